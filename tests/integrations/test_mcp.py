"""The MCP Python SDK (2.x), driven for real offline: an MCPServer with the LoopGuardMiddleware,
the SDK's Client over its in-memory JSON-RPC transport (the stdio and HTTP path: the client's
trace context travels in each request's ``_meta``), a host loop playing a model that loops inside
an agent span of its own, and the SDK's own spans: the host's and the client's on the host's
provider, the server's on the processor's, as in two processes. Neither the middleware nor the
spans have a call id; the middleware reports before the server span ends, and the span reports
the call only with capture_content (the SDK's spans carry no arguments)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from otel_loopguard import LoopGuard
from otel_loopguard.metrics import PrometheusRecorder

from .conftest import (
    ARGUMENTS,
    FAILURE,
    FAILURE_STOP,
    FAILURE_STOP_DECISION,
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
    require,
    tool_spans,
)
from .scripted import DETOUR_CALLS, OTHER_RESULTS, OTHER_TOOL, Detour

require("mcp")

import mcp.shared._otel as mcp_otel  # noqa: E402
import mcp.shared.jsonrpc_dispatcher as mcp_dispatcher  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client._memory import InMemoryTransport  # noqa: E402
from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from mcp_types import TextContent  # noqa: E402

from otel_loopguard.integrations.mcp import LoopGuardMiddleware  # noqa: E402

#: The model's next call, or None to answer, from the last tool result it read.
Plan = Callable[[str | None], "tuple[str, dict[str, str]] | None"]

AGENT = "weather_agent"


def looping(script: Script) -> Plan:
    return lambda last: (TOOL, dict(ARGUMENTS)) if script.next_call(last) else None


def build(middleware: LoopGuardMiddleware, script: Script | Detour, fail: bool = False) -> Any:
    """``fail``: ``search`` fails the same way every time (a ``ToolError``, whose text the SDK
    hands the client in an ``isError`` result, and the loop goes on)."""
    server = MCPServer("weather", middleware=[middleware])

    @server.tool()
    def search(query: str) -> str:
        """Search the web."""
        result = script.run_tool(query)
        if fail:
            raise ToolError(FAILURE)
        return result

    @server.tool()
    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        assert isinstance(script, Detour)
        return script.run_other(city)

    return server


def host(server: Any, plan: Plan, provider: TracerProvider | None = None) -> list[bool]:
    """The agent: call the server's tools as the plan says until it answers, inside an agent
    span on ``provider`` (none: outside any span); the model reads a result's text blocks, a
    blank line between them. Returns whether each result was an error."""
    errors: list[bool] = []

    async def go() -> None:
        async with Client(InMemoryTransport(server)) as client:
            last = None
            while (call := plan(last)) is not None:
                result = await client.call_tool(*call)
                errors.append(result.is_error)
                texts = [block.text for block in result.content if isinstance(block, TextContent)]
                last = "\n\n".join(texts)

    if provider is None:
        asyncio.run(go())
        return errors
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": AGENT}
    tracer = provider.get_tracer("host")
    with tracer.start_as_current_span(f"invoke_agent {AGENT}", attributes=attributes):
        asyncio.run(go())
    return errors


def client_spans_on(provider: trace.TracerProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's client spans (``MCP send ...``, whose context it puts in ``_meta``) on
    ``provider``: the host process's."""
    tracer = provider.get_tracer("mcp-python-sdk")

    @contextmanager
    def otel_span(name: str, **options: Any) -> Iterator[Any]:
        with tracer.start_as_current_span(name, **options) as span:
            yield span

    monkeypatch.setattr(mcp_dispatcher, "otel_span", otel_span)


@pytest.fixture
def host_provider(monkeypatch: pytest.MonkeyPatch) -> TracerProvider:
    provider = TracerProvider()
    client_spans_on(provider, monkeypatch)
    return provider


@pytest.fixture
def instrumented(tracing: Tracing, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tracing]:
    # the SDK's tracer comes from the global provider; its server spans go to this test's
    monkeypatch.setattr(mcp_otel, "_tracer", tracing.provider.get_tracer("mcp-python-sdk"))
    yield tracing


