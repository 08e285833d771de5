"""The reliability suite of ``serve`` (issue 14): slowloris, hostile framing, concurrent big bodies
under a memory ceiling, the in-flight byte budget, TLS with the real exporter, the token rules.

Loopback only; each test is bounded (well under 60 s together). docs/serve.md ("Limits")
quotes these figures next to what the OpenTelemetry Collector promises.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service_tools import request, require_serve_prerequisites, self_signed, wait_for

require_serve_prerequisites()

from otel_loopguard.config import Policy  # noqa: E402
from otel_loopguard.service import ServeOptions, Service  # noqa: E402

TOKEN = "s3cret"
DEADLINE = 1.0
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _options(**changes: object) -> ServeOptions:
    fields: dict[str, object] = {
        "http_port": 0,
        "grpc_port": None,
        "token": TOKEN,
        "request_timeout_seconds": DEADLINE,
        "drain_timeout_seconds": 5.0,
    }
    fields.update(changes)
    return ServeOptions(**fields)  # type: ignore[arg-type]


@pytest.fixture
def service() -> Iterator[Service]:
    with Service(_options(max_connections=2048), policy=Policy()) as svc:
        yield svc


def _proto_body(spans: int = 3) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    message = ExportTraceServiceRequest()
    scope = message.resource_spans.add().scope_spans.add()
    for n in range(spans):
        span = scope.spans.add()
        span.trace_id = os.urandom(16)
        span.span_id = (n + 1).to_bytes(8, "big")
        span.name = "chat"
    return bytes(message.SerializeToString())


# -- slowloris ---------------------------------------------------------------------------------


async def _slow(port: int, mode: str, lifetimes: list[tuple[float, bool]], stop: float) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    if mode == "body":
        writer.write(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
            b"Content-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\n"
        )
    else:
        writer.write(b"POST /v1/traces HTTP/1.1\r\n")
    read = asyncio.ensure_future(reader.read())
    while time.monotonic() < stop and not read.done():
        try:
            writer.write(b"a")  # 4 bytes a second: a per-read timeout would never fire
            await writer.drain()
        except OSError:
            break
        await asyncio.wait([read], timeout=0.25)
    lifetimes.append((time.monotonic() - start, read.done()))
    read.cancel()
    writer.close()


async def _legit(port: int, raw: bytes, results: list[tuple[bytes, float]]) -> None:
    start = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
        writer.write(raw)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 2)  # hook --server's default timeout
        writer.close()
        results.append((line[9:12], time.monotonic() - start))
    except (OSError, asyncio.TimeoutError) as exc:
        results.append((type(exc).__name__.encode(), time.monotonic() - start))


def _raw_post(path: str, body: bytes, content_type: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: bearer {TOKEN}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@pytest.mark.slow
def test_slowloris_and_slow_bodies_do_not_turn_the_guard_off(service: Service) -> None:
    """256 connections dribbling headers and 64 dribbling a body (4 bytes a second) while OTLP
    exports and hook decisions keep coming: every slow connection is closed within the request
    deadline, every legitimate request is answered 200 in well under the hook's 2 s timeout."""
    port = service.http_port
    spans = _raw_post("/v1/traces", _proto_body(), "application/x-protobuf")
    decision = _raw_post(
        "/v1/decisions/before",
        json.dumps({"tool": "grep", "arguments": {"q": 1}, "session": "s"}).encode(),
        "application/json",
    )

    async def run() -> tuple[list[tuple[float, bool]], list[tuple[bytes, float]]]:
        stop = time.monotonic() + 4 * DEADLINE
        lifetimes: list[tuple[float, bool]] = []
        legit: list[tuple[bytes, float]] = []
        attack = [asyncio.ensure_future(_slow(port, "header", lifetimes, stop)) for _ in range(256)]
        attack += [asyncio.ensure_future(_slow(port, "body", lifetimes, stop)) for _ in range(64)]
        await asyncio.sleep(0.3)
        pending = []
        while time.monotonic() < stop:
            pending.append(asyncio.ensure_future(_legit(port, spans, legit)))
            pending.append(asyncio.ensure_future(_legit(port, decision, legit)))
            await asyncio.sleep(0.1)
        await asyncio.wait_for(asyncio.gather(*attack, *pending), 10)
        return lifetimes, legit

    lifetimes, legit = asyncio.run(run())
    assert len(lifetimes) == 320
    assert all(closed for _, closed in lifetimes), "a slow connection outlived 4 deadlines"
    assert max(t for t, _ in lifetimes) < DEADLINE + 1.0
    assert len(legit) >= 40 and all(status == b"200" for status, _ in legit), legit
    assert max(t for _, t in legit) < 1.0
    timeouts = service.metrics.requests.labels("http", "timeout")._value.get()
    assert timeouts >= 320


