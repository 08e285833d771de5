"""Engine throughput and memory per idle session.

    python benchmarks/bench_engine.py [--repeat 7] [--pairs 100000] [--sessions 20000]

Throughput: before_tool + after_tool pairs per second on one thread, through the public hook
API with the default policy, without metrics and with the Prometheus recorder (a fresh registry
per run), for two workloads:
  - "mixed": 100 live sessions of 50 calls each; in each, every 5th call repeats the one
    before it, the rest are new; results given (a busy, healthy service: repeats, no trips);
  - "distinct": every call new (the cheapest path: nothing repeats);
  - "loop-heavy": 100 live sessions of 20 calls each; in each, 8 new reads, then one grep
    repeated with the same result until the ladder reminds, denies and stops (the path that
    trips: every session ends stopped).
The recorder's own cost per call is also timed directly: PrometheusRecorder.tool_call minus
NoopRecorder.tool_call (a counted call; a repeated one bumps two counts).
A plain baseline is measured in the same run: hashing the same calls' canonical JSON with the
standard library (json.dumps(sort_keys=True) + hashlib.blake2b), i.e. the least work any loop
detector must do per call. The floor the engine is held to (issue 29) is measured in the same
run too: per call, orjson.dumps(arguments, option=OPT_SORT_KEYS) and xxh3-128 of the tool name
and that (one canonicalisation and one hash); each workload's ratio to it is printed and
recorded. Medians over --repeat runs.

Memory: tracemalloc over --sessions sessions that each made N tracked calls and went idle
(N = 1 and 10), including the session id strings, divided by the session count.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import platform
import statistics
import sys
import time
import timeit
import tracemalloc

import orjson
from _results import record
from xxhash import xxh3_128_hexdigest

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard.metrics import NoopRecorder, PrometheusRecorder


def workload(kind: str, pairs: int) -> list[tuple[str, dict[str, object], str, str]]:
    calls: list[tuple[str, dict[str, object], str, str]] = []
    for i in range(pairs):
        session = f"session-{i % 100}-{i // 5000}"  # 100 live sessions of 50 calls each
        if kind == "distinct":
            calls.append(("grep", {"pattern": f"p{i}", "path": "src"}, session, "ok"))
        elif kind == "loop-heavy":
            # 100 live sessions of 20 calls each: 8 new reads, then one grep repeated until the
            # ladder reminds, denies and stops
            session = f"session-{i % 100}-{i // 2000}"
            n = (i // 100) % 20
            if n < 8:
                calls.append(("read", {"path": f"src/f{n}.py"}, session, f"contents {n}"))
            else:
                calls.append(("grep", {"pattern": "TODO", "path": "src"}, session, "no match"))
        else:
            # per session: every 5th call repeats the one before (a re-read), the rest are new
            n = i // 100
            n -= 1 if n % 5 == 4 else 0
            tool = ("grep", "read", "bash")[n % 3]
            calls.append((tool, {"arg": f"v{n}", "path": "src"}, session, f"result {n}"))
    return calls


def run_guard(calls: list[tuple[str, dict[str, object], str, str]], metrics: bool = False) -> float:
    guard = LoopGuard(PRESETS["default"], recorder=PrometheusRecorder() if metrics else None)
    before, after = guard.before_tool, guard.after_tool
    started = time.perf_counter()
    for tool, arguments, session, result in calls:
        decision = before(tool, arguments, session=session)
        if not decision.blocks:
            after(tool, arguments, session=session, result=result)
    return len(calls) / (time.perf_counter() - started)


def run_baseline(calls: list[tuple[str, dict[str, object], str, str]]) -> float:
    seen: dict[str, int] = {}
    started = time.perf_counter()
    for tool, arguments, session, result in calls:
        key = hashlib.blake2b(
            (tool + json.dumps(arguments, sort_keys=True)).encode(), digest_size=16
        ).hexdigest()
        seen[session + key] = seen.get(session + key, 0) + 1
        hashlib.blake2b(result.encode(), digest_size=16).hexdigest()
    return len(calls) / (time.perf_counter() - started)


def run_floor(calls: list[tuple[str, dict[str, object], str, str]]) -> float:
    """The floor: one canonicalisation (orjson, keys sorted) and one hash (xxh3-128) per call."""
    dumps, sort = orjson.dumps, orjson.OPT_SORT_KEYS
    started = time.perf_counter()
    for tool, arguments, _session, _result in calls:
        xxh3_128_hexdigest(tool.encode() + b"\x00" + dumps(arguments, option=sort))
    return len(calls) / (time.perf_counter() - started)


def recorder_cost_ns(repeated: bool, number: int = 200_000) -> float:
    """Extra nanoseconds of one PrometheusRecorder.tool_call over a NoopRecorder's."""
    prometheus, noop = PrometheusRecorder(), NoopRecorder()
    prometheus.tool_call(None, "grep", repeated)
    spent = []
    for recorder in (prometheus, noop):
        call = recorder.tool_call
        spent.append(timeit.timeit(lambda: call(None, "grep", repeated), number=number))  # noqa: B023 - run now, in this iteration
    return (spent[0] - spent[1]) / number * 1e9


