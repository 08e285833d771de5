"""Strands Agents, driven for real offline: a custom model provider that loops, the
LoopGuardHooks, and Strands' own tracer writing spans to the processor's provider."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from otel_loopguard import LoopGuard
from otel_loopguard.metrics import PrometheusRecorder

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
    expected_tool_results,
    require,
    tool_spans,
)

require("strands")

from strands import Agent, tool  # noqa: E402
from strands.models import Model  # noqa: E402
from strands.telemetry.tracer import get_tracer  # noqa: E402

from otel_loopguard.integrations.strands import LoopGuardHooks  # noqa: E402


class ScriptedModel(Model):
    """A model provider that streams the script's next call, or an answer."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    async def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError
        yield  # pragma: no cover

    async def stream(
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        result = None
        for block in messages[-1]["content"]:
            if "toolResult" in block:
                # the text blocks the model reads, a blank line between them
                result = "\n\n".join(part["text"] for part in block["toolResult"]["content"])
        script = self.script
        yield {"messageStart": {"role": "assistant"}}
        if script.next_call(result):
            yield {
                "contentBlockStart": {
                    "start": {"toolUse": {"toolUseId": f"call_{script.calls}", "name": TOOL}}
                }
            }
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(ARGUMENTS)}}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
        else:
            yield {"contentBlockDelta": {"delta": {"text": FINAL}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}


def build(script: Script, hooks: LoopGuardHooks, fail: bool = False) -> Agent:
    """``fail``: the tool fails the same way every time (Strands hands the model an error
    result and the loop goes on)."""

    @tool
    def search(query: str) -> str:
        """Search the web."""
        result = script.run_tool(query)
        if fail:
            raise RuntimeError(FAILURE)
        return result

    return Agent(
        model=ScriptedModel(script),
        tools=[search],
        hooks=[hooks],
        name="weather_agent",
        callback_handler=None,
        trace_attributes={"session.id": "conv-1"},
    )


@pytest.fixture
def instrumented(tracing: Tracing) -> Iterator[Tracing]:
    # Strands' tracer takes the global provider when first made; point it at this test's
    strands_tracer = get_tracer()
    saved = strands_tracer.tracer_provider, strands_tracer.tracer
    strands_tracer.tracer_provider = tracing.provider
    strands_tracer.tracer = tracing.provider.get_tracer(strands_tracer.service_name)
    try:
        yield tracing
    finally:
        strands_tracer.tracer_provider, strands_tracer.tracer = saved


def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(instrumented: Tracing) -> None:
    tracing = instrumented
    script = Script()
    result = build(script, LoopGuardHooks(processor=tracing.processor))(
        "What's the weather in Paris?"
    )
    # the stop cancels the call and ends the invocation before the next model call
    assert result.stop_reason == "cancelled"
    assert str(result.message["content"][0]["text"]) == REFERENCE[FIRST_STOP - 1].message
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # hook and tool spans count each attempt once; Strands emits no tool span for a cancelled
    # call, so the spans alone see only the calls that ran
    assert calls_seen(tracing.guard) == FIRST_STOP
    assert len(tool_spans(tracing)) == calls_seen(tracing.spans_only) == FIRST_DENY - 1


def test_the_run_goes_on_when_the_model_reads_the_denial() -> None:
    script = Script(listen=True)
    agent = build(script, LoopGuardHooks(LoopGuard(POLICY)))
    result = agent("What's the weather in Paris?")
    assert result.stop_reason == "end_turn"
    assert str(result.message["content"][0]["text"]) == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY)
    # the next invocation starts a new progress epoch
    script.calls, script.seen = 0, []
    agent("And now?")
    assert script.seen == expected_tool_results(FIRST_DENY)


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(
    instrumented: Tracing, via: str
) -> None:
    tracing = instrumented
    script = Script()
    # With the processor, the tool span ends before AfterToolCallEvent: the span reports the
    # failure first and the hooks take the stop from the processor.
    hooks = (
        LoopGuardHooks(processor=tracing.processor)
        if via == "processor"
        else LoopGuardHooks(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    result = build(script, hooks, fail=True)("What's the weather in Paris?")
    # the third identical failure: the call ran, then the invocation ended before the next
    # model call, with the stop text as its last message
    assert result.stop_reason == "cancelled"
    assert str(result.message["content"][0]["text"]) == FAILURE_STOP_DECISION.message
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert len(script.seen) == FAILURE_STOP - 1 and all(FAILURE in text for text in script.seen)
    assert calls_seen(hooks.guard) == FAILURE_STOP


def test_the_advisor_is_told_the_invocations_prompt() -> None:
    guard, requests = advised_guard()
    script = UntilAdvised()
    agent = build(script, LoopGuardHooks(guard))
    result = agent("What's the weather in Paris?")
    # the loop was rescued: the model read the advice with the denial, then answered
    assert result.stop_reason == "end_turn" and ADVICE in script.seen[-1]
    assert [request.task for request in requests] == ["What's the weather in Paris?"]
    # the next invocation: its prompt is the task from now on
    script.calls, script.seen = 0, []
    agent("And in Lyon?")
    assert ADVICE in script.seen[-1]
    assert [request.task for request in requests] == [
        "What's the weather in Paris?",
        "And in Lyon?",
    ]
