"""The README's framework table ("Enforce in your framework") is backed by tests: every row has
every column filled; each claim cell is named in the row's tests column with the tests that prove
it, or says "untested"; every test named (``path::function``, a pytest id in brackets allowed)
is a function defined in a file of the repository; every adapter module of
``otel_loopguard.integrations`` and every coding agent's hook has a row; nothing is left "TBD".

``README_UNDER_TEST`` (a path) checks another file than the repository's README.md: a draft of
the table, before it goes in.
"""

from __future__ import annotations

import ast
import os
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

import otel_loopguard.integrations
from otel_loopguard.hooks import HOSTS

ROOT = Path(__file__).resolve().parents[1]
README = Path(os.environ.get("README_UNDER_TEST") or ROOT / "README.md")
HEADING = "## Enforce in your framework"
COLUMNS = (
    "framework",
    "adapter",
    "detection from spans alone",
    "enforcement (the adapter's decisions)",
    "one count with hook and spans",
    "what a stop does",
    "tests",
)
#: The claim columns, by the label that names each in the tests column.
CLAIMS = {"detection": 2, "enforcement": 3, "count": 4, "stop": 5}
TESTS = COLUMNS.index("tests")
#: ``path::function``, ``path::Class::function``, each with an optional ``[pytest id]``.
REFERENCE = re.compile(r"`(?P<path>[^`\s:]+)(?P<names>(?:::[A-Za-z_]\w*)+)(?:\[[^`\]]+\])?`")
#: One group of the tests column: ``label, label: `ref`, `ref```.
GROUP = re.compile(r"(?P<labels>[a-z]+(?:, [a-z]+)*): (?P<refs>.+)")
ADAPTER = re.compile(r"`from otel_loopguard\.integrations\.(\w+) import \w+`")
HOOK = re.compile(r"`otel-loopguard hook ([\w-]+)`")


@dataclass(frozen=True)
class Row:
    line: int  # in the README, from 1
    cells: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"line {self.line} ({self.cells[0] or '?'})"


def cell(row: Row, column: int) -> str:
    """The row's cell in ``column``; empty when the row is short (a fault the checks name)."""
    return row.cells[column] if len(row.cells) > column else ""


def _cells(line: str) -> tuple[str, ...]:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return tuple(part.strip() for part in re.split(r"(?<!\\)\|", inner))


def table(text: str) -> tuple[tuple[str, ...], list[Row]]:
    """The header and rows of the first table in the section under :data:`HEADING`."""
    assert HEADING in text, f"{README}: no {HEADING!r} section"
    start = text.index(HEADING)
    first = text.count("\n", 0, start) + 1
    lines = text[start:].split("\n")
    end = next((n for n, line in enumerate(lines[1:], 1) if line.startswith("## ")), len(lines))
    numbered = [(first + n, line) for n, line in enumerate(lines[:end])]
    rows = [(n, line) for n, line in numbered if line.lstrip().startswith("|")]
    assert len(rows) >= 2, f"{README}: no table under {HEADING!r}"
    # the table is the first run of consecutive table lines
    block = [rows[0]]
    for n, line in rows[1:]:
        if n != block[-1][0] + 1:
            break
        block.append((n, line))
    header = _cells(block[0][1])
    assert set(_cells(block[1][1])) <= {"---", ":---", "---:", ":---:"}, "no delimiter row"
    return header, [Row(n, _cells(line)) for n, line in block[2:]]


def cell_problems(header: tuple[str, ...], rows: list[Row]) -> list[str]:
    problems = [] if header == COLUMNS else [f"header {header} is not {COLUMNS}"]
    for row in rows:
        if len(row.cells) != len(COLUMNS):
            problems.append(f"{row.name}: {len(row.cells)} cells, not {len(COLUMNS)}")
        problems += [
            f"{row.name}: column {column!r} is empty"
            for column, text in zip(COLUMNS, row.cells, strict=False)
            if not text
        ]
    return problems


def groups(row: Row) -> tuple[dict[str, list[str]], list[str]]:
    """The tests cell read as label -> references; and what in it cannot be read."""
    found: dict[str, list[str]] = {}
    problems = []
    for part in (p.strip() for p in cell(row, TESTS).split(";")):
        match = GROUP.fullmatch(part)
        if match is None:
            problems.append(f"{row.name}: {part!r} is not 'label, label: `path::function`, ...'")
            continue
        refs = [m.group(0) for m in REFERENCE.finditer(match["refs"])]
        rest = REFERENCE.sub("", match["refs"]).replace(",", "").strip()
        if not refs or rest:
            problems.append(f"{row.name}: {match['refs']!r} is not a list of `path::function`")
        for label in match["labels"].split(", "):
            if label not in CLAIMS:
                problems.append(f"{row.name}: {label!r} names no claim column ({sorted(CLAIMS)})")
            found.setdefault(label, []).extend(refs)
    return found, problems


def claim_problems(rows: list[Row]) -> list[str]:
    problems = []
    for row in rows:
        found, unreadable = groups(row)
        problems += unreadable
        for label, column in CLAIMS.items():
            if not found.get(label) and "untested" not in cell(row, column):
                problems.append(
                    f"{row.name}: {COLUMNS[column]!r} names no test ({label}: ...) and does not"
                    " say 'untested'"
                )
    return problems


