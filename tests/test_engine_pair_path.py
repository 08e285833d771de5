"""The pair path's shortcuts (issue 29, item 2) give what the general code gives: the keying in
one call, frozen records built through their slot setters, a plain outcome recorded without the
general outcome path, and no recorder calls without metrics."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
import random
from typing import Any

import pytest

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard._calls import args_key, canonical_and_key, canonical_json
from otel_loopguard._decision import ALLOW_STEP, Action, Decision, Phase, Step
from otel_loopguard._engine import SessionState
from otel_loopguard._record import slot_setters
from otel_loopguard._rules import Verdict, consecutive, evaluate, no_progress, stall, window
from otel_loopguard.config import Policy, Rule
from otel_loopguard.metrics import PrometheusRecorder


class _Opaque:
    """Not JSON: orjson refuses it, so keying takes the slow path."""

    def __repr__(self) -> str:
        return "opaque"


@pytest.mark.parametrize(
    "value",
    [
        {"path": "src", "pattern": "TODO"},
        {"b": 1, "a": [1, 2, {"z": None, "y": 2.5}]},
        {"x": math.nan, "y": math.inf, "z": None},
        {"x": -math.inf},
        {"text": "caf\u00e9 \ud800"},  # a lone surrogate: orjson refuses it
        {"obj": _Opaque()},
        {1: "int key", "k": (1, 2)},
        [1, "two", None],
        "plain",
        None,
        {},
    ],
)
@pytest.mark.parametrize("tool", ["grep", "t\u00e9l\u00e9", "bad\udc80tool"])
def test_canonical_and_key_gives_the_two_functions_bytes_and_key(value: object, tool: str) -> None:
    canonical = canonical_json(value)
    assert canonical_and_key(tool, value) == (canonical, args_key(tool, canonical))


def test_frozen_records_built_through_slot_setters_keep_every_field() -> None:
    values: list[Any] = [
        Action.DENY,
        "m",
        Rule.CONSECUTIVE,
        3,
        2,
        "abc",
        "grep",
        "s",
        True,
        Action.STOP,
        "hash",
        Phase.POST,
        7,
        0.5,
    ]
    decision = Decision(*values)
    assert [getattr(decision, f.name) for f in dataclasses.fields(Decision)] == values
    assert dataclasses.replace(decision, message="n").message == "n"
    assert dataclasses.replace(decision, message="n").loop_cost_usd == 0.5
    assert pickle.loads(pickle.dumps(decision)) == decision
    assert copy.copy(decision) == decision
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.count = 4  # type: ignore[misc]
    step = Step(Action.STOP, Rule.WINDOW, 5, 4, True, False, 2, 1, 3, 6, None, None)
    assert (step.count, step.threshold, step.denials, step.failures, step.refused) == (
        5,
        4,
        2,
        1,
        3,
    )
    assert (step.detailed, step.polling, step.deny_threshold) == (True, False, 6)
    assert Step(Action.ALLOW) == ALLOW_STEP
    assert hash(Verdict(Rule.WINDOW, 3, 1)) == hash(Verdict(Rule.WINDOW, 3, 1))
    assert Verdict(Rule.WINDOW, 3, 1).attempts == 4


def test_slot_setters_are_the_fields_in_order() -> None:
    setters = slot_setters(Verdict)
    assert len(setters) == len(Verdict.__slots__) == 3
    verdict = Verdict(Rule.WINDOW, 1)
    setters[1](verdict, 9)
    assert verdict.count == 9 and verdict.rule is Rule.WINDOW


def _pairs(guard: LoopGuard, calls: int) -> list[object]:
    seen: list[object] = []
    for i in range(calls):
        arguments = {"pattern": "TODO" if i % 3 else f"p{i}", "path": "src"}
        decision = guard.before_tool("grep", arguments, session="s")
        seen.append((decision.action, decision.count, decision.message))
        if not decision.blocks:
            error = i % 5 == 4
            seen.append(
                guard.after_tool(
                    "grep", arguments, session="s", result="no match", error=error or None
                )
            )
    return seen


def test_metrics_on_or_off_the_same_decisions_and_the_metrics_counted() -> None:
    recorder = PrometheusRecorder()
    metered = LoopGuard(PRESETS["default"], recorder=recorder)
    plain = LoopGuard(PRESETS["default"])
    assert _pairs(metered, 12) == _pairs(plain, 12)
    registry = recorder.registry
    labels = {"agent": "none", "tool": "grep"}
    assert registry.get_sample_value("loopguard_tool_calls_total", labels) == 12
    assert registry.get_sample_value("loopguard_repeated_calls_total", labels) == 7
    decided = sum(
        sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if sample.name == "loopguard_decisions_total"
    )
    assert decided >= 1  # repeats that reached the ladder are counted


def _evaluate_by_the_rules(
    history: SessionState, key: str, policy: Policy
) -> tuple[Verdict | None, Verdict | None, Verdict | None]:
    """evaluate as the rule functions compose it (its code before the rules were written out in
    it): the reference the written-out evaluate must equal."""
    signature = history.signature(key)
    if signature is None:
        return None, None, None
    rules = policy.rules
    if (
        signature.last_outcome is not None
        and not signature.failed
        and not signature.looped
        and history.novel > signature.novel_seen
    ):
        return (
            None,
            None,
            stall(history, key, policy.stall_threshold) if Rule.STALL in rules else None,
        )
    preference = {Rule.CONSECUTIVE: 0, Rule.NO_PROGRESS: 1, Rule.WINDOW: 2}
    best: Verdict | None = None
    stuck = no_progress(history, key) if Rule.NO_PROGRESS in rules else None
    candidates = (
        consecutive(history, key) if Rule.CONSECUTIVE in rules else None,
        stuck,
        window(history, key, policy.window_size) if Rule.WINDOW in rules else None,
    )
    for verdict in candidates:
        if verdict is not None and (
            best is None
            or verdict.count > best.count
            or (verdict.count == best.count and preference[verdict.rule] < preference[best.rule])
        ):
            best = verdict
    stalled = stall(history, key, policy.stall_threshold) if Rule.STALL in rules else None
    return best, stuck, stalled


@pytest.mark.parametrize("seed", range(40))
def test_evaluate_equals_its_rules_composed(seed: int) -> None:
    rng = random.Random(seed)
    all_rules = [Rule.CONSECUTIVE, Rule.WINDOW, Rule.NO_PROGRESS, Rule.STALL]
    policy = PRESETS["default"].replace(
        rules=frozenset(r for r in all_rules if rng.random() < 0.75),
        window_size=rng.choice([2, 3, 5, 8]),
        stall_threshold=rng.choice([2, 4, 6, 30]),
    )
    state = SessionState(0.0)
    keys = [f"k{i}" for i in range(rng.choice([1, 2, 3, 6]))]
    compared = 0
    for _ in range(60):
        key = rng.choice(keys)
        assert evaluate(state, key, policy) == _evaluate_by_the_rules(state, key, policy)
        compared += state.signature(key) is not None
        state.record_attempt(key, policy, blocked=rng.random() < 0.1, explores=rng.random() < 0.7)
        if rng.random() < 0.8:
            outcome = rng.choice(["a", "a", "b", None])
            state.record_outcome(key, outcome, failed=rng.random() < 0.3)
        if rng.random() < 0.03:
            state.new_epoch()
    assert compared > 10
