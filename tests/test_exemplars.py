"""Exemplars (issue 30): the trace and span of each call a repeat, decision or stop counts, on
the Prometheus and OpenTelemetry recorders, in OpenMetrics only when the scraper asks for it."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from otel_loopguard import LoopGuard
from otel_loopguard._exemplars import DROPPED, counting, current_call
from otel_loopguard.metrics import PrometheusRecorder
from otel_loopguard.metrics.otel import OpenTelemetryRecorder

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
FAILED = "Traceback: ConnectionError: connection refused"


def loop(guard: LoopGuard, calls: int = 10) -> list[str]:
    """One session calling the same failing command ``calls`` times; the actions."""
    actions = []
    for _ in range(calls):
        decision = guard.before_tool("bash", {"command": "pytest -x"}, session="s", agent="coder")
        actions.append(decision.action.value)
        if decision.action.value in ("allow", "remind"):
            guard.after_tool(
                "bash",
                {"command": "pytest -x"},
                session="s",
                agent="coder",
                error=True,
                result=FAILED,
                duration_seconds=1.5,
            )
    return actions


def exemplars(body: str) -> dict[str, set[str]]:
    """Sample name -> the trace ids of its exemplars, from an OpenMetrics body."""
    found: dict[str, set[str]] = {}
    for family in om_families(body):  # type: ignore[no-untyped-call]
        for sample in family.samples:
            if sample.exemplar is not None:
                found.setdefault(sample.name, set()).add(sample.exemplar.labels["trace_id"])
    return found


@pytest.fixture
def tracer() -> Iterator[object]:
    provider = TracerProvider()
    yield provider.get_tracer("test")
    provider.shutdown()


def test_a_loop_in_a_span_carries_its_trace_on_every_counter_that_matters(tracer: object) -> None:
    recorder = PrometheusRecorder()
    guard = LoopGuard(recorder=recorder)
    with tracer.start_as_current_span("agent run") as span:  # type: ignore[attr-defined]
        actions = loop(guard)
        trace_id = f"{span.get_span_context().trace_id:032x}"
    assert "remind" in actions and "stop" in actions
    found = exemplars(recorder.exposition(OPENMETRICS).decode())
    for name in (
        "loopguard_decisions_total",
        "loopguard_stopped_runs_total",
        "loopguard_repeated_calls_total",
        "loopguard_repeated_call_seconds_bucket",
    ):
        assert found.get(name) == {trace_id}, (name, found)
    assert "loopguard_tool_calls_total" not in found  # every call, not a loop: no exemplar


def test_the_text_format_has_no_exemplars_and_still_parses(tracer: object) -> None:
    recorder = PrometheusRecorder()
    guard = LoopGuard(recorder=recorder)
    with tracer.start_as_current_span("agent run"):  # type: ignore[attr-defined]
        loop(guard)
    body, content_type = recorder.page()
    assert content_type.startswith("text/plain")
    assert b"trace_id" not in body
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert "loopguard_decisions" in names
    body, content_type = recorder.page(OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text")
    assert b'# {span_id="' in body and body.endswith(b"# EOF\n")


def test_without_a_trace_there_is_no_exemplar_and_no_error() -> None:
    recorder = PrometheusRecorder()
    actions = loop(LoopGuard(recorder=recorder))
    assert "stop" in actions
    assert exemplars(recorder.exposition(OPENMETRICS).decode()) == {}
    assert recorder.failures.count == 0


@pytest.mark.parametrize(
    "ids",
    [(0, 1), (1, 0), (-1, 5), (1 << 128, 5), (5, 1 << 64), ("abc", 5), (5, 2.0), (None, None)],
)
def test_bad_ids_give_no_exemplar_and_are_counted(ids: tuple[object, object]) -> None:
    recorder = PrometheusRecorder()
    guard = LoopGuard(recorder=recorder)
    before = DROPPED.count
    with counting(*ids):
        assert current_call() is None
        actions = loop(guard)
    assert "stop" in actions
    assert exemplars(recorder.exposition(OPENMETRICS).decode()) == {}
    assert DROPPED.count > before
    assert recorder.failures.count == 0


def test_a_named_span_wins_over_the_active_one(tracer: object) -> None:
    recorder = PrometheusRecorder()
    guard = LoopGuard(recorder=recorder)
    with tracer.start_as_current_span("ignored"), counting(0xABC, 0xDEF):  # type: ignore[attr-defined]
        loop(guard)
    found = exemplars(recorder.exposition(OPENMETRICS).decode())
    assert found["loopguard_decisions_total"] == {f"{0xABC:032x}"}


def test_the_recorders_own_server_negotiates_openmetrics(tracer: object) -> None:
    recorder = PrometheusRecorder()
    guard = LoopGuard(recorder=recorder)
    with tracer.start_as_current_span("agent run"):  # type: ignore[attr-defined]
        loop(guard)
    with recorder.serve(0) as server:
        plain = urllib.request.urlopen(server.url, timeout=10)
        assert plain.headers["Content-Type"].startswith("text/plain")
        assert b"trace_id" not in plain.read()
        asked = urllib.request.Request(server.url, headers={"Accept": OPENMETRICS})
        answer = urllib.request.urlopen(asked, timeout=10)
        assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
        assert "loopguard_stopped_runs_total" in exemplars(answer.read().decode())


def test_the_wsgi_app_negotiates_openmetrics(tracer: object) -> None:
    recorder = PrometheusRecorder()
    with tracer.start_as_current_span("agent run"):  # type: ignore[attr-defined]
        loop(LoopGuard(recorder=recorder))
    app = recorder.wsgi_app()
    for accept, kind in ((OPENMETRICS, "application/openmetrics-text"), ("", "text/plain")):
        seen: dict[str, str] = {}

        def start(status: str, headers: list[tuple[str, str]], seen: dict[str, str] = seen) -> None:
            seen.update(headers)

        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""}
        if accept:
            environ["HTTP_ACCEPT"] = accept
        body = b"".join(app(environ, start))
        assert seen["Content-Type"].startswith(kind)
        assert (b"trace_id" in body) is bool(accept)


def _exemplar_traces(reader: InMemoryMetricReader) -> dict[str, set[int]]:
    traces: dict[str, set[int]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    for exemplar in point.exemplars or ():
                        assert exemplar.trace_id is not None
                        traces.setdefault(metric.name, set()).add(exemplar.trace_id)
    return traces


def test_the_opentelemetry_recorder_attaches_the_trace_to_its_exemplars(tracer: object) -> None:
    """The SDK's own exemplars (its default filter keeps sampled spans' ids): the active span's
    for the hook API, the named span's for a span path."""
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    guard = LoopGuard(recorder=OpenTelemetryRecorder(meters.get_meter("test")))
    with tracer.start_as_current_span("agent run") as span:  # type: ignore[attr-defined]
        loop(guard)
        trace_id = span.get_span_context().trace_id
    traces = _exemplar_traces(reader)
    for name in ("loopguard_decisions", "loopguard_stopped_runs", "loopguard_repeated_calls"):
        assert traces.get(name) == {trace_id}, (name, traces)
    meters.shutdown()

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    guard = LoopGuard(recorder=OpenTelemetryRecorder(meters.get_meter("test")))
    with counting(0x123, 0x456):
        loop(guard)
    assert _exemplar_traces(reader)["loopguard_stopped_runs"] == {0x123}
    meters.shutdown()