# -- hostile framing ---------------------------------------------------------------------------


def _raw(port: int, data: bytes, context: ssl.SSLContext | None = None) -> bytes:
    sock = socket.create_connection(("127.0.0.1", port), 2)
    sock.settimeout(2)
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
    out = b""
    try:
        sock.sendall(data)
        while chunk := sock.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError, ssl.SSLError):
        pass
    finally:
        sock.close()
    return out


_HEAD = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"Content-Length: 5\r\nContent-Length: 5\r\n", b"400"),
        (b"Content-Length: 5\r\nContent-Length: 6\r\n", b"400"),
        (b"Content-Length: 5,5\r\n", b"400"),
        (b"Content-Length: 5x\r\n", b"400"),
        (b"Content-Length: +5\r\n", b"400"),
        (b"Content-Length: -5\r\n", b"400"),
        (b"Content-Length : 5\r\n", b"400"),
        (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"400"),
        (b"Transfer-Encoding: xchunked\r\n", b"400"),
        (b"Transfer-Encoding: gzip, chunked\r\n", b"400"),  # chunked, and only that
        (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b"400"),
        (b"Transfer-Encoding: chunked, chunked\r\n", b"400"),
        (b"", b"411"),  # a POST body needs Content-Length (or to be chunked)
    ],
)
def test_hostile_framing_gets_one_answer_and_a_close(
    service: Service, head: bytes, status: bytes
) -> None:
    tail = b"\r\n5\r\nhello\r\n0\r\n\r\n" if b"chunked" in head else b"\r\nhello"
    if not head:  # no length: what follows would be the next request
        tail = b"\r\n"
    out = _raw(service.http_port, _HEAD + b"Content-Type: application/x-protobuf\r\n" + head + tail)
    assert out[9:12] == status, out
    assert out.count(b"HTTP/1.1 ") == 1
    assert b"connection: close" in out.lower()


