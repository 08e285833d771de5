"""AutoGen AgentChat, driven for real offline: an AssistantAgent whose model client loops (one
that, as AutoGen's OpenAI client does, honours the run's cancellation token; and AutoGen's own
ReplayChatCompletionClient, which ignores it), the LoopGuardWorkbench, and
AutoGen's own spans (through the global provider) writing to the processor's provider. The
workbench and the tool spans both carry the model's call id; the tool span ends before the
workbench reports and carries no arguments."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

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
    REFERENCE,
    SAFETY_CAP,
    TOOL,
    Script,
    Tracing,
    calls_seen,
    expected_tool_results,
    make_tracing,
    plain,
    require,
)
from .scripted import DETOUR_CALLS, OTHER_RESULTS, OTHER_TOOL, Detour, global_spans

require("autogen")

from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_agentchat.base import TaskResult  # noqa: E402
from autogen_agentchat.messages import ToolCallExecutionEvent  # noqa: E402
from autogen_core import CancellationToken, FunctionCall  # noqa: E402
from autogen_core.models import (  # noqa: E402
    ChatCompletionClient,
    CreateResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    RequestUsage,
)
from autogen_core.tools import FunctionTool  # noqa: E402
from autogen_ext.models.replay import ReplayChatCompletionClient  # noqa: E402

from otel_loopguard.integrations.autogen import LoopGuardWorkbench  # noqa: E402

#: The model's next call, or None to answer, from the last tool result it read.
Plan = Callable[[str | None], "tuple[str, dict[str, str]] | None"]

MODEL_INFO: Any = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}
USAGE = RequestUsage(prompt_tokens=10, completion_tokens=5)


def looping(script: Script) -> Plan:
    return lambda last: (TOOL, dict(ARGUMENTS)) if script.next_call(last) else None


class ScriptedClient(ReplayChatCompletionClient):
    """A model client that asks for the plan's next call, or answers; like AutoGen's real
    clients, a call made after the run's token was cancelled is cancelled."""

    def __init__(self, plan: Plan) -> None:
        super().__init__([], model_info=MODEL_INFO)
        self.plan = plan
        self.turns = 0

    async def create(
        self,
        messages: Sequence[LLMMessage],
        *,
        cancellation_token: CancellationToken | None = None,
        **kwargs: Any,
    ) -> CreateResult:
        future = asyncio.ensure_future(self._next(messages))
        if cancellation_token is not None:
            cancellation_token.link_future(future)
        return await future

    async def _next(self, messages: Sequence[LLMMessage]) -> CreateResult:
        last = messages[-1]
        result = (
            str(last.content[-1].content)
            if isinstance(last, FunctionExecutionResultMessage)
            else None
        )
        call = self.plan(result)
        self.turns += 1
        if call is None:
            return CreateResult(finish_reason="stop", content=FINAL, usage=USAGE, cached=False)
        name, arguments = call
        content = [
            FunctionCall(id=f"call_{self.turns}", name=name, arguments=json.dumps(arguments))
        ]
        return CreateResult(
            finish_reason="function_calls", content=content, usage=USAGE, cached=False
        )


def agent_for(
    script: Script | Detour,
    make: Callable[[list[Any]], LoopGuardWorkbench],
    client: ChatCompletionClient,
    fail: bool = False,
    max_tool_iterations: int = 2 * SAFETY_CAP,
) -> AssistantAgent:
    """The agent, its tools on the workbench ``make`` builds; ``fail``: ``search`` fails the
    same way every time (it raises; the workbench hands the model the error and the loop goes
    on)."""

    async def search(query: str) -> str:
        result = script.run_tool(query)
        if fail:
            raise RuntimeError(FAILURE)
        return result

    async def get_weather(city: str) -> str:
        assert isinstance(script, Detour)
        return script.run_other(city)

    tools = [
        FunctionTool(search, description="Search the web."),
        FunctionTool(get_weather, description="Get the weather for a city."),
    ]
    return AssistantAgent(
        "weather_agent",
        model_client=client,
        workbench=make(tools),
        max_tool_iterations=max_tool_iterations,
    )


