"""Intent versus action on real agent runs: how often the intent sentence fires (issue 27).

    python benchmarks/bench_intent.py                      # ../shared/corpus/trajectories
    python benchmarks/bench_intent.py --corpus DIR         # another labelled corpus folder

Each run goes call by call through a guard (``default`` preset) as a model's requests
(``LoopGuard.decide_requested``, one response per call), then reports the call's outcome
(``after_tool``). The model's text of a turn is what the run recorded of it: the narration
fields of the call's own arguments (``thought``, ``reasoning``, ``explanation``, ``description``,
``comment``), else the ``thought`` of the ``think`` call just before it (tau-bench's thinking
tool). The corpus records no other assistant text (its README and evaluator say so): runs
without such fields cannot fire, and are counted apart.

Printed per judgement (stuck, weak, productive-repetition, no-repetition): runs, runs with
model text, calls with text, calls whose text announces a change of approach, announced calls
that repeat an earlier call, and the decisions whose text gained the intent sentence (the check
"fires"); productive and no-repetition rows are false alarms. Without the corpus folder the
script says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this checkout's package, unless PYTHONPATH names another one (benchmarks/compare.py does)
sys.path.append(str(ROOT))

from _results import record  # noqa: E402

from otel_loopguard import Action, LoopGuard  # noqa: E402
from otel_loopguard._intent import says_new_approach  # noqa: E402
from otel_loopguard.config import PRESETS  # noqa: E402

DEFAULT_CORPUS = Path("..") / "shared" / "corpus" / "trajectories"
NARRATION = ("thought", "reasoning", "explanation", "description", "comment")
SENTENCE = "You said you would change approach"
THINK_TOOLS = frozenset({"think"})


def narration(arguments: object) -> str:
    if not isinstance(arguments, dict):
        return ""
    return "\n".join(
        str(arguments[key]) for key in NARRATION if isinstance(arguments.get(key), str)
    )


def run_file(path: Path) -> Counter[str]:
    """One run through a guard: the counts of the module docstring."""
    guard = LoopGuard(PRESETS["default"])
    counts: Counter[str] = Counter()
    pending_text = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("type") == "user_message":
            guard.user_message("run")
            continue
        tool, arguments = record["tool"], record["arguments"]
        text = narration(arguments)
        if tool in THINK_TOOLS:
            pending_text = text
            text = ""
        elif not text:
            text, pending_text = pending_text, ""
        call_id = f"call_{record['seq']}"
        (decision,) = guard.decide_requested([(tool, arguments, call_id)], session="run", text=text)
        if text:
            counts["calls_with_text"] += 1
            if says_new_approach(text):
                counts["announced"] += 1
                if decision.repeated:
                    counts["announced_repeats"] += 1
        if SENTENCE in decision.message:
            counts["fired"] += 1
            if decision.action in (Action.DENY, Action.RESCUE, Action.STOP):
                counts["fired_on_block"] += 1
        guard.after_tool(
            tool,
            arguments,
            session="run",
            call_id=call_id,
            error=record.get("is_error"),
            result=record.get("result"),
        )
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    options = parser.parse_args(argv)
    labels_path = options.corpus / "labels.json"
    if not labels_path.is_file():
        print(f"bench_intent: no corpus at {options.corpus} (labels.json missing); skipped")
        return 0
    labels = json.loads(labels_path.read_text(encoding="utf-8"))
    rows: dict[str, Counter[str]] = {}
    for name, label in sorted(labels.items()):
        path = options.corpus / name
        if not path.is_file():
            continue
        counts = run_file(path)
        row = rows.setdefault(label["judgement"], Counter())
        row["runs"] += 1
        row["runs_with_text"] += bool(counts["calls_with_text"])
        row["runs_fired"] += bool(counts["fired"])
        row.update(counts)
    columns = [
        "runs",
        "runs_with_text",
        "calls_with_text",
        "announced",
        "announced_repeats",
        "fired",
        "fired_on_block",
        "runs_fired",
    ]
    print("| judgement | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for judgement in ("stuck", "weak", "productive-repetition", "no-repetition"):
        row = rows.get(judgement, Counter())
        print(f"| {judgement} | " + " | ".join(str(row[c]) for c in columns) + " |")
        if judgement == "stuck":
            record("stuck: runs where it fired", row["runs_fired"], "runs", better="higher")
        else:  # a false alarm
            record(f"{judgement}: runs where it fired", row["runs_fired"], "runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
