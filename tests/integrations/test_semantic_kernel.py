"""Semantic Kernel, driven for real offline: a ChatCompletionAgent whose chat service loops (with
Semantic Kernel's own chat tracing decorator, as its OpenAI connector has), the LoopGuardFilter,
and Semantic Kernel's own spans (arguments on them in its sensitive diagnostics mode) writing to
the processor's provider. The filter and the tool spans both carry the model's call id; the tool
span ends before the filter reports."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from otel_loopguard import LoopGuard
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
)
from .scripted import DETOUR_CALLS, OTHER_RESULTS, OTHER_TOOL, Detour, global_spans

# Semantic Kernel's GenAI diagnostics with the arguments and results on its spans (read once,
# when semantic_kernel is imported)
os.environ.setdefault("SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS_SENSITIVE", "true")

require("semantic_kernel")

from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread  # noqa: E402
from semantic_kernel.connectors.ai import (  # noqa: E402
    FunctionChoiceBehavior,
    PromptExecutionSettings,
)
from semantic_kernel.connectors.ai.chat_completion_client_base import (  # noqa: E402
    ChatCompletionClientBase,
)
from semantic_kernel.contents import (  # noqa: E402
    AuthorRole,
    ChatMessageContent,
    FunctionCallContent,
    FunctionResultContent,
)
from semantic_kernel.functions import KernelArguments, kernel_function  # noqa: E402
from semantic_kernel.utils.telemetry.model_diagnostics.decorators import (  # noqa: E402
    trace_chat_completion,
)

from otel_loopguard.integrations.semantic_kernel import LoopGuardFilter  # noqa: E402

#: The plugin the tools are in: the model calls them, and the guard names them, "tools-<name>".
PLUGIN = "tools"
SEARCH = f"{PLUGIN}-{TOOL}"
OTHER = f"{PLUGIN}-{OTHER_TOOL}"

#: The user's message, the prompt of the run.
TASK = "What's the weather in Paris?"

#: The model's next call, or None to answer, from the last tool result it read.
Plan = Callable[[str | None], "tuple[str, dict[str, str]] | None"]


def looping(script: Script) -> Plan:
    return lambda last: (TOOL, dict(ARGUMENTS)) if script.next_call(last) else None


def named(texts: list[str]) -> list[str]:
    """The reference texts with the tool named as the model calls it here."""
    return [text.replace(f"`{TOOL}`", f"`{SEARCH}`") for text in texts]


class ScriptedChat(ChatCompletionClientBase):
    """A chat service that asks for the plan's next call, or answers."""

    SUPPORTS_FUNCTION_CALLING = True
    plan: Any = None
    turns: int = 0

    @trace_chat_completion("scripted")
    async def _inner_get_chat_message_contents(
        self, chat_history: Any, settings: Any
    ) -> list[ChatMessageContent]:
        results = [
            str(item.result)
            for item in chat_history.messages[-1].items
            if isinstance(item, FunctionResultContent)
        ]
        call = self.plan(results[-1] if results else None)
        self.turns += 1
        if call is None:
            return [ChatMessageContent(role=AuthorRole.ASSISTANT, content=FINAL)]
        name, arguments = call
        content = FunctionCallContent(
            id=f"call_{self.turns}", name=f"{PLUGIN}-{name}", arguments=json.dumps(arguments)
        )
        return [ChatMessageContent(role=AuthorRole.ASSISTANT, items=[content])]


def respond(
    plan: Plan,
    script: Script | Detour,
    guard_filter: LoopGuardFilter,
    fail: bool = False,
    prompt: str = TASK,
    thread: ChatHistoryAgentThread | None = None,
) -> ChatMessageContent:
    """One agent invocation with ``prompt``, in ``thread`` if given; ``fail``: ``search`` fails
    the same way every time (it raises; Semantic Kernel hands the model the error and the loop
    goes on)."""

    class Tools:
        @kernel_function(description="Search the web.")
        def search(self, query: str) -> str:
            result = script.run_tool(query)
            if fail:
                raise RuntimeError(FAILURE)
            return result

        @kernel_function(description="Get the weather for a city.")
        def get_weather(self, city: str) -> str:
            assert isinstance(script, Detour)
            return script.run_other(city)

    behavior = FunctionChoiceBehavior.Auto(maximum_auto_invoke_attempts=2 * SAFETY_CAP)
    agent = ChatCompletionAgent(
        service=ScriptedChat(ai_model_id="scripted", plan=plan),
        name="weather_agent",
        arguments=KernelArguments(
            settings=PromptExecutionSettings(function_choice_behavior=behavior)
        ),
    )
    agent.kernel.add_plugin(Tools(), plugin_name=PLUGIN)
    guard_filter.add_to(agent.kernel)

    async def go() -> ChatMessageContent:
        response = await agent.get_response(messages=prompt, thread=thread)
        return response.message

    return asyncio.run(go())


