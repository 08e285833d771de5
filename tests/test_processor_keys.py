"""Whose chain is a tool span: traces, agents, conversations, and one count per call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

from otel_loopguard import PRESETS, Action, LoopGuard, Mode, Phase
from otel_loopguard.processor import LoopGuardSpanProcessor

from .conftest import threshold
from .test_processor import Recording

OBSERVE = PRESETS["default"].replace(mode=Mode.OBSERVE)


def setup(**options: Any) -> tuple[trace.Tracer, LoopGuardSpanProcessor, Recording]:
    guard = LoopGuard(OBSERVE)
    recording = Recording(guard)
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(guard, tracer_provider=provider, **options)
    provider.add_span_processor(processor)
    return provider.get_tracer("t"), processor, recording


@contextmanager
def agent(tracer: trace.Tracer, name: str, **attributes: Any) -> Iterator[trace.Span]:
    with tracer.start_as_current_span(
        f"invoke_agent {name}",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": name,
            **attributes,
        },
    ) as span:
        yield span


def strands_tool(
    tracer: trace.Tracer,
    tool: str,
    arguments: dict[str, Any],
    call_id: str,
    result: str = "r",
    error: bool = False,
    **attributes: Any,
) -> None:
    """A tool span in the Strands shape: arguments in an event, known only at the end."""
    with tracer.start_as_current_span(f"execute_tool {tool}") as span:
        span.set_attributes(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": call_id,
                **attributes,
            }
        )
        span.add_event(
            "gen_ai.tool.message", {"role": "tool", "id": call_id, "content": json.dumps(arguments)}
        )
        span.add_event("gen_ai.choice", {"message": json.dumps([{"text": result}])})
        if error:
            span.set_status(Status(StatusCode.ERROR, "boom"))


def counts(recording: Recording) -> list[int]:
    return [decision.count for _, decision in recording.decisions]


def test_sub_agents_in_one_trace_never_share_a_chain() -> None:
    tracer, _, recording = setup()
    with agent(tracer, "planner"):
        for n in range(3):
            strands_tool(tracer, "search", {"q": "x"}, f"p{n}")
        with agent(tracer, "researcher"):
            for n in range(3):
                strands_tool(tracer, "search", {"q": "x"}, f"r{n}")
        with agent(tracer, "researcher"):  # a second run of the same sub-agent: its own chain
            strands_tool(tracer, "search", {"q": "x"}, "r2-0")
        strands_tool(tracer, "search", {"q": "x"}, "p3")
    assert counts(recording) == [0, 2, 3, 0, 2, 3, 0, 4]
    sessions = [decision.session for _, decision in recording.decisions if decision.session]
    assert len(set(sessions)) == 2


def test_two_traces_never_share_a_chain() -> None:
    tracer, _, recording = setup()
    for _ in range(2):
        with agent(tracer, "same-name"):
            for n in range(3):
                strands_tool(tracer, "search", {"q": "x"}, f"c{n}")
    assert counts(recording) == [0, 2, 3, 0, 2, 3]


def test_conversation_keying_shares_a_chain_across_traces() -> None:
    tracer, _, recording = setup(key_by="conversation")
    conv_1: dict[str, Any] = {"gen_ai.conversation.id": "conv-1"}
    conv_2: dict[str, Any] = {"gen_ai.conversation.id": "conv-2"}
    for n in range(4):  # every call in its own trace, as frameworks that do not propagate do
        strands_tool(tracer, "search", {"q": "x"}, f"c{n}", **conv_1)
    strands_tool(tracer, "search", {"q": "x"}, "other", **conv_2)
    assert counts(recording) == [0, 2, 3, 4, 0]
    assert recording.decisions[1][1].session == "conv-1"


def test_conversation_keying_starts_a_new_epoch_on_a_new_run() -> None:
    tracer, _, recording = setup(key_by="conversation")
    for _ in range(2):
        with agent(tracer, "a", **{"gen_ai.conversation.id": "conv-1"}):
            for n in range(3):
                strands_tool(tracer, "search", {"q": "x"}, f"c{n}")
    assert counts(recording) == [0, 2, 3, 0, 2, 3]


def test_hook_and_span_for_one_call_count_once() -> None:
    tracer, processor, recording = setup()
    guard = processor.guard
    hook_counts = []
    with agent(tracer, "a"):
        for n in range(4):
            keys = processor.current_session()
            assert keys is not None
            session, agent_name = keys
            decision = guard.before_tool(
                "search", {"q": "x"}, session=session, agent=agent_name, call_id=f"call-{n}"
            )
            hook_counts.append(decision.count)
            strands_tool(tracer, "search", {"q": "x"}, f"call-{n}")
    assert hook_counts == [0, 2, 3, 4]
    assert recording.decisions == []  # every span only added the outcome of the hook's call


def test_a_blocked_call_without_a_span_still_counts() -> None:
    # Strands and LangGraph emit no span for a call their hook blocked: the guard counts it.
    guard = LoopGuard(PRESETS["default"])
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(guard, tracer_provider=provider)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    actions = []
    with agent(tracer, "a"):
        for n in range(8):
            session, agent_name = processor.current_session() or ("", None)
            decision = guard.before_tool(
                "search", {"q": "x"}, session=session, agent=agent_name, call_id=f"c{n}"
            )
            actions.append(decision.action)
            if not decision.blocks:
                strands_tool(tracer, "search", {"q": "x"}, f"c{n}")
    assert actions.index(Action.DENY) == threshold(PRESETS["default"].no_progress_threshold) - 1
    assert actions[-1] is Action.STOP


def test_bookkeeping_is_freed_when_the_trace_ends() -> None:
    tracer, processor, _ = setup()
    with (
        agent(tracer, "a"),
        tracer.start_as_current_span(
            "execute_tool search",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "search",
                "gen_ai.tool.call.arguments": '{"q": 1}',
                "logfire.msg": "x",
            },
        ),
    ):
        assert len(processor._open) == 2
    assert processor._open == {} and processor._started == {}


def test_error_status_is_an_error_outcome() -> None:
    # the span's error status makes the same text a failure: the third identical failure is a
    # stop concluded after the call ran (failure_stop_threshold; observe: detected)
    tracer, _, recording = setup()
    with agent(tracer, "a"):
        for n in range(3):
            strands_tool(tracer, "build", {}, f"e{n}", result="failed", error=True)
    third = recording.decisions[2][1]
    assert (third.phase, third.detected, third.count) == (Phase.POST, Action.STOP, 3)
    # the same text without the error status is a success that came back the same: reminded
    # at the third call, no stop (were the status lost, the spans above would look like this)
    tracer, _, recording = setup()
    with agent(tracer, "a"):
        for n in range(3):
            strands_tool(tracer, "build", {}, f"ok{n}", result="failed", error=False)
    assert [d.detected for _, d in recording.decisions] == [
        Action.ALLOW,
        Action.ALLOW,
        Action.REMIND,
    ]


def test_constructor_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="key_by"):
        LoopGuardSpanProcessor(key_by="tenant")
    with pytest.raises(ValueError, match="max_tracked_spans"):
        LoopGuardSpanProcessor(max_tracked_spans=0)
    with pytest.raises(ValueError, match="guard"):
        LoopGuardSpanProcessor(guard="yes")  # type: ignore[arg-type]