def _chunks(body: bytes, size: int) -> bytes:
    """``body`` in chunked transfer coding, ``size`` bytes a chunk, and the last chunk."""
    parts = [body[n : n + size] for n in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


_CHUNKED = _HEAD + b"Content-Type: application/x-protobuf\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_chunked_otlp_body_is_read(service: Service) -> None:
    """The OpenTelemetry Node SDK's OTLP/HTTP exporter streams its body chunked."""
    body = _proto_body()
    out = _raw(service.http_port, _CHUNKED + _chunks(body, 7) + _CHUNKED + _chunks(body, 4096))
    assert out.count(b"HTTP/1.1 200") == 2, out  # two on one connection: it stays usable
    assert wait_for(lambda: service.processed_spans == 6)
    assert service.budget.used == 0


def test_a_chunked_decision_body_is_refused(service: Service) -> None:
    body = json.dumps({"session": "s", "tool": "t"}).encode()
    out = _raw(
        service.http_port,
        b"POST /v1/decisions/before HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunks(body, 8),
    )
    assert out.startswith(b"HTTP/1.1 411") and out.count(b"HTTP/1.1 ") == 1, out
    assert b"connection: close" in out.lower()


def test_an_oversized_chunked_body_is_413_while_it_is_read() -> None:
    limit = 64 * 1024
    with Service(_options(max_body_bytes=limit), policy=Policy()) as svc:
        sock = socket.create_connection(("127.0.0.1", svc.http_port), 5)
        sock.settimeout(5)
        try:
            sock.sendall(_CHUNKED)
            # Past the cap in chunks, and the body never ends: the answer cannot wait for it.
            sent = 0
            while sent <= limit:
                sock.sendall(b"%x\r\n%s\r\n" % (4096, b"\0" * 4096))
                sent += 4096
            out = b""
            while chunk := sock.recv(65536):
                out += chunk
        except ConnectionResetError:
            out = b""
        finally:
            sock.close()
        assert out.startswith(b"HTTP/1.1 413"), out
        assert b"connection: close" in out.lower()
        assert wait_for(lambda: svc.budget.used == 0, 2)
        too_large = svc.metrics.requests.labels("http", "too_large")._value.get()
        assert too_large == 1


def test_a_chunked_body_dribbled_slowly_meets_the_deadline() -> None:
    with Service(_options(), policy=Policy()) as svc:
        sock = socket.create_connection(("127.0.0.1", svc.http_port), 5)
        sock.settimeout(DEADLINE + 5)
        start = time.monotonic()
        closed_at = None
        try:
            sock.sendall(_CHUNKED)
            for _ in range(int(DEADLINE * 10) + 50):  # a byte-sized chunk every 0.1 s
                sock.sendall(b"1\r\nx\r\n")
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            closed_at = time.monotonic() - start
        finally:
            sock.close()
        assert closed_at is not None and closed_at < DEADLINE + 2, closed_at
        assert svc.metrics.requests.labels("http", "timeout")._value.get() >= 1
        assert wait_for(lambda: svc.budget.used == 0, 2)


def test_chunked_bytes_are_taken_from_the_budget_as_they_arrive() -> None:
    with Service(_options(max_inflight_bytes=1 << 20), policy=Policy()) as svc:
        holder = socket.create_connection(("127.0.0.1", svc.http_port), 5)
        try:
            holder.sendall(_CHUNKED + b"%x\r\n%s\r\n" % (300_000, b"\0" * 300_000))
            assert wait_for(lambda: svc.budget.used == 300_000, 2)
            holder.sendall(b"%x\r\n%s\r\n" % (300_000, b"\0" * 300_000))
            assert wait_for(lambda: svc.budget.used == 600_000, 2)
            # Another request's chunks past the budget: 429 with a close, while they come.
            out = _raw(svc.http_port, _CHUNKED + b"%x\r\n%s\r\n" % (600_000, b"\0" * 600_000))
            assert out.startswith(b"HTTP/1.1 429"), out[:200]
            assert b"connection: close" in out.lower() and b"retry-after: 1" in out.lower()
        finally:
            holder.close()
        assert wait_for(lambda: svc.budget.used == 0, 5)


def test_a_gets_body_is_never_a_second_request(service: Service) -> None:
    smuggled = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    out = _raw(
        service.http_port,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        % len(smuggled)
        + smuggled,
    )
    assert out.count(b"HTTP/1.1 ") == 1 and out.startswith(b"HTTP/1.1 200")
    assert b"server:" not in out.lower()  # no Server header naming the stack


def test_bare_lf_and_folded_headers_are_refused(service: Service) -> None:
    for data in (
        b"GET /healthz HTTP/1.1\nHost: x\n\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n b\r\n\r\n",
    ):
        out = _raw(service.http_port, data)
        assert out.startswith(b"HTTP/1.1 400") and out.count(b"HTTP/1.1 ") == 1, out


def test_accepted_connections_send_without_nagle(service: Service) -> None:
    """uvicorn writes an answer's head and body separately: without TCP_NODELAY the body waits
    for the client's delayed ACK, about 40 ms per answer on a keep-alive connection (a hook asks
    before every tool call). asyncio sets it only on a socket made with ``IPPROTO_TCP``."""
    with socket.create_connection(("127.0.0.1", service.http_port), timeout=5) as client:
        for _ in range(2):  # the second request is the keep-alive case
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while not got.endswith(b'"ok"}'):
                chunk = client.recv(4096)
                assert chunk, got
                got += chunk
        receiver = service._http
        assert receiver is not None
        connections = list(receiver._server.server_state.connections)
        assert connections, "the server holds no connection"
        for protocol in connections:
            sock = protocol.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


# -- the in-flight byte budget -----------------------------------------------------------------


def test_past_the_byte_budget_429_comes_before_the_body() -> None:
    with Service(_options(max_inflight_bytes=1 << 20), policy=Policy()) as svc:
        holder = socket.create_connection(("127.0.0.1", svc.http_port), 2)
        try:  # a request whose body is under way holds its bytes
            holder.sendall(
                _HEAD + b"Content-Type: application/x-protobuf\r\nContent-Length: 900000\r\n\r\nx"
            )
            assert wait_for(lambda: svc.budget.used == 900_000, 2)
            start = time.monotonic()
            out = _raw(
                svc.http_port,
                _HEAD + b"Content-Type: application/x-protobuf\r\nContent-Length: 200000\r\n"
                b"Connection: close\r\n\r\n",
            )  # no body sent at all
            assert out.startswith(b"HTTP/1.1 429"), out
            assert b"retry-after: 1" in out.lower()
            assert time.monotonic() - start < DEADLINE
            registry = svc.metrics_page()[0].decode()
            # told apart from a full ingest queue: the operator knows which limit to raise
            assert (
                'loopguard_otlp_requests_total{outcome="over_budget",transport="http"} 1.0'
                in registry
            )
            assert (
                'loopguard_otlp_requests_total{outcome="throttled",transport="http"} 0.0'
                in registry
            )
        finally:
            holder.close()
        assert wait_for(lambda: svc.budget.used == 0, 2 * DEADLINE)
        # the budget is given back: a request is accepted again
        body = _proto_body()
        answer = request(
            svc.http_port,
            "POST",
            "/v1/traces",
            body,
            {**AUTH, "Content-Type": "application/x-protobuf"},
        )
        assert answer.status == 200


def test_the_byte_budget_covers_grpc() -> None:
    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    with Service(_options(grpc_port=0, max_inflight_bytes=1 << 20), policy=Policy()) as svc:
        assert svc.budget.take(1 << 20)  # as a request under way would
        try:
            channel = grpc.insecure_channel(f"127.0.0.1:{svc.grpc_port}")
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=lambda m: m,
                response_deserializer=lambda b: b,
            )
            with pytest.raises(grpc.RpcError) as failure:
                export(
                    ExportTraceServiceRequest.FromString(_proto_body()).SerializeToString(),
                    metadata=(("authorization", f"Bearer {TOKEN}"),),
                    timeout=5,
                )
            error = failure.value
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            trailers = dict(error.trailing_metadata())
            assert "google.rpc.retryinfo-bin" in trailers
            channel.close()
            assert (
                'loopguard_otlp_requests_total{outcome="over_budget",transport="grpc"} 1.0'
                in svc.metrics_page()[0].decode()
            )
        finally:
            svc.budget.give(1 << 20)


