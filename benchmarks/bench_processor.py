"""Span processor overhead: a TracerProvider with LoopGuardSpanProcessor vs with a no-op processor.

    python benchmarks/bench_processor.py [--rounds 600] [--spans 50] [--warmup 20]
    python benchmarks/bench_processor.py --profile tool_strands   # cProfile of our provider

Two providers are built alike (default sampler, id generator and limits) with one span processor
each: ours (``LoopGuardSpanProcessor`` on a guard with the ``default`` preset, no metrics) or a
``SpanProcessor`` whose hooks do nothing. In each round both run the same batch of --spans spans,
one after the other, alternating which goes first; the round's per-span cost is the batch time
divided by --spans, and its ratio is ours / no-op. Reported: the median per-span cost of each
provider, the median of the per-round differences (overhead), and the median and quartiles of the
per-round ratios (the median ratio is the figure the targets are about). The garbage
collector stays on (our allocations are part of our cost); the first --warmup rounds are dropped.

Workloads; every span is a child of an open ``invoke_agent`` span (a new agent run, so a new
session, each round), started with ``start_span`` and ended with ``end()`` (no context attach, the
cheapest SDK path, so the ratio is the strictest):
  - "chat": a non-tool span, ``chat gpt-4o`` with 6 GenAI attributes at start
    (operation, provider, request model, agent name, conversation id, server address);
  - "tool_pydantic": a Pydantic AI tool span: ``execute_tool <tool>`` started with the operation,
    tool name, call id, JSON arguments, agent name, conversation id and ``logfire.msg``; the
    result set before the end. The guard decides at start and adds the outcome at the end;
  - "tool_strands": a Strands tool span (OTel GenAI semconv with events): started bare, then
    operation, system, tool name and call id set just after the start, the arguments in a
    ``gen_ai.tool.message`` event and the result in a ``gen_ai.choice`` event, the tool status
    set, then ended. The guard decides at the end.
Tool calls are healthy work: distinct arguments, every 5th call repeats the one before (a
re-read), nothing trips the ladder.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import Tracer

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard.processor import LoopGuardSpanProcessor

TOOLS = ("search", "read_file", "get_weather")


def chat_attributes() -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.agent.name": "weather_agent",
        "gen_ai.conversation.id": "conv-123",
        "server.address": "api.openai.com",
    }


def tool_call(n: int) -> tuple[str, str, str]:
    """(tool, JSON arguments, result) of call ``n``: every 5th repeats the one before."""
    k = n - 1 if n % 5 == 4 else n
    tool = TOOLS[k % len(TOOLS)]
    arguments = json.dumps({"query": f"weather in city {k}", "limit": 10})
    return tool, arguments, f"results for city {k}: sunny"


Batch = Callable[[Tracer, trace.Span, int], None]


def chat_batch(spans: int) -> Batch:
    attributes = chat_attributes()

    def run(tracer: Tracer, agent: trace.Span, count: int) -> None:
        context = trace.set_span_in_context(agent)
        for _ in range(count):
            tracer.start_span("chat gpt-4o", context=context, attributes=attributes).end()

    return run


def pydantic_batch(spans: int) -> Batch:
    prepared = []
    for n in range(spans):
        tool, arguments, result = tool_call(n)
        prepared.append(
            (
                f"execute_tool {tool}",
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.id": f"call_{n}",
                    "gen_ai.tool.call.arguments": arguments,
                    "gen_ai.agent.name": "weather_agent",
                    "gen_ai.conversation.id": "conv-123",
                    "logfire.msg": f"running tool: {tool}",
                },
                result,
            )
        )

    def run(tracer: Tracer, agent: trace.Span, count: int) -> None:
        context = trace.set_span_in_context(agent)
        for name, attributes, result in prepared[:count]:
            span = tracer.start_span(name, context=context, attributes=attributes)
            span.set_attribute("gen_ai.tool.call.result", result)
            span.end()

    return run


def strands_batch(spans: int) -> Batch:
    prepared = []
    for n in range(spans):
        tool, arguments, result = tool_call(n)
        call_id = f"tooluse_{n}"
        prepared.append(
            (
                f"execute_tool {tool}",
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.system": "strands-agents",
                    "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.id": call_id,
                },
                {"role": "tool", "content": arguments, "id": call_id},
                {"message": json.dumps([{"text": result}]), "id": call_id},
            )
        )

    def run(tracer: Tracer, agent: trace.Span, count: int) -> None:
        context = trace.set_span_in_context(agent)
        for name, attributes, message, choice in prepared[:count]:
            span = tracer.start_span(name, context=context)
            span.set_attributes(attributes)
            span.add_event("gen_ai.tool.message", message)
            span.add_event("gen_ai.choice", choice)
            span.set_attribute("gen_ai.tool.status", "success")
            span.end()

    return run


WORKLOADS: dict[str, Callable[[int], Batch]] = {
    "chat": chat_batch,
    "tool_pydantic": pydantic_batch,
    "tool_strands": strands_batch,
}


def agent_attributes() -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "weather_agent",
        "gen_ai.conversation.id": "conv-123",
    }


def provider_with(processor: SpanProcessor) -> tuple[TracerProvider, Tracer]:
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return provider, provider.get_tracer("bench")


#: With --metrics, the guard records into a Prometheus registry, as a user scraping it would.
METRICS = False


def ours() -> tuple[TracerProvider, Tracer]:
    recorder = None
    if METRICS:
        from otel_loopguard.metrics import PrometheusRecorder

        recorder = PrometheusRecorder()
    guard = LoopGuard(PRESETS["default"], recorder=recorder)
    return provider_with(LoopGuardSpanProcessor(guard))


def noop() -> tuple[TracerProvider, Tracer]:
    return provider_with(SpanProcessor())  # the base class: every hook does nothing


def timed(tracer: Tracer, batch: Batch, spans: int) -> float:
    """Seconds per span for one batch under a fresh agent span."""
    agent = tracer.start_span("invoke_agent weather_agent", attributes=agent_attributes())
    started = time.perf_counter_ns()
    batch(tracer, agent, spans)
    elapsed = time.perf_counter_ns() - started
    agent.end()
    return elapsed / spans / 1e9


@dataclass(frozen=True)
class Result:
    ours: float  # median seconds per span, our provider
    base: float  # median seconds per span, no-op provider
    overhead: float  # median of the per-round differences, seconds per span
    ratio: float  # median of the per-round ratios
    ratio_iqr: tuple[float, float]  # quartiles of the per-round ratios


def measure(workload: str, rounds: int, spans: int, warmup: int) -> Result:
    batch = WORKLOADS[workload](spans)
    (_, our_tracer), (_, base_tracer) = ours(), noop()
    our_costs, base_costs = [], []
    for index in range(warmup + rounds):
        if index % 2:
            base = timed(base_tracer, batch, spans)
            mine = timed(our_tracer, batch, spans)
        else:
            mine = timed(our_tracer, batch, spans)
            base = timed(base_tracer, batch, spans)
        if index >= warmup:
            our_costs.append(mine)
            base_costs.append(base)
    ratios = [mine / base for mine, base in zip(our_costs, base_costs)]
    quartiles = statistics.quantiles(ratios, n=4)
    return Result(
        ours=statistics.median(our_costs),
        base=statistics.median(base_costs),
        overhead=statistics.median(mine - base for mine, base in zip(our_costs, base_costs)),
        ratio=statistics.median(ratios),
        ratio_iqr=(quartiles[0], quartiles[2]),
    )


def profile(workload: str, rounds: int, spans: int) -> None:
    batch = WORKLOADS[workload](spans)
    _, tracer = ours()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(rounds):
        timed(tracer, batch, spans)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--spans", type=int, default=50, help="spans per batch")
    parser.add_argument("--warmup", type=int, default=20, help="rounds dropped at the start")
    parser.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        action="append",
        help="run only this workload (repeatable)",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(WORKLOADS),
        help="profile our provider on this workload instead of timing",
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="the guard records Prometheus metrics (as issue 4 asks)",
    )
    args = parser.parse_args()
    global METRICS
    METRICS = args.metrics
    if args.profile:
        profile(args.profile, args.rounds, args.spans)
        return 0
    print(
        f"python {platform.python_version()} ({platform.python_implementation()}) on"
        f" {platform.machine()}, {platform.system()}; {args.rounds} rounds x {args.spans} spans"
        f" per provider and workload, {args.warmup} warm-up rounds dropped;"
        f" metrics {'on' if METRICS else 'off'}"
    )
    # A shared machine shows as load and as CPU time below wall time (waiting for a CPU).
    print(
        f"{'workload':14s} {'ours us/span':>12s} {'no-op us/span':>13s} {'overhead us':>11s}"
        f" {'ratio':>7s} {'ratio IQR':>13s} {'CPU/wall':>8s} {'load':>5s}"
    )
    for workload in args.workload or list(WORKLOADS):
        wall, cpu = time.perf_counter(), time.process_time()
        r = measure(workload, args.rounds, args.spans, args.warmup)
        share = (time.process_time() - cpu) / (time.perf_counter() - wall)
        print(
            f"{workload:14s} {r.ours * 1e6:12.2f} {r.base * 1e6:13.2f} {r.overhead * 1e6:11.2f}"
            f" {r.ratio:6.3f}x {r.ratio_iqr[0]:6.3f}-{r.ratio_iqr[1]:.3f} {share:8.2f}"
            f" {os.getloadavg()[0]:5.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
