"""Cost metrics (issue 24, item 4): model tokens by kind, cost by source, unpriced calls, loop
spend and the avoided estimate, in the Prometheus and the OpenTelemetry recorders alike, within
the series budget, through the hook API and the span processor."""

from __future__ import annotations

import math
import subprocess
from collections import defaultdict
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import TracerProvider

from otel_loopguard import PRESETS, Action, LoopGuard, LoopGuardSpanProcessor
from otel_loopguard.metrics import (
    COST_SOURCES,
    OTHER,
    TOKEN_KINDS,
    NoopRecorder,
    OpenTelemetryRecorder,
    PrometheusRecorder,
)
from otel_loopguard.metrics.prometheus import SERIES_PER_MODEL_PAIR

from .prometheus_tools import require_tool

DEFAULT = PRESETS["default"]
TOKENS = "loopguard_model_tokens_total"
COST = "loopguard_model_cost_usd_total"
UNPRICED = "loopguard_unpriced_model_calls_total"
LOOP_TOKENS = "loopguard_loop_tokens_total"
LOOP_COST = "loopguard_loop_cost_usd_total"
AVOIDED_TOKENS = "loopguard_avoided_tokens_total"
AVOIDED_COST = "loopguard_avoided_cost_usd_total"
PER_AGENT = (LOOP_TOKENS, LOOP_COST, AVOIDED_TOKENS, AVOIDED_COST)

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def value(recorder: PrometheusRecorder, name: str, **labels: str) -> float | None:
    found: float | None = recorder.registry.get_sample_value(name, labels)
    return found


def prometheus_series(recorder: PrometheusRecorder, names: set[str]) -> Series:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in recorder.registry.collect()
        for sample in family.samples
        if sample.name in names
    }


def otel_series(reader: InMemoryMetricReader, names: set[str]) -> Series:
    """The reader's points as the Prometheus series they become (a counter gains ``_total``)."""
    data = reader.get_metrics_data()
    assert data is not None
    found: Series = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                name = metric.name + "_total"
                if name not in names:
                    continue
                for point in metric.data.data_points:
                    assert isinstance(point, NumberDataPoint)
                    attributes = point.attributes or {}
                    labels = tuple(sorted((k, str(v)) for k, v in attributes.items()))
                    found[(name, labels)] = point.value
    return found


COST_NAMES = {TOKENS, COST, UNPRICED, *PER_AGENT}


