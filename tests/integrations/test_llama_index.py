"""LlamaIndex agents, driven for real offline: LlamaIndex's own MockFunctionCallingLLM playing a
model that loops, a FunctionAgent subclass made by guard_class, and OpenInference's LlamaIndex
instrumentation writing spans to the processor's provider. The step sees the model's call id;
the tool spans have none and end before the step reports."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from opentelemetry.sdk.trace import TracerProvider

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

require("llama_index")

# LlamaIndex's workflows look their steps up with inspect.getmembers on the pydantic agent, which
# touches pydantic's deprecated attributes: hundreds of warnings a run, none of them ours.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

from llama_index.core.agent.workflow import FunctionAgent  # noqa: E402
from llama_index.core.base.llms.types import (  # noqa: E402
    ChatMessage,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.llms.mock import MockFunctionCallingLLM  # noqa: E402
from llama_index.core.tools import FunctionTool  # noqa: E402
from llama_index.core.workflow import Context  # noqa: E402

from otel_loopguard.integrations.llama_index import (  # noqa: E402
    SESSION_KEY,
    LoopGuardToolCalls,
    guard_class,
)

#: The model's next call, or None to answer, from the last tool result it read.
Plan = Callable[[str | None], "tuple[str, dict[str, str]] | None"]

TASK = "What's the weather in Paris?"
#: Model turns a run may take (LlamaIndex's default is 20): more than the script's cap.
MAX_ITERATIONS = SAFETY_CAP + 10


def looping(script: Script) -> Plan:
    return lambda last: (TOOL, dict(ARGUMENTS)) if script.next_call(last) else None


def scripted_llm(plan: Plan) -> MockFunctionCallingLLM:
    """LlamaIndex's mock function-calling LLM answering with the plan's next call, or text."""
    turns = [0]

    def respond(messages: list[ChatMessage], **kwargs: Any) -> ChatMessage:
        last = messages[-1]
        result = last.content if last.role == MessageRole.TOOL else None
        turns[0] += 1
        call = plan(result)
        if call is None:
            return ChatMessage(role=MessageRole.ASSISTANT, content=FINAL)
        name, arguments = call
        block = ToolCallBlock(
            tool_call_id=f"call_{turns[0]}", tool_name=name, tool_kwargs=arguments
        )
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[block])

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


def build(
    plan: Plan, script: Script | Detour, tool_calls: LoopGuardToolCalls, fail: bool = False
) -> Any:
    """``fail``: ``search`` fails the same way every time (the agent hands the model the error
    as the tool result and the loop goes on)."""

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

    agent_class = tool_calls.agent_class(FunctionAgent)
    return agent_class(
        name="weather_agent",
        description="Answers weather questions.",
        tools=[FunctionTool.from_defaults(fn=search), FunctionTool.from_defaults(fn=get_weather)],
        llm=scripted_llm(plan),
    )


def run(agent: Any, ctx: Context | None = None, task: str = TASK) -> str:
    async def go() -> Any:
        return await agent.run(user_msg=task, max_iterations=MAX_ITERATIONS, ctx=ctx)

    return str(asyncio.run(go()).response.content)


@pytest.fixture
def instrumented(tracing: Tracing) -> Iterator[Tracing]:
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    instrumentor = LlamaIndexInstrumentor()
    instrumentor.instrument(tracer_provider=tracing.provider)
    try:
        yield tracing
    finally:
        instrumentor.uninstrument()


def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(instrumented: Tracing) -> None:
    tracing = instrumented
    script = Script()
    agent = build(looping(script), script, LoopGuardToolCalls(processor=tracing.processor))
    # the stop answers the call with the stop text as a return_direct result: the run ends
    # without another model call, the stop text as the agent's response
    assert run(agent) == REFERENCE[FIRST_STOP - 1].message
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # hook (with the model's call id) and tool spans (without; the span ends first) count each
    # attempt once; a blocked call has no tool span, so the spans alone see only those that ran
    assert calls_seen(tracing.guard) == FIRST_STOP
    assert len(tool_spans(tracing)) == calls_seen(tracing.spans_only) == FIRST_DENY - 1


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_after_the_denial_another_tool_is_never_blocked(instrumented: Tracing, via: str) -> None:
    tracing = instrumented
    script = Detour()
    tool_calls = (
        LoopGuardToolCalls(processor=tracing.processor)
        if via == "processor"
        else LoopGuardToolCalls(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    assert run(build(script.next_call, script, tool_calls)) == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY) + OTHER_RESULTS
    assert script.other_runs == DETOUR_CALLS
    assert calls_seen(tool_calls.guard) == FIRST_DENY
    assert calls_seen(tool_calls.guard, OTHER_TOOL) == DETOUR_CALLS


def test_a_run_that_continues_the_context_keeps_the_session_in_a_new_epoch() -> None:
    script = Script(listen=True)
    agent = build(looping(script), script, LoopGuardToolCalls(LoopGuard(POLICY)))
    ctx = Context(agent)
    assert run(agent, ctx) == FINAL
    assert script.seen == expected_tool_results(FIRST_DENY)
    session = asyncio.run(ctx.store.get(SESSION_KEY))
    assert isinstance(session, str)
    script.calls, script.seen = 0, []
    assert run(agent, ctx, "And now?") == FINAL
    assert script.seen == expected_tool_results(FIRST_DENY)
    assert asyncio.run(ctx.store.get(SESSION_KEY)) == session


def test_a_stop_can_be_answered_as_a_message() -> None:
    script = Script()
    tool_calls = LoopGuardToolCalls(LoopGuard(POLICY), on_stop="message")
    assert run(build(looping(script), script, tool_calls)) == FINAL
    # the model reads every refusal, the stop texts too, until its own cap, then answers
    assert script.calls == SAFETY_CAP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(SAFETY_CAP)


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(
    instrumented: Tracing, via: str
) -> None:
    tracing = instrumented
    script = Script()
    # With the processor, the tool span (status error) ends before the step sees the result:
    # the span reports the failure first and the step takes the stop from the processor.
    tool_calls = (
        LoopGuardToolCalls(processor=tracing.processor)
        if via == "processor"
        else LoopGuardToolCalls(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    answer = run(build(looping(script), script, tool_calls, fail=True))
    # the third identical failure: the call ran, then the run ended with the stop text
    assert answer == FAILURE_STOP_DECISION.message
    assert FAILURE_STOP_DECISION.action is Action.STOP
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert script.seen == [FAILURE] * (FAILURE_STOP - 1)
    assert calls_seen(tool_calls.guard) == FAILURE_STOP


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_the_advisor_is_told_the_runs_prompt(via: str) -> None:
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    guard, requests = advised_guard()
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(guard, tracer_provider=provider)
    if via == "processor":  # else the spans never reach the guard
        provider.add_span_processor(processor)
    instrumentor = LlamaIndexInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    tool_calls = (
        LoopGuardToolCalls(processor=processor) if via == "processor" else LoopGuardToolCalls(guard)
    )
    script = Script()
    agent = build(looping(script), script, tool_calls)
    ctx = Context(agent)
    told: dict[str, list[str | None]] = {}
    try:
        for prompt in PROMPTS:
            script.calls = 0
            # the rescue came first: the run looped on until the stop ended it
            assert run(agent, ctx, prompt) == REFERENCE[FIRST_STOP - 1].message
            told[prompt] = [request.task for request in requests]
            requests.clear()
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
    for prompt, tasks in told.items():
        assert tasks, f"the guard never rescued in the run of {prompt!r}"
        assert all(task is not None and prompt in task for task in tasks), tasks


def test_guard_class_names_the_subclass_and_refuses_what_is_no_agent_workflow() -> None:
    guarded = guard_class(FunctionAgent, LoopGuard(POLICY))
    assert issubclass(guarded, FunctionAgent)
    assert guarded.__name__ == "LoopGuardFunctionAgent"
    with pytest.raises(ValueError, match="agent workflow class"):
        guard_class(cast(Any, object), LoopGuard(POLICY))
