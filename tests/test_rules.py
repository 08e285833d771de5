"""The pure rules (rules.py), on plain values, with boundary pairs at each threshold."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from otel_loopguard import PRESETS, Policy, Rule
from otel_loopguard._rules import (
    Trend,
    Verdict,
    consecutive,
    evaluate,
    no_progress,
    stall,
    trend,
    window,
)


@dataclass
class Sig:
    count: int = 1
    last_outcome: str | None = None
    same_outcomes: int = 0
    changed: bool = False
    failed: bool = False
    novel_seen: int = 0
    looped: bool = False
    refused: int = 0


@dataclass
class Hist:
    window: Sequence[str] = ()
    last_key: str | None = None
    run_length: int = 0
    redundant: int = 0
    novel: int = 0
    sigs: dict[str, Sig] = field(default_factory=dict)

    def signature(self, key: str) -> Sig | None:
        return self.sigs.get(key)


def test_consecutive_counts_the_run_including_the_attempt() -> None:
    assert consecutive(Hist(last_key="a", run_length=2), "a") == Verdict(Rule.CONSECUTIVE, 3)
    assert consecutive(Hist(last_key="b", run_length=9), "a") is None


def test_window_looks_back_size_minus_one_calls() -> None:
    history = Hist(window=["a", "b", "a", "c", "a"])
    assert window(history, "a", size=6) == Verdict(Rule.WINDOW, 4)
    # below: with size 4 only the last 3 calls (a, c, a) are seen
    assert window(history, "a", size=4) == Verdict(Rule.WINDOW, 3)
    assert window(history, "z", size=6) is None


def test_no_progress_counts_the_last_outcome() -> None:
    sig = Sig(count=4, last_outcome="r1", same_outcomes=3)
    assert no_progress(Hist(sigs={"a": sig}), "a") == Verdict(Rule.NO_PROGRESS, 4)
    assert no_progress(Hist(sigs={"a": Sig()}), "a") is None  # outcome unknown
    assert no_progress(Hist(), "a") is None


def test_stall_boundary() -> None:
    threshold = PRESETS["default"].stall_threshold
    seen = {"a": Sig()}
    below = Hist(redundant=threshold - 2, sigs=seen)
    at = Hist(redundant=threshold - 1, sigs=seen)
    assert stall(below, "a", threshold) is None
    assert stall(at, "a", threshold) == Verdict(Rule.STALL, threshold)
    assert stall(Hist(redundant=threshold * 2), "new", threshold) is None  # not redundant itself


def test_trend() -> None:
    assert trend(None) is Trend.UNKNOWN
    assert trend(Sig()) is Trend.UNKNOWN
    assert trend(Sig(last_outcome="x", same_outcomes=1)) is Trend.SAME
    assert trend(Sig(last_outcome="x", same_outcomes=2)) is Trend.SAME
    assert trend(Sig(last_outcome="x", same_outcomes=1, changed=True)) is Trend.CHANGING


def test_evaluate_takes_the_strongest_and_prefers_the_specific_rule_on_ties() -> None:
    policy = PRESETS["default"]
    sig = Sig(count=3, last_outcome="r", same_outcomes=3)
    history = Hist(window=["a", "a", "a"], last_key="a", run_length=3, sigs={"a": sig})
    best, stuck, stalled = evaluate(history, "a", policy)
    assert best == Verdict(Rule.CONSECUTIVE, 4) and stalled is None
    assert stuck == Verdict(Rule.NO_PROGRESS, 4)
    spread = Hist(window=["a", "b", "a", "c", "a"], last_key="a", run_length=1, sigs={"a": sig})
    assert evaluate(spread, "a", policy)[0] == Verdict(Rule.NO_PROGRESS, 4)
    unknown = Hist(
        window=["a", "b", "a", "c", "a"], last_key="a", run_length=1, sigs={"a": Sig(count=3)}
    )
    assert evaluate(unknown, "a", policy)[0] == Verdict(Rule.WINDOW, 4)


def test_disabled_rules_give_nothing() -> None:
    policy = PRESETS["default"].replace(rules=frozenset({Rule.CONSECUTIVE}))
    history = Hist(window=["a", "b", "a"], last_key="a", run_length=1, sigs={"a": Sig(count=2)})
    assert evaluate(history, "a", policy) == (Verdict(Rule.CONSECUTIVE, 2), None, None)
    policy = PRESETS["default"].replace(rules=frozenset())
    assert evaluate(history, "a", policy) == (None, None, None)


def test_no_progress_after_failures_counts_only_a_failing_latest_outcome() -> None:
    from otel_loopguard._rules import identical_failures, no_progress_after_failures

    assert identical_failures is no_progress_after_failures  # the former name, for now

    failing = Hist(sigs={"a": Sig(last_outcome="E", same_outcomes=3, failed=True)})
    assert no_progress_after_failures(failing, "a") == Verdict(Rule.NO_PROGRESS, 3)
    passing = Hist(sigs={"a": Sig(last_outcome="R", same_outcomes=3)})
    assert no_progress_after_failures(passing, "a") is None
    assert no_progress_after_failures(Hist(), "a") is None


def test_a_successful_reread_after_new_calls_is_no_evidence() -> None:
    policy = Policy()
    sig = Sig(count=5, last_outcome="R", same_outcomes=5, novel_seen=3)
    explored = Hist(window=["a"] * 5, last_key="a", run_length=1, novel=4, sigs={"a": sig})
    assert evaluate(explored, "a", policy)[:2] == (None, None)
    nothing_new = Hist(window=["a"] * 5, last_key="a", run_length=1, novel=3, sigs={"a": sig})
    assert evaluate(nothing_new, "a", policy)[0] is not None
    failing = Sig(count=5, last_outcome="E", same_outcomes=5, novel_seen=3, failed=True)
    assert (
        evaluate(Hist(window=["a"] * 5, novel=4, sigs={"a": failing}), "a", policy)[0] is not None
    )