def both() -> tuple[PrometheusRecorder, OpenTelemetryRecorder, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("otel_loopguard")
    return (
        PrometheusRecorder(max_label_values=3),
        OpenTelemetryRecorder(meter, max_label_values=3),
        reader,
    )


# -- the recorders ------------------------------------------------------------------------------


def test_token_kinds_partition_the_calls_tokens_and_cost_keeps_its_source() -> None:
    recorder = PrometheusRecorder()
    # 1,000 input tokens of which 400 read from the cache and 100 written to it, 50 output.
    recorder.model_call("coder", "gpt-4o", 1000, 50, 400, 100, 0.004, "computed")
    recorder.model_call("coder", "gpt-4o", 10, 5, 0, 0, 0.25, "provider")
    kinds = {
        kind: value(recorder, TOKENS, agent="coder", model="gpt-4o", kind=kind)
        for kind in TOKEN_KINDS
    }
    assert kinds == {"input": 510, "output": 55, "cache_read": 400, "cache_write": 100}
    assert sum(v or 0 for v in kinds.values()) == 1000 + 50 + 10 + 5  # every token, once
    assert value(recorder, COST, agent="coder", model="gpt-4o", source="computed") == 0.004
    assert value(recorder, COST, agent="coder", model="gpt-4o", source="provider") == 0.25
    assert value(recorder, UNPRICED, model="gpt-4o") == 0  # exists at zero, never counted


def test_an_unpriced_call_counts_its_tokens_never_a_cost() -> None:
    recorder = PrometheusRecorder()
    recorder.model_call("coder", "in-house-7b", 120, 30, 0, 0, None, None)
    recorder.model_call(None, None, 1, 1, 0, 0, None, None)
    assert value(recorder, UNPRICED, model="in-house-7b") == 1
    assert value(recorder, UNPRICED, model="unknown") == 1  # a call that named no model
    assert value(recorder, TOKENS, agent="none", model="unknown", kind="input") == 1
    assert value(recorder, TOKENS, agent="coder", model="in-house-7b", kind="output") == 30
    for source in COST_SOURCES:
        assert value(recorder, COST, agent="coder", model="in-house-7b", source=source) == 0


def test_loop_and_avoided_spend_per_agent_exist_at_zero_from_the_agents_first_call() -> None:
    recorder = PrometheusRecorder()
    recorder.tool_call("coder", "grep", False)
    recorder.model_call("planner", "gpt-4o", 1, 1, 0, 0, 0.0, "computed")
    for agent in ("coder", "planner"):
        for name in PER_AGENT:
            assert value(recorder, name, agent=agent) == 0, (agent, name)
    recorder.loop_spend("coder", 1100, 0.02)
    recorder.loop_spend("coder", 1100, 0.02)
    recorder.avoided("coder", 3300, 0.06)
    assert value(recorder, LOOP_TOKENS, agent="coder") == 2200
    assert value(recorder, LOOP_COST, agent="coder") == pytest.approx(0.04)
    assert value(recorder, AVOIDED_TOKENS, agent="coder") == 3300
    assert value(recorder, AVOIDED_COST, agent="coder") == pytest.approx(0.06)
    assert value(recorder, LOOP_COST, agent="planner") == 0


def test_the_avoided_metric_says_it_is_an_estimate() -> None:
    exposition = PrometheusRecorder().exposition().decode()
    for name in ("loopguard_avoided_cost_usd", "loopguard_avoided_tokens"):
        (help_line,) = [
            line for line in exposition.splitlines() if line.startswith(f"# HELP {name}_total ")
        ]
        assert "estimate" in help_line, help_line


@pytest.mark.parametrize(
    "call",
    [
        ("a", "m", -5, 3, 0, 0, 1.0, "computed"),
        ("a", "m", 3, 3, 5, 5, math.nan, "computed"),
        ("a", "m", 3, 3, 0, 0, -1.0, "provider"),
        ("a", "m", 3, 3, 0, 0, math.inf, "provider"),
        ("a", "m", "3", 3, 0, 0, 1.0, "computed"),
        ("a", "m", 3, 3, 0, 0, "1.0", "computed"),
        ("a", "m", 3, 3, 0, 0, 1.0, "invented"),
    ],
)
def test_bad_values_never_raise_nor_count_a_made_up_cost(call: tuple[Any, ...]) -> None:
    prometheus, otel, _ = both()
    for recorder in (prometheus, otel):
        recorder.model_call(*call)
        recorder.loop_spend("a", call[2], call[6])
        recorder.avoided("a", call[2], call[6])
    for name, labels in [
        (COST, {"agent": "a", "model": "m", "source": "computed"}),
        (COST, {"agent": "a", "model": "m", "source": "provider"}),
        (LOOP_COST, {"agent": "a"}),
        (AVOIDED_COST, {"agent": "a"}),
    ]:
        got = value(prometheus, name, **labels) or 0.0
        assert got == 0 or (got == 1.0 and call[6] == 1.0), (name, got)
    # A source we do not know is reported as other, never as a known one.
    if call[7] == "invented":
        assert value(prometheus, COST, agent="a", model="m", source=OTHER) == 1.0
    for name in (TOKENS, LOOP_TOKENS, AVOIDED_TOKENS):
        assert all(v >= 0 for v in prometheus_series(prometheus, {name}).values())


def test_both_recorders_give_the_same_series() -> None:
    prometheus, otel, reader = both()
    calls: list[tuple[Any, ...]] = [
        ("coder", "gpt-4o", 1000, 50, 400, 100, 0.004, "computed"),
        ("coder", "gpt-4o", 10, 5, 0, 0, 0.25, "provider"),
        ("coder", "in-house-7b", 120, 30, 0, 0, None, None),
        (None, None, 7, 3, 0, 0, None, None),
        ("4bf92f3577b34da6a3ce929d0e0e4736", "claude-sonnet-4-5", 9, 9, 0, 9, 0.5, "computed"),
        # past max_label_values=3 named models ("unknown" aside): the model label is other
        ("coder", "gemini-2.5-pro", 1, 1, 0, 0, 0.001, "computed"),
        ("coder", "o3", 2, 2, 0, 0, 0.002, "computed"),
    ]
    for recorder in (prometheus, otel):
        for call in calls:
            recorder.model_call(*call)
        recorder.loop_spend("coder", 1100, 0.02)
        recorder.avoided("coder", 2200, 0.04)
        recorder.loop_spend(None, 10, 0.0)
    ours = prometheus_series(prometheus, COST_NAMES)
    theirs = otel_series(reader, COST_NAMES)
    assert ours.keys() == theirs.keys()
    for key, number in ours.items():
        assert theirs[key] == pytest.approx(number), key
    models = {dict(labels)["model"] for name, labels in ours if name == TOKENS}
    assert models == {"gpt-4o", "in-house-7b", "claude-sonnet-4-5", "unknown", OTHER}
    agents = {dict(labels)["agent"] for name, labels in ours if name == LOOP_COST}
    assert agents == {"coder", "none", OTHER}


def test_the_model_pairs_stay_within_the_series_budget() -> None:
    budget = 10 * SERIES_PER_MODEL_PAIR
    recorder = PrometheusRecorder(max_label_values=200, max_series=max(budget, 1000))
    budget = recorder.max_series
    for agent in range(40):
        for model in range(40):
            recorder.model_call(f"agent{agent}", f"model{model}", 10, 1, 0, 0, 0.001, "computed")
    series = prometheus_series(recorder, {TOKENS, COST})
    assert budget - SERIES_PER_MODEL_PAIR < len(series) <= budget
    tokens: dict[tuple[str, str], float] = defaultdict(float)
    for (name, labels), number in series.items():
        if name == TOKENS:
            found = dict(labels)
            tokens[(found["agent"], found["model"])] += number
    assert sum(tokens.values()) == 40 * 40 * 11  # every token counted, the overflow as other
    assert tokens[(OTHER, OTHER)] == 11 * (40 * 40 - (len(tokens) - 1))


def test_promtool_accepts_the_cost_metrics(tmp_path: Any) -> None:
    promtool = require_tool("promtool")
    recorder = PrometheusRecorder()
    recorder.model_call("coder", "gpt-4o", 1000, 50, 400, 100, 0.004, "computed")
    recorder.model_call("coder", "in-house-7b", 1, 1, 0, 0, None, None)
    recorder.loop_spend("coder", 10, 0.01)
    recorder.avoided("coder", 10, 0.01)
    result = subprocess.run(
        [promtool, "check", "metrics"], input=recorder.exposition(), capture_output=True, timeout=60
    )
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


# -- through the guard ----------------------------------------------------------------------------


def test_the_hook_apis_model_call_reaches_the_metrics_with_its_source() -> None:
    recorder = PrometheusRecorder()
    guard = LoopGuard(
        DEFAULT.replace(prices={"in-house-*": {"input": 2, "output": 8}}), recorder=recorder
    )
    table = guard.model_call(
        {"model": "in-house-7b", "input_tokens": 1000, "output_tokens": 100},
        session="s",
        agent="coder",
    )
    provider = guard.model_call(
        {"model": "gpt-4o", "input_tokens": 10, "output_tokens": 1, "reported_cost_usd": 0.5},
        session="s",
        agent="coder",
    )
    database = guard.model_call(
        {"model": "gpt-4o", "input_tokens": 1000, "output_tokens": 100, "cache_read_tokens": 400},
        session="s",
        agent="coder",
    )
    nobody = guard.model_call(
        {"model": "nobody-knows-1", "input_tokens": 5}, session="s", agent="coder"
    )
    assert table is not None and table.usd == pytest.approx(0.0028)
    assert provider is not None and provider.source == "provider"
    assert database is not None and database.usd == pytest.approx(0.003)
    assert nobody is not None and nobody.usd is None
    assert value(
        recorder, COST, agent="coder", model="in-house-7b", source="computed"
    ) == pytest.approx(0.0028)
    assert value(recorder, COST, agent="coder", model="gpt-4o", source="provider") == 0.5
    assert value(recorder, COST, agent="coder", model="gpt-4o", source="computed") == pytest.approx(
        0.003
    )
    assert value(recorder, UNPRICED, model="nobody-knows-1") == 1
    assert value(recorder, TOKENS, agent="coder", model="gpt-4o", kind="cache_read") == 400
    assert value(recorder, TOKENS, agent="coder", model="gpt-4o", kind="input") == 610
    # Bad usage is a counted skip, never a metric.
    guard.model_call({"model": "gpt-4o", "input_tokens": -1}, session="s", agent="coder")
    assert guard.skipped_model_calls == {"input_tokens": 1}
    assert value(recorder, TOKENS, agent="coder", model="gpt-4o", kind="input") == 610


class RaisingOnModelCalls(NoopRecorder):
    def model_call(self, *args: object) -> None:
        raise RuntimeError("metrics backend down")


def test_a_recorder_that_raises_keeps_the_spend_and_counts_an_internal_error() -> None:
    guard = LoopGuard(DEFAULT, recorder=RaisingOnModelCalls())
    cost = guard.model_call(
        {"model": "m", "input_tokens": 5, "reported_cost_usd": 0.1}, session="s"
    )
    assert cost is not None and cost.usd == 0.1
    spend = guard.spend("s")
    assert spend is not None and spend.provider_usd == 0.1
    assert guard.internal_errors == {"model_call": 1}


class WrittenBeforeCost:
    """A recorder of the protocol as it was before the cost methods (a plain class)."""

    def __init__(self) -> None:
        self.calls = 0
        self.stops = 0
        self.sessions: Any = None

    def observe_sessions(self, count: Any) -> None:
        self.sessions = count

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        self.calls += 1

    def wasted(self, agent: str | None, tool: str, seconds: float) -> None:
        pass

    def decision(self, agent: str | None, tool: str, rule: str, action: str, count: int) -> None:
        pass

    def stopped_run(self, agent: str | None, tool: str, rule: str) -> None:
        self.stops += 1

    def rescue(self, outcome: str) -> None:
        pass

    def evicted(self, reason: str) -> None:
        pass

    def internal_error(self, where: str) -> None:
        pass


def test_a_recorder_written_before_the_cost_methods_is_not_called_for_them() -> None:
    """As for store_error: a recorder without the cost methods keeps working, and so does the
    guard (a loop with model turns is still stopped, with no internal error)."""
    old = WrittenBeforeCost()
    guard = LoopGuard(DEFAULT, recorder=old)  # type: ignore[arg-type]
    actions = []
    for _ in range(12):
        guard.model_call(TURN_WITH_COST, session="s", agent="coder")
        actions.append(guard.before_tool("search", {"q": "x"}, session="s", agent="coder").action)
    assert Action.STOP in actions
    assert guard.internal_errors == {}
    assert (old.calls, old.stops) == (12, 1)
    assert old.sessions is not None and old.sessions() == 1  # still handed the session count
    assert guard.recorder.calls == 12  # type: ignore[attr-defined]
    spend = guard.spend("s", agent="coder")
    assert spend is not None and spend.loop_turns == 11


def test_a_recorder_written_before_the_cost_methods_still_hears_of_store_errors() -> None:
    class WithStoreErrors(WrittenBeforeCost):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def store_error(self, op: str) -> None:
            self.ops.append(op)

    old = WithStoreErrors()
    # Nothing listens on port 1: the read fails, the call is decided as store_failure says.
    policy = DEFAULT.replace(store="redis://127.0.0.1:1", store_timeout_seconds=0.2)
    guard = LoopGuard(policy, recorder=old)  # type: ignore[arg-type]
    assert guard.before_tool("grep", {"q": 1}, session="s").action is Action.ALLOW
    assert old.ops == ["read"] and guard.internal_errors == {}


TURN_WITH_COST = {
    "model": "gpt-4o",
    "input_tokens": 1000,
    "output_tokens": 100,
    "reported_cost_usd": 0.01,
}


def _model_span(
    tracer: Any, model: str, input_tokens: int, output_tokens: int, **extra: Any
) -> None:
    with tracer.start_as_current_span(
        f"chat {model}",
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": input_tokens,
            "gen_ai.usage.output_tokens": output_tokens,
            **extra,
        },
    ):
        pass


