"""Agno, driven for real offline: a Model that loops, the LoopGuardToolHook in the agent's
tool_hooks (sync and async runs), and OpenInference's Agno instrumentation writing spans to the
processor's provider. Neither the hook nor the spans carry a call id; the hook runs inside the
tool span and reports before it ends."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
    tool_spans,
)
from .scripted import DETOUR_CALLS, OTHER_RESULTS, OTHER_TOOL, Detour, Forward

# Agno's own usage telemetry off (offline; the agents below also say telemetry=False)
os.environ.setdefault("AGNO_TELEMETRY", "false")

require("agno")

from agno.agent import Agent, RunOutput  # noqa: E402
from agno.models.base import Model  # noqa: E402
from agno.models.response import ModelResponse  # noqa: E402

from otel_loopguard.integrations.agno import LoopGuardToolHook  # noqa: E402

CONVERSATION = "conv-1"

#: The model's next call, or None to answer, from the last tool result it read.
Plan = Callable[[str | None], "tuple[str, dict[str, str]] | None"]


def looping(script: Script) -> Plan:
    return lambda last: (TOOL, dict(ARGUMENTS)) if script.next_call(last) else None


@dataclass
class ScriptedModel(Model):
    """A model that asks for the plan's next call, or answers."""

    id: str = "scripted"
    name: str = "ScriptedModel"
    provider: str = "scripted"
    plan: Any = None
    turns: int = 0

    def invoke(self, *args: Any, messages: Any = None, **kwargs: Any) -> ModelResponse:
        last = messages[-1] if messages else None
        is_result = getattr(last, "role", None) == "tool"
        result = str(getattr(last, "content", None)) if is_result else None
        call = self.plan(result)
        self.turns += 1
        if call is None:
            return ModelResponse(role="assistant", content=FINAL)
        name, arguments = call
        tool_call = {
            "id": f"call_{self.turns}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return ModelResponse(role="assistant", tool_calls=[tool_call])

    async def ainvoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return self.invoke(*args, **kwargs)

    def invoke_stream(self, *args: Any, **kwargs: Any) -> Any:
        yield self.invoke(*args, **kwargs)

    async def ainvoke_stream(self, *args: Any, **kwargs: Any) -> Any:
        yield self.invoke(*args, **kwargs)

    def _parse_provider_response(self, response: Any, **kwargs: Any) -> Any:
        return response

    def _parse_provider_response_delta(self, response: Any) -> Any:
        return response


def run(
    plan: Plan,
    script: Script | Detour,
    hook: LoopGuardToolHook,
    fail: bool = False,
    mode: str = "sync",
    prompt: str = "What's the weather in Paris?",
) -> RunOutput:
    """One agent run with ``prompt``; ``fail``: ``search`` fails the same way every time (it
    raises; Agno hands the model the error and the loop goes on)."""

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

    agent = Agent(
        name="weather_agent",
        model=ScriptedModel(plan=plan),
        tools=[search, get_weather],
        tool_hooks=[hook],
        telemetry=False,
    )
    if mode == "sync":
        return agent.run(prompt, session_id=CONVERSATION)
    return asyncio.run(agent.arun(prompt, session_id=CONVERSATION))


def last_message(output: RunOutput) -> tuple[str, str]:
    message = (output.messages or [])[-1]
    return str(message.role), str(message.content)


@pytest.fixture(scope="module")
def forward() -> Iterator[Forward]:
    """OpenInference's Agno instrumentation, once for the module, on a provider that hands its
    spans to each test's."""
    from openinference.instrumentation.agno import AgnoInstrumentor

    forward = Forward()
    provider = TracerProvider()
    provider.add_span_processor(forward)
    instrumentor = AgnoInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield forward
    finally:
        instrumentor.uninstrument()


@pytest.fixture
def instrumented(tracing: Tracing, forward: Forward) -> Iterator[Tracing]:
    with forward.to(tracing.provider):
        yield tracing


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_loop_is_denied_at_the_configured_repeat_then_the_run_stops(
    instrumented: Tracing, mode: str
) -> None:
    tracing = instrumented
    script = Script()
    output = run(looping(script), script, LoopGuardToolHook(processor=tracing.processor), mode=mode)
    # the stop ends the run without another model call, the stop text its last message
    assert last_message(output) == ("tool", REFERENCE[FIRST_STOP - 1].message)
    assert script.calls == FIRST_STOP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_STOP - 1)
    # hook and tool spans (neither has a call id; the hook reports first) count each attempt
    # once; a blocked call has a tool span too, so the spans alone see every attempt
    assert calls_seen(tracing.guard) == FIRST_STOP
    assert len(tool_spans(tracing)) == calls_seen(tracing.spans_only) == FIRST_STOP


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_after_the_denial_another_tool_is_never_blocked(instrumented: Tracing, via: str) -> None:
    tracing = instrumented
    script = Detour()
    hook = (
        LoopGuardToolHook(processor=tracing.processor)
        if via == "processor"
        else LoopGuardToolHook(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    output = run(script.next_call, script, hook)
    assert last_message(output) == ("assistant", FINAL)
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY) + OTHER_RESULTS
    assert script.other_runs == DETOUR_CALLS
    assert calls_seen(hook.guard) == FIRST_DENY
    assert calls_seen(hook.guard, OTHER_TOOL) == DETOUR_CALLS


def test_a_stop_can_be_answered_as_a_message() -> None:
    script = Script()
    output = run(looping(script), script, LoopGuardToolHook(LoopGuard(POLICY), on_stop="message"))
    # the model reads every refusal, the stop texts too, until its own cap, then answers
    assert last_message(output) == ("assistant", FINAL)
    assert script.calls == SAFETY_CAP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(SAFETY_CAP)


@pytest.mark.parametrize("via", ["processor", "guard"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_call_failing_the_same_way_ends_the_run_after_it_ran(
    instrumented: Tracing, mode: str, via: str
) -> None:
    tracing = instrumented
    script = Script()
    hook = (
        LoopGuardToolHook(processor=tracing.processor)
        if via == "processor"
        else LoopGuardToolHook(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    output = run(looping(script), script, hook, fail=True, mode=mode)
    # the third identical failure: the call ran, then the run ended before the next model call
    assert last_message(output) == ("tool", FAILURE_STOP_DECISION.message)
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert script.seen == [FAILURE] * (FAILURE_STOP - 1)
    assert calls_seen(hook.guard) == FAILURE_STOP


@pytest.mark.parametrize("via", ["processor", "guard"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_advisor_is_told_the_runs_prompt(forward: Forward, mode: str, via: str) -> None:
    guard, requests = advised_guard()
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(guard, tracer_provider=provider)
    if via == "processor":  # else the spans never reach the guard
        provider.add_span_processor(processor)
    hook = (
        LoopGuardToolHook(processor=processor) if via == "processor" else LoopGuardToolHook(guard)
    )
    told: dict[str, list[str | None]] = {}
    try:
        with forward.to(provider):
            for prompt in PROMPTS:
                script = Script()
                output = run(looping(script), script, hook, mode=mode, prompt=prompt)
                # the rescue came first: the run looped on until the stop ended it
                assert last_message(output) == ("tool", REFERENCE[FIRST_STOP - 1].message)
                told[prompt] = [request.task for request in requests]
                requests.clear()
    finally:
        provider.shutdown()
    for prompt, tasks in told.items():
        assert tasks, f"the guard never rescued in the run of {prompt!r}"
        assert all(task is not None and prompt in task for task in tasks), tasks