def run(
    plan: Plan,
    script: Script | Detour,
    make: Callable[[list[Any]], LoopGuardWorkbench],
    fail: bool = False,
) -> TaskResult:
    """One agent run, its model the scripted client that honours the run's token."""
    agent = agent_for(script, make, ScriptedClient(plan), fail)
    return asyncio.run(agent.run(task=TASK))


TASK = "What's the weather in Paris?"


def replay_client(calls: int = SAFETY_CAP) -> ReplayChatCompletionClient:
    """AutoGen's own ReplayChatCompletionClient (it ignores the cancellation token): ``calls``
    calls of ``search``, then the answer."""
    completions: list[str | CreateResult] = [
        CreateResult(
            finish_reason="function_calls",
            content=[FunctionCall(id=f"call_{n}", name=TOOL, arguments=json.dumps(ARGUMENTS))],
            usage=USAGE,
            cached=False,
        )
        for n in range(1, calls + 1)
    ]
    return ReplayChatCompletionClient([*completions, FINAL], model_info=MODEL_INFO)


def results_read(client: ReplayChatCompletionClient) -> list[str]:
    """The tool results the replayed model was given, in order (from its last request)."""
    messages = client.create_calls[-1]["messages"]
    return [
        str(item.content)
        for message in messages
        if isinstance(message, FunctionExecutionResultMessage)
        for item in message.content
    ]


def counting_spans() -> Tracing:
    """A tracing whose guard counts AutoGen's argument-less tool spans (by their call id)."""
    tracing = make_tracing(spans_only=False)
    policy = dataclasses.replace(POLICY, count_calls_without_arguments=True)
    guard = LoopGuard(policy, recorder=PrometheusRecorder())
    processor = LoopGuardSpanProcessor(guard, tracer_provider=tracing.provider)
    tracing.provider.add_span_processor(processor)
    return dataclasses.replace(tracing, guard=guard, processor=processor)


@pytest.fixture(params=["spans skipped", "spans counted"])
def instrumented(request: pytest.FixtureRequest) -> Iterator[Tracing]:
    """AutoGen traces through the global provider: its spans go to this test's. By default
    the processor skips them (no arguments); with ``count_calls_without_arguments`` it counts
    them, and the call id makes each call count once."""
    tracing = make_tracing() if request.param == "spans skipped" else counting_spans()
    try:
        with global_spans().to(tracing.provider):
            yield tracing
    finally:
        tracing.provider.shutdown()


def tool_results(result: TaskResult) -> list[str]:
    return [
        str(item.content)
        for message in result.messages
        if isinstance(message, ToolCallExecutionEvent)
        for item in message.content
    ]


def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(instrumented: Tracing) -> None:
    tracing = instrumented
    script = Script()
    workbench: list[LoopGuardWorkbench] = []

    def make(tools: list[Any]) -> LoopGuardWorkbench:
        workbench.append(LoopGuardWorkbench(tools, processor=tracing.processor))
        return workbench[0]

    # the stop answers the call and cancels the run: the next model call is cancelled
    with pytest.raises(asyncio.CancelledError):
        run(looping(script), script, make)
    stopped = workbench[0].stopped
    assert stopped is not None and plain(stopped.message) == REFERENCE[FIRST_STOP - 1].message
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # workbench and (when counted) the tool spans, both with the call id, count each attempt once
    assert calls_seen(tracing.guard) == FIRST_STOP


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_after_the_denial_another_tool_is_never_blocked(instrumented: Tracing, via: str) -> None:
    tracing = instrumented
    script = Detour()
    guard = (
        tracing.guard if via == "processor" else LoopGuard(POLICY, recorder=PrometheusRecorder())
    )

    def make(tools: list[Any]) -> LoopGuardWorkbench:
        if via == "processor":
            return LoopGuardWorkbench(tools, processor=tracing.processor)
        return LoopGuardWorkbench(tools, guard)

    result = run(script.next_call, script, make)
    assert str(result.messages[-1].content) == FINAL
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY) + OTHER_RESULTS
    assert tool_results(result) == script.seen
    assert script.other_runs == DETOUR_CALLS
    assert calls_seen(guard) == FIRST_DENY
    assert calls_seen(guard, OTHER_TOOL) == DETOUR_CALLS


