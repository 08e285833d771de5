"""Span exporter cost: the application thread with BatchSpanProcessor(LoopGuardSpanExporter()) vs
BatchSpanProcessor(no-op exporter), and the worker's throughput.

    python benchmarks/bench_exporter.py [--rounds 400] [--spans 50] [--busy-rounds 60]
                                        [--busy-spans 2048] [--batches 40] [--no-metrics]

Two providers are built alike (default sampler, id generator and limits; a
``BatchSpanProcessor`` with the SDK's defaults but for a queue large enough that no span is
dropped) with one exporter each: ours (``LoopGuardSpanExporter`` on a guard with the ``default``
preset, the Prometheus recorder on unless --no-metrics) or a ``SpanExporter`` that returns
SUCCESS. The workloads are bench_processor.py's (a plain ``chat`` span; Pydantic AI and Strands
tool spans, healthy calls), each batch under a fresh ``invoke_agent`` span. In each round both
providers run the same batch, one after the other, alternating which goes first; per-round
ratios are ours / no-op, and the medians are reported with the ratios' quartiles.

Application thread, two ways:
  - "quiet": --spans spans per round, timed; then, untimed, ``provider.force_flush()`` exports
    the queue on this thread (our exporter judges it there). The worker never runs during the
    timing: this is what the application thread itself does per span (create, end, enqueue).
  - "busy": --busy-spans spans per round in a tight loop; the worker wakes each time 512 spans
    are queued and exports alongside the application thread, so the time includes waiting for
    the GIL while the worker judges spans (the worst case: an application doing nothing but
    make spans; a real agent waits on its model most of the time, the GIL released). Reported as
    wall time and as the thread's CPU time (``time.thread_time``, which leaves the waits out).
Worker: --batches batches of 512 finished spans of each workload (recorded beforehand, runs of
one agent span and its spans, the agent span ending last) are given to ``export`` one after the
other on a fresh exporter; spans/s is 512 over the median batch time.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from _results import record
from bench_processor import WORKLOADS, Batch, agent_attributes
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard.exporter import LoopGuardSpanExporter

#: With --no-metrics the guard records nothing; by default into a Prometheus registry.
METRICS = True
#: The BatchSpanProcessor's queue: large enough that a busy round never drops a span.
QUEUE = 65_536
#: The worker's batch (the SDK's default max_export_batch_size).
EXPORT_BATCH = 512


class NoopExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class Counted(SpanExporter):
    """Counts the spans its exporter has finished exporting (both sides are wrapped alike)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        self.spans += len(spans)
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.inner.shutdown()


def guard() -> LoopGuard:
    recorder = None
    if METRICS:
        from otel_loopguard.metrics import PrometheusRecorder

        recorder = PrometheusRecorder()
    return LoopGuard(PRESETS["default"], recorder=recorder)


@dataclass
class Side:
    provider: TracerProvider
    tracer: Tracer
    exporter: Counted
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)


def side(exporter: SpanExporter) -> Side:
    counted = Counted(exporter)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(counted, max_queue_size=QUEUE))
    return Side(provider, provider.get_tracer("bench"), counted)


class Paced:
    """A tracer whose ``start_span`` first waits ``pause`` seconds with the GIL released, as an
    agent waits on its model between spans."""

    def __init__(self, tracer: Tracer, pause: float) -> None:
        self.tracer = tracer
        self.pause = pause

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        time.sleep(self.pause)
        return self.tracer.start_span(*args, **kwargs)


def timed(s: Side, batch: Batch, spans: int, pause: float = 0.0) -> tuple[float, float, float]:
    """(wall, thread CPU) seconds per span for one batch under a fresh agent span, and the share
    of its spans the worker had exported by the end of the batch."""
    agent = s.tracer.start_span("invoke_agent weather_agent", attributes=agent_attributes())
    tracer = cast(Tracer, Paced(s.tracer, pause)) if pause else s.tracer
    before = s.exporter.spans
    wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
    batch(tracer, agent, spans)
    cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
    share = (s.exporter.spans - before) / spans
    agent.end()
    return wall / spans / 1e9, cpu / spans / 1e9, share


