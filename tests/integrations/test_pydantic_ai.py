"""Pydantic AI, driven for real offline: a FunctionModel that loops, the LoopGuardCapability,
and Pydantic AI's own OpenTelemetry instrumentation on the same provider as the processor."""

from __future__ import annotations

from typing import Any

import pytest

from otel_loopguard import Action, LoopDetected, LoopGuard

from .conftest import (
    ADVICE,
    ARGUMENTS,
    FAILURE,
    FAILURE_STOP,
    FAILURE_STOP_DECISION,
    FINAL,
    FIRST_DENY,
    FIRST_STOP,
    POLICY,
    REFERENCE,
    TOOL,
    Script,
    Tracing,
    UntilAdvised,
    advised_guard,
    calls_seen,
    decision_events,
    expected_tool_results,
    make_tracing,
    plain,
    require,
    tool_spans,
)

require("pydantic_ai")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.capabilities import Instrumentation  # noqa: E402
from pydantic_ai.exceptions import ToolFailed  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.models.instrumented import InstrumentationSettings  # noqa: E402

from otel_loopguard.integrations.pydantic_ai import LoopGuardCapability  # noqa: E402


def build(
    script: Script, capability: LoopGuardCapability, tracing: Tracing | None, fail: bool = False
) -> Agent[Any, str]:
    """``fail``: the tool fails the same way every time (``ToolFailed``: the model reads the
    failure and may call again)."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        results = (
            [part.content for part in last.parts if isinstance(part, ToolReturnPart)]
            if isinstance(last, ModelRequest)
            else []
        )
        if script.next_call(str(results[-1]) if results else None):
            return ModelResponse(
                parts=[ToolCallPart(TOOL, dict(ARGUMENTS), tool_call_id=f"call_{script.calls}")]
            )
        return ModelResponse(parts=[TextPart(FINAL)])

    capabilities: list[Any] = [capability]
    if tracing is not None:
        capabilities.insert(
            0, Instrumentation(settings=InstrumentationSettings(tracer_provider=tracing.provider))
        )
    agent: Agent[Any, str] = Agent(
        FunctionModel(model), name="weather_agent", capabilities=capabilities
    )

    @agent.tool_plain
    def search(query: str) -> str:
        result = script.run_tool(query)
        if fail:
            raise ToolFailed(FAILURE)
        return result

    return agent


def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops() -> None:
    tracing = make_tracing(spans_only=False)
    script = Script()
    agent = build(script, LoopGuardCapability(processor=tracing.processor), tracing)
    with pytest.raises(LoopDetected) as raised:
        agent.run_sync("What's the weather in Paris?")
    # the stop ends the run at the attempt the reference guard stops, without running the tool
    assert raised.value.code == Action.STOP.value
    assert plain(raised.value.message) == REFERENCE[FIRST_STOP - 1].message
    # Pydantic AI's spans report the FunctionModel's usage: the texts say what the loop used
    assert "This loop has used" in raised.value.message
    assert script.calls == FIRST_STOP
    assert script.tool_runs == FIRST_DENY - 1
    # the model read each result, the reminder with it, then the denial as the tool result
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # each attempt counted once though both the capability and the span saw it: the processor
    # decided at span start (the arguments are there) and its events carry the same decisions
    assert calls_seen(tracing.guard) == FIRST_STOP == len(tool_spans(tracing))
    assert decision_events(tracing) == [
        (d.action.value, d.count) for d in REFERENCE[:FIRST_STOP] if d.action is not Action.ALLOW
    ]


def test_the_run_goes_on_when_the_model_reads_the_denial() -> None:
    script = Script(listen=True)
    guard = LoopGuard(POLICY)
    agent = build(script, LoopGuardCapability(guard), None)  # no spans: the hook alone
    result = agent.run_sync("What's the weather in Paris?")
    assert result.output == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY)
    # the next run of the conversation starts a new progress epoch
    script.calls, script.seen = 0, []
    agent.run_sync("And now?", message_history=result.all_messages())
    assert script.seen == expected_tool_results(FIRST_DENY)


def test_a_stop_can_be_answered_as_a_message() -> None:
    script = Script()
    agent = build(script, LoopGuardCapability(LoopGuard(POLICY), on_stop="message"), None)
    agent.run_sync("What's the weather in Paris?")  # the model is never stopped: it hits the cap
    assert script.seen[FIRST_STOP - 1] == REFERENCE[FIRST_STOP - 1].message
    assert script.tool_runs == FIRST_DENY - 1


def test_a_call_failing_the_same_way_ends_the_run_after_it_ran() -> None:
    tracing = make_tracing(spans_only=False)
    script = Script()
    agent = build(script, LoopGuardCapability(processor=tracing.processor), tracing, fail=True)
    with pytest.raises(LoopDetected) as raised:
        agent.run_sync("What's the weather in Paris?")
    # the third identical failure: the call ran, then the run ended before the next model turn
    assert raised.value.code == Action.STOP.value
    assert plain(raised.value.message) == FAILURE_STOP_DECISION.message
    assert isinstance(raised.value.__cause__, Exception)  # raised from the tool's failure
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert len(script.seen) == FAILURE_STOP - 1 and all(FAILURE in text for text in script.seen)
    # each call counted once though the capability and the span both reported it
    assert calls_seen(tracing.guard) == FAILURE_STOP == len(tool_spans(tracing))


def test_the_advisor_is_told_the_runs_prompt() -> None:
    guard, requests = advised_guard()
    script = UntilAdvised()
    agent = build(script, LoopGuardCapability(guard), None)
    result = agent.run_sync("What's the weather in Paris?")
    # the loop was rescued: the model read the advice with the denial, then answered
    assert result.output == FINAL and ADVICE in script.seen[-1]
    assert [request.task for request in requests] == ["What's the weather in Paris?"]
    # the next run of the conversation: its prompt is the task from now on
    script.calls, script.seen = 0, []
    agent.run_sync("And in Lyon?", message_history=result.all_messages())
    assert ADVICE in script.seen[-1]
    assert [request.task for request in requests] == [
        "What's the weather in Paris?",
        "And in Lyon?",
    ]


def test_a_rescue_decided_at_span_start_reaches_the_model_with_its_advice() -> None:
    """With ``processor=`` the processor decides each tool span at its start, where it never
    waits for the advisor; the capability waits for the advice before it refuses the call, so
    the model reads it with the refusal and the run goes on (before, it read a plain denial and
    the next attempt was a stop)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_loopguard import LoopGuardSpanProcessor

    from .conftest import Tracing

    guard, requests = advised_guard()
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(guard, tracer_provider=provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(processor)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider, exporter, guard, processor, guard)
    script = UntilAdvised()
    agent = build(script, LoopGuardCapability(processor=processor), tracing)
    result = agent.run_sync("What's the weather in Paris?")
    assert result.output == FINAL and ADVICE in script.seen[-1]
    assert len(requests) == 1 and requests[0].task == "What's the weather in Paris?"
