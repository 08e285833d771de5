"""Adapters import lazily: ``import otel_loopguard`` loads no framework, and an adapter without
its framework raises ImportError naming the extra to install (runs in every environment)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

#: adapter module -> (modules hidden to simulate a missing framework, extra named in the error)
ADAPTERS = {
    "pydantic_ai": (["pydantic_ai"], "pydantic-ai"),
    "openai_agents": (["agents"], "openai-agents"),
    "langgraph": (["langgraph", "langchain_core"], "langgraph"),
    "strands": (["strands"], "strands"),
    "google_adk": (["google.adk"], "google-adk"),
    "smolagents": (["smolagents"], "smolagents"),
    "llama_index": (["llama_index"], "llama-index"),
    "haystack": (["haystack"], "haystack"),
    "mcp": (["mcp", "mcp_types"], "mcp"),
    "crewai": (["crewai"], "crewai"),
    "semantic_kernel": (["semantic_kernel"], "semantic-kernel"),
    "agno": (["agno"], "agno"),
    "autogen": (["autogen_core", "autogen_agentchat"], "autogen"),
    "dspy": (["dspy"], "dspy"),
}
EVERY_ADAPTER = ADAPTERS


@pytest.mark.parametrize("adapter", sorted(EVERY_ADAPTER))
def test_missing_framework_names_the_extra(adapter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hidden, extra = EVERY_ADAPTER[adapter]
    for name in list(sys.modules):
        if any(name == h or name.startswith(h + ".") for h in hidden):
            monkeypatch.delitem(sys.modules, name)
    for name in hidden:
        monkeypatch.setitem(sys.modules, name, None)
    module = f"otel_loopguard.integrations.{adapter}"
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError) as raised:
        importlib.import_module(module)
    assert f"pip install '.[{extra}]'" in str(raised.value)


def test_importing_the_package_loads_no_framework() -> None:
    code = (
        "import sys, otel_loopguard, otel_loopguard.integrations; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(EVERY_ADAPTER)!r} "
        "or m.startswith(('langchain_core', 'google.adk'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_adapter_is_listed_in_pyproject_extras() -> None:
    from pathlib import Path

    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    assert {extra for _, extra in EVERY_ADAPTER.values()} <= set(extras)


def test_readme_snippets_import_what_the_adapters_export() -> None:
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    section = (root / "README.md").read_text().split("## Enforce in your framework", 1)[1]
    imports = re.findall(r"from otel_loopguard\.integrations\.(\w+) import (\w+)", section)
    assert {module for module, _ in imports} == set(ADAPTERS)
    for module, name in imports:
        tree = ast.parse((root / "otel_loopguard" / "integrations" / f"{module}.py").read_text())
        exported = next(
            node
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) == "__all__" for t in node.targets)
        )
        assert name in ast.literal_eval(exported.value), (module, name)