@dataclass(frozen=True)
class Ratio:
    ours: float  # median seconds per span
    base: float
    overhead: float  # median of per-round differences, seconds per span
    ratio: float  # median of per-round ratios
    iqr: tuple[float, float]


def summary(ours: list[float], base: list[float]) -> Ratio:
    ratios = [mine / other for mine, other in zip(ours, base)]
    quartiles = statistics.quantiles(ratios, n=4)
    return Ratio(
        statistics.median(ours),
        statistics.median(base),
        statistics.median(mine - other for mine, other in zip(ours, base)),
        statistics.median(ratios),
        (quartiles[0], quartiles[2]),
    )


@dataclass(frozen=True)
class AppThread:
    wall: Ratio
    cpu: Ratio
    share: tuple[float, float]  # median share of a round's spans exported during it: ours, no-op


def app_thread(
    workload: str, rounds: int, spans: int, warmup: int, pause: float = 0.0
) -> AppThread:
    """The application thread, ours vs no-op."""
    batch = WORKLOADS[workload](spans)
    ours, base = side(LoopGuardSpanExporter(guard())), side(NoopExporter())

    def one(s: Side, keep: bool) -> None:
        wall, cpu, share = timed(s, batch, spans, pause)
        s.provider.force_flush()  # untimed: what is still queued, exported on this thread
        if keep:
            s.walls.append(wall)
            s.cpus.append(cpu)
            s.shares.append(share)

    for index in range(warmup + rounds):
        keep = index >= warmup
        first, second = (base, ours) if index % 2 else (ours, base)
        one(first, keep)
        one(second, keep)
    ours.provider.shutdown()
    base.provider.shutdown()
    return AppThread(
        summary(ours.walls, base.walls),
        summary(ours.cpus, base.cpus),
        (statistics.median(ours.shares), statistics.median(base.shares)),
    )