def test_a_stop_can_be_answered_as_a_message() -> None:
    script = Script()
    result = run(
        looping(script),
        script,
        lambda tools: LoopGuardWorkbench(tools, LoopGuard(POLICY), on_stop="message"),
    )
    # the model reads every refusal, the stop texts too, until its own cap, then answers
    assert str(result.messages[-1].content) == FINAL
    assert script.calls == SAFETY_CAP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(SAFETY_CAP)


def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(instrumented: Tracing) -> None:
    tracing = instrumented
    script = Script()
    workbench: list[LoopGuardWorkbench] = []

    def make(tools: list[Any]) -> LoopGuardWorkbench:
        workbench.append(LoopGuardWorkbench(tools, processor=tracing.processor))
        return workbench[0]

    with pytest.raises(asyncio.CancelledError):
        run(looping(script), script, make, fail=True)
    # the third identical failure: the call ran, then the run ended at the next model call
    stopped = workbench[0].stopped
    assert stopped is not None and plain(stopped.message) == FAILURE_STOP_DECISION.message
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert len(script.seen) == FAILURE_STOP - 1 and all(FAILURE in text for text in script.seen)
    assert calls_seen(tracing.guard) == FAILURE_STOP


def capturing(made: list[LoopGuardWorkbench], **options: Any) -> Any:
    """A ``make`` for :func:`agent_for` that keeps the workbench it builds in ``made``."""

    def make(tools: list[Any]) -> LoopGuardWorkbench:
        made.append(LoopGuardWorkbench(tools, **options))
        return made[-1]

    return make


def test_a_stop_ends_the_run_with_a_client_that_ignores_the_token(instrumented: Tracing) -> None:
    # ReplayChatCompletionClient never looks at the token: the workbench ends the run before
    # the next model call (AgentChat asks it for its tools first)
    tracing = instrumented
    script = Script()
    client = replay_client()
    made: list[LoopGuardWorkbench] = []
    agent = agent_for(script, capturing(made, processor=tracing.processor), client)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(agent.run(task=TASK))
    stopped = made[0].stopped
    assert stopped is not None and plain(stopped.message) == REFERENCE[FIRST_STOP - 1].message
    assert len(client.create_calls) == FIRST_STOP  # no model call after the stop
    assert script.tool_runs == FIRST_DENY - 1
    assert results_read(client) == expected_tool_results(FIRST_STOP - 1)
    assert calls_seen(tracing.guard) == FIRST_STOP


def test_a_stop_from_a_result_ends_the_run_with_a_client_that_ignores_the_token() -> None:
    script = Script()
    client = replay_client()
    made: list[LoopGuardWorkbench] = []
    agent = agent_for(script, capturing(made, guard=LoopGuard(POLICY)), client, fail=True)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(agent.run(task=TASK))
    stopped = made[0].stopped
    assert stopped is not None and plain(stopped.message) == FAILURE_STOP_DECISION.message
    assert len(client.create_calls) == script.tool_runs == FAILURE_STOP


@pytest.mark.parametrize("last_iteration", [False, True], ids=["mid-run", "last-iteration"])
def test_the_next_run_in_the_same_task_is_not_ended_by_the_last_stop(last_iteration: bool) -> None:
    # two runs of one agent on one task (one event loop): the second has its own token, so the
    # first's stop never ends it early; also when that stop came on the agent's last tool
    # iteration (AgentChat then ends the run itself, with no model call after the stop)
    script = Script()
    client = replay_client(2 * SAFETY_CAP)
    agent = agent_for(
        script,
        capturing([], guard=LoopGuard(POLICY)),
        client,
        max_tool_iterations=FIRST_STOP if last_iteration else 2 * SAFETY_CAP,
    )

    async def one_run(task: str) -> bool:
        """Whether the run was cancelled."""
        try:
            await agent.run(task=task)
        except asyncio.CancelledError:
            return True
        return False

    async def twice() -> list[tuple[bool, int]]:
        return [(await one_run(task), len(client.create_calls)) for task in (TASK, "And Lyon?")]

    # each run is a new epoch: the whole ladder again, up to its stop, and no further
    assert asyncio.run(twice()) == [
        (not last_iteration, FIRST_STOP),
        (not last_iteration, 2 * FIRST_STOP),
    ]
    assert script.tool_runs == 2 * (FIRST_DENY - 1)
