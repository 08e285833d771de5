"""The package exports exactly its public API (as httpx's test_exported_members does): a new name
in ``vars(otel_loopguard)`` is a decision, and every module is private (``_name``) or listed as
public here and in CONTRIBUTING.md."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import otel_loopguard

ROOT = Path(__file__).resolve().parents[1]

#: Modules a user or an adapter author may import; everything else is named ``_private``.
PUBLIC_MODULES = {
    "otel_loopguard.cli",
    "otel_loopguard.config",
    "otel_loopguard.exporter",
    "otel_loopguard.hooks",
    "otel_loopguard.integrations",
    "otel_loopguard.integrations.agno",
    "otel_loopguard.integrations.autogen",
    "otel_loopguard.integrations.crewai",
    "otel_loopguard.integrations.dspy",
    "otel_loopguard.integrations.google_adk",
    "otel_loopguard.integrations.haystack",
    "otel_loopguard.integrations.langgraph",
    "otel_loopguard.integrations.llama_index",
    "otel_loopguard.integrations.mcp",
    "otel_loopguard.integrations.openai_agents",
    "otel_loopguard.integrations.pydantic_ai",
    "otel_loopguard.integrations.semantic_kernel",
    "otel_loopguard.integrations.smolagents",
    "otel_loopguard.integrations.strands",
    "otel_loopguard.metrics",
    "otel_loopguard.metrics.otel",
    "otel_loopguard.metrics.prometheus",
    "otel_loopguard.processor",
    "otel_loopguard.replay",
    "otel_loopguard.service",
}

#: Names in __all__ that are loaded on first use: all of them (PEP 562), so that importing a
#: submodule (the command hook imports ``otel_loopguard.cli``) does not import the guard.
LAZY = {n for n in otel_loopguard.__all__ if not n.startswith("_")}


def _fresh_vars() -> list[str]:
    code = (
        "import otel_loopguard as m, types; print('\\n'.join(sorted("
        "n + (' module' if isinstance(v, types.ModuleType) else '')"
        " for n, v in vars(m).items() if not n.startswith('_'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_vars_hold_the_public_api_and_public_modules_only() -> None:
    lines = _fresh_vars()
    names = {line for line in lines if line != "module"}
    modules = {n for n in names if f"otel_loopguard.{n}" in PUBLIC_MODULES}
    public = {n for n in otel_loopguard.__all__ if not n.startswith("_")}
    assert names - modules == public - LAZY == set()
    for name in modules:
        assert isinstance(getattr(otel_loopguard, name), ModuleType)
    for name in public:
        assert getattr(otel_loopguard, name) is not None, name
    assert public <= set(dir(otel_loopguard))


def test_every_module_is_private_or_listed_as_public() -> None:
    found = set()
    for info in pkgutil.walk_packages(otel_loopguard.__path__, "otel_loopguard."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            found.add(info.name)
    assert found == PUBLIC_MODULES


def test_contributing_describes_every_public_module() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    for module in PUBLIC_MODULES:
        relative = module.removeprefix("otel_loopguard.").replace(".", "/")
        assert f"`{relative}" in text, module


def test_contributing_names_every_module_of_the_package() -> None:
    """The layout table is the map: a module it does not name (private ones too) is a gap."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    table = text.split("## Layout, and the direction of imports", 1)[1].split("\n## ", 1)[0]
    for info in pkgutil.walk_packages(otel_loopguard.__path__, "otel_loopguard."):
        relative = info.name.removeprefix("otel_loopguard.").replace(".", "/")
        if relative.startswith("integrations/") or relative == "__main__":
            continue  # the frameworks are listed as integrations/<framework>
        # a package's private parts may be named alone in their package's row (`_budget`)
        leaf = relative.rsplit("/", 1)[-1]
        assert f"`{relative}" in table or f"`{leaf}`" in table, info.name