def memory_per_session(sessions: int, calls_per_session: int) -> float:
    policy = PRESETS["default"].replace(max_sessions=sessions * 2)
    guard = LoopGuard(policy)
    gc.collect()
    tracemalloc.start()
    start, _ = tracemalloc.get_traced_memory()
    for s in range(sessions):
        session = f"session-{s:08d}"
        for c in range(calls_per_session):
            arguments = {"path": f"src/file{c}.py"}
            guard.before_tool("read", arguments, session=session)
            guard.after_tool("read", arguments, session=session, result=f"contents {c}")
    del arguments, session
    gc.collect()
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert guard.session_count == sessions
    return (used - start) / sessions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=20_000)
    args = parser.parse_args()

    print(f"python {platform.python_version()} on {platform.machine()}, {platform.system()}")
    for kind in ("mixed", "distinct", "loop-heavy"):
        calls = workload(kind, args.pairs)
        ours, base, metered, ratios, floor, to_floor = [], [], [], [], [], []
        for _ in range(args.repeat):  # side by side, alternating, so load affects all alike
            ours.append(run_guard(calls))
            base.append(run_baseline(calls))
            floor.append(run_floor(calls))
            metered.append(run_guard(calls, metrics=True))
            ratios.append(ours[-1] / metered[-1])
            to_floor.append(floor[-1] / ours[-1])
        o, b = statistics.median(ours), statistics.median(base)
        m, f = statistics.median(metered), statistics.median(floor)
        ratio = statistics.median(to_floor)
        print(
            f"throughput {kind:8s}: {o:10,.0f} pairs/s (median of {args.repeat});"
            f" baseline hash-only {b:10,.0f}/s; ours/baseline time ratio {b / o:.2f}x"
        )
        print(
            f"  with Prometheus recorder: {m:10,.0f} pairs/s; time ratio metrics on/off"
            f" {statistics.median(ratios):.3f}x (median of per-run ratios)"
        )
        print(
            f"  floor orjson+xxh3-128: {f:10,.0f} calls/s; ours/floor time ratio {ratio:.1f}x"
            " (median of per-run ratios; target <= 10x)"
        )
        record(f"{kind}_pairs_per_s", o, "pairs/s", better="higher")
        record(f"{kind}_to_floor", ratio, "x", better="lower")
    for repeated in (False, True):
        costs = [recorder_cost_ns(repeated) for _ in range(args.repeat)]
        print(
            f"recorder cost per {'repeated' if repeated else 'new'} call:"
            f" {statistics.median(costs):,.0f} ns over the no-op recorder (median of {args.repeat})"
        )
    for n in (1, 10):
        per = memory_per_session(args.sessions, n)
        print(
            f"memory: {per:,.0f} B per idle session after {n} tracked call(s)"
            f" ({args.sessions:,} sessions)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
