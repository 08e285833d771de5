"""Google ADK, driven for real offline: a custom BaseLlm that loops, the LoopGuardCallbacks, and
ADK's own tracing (with tool arguments on spans) writing to the processor's provider."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from otel_loopguard import LoopGuard

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
    RESCUE_POLICY,
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

require("google_adk")

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.events import Event  # noqa: E402
from google.adk.models.base_llm import BaseLlm  # noqa: E402
from google.adk.models.llm_request import LlmRequest  # noqa: E402
from google.adk.models.llm_response import LlmResponse  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService  # noqa: E402
from google.genai import types  # noqa: E402

from otel_loopguard.integrations.google_adk import LoopGuardCallbacks  # noqa: E402


class ScriptedLlm(BaseLlm):
    """A model that asks for the script's next call, or answers."""

    model: str = "scripted"
    script: Any = None

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        script: Script = self.script
        result = None
        for part in llm_request.contents[-1].parts or []:
            if part.function_response is not None:
                response = part.function_response.response or {}
                result = str(response.get("result", response.get("error")))
        if script.next_call(result):
            call = types.FunctionCall(id=f"call_{script.calls}", name=TOOL, args=dict(ARGUMENTS))
            yield LlmResponse(
                content=types.Content(role="model", parts=[types.Part(function_call=call)])
            )
        else:
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=FINAL)]))


def _recover(tool: Any, args: Any, tool_context: Any, error: Exception) -> dict[str, Any]:
    """The application's own recovery from tool errors: the model reads the error."""
    return {"error": str(error)}


def run(
    script: Script,
    callbacks: LoopGuardCallbacks,
    fail: bool = False,
    prompts: tuple[str, ...] = ("Weather in Paris?",),
) -> list[Event]:
    """``fail``: the tool fails the same way every time (it raises; the application's
    ``on_tool_error_callback``, after the guard's, hands the model the error). ``prompts``: the
    user's messages, one invocation each in the same session."""

    def search(query: str) -> str:
        """Search the web."""
        result = script.run_tool(query)
        if fail:
            raise RuntimeError(FAILURE)
        return result

    agent = LlmAgent(
        name="weather_agent",
        model=ScriptedLlm(script=script),
        tools=[search],
        before_tool_callback=callbacks.before_tool,
        after_tool_callback=callbacks.after_tool,
        on_tool_error_callback=[callbacks.on_tool_error, _recover],
    )

    async def go() -> list[Event]:
        sessions = InMemorySessionService()
        runner = Runner(agent=agent, app_name="weather", session_service=sessions)
        await sessions.create_session(app_name="weather", user_id="u", session_id="conv-1")
        events = []
        for prompt in prompts:
            message = types.Content(role="user", parts=[types.Part(text=prompt)])
            events += [
                event
                async for event in runner.run_async(
                    user_id="u", session_id="conv-1", new_message=message
                )
            ]
        return events

    return asyncio.run(go())


class _Forward(SpanProcessor):
    """The global provider's only processor: hands spans to the current test's processors."""

    def __init__(self) -> None:
        self.target: TracerProvider | None = None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.target is not None:
            self.target._active_span_processor.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if self.target is not None:
            self.target._active_span_processor.on_end(span)


_FORWARD = _Forward()


@pytest.fixture
def instrumented(tracing: Tracing, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tracing]:
    # ADK's tracer comes from the global provider: set one once, forwarding to this test's
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_FORWARD)
        trace.set_tracer_provider(provider)
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    _FORWARD.target = tracing.provider
    try:
        yield tracing
    finally:
        _FORWARD.target = None


def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(instrumented: Tracing) -> None:
    tracing = instrumented
    script = Script()
    events = run(script, LoopGuardCallbacks(processor=tracing.processor))
    # the stop answers the call and ends the invocation: no model call after it
    last = events[-1].content
    assert last is not None and last.parts
    response = last.parts[0].function_response
    assert response is not None and response.response == {
        "error": REFERENCE[FIRST_STOP - 1].message
    }
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # callbacks (inside the tool span) and spans count each attempt once; ADK emits a tool span
    # for an answered call too, so the spans alone count every attempt
    assert calls_seen(tracing.guard) == FIRST_STOP
    assert len(tool_spans(tracing)) == calls_seen(tracing.spans_only) == FIRST_STOP


def test_the_run_goes_on_when_the_model_reads_the_denial() -> None:
    script = Script(listen=True)
    events = run(script, LoopGuardCallbacks(LoopGuard(POLICY)))
    last = events[-1].content
    assert last is not None and last.parts and last.parts[0].text == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY)


def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(instrumented: Tracing) -> None:
    tracing = instrumented
    script = Script()
    events = run(script, LoopGuardCallbacks(processor=tracing.processor), fail=True)
    # the third identical failure: the call ran and is answered with the stop text, and the
    # invocation ends without another model call
    last = events[-1].content
    assert last is not None and last.parts
    response = last.parts[0].function_response
    assert response is not None and response.response == {"error": FAILURE_STOP_DECISION.message}
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert script.seen == [FAILURE] * (FAILURE_STOP - 1)
    assert calls_seen(tracing.guard) == FAILURE_STOP


def test_the_advisor_is_told_the_invocations_prompt() -> None:
    guard, requests = advised_guard()
    script = UntilAdvised()
    callbacks = LoopGuardCallbacks(guard)
    events = run(script, callbacks, prompts=("Weather in Paris?", "And in Lyon?"))
    # each invocation's loop was rescued: the model read the advice with the denial, then
    # answered; each rescue was told the prompt of its own invocation
    answers = [part.text for event in events if event.content for part in event.content.parts or ()]
    assert answers.count(FINAL) == 2
    rescue_at = RESCUE_POLICY.rescue_threshold
    assert rescue_at is not None
    assert [n for n, text in enumerate(script.seen, 1) if ADVICE in text] == [
        rescue_at,
        2 * rescue_at,
    ]
    assert [request.task for request in requests] == ["Weather in Paris?", "And in Lyon?"]
