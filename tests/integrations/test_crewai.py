"""CrewAI, driven for real offline: a BaseLLM that loops, the LoopGuardHooks (CrewAI's global
tool and LLM hooks), and OpenInference's CrewAI instrumentation (wrapper mode: the tool span ends
before the after hook) writing spans to the processor's provider. CrewAI's hooks see no call id,
nor do its spans."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_loopguard import Action, LoopGuard
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
    RESULT,
    SAFETY_CAP,
    TOOL,
    Script,
    Tracing,
    advised_guard,
    calls_seen,
    expected_tool_results,
    make_tracing,
    plain,
    require,
    tool_spans,
)
from .scripted import DETOUR_CALLS, OTHER_RESULTS, OTHER_TOOL, Detour, Forward

# CrewAI's own telemetry and tracing off (offline; they would export to CrewAI's servers)
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

require("crewai")

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.events.types.llm_events import LLMCallType  # noqa: E402
from crewai.llms.base_llm import BaseLLM, llm_call_context  # noqa: E402
from crewai.tools import tool  # noqa: E402

from otel_loopguard.integrations.crewai import LoopGuardHooks, LoopStopped  # noqa: E402

#: The task's description, the prompt of the run.
TASK = "What's the weather in Paris?"

#: The model's next call, or None to answer, from the last tool result it read.
Plan = Callable[[str | None], "tuple[str, dict[str, str]] | None"]


def looping(script: Script) -> Plan:
    return lambda last: (TOOL, dict(ARGUMENTS)) if script.next_call(last) else None


class ScriptedLLM(BaseLLM):
    """A model with native function calling that asks for the plan's next call, or answers;
    it emits CrewAI's LLM events as CrewAI's own providers do."""

    plan: Any = None
    turns: int = 0

    def supports_function_calling(self) -> bool:
        return True

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None, **kwargs: Any) -> Any:
        from_task, from_agent = kwargs.get("from_task"), kwargs.get("from_agent")
        with llm_call_context():
            self._emit_call_started_event(
                messages=messages, tools=tools, from_task=from_task, from_agent=from_agent
            )
            last = messages[-1]
            result = str(last["content"]) if last.get("role") == "tool" else None
            self.turns += 1
            call = self.plan(result)
            if call is None:
                response: Any = FINAL
                call_type = LLMCallType.LLM_CALL
            else:
                name, arguments = call
                response = [
                    {
                        "id": f"call_{self.turns}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                ]
                call_type = LLMCallType.TOOL_CALL
            self._emit_call_completed_event(
                response=response,
                call_type=call_type,
                from_task=from_task,
                from_agent=from_agent,
                messages=messages,
            )
            return response


class ReActLLM(BaseLLM):
    """A model without function calling (CrewAI's ReAct text mode): it writes ``Action:`` and
    ``Action Input:`` lines for the plan's next call, or a ``Final Answer:``, and reads the
    ``Observation:`` CrewAI appends to its last message."""

    plan: Any = None
    turns: int = 0

    def supports_function_calling(self) -> bool:
        return False

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None, **kwargs: Any) -> Any:
        said = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), None)
        last = None
        if isinstance(said, str) and "Observation:" in said:
            last = said.split("Observation:", 1)[1].strip()  # what follows its own words
        self.turns += 1
        call = self.plan(last)
        if call is None:
            return f"Thought: I now know the final answer\nFinal Answer: {FINAL}"
        name, arguments = call
        return f"Thought: I search.\nAction: {name}\nAction Input: {json.dumps(arguments)}"


def kickoff(
    plan: Plan,
    script: Script | Detour,
    fail: bool = False,
    prompt: str = TASK,
    llm: type[BaseLLM] = ScriptedLLM,
) -> str:
    """One crew, one agent, one task (``prompt``, its description); ``fail``: ``search`` fails
    the same way every time (it raises; CrewAI hands the model the error and the loop goes on).
    ``llm``: the model's class (:class:`ScriptedLLM` calls tools natively)."""

    @tool("search")
    def search(query: str) -> str:
        """Search the web."""
        result = script.run_tool(query)
        if fail:
            raise RuntimeError(FAILURE)
        return result

    @tool(OTHER_TOOL)
    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        assert isinstance(script, Detour)
        return script.run_other(city)

    agent = Agent(
        role="Weather researcher",
        goal="Answer weather questions",
        backstory="You look things up.",
        llm=llm(model="scripted", plan=plan),
        tools=[search, get_weather],
        max_iter=2 * SAFETY_TURNS,
    )
    task = Task(description=prompt, expected_output="A short answer.", agent=agent)
    return str(Crew(agents=[agent], tasks=[task]).kickoff().raw)


SAFETY_TURNS = 50


FAILURE_TEXT_RACE = (
    "guard: a span report without the result that comes first settles the call; the hook's "
    "failure text is dropped"
)

#: The conversation the runs are in (OpenInference's ``using_session``, the hooks' ``session``).
CONVERSATION = "conv-1"


@dataclass
class Instrumented:
    tracing: Tracing
    events: bool  # OpenInference's event-listener mode (else its default wrapper mode)


@pytest.fixture(scope="module", params=["events", "wrapper"])
def mode(request: pytest.FixtureRequest) -> Iterator[tuple[Forward, bool]]:
    """OpenInference instrumented once per mode (in this order: its event-listener mode records
    nothing once its wrapper mode was instrumented and removed in the same process)."""
    from openinference.instrumentation.crewai import CrewAIInstrumentor

    events = request.param == "events"
    forward = Forward()
    provider = TracerProvider()
    provider.add_span_processor(forward)
    instrumentor = CrewAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider, use_event_listener=events)
    try:
        yield forward, events
    finally:
        instrumentor.uninstrument()


