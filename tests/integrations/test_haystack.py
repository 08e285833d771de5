"""Haystack agents, driven for real offline: Haystack's own MockChatGenerator playing a model that
loops, an Agent with the LoopGuardHooks (sync and async runs), and Haystack's tracing through
opentelemetry-haystack's OpenTelemetryTracer writing spans to the processor's provider. The hooks
see the model's call ids; the tool spans have none and end before the after_tool hook."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from otel_loopguard import LoopGuard
from otel_loopguard.metrics import PrometheusRecorder

from .conftest import (
    ARGUMENTS,
    FAILURE,
    FAILURE_STOP,
    FAILURE_STOP_DECISION,
    FINAL,
    FIRST_DENY,
    FIRST_STOP,
    POLICY,
    PROMPTS,
    REFERENCE,
    SAFETY_CAP,
    TOOL,
    Script,
    Tracing,
    advised_guard,
    calls_seen,
    expected_tool_results,
    require,
    tool_spans,
)
from .scripted import DETOUR_CALLS, OTHER_RESULTS, OTHER_TOOL, Detour

# Read when haystack is imported: no usage telemetry (offline), and tool arguments and results on
# the tool spans (without content tracing the spans carry the tool name only).
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
os.environ.setdefault("HAYSTACK_CONTENT_TRACING_ENABLED", "true")

require("haystack")

from haystack.components.agents import Agent  # noqa: E402
from haystack.components.generators.chat import MockChatGenerator  # noqa: E402
from haystack.dataclasses import ChatMessage, ToolCall  # noqa: E402
from haystack.tools import tool  # noqa: E402

from otel_loopguard.integrations.haystack import STOP_REASON, LoopGuardHooks  # noqa: E402

#: The model's next call, or None to answer, from the last tool result it read.
Plan = Callable[[str | None], "tuple[str, dict[str, str]] | None"]

TASK = "What's the weather in Paris?"


def looping(script: Script) -> Plan:
    return lambda last: (TOOL, dict(ARGUMENTS)) if script.next_call(last) else None


def scripted_generator(plan: Plan, call_ids: bool = True) -> MockChatGenerator:
    """Haystack's mock chat generator answering with the plan's next call, or text;
    ``call_ids=False``: a model whose tool calls have no id (Haystack's ``ToolCall.id`` is
    optional)."""
    turns = [0]

    def respond(messages: list[ChatMessage]) -> ChatMessage | str:
        result = messages[-1].tool_call_result
        turns[0] += 1
        call = plan(str(result.result) if result is not None else None)
        if call is None:
            return FINAL
        name, arguments = call
        return ChatMessage.from_assistant(
            tool_calls=[
                ToolCall(
                    tool_name=name,
                    arguments=arguments,
                    id=f"call_{turns[0]}" if call_ids else None,
                )
            ]
        )

    return MockChatGenerator(response_fn=respond)


def build(
    plan: Plan,
    script: Script | Detour,
    hooks: LoopGuardHooks,
    fail: bool = False,
    call_ids: bool = True,
) -> Agent:
    """``fail``: ``search`` fails the same way every time (the Agent hands the model the error
    as the tool result and the loop goes on)."""

    @tool
    def search(query: str) -> str:
        """Search the web."""
        result = script.run_tool(query)
        if fail:
            raise RuntimeError(FAILURE)
        return result

    @tool
    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        assert isinstance(script, Detour)
        return script.run_other(city)

    return Agent(
        chat_generator=scripted_generator(plan, call_ids),
        tools=[search, get_weather],
        hooks=hooks.hooks(),
        max_agent_steps=SAFETY_CAP + 10,
    )


def run(agent: Agent, mode: str = "sync", task: str = TASK) -> dict[str, Any]:
    messages = [ChatMessage.from_user(task)]
    result: dict[str, Any]
    if mode == "sync":
        result = agent.run(messages=messages)
    else:
        result = asyncio.run(agent.run_async(messages=messages))
    return result


@pytest.fixture
def instrumented(tracing: Tracing) -> Iterator[Tracing]:
    from haystack import tracing as haystack_tracing
    from haystack_integrations.tracing.opentelemetry import OpenTelemetryTracer

    haystack_tracing.enable_tracing(OpenTelemetryTracer(tracing.provider.get_tracer("haystack")))
    try:
        yield tracing
    finally:
        haystack_tracing.disable_tracing()


@pytest.mark.parametrize("call_ids", [True, False], ids=["call-ids", "no-call-ids"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(
    instrumented: Tracing, mode: str, call_ids: bool
) -> None:
    tracing = instrumented
    script = Script()
    hooks = LoopGuardHooks(processor=tracing.processor)
    result = run(build(looping(script), script, hooks, call_ids=call_ids), mode)
    # the stop answers the call with the stop text and ends the run before the next model call
    assert result["exit_reason"] == STOP_REASON
    assert result["last_message"].tool_call_result.result == REFERENCE[FIRST_STOP - 1].message
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # hooks (with or without the model's call id) and tool spans (without; the span ends first)
    # count each attempt once; a blocked call has no tool span, so the spans alone see only those that ran
    assert calls_seen(tracing.guard) == FIRST_STOP
    assert len(tool_spans(tracing)) == calls_seen(tracing.spans_only) == FIRST_DENY - 1


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_after_the_denial_another_tool_is_never_blocked(instrumented: Tracing, via: str) -> None:
    tracing = instrumented
    script = Detour()
    hooks = (
        LoopGuardHooks(processor=tracing.processor)
        if via == "processor"
        else LoopGuardHooks(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    result = run(build(script.next_call, script, hooks))
    assert result["last_message"].text == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY) + OTHER_RESULTS
    assert script.other_runs == DETOUR_CALLS
    assert calls_seen(hooks.guard) == FIRST_DENY
    assert calls_seen(hooks.guard, OTHER_TOOL) == DETOUR_CALLS


@pytest.mark.parametrize("session", [None, "conversation-1"])
def test_each_run_starts_afresh(session: str | None) -> None:
    # without session= each run is its own session; with it, each run a new progress epoch
    script = Script(listen=True)
    agent = build(looping(script), script, LoopGuardHooks(LoopGuard(POLICY), session=session))
    assert run(agent)["last_message"].text == FINAL
    assert script.seen == expected_tool_results(FIRST_DENY)
    script.calls, script.seen = 0, []
    assert run(agent, task="And now?")["last_message"].text == FINAL
    assert script.seen == expected_tool_results(FIRST_DENY)


def test_a_stop_can_be_answered_as_a_message() -> None:
    script = Script()
    hooks = LoopGuardHooks(LoopGuard(POLICY), on_stop="message")
    result = run(build(looping(script), script, hooks))
    # the model reads every refusal, the stop texts too, until its own cap, then answers
    assert result["last_message"].text == FINAL
    assert script.calls == SAFETY_CAP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(SAFETY_CAP)


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(
    instrumented: Tracing, via: str
) -> None:
    tracing = instrumented
    script = Script()
    # With the processor, the tool span (haystack.tool.error) ends before the after_tool hook:
    # the span reports the failure first and the hook takes the stop from the processor.
    hooks = (
        LoopGuardHooks(processor=tracing.processor)
        if via == "processor"
        else LoopGuardHooks(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    result = run(build(looping(script), script, hooks, fail=True))
    # the third identical failure: the call ran, then the run ended before the next model call,
    # the stop text after the failure in the last message
    assert result["exit_reason"] == STOP_REASON
    last = result["last_message"].tool_call_result
    assert last.error and FAILURE in last.result
    assert last.result.endswith(f"\n\n{FAILURE_STOP_DECISION.message}")
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert len(script.seen) == FAILURE_STOP - 1 and all(FAILURE in text for text in script.seen)
    assert calls_seen(hooks.guard) == FAILURE_STOP


def test_the_hooks_refuse_to_be_serialised() -> None:
    hooks = LoopGuardHooks(LoopGuard(POLICY)).hooks()
    with pytest.raises(TypeError, match="cannot be serialised"):
        hooks["before_tool"][0].to_dict()


@pytest.mark.parametrize("session", [None, "conversation-1"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_advisor_is_told_the_runs_prompt(mode: str, session: str | None) -> None:
    guard, requests = advised_guard()
    script = Script()
    agent = build(looping(script), script, LoopGuardHooks(guard, session=session))
    told: dict[str, list[str | None]] = {}
    for prompt in PROMPTS:
        script.calls = 0
        # the rescue came first: the run looped on until the stop ended it
        assert run(agent, mode, prompt)["exit_reason"] == STOP_REASON
        told[prompt] = [request.task for request in requests]
        requests.clear()
    for prompt, tasks in told.items():
        assert tasks, f"the guard never rescued in the run of {prompt!r}"
        assert all(task is not None and prompt in task for task in tasks), tasks