def function_result(message: ChatMessageContent) -> str | None:
    """The result in a tool message (the response of a run a stop ended), else None."""
    results = [item for item in message.items if isinstance(item, FunctionResultContent)]
    return str(results[-1].result) if results else None


def search_spans(tracing: Tracing) -> int:
    return sum(
        1 for span in tracing.exporter.get_finished_spans() if span.name == f"execute_tool {SEARCH}"
    )


@pytest.fixture
def instrumented(tracing: Tracing) -> Iterator[Tracing]:
    # Semantic Kernel traces through the global provider: hand its spans to this test's
    with global_spans().to(tracing.provider):
        yield tracing


def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(instrumented: Tracing) -> None:
    tracing = instrumented
    script = Script()
    message = respond(looping(script), script, LoopGuardFilter(processor=tracing.processor))
    # the stop answers the call and ends the auto-invoke loop: no model call after it
    assert message.role == AuthorRole.TOOL
    assert function_result(message) == named([REFERENCE[FIRST_STOP - 1].message])[0]
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == named(expected_tool_results(FIRST_STOP - 1))
    # filter and tool spans (both with the call id; the span ends first) count each attempt
    # once; a blocked call has no tool span, so the spans alone see only the calls that ran
    assert calls_seen(tracing.guard, SEARCH) == FIRST_STOP
    assert search_spans(tracing) == calls_seen(tracing.spans_only, SEARCH) == FIRST_DENY - 1


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_after_the_denial_another_tool_is_never_blocked(instrumented: Tracing, via: str) -> None:
    tracing = instrumented
    script = Detour()
    guard_filter = (
        LoopGuardFilter(processor=tracing.processor)
        if via == "processor"
        else LoopGuardFilter(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    message = respond(script.next_call, script, guard_filter)
    assert message.content == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == named(expected_tool_results(FIRST_DENY)) + OTHER_RESULTS
    assert script.other_runs == DETOUR_CALLS
    assert calls_seen(guard_filter.guard, SEARCH) == FIRST_DENY
    assert calls_seen(guard_filter.guard, OTHER) == DETOUR_CALLS


def test_a_stop_can_be_answered_as_a_message() -> None:
    script = Script()
    guard_filter = LoopGuardFilter(LoopGuard(POLICY), on_stop="message")
    message = respond(looping(script), script, guard_filter)
    # the model reads every refusal, the stop texts too, until its own cap, then answers
    assert message.content == FINAL
    assert script.calls == SAFETY_CAP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == named(expected_tool_results(SAFETY_CAP))


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(
    instrumented: Tracing, via: str
) -> None:
    tracing = instrumented
    script = Script()
    # With the processor, the tool span (status error) ends before the filter reports: the span
    # reports the failure first and the filter takes the stop from the processor.
    guard_filter = (
        LoopGuardFilter(processor=tracing.processor)
        if via == "processor"
        else LoopGuardFilter(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    message = respond(looping(script), script, guard_filter, fail=True)
    # the third identical failure: the call ran, and its result (with the stop text) ends the
    # auto-invoke loop without another model call
    result = function_result(message)
    assert result is not None and FAILURE in result
    assert result.endswith(named([FAILURE_STOP_DECISION.message])[0])
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert len(script.seen) == FAILURE_STOP - 1 and all(FAILURE in text for text in script.seen)
    assert calls_seen(guard_filter.guard, SEARCH) == FAILURE_STOP


@pytest.mark.parametrize("via", ["processor", "guard", "session"])
def test_the_advisor_is_told_the_runs_prompt(via: str) -> None:
    guard, requests = advised_guard()
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(guard, tracer_provider=provider)
    if via == "processor":  # else the spans never reach the guard
        provider.add_span_processor(processor)
    guard_filter = (
        LoopGuardFilter(processor=processor)
        if via == "processor"
        else LoopGuardFilter(guard, session="conversation" if via == "session" else None)
    )
    thread = ChatHistoryAgentThread()
    told: dict[str, list[str | None]] = {}
    try:
        with global_spans().to(provider):
            for prompt in PROMPTS:
                script = Script()
                message = respond(
                    looping(script), script, guard_filter, prompt=prompt, thread=thread
                )
                # the rescue came first: the run looped on until the stop ended it
                assert function_result(message) == named([REFERENCE[FIRST_STOP - 1].message])[0]
                told[prompt] = [request.task for request in requests]
                requests.clear()
    finally:
        provider.shutdown()
    for prompt, tasks in told.items():
        assert tasks, f"the guard never rescued in the run of {prompt!r}"
        assert all(task is not None and prompt in task for task in tasks), tasks