def _stalled_grpc_calls(
    port: int, count: int, metadata: tuple[tuple[str, str], ...]
) -> tuple[list[Any], threading.Event, Any]:
    """``count`` Export calls that send their headers and never a message (the request
    iterator blocks until the event is set)."""
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    export = channel.stream_unary(
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        request_serializer=lambda m: m,
        response_deserializer=lambda b: b,
    )
    release = threading.Event()

    def never() -> Iterator[bytes]:
        release.wait(60)
        return
        yield b""  # pragma: no cover

    calls = [export.future(never(), metadata=metadata, timeout=60) for _ in range(count)]
    return calls, release, channel


@pytest.mark.parametrize("token", [TOKEN, None])
def test_grpc_calls_that_never_send_a_message_stall_nothing(token: str | None) -> None:
    """64 calls that send headers and never the message (with a wrong token, and, where serve
    has no token, with none needed): the real OTLP/gRPC exporter still exports within seconds;
    unauthenticated calls end at once, the others at the request deadline."""
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    recorded = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(recorded))
    with provider.get_tracer("t").start_as_current_span("chat"):
        pass
    with Service(_options(grpc_port=0, token=token), policy=Policy()) as svc:
        wrong = (("authorization", "Bearer wrong"),)
        assert svc.grpc_port is not None
        stalled, release, channel = _stalled_grpc_calls(svc.grpc_port, 64, wrong if token else ())
        try:
            time.sleep(0.3)  # every stalled call is under way
            exporter = OTLPSpanExporter(
                endpoint=f"127.0.0.1:{svc.grpc_port}",
                insecure=True,
                headers={"authorization": f"Bearer {TOKEN}"} if token else None,
                timeout=5,
            )
            start = time.monotonic()
            assert exporter.export(recorded.get_finished_spans()) == SpanExportResult.SUCCESS
            assert time.monotonic() - start < 2.0
            exporter.shutdown()
            assert wait_for(lambda: svc.processed_spans == 1, 5)
            codes = []
            for call in stalled:
                with pytest.raises(grpc.RpcError) as failure:
                    call.result(timeout=4 * DEADLINE)
                codes.append(failure.value.code())
            expected = (
                grpc.StatusCode.UNAUTHENTICATED if token else grpc.StatusCode.DEADLINE_EXCEEDED
            )
            assert set(codes) == {expected}
        finally:
            release.set()
            channel.close()


