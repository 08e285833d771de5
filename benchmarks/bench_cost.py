"""What loops cost, on real runs: prices checked against the provider's figures, spend on repeats.

    python benchmarks/bench_cost.py                      # ../shared/corpus/trajectories
    python benchmarks/bench_cost.py --corpus DIR --markdown

1. **Prices.** Every model turn of the corpus that carries the provider's own cost
   (``usage.reported_cost_usd``: OpenRouter's figure) is priced again from its token counts alone
   (:class:`otel_loopguard._prices.Pricer`, genai-prices' bundled snapshot), and the two are
   compared: the ratio of the totals, and how many turns agree within 1%.
2. **Spend on repeats.** Each run with usage goes through the default policy's guard (the hook
   API, as ``replay`` feeds it: ``before_tool``, then ``after_tool`` with the recorded outcome);
   a turn whose call the guard counted as a repeat (its arguments already seen in the progress
   epoch) is spend on repeats; a stop (before or after a call) ends the run there, and the turns
   after it are what the stop would have avoided.
3. **Stuck runs.** The labelled stuck runs carry no usage (their sources recorded none): their
   calls inside the labelled loop are priced at the mean cost of a turn of the runs that do, an
   **estimate**, labelled so.

Without the corpus folder the script says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _results import record

DEFAULT_CORPUS = Path("..") / "shared" / "corpus" / "trajectories"


@dataclass
class Run:
    name: str
    judgement: str
    calls: list[dict[str, Any]]
    label: dict[str, Any]


@dataclass
class Spend:
    runs: int = 0
    turns: int = 0
    usd: float = 0.0
    tokens: int = 0
    repeat_turns: int = 0
    repeat_usd: float = 0.0
    repeat_tokens: int = 0
    stopped_runs: int = 0
    avoided_usd: float = 0.0
    avoided_tokens: int = 0
    blocked: dict[str, int] = field(default_factory=dict)


def load(corpus: Path) -> list[Run]:
    labels = json.loads((corpus / "labels.json").read_text())
    runs = []
    for path in sorted(corpus.glob("*.jsonl")):
        calls = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        label = labels[path.name]
        runs.append(Run(path.name, label["judgement"], calls, label))
    return runs


def check_prices(runs: list[Run]) -> dict[str, Any]:
    from otel_loopguard._prices import ModelUsage, Pricer

    pricer = Pricer()
    computed_total = reported_total = 0.0
    ratios: list[float] = []
    within = unpriced = 0
    for run in runs:
        for call in run.calls:
            usage = call.get("usage")
            if not usage or usage.get("reported_cost_usd") is None:
                continue
            tokens = ModelUsage.checked(
                usage["model"],
                input_tokens=usage["input_tokens"],
                output_tokens=usage["output_tokens"],
                cache_read_tokens=usage.get("cache_read_input_tokens") or 0,
            )
            cost = pricer.cost(tokens)
            reported = float(usage["reported_cost_usd"])
            if cost.usd is None:
                unpriced += 1
                continue
            computed_total += cost.usd
            reported_total += reported
            if reported > 0:
                ratios.append(cost.usd / reported)
                within += abs(cost.usd / reported - 1) <= 0.01
    return {
        "turns": len(ratios),
        "unpriced": unpriced,
        "computed_usd": computed_total,
        "reported_usd": reported_total,
        "ratio_of_totals": computed_total / reported_total if reported_total else float("nan"),
        "within_1pct": within,
        "ratio_min": min(ratios, default=float("nan")),
        "ratio_median": statistics.median(ratios) if ratios else float("nan"),
        "ratio_max": max(ratios, default=float("nan")),
    }


def _turn(call: dict[str, Any], pricer: Any) -> tuple[float, int] | None:
    from otel_loopguard._prices import ModelUsage

    usage = call.get("usage")
    if not usage:
        return None
    tokens = ModelUsage.checked(
        usage["model"],
        input_tokens=usage["input_tokens"],
        output_tokens=usage["output_tokens"],
        cache_read_tokens=usage.get("cache_read_input_tokens") or 0,
        reported_cost_usd=usage.get("reported_cost_usd"),
    )
    cost = pricer.cost(tokens)
    return (cost.usd or 0.0), tokens.tokens


def spend_on_repeats(runs: list[Run]) -> dict[str, Spend]:
    """Per judgement group, the runs with usage through the default policy's guard."""
    from otel_loopguard import PRESETS, LoopGuard
    from otel_loopguard._prices import Pricer

    pricer = Pricer()
    groups: dict[str, Spend] = {}
    for run in runs:
        turns = [_turn(call, pricer) for call in run.calls if call.get("type") != "user_message"]
        if not any(turns):
            continue
        spend = groups.setdefault(run.judgement, Spend())
        spend.runs += 1
        guard = LoopGuard(PRESETS["default"])
        stopped_at: int | None = None
        index = -1
        for call in run.calls:
            if call.get("type") == "user_message":
                guard.user_message("run")
                continue
            index += 1
            turn = turns[index] or (0.0, 0)
            spend.turns += 1
            spend.usd += turn[0]
            spend.tokens += turn[1]
            if stopped_at is not None:
                spend.avoided_usd += turn[0]
                spend.avoided_tokens += turn[1]
                continue
            decision = guard.before_tool(call["tool"], call["arguments"], session="run")
            if decision.repeated:
                spend.repeat_turns += 1
                spend.repeat_usd += turn[0]
                spend.repeat_tokens += turn[1]
            action = decision.action.value
            if action != "allow":
                spend.blocked[action] = spend.blocked.get(action, 0) + 1
            if action == "stop":
                stopped_at = index
                continue
            post = guard.after_tool(
                call["tool"],
                call["arguments"],
                session="run",
                error=call.get("is_error"),
                result=call.get("result"),
            )
            if post is not None and post.action.value == "stop":
                stopped_at = index
        spend.stopped_runs += stopped_at is not None
    return groups


