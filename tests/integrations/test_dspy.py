"""DSPy, driven for real offline: a ``dspy.ReAct`` agent whose model is DSPy's own DummyLM
(answering from a script that reads the trajectory's last observation), its tools wrapped by
LoopGuardTools, and OpenInference's DSPy instrumentation writing spans to the processor's
provider. Neither the tools nor the spans have a call id; a tool span ("<tool>.__call__", no
tool.name) starts inside the wrapped call and ends before the wrapper reports."""

from __future__ import annotations

import re
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
    REFERENCE,
    SAFETY_CAP,
    TOOL,
    Script,
    Tracing,
    calls_seen,
    expected_tool_results,
    plain,
    require,
    tool_spans,
)
from .scripted import DETOUR_CALLS, OTHER_RESULTS, OTHER_TOOL, Detour

require("dspy")

import dspy  # noqa: E402
from dspy.utils import DummyLM  # noqa: E402

from otel_loopguard.integrations.dspy import FINISH_TOOL, LoopGuardTools, LoopStopped  # noqa: E402

#: The model's next call, or None to answer, from the last tool result it read.
Plan = Callable[[str | None], "tuple[str, dict[str, str]] | None"]

#: ReAct's trajectory as DummyLM's ChatAdapter shows it: "[[ ## observation_<n> ## ]]" headers.
_OBSERVATION = re.compile(
    r"\[\[ ## observation_(\d+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with |\Z)", re.S
)


def looping(script: Script) -> Plan:
    return lambda last: (TOOL, dict(ARGUMENTS)) if script.next_call(last) else None


def observations(text: str) -> list[str]:
    """The observations of a trajectory, in order."""
    return [match.group(2) for match in _OBSERVATION.finditer(text)]


class Answers(list[dict[str, Any]]):
    """DummyLM's scripted answers (its list mode), made when asked: ReAct's next step from the
    plan (a tool call, or ``finish``), or the extracted answer. DummyLM takes ``iter(answers)``;
    the iterator reads the prompt DummyLM was given last (:class:`ScriptedLM`)."""

    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self.plan = plan
        self.prompt = ""  # the last request's messages, as text
        self.steps = 0  # ReAct steps the model answered

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            if "next_tool_name" not in self.prompt:  # the extract step: the final answer
                yield {"reasoning": "The search said nothing more.", "answer": FINAL}
                continue
            seen = observations(self.prompt.rsplit("[[ ## trajectory ## ]]", 1)[-1])
            self.steps += 1
            call = self.plan(seen[-1] if seen else None)
            if call is None:
                yield {"next_thought": "Done.", "next_tool_name": FINISH_TOOL, "next_tool_args": {}}
            else:
                name, arguments = call
                yield {
                    "next_thought": "Search.",
                    "next_tool_name": name,
                    "next_tool_args": arguments,
                }


class ScriptedLM(DummyLM):
    """DSPy's DummyLM, its answers made from the request it is given (see :class:`Answers`)."""

    def __init__(self, plan: Plan) -> None:
        self.script = Answers(plan)
        super().__init__(self.script)

    def forward(self, prompt: Any = None, messages: Any = None, **kwargs: Any) -> Any:
        self.script.prompt = "\n".join(str(m.get("content", "")) for m in messages or ())
        return super().forward(prompt=prompt, messages=messages, **kwargs)


def react(
    plan: Plan, script: Script | Detour, tools: LoopGuardTools, fail: bool = False
) -> tuple[dspy.Prediction, ScriptedLM]:
    """One question to a ReAct agent over ``search`` and ``get_weather`` wrapped by ``tools``;
    ``fail``: ``search`` fails the same way every time (it raises; ReAct hands the model the
    error and the loop goes on)."""

    def search(query: str) -> str:
        """Search the web."""
        result = script.run_tool(query)
        if fail:
            raise RuntimeError(FAILURE)
        return result

    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        assert isinstance(script, Detour)
        return script.run_other(city)

    lm = ScriptedLM(plan)
    agent = dspy.ReAct(
        "question -> answer", tools=tools.wrap([search, get_weather]), max_iters=2 * SAFETY_CAP
    )
    with dspy.context(lm=lm):
        return agent(question="What's the weather in Paris?"), lm