# -- concurrent big bodies under a memory ceiling ----------------------------------------------

#: The serve process's peak resident memory (VmHWM) must stay under this while 16 clients send
#: 17 MiB OTLP JSON bodies at once (the standard library server took 3.7 GB).
MEMORY_CEILING_MB = 400


def _big_json_body(target: int) -> bytes:
    span = {
        "traceId": "",
        "spanId": "",
        "name": "execute_tool grep",
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "grep"}},
            {"key": "gen_ai.tool.call.result", "value": {"stringValue": "x" * 300}},
        ],
    }
    one = len(json.dumps(span)) + 70
    spans = []
    for n in range(target // one):
        spans.append({**span, "traceId": f"{n + 1:032x}", "spanId": f"{n + 1:016x}"})
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()


def _vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")
def test_concurrent_big_bodies_stay_under_a_memory_ceiling() -> None:
    body = _big_json_body(17 << 20)
    process = subprocess.Popen(
        [sys.executable, "-m", "otel_loopguard", "serve", "--http-port", "0", "--no-grpc"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "LOOPGUARD_SERVE_TOKEN"},
    )
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
        port = int(first.split(" on http://127.0.0.1:", 1)[1].split(";", 1)[0].split()[0])
        idle_mb = _vm_hwm_mb(process.pid)
        statuses: list[int] = []

        def send() -> None:
            try:
                answer = request(
                    port, "POST", "/v1/traces", body, {"Content-Type": "application/json"}, 30
                )
                statuses.append(answer.status)
                if answer.status == 429:
                    assert answer.headers["retry-after"] == "1"
            except OSError as exc:
                statuses.append(-1)
                print(exc)

        threads = [threading.Thread(target=send) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(40)
        peak_mb = _vm_hwm_mb(process.pid)
        print(f"idle {idle_mb:.0f} MB, peak {peak_mb:.0f} MB, answers {sorted(statuses)}")
        assert len(statuses) == 16 and set(statuses) <= {200, 429}, statuses
        assert statuses.count(200) >= 1
        assert peak_mb < MEMORY_CEILING_MB, (idle_mb, peak_mb)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


# -- TLS ---------------------------------------------------------------------------------------


def test_tls_round_trip_with_the_real_otlp_http_exporter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # requests lets these override a session's CA file (the exporter's certificate_file)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    recorded = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(recorded))
    with provider.get_tracer("t").start_as_current_span("chat"):
        pass
    cert, key = self_signed(tmp_path)
    with Service(_options(tls_cert=cert, tls_key=key), policy=Policy()) as svc:
        assert svc.urls["http"].startswith("https://")
        exporter = OTLPSpanExporter(
            endpoint=f"https://127.0.0.1:{svc.http_port}/v1/traces",
            certificate_file=cert,
            headers={"authorization": f"bearer {TOKEN}"},
            timeout=5,
        )
        assert exporter.export(recorded.get_finished_spans()) == SpanExportResult.SUCCESS
        assert wait_for(lambda: svc.processed_spans == 1, 5)
        # plain HTTP on the TLS port gets no answer
        assert not _raw(svc.http_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").startswith(
            b"HTTP/1.1 200"
        )
        context = ssl.create_default_context(cafile=cert)
        out = _raw(
            svc.http_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", context
        )
        assert out.startswith(b"HTTP/1.1 200")
        exporter.shutdown()  # type: ignore[no-untyped-call]


def test_tls_handshakes_count_against_the_cap_and_the_deadline(tmp_path: Path) -> None:
    """TCP connections that never send a ClientHello: never more open than max_connections
    (the reserved slot's waiting one is replaced by each new one), each closed within the
    request deadline; HTTPS keeps answering."""
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(cafile=cert)
    with Service(_options(tls_cert=cert, tls_key=key, max_connections=8), policy=Policy()) as svc:
        receiver = svc._http
        assert receiver is not None
        protocol = receiver.protocol
        silent = []
        start = time.monotonic()
        for _ in range(40):
            sock = socket.create_connection(("127.0.0.1", svc.http_port), 2)
            sock.settimeout(3 * DEADLINE)
            silent.append(sock)
            time.sleep(0.005)
            assert len(protocol.handshaking) + len(receiver._server.server_state.connections) <= 8
        assert wait_for(lambda: len(protocol.handshaking) > 0, 1)
        lifetimes = []
        for sock in silent:
            try:
                closed = sock.recv(1) == b""
            except ConnectionResetError:
                closed = True
            except TimeoutError:
                closed = False
            lifetimes.append((closed, time.monotonic() - start))
            sock.close()
        assert all(closed for closed, _ in lifetimes), lifetimes
        assert max(t for _, t in lifetimes) < 2 * DEADLINE + 1, lifetimes
        assert wait_for(lambda: not protocol.handshaking, 2)
        out = _raw(
            svc.http_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", context
        )
        assert out.startswith(b"HTTP/1.1 200"), out


def test_a_certificate_that_cannot_be_loaded_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ValueError, match="tls_cert"):
        Service(_options(tls_cert=str(bad), tls_key=str(bad))).start()
    with pytest.raises(ValueError, match="give both"):
        _options(tls_cert=str(bad))


# -- the token ---------------------------------------------------------------------------------


def test_the_bearer_scheme_is_case_insensitive(service: Service) -> None:
    port = service.http_port
    for scheme in ("Bearer", "bearer", "BEARER"):
        answer = request(port, "GET", "/metrics", headers={"Authorization": f"{scheme} {TOKEN}"})
        assert answer.status == 200, scheme
    for header in (f"Basic {TOKEN}", "Bearer wrong", f"Bearer{TOKEN}", TOKEN):
        assert request(port, "GET", "/metrics", headers={"Authorization": header}).status == 401


def test_an_empty_token_is_refused_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from otel_loopguard.cli import main
    from otel_loopguard.hooks import run

    empty = tmp_path / "token"
    empty.write_text("\n")
    monkeypatch.delenv("LOOPGUARD_SERVE_TOKEN", raising=False)
    for argv in (["--token", ""], ["--token-file", str(empty)]):
        assert main(["serve", "--http-port", "0", "--no-grpc", *argv]) == 2
        assert "empty" in capsys.readouterr().err
    monkeypatch.setenv("LOOPGUARD_SERVE_TOKEN", "")
    assert main(["serve", "--http-port", "0", "--no-grpc"]) == 2
    assert "LOOPGUARD_SERVE_TOKEN: the token is empty" in capsys.readouterr().err
    with pytest.raises(ValueError):
        ServeOptions(token="")
    # hook --server: refused (and, with --fail-closed, the call is denied), never sent bare
    event = {
        "hook_event_name": "PreToolUse",
        "session_id": "s",
        "tool_name": "Bash",
        "tool_input": {"command": "ls"},
    }
    out, err = io.BytesIO(), io.StringIO()
    assert (
        run(
            "claude-code",
            server="http://127.0.0.1:9",
            fail_closed=True,
            environ={"LOOPGUARD_SERVE_TOKEN": ""},
            stdin=io.BytesIO(json.dumps(event).encode()),
            stdout=out,
            stderr=err,
        )
        == 0
    )
    assert "LOOPGUARD_SERVE_TOKEN is set but empty" in err.getvalue()
    assert "deny" in out.getvalue().decode()


def test_a_token_on_the_command_line_warns_and_a_token_file_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from otel_loopguard.cli import main

    monkeypatch.delenv("LOOPGUARD_SERVE_TOKEN", raising=False)
    # A bad --max-connections stops it before binding: enough to see how the token was read.
    assert main(["serve", "--token", TOKEN, "--max-connections", "0"]) == 2
    assert "ps" in capsys.readouterr().err
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert main(["serve", "--token-file", str(token_file), "--max-connections", "0"]) == 2
    err = capsys.readouterr().err
    assert "ps" not in err and "max_connections" in err


# -- issue 23: heads, pipelining, slow readers, gzip, decision bodies, TLS handshakes -----------


def test_a_head_past_its_byte_or_header_cap_is_431_while_it_is_read(service: Service) -> None:
    from otel_loopguard.service._http import MAX_HEAD_BYTES, MAX_HEADERS

    port = service.http_port
    big_value = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * (MAX_HEAD_BYTES + 1)
    many = b"GET /healthz HTTP/1.1\r\n" + b"".join(
        b"X-%d: 1\r\n" % n for n in range(MAX_HEADERS + 1)
    )
    long_url = b"GET /healthz?" + b"q" * (MAX_HEAD_BYTES + 1) + b" HTTP/1.1\r\n"
    for head in (big_value, many + b"\r\n", long_url):  # the first never ends its head
        out = _raw(port, head)
        assert out.startswith(b"HTTP/1.1 431"), out[:80]
        assert out.count(b"HTTP/1.1 ") == 1 and b"connection: close" in out
    # just under the caps: answered
    fits = b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % n for n in range(MAX_HEADERS))
    assert _raw(port, fits + b"Connection: close\r\n\r\n").startswith(b"HTTP/1.1 431")
    fits = b"GET /healthz HTTP/1.1\r\n" + b"".join(
        b"X-%d: 1\r\n" % n for n in range(MAX_HEADERS - 1)
    )
    assert _raw(port, fits + b"Connection: close\r\n\r\n").startswith(b"HTTP/1.1 200")
    value = b"v" * (MAX_HEAD_BYTES - 200)
    out = _raw(port, b"GET /healthz HTTP/1.1\r\nX-Big: " + value + b"\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200"), out[:80]


