"""LangGraph, driven for real offline: a custom chat model that loops, a graph whose ToolNode
has the wrapper (sync and async), and OpenInference's LangChain instrumentation writing spans to
the processor's provider."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from otel_loopguard import Action, LoopDetected, LoopGuard
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
    make_tracing,
    plain,
    require,
    tool_spans,
)

require("langgraph")

from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import ToolException, tool  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402

from otel_loopguard.integrations.langgraph import LoopGuardToolWrapper  # noqa: E402


class ScriptedChatModel(BaseChatModel):
    """A chat model that asks for the script's next call, or answers."""

    script: Script

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        last = messages[-1]
        result = str(last.content) if isinstance(last, ToolMessage) else None
        script = self.script
        if script.next_call(result):
            message = AIMessage(
                content="",
                tool_calls=[{"name": TOOL, "args": dict(ARGUMENTS), "id": f"call_{script.calls}"}],
            )
        else:
            message = AIMessage(content=FINAL)
        return ChatResult(generations=[ChatGeneration(message=message)])


def build(script: Script, wrapper: LoopGuardToolWrapper, fail: bool = False) -> Any:
    """``fail``: the tool fails the same way every time (a ``ToolException`` the tool turns
    into a ``ToolMessage`` with ``status="error"``; the model reads it and may call again)."""

    @tool
    def search(query: str) -> str:
        """Search the web."""
        result = script.run_tool(query)
        if fail:
            raise ToolException(FAILURE)
        return result

    search.handle_tool_error = True

    model = ScriptedChatModel(script=script)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node(
        "tools",
        ToolNode(
            [search], wrap_tool_call=wrapper.wrap_tool_call, awrap_tool_call=wrapper.awrap_tool_call
        ),
    )
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(name="weather_agent")


CONFIG = {"configurable": {"thread_id": "thread-1"}, "recursion_limit": 200}


@pytest.fixture
def instrumented() -> Iterator[Tracing]:
    from openinference.instrumentation.langchain import LangChainInstrumentor

    # OpenInference does not make its spans current: key spans and hook by the thread
    tracing = make_tracing(key_by="conversation")
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=tracing.provider)
    try:
        yield tracing
    finally:
        instrumentor.uninstrument()
        tracing.provider.shutdown()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(
    instrumented: Tracing, mode: str
) -> None:
    tracing = instrumented
    script = Script()
    graph = build(script, LoopGuardToolWrapper(processor=tracing.processor))
    inputs = {"messages": [("user", "What's the weather in Paris?")]}
    with pytest.raises(LoopDetected) as raised:
        if mode == "sync":
            graph.invoke(inputs, CONFIG)
        else:
            asyncio.run(graph.ainvoke(inputs, CONFIG))
    assert raised.value.code == Action.STOP.value
    assert plain(raised.value.message) == REFERENCE[FIRST_STOP - 1].message
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # hook and OpenInference tool spans (no call id on them) count each attempt once; LangGraph
    # emits no tool span for a call that did not run, so the spans alone see only those that ran
    assert calls_seen(tracing.guard) == FIRST_STOP
    assert len(tool_spans(tracing)) == calls_seen(tracing.spans_only) == FIRST_DENY - 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_run_goes_on_when_the_model_reads_the_denial(mode: str) -> None:
    script = Script(listen=True)
    graph = build(script, LoopGuardToolWrapper(LoopGuard(POLICY)))
    inputs = {"messages": [("user", "What's the weather in Paris?")]}
    if mode == "sync":
        state = graph.invoke(inputs, CONFIG)
    else:
        state = asyncio.run(graph.ainvoke(inputs, CONFIG))
    assert state["messages"][-1].content == FINAL
    denied = [m for m in state["messages"] if isinstance(m, ToolMessage) and m.status == "error"]
    assert len(denied) == 1 and denied[0].content == REFERENCE[FIRST_DENY - 1].message
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY)


@pytest.mark.parametrize("via", ["processor", "guard"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(
    instrumented: Tracing, mode: str, via: str
) -> None:
    tracing = instrumented
    script = Script()
    # With the processor, the tool span ends before the wrapper sees the result: the span
    # reports the failure first and the wrapper takes the stop from the processor.
    wrapper = (
        LoopGuardToolWrapper(processor=tracing.processor)
        if via == "processor"
        else LoopGuardToolWrapper(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    graph = build(script, wrapper, fail=True)
    inputs = {"messages": [("user", "What's the weather in Paris?")]}
    config = {**CONFIG, "configurable": {"thread_id": f"failing-{mode}"}}
    with pytest.raises(LoopDetected) as raised:
        if mode == "sync":
            graph.invoke(inputs, config)
        else:
            asyncio.run(graph.ainvoke(inputs, config))
    # the third identical failure: the call ran, then the run ended before the next model turn
    assert raised.value.code == Action.STOP.value
    assert plain(raised.value.message) == FAILURE_STOP_DECISION.message
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert script.seen == [FAILURE] * (FAILURE_STOP - 1)
    assert calls_seen(wrapper.guard) == FAILURE_STOP


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_advisor_is_told_the_user_message(mode: str) -> None:
    guard, requests = advised_guard()
    script = UntilAdvised()
    graph = build(script, LoopGuardToolWrapper(guard))
    config = {**CONFIG, "configurable": {"thread_id": f"advised-{mode}"}}

    def invoke(content: Any) -> Any:
        inputs = {"messages": [("user", content)]}
        if mode == "sync":
            return graph.invoke(inputs, config)
        return asyncio.run(graph.ainvoke(inputs, config))

    state = invoke("What's the weather in Paris?")
    # the loop was rescued: the model read the advice with the denial, then answered
    assert state["messages"][-1].content == FINAL and ADVICE in script.seen[-1]
    assert [request.task for request in requests] == ["What's the weather in Paris?"]
    # a new user message in the thread (content blocks: their text is the task) is a new run
    script.calls, script.seen = 0, []
    invoke([{"type": "text", "text": "And in Lyon?"}])
    assert ADVICE in script.seen[-1]
    assert [request.task for request in requests] == [
        "What's the weather in Paris?",
        "And in Lyon?",
    ]
