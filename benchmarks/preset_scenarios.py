"""How each preset does on scripted agent behaviours: loops it should catch, work it should leave alone.

    python benchmarks/preset_scenarios.py            # prints the markdown table in docs/how-it-decides.md

Each scenario is a list of tool calls with their results, driven through the public hook API
(before_tool, then after_tool when the call ran). For a loop, the cell gives the call number of
the first block (deny, rescue or stop) and how many calls ran before it; for healthy work, the
number of calls wrongly blocked (0 is right). tests/test_docs.py checks docs/how-it-decides.md shows
this script's current output.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from otel_loopguard import PRESETS, LoopGuard, Mode

Call = tuple[str, dict[str, object], object, bool]  # tool, arguments, result, error


def stuck() -> list[Call]:
    return [("search", {"query": "weather in Paris"}, "no results", False)] * 20


def stuck_unreported() -> list[Call]:
    return [("search", {"query": "weather in Paris"}, None, False)] * 20


def periodic() -> list[Call]:
    period: list[Call] = [
        ("grep", {"pattern": "parse_minutes", "path": "src"}, "src/d.py:3", False)
    ] * 5
    return (period + [("read_file", {"path": "src/d.py"}, "def parse...", False)]) * 6


def alternating() -> list[Call]:
    pair: list[Call] = [
        ("read_file", {"path": "a.py"}, "A", False),
        ("read_file", {"path": "b.py"}, "B", False),
    ]
    return pair * 10


def numbered_descriptions() -> list[Call]:
    return [
        (
            "bash",
            {"command": "npm test", "description": f"Run tests (attempt {n})"},
            "1 failing",
            False,
        )
        for n in range(1, 16)
    ]


def failing_command() -> list[Call]:
    return [("bash", {"command": "cargo build"}, "error[E0425]", True)] * 15


def grinding() -> list[Call]:
    files = [f"src/mod{n}.py" for n in range(5)]
    return [("read_file", {"path": files[n % 5]}, f"content {n % 5}", False) for n in range(60)]


def edit_between_runs() -> list[Call]:
    calls: list[Call] = []
    for n in range(8):
        calls.append(("bash", {"command": "cargo clippy"}, f"{8 - n} warnings", False))
        calls.append(
            ("edit_file", {"path": "src/lib.rs", "old": f"a{n}", "new": f"b{n}"}, "ok", False)
        )
    return calls


def sed_between_runs() -> list[Call]:
    calls: list[Call] = []
    for n in range(8):
        calls.append(("bash", {"command": "pytest -q"}, f"{8 - n} failed", False))
        calls.append(("bash", {"command": f"sed -i 's/bug{n}/fix{n}/' app.py"}, "", False))
    return calls


def polling() -> list[Call]:
    return [("job_status", {"id": 42}, f"{n * 10}% done", False) for n in range(10)]


def rebuild_and_list() -> list[Call]:
    # `python build.py` is not a known mutating command, but what `ls dist` shows keeps changing
    calls: list[Call] = []
    for n in range(8):
        calls.append(("bash", {"command": "python build.py"}, f"built {n}", False))
        calls.append(("bash", {"command": "ls dist"}, f"{n} files", False))
    return calls


def exploring() -> list[Call]:
    calls: list[Call] = []
    for n in range(60):
        calls.append(("read_file", {"path": f"src/f{n}.py"}, f"content {n}", False))
        if n % 10 == 9:  # now and then re-read an earlier file
            calls.append(("read_file", {"path": f"src/f{n - 5}.py"}, f"content {n - 5}", False))
    return calls


@dataclass(frozen=True)
class Scenario:
    name: str
    calls: Callable[[], list[Call]]
    loop: bool


SCENARIOS = (
    Scenario("same call, same result, 20x", stuck, True),
    Scenario("same call, results not reported, 20x", stuck_unreported, True),
    Scenario("grep x5 + read, period 6 (a)", periodic, True),
    Scenario("two files read alternately", alternating, True),
    Scenario("same command, numbered description (c)", numbered_descriptions, True),
    Scenario("same failing build, 15x", failing_command, True),
    Scenario("5 files read round-robin, 60 calls", grinding, True),
    Scenario("clippy with an edit between runs (b)", edit_between_runs, False),
    Scenario("bash-only: tests, sed -i, tests (j)", sed_between_runs, False),
    Scenario("polling, result changes (f), 10x", polling, False),
    Scenario("unknown writer, then ls: output changes", rebuild_and_list, False),
    Scenario("exploring 60 files, a few re-reads", exploring, False),
)


def first_block(preset: str, calls: list[Call]) -> tuple[int | None, int]:
    """(1-based index of the first blocking decision, blocked calls) in enforce mode."""
    guard = LoopGuard(PRESETS[preset].replace(mode=Mode.ENFORCE))
    first, blocked = None, 0
    for index, (tool, arguments, result, error) in enumerate(calls, 1):
        decision = guard.before_tool(tool, arguments, session="s")
        if decision.blocks:
            blocked += 1
            first = first or index
            continue
        if result is not None:
            guard.after_tool(tool, arguments, session="s", result=result, error=error)
    return first, blocked


def table() -> str:
    presets = list(PRESETS)
    lines = [
        "| scenario | loop? | " + " | ".join(f"`{p}`" for p in presets) + " |",
        "| --- | --- | " + " | ".join("---" for _ in presets) + " |",
    ]
    for scenario in SCENARIOS:
        cells = []
        for preset in presets:
            first, blocked = first_block(preset, scenario.calls())
            if scenario.loop:
                cells.append("never blocked" if first is None else f"blocked at call {first}")
            else:
                cells.append("ok" if not blocked else f"{blocked} wrongly blocked")
        lines.append(
            f"| {scenario.name} | {'yes' if scenario.loop else 'no'} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def record_figures() -> None:
    """Per preset: the loops blocked, the calls that ran before the blocks (a loop never blocked
    counts all its calls) and the calls wrongly blocked in healthy work (for compare.py)."""
    from _results import record  # here: tests load this module without benchmarks/ on the path

    for preset in PRESETS:
        caught = ran = wrong = 0
        for scenario in SCENARIOS:
            calls = scenario.calls()
            first, blocked = first_block(preset, calls)
            if scenario.loop:
                caught += first is not None
                ran += len(calls) if first is None else first - 1
            else:
                wrong += blocked
        record(f"{preset}: loops blocked", caught, "scenarios", better="higher")
        record(f"{preset}: loop calls run before the block", ran, "calls")
        record(f"{preset}: calls wrongly blocked", wrong, "calls")


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
    record_figures()
