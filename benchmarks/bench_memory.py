"""Dead-end memory across runs (issue 28), measured on real runs that follow each other.

    python benchmarks/bench_memory.py                     # ../shared/corpus/sequences
    python benchmarks/bench_memory.py --corpus DIR --markdown

The corpus holds 60 SWE-bench tasks, each attempted five times by AutoCodeRover, in order
(``manifest.json``: each file's ``task`` and ``order``; ``labels.json``: each run's
``judgement`` and, for a loop, ``loop_start_seq`` / ``loop_third_seq``). Each task's five runs
go through the guard (the hook API, the default policy) one after the other, twice:

- memory off (``memory = false``): every run starts from nothing, as today;
- memory on: one memory file per task, ``memory_scope = "global"`` in it (the scope is the
  task), carried from each run to the next.

Each run is a fresh guard and session; a call is decided before it runs (``before_tool``) and,
unless refused, reported after it (``after_tool`` with the run's own error flag; AutoCodeRover
recorded no output, so an outcome is "error" or unknown). The replay cannot show how an agent
would have reacted to a reminder: every recorded call is fed as recorded.

Reported, off and on side by side:
- stuck runs: how many were reminded and blocked inside their loop, and the mean number of the
  loop's calls that ran before the first reminder and before the first block (counted from
  ``loop_start_seq``; fewer is earlier); calls cut (refused, or after a stop: the run ends);
- the stuck runs that had something to remember (an earlier run of the task denied or stopped
  the same call): the same figures for them alone; and the weak runs (re-reading among new
  exploration: a reminder or block there is neither right nor wrong);
- runs without repetition (``no-repetition``): how many were reminded or blocked at all (a
  false reminder or block), and how many reminders came from memory.

Without the corpus folder the script says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import _results

from otel_loopguard import LoopGuard
from otel_loopguard._policy import Action
from otel_loopguard.config import PRESETS, MemoryScope, Policy, Rule

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = ROOT.parent / "shared" / "corpus" / "sequences"


@dataclass
class RunResult:
    """What the guard did in one run."""

    name: str
    judgement: str
    loop_start: int | None
    calls: int = 0
    first_remind: int | None = None  # seq of the first reminder (any rule)
    first_block: int | None = None  # seq of the first deny, rescue or stop (before or after)
    memory_reminders: int = 0
    cut: int = 0  # calls refused, and every call after a stop (the run would have ended)
    memory_seqs: list[int] = field(default_factory=list)


def _calls(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def replay_run(guard: LoopGuard, path: Path, label: dict[str, object]) -> RunResult:
    """Feed one run through ``guard``; what it decided."""
    session = path.stem
    loop_start = label.get("loop_start_seq")
    result = RunResult(
        path.name,
        str(label["judgement"]),
        loop_start if isinstance(loop_start, int) else None,
    )
    stopped_at: int | None = None
    for record in _calls(path):
        if record.get("type") == "user_message":
            guard.user_message(session)
            continue
        seq = int(record["seq"])  # type: ignore[call-overload]
        tool, arguments = str(record["tool"]), record["arguments"]
        error = record.get("is_error")
        result.calls += 1
        if stopped_at is not None:
            result.cut += 1
            continue
        decision = guard.before_tool(tool, arguments, session=session)
        if decision.action is Action.REMIND:
            if result.first_remind is None:
                result.first_remind = seq
            if decision.rule is Rule.MEMORY:
                result.memory_reminders += 1
                result.memory_seqs.append(seq)
        if decision.blocks:
            if result.first_block is None:
                result.first_block = seq
            result.cut += 1
            if decision.action is Action.STOP:
                stopped_at = seq
            continue
        after = guard.after_tool(
            tool,
            arguments,
            session=session,
            error=error if isinstance(error, bool) else None,
            result=record.get("result"),
        )
        if after is not None and after.blocks:
            if result.first_block is None:
                result.first_block = seq
            stopped_at = seq
    guard.close(wait=True)
    return result


def run_corpus(corpus: Path, memory: bool) -> list[RunResult]:
    manifest = json.loads((corpus / "manifest.json").read_text())["items"]
    labels = json.loads((corpus / "labels.json").read_text())
    tasks: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for item in manifest:
        tasks[item["task"]].append((int(item["order"]), item["out"]))
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as scratch:
        for task, runs in sorted(tasks.items()):
            policy: Policy = PRESETS["default"].replace(
                memory=str(Path(scratch) / f"{task}.json") if memory else False,
                memory_scope=MemoryScope.GLOBAL,
            )
            for _, name in sorted(runs):
                guard = LoopGuard(policy)
                results.append(replay_run(guard, corpus / name, labels[name]))
    return results


@dataclass
class Summary:
    runs: int = 0
    reminded: int = 0
    blocked: int = 0
    ran_before_remind: list[int] = field(default_factory=list)
    ran_before_block: list[int] = field(default_factory=list)
    cut: int = 0
    memory_reminders: int = 0


def summarise(results: list[RunResult], names: set[str]) -> Summary:
    """Over the runs named: reminded / blocked inside the loop (at or after its start), the
    loop's calls that ran before (unreminded / unblocked runs count the whole loop: the run's
    calls from its start), calls cut."""
    summary = Summary()
    for run in results:
        if run.name not in names:
            continue
        summary.runs += 1
        summary.cut += run.cut
        summary.memory_reminders += run.memory_reminders
        start = run.loop_start if run.loop_start is not None else 0
        whole = max(0, run.calls - start)
        if run.first_remind is not None and run.first_remind >= start:
            summary.reminded += 1
            summary.ran_before_remind.append(run.first_remind - start)
        elif run.first_remind is not None:  # reminded before the labelled loop began
            summary.reminded += 1
            summary.ran_before_remind.append(0)
        else:
            summary.ran_before_remind.append(whole)
        if run.first_block is not None:
            summary.blocked += 1
            summary.ran_before_block.append(max(0, run.first_block - start))
        else:
            summary.ran_before_block.append(whole)
    return summary


def _mean(values: list[int]) -> str:
    return f"{statistics.fmean(values):.1f}" if values else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--markdown", action="store_true", help="print the README table only")
    args = parser.parse_args(argv)
    corpus: Path = args.corpus
    if not (corpus / "manifest.json").is_file():
        print(f"bench_memory: no corpus at {corpus} (../shared/corpus/sequences); skipped")
        return 0
    off = run_corpus(corpus, memory=False)
    on = run_corpus(corpus, memory=True)
    stuck = {r.name for r in off if r.judgement == "stuck"}
    weak = {r.name for r in off if r.judgement == "weak"}
    clean = {r.name for r in off if r.judgement == "no-repetition"}
    # Stuck runs with something to remember: a call an earlier run of the task was blocked for.
    helped = {r.name for r in on if r.name in stuck and r.memory_reminders}
    rows = []
    for label, names in (
        (f"stuck runs ({len(stuck)})", stuck),
        (f"stuck runs with a dead end remembered ({len(helped)})", helped),
        (f"weak runs ({len(weak)}; either way)", weak),
    ):
        a, b = summarise(off, names), summarise(on, names)
        rows.append(
            (
                label,
                f"{a.reminded} / {b.reminded}",
                f"{_mean(a.ran_before_remind)} / {_mean(b.ran_before_remind)}",
                f"{a.blocked} / {b.blocked}",
                f"{_mean(a.ran_before_block)} / {_mean(b.ran_before_block)}",
                f"{a.cut} / {b.cut}",
                f"{a.memory_reminders} / {b.memory_reminders}",
            )
        )
    for side, results in (("memory off", off), ("memory on", on)):
        caught, false = summarise(results, stuck), summarise(results, clean)
        _results.record(f"{side}: stuck runs reminded", caught.reminded, "runs", better="higher")
        loop_calls = statistics.fmean(caught.ran_before_remind) if caught.ran_before_remind else 0
        _results.record(
            f"{side}: loop calls before the reminder, stuck runs (mean)", loop_calls, "calls"
        )
        _results.record(f"{side}: stuck runs blocked", caught.blocked, "runs", better="higher")
        _results.record(f"{side}: false reminders, runs without repetition", false.reminded, "runs")
        _results.record(f"{side}: false blocks, runs without repetition", false.blocked, "runs")
    a, b = summarise(off, clean), summarise(on, clean)
    rows.append(
        (
            f"runs without repetition ({len(clean)}): false",
            f"{a.reminded} / {b.reminded}",
            "",
            f"{a.blocked} / {b.blocked}",
            "",
            f"{a.cut} / {b.cut}",
            f"{a.memory_reminders} / {b.memory_reminders}",
        )
    )
    header = (
        "runs",
        "reminded",
        "loop calls before the reminder",
        "blocked",
        "loop calls before the block",
        "calls cut",
        "reminders from memory",
    )
    if not args.markdown:
        print(f"corpus: {corpus} ({len(off)} runs); each cell: memory off / memory on")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if not args.markdown:
        for run in on:
            if run.memory_reminders:
                print(f"  {run.name} ({run.judgement}): from memory at seq {run.memory_seqs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
