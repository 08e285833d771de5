"""otel-loopguard serve: real OTLP exporters in, the same decisions as the span processor out.

Every test starts a real :class:`Service` on free loopback ports and talks to it over real
sockets: the opentelemetry-exporter-otlp exporters (HTTP protobuf, HTTP gzip, gRPC), raw HTTP
requests and a raw gRPC channel.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .service_tools import require_serve_prerequisites

require_serve_prerequisites()

import grpc  # noqa: E402
from google.rpc import status_pb2  # noqa: E402
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: E402
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: E402
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)

from otel_loopguard._guard import LoopGuard  # noqa: E402
from otel_loopguard.config import PRESETS  # noqa: E402
from otel_loopguard.metrics import PrometheusRecorder  # noqa: E402
from otel_loopguard.processor import LoopGuardSpanProcessor  # noqa: E402
from otel_loopguard.service import ServeOptions, Service  # noqa: E402
from otel_loopguard.service._options import (  # noqa: E402
    RETRY_AFTER_SECONDS,
)

from .conftest import FakeClock  # noqa: E402
from .service_tools import (  # noqa: E402
    guard_samples,
    keep_alive,
    looping,
    request,
    run_agent,
    sample,
    trip_lines,
    wait_for,
    workload,
)

DEFAULT = PRESETS["default"]
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}


def start(tmp_path: Path, name: str = "serve", *, clock: Any = None, **options: Any) -> Service:
    policy = DEFAULT.replace(trip_log_path=str(tmp_path / f"{name}.trips.jsonl"))
    settings: dict[str, Any] = {"http_port": 0, "grpc_port": 0, "hold_seconds": 60.0}
    settings.update(options)
    guard = LoopGuard(policy, recorder=PrometheusRecorder())
    kwargs: dict[str, Any] = {"guard": guard}
    if clock is not None:
        kwargs["clock"] = clock
    return Service(ServeOptions(**settings), **kwargs).start()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = start(tmp_path)
    yield svc
    svc.close(timeout=10)


def registry(service: Service) -> Any:
    return service.guard.recorder.registry  # type: ignore[attr-defined]


# -- acceptance: real exporters, the processor's decisions --------------------------------------


def _exporter(kind: str, service: Service) -> SpanExporter:
    if kind == "grpc":
        return GrpcExporter(endpoint=f"127.0.0.1:{service.grpc_port}", insecure=True, timeout=10)
    url = f"http://127.0.0.1:{service.http_port}/v1/traces"
    if kind == "http-gzip":
        return HttpExporter(endpoint=url, compression=Compression.Gzip, timeout=10)
    return HttpExporter(endpoint=url, timeout=10)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "batched"),
    [
        ("http", False),  # one request per span: children before parents, across requests
        ("http-gzip", True),
        ("grpc", True),
    ],
)
def test_exporters_give_the_processors_decisions_metrics_and_trip_log(
    tmp_path: Path, kind: str, batched: bool
) -> None:
    in_process = LoopGuard(
        DEFAULT.replace(trip_log_path=str(tmp_path / "local.jsonl")), recorder=PrometheusRecorder()
    )
    service = start(tmp_path)
    try:
        provider = TracerProvider()
        provider.add_span_processor(LoopGuardSpanProcessor(in_process, tracer_provider=provider))
        exporter = _exporter(kind, service)
        export: SpanProcessor = (
            BatchSpanProcessor(exporter, schedule_delay_millis=50)
            if batched
            else SimpleSpanProcessor(exporter)
        )
        provider.add_span_processor(export)
        workload(provider.get_tracer("agent"), traces=2)
        assert provider.force_flush(10_000)
        provider.shutdown()
        assert wait_for(lambda: service.processed_spans > 0)
        assert service.wait_idle(10)
        local = trip_lines(tmp_path / "local.jsonl")
        served = trip_lines(tmp_path / "serve.trips.jsonl")
        assert len(local) > 10
        assert {line["action"] for line in local} >= {"remind", "deny", "stop"}
        assert served == local
        assert guard_samples(registry(service)) == guard_samples(in_process.recorder.registry)  # type: ignore[attr-defined]
        assert sample(registry(service), "loopguard_otlp_spans_total", result="rejected") == 0
        assert service.guard.internal_errors == {}
    finally:
        assert service.close(timeout=10)


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_batch_the_exporter_sends_twice_counts_once(tmp_path: Path, kind: str) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    run_agent(provider.get_tracer("agent"), looping("coder", 3))
    spans = memory.get_finished_spans()
    service = start(tmp_path)
    try:
        exporter = _exporter(kind, service)
        reg = registry(service)
        for _ in range(3):  # sent, then retried twice after its trace was judged and forgotten
            assert exporter.export(spans).name == "SUCCESS"
            assert service.wait_idle(5)
        exporter.shutdown()
        assert sample(reg, "loopguard_tool_calls_total", agent="coder", tool="grep") == 3
        assert wait_for(
            lambda: sample(reg, "loopguard_otlp_spans_total", result="duplicate") == 2 * len(spans)
        )
    finally:
        assert service.close(timeout=10)


def test_a_raw_post_repeated_counts_once(service: Service) -> None:
    body = _json_request(_agent(7, 0xA, None, "planner"), _tool(7, 0x101, 0xA, 0))
    for _ in range(2):
        assert request(service.http_port, "POST", "/v1/traces", body, JSON).status == 200
        assert service.wait_idle(5)
    reg = registry(service)
    assert sample(reg, "loopguard_tool_calls_total", agent="planner", tool="search") == 1
    assert wait_for(lambda: sample(reg, "loopguard_otlp_spans_total", result="duplicate") == 2)


# -- children before parents across requests -----------------------------------------------------


def _span(
    trace: int,
    span: int,
    parent: int | None,
    name: str,
    attributes: dict[str, Any],
    start: int = 1_000,
    end: int = 2_000,
) -> dict[str, Any]:
    return {
        "traceId": f"{trace:032x}",
        "spanId": f"{span:016x}",
        "parentSpanId": f"{parent:016x}" if parent else "",
        "name": name,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes.items()],
    }


def _json_request(*spans: dict[str, Any]) -> bytes:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}).encode()


def _tool(trace: int, span: int, parent: int, n: int) -> dict[str, Any]:
    return _span(
        trace,
        span,
        parent,
        "execute_tool search",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search",
            "gen_ai.tool.call.arguments": '{"q": "paris"}',
            "gen_ai.tool.call.result": "same",
        },
        start=1_000 + n * 10,
        end=1_005 + n * 10,
    )


def _agent(trace: int, span: int, parent: int | None, name: str) -> dict[str, Any]:
    return _span(
        trace,
        span,
        parent,
        f"invoke_agent {name}",
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name},
        900,
        5_000,
    )


def test_children_before_parents_resolve_their_agent_within_the_hold(tmp_path: Path) -> None:
    clock = FakeClock()
    hold = 2.0
    service = start(tmp_path, clock=clock, hold_seconds=hold)
    try:
        port = service.http_port
        # Trace 1: four tool spans in four requests, then their agent span (not the root) in a
        # fifth, within the hold: the tools are keyed by the agent, as in-process.
        for n in range(4):
            assert (
                request(
                    port, "POST", "/v1/traces", _json_request(_tool(1, 0x100 + n, 0xA, n)), JSON
                ).status
                == 200
            )
        assert (
            request(
                port, "POST", "/v1/traces", _json_request(_agent(1, 0xA, 0xF, "planner")), JSON
            ).status
            == 200
        )
        # Trace 2: the same, but the agent span comes after the hold: judged without it.
        for n in range(4):
            request(port, "POST", "/v1/traces", _json_request(_tool(2, 0x200 + n, 0xB, n)), JSON)
        assert service.wait_idle(5)
        clock.advance(hold)
        reg = registry(service)
        assert wait_for(
            lambda: sample(reg, "loopguard_tool_calls_total", agent="planner", tool="search") == 4,
            5,
        )
        assert wait_for(
            lambda: sample(reg, "loopguard_tool_calls_total", agent="none", tool="search") == 4, 5
        )
        assert sample(reg, "loopguard_trace_agents_lost_total") == 0  # trace 1 kept its agent
        request(port, "POST", "/v1/traces", _json_request(_agent(2, 0xB, 0xF, "late")), JSON)
        assert service.wait_idle(5)
        assert sample(reg, "loopguard_tool_calls_total", agent="late", tool="search") == 0
        assert sample(reg, "loopguard_trace_agents_lost_total") == 1  # trace 2's run lost it
        trips = trip_lines(tmp_path / "serve.trips.jsonl")
        by_agent = {(line["agent"], line["action"]) for line in trips}
        assert ("planner", "deny") in by_agent and (None, "deny") in by_agent
        assert wait_for(
            lambda: sample(reg, "loopguard_trace_flushes_early_total", reason="time") == 2, 5
        )
    finally:
        service.close(timeout=10)


# -- bad input ---------------------------------------------------------------------------------


def _proto_request(spans: int, *, tool_every: int = 0, trace: int = 7, bad_ids: int = 0) -> bytes:
    request_ = ExportTraceServiceRequest()
    scope = request_.resource_spans.add().scope_spans.add()
    root = scope.spans.add()
    root.trace_id = trace.to_bytes(16, "big")
    root.span_id = (1).to_bytes(8, "big")
    root.name = "invoke_agent bulk"
    attribute = root.attributes.add()
    attribute.key, attribute.value.string_value = "gen_ai.operation.name", "invoke_agent"
    for n in range(2, spans + 1):
        span = scope.spans.add()
        span.trace_id = trace.to_bytes(16, "big")
        span.span_id = n.to_bytes(8, "big")
        span.parent_span_id = (1).to_bytes(8, "big")
        span.start_time_unix_nano = 1_000 + n
        span.end_time_unix_nano = 1_001 + n
        if tool_every and n % tool_every == 0:
            span.name = "execute_tool read"
            for key, value in (
                ("gen_ai.operation.name", "execute_tool"),
                ("gen_ai.tool.name", "read"),
                ("gen_ai.tool.call.arguments", json.dumps({"n": n})),
            ):
                attribute = span.attributes.add()
                attribute.key, attribute.value.string_value = key, value
        else:
            span.name = "chat model"
    for n in range(bad_ids):
        span = scope.spans.add()
        span.trace_id = b"\x01\x02\x03"
        span.span_id = (1000 + n).to_bytes(8, "big")
    return bytes(request_.SerializeToString())


def _status(answer: Any) -> Any:
    status = status_pb2.Status()
    status.ParseFromString(answer.body)
    return status


def _still_serving(service: Service) -> None:
    port = service.http_port
    assert request(port, "GET", "/healthz").json() == {"status": "ok"}
    before = service.processed_spans
    good = request(port, "POST", "/v1/traces", _proto_request(3, trace=99), PROTOBUF)
    assert good.status == 200
    assert wait_for(lambda: service.processed_spans == before + 3, 5)


def _gzip_bomb(inflated: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    parts = [packer.compress(chunk) for _ in range(inflated >> 20)]
    return b"".join(parts) + packer.flush()


@pytest.mark.slow
def test_bad_input_gets_the_right_status_and_the_server_keeps_serving(service: Service) -> None:
    port = service.http_port
    good = _proto_request(20)
    cases: list[tuple[str, bytes, dict[str, str], int]] = [
        ("truncated protobuf", good[: len(good) // 2], PROTOBUF, 400),
        ("invalid JSON", b'{"resourceSpans": [', JSON, 400),
        ("JSON that is not an object", b"[1, 2]", JSON, 400),
        ("wrong content type", good, {"Content-Type": "text/plain"}, 415),
        ("no content type", good, {}, 415),
        ("gzip bomb", _gzip_bomb(64 << 20), {**PROTOBUF, "Content-Encoding": "gzip"}, 413),
        ("broken gzip", b"\x1f\x8b\x08\x00garbage", {**PROTOBUF, "Content-Encoding": "gzip"}, 400),
        ("unknown encoding", good, {**PROTOBUF, "Content-Encoding": "br"}, 415),
        ("30 MiB body", bytes(30 << 20), PROTOBUF, 413),
        ("only spans with wrong ids", _only_bad_ids(), PROTOBUF, 400),
    ]
    for label, body, headers, status in cases:
        answer = request(port, "POST", "/v1/traces", body, headers)
        assert answer.status == status, label
        if headers.get("Content-Type") == "application/x-protobuf":
            assert answer.headers["content-type"] == "application/x-protobuf", label
            assert _status(answer).message, label
        else:
            assert "message" in answer.json(), label
        _still_serving(service)
    assert service.processed_spans == 3 * len(cases)  # only the good requests' spans
    reg = registry(service)
    assert sample(reg, "loopguard_otlp_spans_total", result="accepted") == 3 * len(cases)
    assert sample(reg, "loopguard_otlp_requests_total", transport="http", outcome="too_large") == 2
    assert service.guard.internal_errors == {}


def _only_bad_ids() -> bytes:
    request_ = ExportTraceServiceRequest()
    scope = request_.resource_spans.add().scope_spans.add()
    for n in range(2):
        span = scope.spans.add()
        span.trace_id = b"\x01" * 15
        span.span_id = (n + 1).to_bytes(8, "big")
    return bytes(request_.SerializeToString())


def test_ids_of_the_wrong_length_are_rejected_span_by_span(service: Service) -> None:
    answer = request(
        service.http_port, "POST", "/v1/traces", _proto_request(5, bad_ids=2), PROTOBUF
    )
    assert answer.status == 200
    response = ExportTraceServiceResponse()
    response.ParseFromString(answer.body)
    assert response.partial_success.rejected_spans == 2
    assert "'trace_id' must be 16 bytes, got 3" in response.partial_success.error_message
    assert service.wait_idle(5) and service.processed_spans == 5
    spans = [
        _tool(5, 2, 1, 0),
        {**_tool(5, 3, 1, 1), "spanId": "abc"},
        {**_tool(5, 4, 1, 2), "traceId": "ab" * 17},
    ]
    answer = request(service.http_port, "POST", "/v1/traces", _json_request(*spans), JSON)
    assert answer.status == 200
    partial = answer.json()["partialSuccess"]
    assert (
        partial["rejectedSpans"] == "2" and "'spanId' must be 8 bytes" in (partial["errorMessage"])
    )
    reg = registry(service)
    assert sample(reg, "loopguard_otlp_spans_total", result="rejected") == 4
    assert sample(reg, "loopguard_otlp_requests_total", transport="http", outcome="partial") == 2


def test_ten_thousand_spans_in_one_request_all_count(service: Service) -> None:
    body = _proto_request(10_000, tool_every=10)
    answer = request(service.http_port, "POST", "/v1/traces", body, PROTOBUF)
    assert answer.status == 200 and answer.body == b""
    assert service.wait_idle(30)
    assert service.processed_spans == 10_000
    reg = registry(service)
    assert sample(reg, "loopguard_tool_calls_total", agent="bulk", tool="read") == 1_000
    assert sample(reg, "loopguard_otlp_spans_total", result="accepted") == 10_000
    gz = request(
        service.http_port,
        "POST",
        "/v1/traces",
        gzip.compress(_proto_request(10_000, tool_every=10, trace=8)),
        {**PROTOBUF, "Content-Encoding": "gzip"},
    )
    assert gz.status == 200 and service.wait_idle(30)
    assert service.processed_spans == 20_000


def test_grpc_bad_input_and_limits(tmp_path: Path) -> None:
    service = start(tmp_path, max_body_bytes=1 << 20)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            export = channel.unary_unary(EXPORT)
            with pytest.raises(grpc.RpcError) as bad:
                export(_proto_request(20)[:-7], timeout=10)
            assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as big:
                export(bytes(2 << 20), timeout=10)
            assert big.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            answer = export(_proto_request(5, bad_ids=1), timeout=10)
            response = ExportTraceServiceResponse()
            response.ParseFromString(answer)
            assert response.partial_success.rejected_spans == 1
            assert export(_proto_request(4, trace=3), timeout=10) == b""
        assert service.wait_idle(5) and service.processed_spans == 9
    finally:
        service.close(timeout=10)


# -- auth --------------------------------------------------------------------------------------

TOKEN = "s3cret-token"


def test_a_token_guards_every_endpoint_but_healthz(tmp_path: Path) -> None:
    service = start(tmp_path, token=TOKEN)
    port = service.http_port
    endpoints = [
        ("POST", "/v1/traces", _proto_request(3), PROTOBUF),
        (
            "POST",
            "/v1/decisions/before",
            json.dumps({"tool": "t", "session": "s", "arguments": {}}).encode(),
            JSON,
        ),
        (
            "POST",
            "/v1/decisions/after",
            json.dumps({"tool": "t", "session": "s", "arguments": {}}).encode(),
            JSON,
        ),
        ("POST", "/v1/decisions/user_message", json.dumps({"session": "s"}).encode(), JSON),
        ("POST", "/v1/decisions/new_run", json.dumps({"session": "s"}).encode(), JSON),
        ("GET", "/metrics", None, {}),
    ]
    try:
        for method, path, body, headers in endpoints:
            for wrong in (
                {},
                {"Authorization": "Bearer nope"},
                {"Authorization": TOKEN},
                {"Authorization": f"Basic {TOKEN}"},
            ):
                answer = request(port, method, path, body, {**headers, **wrong})
                assert answer.status == 401, (path, wrong)
                assert answer.headers["www-authenticate"].startswith("Bearer")
            right = request(
                port, method, path, body, {**headers, "Authorization": f"Bearer {TOKEN}"}
            )
            assert right.status == 200, path
        assert request(port, "GET", "/healthz").status == 200
        with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            export = channel.unary_unary(EXPORT)
            for metadata in ((), (("authorization", "Bearer nope"),)):
                with pytest.raises(grpc.RpcError) as denied:
                    export(_proto_request(2), metadata=metadata, timeout=10)
                assert denied.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert (
                export(
                    _proto_request(2), timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),)
                )
                == b""
            )
        exporter = GrpcExporter(
            endpoint=f"127.0.0.1:{service.grpc_port}",
            insecure=True,
            headers={"authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        run_agent(provider.get_tracer("a"), looping("coder", 3))
        provider.shutdown()
        assert service.wait_idle(5) and service.processed_spans == 3 + 2 + 7
    finally:
        service.close(timeout=10)


def test_non_loopback_needs_a_token_or_insecure() -> None:
    with pytest.raises(ValueError, match="host: '0.0.0.0' is not a loopback address"):
        ServeOptions(host="0.0.0.0")
    assert ServeOptions(host="0.0.0.0", token=TOKEN).token == TOKEN
    assert ServeOptions(host="0.0.0.0", insecure=True).insecure
    assert ServeOptions(host="::1").host == "::1"
    with pytest.raises(ValueError, match="http_port"):
        ServeOptions(http_port=70_000)
    with pytest.raises(ValueError, match="token"):
        ServeOptions(token="has space")


# -- the decision API --------------------------------------------------------------------------


def _call(port: int, endpoint: str, **fields: Any) -> Any:
    answer = request(port, "POST", f"/v1/decisions/{endpoint}", json.dumps(fields).encode(), JSON)
    assert answer.status == 200, answer.body
    return answer.json()


def test_decision_api_is_the_hook_api(service: Service) -> None:
    port = service.http_port
    reference = LoopGuard(DEFAULT)
    arguments = {"pattern": "TODO", "path": "src"}
    for n in range(1, 7):
        got = _call(
            port,
            "before",
            tool="grep",
            arguments=arguments,
            session="conv",
            agent="coder",
            call_id=f"c{n}",
        )["decision"]
        want = reference.before_tool(
            "grep", arguments, session="conv", agent="coder", call_id=f"c{n}"
        )
        assert (
            got["action"],
            got["rule"],
            got["count"],
            got["message"],
            got["blocks"],
            got["hash_prefix"],
        ) == (
            want.action.value,
            want.rule.value if want.rule else None,
            want.count,
            want.message,
            want.blocks,
            want.hash_prefix,
        )
        assert bool(got["hash_prefix"]) == got["blocks"]  # on blocking decisions only
        if not want.blocks:
            after = _call(
                port,
                "after",
                tool="grep",
                arguments=arguments,
                session="conv",
                agent="coder",
                call_id=f"c{n}",
                result="3 matches",
                error=False,
                duration_seconds=0.5,
            )
            assert after == {"decision": None}  # counted by before: only the outcome added
            reference.after_tool(
                "grep",
                arguments,
                session="conv",
                agent="coder",
                call_id=f"c{n}",
                result="3 matches",
                duration_seconds=0.5,
            )
    assert got["action"] == "stop" or got["blocks"]
    assert _call(port, "user_message", session="conv", agent="coder") == {}
    fresh = _call(port, "before", tool="grep", arguments=arguments, session="conv", agent="coder")[
        "decision"
    ]
    assert fresh["action"] in ("allow", "remind") and not fresh["blocks"]
    alone = _call(port, "after", tool="ls", arguments={}, session="other", result="x")
    assert alone["decision"]["action"] == "allow"
    assert _call(port, "new_run", session="conv") == {}


def test_decision_api_refuses_bad_requests(service: Service) -> None:
    port = service.http_port
    for body, fragment in [
        (b"not json", "not valid JSON"),
        (b"[]", "expected a JSON object"),
        (json.dumps({"tool": "t"}).encode(), "missing field 'session'"),
        (json.dumps({"session": "s"}).encode(), "missing field 'tool'"),
        (json.dumps({"session": "s", "tool": 3}).encode(), "'tool' must be"),
    ]:
        answer = request(port, "POST", "/v1/decisions/before", body, JSON)
        assert answer.status == 400 and fragment in answer.json()["error"]
    bad_error = json.dumps({"session": "s", "tool": "t", "error": "yes"}).encode()
    assert request(port, "POST", "/v1/decisions/after", bad_error, JSON).status == 400
    assert request(port, "POST", "/v1/decisions/sideways", b"{}", JSON).status == 404
    assert request(port, "GET", "/nowhere").status == 404
    assert request(port, "PUT", "/v1/traces", b"").status == 405
    too_big = json.dumps({"session": "s", "tool": "t", "arguments": "x" * (2 << 20)}).encode()
    assert request(port, "POST", "/v1/decisions/before", too_big, JSON).status == 413
    with keep_alive(port) as conn:  # many answers on one connection
        for _ in range(20):
            conn.request(
                "POST",
                "/v1/decisions/before",
                json.dumps({"tool": "t", "session": "ka"}).encode(),
                JSON,
            )
            response = conn.getresponse()
            assert response.status == 200 and json.loads(response.read())["decision"]
    assert service.guard.internal_errors == {}


def test_decision_api_holds_reminders_for_command_hooks(service: Service) -> None:
    """What ``otel-loopguard hook HOST --server`` needs: a reminder decided before a call is
    held (``"hold_reminder": true``) and given with that call's ``/after``, once; a call reported
    only after it ran gets the text a hook shows for it (a denial worded as a reminder)."""
    from otel_loopguard.hooks._answers import after_the_fact
    from otel_loopguard.service._decisions import HeldReminders

    port = service.http_port
    remind_at = DEFAULT.remind_thresholds[0]
    grep = {"pattern": "TODO"}
    for session, hold, ids in (
        ("held", True, True),
        ("held-by-arguments", True, False),
        ("not-held", False, True),
    ):
        for n in range(1, remind_at + 1):
            ref = {"call_id": f"c{n}"} if ids else {}
            before = _call(
                port,
                "before",
                tool="grep",
                arguments=grep,
                session=session,
                agent="a",
                hold_reminder=hold,
                **ref,
            )["decision"]
            after = _call(
                port,
                "after",
                tool="grep",
                arguments=grep,
                session=session,
                agent="a",
                result="3 matches",
                **ref,
            )
            assert before["action"] == ("remind" if n == remind_at else "allow")
            if n == remind_at and hold:
                assert after == {"decision": None, "reminder": before["message"]}
            else:
                assert after == {"decision": None}
        if ids:  # taken once: the same call's result again carries nothing
            assert _call(
                port,
                "after",
                tool="grep",
                arguments=grep,
                session=session,
                agent="a",
                call_id=f"c{remind_at}",
                result="3 matches",
            ) == {"decision": None}
    # Held under the session and agent it was decided for.
    for n in range(1, remind_at + 1):
        held = _call(
            port,
            "before",
            tool="ls",
            arguments={},
            session="agents",
            agent="a",
            call_id=f"x{n}",
            hold_reminder=True,
        )["decision"]
    assert held["action"] == "remind"
    other = _call(
        port,
        "after",
        tool="ls",
        arguments={"other": 1},
        session="agents",
        agent="b",
        call_id=f"x{remind_at}",
        result="r",
    )
    assert "reminder" not in other
    assert (
        _call(
            port,
            "after",
            tool="ls",
            arguments={},
            session="agents",
            agent="a",
            call_id=f"x{remind_at}",
            result="r",
        )["reminder"]
        == held["message"]
    )
    # Reported only after they ran: the hook runner's words, with the server's policy.
    reference = LoopGuard(DEFAULT)
    shown = []
    for n in range(1, 9):
        got = _call(
            port,
            "after",
            tool="grep",
            arguments=grep,
            session="late",
            result="same",
            call_id=f"late{n}",
        )
        want = reference.after_tool("grep", grep, session="late", result="same", call_id=f"late{n}")
        assert want is not None and got["decision"]["action"] == want.action.value
        expected = after_the_fact(want, grep, DEFAULT)
        assert got.get("reminder") == (
            expected.message if expected.action.value == "remind" else None
        )
        shown.append((got["decision"]["action"], got.get("reminder") or ""))
    actions = [action for action, _ in shown]
    assert {"remind", "deny", "stop"} <= set(actions), actions
    denied = [text for action, text in shown if action == "deny"]
    assert all(t.startswith("[loopguard] Repeated call") and "Not run" not in t for t in denied)
    assert all(text == "" for action, text in shown if action == "stop")
    bad = json.dumps({"session": "s", "tool": "t", "hold_reminder": "yes"}).encode()
    answer = request(port, "POST", "/v1/decisions/before", bad, JSON)
    assert (
        answer.status == 400 and "'hold_reminder' must be true or false" in answer.json()["error"]
    )
    # Bounded: the oldest is dropped (a result that never came); holding again renews.
    reminders = HeldReminders(2)
    for key in ("a", "b", "a", "c"):
        reminders.hold(("s", None, key), key)
    assert [reminders.take(("s", None, key)) for key in ("a", "b", "c")] == ["a", None, "c"]
    assert service.guard.internal_errors == {}


def test_metrics_and_health(service: Service) -> None:
    _call(service.http_port, "before", tool="grep", arguments={}, session="s", agent="a")
    text = request(service.http_port, "GET", "/metrics").body.decode()
    assert 'loopguard_tool_calls_total{agent="a",tool="grep"} 1.0' in text
    assert "loopguard_otlp_spans_total" in text and "loopguard_ingest_queue_spans" in text
    assert 'loopguard_decision_requests_total{endpoint="before"} 1.0' in text
    assert request(service.http_port, "GET", "/healthz").json() == {"status": "ok"}


@pytest.mark.slow
def test_idle_sessions_are_dropped_on_a_quiet_server(tmp_path: Path) -> None:
    clock = FakeClock()
    policy = DEFAULT.replace(session_ttl_seconds=60)
    guard = LoopGuard(policy, recorder=PrometheusRecorder(), clock=clock)
    options = ServeOptions(http_port=0, grpc_port=None)
    with Service(options, guard=guard) as service:
        for session in ("a", "b"):
            _call(service.http_port, "before", tool="grep", arguments={}, session=session)
        clock.advance(60)  # no call comes: only the server's own timer can drop them
        # The store itself: a scrape would drop them too (the sessions gauge expires first).
        assert wait_for(lambda: len(guard._store) == 0, 5)
        assert sample(registry(service), "loopguard_sessions_evicted_total", reason="ttl") == 2


# -- back-pressure and shutdown ----------------------------------------------------------------


def _stall_ingest(service: Service) -> Any:
    """Make the ingest thread wait on the returned event before each batch."""
    import threading

    gate = threading.Event()
    ingest = service._ingest
    assert ingest is not None
    original = ingest._add

    def slow(batch: Any) -> None:
        gate.wait(20)
        original(batch)

    ingest._add = slow  # type: ignore[method-assign]
    return gate


def test_a_full_queue_answers_429_and_resource_exhausted_with_a_retry_hint(tmp_path: Path) -> None:
    service = start(tmp_path, max_queued_spans=10)
    try:
        gate = _stall_ingest(service)
        port = service.http_port
        assert request(port, "POST", "/v1/traces", _proto_request(4), PROTOBUF).status == 200
        assert wait_for(lambda: service.queued_spans <= 4, 5)
        assert (
            request(port, "POST", "/v1/traces", _proto_request(4, trace=2), PROTOBUF).status == 200
        )
        full = request(port, "POST", "/v1/traces", _proto_request(4, trace=3), PROTOBUF)
        assert full.status == 429 and full.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
        assert _status(full).code == 8
        with (
            grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel,
            pytest.raises(grpc.RpcError) as throttled,
        ):
            channel.unary_unary(EXPORT)(_proto_request(4, trace=4), timeout=10)
        assert throttled.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        trailing = dict(throttled.value.trailing_metadata())
        assert "google.rpc.retryinfo-bin" in trailing and "grpc-status-details-bin" in trailing
        gate.set()
        assert service.wait_idle(10) and service.processed_spans == 8
        reg = registry(service)
        assert sample(reg, "loopguard_otlp_spans_total", result="throttled") == 8
        assert sample(reg, "loopguard_otlp_spans_total", result="accepted") == 8
    finally:
        service.close(timeout=10)


def test_shutdown_drains_what_was_accepted(tmp_path: Path) -> None:
    service = start(tmp_path)  # hold 60 s: nothing is judged before its root or the shutdown
    gate = _stall_ingest(service)
    port = service.http_port
    for n in range(5):  # tool spans whose trace root never comes
        answer = request(port, "POST", "/v1/traces", _json_request(_tool(40 + n, 2, 1, 0)), JSON)
        assert answer.status == 200
    reg = registry(service)
    assert sample(reg, "loopguard_tool_calls_total", agent="none", tool="search") == 0
    gate.set()
    assert service.close(timeout=10)
    assert service.processed_spans == 5
    assert sample(reg, "loopguard_tool_calls_total", agent="none", tool="search") == 5
    with pytest.raises(OSError):
        request(port, "GET", "/healthz", timeout=2)


def test_a_taken_port_is_an_error_naming_it_and_leaves_nothing_running(tmp_path: Path) -> None:
    first = start(tmp_path, "first")
    try:
        taken = rf"cannot listen on 127\.0\.0\.1:{first.http_port} \(OTLP/HTTP\): .*--http-port"
        with pytest.raises(OSError, match=taken):
            start(tmp_path, "second", http_port=first.http_port)
        # grpcio says RuntimeError; serve says OSError naming the port all the same.
        taken = rf"cannot listen on 127\.0\.0\.1:{first.grpc_port} \(OTLP/gRPC\): .*--grpc-port"
        with pytest.raises(OSError, match=taken):
            start(tmp_path, "third", grpc_port=first.grpc_port)
    finally:
        first.close(timeout=10)


# -- the command line --------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_serve_reads_the_toml_policy_and_stops_on_sigterm(tmp_path: Path) -> None:
    import queue
    import signal
    import subprocess
    import sys
    import threading

    config = tmp_path / "loopguard.toml"
    trips = tmp_path / "trips.jsonl"
    config.write_text(f'[loopguard]\nmode = "observe"\ntrip_log_path = "{trips}"\n')
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "otel_loopguard",
            "serve",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--config",
            str(config),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stderr is not None
    stderr = process.stderr

    def pump() -> None:
        for line in stderr:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        first = lines.get(timeout=30)
        assert "mode observe" in first, first
        port = int(first.split("http://127.0.0.1:", 1)[1].split(";", 1)[0])
        decisions = [
            _call(port, "before", tool="grep", arguments={"q": 1}, session="s", call_id=f"c{n}")[
                "decision"
            ]
            for n in range(7)
        ]
        assert {d["action"] for d in decisions} == {"allow"}  # observe: never blocks
        assert "deny" in {d["detected"] for d in decisions}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        rest = []
        while not lines.empty():
            rest.append(lines.get())
        assert any("stopped" in line for line in rest), rest
        assert {line["mode"] for line in trip_lines(trips)} == {"observe"}
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@pytest.mark.slow
def test_cli_serve_refuses_an_open_address_without_a_token(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_loopguard",
            "serve",
            "--host",
            "0.0.0.0",
            "--http-port",
            "0",
            "--no-grpc",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in __import__("os").environ.items() if k != "LOOPGUARD_SERVE_TOKEN"},
    )
    assert done.returncode == 2
    assert "not a loopback address" in done.stderr and "--insecure" in done.stderr


def test_import_otel_loopguard_stays_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, otel_loopguard, otel_loopguard.cli, otel_loopguard.replay; "
        "print(sorted(m for m in sys.modules if m.startswith(('grpc', 'google.protobuf', "
        "'opentelemetry.proto', 'otel_loopguard.service'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_connections_beyond_the_bound_are_closed_and_the_server_recovers(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket
    import time

    http_server = service._http
    assert http_server is not None
    monkeypatch.setattr(http_server.protocol, "max_connections", 2)
    monkeypatch.setattr(http_server.protocol, "reserve", 0)  # no slot kept for decisions
    idle = [socket.create_connection(("127.0.0.1", service.http_port), timeout=5) for _ in range(2)]

    try:
        time.sleep(0.2)  # the two idle connections hold both slots
        with pytest.raises(OSError):  # closed at once, no answer
            request(service.http_port, "GET", "/healthz", timeout=5)
    finally:
        for sock in idle:
            sock.close()

    def healthy() -> bool:
        try:
            return request(service.http_port, "GET", "/healthz", timeout=5).status == 200
        except OSError:
            return False

    assert wait_for(healthy, 5)


def test_the_last_slots_serve_decisions_and_health_and_replace_waiting_connections(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    http_server = service._http
    assert http_server is not None
    port = service.http_port
    monkeypatch.setattr(http_server.protocol, "max_connections", 3)
    monkeypatch.setattr(http_server.protocol, "reserve", 1)
    general = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
    waiting = socket.create_connection(("127.0.0.1", port), timeout=5)  # the reserved slot
    try:
        assert wait_for(lambda: len(http_server.protocol.reserved) == 1, 5)
        # every slot is taken: a decision replaces the reserved connection still waiting
        body = b'{"tool": "grep", "session": "s"}'
        answer = request(port, "POST", "/v1/decisions/before", body, JSON)
        assert answer.status == 200, answer.body
        assert waiting.recv(1) == b""  # closed for it
        assert request(port, "GET", "/healthz").status == 200
        # anything else gets 503 in the reserved slot
        answer = request(port, "GET", "/metrics")
        assert answer.status == 503 and answer.headers["retry-after"] == "1"
        assert answer.headers["connection"] == "close"
        post = request(port, "POST", "/v1/traces", b"{}", JSON)
        assert post.status == 503
    finally:
        for sock in [*general, waiting]:
            sock.close()
    assert wait_for(lambda: request(port, "GET", "/metrics").status == 200, 5)


def test_keyed_by_conversation_serve_decides_as_the_processor(tmp_path: Path) -> None:
    """Each call in its own trace, one conversation: keyed by conversation, serve shares one
    chain across traces exactly as an in-process processor keyed by conversation does."""
    in_process = LoopGuard(DEFAULT.replace(trip_log_path=str(tmp_path / "local.jsonl")))
    service = start(tmp_path, key_by="conversation")
    try:
        provider = TracerProvider()
        provider.add_span_processor(
            LoopGuardSpanProcessor(in_process, key_by="conversation", tracer_provider=provider)
        )
        provider.add_span_processor(SimpleSpanProcessor(_exporter("http", service)))
        tracer = provider.get_tracer("agent")
        for n in range(8):  # no agent span: each tool call is its own trace
            with tracer.start_as_current_span(
                "execute_tool search",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search",
                    "gen_ai.conversation.id": "conv-42",
                },
            ) as span:
                span.set_attribute("gen_ai.tool.call.arguments", '{"q": "weather"}')
                span.set_attribute("gen_ai.tool.call.id", f"c{n}")
                span.set_attribute("gen_ai.tool.call.result", "nothing")
        provider.shutdown()
        assert wait_for(lambda: service.processed_spans >= 8)
        assert service.wait_idle(10)
        local = trip_lines(tmp_path / "local.jsonl")
        served = trip_lines(tmp_path / "serve.trips.jsonl")
        assert {line["action"] for line in local} >= {"remind", "deny"}
        assert {line["session"] for line in served} == {"conv-42"}
        assert served == local
    finally:
        assert service.close(timeout=10)


def test_bad_key_by_is_refused_by_serve() -> None:
    with pytest.raises(ValueError, match="key_by"):
        ServeOptions(key_by="tenant")


# -- a user's first hour: user messages, first answers, logs, defaults -------------------------


def _stop_over_api(port: int, session: str, agent: str | None) -> None:
    """Repeat one call through the decision API until the guard stops the run."""
    ids: dict[str, Any] = {"session": session} | ({"agent": agent} if agent else {})
    for n in range(30):
        got = _call(port, "before", tool="grep", arguments={"q": 1}, call_id=f"{agent}{n}", **ids)
        if got["decision"]["action"] == "stop":
            return
        if not got["decision"]["blocks"]:
            _call(port, "after", tool="grep", arguments={"q": 1}, call_id=f"{agent}{n}", **ids)
    raise AssertionError("never stopped")


def test_decision_api_user_message_to_a_session_lifts_every_agents_stop(service: Service) -> None:
    port = service.http_port
    for agent in ("coder", "reviewer"):
        _stop_over_api(port, "conv", agent)

    def action(agent: str) -> str:
        answer = _call(port, "before", tool="grep", arguments={"q": 1}, session="conv", agent=agent)
        return str(answer["decision"]["action"])

    assert _call(port, "user_message", session="conv", agent="coder") == {}
    assert (action("coder"), action("reviewer")) == ("allow", "stop")  # named: that agent only
    _stop_over_api(port, "conv", "coder")
    assert _call(port, "user_message", session="conv") == {}  # no agent: every agent
    assert (action("coder"), action("reviewer")) == ("allow", "allow")


def test_the_first_decision_answer_names_the_call_like_the_later_ones(service: Service) -> None:
    port = service.http_port
    answers = [
        _call(port, "before", tool="grep", arguments={"q": 1}, session="s", call_id=f"c{n}")[
            "decision"
        ]
        for n in range(2)
    ]
    first, second = answers
    assert first["repeated"] is False and second["repeated"] is True
    for answer in answers:
        assert (answer["tool"], answer["session"]) == ("grep", "s")
    assert first["signature"] == second["signature"] and len(first["signature"]) == 12
    # An untracked first call is named too.
    untracked = LoopGuard(DEFAULT.replace(exclude=("ls",)), recorder=PrometheusRecorder())
    with Service(ServeOptions(http_port=0, grpc_port=None), guard=untracked) as other:
        answer = _call(other.http_port, "before", tool="ls", arguments={}, session="t")
        assert (answer["decision"]["tool"], answer["decision"]["session"]) == ("ls", "t")


def test_one_log_line_per_decision_at_info_allows_at_debug(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    port = service.http_port
    with caplog.at_level(logging.INFO, logger="otel_loopguard"):
        decisions = [
            _call(port, "before", tool="grep", arguments={"q": 1}, session="s", agent="coder")[
                "decision"
            ]
            for _ in range(5)
        ]
    lines = [r for r in caplog.records if r.name == "otel_loopguard.serve"]
    detected = [d for d in decisions if d["detected"] != "allow"]
    assert detected and len(lines) == len(detected)  # plain allows are not logged at info
    for record, decision in zip(lines, detected, strict=True):
        assert record.levelno == logging.INFO
        fields = record.loopguard  # type: ignore[attr-defined]
        assert fields["source"] == "api" and fields["agent"] == "coder"
        assert {k: fields[k] for k in ("session", "tool", "action", "rule", "count")} == {
            k: decision[k] for k in ("session", "tool", "action", "rule", "count")
        }
        message = record.getMessage()
        assert message.startswith(f"api decision: {decision['action']} ")
        assert "session=s agent=coder tool=grep" in message and "arguments" not in message
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="otel_loopguard"):
        _call(port, "before", tool="read", arguments={"p": 1}, session="s")
    allows = [r for r in caplog.records if r.name == "otel_loopguard.serve"]
    assert [(r.levelno, r.loopguard["action"]) for r in allows] == [  # type: ignore[attr-defined]
        (logging.DEBUG, "allow")
    ]


def test_spans_decisions_are_logged_too(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    service = start(tmp_path)
    try:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter("http", service)))
        with caplog.at_level(logging.INFO, logger="otel_loopguard"):
            run_agent(provider.get_tracer("agent"), looping("coder"))
            assert service.wait_idle(10)
        provider.shutdown()
    finally:
        service.close(timeout=10)
    fields = [
        r.loopguard  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "otel_loopguard.serve"
    ]
    assert fields and {f["source"] for f in fields} == {"span"}
    assert {(f["agent"], f["tool"]) for f in fields} == {("coder", "grep")}
    assert {"remind", "deny"} <= {f["detected"] for f in fields}


def test_json_log_lines_are_one_object_each_with_the_decisions_fields() -> None:
    import logging

    from otel_loopguard.service._logs import JsonFormatter

    record = logging.LogRecord(
        "otel_loopguard.serve", logging.INFO, __file__, 1, "m %s", ("x",), None
    )
    record.loopguard = {"action": "deny", "count": 4, "message": "not this one"}
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "info" and entry["logger"] == "otel_loopguard.serve"
    assert entry["message"] == "m x" and entry["action"] == "deny" and entry["count"] == 4
    assert entry["time"].endswith("Z") and "T" in entry["time"]


def test_the_text_log_escapes_control_characters_in_every_field(service: Service) -> None:
    import io
    import logging

    from otel_loopguard.service._logs import install, uninstall

    forged = "s\n2026-01-01 00:00:00,000 INFO otel_loopguard.serve: api decision: allow"
    hostile = {
        "session": forged + " session=FORGED\r\x1b[2K\x00",
        "tool": "grep\u2028tool=FORGED\x85\x7f",
    }
    stream = io.StringIO()
    handler = install("info", "text", stream)
    try:
        for n in range(4):
            _call(service.http_port, "before", arguments={"q": 1}, call_id=f"c{n}", **hostile)
        logging.getLogger("otel_loopguard.serve").error(
            "boom %s", "a\nb", exc_info=ValueError("x\ny")
        )
    finally:
        uninstall(handler)
    text = stream.getvalue()
    lines = text.split("\n")[:-1]
    decided = [line for line in lines if "api decision:" in line]
    assert decided, text  # the fourth grep is reminded at least
    quoted = r'"((?:[^"\\]|\\.)*)"'
    for line in decided:
        assert not any(c in line for c in "\r\x1b\x00\x85\x7f\u2028"), repr(line)
        match = re.match(
            rf"^\d{{4}}-\S+ \S+ INFO otel_loopguard.serve: api decision: \w+ "
            rf"session={quoted} tool={quoted} rule=",
            line,
        )
        assert match, line
        # the values are whole, quoted, and read back to what the client sent once the text
        # formatter's escapes of the characters JSON leaves raw are undone
        session, tool = (
            json.loads(
                f'"{g}"'.replace("\\u2028", "\u2028")
                .replace("\\x85", "\x85")
                .replace("\\x7f", "\x7f")
            )
            for g in match.groups()
        )
        assert (session, tool) == (hostile["session"], hostile["tool"])
    # every line starts with a time; a traceback's further lines are indented
    record_lines = [line for line in lines if not line.startswith("    ")]
    assert all(line[:4].isdigit() for line in record_lines), record_lines
    assert "boom a\\nb" in text and "\n    ValueError: x\n    y\n" in text


@pytest.mark.slow
def test_cli_serve_logs_json_lines_and_names_a_taken_port(tmp_path: Path) -> None:
    import queue
    import signal
    import subprocess
    import sys
    import threading

    command = [sys.executable, "-m", "otel_loopguard", "serve", "--http-port", "0", "--no-grpc"]
    process = subprocess.Popen(
        [*command, "--log-format", "json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stderr is not None
    stderr = process.stderr

    def pump() -> None:
        for line in stderr:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        started = json.loads(lines.get(timeout=30))
        assert started["event"] == "started" and started["level"] == "info"
        assert started["hold_seconds"] == ServeOptions().hold_seconds
        port = int(started["http"].rsplit(":", 1)[1])
        for n in range(5):
            _call(port, "before", tool="grep", arguments={"q": 1}, session="s", call_id=f"c{n}")
        # The same port again: exit 2, one line naming it.
        taken = subprocess.run(
            [*command[:4], "--http-port", str(port), "--no-grpc"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert taken.returncode == 2
        assert f"cannot listen on 127.0.0.1:{port} (OTLP/HTTP)" in taken.stderr
        assert "--http-port" in taken.stderr and "Traceback" not in taken.stderr
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        entries = []
        while not lines.empty():
            entries.append(json.loads(lines.get()))
        decided = [e for e in entries if e.get("source") == "api"]
        assert decided and all(e["detected"] != "allow" for e in decided)
        assert {e["tool"] for e in decided} == {"grep"}
        assert entries[-1]["event"] == "stopped"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def test_cli_serve_defaults_are_the_services() -> None:
    import argparse

    from otel_loopguard.cli import build_parser
    from otel_loopguard.service._logs import LOG_FORMATS, LOG_LEVELS

    args = build_parser().parse_args(["serve"])
    defaults = ServeOptions()
    assert args.hold_seconds == defaults.hold_seconds
    assert (args.http_port, args.grpc_port) == (defaults.http_port, defaults.grpc_port)
    assert (args.max_queued_spans, args.max_body_bytes) == (
        defaults.max_queued_spans,
        defaults.max_body_bytes,
    )
    assert (args.max_inflight_bytes, args.max_connections, args.request_timeout) == (
        defaults.max_inflight_bytes,
        defaults.max_connections,
        defaults.request_timeout_seconds,
    )
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    choices = {a.dest: tuple(a.choices or ()) for a in commands.choices["serve"]._actions}
    assert choices["log_level"] == LOG_LEVELS and choices["log_format"] == LOG_FORMATS


def test_the_default_hold_outlasts_two_of_the_exporters_batch_delays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The OpenTelemetry SDK's BatchSpanProcessor exports every 5 s by default: a run's agent span
    # arrives one or two batches after its first tool spans (benchmarks/serve_hold.py).
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.delenv("OTEL_BSP_SCHEDULE_DELAY", raising=False)
    processor = BatchSpanProcessor(InMemorySpanExporter())
    try:
        delay_seconds = processor._batch_processor._schedule_delay  # the SDK's own default
    finally:
        processor.shutdown()  # type: ignore[no-untyped-call]
    assert ServeOptions().hold_seconds > 2 * delay_seconds
