"""Cost per span of recognising tool calls and agents (otel_loopguard._conventions).

    python benchmarks/bench_conventions.py [--repeat 15] [--min-seconds 0.2] [--baseline OLD_CONVENTIONS]

These functions run on the application's thread for every span it starts or ends, so their cost
is compared with a span's own cost in the OpenTelemetry SDK (about 15 us). Spans come from the
real framework dumps in ``tests/data/spans`` (the non-blocked file of each instrumentation):

  - "reject tool" / "reject agent": ``tool_call_from_span`` / ``agent_from_span`` on the first
    span of the dump that is neither a tool nor an agent span, as ``on_end`` sees it; "reject
    start": ``arguments_available_at_start`` on it as ``on_start`` sees it; plus a plain HTTP
    server span;
  - "tool": ``tool_call_from_span`` on the first tool span of the dump as ``on_end`` sees it;
    "tool at start" where its arguments arrive at start; "args at start":
    ``arguments_available_at_start`` on it as ``on_start`` sees it.

Each figure is the median, and the best, over --repeat short runs of the time per call (each
run a tenth of the calls that take --min-seconds), in microseconds; on a shared machine the best is the steadier figure. With --baseline (another
copy of the conventions package, e.g. ``mkdir /tmp/old && git archive HEAD
otel_loopguard/_conventions | tar -x -C /tmp/old`` then ``--baseline
/tmp/old/otel_loopguard/_conventions``; ``otel_loopguard/conventions`` in commits before it was
made private, or the single-module ``conventions.py`` it replaced)
both are measured side by side, alternating, and the ratio of medians is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import sys
import timeit
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The code next to this script, whatever is installed (the editable install's finder comes after
# sys.path), unless PYTHONPATH names another checkout (benchmarks/compare.py does).
sys.path.append(str(REPO))

from _results import record  # noqa: E402

from otel_loopguard import _conventions as conventions  # noqa: E402

SPAN_DUMPS = REPO / "tests" / "data" / "spans"
DUMPS = (
    "pydantic_ai/spans.jsonl",
    "pydantic_ai/spans_v2_legacy.jsonl",
    "langgraph/spans.jsonl",
    "langgraph_openllmetry/spans.jsonl",
    "strands/spans.jsonl",
    "strands/spans_latest_semconv.jsonl",
)
HTTP_SPAN: dict[str, object] = {
    "http.request.method": "GET",
    "url.path": "/",
    "http.response.status_code": 200,
    "server.address": "localhost",
}

# Targets per call on the application's thread.
REJECT_TOOL_TARGET_US = 0.25
REJECT_AGENT_TARGET_US = 0.2
TOOL_TARGET_US = 3.0
TOOL_TARGET_DUMPS = frozenset({"pydantic_ai", "langgraph", "langgraph_openllmetry", "strands"})


@dataclass(frozen=True)
class Case:
    label: str
    function: str  # name of the conventions function under test
    statement: str  # run with f (that function) and the span's fields in scope
    fields: dict[str, Any]
    target_us: float | None = None


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _events(row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(event["name"], event["attributes"]) for event in row["events"]]


def cases() -> list[Case]:
    found: list[Case] = []
    for dump in DUMPS:
        short = dump.removesuffix(".jsonl").replace("/spans", "")
        tool_row = other_row = None
        for row in _rows(SPAN_DUMPS / dump):
            is_tool = (
                conventions.tool_call_from_span(row["name"], row["attributes"], _events(row))
                is not None
            )
            is_agent = conventions.agent_from_span(row["name"], row["attributes"]) is not None
            if is_tool and tool_row is None:
                tool_row = row
            if not is_tool and not is_agent and other_row is None:
                other_row = row
        assert tool_row is not None and other_row is not None, dump

        end = {"n": other_row["name"], "a": other_row["attributes"]}
        start = {"n": other_row["name_at_start"], "a": other_row["attributes_at_start"]}
        found += [
            Case(
                f"reject tool   {short} '{end['n']}'",
                "tool_call_from_span",
                "f(n, a, (), False)",
                end,
                REJECT_TOOL_TARGET_US,
            ),
            Case(
                f"reject agent  {short} '{end['n']}'",
                "agent_from_span",
                "f(n, a)",
                end,
                REJECT_AGENT_TARGET_US,
            ),
            Case(
                f"reject start  {short} '{start['n']}'",
                "arguments_available_at_start",
                "f(n, a)",
                start,
            ),
        ]

        tool = {
            "n": tool_row["name"],
            "a": tool_row["attributes"],
            "e": _events(tool_row),
            "s": tool_row["status"]["code"] == "ERROR",
        }
        target = TOOL_TARGET_US if short in TOOL_TARGET_DUMPS else None
        found.append(
            Case(
                f"tool          {short} '{tool['n']}'",
                "tool_call_from_span",
                "f(n, a, e, s)",
                tool,
                target,
            )
        )
        start = {"n": tool_row["name_at_start"], "a": tool_row["attributes_at_start"]}
        if conventions.arguments_available_at_start(start["n"], start["a"]):
            found.append(
                Case(
                    f"tool at start {short} '{start['n']}'", "tool_call_from_span", "f(n, a)", start
                )
            )
        found.append(
            Case(
                f"args at start {short} '{start['n']}'",
                "arguments_available_at_start",
                "f(n, a)",
                start,
            )
        )
    http = {"n": "GET /", "a": HTTP_SPAN}
    found += [
        Case(
            "reject tool   http 'GET /'",
            "tool_call_from_span",
            "f(n, a, (), False)",
            http,
            REJECT_TOOL_TARGET_US,
        ),
        Case(
            "reject agent  http 'GET /'", "agent_from_span", "f(n, a)", http, REJECT_AGENT_TARGET_US
        ),
    ]
    return found


def load_module(path: str) -> ModuleType:
    """The conventions package (a directory) or module (a .py file) at ``path``."""
    if Path(path).is_dir():  # a package: its modules import each other relatively
        spec = importlib.util.spec_from_file_location(
            "baseline_conventions", Path(path) / "__init__.py", submodule_search_locations=[path]
        )
    else:
        spec = importlib.util.spec_from_file_location("baseline_conventions", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def timer(case: Case, module: ModuleType) -> timeit.Timer:
    return timeit.Timer(
        case.statement, globals={**case.fields, "f": getattr(module, case.function)}
    )


def calls_for(timer: timeit.Timer, seconds: float) -> int:
    """How many calls take at least ``seconds`` (1, 2, 5, 10, 20, ... as ``autorange``)."""
    scale = 1
    while True:
        for factor in (1, 2, 5):
            number = scale * factor
            if timer.timeit(number) >= seconds:
                return number
        scale *= 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=0.2,
        help="size each case's runs from the calls that take this long (default 0.2: timeit's)",
    )
    parser.add_argument(
        "--baseline",
        help="another conventions package (directory) or conventions.py to compare against",
    )
    args = parser.parse_args()

    baseline = load_module(args.baseline) if args.baseline else None
    print(
        f"python {platform.python_version()} on {platform.machine()}, {platform.system()};"
        f" {conventions.__file__}"
    )
    print(
        f"us per call: median and best of {args.repeat} runs; '!' marks a median above its target"
    )
    header = f"{'case':56s} {'median':>7s} {'best':>7s} {'target':>7s}"
    if baseline is not None:
        header += f" {'baseline':>9s} {'ratio':>6s}"
    print(header)
    totals: dict[str, list[float]] = {}
    for case in cases():
        ours_timer = timer(case, conventions)
        number = calls_for(ours_timer, args.min_seconds)  # enough calls for 0.2 s ...
        number = max(1, number // 10)  # ... split in short runs, so a busy machine spoils few
        base_timer = timer(case, baseline) if baseline is not None else None
        ours, base = [], []
        for _ in range(args.repeat):  # alternating, so load affects both alike
            ours.append(ours_timer.timeit(number) / number * 1e6)
            if base_timer is not None:
                base.append(base_timer.timeit(number) / number * 1e6)
        median = statistics.median(ours)
        totals.setdefault(case.label[:13].strip(), []).append(median)
        target = ""
        if case.target_us is not None:
            target = f"{case.target_us:.2f}" + ("!" if median > case.target_us else "")
        line = f"{case.label:56s} {median:7.3f} {min(ours):7.3f} {target:>7s}"
        if base:
            line += f" {statistics.median(base):9.3f} {statistics.median(base) / median:5.1f}x"
        print(line)
    for kind, medians in totals.items():  # one figure per kind of call: the sum over the spans
        record(f"{kind}: sum over {len(medians)} spans", sum(medians), "µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