def defines(tree: ast.Module, names: list[str]) -> bool:
    """``names``: a function, at the top level or a method of any class; or a chain of classes
    ending in a method."""
    *classes, function = names
    scope: list[ast.stmt] = tree.body
    for name in classes:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == name]
        if not found:
            return False
        scope = found[0].body
    bodies = [scope]
    if not classes:  # a method of any class of the module will do
        bodies += [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function
        for body in bodies
        for node in body
    )


def reference_problems(rows: list[Row], root: Path = ROOT) -> list[str]:
    problems = []
    for row in rows:
        for match in REFERENCE.finditer(cell(row, TESTS)):
            path = (root / match["path"]).resolve()
            if not path.is_relative_to(root) or not path.is_file():
                problems.append(f"{row.name}: {match['path']} is no file of the repository")
                continue
            names = match["names"].split("::")[1:]
            if not defines(ast.parse(path.read_text(encoding="utf-8")), names):
                problems.append(f"{row.name}: {match['path']} defines no {'::'.join(names)}")
        # a reference the pattern does not take (a glob, a placeholder) is a problem too
        for text in re.findall(r"`([^`]*::[^`]*)`", cell(row, TESTS)):
            if REFERENCE.fullmatch(f"`{text}`") is None:
                problems.append(f"{row.name}: `{text}` is not `path::function`")
    return problems


def adapters() -> set[str]:
    """The public adapter modules of ``otel_loopguard.integrations``."""
    return {
        module.name
        for module in pkgutil.iter_modules(otel_loopguard.integrations.__path__)
        if not module.name.startswith("_")
    }


def the_table() -> tuple[tuple[str, ...], list[Row]]:
    return table(README.read_text(encoding="utf-8"))


def test_the_table_has_the_columns_and_every_cell_is_filled() -> None:
    header, rows = the_table()
    assert rows
    assert cell_problems(header, rows) == []


def test_every_claim_names_its_tests_or_says_it_is_untested() -> None:
    _, rows = the_table()
    assert claim_problems(rows) == []


def test_every_test_named_is_a_function_defined_in_a_file_of_the_repository() -> None:
    _, rows = the_table()
    assert sum(len(REFERENCE.findall(cell(row, TESTS))) for row in rows) >= len(rows)
    assert reference_problems(rows) == []


def test_every_adapter_and_every_coding_agent_hook_has_a_row() -> None:
    _, rows = the_table()
    modules = [m for row in rows for m in ADAPTER.findall(cell(row, 1))]
    hosts = [h for row in rows for h in HOOK.findall(cell(row, 1))]
    assert len(adapters()) == 14  # the fourteen frameworks (a new one: a new row)
    assert sorted(modules) == sorted(adapters())
    assert sorted(hosts) == sorted(HOSTS)


def test_nothing_is_left_to_be_done() -> None:
    _, rows = the_table()
    assert [row.name for row in rows if "TBD" in " ".join(row.cells)] == []


def test_the_checks_find_what_is_wrong_in_a_table() -> None:
    """The checks above on a table with one fault of each kind: each fault is named."""
    here = "tests/test_readme_framework_table.py"
    text = "\n".join(
        [
            "# x",
            HEADING,
            "",
            "| " + " | ".join(COLUMNS) + " |",
            "|" + " --- |" * len(COLUMNS),
            f"| A | a | sees | | once | ends | detection, enforcement, count, stop: `{here}::defines` |",
            f"| B | b | sees | acts | once | ends | detection, count: `{here}::no_such_function` |",
            "| C | c | sees, untested | acts | once | ends | enforcement, count, stop:"
            " `tests/no_such_file.py::test_x`, `tests/test_x*.py::<TBD>` |",
            f"| D | d | sees | acts | once | ends | stops: `{here}::Row::name[x]`; `{here}` |",
            "",
            "| not | this table |",
        ]
    )
    header, rows = table(text)
    assert [row.cells[0] for row in rows] == ["A", "B", "C", "D"]
    assert cell_problems(header, rows) == [f"line 6 (A): column {COLUMNS[3]!r} is empty"]
    claims = claim_problems(rows)
    assert not any("line 6" in p for p in claims)
    # C's detection says "untested"; its second reference is no reference
    assert [p for p in claims if "line 8" in p] == [
        "line 8 (C): '`tests/no_such_file.py::test_x`, `tests/test_x*.py::<TBD>`'"
        " is not a list of `path::function`"
    ]
    assert [p for p in claims if "line 7" in p] == [
        f"line 7 (B): {COLUMNS[3]!r} names no test (enforcement: ...) and does not say 'untested'",
        f"line 7 (B): {COLUMNS[5]!r} names no test (stop: ...) and does not say 'untested'",
    ]
    assert f"line 9 (D): {'stops'!r} names no claim column ({sorted(CLAIMS)})" in claims
    assert f"line 9 (D): '`{here}`' is not 'label, label: `path::function`, ...'" in claims
    assert reference_problems(rows) == [
        f"line 7 (B): {here} defines no no_such_function",
        "line 8 (C): tests/no_such_file.py is no file of the repository",
        "line 8 (C): `tests/test_x*.py::<TBD>` is not `path::function`",
    ]
