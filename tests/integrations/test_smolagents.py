"""smolagents, driven for real offline: a Model that loops, a ToolCallingAgent wrapped by
guard_agent, and OpenInference's smolagents instrumentation writing spans to the processor's
provider. The wrapper gets the model's call ids; the tool spans have none and end before the
wrapper reports."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from opentelemetry.sdk.trace import TracerProvider

from otel_loopguard import Action, LoopDetected, LoopGuard
from otel_loopguard.metrics import PrometheusRecorder
from otel_loopguard.processor import LoopGuardSpanProcessor

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
    plain,
    require,
    tool_spans,
)
from .scripted import DETOUR_CALLS, OTHER_RESULTS, OTHER_TOOL, Detour

# offline: no Hugging Face Hub calls, no Hub telemetry (smolagents has none of its own)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

require("smolagents")

from smolagents import ToolCallingAgent, tool  # noqa: E402
from smolagents.models import (  # noqa: E402
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
    Model,
)

from otel_loopguard.integrations.smolagents import guard_agent  # noqa: E402

#: The model's next call, or None to answer, from the last tool result it read.
Plan = Callable[[str | None], "tuple[str, dict[str, str]] | None"]

#: What smolagents puts before a tool result it hands the model.
OBSERVATION = "Observation:\n"


def looping(script: Script) -> Plan:
    return lambda last: (TOOL, dict(ARGUMENTS)) if script.next_call(last) else None


class ScriptedModel(Model):
    """A model with native tool calls that asks for the plan's next call, or calls
    ``final_answer`` (a ToolCallingAgent ends only through it). ``call_ids=False``: a provider
    that gives no call ids."""

    def __init__(self, plan: Plan, call_ids: bool = True) -> None:
        super().__init__(model_id="scripted")
        self.plan = plan
        self.call_ids = call_ids
        self.turns = 0

    def generate(self, messages: list[Any], *args: Any, **kwargs: Any) -> ChatMessage:
        last = messages[-1]
        result = None
        if last.role == MessageRole.TOOL_RESPONSE:
            text = "".join(part["text"] for part in last.content if part.get("type") == "text")
            result = text.split(OBSERVATION, 1)[1] if OBSERVATION in text else text
        self.turns += 1
        call = self.plan(result)
        name, arguments = call if call is not None else ("final_answer", {"answer": FINAL})
        tool_call = ChatMessageToolCall(
            id=f"call_{self.turns}" if self.call_ids else cast(str, None),
            type="function",
            function=ChatMessageToolCallFunction(name=name, arguments=arguments),
        )
        return ChatMessage(role=MessageRole.ASSISTANT, content=None, tool_calls=[tool_call])


def build(plan: Plan, script: Script | Detour, fail: bool = False, call_ids: bool = True) -> Any:
    """``fail``: ``search`` fails the same way every time (smolagents hands the model the
    error and the loop goes on)."""

    @tool
    def search(query: str) -> str:
        """Search the web.

        Args:
            query: what to search for
        """
        result = script.run_tool(query)
        if fail:
            raise RuntimeError(FAILURE)
        return result

    @tool
    def get_weather(city: str) -> str:
        """Get the weather for a city.

        Args:
            city: the city
        """
        assert isinstance(script, Detour)
        return script.run_other(city)

    return ToolCallingAgent(
        tools=[search, get_weather],
        model=ScriptedModel(plan, call_ids),
        name="weather_agent",
        max_steps=SAFETY_CAP + 10,
        verbosity_level=0,
    )


TASK = "What's the weather in Paris?"


@pytest.fixture
def instrumented(tracing: Tracing) -> Iterator[Tracing]:
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor

    instrumentor = SmolagentsInstrumentor()
    instrumentor.instrument(tracer_provider=tracing.provider)
    try:
        yield tracing
    finally:
        instrumentor.uninstrument()


def spy_call_ids(guard: LoopGuard, monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The call ids the wrapper asks the guard with, in order."""
    seen: list[str | None] = []
    before = guard.before_tool

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("call_id"))
        return before(*args, **kwargs)

    monkeypatch.setattr(guard, "before_tool", spy)
    return seen