def test_trip_lines_carry_the_trace_of_the_call_decided(tmp_path: object, tracer: object) -> None:
    """The in-process guard's decision log (the trip log) joins its trace: ``trace_id`` and
    ``span_id`` on each line of a call that has them, none on a call without a trace."""
    import json
    from pathlib import Path

    from otel_loopguard import PRESETS

    path = Path(str(tmp_path)) / "trips.jsonl"
    guard = LoopGuard(PRESETS["default"].replace(trip_log_path=str(path)))
    with tracer.start_as_current_span("agent run") as span:  # type: ignore[attr-defined]
        loop(guard)
        context = span.get_span_context()
    traced = [json.loads(line) for line in path.read_text().splitlines()]
    assert traced and all(
        line["trace_id"] == f"{context.trace_id:032x}"
        and line["span_id"] == f"{context.span_id:016x}"
        for line in traced
    )
    guard.new_run("s")
    loop(guard)
    untraced = [json.loads(line) for line in path.read_text().splitlines()][len(traced) :]
    assert untraced and not any("trace_id" in line or "span_id" in line for line in untraced)


def test_the_span_processor_names_the_tool_span_of_each_call() -> None:
    """Through the processor, an exemplar is the tool span's own (trace and span id), not the
    agent span that is active while the tool spans end."""
    import json

    from otel_loopguard import LoopGuardSpanProcessor

    recorder = PrometheusRecorder()
    guard = LoopGuard(recorder=recorder)
    provider = TracerProvider()
    provider.add_span_processor(LoopGuardSpanProcessor(guard))
    tracer = provider.get_tracer("agent")
    tool_spans: set[str] = set()
    with tracer.start_as_current_span(
        "invoke_agent coder",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "coder"},
    ) as run:
        trace_id = f"{run.get_span_context().trace_id:032x}"
        for _ in range(10):
            span = tracer.start_span(
                "execute_tool bash",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "bash",
                    "gen_ai.tool.call.arguments": json.dumps({"command": "pytest -x"}),
                },
            )
            tool_spans.add(f"{span.get_span_context().span_id:016x}")
            span.set_attribute("gen_ai.tool.call.result", FAILED)
            span.end()
    provider.shutdown()
    body = recorder.exposition(OPENMETRICS).decode()
    spans = {
        sample.exemplar.labels["span_id"]
        for family in om_families(body)  # type: ignore[no-untyped-call]
        for sample in family.samples
        if sample.exemplar is not None
    }
    assert exemplars(body).get("loopguard_decisions_total") == {trace_id}
    assert spans and spans <= tool_spans