@pytest.mark.parametrize("capture_content", [False, True], ids=["spans-bare", "spans-content"])
def test_loop_is_reminded_then_denied_and_the_stop_text_keeps_coming(
    instrumented: Tracing, host_provider: TracerProvider, capture_content: bool
) -> None:
    tracing = instrumented
    script = Script()
    middleware = LoopGuardMiddleware(processor=tracing.processor, capture_content=capture_content)
    errors = host(build(middleware, script), looping(script), host_provider)
    # the server cannot end the client's run: the model reads every refusal, the stop texts
    # too (an error result each), until its own cap
    assert script.calls == SAFETY_CAP and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(SAFETY_CAP)
    assert errors == [d.blocks for d in REFERENCE[:SAFETY_CAP]]
    assert REFERENCE[FIRST_STOP - 1].message in script.seen
    # every call has a server span (a blocked one too, its status an error); with the content
    # on it, the span reports the call after the middleware did, and it still counts once
    assert len(tool_spans(tracing)) == SAFETY_CAP
    assert calls_seen(tracing.guard) == SAFETY_CAP
    assert calls_seen(tracing.spans_only) == (SAFETY_CAP if capture_content else 0)


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_after_the_denial_another_tool_is_never_blocked(
    instrumented: Tracing, host_provider: TracerProvider, via: str
) -> None:
    tracing = instrumented
    script = Detour()
    middleware = (
        LoopGuardMiddleware(processor=tracing.processor, capture_content=True)
        if via == "processor"
        else LoopGuardMiddleware(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    host(build(middleware, script), script.next_call, host_provider)
    assert script.calls == FIRST_DENY and script.tool_runs == FIRST_DENY - 1
    assert script.seen == expected_tool_results(FIRST_DENY) + OTHER_RESULTS
    assert script.other_runs == DETOUR_CALLS
    assert calls_seen(middleware.guard) == FIRST_DENY
    assert calls_seen(middleware.guard, OTHER_TOOL) == DETOUR_CALLS


def test_each_agent_run_is_its_own_session(host_provider: TracerProvider) -> None:
    # no tracing on the server: the middleware keys by the trace the client propagates
    script = Script(listen=True)
    server = build(LoopGuardMiddleware(LoopGuard(POLICY)), script)
    host(server, looping(script), host_provider)
    assert script.seen == expected_tool_results(FIRST_DENY)
    script.calls, script.seen = 0, []
    host(server, looping(script), host_provider)
    assert script.seen == expected_tool_results(FIRST_DENY)


def test_without_trace_context_the_connection_is_the_session(
    instrumented: Tracing, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a client without tracing sends no trace context: every call of the process's one client
    # is one session (no new run can be seen), and the server spans, each a trace of its own,
    # get no content, so the processor's per-request keys never count a call
    tracing = instrumented
    client_spans_on(trace.NoOpTracerProvider(), monkeypatch)
    script = Script(listen=True)
    middleware = LoopGuardMiddleware(processor=tracing.processor, capture_content=True)
    server = build(middleware, script)
    host(server, looping(script))
    assert script.seen == expected_tool_results(FIRST_DENY)
    script.calls, script.seen = 0, []
    host(server, looping(script))
    # the next run of that client goes on in the same session: its first call is refused
    assert script.calls == 1 and script.seen == [REFERENCE[FIRST_DENY].message]
    assert calls_seen(tracing.guard) == FIRST_DENY + 1
    assert calls_seen(tracing.spans_only) == 0


@pytest.mark.parametrize("via", ["processor", "guard"])
def test_a_call_failing_the_same_way_gets_the_stop_text(
    instrumented: Tracing, host_provider: TracerProvider, via: str
) -> None:
    tracing = instrumented
    script = Script()
    middleware = (
        LoopGuardMiddleware(processor=tracing.processor, capture_content=True)
        if via == "processor"
        else LoopGuardMiddleware(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    )
    server = build(middleware, script, fail=True)

    def plan(last: str | None) -> tuple[str, dict[str, str]] | None:
        if script.calls < FAILURE_STOP:
            return looping(script)(last)
        script.seen.append(str(last))  # the model reads the last result, then answers
        return None

    host(server, plan, host_provider)
    # the third identical failure: the call ran and failed, the stop text follows its error
    assert script.calls == script.tool_runs == FAILURE_STOP
    assert all(FAILURE in text for text in script.seen)
    assert not any(FAILURE_STOP_DECISION.message in text for text in script.seen[:-1])
    assert script.seen[-1].endswith(f"\n\n{FAILURE_STOP_DECISION.message}")
    assert calls_seen(middleware.guard) == FAILURE_STOP


def test_other_requests_pass_through() -> None:
    script = Script()
    middleware = LoopGuardMiddleware(LoopGuard(POLICY, recorder=PrometheusRecorder()))
    server = build(middleware, script)

    async def go() -> list[str]:
        async with Client(server) as client:
            return [tool.name for tool in (await client.list_tools()).tools]

    assert sorted(asyncio.run(go())) == sorted([TOOL, OTHER_TOOL])
    assert calls_seen(middleware.guard) == 0


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


@pytest.mark.parametrize("plan", ["loop", "detour"])
def test_in_process_host_and_server_on_one_provider_count_each_call_once(
    instrumented: Tracing, monkeypatch: pytest.MonkeyPatch, plan: str
) -> None:
    # the host's agent span, the client's spans and the server's spans all on the processor's
    # provider (one process): the server's tools/call span has the client's span as its parent
    # through _meta (a remote parent the processor saw start), and is keyed under the host's
    # agent, as the middleware asks; with the content on it, each call counts once
    tracing = instrumented
    client_spans_on(tracing.provider, monkeypatch)
    script: Script | Detour = Script() if plan == "loop" else Detour()
    middleware = LoopGuardMiddleware(processor=tracing.processor, capture_content=True)
    next_call = looping(script) if isinstance(script, Script) else script.next_call
    host(build(middleware, script), next_call, tracing.provider)
    if isinstance(script, Script):
        assert script.calls == SAFETY_CAP and script.tool_runs == FIRST_DENY - 1
        assert script.seen == expected_tool_results(SAFETY_CAP)
        assert calls_seen(tracing.guard) == calls_seen(tracing.spans_only) == SAFETY_CAP
    else:
        # the other tool is never blocked: its span's chain is the middleware's chain
        assert script.seen == expected_tool_results(FIRST_DENY) + OTHER_RESULTS
        assert script.other_runs == DETOUR_CALLS
        assert calls_seen(tracing.guard) == calls_seen(tracing.spans_only) == FIRST_DENY
        assert calls_seen(tracing.guard, OTHER_TOOL) == DETOUR_CALLS
    assert agents_counted(tracing.guard) == agents_counted(tracing.spans_only) == {AGENT}
