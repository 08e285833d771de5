"""Issue 23, item 2: gRPC that nobody can stall.

Round two: eight calls that sent their headers and never the message (no token needed) held all
eight gRPC worker threads; every legitimate ``Export`` then failed with ``DEADLINE_EXCEEDED``
and the real Python exporter reported ``FAILURE``, indefinitely. Now serve runs ``grpc.aio``: a
call authenticates as soon as its headers are in and waits for its message as a coroutine, at
most the request timeout; calls are bounded per connection (100) and in all (1,024).

A real ``serve`` process; its peak resident memory (VmHWM) is read from /proc.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.service_tools import ServeProcess, require_serve_prerequisites

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

require_serve_prerequisites()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status"),
]

TOKEN = "s3cret"
DEADLINE = 3.0
#: serve's peak resident memory must stay under this (measured: about 60 MiB).
CEILING_MB = 150
STALLED = 256


def _spans() -> list[ReadableSpan]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    recorded = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(recorded))
    with provider.get_tracer("t").start_as_current_span("chat"):
        pass
    return list(recorded.get_finished_spans())


@pytest.mark.parametrize("token", [None, TOKEN], ids=["no-token", "token"])
def test_calls_that_never_send_their_message_do_not_stop_grpc_ingest(token: str | None) -> None:
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    args = ["--request-timeout", str(DEADLINE)] + (["--token", token] if token else [])
    server = ServeProcess(*args, grpc=True)
    release = threading.Event()
    channels = []
    try:
        assert server.grpc_port is not None
        idle = server.peak_rss_mb()
        # 256 calls over 4 connections (no token needed, or a wrong one): headers, no message
        stalled = []

        def never() -> Iterator[bytes]:
            release.wait(60)
            return
            yield b""  # pragma: no cover

        for _ in range(4):
            channel = grpc.insecure_channel(  # a connection each (64 calls: under its 100)
                f"127.0.0.1:{server.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
            )
            channels.append(channel)
            export = channel.stream_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=lambda m: m,
                response_deserializer=lambda b: b,
            )
            metadata = (("authorization", "Bearer wrong"),) if token else ()
            stalled += [
                export.future(never(), metadata=metadata, timeout=60) for _ in range(STALLED // 4)
            ]
        time.sleep(0.5)
        exporter = OTLPSpanExporter(
            endpoint=f"127.0.0.1:{server.grpc_port}",
            insecure=True,
            headers={"authorization": f"Bearer {token}"} if token else None,
            timeout=5,
        )
        results, times = [], []
        for _ in range(5):  # while the stalled calls are under way
            start = time.monotonic()
            results.append(exporter.export(_spans()))
            times.append(time.monotonic() - start)
        exporter.shutdown()
        codes = set()
        for call in stalled:
            try:
                call.result(timeout=DEADLINE + 5)
                codes.add("OK")
            except grpc.RpcError as error:
                codes.add(error.code().name)
        peak = server.peak_rss_mb()
        print(
            f"grpc ({'token' if token else 'no token'}): {STALLED} stalled calls ended {codes};"
            f" exports {[r.name for r in results]}, slowest {max(times):.3f} s;"
            f" idle {idle:.0f} MiB, peak {peak:.0f} MiB"
        )
        assert results == [SpanExportResult.SUCCESS] * 5
        assert max(times) < 2.0
        assert codes == {"UNAUTHENTICATED" if token else "DEADLINE_EXCEEDED"}
        assert peak < CEILING_MB, (idle, peak)
    finally:
        release.set()
        for channel in channels:
            channel.close()
        assert server.stop(30) == 0
        server.close()
