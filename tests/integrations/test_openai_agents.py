"""OpenAI Agents SDK, driven for real offline: a custom Model that loops, the tool guardrails on
every function tool, and OpenInference's instrumentation writing spans to the processor's
provider."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from otel_loopguard import Action, LoopGuard, Phase

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

require("openai_agents")

from agents import (  # noqa: E402
    Agent,
    FunctionTool,
    ModelResponse,
    RunConfig,
    Runner,
    ToolInputGuardrailTripwireTriggered,
    ToolOutputGuardrailTripwireTriggered,
    TResponseInputItem,
    Usage,
    function_tool,
)
from agents.models.interface import Model  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from otel_loopguard.integrations.openai_agents import guard_agent  # noqa: E402


class ScriptedModel(Model):
    """A Model that asks for the script's next call, or answers."""

    def __init__(self, script: Script) -> None:
        self.script = script

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        last = input[-1] if isinstance(input, list) and input else None
        result = (
            last.get("output")
            if isinstance(last, dict) and last.get("type") == "function_call_output"
            else None
        )
        script = self.script
        if script.next_call(str(result) if result is not None else None):
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call_{script.calls}",
                name=TOOL,
                arguments=json.dumps(ARGUMENTS),
                id=f"fc_{script.calls}",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        message = ResponseOutputMessage(
            id="msg",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=FINAL, annotations=[])],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def build(script: Script, fail: bool = False) -> Agent[Any]:
    """``fail``: the tool fails the same way every time (the SDK hands the model its error
    text and the run goes on)."""

    @function_tool(failure_error_function=lambda _, error: f"Error: {error}")
    def search(query: str) -> str:
        """Search the web."""
        result = script.run_tool(query)
        if fail:
            raise RuntimeError(FAILURE)
        return result

    return Agent(name="weather_agent", tools=[search], model=ScriptedModel(script))


@pytest.fixture
def instrumented(tracing: Tracing) -> Iterator[Tracing]:
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    instrumentor = OpenAIAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=tracing.provider)
    try:
        yield tracing
    finally:
        instrumentor.uninstrument()


def test_guardrails_go_on_every_function_tool() -> None:
    agent = guard_agent(build(Script()), LoopGuard(POLICY))
    tools = [tool for tool in agent.tools if isinstance(tool, FunctionTool)]
    assert tools and all(
        tool.tool_input_guardrails and tool.tool_output_guardrails for tool in tools
    )


def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(instrumented: Tracing) -> None:
    tracing = instrumented
    script = Script()
    agent = guard_agent(build(script), processor=tracing.processor)
    with pytest.raises(ToolInputGuardrailTripwireTriggered) as raised:
        Runner.run_sync(
            agent, "What's the weather in Paris?", run_config=RunConfig(group_id="conv-1")
        )
    decision = raised.value.output.output_info
    assert decision.action is Action.STOP
    assert decision.message == REFERENCE[FIRST_STOP - 1].message
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # the guardrails ran inside OpenInference's tool spans (which carry no call id) and asked
    # with the processor's keys: every attempt counted once; the spans alone count the same
    # (a rejected call still has its tool span)
    assert len(tool_spans(tracing)) == FIRST_STOP
    assert calls_seen(tracing.guard) == FIRST_STOP
    assert calls_seen(tracing.spans_only) == FIRST_STOP


def test_the_run_goes_on_when_the_model_reads_the_denial() -> None:
    script = Script(listen=True)
    agent = guard_agent(build(script), LoopGuard(POLICY))
    result = Runner.run_sync(
        agent,
        "What's the weather in Paris?",
        run_config=RunConfig(group_id="conv-2", tracing_disabled=True),
    )
    assert result.final_output == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY)


def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(instrumented: Tracing) -> None:
    tracing = instrumented
    script = Script()
    agent = guard_agent(build(script, fail=True), processor=tracing.processor)
    with pytest.raises(ToolOutputGuardrailTripwireTriggered) as raised:
        Runner.run_sync(
            agent, "What's the weather in Paris?", run_config=RunConfig(group_id="conv-3")
        )
    # the third identical failure: the call ran, then its output guardrail tripped
    decision = raised.value.output.output_info
    assert (decision.action, decision.phase) == (Action.STOP, Phase.POST)
    assert decision.message == FAILURE_STOP_DECISION.message
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert script.seen == [f"Error: {FAILURE}"] * (FAILURE_STOP - 1)
    assert calls_seen(tracing.guard) == FAILURE_STOP


@pytest.mark.parametrize("tracing_disabled", [True, False])
def test_the_advisor_is_told_the_runs_prompt(tracing_disabled: bool) -> None:
    guard, requests = advised_guard()
    script = UntilAdvised()
    agent = guard_agent(build(script), guard)
    config = RunConfig(group_id=f"advised-{tracing_disabled}", tracing_disabled=tracing_disabled)
    result = Runner.run_sync(agent, "What's the weather in Paris?", run_config=config)
    # the loop was rescued: the model read the advice with the denial, then answered
    assert result.final_output == FINAL and ADVICE in script.seen[-1]
    assert [request.task for request in requests] == ["What's the weather in Paris?"]
    if tracing_disabled:
        return  # every run has the same no-op trace: a next run is not told apart
    # the next run in the group (its input: the history, then the new message) is a new run
    # (a new SDK trace): its latest user message is the task from now on
    script.calls, script.seen = 0, []
    follow_up: list[TResponseInputItem] = [
        *result.to_input_list(),
        {"role": "user", "content": "And in Lyon?"},
    ]
    Runner.run_sync(agent, follow_up, run_config=config)
    assert ADVICE in script.seen[-1]
    assert [request.task for request in requests] == [
        "What's the weather in Paris?",
        "And in Lyon?",
    ]
