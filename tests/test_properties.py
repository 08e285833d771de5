"""Invariants, property-tested: key order, transparency, isolation, never raising."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from otel_loopguard import PRESETS, Action, LoopGuard
from otel_loopguard._calls import ToolCall

DEFAULT = PRESETS["default"]

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same value with every object's keys in another insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


@pytest.mark.slow
@given(json_values, st.randoms())
def test_key_order_never_matters(value: Any, rng: random.Random) -> None:
    a = ToolCall.build("tool", value, session="s")
    b = ToolCall.build("tool", shuffled(value, rng), session="s")
    assert a.args_key == b.args_key


@pytest.mark.slow
@given(st.dictionaries(st.text(max_size=6), json_values, max_size=4), st.randoms())
def test_json_string_and_object_give_one_key(value: dict[str, Any], rng: random.Random) -> None:
    import json

    if any(isinstance(v, float) and not math.isfinite(v) for v in _leaves(value)):
        return  # JSON text has no NaN/inf
    as_text = json.dumps(shuffled(value, rng))
    assert (
        ToolCall.build("t", as_text, session="s").args_key
        == ToolCall.build("t", value, session="s").args_key
    )


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


tracked_calls = st.lists(
    st.tuples(st.sampled_from(["grep", "read", "ls"]), st.integers(0, 2), st.integers(0, 1)),
    max_size=40,
)


@pytest.mark.slow
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(tracked_calls, st.lists(st.integers(0, 40), max_size=15))
def test_untracked_calls_are_transparent(
    calls: list[tuple[str, int, int]], positions: list[int]
) -> None:
    policy = DEFAULT.replace(exclude=("todo*",), exclude_commands=(r"^docker ps",))

    def decide(with_noise: bool) -> list[tuple[Action, int]]:
        guard = LoopGuard(policy)
        noise = set(positions) if with_noise else set()
        out = []
        for index, (tool, arg, result) in enumerate(calls):
            if index in noise:
                guard.before_tool("TodoWrite", {"todos": [index]}, session="s")
                guard.after_tool("TodoWrite", {"todos": [index]}, session="s", result="ok")
                guard.before_tool("bash", {"command": "docker ps"}, session="s")
                guard.after_tool("bash", {"command": "docker ps"}, session="s", result=index)
            decision = guard.before_tool(tool, {"a": arg}, session="s")
            out.append((decision.action, decision.count))
            if not decision.blocks:
                guard.after_tool(tool, {"a": arg}, session="s", result=result)
        return out

    assert decide(True) == decide(False)


@pytest.mark.slow
@settings(max_examples=100)
@given(tracked_calls, tracked_calls, st.randoms())
def test_sessions_are_isolated(
    a: list[tuple[str, int, int]], b: list[tuple[str, int, int]], rng: random.Random
) -> None:
    def alone(calls: list[tuple[str, int, int]]) -> list[Action]:
        guard = LoopGuard(DEFAULT)
        return [guard.before_tool(t, {"a": x}, session="only").action for t, x, _ in calls]

    tagged = [("A", c) for c in a] + [("B", c) for c in b]
    # interleave while keeping each session's own order
    order = sorted(range(len(tagged)), key=lambda i: (rng.random(), i))
    queues = {"A": list(a), "B": list(b)}
    guard = LoopGuard(DEFAULT)
    seen: dict[str, list[Action]] = {"A": [], "B": []}
    for i in order:
        session = tagged[i][0]
        tool, x, _ = queues[session].pop(0)
        seen[session].append(guard.before_tool(tool, {"a": x}, session=session).action)
    assert seen["A"] == alone(a)
    assert seen["B"] == alone(b)


anything = st.one_of(
    json_values,
    st.binary(max_size=64),
    st.builds(object),
    st.sets(st.integers(), max_size=4),
    st.dictionaries(st.integers() | st.text(max_size=3), json_values, max_size=3),
    st.tuples(st.floats(), st.text()),
)


@pytest.mark.slow
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(anything, anything, anything, anything, anything, anything, st.none() | st.booleans())
def test_no_input_makes_the_hooks_raise(
    tool: Any, arguments: Any, session: Any, agent: Any, call_id: Any, result: Any, error: Any
) -> None:
    guard = LoopGuard(DEFAULT)
    for _ in range(3):
        decision = guard.before_tool(tool, arguments, session=session, agent=agent, call_id=call_id)
        assert isinstance(decision.action, Action)
        guard.after_tool(
            tool,
            arguments,
            session=session,
            agent=agent,
            call_id=call_id,
            error=error,
            result=result,
            duration_seconds=result,
        )
        guard.user_message(session)
    assert guard.internal_errors == {}


# One step of an agent: ("prompt",) or (tool, argument, result or None when not reported, error,
# whether the host gives call ids). Small alphabets so that repeats, denials and stops happen.
agent_steps = st.lists(
    st.one_of(
        st.just(("prompt",)),
        st.tuples(
            st.sampled_from(["read", "grep", "edit", "bash"]),
            st.integers(0, 2),
            st.none() | st.integers(0, 1),
            st.booleans(),
            st.booleans(),
        ),
    ),
    max_size=60,
)


@pytest.mark.slow
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(agent_steps, st.sampled_from(sorted(PRESETS)))
# The whole ladder up to stop, then a different call (still stopped) and a prompt (lifted):
@example(
    [("read", 0, None, False, True)] * 10
    + [("grep", 1, 0, False, True), ("prompt",), ("grep", 1, 0, False, True)],
    "default",
)
@example(
    [("read", 0, 0, False, False)] * 9
    + [("edit", 1, 0, False, False)]
    + [("read", 0, 0, False, False)] * 3,
    "default",
)
def test_a_session_saved_between_calls_decides_as_one_kept_in_memory(
    steps: list[tuple[Any, ...]], preset: str
) -> None:
    """What command hooks do (a new process, hence a new guard, per call; the session saved as
    bytes in between) never changes a decision."""
    from otel_loopguard._engine import SessionState

    policy = PRESETS[preset]
    clock = lambda: 1000.0  # noqa: E731 - no TTL expiry in either run
    kept = LoopGuard(policy, clock=clock)
    saved: bytes | None = None

    def fresh_guard() -> LoopGuard:
        guard = LoopGuard(policy, clock=clock)
        if saved is not None:
            guard.import_session("s", SessionState.from_bytes(saved, policy))
        return guard

    def save(guard: LoopGuard) -> bytes | None:
        state = guard.export_session("s")
        return saved if state is None else state.to_bytes()

    for index, step in enumerate(steps):
        if step[0] == "prompt":
            kept.user_message("s")
            guard = fresh_guard()
            guard.user_message("s")
            saved = save(guard)
            continue
        tool, argument, result, error, with_ids = step
        arguments = {"command": f"ls {argument}"} if tool == "bash" else {"path": f"f{argument}"}
        call_id = f"call-{index}" if with_ids else None
        guard = fresh_guard()
        expected = kept.before_tool(tool, arguments, session="s", call_id=call_id)
        got = guard.before_tool(tool, arguments, session="s", call_id=call_id)
        assert got == expected
        saved = save(guard)
        if result is None or expected.blocks:
            continue
        guard = fresh_guard()
        expected_after = kept.after_tool(
            tool, arguments, session="s", call_id=call_id, result=f"r{result}", error=error
        )
        got_after = guard.after_tool(
            tool, arguments, session="s", call_id=call_id, result=f"r{result}", error=error
        )
        assert got_after == expected_after
        saved = save(guard)