def _tool_span(tracer: Any, tool: str, arguments: str, n: int) -> None:
    with tracer.start_as_current_span(
        f"execute_tool {tool}",
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": f"call_{n}",
            "gen_ai.tool.call.arguments": arguments,
        },
    ) as span:
        span.set_attribute("gen_ai.tool.call.result", "no matches")


def looping_run(recorder: Any, turns: int = 12) -> LoopGuard:
    """An agent whose model spans report usage asks for the same search ``turns`` times."""
    guard = LoopGuard(DEFAULT, recorder=recorder)
    provider = TracerProvider()
    provider.add_span_processor(LoopGuardSpanProcessor(guard, tracer_provider=provider))
    emit_looping_run(provider, turns)
    provider.shutdown()
    return guard


def emit_looping_run(provider: TracerProvider, turns: int = 12) -> None:
    tracer = provider.get_tracer("agent")
    with tracer.start_as_current_span(
        "invoke_agent coder",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "coder",
            "gen_ai.conversation.id": "conversation-1",
        },
    ):
        for n in range(turns):
            _model_span(
                tracer, "gpt-4o", 1000, 100, **{"gen_ai.usage.cache_read.input_tokens": 400}
            )
            _tool_span(tracer, "search", '{"q": "flaky"}', n)
        _model_span(tracer, "in-house-7b", 50, 5)


