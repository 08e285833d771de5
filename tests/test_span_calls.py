"""The one way from a span to the guard (otel_loopguard._span_calls), on its own: the start
gate, the rule for calls without arguments, the keys an end reuses. The parity suites
(test_processor*, test_traces, test_replay_traces, test_exporter) test it through its callers."""

from __future__ import annotations

from otel_loopguard._conventions import MISSING
from otel_loopguard._guard import LoopGuard
from otel_loopguard._policy import Action
from otel_loopguard._span_calls import (
    call_at_end,
    call_at_start,
    call_ended,
    call_started,
    duration_seconds,
    run_started,
)
from otel_loopguard.config import PRESETS

PYDANTIC_AT_START = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "search",
    "gen_ai.tool.call.id": "call-1",
    "gen_ai.tool.call.arguments": '{"q": "x"}',
    "logfire.msg": "running tool: search",
}
SEMCONV_AT_END = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "search",
    "gen_ai.tool.call.arguments": '{"q": "x"}',
}


def test_only_a_span_with_its_arguments_at_start_is_decided_then() -> None:
    call = call_at_start("execute_tool search", PYDANTIC_AT_START)
    assert call is not None and call.arguments == {"q": "x"} and call.call_id == "call-1"
    # The same span under a name outside the start gate, a semconv span (arguments come
    # later), and one recognised without arguments: none decided at start.
    assert call_at_start("tool search", PYDANTIC_AT_START) is None
    assert call_at_start("execute_tool search", SEMCONV_AT_END) is None
    bare = {k: v for k, v in PYDANTIC_AT_START.items() if k != "gen_ai.tool.call.arguments"}
    assert call_at_start("execute_tool search", bare) is None
    # At its end the semconv span is a call.
    ended = call_at_end("execute_tool search", SEMCONV_AT_END, (), True)
    assert ended is not None and ended.arguments == {"q": "x"} and ended.is_error is True


def test_a_call_without_arguments_counts_only_when_the_policy_says_so() -> None:
    skipping = LoopGuard(PRESETS["default"])
    found: list[int] = []

    def keys() -> tuple[str, str | None, str | None]:
        found.append(1)
        return ("s", None, None)

    assert call_ended(skipping, "search", MISSING, keys, None, None, None) is None
    assert found == []  # the keys are not even looked for
    counting = LoopGuard(PRESETS["default"].replace(count_calls_without_arguments=True))
    ended = [call_ended(counting, "search", MISSING, keys, None, "r", 0.5) for _ in range(3)]
    assert found == [1, 1, 1]
    assert all(e is not None and e[:2] == (("s", None, None), {}) for e in ended)
    decisions = [e[2] for e in ended if e is not None]
    assert decisions[-1] is not None and decisions[-1].count == 3


def test_an_end_after_a_start_adds_only_the_outcome() -> None:
    guard = LoopGuard(PRESETS["default"])
    keys = ("s", "planner", "call-1")
    decision = call_started(guard, "search", {"q": "x"}, keys)
    assert decision.action is Action.ALLOW
    ended = call_ended(guard, "search", {"q": "x"}, keys, False, "r", 1.0)
    assert ended == (keys, {"q": "x"}, None)


def test_runs_and_durations() -> None:
    agent = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "planner",
        "gen_ai.conversation.id": "conv-7",
    }
    assert run_started("invoke_agent planner", agent) == ("conv-7", "planner")
    no_conversation = {k: v for k, v in agent.items() if k != "gen_ai.conversation.id"}
    assert run_started("invoke_agent planner", no_conversation) is None
    assert run_started("chat gpt-4o", {"gen_ai.operation.name": "chat"}) is None
    assert duration_seconds(1_000_000_000, 3_500_000_000) == 2.5
    assert duration_seconds(5, 1) == 0.0 and duration_seconds(None, 1) is None
