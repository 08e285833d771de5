"""The README says what the code does: quickstart = CI command, preset table = current output."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def quickstart_commands() -> list[str]:
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", section)


def test_quickstart_is_exactly_two_commands_and_the_second_is_what_ci_runs() -> None:
    commands = quickstart_commands()
    assert len(commands) == 2
    assert all("\n" not in command for command in commands)
    assert "demo" in commands[0]
    assert commands[1] == "bash .ci/run"  # CI runs `bash .ci/run` on a clean clone
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert [line for line in ci if line.startswith("bash ")] == [
        "bash .ci/install",
        "bash .ci/test",
        "bash .ci/package",
        "bash .ci/frameworks",
    ]


def test_readme_preset_table_is_current() -> None:
    spec = importlib.util.spec_from_file_location(
        "preset_scenarios", ROOT / "benchmarks" / "preset_scenarios.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["preset_scenarios"] = module
    spec.loader.exec_module(module)
    table = README.split("<!-- preset-table:start -->\n", 1)[1].split(
        "\n<!-- preset-table:end -->"
    )[0]
    assert table == module.table()


def test_every_policy_field_is_documented() -> None:
    from dataclasses import fields

    from otel_loopguard import Policy

    for field in fields(Policy):
        assert f"`{field.name}`" in README, field.name


def test_readme_links_resolve_inside_the_repository() -> None:
    for doc in [ROOT / "README.md", *ROOT.glob("*/README.md")]:
        text = doc.read_text()
        outside = "../" + "shared"  # the folder beside a developer's clone, absent in a user's
        assert outside not in text.replace("copied from `" + outside, ""), doc
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)}: {target}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_table_of_contents_lists_every_section_in_order() -> None:
    toc = README.split("<!-- toc:start -->\n", 1)[1].split("<!-- toc:end -->")[0]
    listed = re.findall(r"^- \[(.+)\]\(#(.+)\)$", toc, re.M)
    sections = [
        h for h in re.findall(r"^## (.+)$", README, re.M) if h not in ("Quickstart", "Contents")
    ]
    assert [title for title, _ in listed] == sections
    assert all(anchor == _slug(title) for title, anchor in listed)