def test_model_spans_through_the_processor_fill_the_token_and_cost_counters() -> None:
    recorder = PrometheusRecorder()
    guard = looping_run(recorder)
    kinds = {
        kind: value(recorder, TOKENS, agent="coder", model="gpt-4o", kind=kind)
        for kind in TOKEN_KINDS
    }
    assert kinds == {
        "input": 12 * 600,
        "output": 12 * 100,
        "cache_read": 12 * 400,
        "cache_write": 0,
    }
    # genai-prices' gpt-4o: $2.50 input, $1.25 cached input, $10 output per million tokens.
    assert value(recorder, COST, agent="coder", model="gpt-4o", source="computed") == pytest.approx(
        12 * (600 * 2.5 + 400 * 1.25 + 100 * 10) / 1e6
    )
    assert value(recorder, UNPRICED, model="in-house-7b") == 1
    assert value(recorder, TOKENS, agent="coder", model="in-house-7b", kind="input") == 50
    # Every turn after the first asked for the same search: 11 turns spent in the loop.
    assert value(recorder, LOOP_TOKENS, agent="coder") == 11 * 1100
    assert value(recorder, LOOP_COST, agent="coder") == pytest.approx(
        11 * (600 * 2.5 + 400 * 1.25 + 100 * 10) / 1e6
    )
    assert guard.internal_errors == {}