def test_a_head_dribbled_in_small_headers_is_cut_at_the_cap(service: Service) -> None:
    """Many small reads, each far under the cap: counted together, 431 once they pass it (one
    unauthenticated connection sending small headers took serve to 2.6 GB before)."""
    with socket.create_connection(("127.0.0.1", service.http_port), 5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        sock.setblocking(False)
        sent, out = 0, b""
        while sent < 4 << 20 and not out:
            try:
                sock.sendall(b"X-Filler: " + b"f" * 1000 + b"\r\n")
                sent += 1012
                if sent % (16 * 1012) == 0:
                    time.sleep(0.005)
                out = sock.recv(65536)
            except BlockingIOError:
                pass
            except OSError:
                break
        sock.settimeout(2)
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except OSError:
            pass
    assert out.startswith(b"HTTP/1.1 431"), out[:80]
    assert sent < 1 << 20, sent  # answered long before a megabyte was sent


def test_pipelined_requests_wait_in_a_bounded_queue_and_all_get_answers(
    service: Service,
) -> None:
    """2,000 pipelined requests sent before any answer is read: at most MAX_PIPELINED (plus
    what one parse step holds) wait in serve, the rest wait unread (TCP pushes back on the
    client); every one is answered, in order."""
    from otel_loopguard.service._http import MAX_PIPELINED

    receiver = service._http
    assert receiver is not None
    connections = receiver._server.server_state.connections
    one = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    count = 2000
    with socket.create_connection(("127.0.0.1", service.http_port), 5) as sock:
        sender = threading.Thread(target=sock.sendall, args=(one * count,))
        sender.start()
        deepest = 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # nothing read meanwhile
            for protocol in list(connections):
                assert isinstance(protocol, receiver.protocol)
                deepest = max(deepest, len(protocol.pipeline))
                assert len(protocol._held) <= 256 * 1024
            time.sleep(0.01)
        assert 0 < deepest <= MAX_PIPELINED + 256 // len(b"GET / HTTP/1.1\r\n\r\n"), deepest
        out = b""
        sock.settimeout(5)
        while out.count(b"HTTP/1.1 200") < count:
            chunk = sock.recv(65536)
            assert chunk, out.count(b"HTTP/1.1 200")
            out += chunk
        sender.join(5)
    assert out.count(b"HTTP/1.1 ") == count


def test_a_client_that_does_not_read_its_answers_is_closed(service: Service) -> None:
    """GET /metrics pipelined one at a time (never past the pipelining bound) and never read:
    once the answers fill the buffers, the connection is closed after the write deadline,
    while the server answers others."""
    receiver = service._http
    assert receiver is not None
    connections = receiver._server.server_state.connections
    with socket.create_connection(("127.0.0.1", service.http_port), 5) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        get = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n\r\n"
        sock.settimeout(0.2)
        for sent in range(400):  # 400 answers of about 24 KB: more than every buffer holds
            try:
                sock.sendall(get)
            except TimeoutError:
                pass
            except OSError:
                break
            if sent % 50 == 0:
                assert request(service.http_port, "GET", "/healthz", timeout=2).status == 200
            time.sleep(0.003)
        assert wait_for(lambda: not connections, 4 * DEADLINE), "still open"
    timeouts = service.metrics.requests.labels("http", "timeout")._value.get()
    assert timeouts >= 1


def _gzip_bomb(inflated: int) -> bytes:
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\0" * (1 << 20)
    parts = [packer.compress(chunk) for _ in range(inflated >> 20)]
    parts.append(packer.flush())
    return b"".join(parts)


def test_a_gzip_body_is_budgeted_as_it_inflates() -> None:
    import gzip

    with Service(
        _options(max_body_bytes=8 << 20, max_inflight_bytes=4 << 20), policy=Policy()
    ) as svc:
        headers = {**AUTH, "Content-Type": "application/json", "Content-Encoding": "gzip"}
        bomb = _gzip_bomb(64 << 20)
        answer = request(svc.http_port, "POST", "/v1/traces", bomb, headers)
        assert answer.status == 413 and b"inflates to more than" in answer.body
        assert wait_for(lambda: svc.budget.used == 0, 2)
        # a body that inflates within the limit but past what the budget has left: 429
        holder = socket.create_connection(("127.0.0.1", svc.http_port), 2)
        try:
            holder.sendall(
                _HEAD + b"Content-Type: application/x-protobuf\r\nContent-Length: 3000000\r\n\r\nx"
            )
            assert wait_for(lambda: svc.budget.used == 3_000_000, 2)
            answer = request(svc.http_port, "POST", "/v1/traces", _gzip_bomb(2 << 20), headers)
            assert answer.status == 429 and answer.headers["retry-after"] == "1"
        finally:
            holder.close()
        assert wait_for(lambda: svc.budget.used == 0, 2 * DEADLINE)
        # alone, a body that inflates to more than the whole budget is still read
        body = gzip.compress(_big_json_body(6 << 20))
        answer = request(svc.http_port, "POST", "/v1/traces", body, headers)
        assert answer.status == 200, answer.body
        assert wait_for(lambda: svc.budget.used == 0, 2)


def test_decision_bodies_have_their_own_budget_and_a_depth_limit(service: Service) -> None:
    from otel_loopguard.service._decisions import MAX_DECISION_DEPTH

    port = service.http_port
    headers = {**AUTH, "Content-Type": "application/json"}

    def nested(depth: int) -> bytes:
        inner = "[" * (depth - 2) + "]" * (depth - 2)
        return f'{{"session": "s", "tool": "t", "arguments": {{"a": {inner}}}}}'.encode()

    answer = request(port, "POST", "/v1/decisions/before", nested(MAX_DECISION_DEPTH + 1), headers)
    assert answer.status == 400 and f"{MAX_DECISION_DEPTH} levels".encode() in answer.body
    answer = request(port, "POST", "/v1/decisions/before", nested(MAX_DECISION_DEPTH), headers)
    assert answer.status == 200, answer.body
    receiver = service._http
    assert receiver is not None
    budget = receiver.decision_budget
    assert budget.limit == service.options.max_inflight_bytes // 8
    # big decision bodies under way take at most half of it; small ones still pass
    holders = []
    try:
        for _ in range(8):
            sock = socket.create_connection(("127.0.0.1", port), 2)
            sock.sendall(
                b"POST /v1/decisions/before HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n["
            )
            holders.append(sock)
        assert wait_for(lambda: budget.used >= budget.limit // 2 - 1_000_000, 2)
        assert budget.used <= budget.limit // 2
        refused = request(
            port,
            "POST",
            "/v1/decisions/before",
            b"[" + b" " * 999_998 + b"]",
            headers,
        )
        assert refused.status == 429 and refused.headers["retry-after"] == "1"
        small = request(port, "POST", "/v1/decisions/before", nested(3), headers, timeout=2)
        assert small.status == 200
    finally:
        for sock in holders:
            sock.close()
    assert wait_for(lambda: budget.used == 0, 2 * DEADLINE)
