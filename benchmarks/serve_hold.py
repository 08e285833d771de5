"""How many agent runs keep their agent in ``serve``, by ``--hold-seconds``, with real exporters.

    python benchmarks/serve_hold.py [--holds 2,6,11] [--durations 1,3,8,20] [--runs 20]
        [--exporters http,grpc,loopguard]

``--exporters loopguard`` measures the in-process ``LoopGuardSpanExporter`` (its
``hold_seconds``) behind the same ``BatchSpanProcessor``, without serve.

Each configuration is one ``Service`` (real OTLP/HTTP and OTLP/gRPC ports) fed by a real
``TracerProvider`` whose ``BatchSpanProcessor`` keeps its defaults (schedule delay 5 s, or
``OTEL_BSP_SCHEDULE_DELAY``) and exports with ``opentelemetry-exporter-otlp-proto-http`` or
``-grpc``. Per run duration, ``--runs`` agent runs start at random moments within
``--spread`` seconds (so the exporter's timer meets them at every phase); a run is an
``invoke_agent`` root span with four ``execute_tool`` spans spaced evenly over the run, as an
agent whose tools take turns with the model. After the last run the provider is shut down (its
last export sent) and the service closed (every buffered trace judged).

A run keeps its agent when its tool calls are counted under the agent's name
(``loopguard_tool_calls_total{agent="a<duration>"}``); a run whose first tool spans were judged
before its agent span arrived is keyed by its trace alone (``agent="none"``). Every run's tools
have the run duration in their name, so the share is read per duration. Also printed: what
serve counted in ``loopguard_trace_agents_lost_total``.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_loopguard import LoopGuard
from otel_loopguard.exporter import LoopGuardSpanExporter
from otel_loopguard.metrics import PrometheusRecorder
from otel_loopguard.service import ServeOptions, Service

CALLS_PER_RUN = 4


def one_run(tracer: object, duration: float, start_after: float) -> None:
    time.sleep(start_after)
    name = f"a{duration:g}"
    with tracer.start_as_current_span(  # type: ignore[attr-defined]
        f"invoke_agent {name}",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name},
    ):
        for index in range(CALLS_PER_RUN):
            time.sleep(duration / CALLS_PER_RUN)  # the model thinks
            with tracer.start_as_current_span(  # type: ignore[attr-defined]
                f"execute_tool t{duration:g}s",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": f"t{duration:g}s",
                    "gen_ai.tool.call.arguments": f'{{"n": {index}}}',
                    "gen_ai.tool.call.result": "ok",
                },
            ):
                pass


def measure(
    exporter_kind: str, hold: float, durations: list[float], runs: int, spread: float
) -> dict[str, object]:
    service: Service | None = None
    guard: LoopGuard | None = None
    if exporter_kind == "loopguard":
        # In process: the span exporter behind the BatchSpanProcessor, no serve.
        guard = LoopGuard(recorder=PrometheusRecorder())
        exporter: object = LoopGuardSpanExporter(guard, hold_seconds=hold)
    else:
        service = Service(ServeOptions(http_port=0, grpc_port=0, hold_seconds=hold)).start()
        guard = service.guard
    if exporter_kind == "http":
        assert service is not None
        exporter = HttpExporter(endpoint=f"{service.urls['http']}/v1/traces")
    elif exporter_kind == "grpc":
        assert service is not None
        exporter = GrpcExporter(endpoint=service.urls["grpc"], insecure=True)
    provider = TracerProvider()
    processor = BatchSpanProcessor(exporter)  # type: ignore[arg-type]
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("serve_hold")
    rng = random.Random(f"{exporter_kind}-{hold}")
    threads = [
        threading.Thread(target=one_run, args=(tracer, duration, rng.uniform(0, spread)))
        for duration in durations
        for _ in range(runs)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    provider.shutdown()  # the LoopGuardSpanExporter judges what it holds at shutdown
    if service is not None:
        service.close()
    registry = guard.recorder.registry  # type: ignore[attr-defined]
    kept: dict[float, float] = {}
    for duration in durations:
        tool = f"t{duration:g}s"
        named = registry.get_sample_value(
            "loopguard_tool_calls_total", {"agent": f"a{duration:g}", "tool": tool}
        )
        none = registry.get_sample_value(
            "loopguard_tool_calls_total", {"agent": "none", "tool": tool}
        )
        total = (named or 0) + (none or 0)
        kept[duration] = (named or 0) / total if total else float("nan")
    lost = registry.get_sample_value("loopguard_trace_agents_lost_total", {})
    return {"kept": kept, "lost_metric": lost}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holds", default="2,6,11")
    parser.add_argument("--durations", default="1,3,8,20")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--spread", type=float, default=10.0)
    parser.add_argument(
        "--exporters",
        default="http,grpc",
        help="http, grpc (OTLP to serve) and/or loopguard (LoopGuardSpanExporter in process)",
    )
    args = parser.parse_args()
    holds = [float(h) for h in args.holds.split(",")]
    durations = [float(d) for d in args.durations.split(",")]
    delay = os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "5000 (default)")
    print(f"BatchSpanProcessor schedule delay: {delay} ms; {args.runs} runs per duration")
    results: dict[tuple[str, float], dict[str, object]] = {}

    def one(kind: str, hold: float) -> None:
        results[(kind, hold)] = measure(kind, hold, durations, args.runs, args.spread)

    workers = [
        threading.Thread(target=one, args=(kind, hold))
        for kind in args.exporters.split(",")
        for hold in holds
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    header = " | ".join(f"run {d:g} s" for d in durations)
    print(f"| exporter | hold | {header} | agents lost (metric) |")
    print("| --- | --- |" + " --- |" * (len(durations) + 1))
    for (kind, hold), result in sorted(results.items()):
        kept = result["kept"]
        assert isinstance(kept, dict)
        cells = " | ".join(f"{kept[d]:.0%} kept" for d in durations)
        print(f"| {kind} | {hold:g} s | {cells} | {result['lost_metric']} |")


if __name__ == "__main__":
    main()
