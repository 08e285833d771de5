"""otel-loopguard serve: OTLP/HTTP protobuf ingest throughput and decision API latency.

    python benchmarks/bench_serve.py [--batches 400] [--repeat 3] [--decisions 5000]

Ingest: ``otel-loopguard serve`` runs as a subprocess pinned to one CPU (``sched_setaffinity``);
a client process pinned to the other CPU sends pre-encoded ``ExportTraceServiceRequest`` bodies
of 512 spans each (encoded by the OpenTelemetry exporter's own encoder from spans a real
TracerProvider recorded, fresh trace ids in every batch) over two keep-alive connections, as
fast as the server answers. The time runs from the first request until the server's ingest
queue is empty and every span was fed to the guard (read from its /metrics). Spans/s on one core
= spans / that time. Server CPU time (user + system, from /proc) is reported too.

Baseline: a bare protobuf parse of the same bytes (``ExportTraceServiceRequest.FromString``) in
this process, on one core; the ratio is ingest seconds per span over parse seconds per span.

Where the time goes: the same batches through the service's pieces in this process, without
HTTP: decoding (``proto_spans``) and the ingest step (trace buffer, conventions, guard), each
timed alone.

Workloads ("agents" always; "fixtures" always):
  - agents: GenAI-semconv agent runs: per run an invoke_agent span, and per step a chat span
    (model, token counts, a short output message) and an execute_tool span (arguments, call id,
    result); one run in three loops on one call. About half the spans are tool spans.
  - fixtures: the real framework span dumps of tests/data/spans (Pydantic AI,
    LangGraph with OpenInference and OpenLLMetry, Strands), rebuilt through a TracerProvider:
    large LLM spans carrying whole conversations (about 4.7 KB a span).

Decision API: on the same (idle) server, one keep-alive connection, ``POST
/v1/decisions/before`` with a small call, 200 warm-up requests then ``--decisions`` timed round
trips; p50 / p99 / max.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "data" / "spans"
BATCH = 512


# -- workloads ---------------------------------------------------------------------------------


def agent_spans(count: int) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    run = 0
    while len(exporter.get_finished_spans()) < count:
        run += 1
        loops = run % 3 == 0
        with tracer.start_as_current_span(
            f"invoke_agent agent{run % 7}",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": f"agent{run % 7}",
                "gen_ai.conversation.id": f"conv-{run}",
            },
        ):
            for step in range(8):
                with tracer.start_as_current_span(
                    "chat gpt-4o",
                    attributes={
                        "gen_ai.operation.name": "chat",
                        "gen_ai.provider.name": "openai",
                        "gen_ai.request.model": "gpt-4o",
                        "gen_ai.response.model": "gpt-4o",
                        "gen_ai.usage.input_tokens": 1200 + step,
                        "gen_ai.usage.output_tokens": 40,
                        "gen_ai.response.finish_reasons": ("tool_calls",),
                    },
                ) as chat:
                    chat.set_attribute(
                        "gen_ai.output.messages",
                        json.dumps(
                            [
                                {
                                    "role": "assistant",
                                    "parts": [
                                        {"type": "tool_call", "name": "search", "id": f"c{step}"}
                                    ],
                                }
                            ]
                        ),
                    )
                query = "weather in Paris" if loops else f"topic {run}-{step}"
                with tracer.start_as_current_span(
                    "execute_tool search",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "search",
                        "gen_ai.tool.type": "function",
                    },
                ) as tool:
                    tool.set_attribute("gen_ai.tool.call.arguments", json.dumps({"query": query}))
                    tool.set_attribute("gen_ai.tool.call.id", f"call-{run}-{step}")
                    tool.set_attribute("gen_ai.tool.call.result", f"results for {query}")
    return list(exporter.get_finished_spans())[:count]


def fixture_spans(count: int) -> list[ReadableSpan]:
    sys.path.insert(0, str(ROOT))
    from tests.span_dumps import load, rebuild

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    paths = sorted(FIXTURES.glob("*/*.jsonl"))
    while len(exporter.get_finished_spans()) < count:
        for path in paths:
            rebuild(load(path), tracer)
    return list(exporter.get_finished_spans())[:count]


def batches(spans: list[ReadableSpan]) -> list[bytes]:
    return [
        encode_spans(spans[i : i + BATCH]).SerializeToString()
        for i in range(0, len(spans) - BATCH + 1, BATCH)
    ]


# -- the server --------------------------------------------------------------------------------


class Server:
    """``otel-loopguard serve`` in a subprocess pinned to CPU 0."""

    def __init__(self) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        self.cpu = cpus[0]
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "otel_loopguard",
                "serve",
                "--http-port",
                "0",
                "--no-grpc",
                "--max-queued-spans",
                "1000000",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {self.cpu}),
        )
        assert self.process.stderr is not None
        line = self.process.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if match is None:
            raise RuntimeError(f"serve did not start: {line!r}")
        self.port = int(match.group(1))
        # serve logs a line per decision on stderr: keep reading it, or a full pipe stalls it
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for _ in self.process.stderr:
            pass

    def metric(self, name: str, **labels: str) -> float:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pattern = re.escape(f"{name}{{{wanted}}}" if labels else name) + r" ([0-9.e+]+)"
        found = re.search(pattern, text)
        return float(found.group(1)) if found else 0.0

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def send_all(port: int, bodies: list[bytes], connections: int = 2) -> None:
    """Send every body (split over ``connections`` keep-alive connections, each in a thread)."""
    errors: list[str] = []

    def sender(part: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for body in part:
            while True:
                conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
                response = conn.getresponse()
                response.read()
                if response.status == 429:
                    time.sleep(0.01)
                    continue
                if response.status != 200:
                    errors.append(f"status {response.status}")
                break
        conn.close()

    threads = [
        threading.Thread(target=sender, args=(bodies[n::connections],)) for n in range(connections)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(errors[:3])


def ingest_run(server: Server, bodies: list[bytes], spans: int) -> tuple[float, float]:
    """(wall seconds, server CPU seconds) to take and judge ``bodies``."""
    before = server.metric("loopguard_otlp_spans_total", result="accepted")
    cpu = server.cpu_seconds()
    started = time.perf_counter()
    client = threading.Thread(target=send_all, args=(server.port, bodies))
    client.start()
    client.join()
    while True:
        accepted = server.metric("loopguard_otlp_spans_total", result="accepted") - before
        if accepted >= spans and server.metric("loopguard_ingest_queue_spans") == 0:
            break
        time.sleep(0.002)
    return time.perf_counter() - started, server.cpu_seconds() - cpu


def bare_parse(bodies: list[bytes]) -> float:
    started = time.perf_counter()
    for body in bodies:
        ExportTraceServiceRequest.FromString(body)
    return time.perf_counter() - started


def pieces(bodies: list[bytes]) -> tuple[float, float]:
    """Seconds to decode, and to ingest (buffer, conventions, guard), every body in process."""
    from otel_loopguard import LoopGuard
    from otel_loopguard.metrics import PrometheusRecorder
    from otel_loopguard.service._ingest import Ingest
    from otel_loopguard.service.proto import proto_spans
    from otel_loopguard.traces import TraceBuffer

    started = time.perf_counter()
    decoded = [proto_spans(body) for body in bodies]
    decode = time.perf_counter() - started
    guard = LoopGuard(recorder=PrometheusRecorder())
    ingest = Ingest(guard, TraceBuffer(hold_seconds=2.0), 10**9, 2.0)
    started = time.perf_counter()
    for batch in decoded:
        ingest._add(batch)
    add = time.perf_counter() - started
    ingest.close(10)
    return decode, add


def decision_latency(port: int, count: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times: list[float] = []
    for n in range(200 + count):
        body = json.dumps(
            {
                "tool": "grep",
                "arguments": {"pattern": f"p{n % 50}"},
                "session": f"s{n % 20}",
                "agent": "bench",
            }
        ).encode()
        started = time.perf_counter_ns()
        conn.request("POST", "/v1/decisions/before", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        elapsed = time.perf_counter_ns() - started
        if response.status != 200:
            raise RuntimeError(f"decision status {response.status}")
        if n >= 200:
            times.append(elapsed / 1e6)
    conn.close()
    return times


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=400, help="batches of 512 per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--decisions", type=int, default=5000)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, set(cpus[1:]))  # the client stays off the server's core
    print(
        f"# {platform.python_implementation()} {platform.python_version()},"
        f" {platform.machine()}, {os.cpu_count()} CPUs; server pinned to CPU {cpus[0]}"
    )
    workloads: dict[str, list[ReadableSpan]] = {"agents": agent_spans(args.batches * BATCH)}
    if FIXTURES.is_dir():
        workloads["fixtures"] = fixture_spans(args.batches * BATCH)
    server = Server()
    try:
        for name, spans in workloads.items():
            bodies = batches(spans)
            total = len(bodies) * BATCH
            size = sum(map(len, bodies)) / total
            walls, cpus_used, parses = [], [], []
            for _ in range(args.repeat):
                wall, cpu = ingest_run(server, bodies, total)
                walls.append(wall)
                cpus_used.append(cpu)
                parses.append(bare_parse(bodies))
            wall = statistics.median(walls)
            cpu = statistics.median(cpus_used)
            parse = statistics.median(parses)
            decode, add = pieces(bodies)
            print(
                f"\n## ingest, workload {name}: {len(bodies)} batches of {BATCH} spans,"
                f" {size:,.0f} B/span"
            )
            print(f"ingest spans/s (one core, wall): {total / wall:,.0f}")
            print(
                f"server CPU s per 1k spans: {cpu / total * 1e3 * 1e3:.2f} ms"
                f" (spans per CPU-second {total / cpu:,.0f})"
            )
            print(f"bare parse spans/s: {total / parse:,.0f}")
            print(f"ratio ingest / bare parse: {wall / parse:.2f}x")
            print(
                f"in process, per span: bare parse {parse / total * 1e6:.2f} us,"
                f" decode {decode / total * 1e6:.2f} us, ingest (buffer + conventions +"
                f" guard) {add / total * 1e6:.2f} us; HTTP and the rest"
                f" {(wall - decode - add) / total * 1e6:.2f} us"
            )
        times = decision_latency(server.port, args.decisions)
        print(f"\n## decision API (POST /v1/decisions/before, keep-alive, {len(times)} calls)")
        print(
            f"p50 {percentile(times, 0.50):.3f} ms, p99 {percentile(times, 0.99):.3f} ms,"
            f" max {max(times):.3f} ms"
        )
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