@pytest.mark.slow
def test_serve_counts_what_the_processor_counts(tmp_path: Any) -> None:
    """The same spans through the span processor and, over OTLP/HTTP, through a real serve give
    the same cost metrics."""
    from .service_tools import require_serve_prerequisites, wait_for

    require_serve_prerequisites()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from otel_loopguard.service import ServeOptions, Service

    served = PrometheusRecorder()
    options = ServeOptions(http_port=0, grpc_port=0, hold_seconds=60.0)
    service = Service(options, guard=LoopGuard(DEFAULT, recorder=served)).start()
    try:
        local = PrometheusRecorder()
        in_process = LoopGuard(DEFAULT, recorder=local)
        provider = TracerProvider()
        provider.add_span_processor(LoopGuardSpanProcessor(in_process, tracer_provider=provider))
        url = f"http://127.0.0.1:{service.http_port}/v1/traces"
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=url, timeout=10)))
        emit_looping_run(provider)
        provider.shutdown()
        assert wait_for(lambda: service.processed_spans > 0)
        assert service.wait_idle(10)
        ours = prometheus_series(local, COST_NAMES)
        assert ours[(LOOP_TOKENS, (("agent", "coder"),))] == 11 * 1100
        wait_for(lambda: prometheus_series(served, COST_NAMES) == ours)
        theirs = prometheus_series(served, COST_NAMES)
        assert {k: (v, theirs.get(k)) for k, v in ours.items() if theirs.get(k) != v} == {}
        assert theirs.keys() == ours.keys()
    finally:
        service.close(timeout=10)


def test_the_loop_metrics_follow_the_sessions_loop_spend() -> None:
    """The loop and avoided counters say what the session's spend says (once the core reports
    them: loop_spend and avoided)."""
    recorder = PrometheusRecorder()
    guard = LoopGuard(DEFAULT, recorder=recorder)
    actions = []
    for _ in range(12):
        guard.model_call(
            {
                "model": "gpt-4o",
                "input_tokens": 1000,
                "output_tokens": 100,
                "reported_cost_usd": 0.01,
            },
            session="s",
            agent="coder",
        )
        actions.append(guard.before_tool("search", {"q": "x"}, session="s", agent="coder").action)
    assert Action.STOP in actions
    spend = guard.spend("s", agent="coder")
    assert spend is not None and spend.loop_turns == 11
    assert value(recorder, LOOP_TOKENS, agent="coder") == spend.loop_tokens == 11 * 1100
    assert value(recorder, LOOP_COST, agent="coder") == pytest.approx(spend.loop_usd)
    tokens, usd = spend.avoided()
    assert tokens > 0
    assert value(recorder, AVOIDED_TOKENS, agent="coder") == tokens
    assert value(recorder, AVOIDED_COST, agent="coder") == pytest.approx(usd)
