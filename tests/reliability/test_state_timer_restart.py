"""Issue 23, item 9: kill -9 after the hold timer judged spans, and the restarted ``serve``
counts what the live one counted.

The attack (round two): tool spans arrive without their agent span; ``--hold-seconds`` passes
and the timer judges them without an agent; then the agent span arrives. A restart that applied
the log again without the timer's judgement judged the tool spans together with their agent (the
agent span was there by then): its counts differed from the live run's (2 where it had 0). Here
each run is a real ``serve`` subprocess fed by the real OTLP/HTTP exporter; the one killed with
SIGKILL and restarted must answer the probes exactly as one never killed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.service_tools import ServeProcess, request, require_serve_prerequisites, wait_for

require_serve_prerequisites()

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

HOLD_SECONDS = "0.5"
CONVERSATION = "conv-timer-1"


class Run:
    """One agent run with three identical ``grep`` calls: its tool spans (no root among them)
    and its agent span (the root), recorded once so every server sees the same ids."""

    def __init__(self) -> None:
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("timer")
        with tracer.start_as_current_span(
            "invoke_agent coder",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "coder",
                "gen_ai.conversation.id": CONVERSATION,
            },
        ):
            for index in range(3):
                with tracer.start_as_current_span(
                    "execute_tool grep",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "grep",
                    },
                ) as span:
                    span.set_attribute("gen_ai.tool.call.arguments", json.dumps({"q": "TODO"}))
                    span.set_attribute("gen_ai.tool.call.id", f"call-{index}")
                    span.set_attribute("gen_ai.tool.call.result", "3 matches")
        spans = list(memory.get_finished_spans())
        provider.shutdown()
        self.tools = [s for s in spans if s.parent is not None]
        self.agent = [s for s in spans if s.parent is None]
        assert len(self.tools) == 3 and len(self.agent) == 1
        context = self.agent[0].context
        assert context is not None
        self.trace = f"{context.trace_id:032x}"
        self.with_agent = f"{self.trace}/{context.span_id:016x}"


def _export(url: str, spans: Sequence[ReadableSpan]) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", timeout=30)
    try:
        assert exporter.export(spans) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]


def _metric(port: int, line_start: str) -> float:
    for line in request(port, "GET", "/metrics").body.decode().splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {line_start}")


def _probe(port: int, session: str, agent: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"session": session, "tool": "grep", "arguments": {"q": "TODO"}}
    if agent is not None:
        body["agent"] = agent
    answer = request(
        port,
        "POST",
        "/v1/decisions/before",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    assert answer.status == 200, answer.body
    decision = answer.json()["decision"]
    return {key: decision[key] for key in ("action", "count", "rule")}


def _scenario(run: Run, state: Path, key_by: str, crash: bool) -> list[dict[str, Any]]:
    args = ("--hold-seconds", HOLD_SECONDS, "--key-by", key_by, "--state-dir", str(state))
    server = ServeProcess(*args)
    try:
        _export(server.url, run.tools)
        # The hold timer judges them (without their agent: its span has not arrived).
        flushed = 'loopguard_trace_flushes_early_total{reason="time"}'
        assert wait_for(lambda: _metric(server.port, flushed) >= 1, timeout=30)
        _export(server.url, run.agent)
        assert wait_for(lambda: _metric(server.port, "loopguard_ingest_queue_spans") == 0)
        assert wait_for(lambda: _metric(server.port, "loopguard_trace_agents_lost_total") == 1)
        if crash:
            server.kill9()
            server = ServeProcess(*args)
            assert any("applied again" in line for line in server.lines), server.lines
        # Where the calls were counted: the bare trace (judged without an agent), not the agent
        # run (nor, keyed by conversation, the agent span's conversation).
        sessions = [(run.trace, None), (run.with_agent, "coder"), (CONVERSATION, "coder")]
        probes = [_probe(server.port, session, agent) for session, agent in sessions]
        assert server.stop() == 0
    finally:
        server.close()
    return probes


@pytest.mark.slow
@pytest.mark.parametrize("key_by", ["trace", "conversation"])
def test_a_restart_after_timer_judged_spans_counts_what_the_live_run_counted(
    tmp_path: Path, key_by: str
) -> None:
    run = Run()
    live = _scenario(run, tmp_path / "live", key_by, crash=False)
    # The timer judged the three calls without their agent: counted under the bare trace.
    assert live[0]["count"] == 4, live
    assert [probe["count"] for probe in live[1:]] == [0, 0], live
    restarted = _scenario(run, tmp_path / "killed", key_by, crash=True)
    assert restarted == live


@pytest.mark.slow
def test_a_snapshot_taken_while_spans_wait_keeps_their_deadline(tmp_path: Path) -> None:
    """A snapshot taken while the tool spans wait for the timer, then the timer's judgement and
    the agent span in the log after it, then a crash: the restart puts the spans' deadline
    where it was (not that far after the restart), so the logged judgement judges them again
    as it did live."""
    from otel_loopguard.config import Policy
    from otel_loopguard.service import ServeOptions, Service
    from otel_loopguard.service._durable import _snapshot_of

    run = Run()
    live = _scenario(run, tmp_path / "live", "trace", crash=False)
    state = tmp_path / "state"
    options = ServeOptions(http_port=0, grpc_port=None, state_dir=str(state), hold_seconds=2.0)
    service = Service(options, policy=Policy()).start()
    try:
        url = f"http://127.0.0.1:{service.http_port}"
        _export(url, run.tools)
        service._next_snapshot = 0.0  # due now: taken by the ingest thread's next pause
        assert wait_for(lambda: service._snapshot_covered >= 1, timeout=1.5)
        held = _snapshot_of((state / "snapshot").read_bytes())["buffer"]["traces"]
        assert len(held) == 1 and len(held[0]["tools"]) == 3  # still waiting for the timer
        flushed = 'loopguard_trace_flushes_early_total{reason="time"}'
        assert wait_for(lambda: _metric(service.http_port, flushed) >= 1, timeout=30)
        _export(url, run.agent)
        assert service.wait_idle()
    finally:
        assert service._state is not None
        service._state.close()  # a crash: no last snapshot
        service._state = None
        service.close()
    restarted = ServeProcess("--hold-seconds", "2", "--state-dir", str(state))
    try:
        sessions = [(run.trace, None), (run.with_agent, "coder"), (CONVERSATION, "coder")]
        probes = [_probe(restarted.port, session, agent) for session, agent in sessions]
        assert restarted.stop() == 0
    finally:
        restarted.close()
    assert probes == live