@pytest.fixture
def instrumented(mode: tuple[Forward, bool]) -> Iterator[Instrumented]:
    """OpenInference's two modes. Wrapper: the hooks run inside the agent span, the tool span
    ends before the after hook, a refused call has no tool span; the processor keys by trace
    (and agent). Event listener: spans come from CrewAI's events on the event bus's threads and
    are never current, the tool span ends after the after hook, a refused call has a tool span
    (its result the guard's message); the processor keys by conversation (``using_session``)."""
    forward, events = mode
    tracing = make_tracing(key_by="conversation" if events else "trace")
    try:
        with forward.to(tracing.provider):
            yield Instrumented(tracing, events)
    finally:
        tracing.provider.shutdown()


def run(plan: Plan, script: Script | Detour, fail: bool = False, prompt: str = TASK) -> str:
    """:func:`kickoff` in the conversation, then wait for the event bus's handlers (the
    event-listener spans end there)."""
    from crewai.events.event_bus import crewai_event_bus
    from openinference.instrumentation import using_session

    try:
        with using_session(CONVERSATION):
            return kickoff(plan, script, fail, prompt)
    finally:
        crewai_event_bus.flush()


def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(
    instrumented: Instrumented,
) -> None:
    tracing = instrumented.tracing
    script = Script()
    with (
        LoopGuardHooks(processor=tracing.processor, session=CONVERSATION).register(),
        pytest.raises(LoopStopped) as raised,
    ):
        run(looping(script), script)
    # the stop refuses the call and ends the run at the next model call
    assert raised.value.code == Action.STOP.value
    assert plain(raised.value.message) == REFERENCE[FIRST_STOP - 1].message
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # hook and tool spans (neither has a call id; in either order) count each attempt once; in
    # wrapper mode a refused call has no tool span, so the spans alone see only those that ran
    assert calls_seen(tracing.guard) == FIRST_STOP
    spans = FIRST_STOP if instrumented.events else FIRST_DENY - 1
    assert len(tool_spans(tracing)) == calls_seen(tracing.spans_only) == spans


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_after_the_denial_another_tool_is_never_blocked(
    instrumented: Instrumented, via: str
) -> None:
    tracing = instrumented.tracing
    script = Detour()
    hooks = (
        LoopGuardHooks(processor=tracing.processor, session=CONVERSATION)
        if via == "processor"
        else LoopGuardHooks(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    with hooks.register():
        answer = run(script.next_call, script)
    assert answer == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY) + OTHER_RESULTS
    assert script.other_runs == DETOUR_CALLS
    assert calls_seen(hooks.guard) == FIRST_DENY
    assert calls_seen(hooks.guard, OTHER_TOOL) == DETOUR_CALLS


def test_a_stop_can_be_answered_as_a_message() -> None:
    script = Script()
    with LoopGuardHooks(LoopGuard(POLICY), on_stop="message").register():
        answer = kickoff(looping(script), script)
    # the model reads every refusal, the stop texts too, until its own cap, then answers
    assert answer == FINAL
    assert script.calls == SAFETY_CAP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(SAFETY_CAP)


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(
    instrumented: Instrumented, via: str, request: pytest.FixtureRequest
) -> None:
    tracing = instrumented.tracing
    if instrumented.events and via == "processor":
        # The event-listener tool span of a failed call ends on CrewAI's error event, on the bus's
        # thread, racing the after hook. It has no result (only its error status): when it comes
        # first the guard settles the call with no failure text and drops the hook's, so that
        # failure does not match the others and the stop can come later.
        request.applymarker(pytest.mark.xfail(strict=False, reason=FAILURE_TEXT_RACE))
    script = Script()
    # With the processor in wrapper mode, the tool span (status error) ends before the after
    # hook: the span reports the failure first and the hook takes the stop from the processor.
    hooks = (
        LoopGuardHooks(processor=tracing.processor, session=CONVERSATION)
        if via == "processor"
        else LoopGuardHooks(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    with hooks.register(), pytest.raises(LoopStopped) as raised:
        run(looping(script), script, fail=True)
    # the third identical failure: the call ran, then the run ended at the next model call
    assert plain(raised.value.message) == FAILURE_STOP_DECISION.message
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert len(script.seen) == FAILURE_STOP - 1 and all(FAILURE in text for text in script.seen)
    assert calls_seen(hooks.guard) == FAILURE_STOP


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_the_advisor_is_told_the_runs_prompt(mode: tuple[Forward, bool], via: str) -> None:
    forward, events = mode
    guard, requests = advised_guard()
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(
        guard, key_by="conversation" if events else "trace", tracer_provider=provider
    )
    if via == "processor":  # else the spans never reach the guard
        provider.add_span_processor(processor)
    hooks = (
        LoopGuardHooks(processor=processor, session=CONVERSATION)
        if via == "processor"
        else LoopGuardHooks(guard)
    )
    told: dict[str, list[str | None]] = {}
    try:
        with forward.to(provider), hooks.register():
            for prompt in PROMPTS:
                script = Script()
                # the rescue came first: the run looped on until the stop ended it
                with pytest.raises(LoopStopped):
                    run(looping(script), script, prompt=prompt)
                told[prompt] = [request.task for request in requests]
                requests.clear()
    finally:
        provider.shutdown()
    for prompt, tasks in told.items():
        assert tasks, f"the guard never rescued in the run of {prompt!r}"
        assert all(task is not None and prompt in task for task in tasks), tasks


# -- CrewAI's own tracing: a TracerProvider of its own per run (telemetry_session) ---------------

#: What CrewAI's own tracing names the agent by (its agent span's crewai.agent.role).
ROLE = "Weather researcher"


def traced_run(
    plan: Plan, script: Script | Detour, processor: LoopGuardSpanProcessor, **session: Any
) -> tuple[InMemorySpanExporter, BaseException | None]:
    """:func:`kickoff` inside CrewAI's own ``telemetry_session``: a TracerProvider of CrewAI's,
    made for the run, with the processor among its span processors and an exporter of its own
    (as a host passes them); the exporter once the session ended, and what the kickoff raised."""
    from crewai.telemetry.tracing import telemetry_session

    exporter = InMemorySpanExporter()
    raised: BaseException | None = None
    try:
        with telemetry_session(
            "kickoff-1", "crew", exporters=[exporter], processors=[processor], **session
        ):
            kickoff(plan, script)
    except Exception as exc:  # the guard's stop, or CrewAI's own (a ToolExecutionFailedError)
        raised = exc
    return exporter, raised


def test_crewai_own_tracing_decisions_reach_the_runs_exporter() -> None:
    # the spans alone (no hooks): each decision drawn at a tool span's end goes through the
    # provider CrewAI made for the run, so it reaches that run's exporter, in the run's trace
    guard = LoopGuard(POLICY, recorder=PrometheusRecorder())
    processor = LoopGuardSpanProcessor(guard)
    script = Script()
    exporter, raised = traced_run(looping(script), script, processor)
    # nothing enforced: the loop goes on until CrewAI's own cap on identical calls ends it
    assert raised is not None and not isinstance(raised, LoopStopped)
    assert script.tool_runs > FIRST_DENY
    spans = exporter.get_finished_spans()
    tools = [span for span in spans if span.name == "call tool"]
    decisions = [span for span in spans if span.name == "loopguard.decision"]
    assert len(tools) == script.tool_runs == calls_seen(guard)
    reference = LoopGuard(POLICY)
    expected = []
    for n in range(len(tools)):
        decision = reference.after_tool(
            TOOL, ARGUMENTS, session="reference", call_id=str(n), result=RESULT
        )
        if decision is not None and decision.action is not Action.ALLOW:
            expected.append((decision.action.value, decision.count))
    shown = [dict(span.attributes or {}) for span in decisions]
    assert expected
    assert [(row["loopguard.action"], row["loopguard.count"]) for row in shown] == expected
    trace_ids = {span.context.trace_id for span in tools}
    assert len(trace_ids) == 1 and {span.context.trace_id for span in decisions} == trace_ids
    assert processor.decisions_to_global_provider == 0


@pytest.mark.parametrize(
    ("key_by", "conversation"),
    [("trace", None), ("conversation", None), ("conversation", "conv-7")],
    ids=["trace", "kickoff-id", "conversation"],
)
def test_crewai_own_tracing_with_the_hooks_counts_each_call_once(
    key_by: str, conversation: str | None
) -> None:
    # hooks and CrewAI's own spans (no call id on either, and no span of CrewAI's is current on
    # the crew's thread): keyed by trace, the hooks ask with the keys of the agent's open span;
    # keyed by conversation, both key the run by its conversation id, else its kickoff id; the
    # agent is its role: each call counts once
    guard = LoopGuard(POLICY, recorder=PrometheusRecorder())
    processor = LoopGuardSpanProcessor(guard, key_by=key_by)
    script = Script()
    attributes = {"gen_ai.conversation.id": conversation} if conversation else None
    with LoopGuardHooks(processor=processor).register():
        exporter, raised = traced_run(looping(script), script, processor, attributes=attributes)
    assert isinstance(raised, LoopStopped)
    assert plain(raised.message) == REFERENCE[FIRST_STOP - 1].message
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # CrewAI's own tracing has a tool span for a refused call too (its result the refusal)
    tools = [span for span in exporter.get_finished_spans() if span.name == "call tool"]
    assert len(tools) == FIRST_STOP
    assert calls_seen(guard) == FIRST_STOP
    assert guard.session_count == 1 and agents_counted(guard) == {ROLE}


def agents_counted(guard: LoopGuard) -> set[str]:
    """The ``agent`` labels of ``loopguard_tool_calls_total`` in the guard's registry."""
    recorder = guard.recorder
    assert isinstance(recorder, PrometheusRecorder)
    return {
        sample.labels["agent"]
        for metric in recorder.registry.collect()
        for sample in metric.samples
        if sample.name == "loopguard_tool_calls_total"
    }


def test_react_text_mode_crewais_own_refusal_of_a_repeat_is_not_a_run() -> None:
    # ReAct text mode: CrewAI refuses a call whose input is its last call's itself, without
    # running it; that refusal is no new result (which would read as polling), so the guard
    # climbs the documented ladder: remind, deny from the configured repeat, stop
    from crewai.utilities.i18n import I18N_DEFAULT

    script = Script()
    guard = LoopGuard(POLICY, recorder=PrometheusRecorder())
    with LoopGuardHooks(guard).register(), pytest.raises(LoopStopped) as raised:
        kickoff(looping(script), script, llm=ReActLLM)
    assert plain(raised.value.message) == REFERENCE[FIRST_STOP - 1].message
    assert script.calls == FIRST_STOP and script.tool_runs == 1
    refusal = str(I18N_DEFAULT.errors("task_repeated_usage")).strip()
    assert script.seen[0] == RESULT and script.seen[1].startswith(refusal)
    for text, decision in zip(script.seen[1:], REFERENCE[1 : FIRST_STOP - 1], strict=True):
        if decision.blocks:
            assert text == decision.message
        elif decision.action is Action.REMIND:
            assert text.startswith(refusal) and decision.message in text
        else:
            assert text.startswith(refusal) and "[loopguard]" not in text
    assert calls_seen(guard) == FIRST_STOP
