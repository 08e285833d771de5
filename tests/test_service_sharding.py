"""Sharding: several serve instances behind a router that sends every span of a trace to the
same instance, as the Collector's ``load_balancing`` exporter does (``routing_key: traceID``, a
consistent-hash ring of the backends, OTLP/gRPC). The real OTLP gRPC exporter sends a mixed
workload; every loop is detected exactly as one instance detects it."""

from __future__ import annotations

import bisect
import json
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import pytest

from .service_tools import require_serve_prerequisites

require_serve_prerequisites()

import grpc  # noqa: E402
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: E402
    OTLPSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: E402

from otel_loopguard._guard import LoopGuard  # noqa: E402
from otel_loopguard.config import PRESETS  # noqa: E402
from otel_loopguard.metrics import PrometheusRecorder  # noqa: E402
from otel_loopguard.service import ServeOptions, Service  # noqa: E402

from .service_tools import sample, trip_lines, workload  # noqa: E402

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SHARDS = 3
#: Points per backend on the ring (the load_balancing exporter's default weight is 100).
RING_POINTS = 100


class Ring:
    """A consistent-hash ring of backends: a trace id goes to the first point at or after its
    hash, wrapping around."""

    def __init__(self, backends: list[str]) -> None:
        points = sorted(
            (zlib.crc32(f"{backend}-{n}".encode()), index)
            for index, backend in enumerate(backends)
            for n in range(RING_POINTS)
        )
        self._hashes = [point for point, _ in points]
        self._owners = [owner for _, owner in points]

    def owner(self, trace_id: bytes) -> int:
        position = bisect.bisect_left(self._hashes, zlib.crc32(trace_id))
        return self._owners[position % len(self._owners)]


class Router:
    """An OTLP/gRPC receiver that splits each request by trace id and forwards the parts to
    the ring's owners over OTLP/gRPC, as ``load_balancing`` does."""

    def __init__(self, backends: list[str]) -> None:
        self.ring = Ring(backends)
        self.channels = [grpc.insecure_channel(backend) for backend in backends]
        self.exports = [channel.unary_unary(EXPORT) for channel in self.channels]
        self.traces_by_shard: list[set[bytes]] = [set() for _ in backends]
        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {"Export": grpc.unary_unary_rpc_method_handler(self.export)},
        )
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def export(self, body: bytes, context: Any) -> bytes:
        request = ExportTraceServiceRequest.FromString(body)
        parts: dict[int, ExportTraceServiceRequest] = {}
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    shard = self.ring.owner(span.trace_id)
                    self.traces_by_shard[shard].add(span.trace_id)
                    part = parts.setdefault(shard, ExportTraceServiceRequest())
                    target = part.resource_spans.add()
                    target.resource.CopyFrom(resource_spans.resource)
                    scope = target.scope_spans.add()
                    scope.scope.CopyFrom(scope_spans.scope)
                    scope.spans.add().CopyFrom(span)
        for shard, part in sorted(parts.items()):
            self.exports[shard](part.SerializeToString(), timeout=10)
        return b""

    def close(self) -> None:
        self.server.stop(1).wait(5)
        for channel in self.channels:
            channel.close()


def _service(tmp_path: Path, name: str) -> Service:
    policy = PRESETS["default"].replace(trip_log_path=str(tmp_path / f"{name}.jsonl"))
    guard = LoopGuard(policy, recorder=PrometheusRecorder())
    return Service(ServeOptions(http_port=0, grpc_port=0, hold_seconds=60.0), guard=guard).start()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[list[Service], Service]]:
    shards = [_service(tmp_path, f"shard{n}") for n in range(SHARDS)]
    single = _service(tmp_path, "single")
    yield shards, single
    for service in (*shards, single):
        service.close(timeout=10)


def _key(line: dict[str, Any]) -> str:
    return json.dumps(line, sort_keys=True)


def test_trace_id_sharding_detects_every_loop_as_one_instance(
    tmp_path: Path, services: tuple[list[Service], Service]
) -> None:
    shards, single = services
    router = Router([f"127.0.0.1:{shard.grpc_port}" for shard in shards])
    try:
        provider = TracerProvider()
        for endpoint in (f"127.0.0.1:{router.port}", f"127.0.0.1:{single.grpc_port}"):
            provider.add_span_processor(
                BatchSpanProcessor(
                    OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=10),
                    schedule_delay_millis=50,
                    max_export_batch_size=64,
                )
            )
        workload(provider.get_tracer("agents"), traces=6)
        assert provider.force_flush(30_000)
        provider.shutdown()
        for service in (*shards, single):
            assert service.wait_idle(15)
    finally:
        router.close()
    assert sum(1 for traces in router.traces_by_shard if traces) >= 2  # it really sharded
    assert sum(service.processed_spans for service in shards) == single.processed_spans

    one = trip_lines(tmp_path / "single.jsonl")
    sharded = [line for n in range(SHARDS) for line in trip_lines(tmp_path / f"shard{n}.jsonl")]
    assert len(one) > 50
    assert {line["action"] for line in one} >= {"remind", "deny", "stop"}
    assert sorted(map(_key, sharded)) == sorted(map(_key, one))
    # Each session's decisions come from one shard only.
    owners: dict[str, set[int]] = {}
    for n in range(SHARDS):
        for line in trip_lines(tmp_path / f"shard{n}.jsonl"):
            owners.setdefault(line["session"], set()).add(n)
    assert all(len(shard_set) == 1 for shard_set in owners.values())
    for agent, tool in (
        ("coder", "grep"),
        ("searcher", "search"),
        ("builder", "bash"),
        ("reviewer", "read_file"),
        ("watcher", "status"),
    ):
        total = sum(
            sample(
                cast(PrometheusRecorder, shard.guard.recorder).registry,
                "loopguard_tool_calls_total",
                agent=agent,
                tool=tool,
            )
            for shard in shards
        )
        assert (
            total
            == sample(
                cast(PrometheusRecorder, single.guard.recorder).registry,
                "loopguard_tool_calls_total",
                agent=agent,
                tool=tool,
            )
            > 0
        )