def stuck_estimate(
    runs: list[Run], mean_turn_usd: float, mean_turn_tokens: float
) -> dict[str, Any]:
    """The stuck runs' calls from the loop's start to the run's end, priced at the mean turn."""
    stuck = [run for run in runs if run.judgement == "stuck"]
    in_loops = 0
    for run in stuck:
        start = run.label.get("loop_start_seq")
        calls = [c for c in run.calls if c.get("type") != "user_message"]
        in_loops += sum(1 for c in calls if start is not None and c["seq"] >= start)
    return {
        "runs": len(stuck),
        "with_usage": sum(1 for run in stuck if any(c.get("usage") for c in run.calls)),
        "calls_from_loop_start": in_loops,
        "estimate_usd": in_loops * mean_turn_usd,
        "estimate_tokens": in_loops * mean_turn_tokens,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--markdown", action="store_true", help="print the README tables")
    args = parser.parse_args(argv)
    if not (args.corpus / "labels.json").is_file():
        print(f"no corpus at {args.corpus} (labels.json missing): nothing to measure")
        return 0
    runs = load(args.corpus)
    prices = check_prices(runs)
    groups = spend_on_repeats(runs)
    turns = sum(g.turns for g in groups.values())
    mean_usd = sum(g.usd for g in groups.values()) / turns if turns else 0.0
    mean_tokens = sum(g.tokens for g in groups.values()) / turns if turns else 0.0
    stuck = stuck_estimate(runs, mean_usd, mean_tokens)
    record(
        "prices: turns within 1% of the reported cost",
        prices["within_1pct"],
        "turns",
        better="higher",
    )
    record("prices: unpriced turns", prices["unpriced"], "turns")
    for name, g in sorted(groups.items()):  # runs with usage: none is labelled stuck
        record(f"{name}: runs stopped", g.stopped_runs, "runs")
        record(f"{name}: calls blocked", sum(g.blocked.values()), "calls")
    if args.markdown:
        print(
            "| turns with a reported cost | computed / reported (totals) | within 1% |"
            " per-turn ratio min / median / max | unpriced |"
        )
        print("| ---: | ---: | ---: | --- | ---: |")
        print(
            f"| {prices['turns']:,} | {prices['ratio_of_totals']:.6f}"
            f" (${prices['computed_usd']:.4f} / ${prices['reported_usd']:.4f})"
            f" | {prices['within_1pct']:,} | {prices['ratio_min']:.4f} /"
            f" {prices['ratio_median']:.4f} / {prices['ratio_max']:.4f} | {prices['unpriced']} |"
        )
        print()
        print(
            "| runs with usage (judgement) | runs | turns | spend | spend on repeats |"
            " tokens on repeats | default's blocks | stopped | spend after the stop |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
        for name, g in sorted(groups.items()):
            share = g.repeat_usd / g.usd if g.usd else 0.0
            blocks = ", ".join(f"{k} {v}" for k, v in sorted(g.blocked.items())) or "none"
            print(
                f"| {name} | {g.runs} | {g.turns:,} | ${g.usd:.2f} | ${g.repeat_usd:.2f}"
                f" ({share:.1%}) | {g.repeat_tokens:,} | {blocks} | {g.stopped_runs} |"
                f" ${g.avoided_usd:.2f} |"
            )
        print()
        print(
            f"Stuck runs: {stuck['runs']}, {stuck['with_usage']} with usage. Their"
            f" {stuck['calls_from_loop_start']:,} calls from the labelled loop's start to the"
            f" run's end at the mean turn of the runs above (${mean_usd:.4f},"
            f" {mean_tokens:,.0f} tokens): an estimate of ${stuck['estimate_usd']:.2f} and"
            f" {stuck['estimate_tokens']:,.0f} tokens."
        )
    else:
        print(
            json.dumps(
                {
                    "prices": prices,
                    "groups": {k: vars(v) for k, v in groups.items()},
                    "stuck_estimate": stuck,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