def recorded_batches(workload: str, batches: int, run_spans: int) -> list[list[ReadableSpan]]:
    """``batches`` lists of EXPORT_BATCH finished spans: runs of an agent span and
    ``run_spans`` spans under it, in the order they ended, with fresh trace ids."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    batch = WORKLOADS[workload](run_spans)
    while len(memory.get_finished_spans()) < batches * EXPORT_BATCH:
        agent = tracer.start_span("invoke_agent weather_agent", attributes=agent_attributes())
        batch(tracer, agent, run_spans)
        agent.end()
    spans = list(memory.get_finished_spans())
    return [
        spans[start : start + EXPORT_BATCH]
        for start in range(0, batches * EXPORT_BATCH, EXPORT_BATCH)
    ]


def worker(workload: str, batches: int, repeat: int) -> tuple[float, float]:
    """(spans/s, CPU spans/s): 512 over the median batch time, wall and CPU."""
    recorded = recorded_batches(workload, batches * repeat, 15)
    walls: list[float] = []
    cpus: list[float] = []
    for part in range(repeat):
        exporter = LoopGuardSpanExporter(guard())
        for spans in recorded[part * batches : (part + 1) * batches]:
            wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
            exporter.export(spans)
            cpus.append((time.thread_time_ns() - cpu) / 1e9)
            walls.append((time.perf_counter_ns() - wall) / 1e9)
        exporter.shutdown()
    return EXPORT_BATCH / statistics.median(walls), EXPORT_BATCH / statistics.median(cpus)


def line(workload: str, mode: str, what: str, r: Ratio, share: tuple[float, float]) -> str:
    return (
        f"{workload:14s} {mode:6s} {what:4s} {r.ours * 1e6:10.2f} {r.base * 1e6:10.2f}"
        f" {r.overhead * 1e6:8.2f} {r.ratio:6.3f}x {r.iqr[0]:6.3f}-{r.iqr[1]:.3f} {share[0]:6.0%} {share[1]:6.0%}"
        f" {os.getloadavg()[0]:5.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400, help="quiet rounds")
    parser.add_argument("--spans", type=int, default=50, help="spans per quiet round")
    parser.add_argument("--busy-rounds", type=int, default=60)
    parser.add_argument("--busy-spans", type=int, default=2048, help="spans per busy round")
    parser.add_argument("--paced-rounds", type=int, default=12)
    parser.add_argument("--paced-spans", type=int, default=1024, help="spans per paced round")
    parser.add_argument(
        "--pause-ms", type=float, default=0.5, help="paced: wait before each span (GIL released)"
    )
    parser.add_argument("--warmup", type=int, default=10, help="rounds dropped at the start")
    parser.add_argument("--batches", type=int, default=40, help="worker batches per repeat")
    parser.add_argument("--repeat", type=int, default=3, help="worker passes (fresh exporter)")
    parser.add_argument(
        "--workload", choices=sorted(WORKLOADS), action="append", help="only this workload"
    )
    parser.add_argument("--no-metrics", action="store_true", help="the guard records nothing")
    args = parser.parse_args()
    global METRICS
    METRICS = not args.no_metrics
    workloads: list[str] = args.workload or list(WORKLOADS)
    print(
        f"python {platform.python_version()} ({platform.python_implementation()}) on"
        f" {platform.machine()}, {platform.system()}, {os.cpu_count()} CPUs;"
        f" metrics {'on' if METRICS else 'off'}; quiet: {args.rounds} rounds x {args.spans} spans;"
        f" busy: {args.busy_rounds} rounds x {args.busy_spans} spans; paced:"
        f" {args.paced_rounds} rounds x {args.paced_spans} spans, {args.pause_ms} ms pause;"
        f" {args.warmup} warm-up rounds dropped (paced: 2); worker: {args.repeat} x {args.batches} batches of {EXPORT_BATCH}"
    )
    print(
        "application thread, us per span (medians; ratio = median of per-round ours/no-op;"
        " exported = median share of a round's spans the worker had exported by its end)"
    )
    print(
        f"{'workload':14s} {'mode':6s} {'time':4s} {'ours':>10s} {'no-op':>10s} {'overhead':>8s}"
        f" {'ratio':>7s}"
        f" {'ratio IQR':>13s} {'exported':>13s} {'load':>5s}"
    )
    runs: list[tuple[str, Callable[[str], AppThread]]] = [
        ("quiet", lambda w: app_thread(w, args.rounds, args.spans, args.warmup)),
        ("busy", lambda w: app_thread(w, args.busy_rounds, args.busy_spans, args.warmup)),
        (
            "paced",
            lambda w: app_thread(w, args.paced_rounds, args.paced_spans, 2, args.pause_ms / 1e3),
        ),
    ]
    for workload in workloads:
        for mode, run in runs:
            r = run(workload)
            print(line(workload, mode, "wall", r.wall, r.share))
            print(line(workload, mode, "CPU", r.cpu, r.share))
            record(f"{workload} {mode}: application thread, wall, ratio", r.wall.ratio, "x")
            record(f"{workload} {mode}: application thread, CPU, ratio", r.cpu.ratio, "x")
    print("worker: LoopGuardSpanExporter.export, spans per second (512 / median batch time)")
    print(f"{'workload':14s} {'spans/s':>10s} {'CPU spans/s':>12s} {'us/span':>8s} {'load':>5s}")
    for workload in workloads:
        rate, cpu_rate = worker(workload, args.batches, args.repeat)
        print(
            f"{workload:14s} {rate:10,.0f} {cpu_rate:12,.0f} {1e6 / rate:8.2f}"
            f" {os.getloadavg()[0]:5.1f}"
        )
        record(f"{workload}: worker spans/s", rate, "spans/s", better="higher")
    return 0


if __name__ == "__main__":
    sys.exit(main())
