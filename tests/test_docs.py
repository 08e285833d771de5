"""The README and docs/ say what the code does: quickstart = CI command, preset table = current
output, every Policy field documented, links that resolve, every page in the site's nav."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
DECIDES = (DOCS / "how-it-decides.md").read_text()  # presets, configuration: the Policy fields
FIRST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/otel-loopguard demo"
)


def quickstart_commands() -> list[str]:
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", section)


def test_quickstart_is_exactly_two_commands_and_the_second_is_what_ci_runs() -> None:
    commands = quickstart_commands()
    assert len(commands) == 2
    assert all("\n" not in command for command in commands)
    # the first makes its own virtualenv (Debian's Python refuses pip outside one) and runs the demo
    assert commands[0] == FIRST_COMMAND
    assert commands[1] == "bash .ci/run"  # CI runs `bash .ci/run` on a clean clone
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert [line for line in ci if line.startswith("bash ")] == [
        "bash .ci/install",
        "bash .ci/test",
        "bash .ci/package",
        "bash .ci/frameworks",
    ]
    # the site's getting-started page gives the same two commands
    started = (DOCS / "getting-started.md").read_text()
    assert f"```sh\n{FIRST_COMMAND}\n```" in started
    assert "```sh\nbash .ci/run\n```" in started


def test_readme_is_a_guide_under_300_lines() -> None:
    assert len(README.splitlines()) < 300


def test_preset_table_is_current() -> None:
    spec = importlib.util.spec_from_file_location(
        "preset_scenarios", ROOT / "benchmarks" / "preset_scenarios.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["preset_scenarios"] = module
    spec.loader.exec_module(module)
    table = DECIDES.split("<!-- preset-table:start -->\n", 1)[1].split(
        "\n<!-- preset-table:end -->"
    )[0]
    assert table == module.table()


def test_every_policy_field_is_documented() -> None:
    from dataclasses import fields

    from otel_loopguard import Policy

    table = DECIDES.split("## Configuration", 1)[1]
    for field in fields(Policy):
        assert f"`{field.name}`" in table, field.name


def _links(text: str) -> list[str]:
    return [
        target for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if "://" not in target
    ]


def test_readme_links_resolve_inside_the_repository() -> None:
    for doc in [ROOT / "README.md", *ROOT.glob("*/README.md")]:
        text = doc.read_text()
        outside = "../" + "shared"  # the folder beside a developer's clone, absent in a user's
        assert outside not in text.replace("copied from `" + outside, ""), doc
        for target in _links(text):
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)}: {target}"


def test_docs_links_stay_inside_the_site() -> None:
    """mkdocs serves docs/ only: a page links to pages and images, repository files by name."""
    for page in DOCS.glob("*.md"):
        for target in _links(page.read_text()):
            resolved = (page.parent / target).resolve()
            assert resolved.exists(), f"{page.name}: {target}"
            assert resolved.is_relative_to(DOCS), f"{page.name}: {target} leaves docs/"


def test_every_page_is_in_the_nav_and_the_readme_links_to_it() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = [page for entry in config["nav"] for page in entry.values()]
    pages = sorted(page.name for page in DOCS.glob("*.md"))
    assert sorted(nav) == pages
    for page in pages:
        if page != "index.md":
            assert f"(docs/{page})" in README, page
