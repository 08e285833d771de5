"""Span processor overhead: a TracerProvider with LoopGuardSpanProcessor vs with a no-op processor.

    python benchmarks/bench_processor.py [--rounds 600] [--spans 50] [--warmup 20]
                                         [--clock wall|cpu] [--parts]
    python benchmarks/bench_processor.py --profile tool_strands   # cProfile of our provider

Two providers are built alike (default sampler, id generator and limits) with one span processor
each: ours (``LoopGuardSpanProcessor`` on a guard with the ``default`` preset, no metrics) or a
``SpanProcessor`` whose hooks do nothing. In each round both run the same batch of --spans spans,
one after the other, alternating which goes first; the round's per-span cost is the batch time
divided by --spans, and its ratio is ours / no-op. Reported: the median per-span cost of each
provider, the median of the per-round differences (overhead), and the median and quartiles of the
per-round ratios (the median ratio is the figure the targets are about). The garbage
collector stays on (our allocations are part of our cost); the first --warmup rounds are dropped.
``--clock cpu`` times each batch by the thread's CPU time (``time.thread_time_ns``) instead of
wall time: on a shared machine it leaves out the waits for a CPU, which wall time adds to one
side of a round at random. ``--parts`` adds a third provider, our processor on a guard whose
``decide_at_span_start``, ``after_tool`` and ``model_call`` return at once (allow, nothing): its
ratio is the processor's own cost, and the rest of ours is the guard's.

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
    set, then ended. The guard decides at the end;
  - "chat_usage": a model span as instrumentations end it: "chat" 's start attributes, then the
    response model, finish reasons and token usage set before the end (the guard's
    ``model_call``);
  - "agent_mix": the mixed agent workload of issue 29: turns of one model span with usage
    ("chat_usage") and two Pydantic AI-shaped tool spans; every 4th turn runs under a sub-agent
    (an ``invoke_agent`` span of its own, ended after its turn), so tool spans are under agent
    spans at two depths. The batch's spans are counted as spans (the sub-agent spans too).
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

from _results import record
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import Tracer

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard._policy import ALLOW, Decision
from otel_loopguard._prices import Cost
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
    prepared = [pydantic_tool(n) for n in range(spans)]

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


def usage_attributes(n: int) -> dict[str, Any]:
    """What a model span carries at its end: the response and its usage."""
    return {
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.response.finish_reasons": ("tool_calls",),
        "gen_ai.usage.input_tokens": 1200 + 40 * n,
        "gen_ai.usage.output_tokens": 60 + n % 7,
    }


def chat_usage_batch(spans: int) -> Batch:
    attributes = chat_attributes()
    ends = [usage_attributes(n) for n in range(spans)]

    def run(tracer: Tracer, agent: trace.Span, count: int) -> None:
        context = trace.set_span_in_context(agent)
        for usage in ends[:count]:
            span = tracer.start_span("chat gpt-4o", context=context, attributes=attributes)
            span.set_attributes(usage)
            span.end()

    return run


def pydantic_tool(n: int, agent: str = "weather_agent") -> tuple[str, dict[str, Any], str]:
    """The name, start attributes and result of a Pydantic AI tool span for call ``n``."""
    tool, arguments, result = tool_call(n)
    return (
        f"execute_tool {tool}",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": f"call_{n}",
            "gen_ai.tool.call.arguments": arguments,
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": "conv-123",
            "logfire.msg": f"running tool: {tool}",
        },
        result,
    )


#: One turn of "agent_mix": a model span, then two tool spans.
_TURN_TOOLS = 2


def mix_batch(spans: int) -> Batch:
    """Turns of a model span with usage and two tool spans; every 4th turn under a sub-agent.
    Exactly ``count`` spans per run (a sub-agent span counts when it starts; one the batch
    stops inside is ended after it)."""
    chat = chat_attributes()
    sub_agent = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "research_agent",
        "gen_ai.conversation.id": "conv-123",
    }
    # One step per span: ("agent", None) opens a sub-agent for the turn, ("chat", usage) and
    # ("tool", (name, attributes, result)) are spans of the turn, ("end", None) closes the
    # sub-agent (no span of its own).
    steps: list[tuple[str, Any]] = []
    made = calls = turn = 0
    while made < spans:
        sub = turn % 4 == 3
        if sub:
            steps.append(("agent", None))
        steps.append(("chat", usage_attributes(turn)))
        for _ in range(_TURN_TOOLS):
            steps.append(
                ("tool", pydantic_tool(calls, "research_agent" if sub else "weather_agent"))
            )
            calls += 1
        if sub:
            steps.append(("end", None))
        made += 1 + _TURN_TOOLS + sub
        turn += 1

    def run(tracer: Tracer, agent: trace.Span, count: int) -> None:
        top = context = trace.set_span_in_context(agent)
        runner: trace.Span | None = None
        made = 0
        for kind, data in steps:
            if kind == "end":
                if runner is not None:
                    runner.end()
                runner, context = None, top
                continue
            if made == count:
                break
            made += 1
            if kind == "tool":
                name, attributes, result = data
                span = tracer.start_span(name, context=context, attributes=attributes)
                span.set_attribute("gen_ai.tool.call.result", result)
                span.end()
            elif kind == "chat":
                span = tracer.start_span("chat gpt-4o", context=context, attributes=chat)
                span.set_attributes(data)
                span.end()
            else:
                runner = tracer.start_span(
                    "invoke_agent research_agent", context=top, attributes=sub_agent
                )
                context = trace.set_span_in_context(runner)
        if runner is not None:
            runner.end()

    return run


WORKLOADS: dict[str, Callable[[int], Batch]] = {
    "chat": chat_batch,
    "chat_usage": chat_usage_batch,
    "tool_pydantic": pydantic_batch,
    "tool_strands": strands_batch,
    "agent_mix": mix_batch,
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


class AnsweringGuard(LoopGuard):
    """A guard that answers the processor's calls at once (allow, nothing counted): with it,
    a provider's cost is the processor's own (--parts)."""

    def decide_at_span_start(
        self, tool: object, arguments: object, session: str, agent: str | None, call_id: str | None
    ) -> Decision:
        return ALLOW

    def after_tool(self, tool: str, arguments: object, **keys: Any) -> Decision | None:
        return None

    def model_call(self, usage: Any, **keys: Any) -> Cost | None:
        return None


def ours(guard_type: type[LoopGuard] = LoopGuard) -> tuple[TracerProvider, Tracer]:
    recorder = None
    if METRICS:
        from otel_loopguard.metrics import PrometheusRecorder

        recorder = PrometheusRecorder()
    guard = guard_type(PRESETS["default"], recorder=recorder)
    return provider_with(LoopGuardSpanProcessor(guard))


def noop() -> tuple[TracerProvider, Tracer]:
    return provider_with(SpanProcessor())  # the base class: every hook does nothing


#: The clock batches are timed by: wall time, or the thread's CPU time (--clock cpu).
CLOCK: Callable[[], int] = time.perf_counter_ns


def timed(tracer: Tracer, batch: Batch, spans: int) -> float:
    """Seconds per span for one batch under a fresh agent span."""
    agent = tracer.start_span("invoke_agent weather_agent", attributes=agent_attributes())
    clock = CLOCK
    started = clock()
    batch(tracer, agent, spans)
    elapsed = clock() - started
    agent.end()
    return elapsed / spans / 1e9


@dataclass(frozen=True)
class Result:
    ours: float  # median seconds per span, our provider
    base: float  # median seconds per span, no-op provider
    overhead: float  # median of the per-round differences, seconds per span
    ratio: float  # median of the per-round ratios
    ratio_iqr: tuple[float, float]  # quartiles of the per-round ratios
    own: float | None = None  # --parts: median ratio of the processor on an answering guard


def measure(workload: str, rounds: int, spans: int, warmup: int, parts: bool = False) -> Result:
    batch = WORKLOADS[workload](spans)
    tracers = [ours()[1], noop()[1]]
    if parts:
        tracers.append(ours(AnsweringGuard)[1])
    costs: list[list[float]] = [[] for _ in tracers]
    for index in range(warmup + rounds):
        # Each provider goes first in turn.
        shift = index % len(tracers)
        timings = [0.0] * len(tracers)
        for k in range(len(tracers)):
            which = (k + shift) % len(tracers)
            timings[which] = timed(tracers[which], batch, spans)
        if index >= warmup:
            for which, timing in enumerate(timings):
                costs[which].append(timing)
    our_costs, base_costs = costs[0], costs[1]
    ratios = [mine / base for mine, base in zip(our_costs, base_costs)]
    quartiles = statistics.quantiles(ratios, n=4)
    return Result(
        ours=statistics.median(our_costs),
        base=statistics.median(base_costs),
        overhead=statistics.median(mine - base for mine, base in zip(our_costs, base_costs)),
        ratio=statistics.median(ratios),
        ratio_iqr=(quartiles[0], quartiles[2]),
        own=statistics.median(own / base for own, base in zip(costs[2], base_costs))
        if parts
        else None,
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
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time batches by wall time (default) or by the thread's CPU time",
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="also run the processor on a guard that answers at once (its own cost)",
    )
    args = parser.parse_args()
    global METRICS, CLOCK
    METRICS = args.metrics
    CLOCK = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    if args.profile:
        profile(args.profile, args.rounds, args.spans)
        return 0
    print(
        f"python {platform.python_version()} ({platform.python_implementation()}) on"
        f" {platform.machine()}, {platform.system()}; {args.rounds} rounds x {args.spans} spans"
        f" per provider and workload, {args.warmup} warm-up rounds dropped;"
        f" metrics {'on' if METRICS else 'off'}; {args.clock} clock"
    )
    # A shared machine shows as load and as CPU time below wall time (waiting for a CPU).
    print(
        f"{'workload':14s} {'ours us/span':>12s} {'no-op us/span':>13s} {'overhead us':>11s}"
        f" {'ratio':>7s} {'ratio IQR':>13s} {'own':>7s} {'CPU/wall':>8s} {'load':>5s}"
    )
    for workload in args.workload or list(WORKLOADS):
        wall, cpu = time.perf_counter(), time.process_time()
        r = measure(workload, args.rounds, args.spans, args.warmup, args.parts)
        share = (time.process_time() - cpu) / (time.perf_counter() - wall)
        own = f"{r.own:6.3f}x" if r.own is not None else f"{'-':>7s}"
        print(
            f"{workload:14s} {r.ours * 1e6:12.2f} {r.base * 1e6:13.2f} {r.overhead * 1e6:11.2f}"
            f" {r.ratio:6.3f}x {r.ratio_iqr[0]:6.3f}-{r.ratio_iqr[1]:.3f} {own} {share:8.2f}"
            f" {os.getloadavg()[0]:5.1f}"
        )
        record(f"{workload}: ratio to a no-op processor", r.ratio, "x")
        if r.own is not None:
            record(f"{workload}: processor's own part, ratio", r.own, "x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