def read(prediction: dspy.Prediction) -> list[str]:
    """The observations of the prediction's trajectory, ReAct's ``finish`` left out."""
    trajectory = prediction.trajectory
    return [
        str(trajectory[f"observation_{n}"])
        for n in range(len(trajectory) // 4)
        if trajectory[f"tool_name_{n}"] != FINISH_TOOL
    ]


@pytest.fixture
def instrumented(tracing: Tracing) -> Iterator[Tracing]:
    from openinference.instrumentation.dspy import DSPyInstrumentor

    instrumentor = DSPyInstrumentor()
    instrumentor.instrument(tracer_provider=tracing.provider)
    try:
        yield tracing
    finally:
        instrumentor.uninstrument()


def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(instrumented: Tracing) -> None:
    tracing = instrumented
    script = Script()
    tools = LoopGuardTools(processor=tracing.processor)
    with pytest.raises(LoopStopped) as raised:
        react(looping(script), script, tools)
    # the stop is raised out of the module call (ReAct turns an Exception into an observation)
    assert plain(raised.value.message) == REFERENCE[FIRST_STOP - 1].message
    assert tools.stopped is not None and tools.stopped.message == raised.value.message
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # wrapper and tool spans (the span names the tool "search", as the wrapper does) count each
    # attempt once; a refused call has no tool span, so the spans alone see the calls that ran
    assert calls_seen(tracing.guard) == FIRST_STOP
    assert len(tool_spans(tracing)) == calls_seen(tracing.spans_only) == FIRST_DENY - 1


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_after_the_denial_another_tool_is_never_blocked(instrumented: Tracing, via: str) -> None:
    tracing = instrumented
    script = Detour()
    tools = (
        LoopGuardTools(processor=tracing.processor)
        if via == "processor"
        else LoopGuardTools(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    prediction, _ = react(script.next_call, script, tools)
    assert prediction.answer == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY) + OTHER_RESULTS
    assert read(prediction) == script.seen
    assert script.other_runs == DETOUR_CALLS
    assert calls_seen(tools.guard) == FIRST_DENY
    assert calls_seen(tools.guard, OTHER_TOOL) == DETOUR_CALLS
    # ReAct's own finish tool (its span "finish.__call__") is a final answer, never a call
    assert calls_seen(tools.guard, FINISH_TOOL) == 0
    assert calls_seen(tracing.spans_only, FINISH_TOOL) == 0


def test_a_stop_can_be_answered_as_a_message(instrumented: Tracing) -> None:
    tracing = instrumented
    script = Script()
    tools = LoopGuardTools(processor=tracing.processor, on_stop="message")
    prediction, _ = react(looping(script), script, tools)
    # the model reads every refusal, the stop texts too, until its own cap, then answers
    assert prediction.answer == FINAL
    assert script.calls == SAFETY_CAP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(SAFETY_CAP) == read(prediction)
    assert calls_seen(tracing.guard) == SAFETY_CAP


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(
    instrumented: Tracing, via: str
) -> None:
    tracing = instrumented
    script = Script()
    tools = (
        LoopGuardTools(processor=tracing.processor)
        if via == "processor"
        else LoopGuardTools(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    with pytest.raises(LoopStopped) as raised:
        react(looping(script), script, tools, fail=True)
    # the third identical failure: the call ran, then the stop ended the run
    assert plain(raised.value.message) == FAILURE_STOP_DECISION.message
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert len(script.seen) == FAILURE_STOP - 1 and all(FAILURE in text for text in script.seen)
    assert calls_seen(tools.guard) == FAILURE_STOP


def test_each_question_is_its_own_session_with_the_processor(instrumented: Tracing) -> None:
    # ReAct's spans have no agent span: the session is the module call's trace
    tracing = instrumented
    tools = LoopGuardTools(processor=tracing.processor)
    for _ in range(2):
        script = Script(listen=True)
        prediction, _ = react(looping(script), script, tools)
        assert prediction.answer == FINAL
        assert script.seen == expected_tool_results(FIRST_DENY)
    assert calls_seen(tracing.guard) == 2 * FIRST_DENY


def test_async_react_is_guarded_the_same_way(instrumented: Tracing) -> None:
    # ReAct's aforward calls each tool's acall: the same denials, then the stop
    import asyncio

    tracing = instrumented
    script = Script()
    tools = LoopGuardTools(processor=tracing.processor)
    lm = ScriptedLM(looping(script))

    async def search(query: str) -> str:
        """Search the web."""
        return script.run_tool(query)

    agent = dspy.ReAct("question -> answer", tools=tools.wrap([search]), max_iters=SAFETY_CAP)

    async def ask() -> None:
        with dspy.context(lm=lm):
            await agent.acall(question="What's the weather in Paris?")

    with pytest.raises(LoopStopped) as raised:
        asyncio.run(ask())
    assert plain(raised.value.message) == REFERENCE[FIRST_STOP - 1].message
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    assert calls_seen(tracing.guard) == FIRST_STOP
    assert len(tool_spans(tracing)) == FIRST_DENY - 1  # "search.acall" spans