@pytest.mark.parametrize("call_ids", [True, False], ids=["call-ids", "no-call-ids"])
def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(
    instrumented: Tracing, call_ids: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracing = instrumented
    script = Script()
    asked = spy_call_ids(tracing.guard, monkeypatch)
    agent = guard_agent(
        build(looping(script), script, call_ids=call_ids), processor=tracing.processor
    )
    with pytest.raises(LoopDetected) as raised:
        agent.run(TASK)
    assert raised.value.code == Action.STOP.value
    assert plain(raised.value.message) == REFERENCE[FIRST_STOP - 1].message
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    expected_ids = [f"call_{n}" if call_ids else None for n in range(1, FIRST_STOP + 1)]
    assert asked == expected_ids
    # hook (with or without the model's call id) and tool spans (without; the span ends first)
    # count each attempt once; a blocked call has no tool span, so the spans alone see only the
    # calls that ran
    assert calls_seen(tracing.guard) == FIRST_STOP
    assert len(tool_spans(tracing)) == calls_seen(tracing.spans_only) == FIRST_DENY - 1


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_after_the_denial_another_tool_is_never_blocked(instrumented: Tracing, via: str) -> None:
    tracing = instrumented
    script = Detour()
    options: dict[str, Any] = (
        {"processor": tracing.processor}
        if via == "processor"
        else {"guard": LoopGuard(POLICY, recorder=PrometheusRecorder())}
    )
    agent = guard_agent(build(script.next_call, script), **options)
    assert agent.run(TASK) == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY) + OTHER_RESULTS
    assert script.other_runs == DETOUR_CALLS
    guard = tracing.guard if via == "processor" else options["guard"]
    assert calls_seen(guard) == FIRST_DENY
    assert calls_seen(guard, OTHER_TOOL) == DETOUR_CALLS


def test_the_next_run_starts_a_new_progress_epoch() -> None:
    script = Script(listen=True)
    agent = guard_agent(build(looping(script), script), LoopGuard(POLICY))
    assert agent.run(TASK) == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY)
    script.calls, script.seen = 0, []
    assert agent.run("And now?") == FINAL
    assert script.seen == expected_tool_results(FIRST_DENY)


def test_a_stop_can_be_answered_as_a_message() -> None:
    script = Script()
    agent = guard_agent(build(looping(script), script), LoopGuard(POLICY), on_stop="message")
    assert agent.run(TASK) == FINAL
    # the model reads every refusal, the stop texts too, until its own cap, then answers
    assert script.calls == SAFETY_CAP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(SAFETY_CAP)


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(
    instrumented: Tracing, via: str
) -> None:
    tracing = instrumented
    script = Script()
    # With the processor, the tool span (status error) ends before the wrapper sees the error:
    # the span reports the failure first and the wrapper takes the stop from the processor.
    options: dict[str, Any] = (
        {"processor": tracing.processor}
        if via == "processor"
        else {"guard": LoopGuard(POLICY, recorder=PrometheusRecorder())}
    )
    agent = guard_agent(build(looping(script), script, fail=True), **options)
    with pytest.raises(LoopDetected) as raised:
        agent.run(TASK)
    # the third identical failure: the call ran, then the run ended before the next model turn
    assert raised.value.code == Action.STOP.value
    assert plain(raised.value.message) == FAILURE_STOP_DECISION.message
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert len(script.seen) == FAILURE_STOP - 1
    assert all(text.startswith("Error:\n") and FAILURE in text for text in script.seen)
    guard = tracing.guard if via == "processor" else options["guard"]
    assert calls_seen(guard) == FAILURE_STOP


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_the_advisor_is_told_the_runs_prompt(via: str) -> None:
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor

    guard, requests = advised_guard()
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(guard, tracer_provider=provider)
    if via == "processor":  # else the spans never reach the guard
        provider.add_span_processor(processor)
    instrumentor = SmolagentsInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    options: dict[str, Any] = {"processor": processor} if via == "processor" else {"guard": guard}
    script = Script()
    agent = guard_agent(build(looping(script), script), **options)
    told: dict[str, list[str | None]] = {}
    try:
        for prompt in PROMPTS:
            script.calls = 0
            with pytest.raises(LoopDetected):  # the rescue came first: the run loops on
                agent.run(prompt)
            told[prompt] = [request.task for request in requests]
            requests.clear()
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
    for prompt, tasks in told.items():
        assert tasks, f"the guard never rescued in the run of {prompt!r}"
        assert all(task is not None and prompt in task for task in tasks), tasks


def test_guard_agent_refuses_what_is_not_a_tool_calling_agent() -> None:
    with pytest.raises(ValueError, match="ToolCallingAgent"):
        guard_agent(cast(Any, object()), LoopGuard(POLICY))
