"""The OpenTelemetry backend: :class:`OpenTelemetryRecorder`, the metrics of
:data:`~._spec.METRICS` as instruments of an OpenTelemetry ``Meter`` (for users who export
metrics over OTLP).

``opentelemetry`` is imported when a recorder is built, never at import.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .._exemplars import current_call
from ._failsafe import Failures, session_reader
from ._labels import DEFAULT_MAX_LABEL_VALUES, MAX_CACHED_PAIRS, Bounded, check_max_label_values
from ._spec import (
    ACTIONS,
    AVOIDED_COST,
    AVOIDED_TOKENS,
    COST_SOURCES,
    DECISION_REPEATS,
    DECISIONS,
    ERROR_PLACES,
    EVICTION_REASONS,
    INTERNAL_ERRORS,
    LOOP_COST,
    LOOP_TOKENS,
    MEMORY_ENTRIES,
    MEMORY_HITS,
    METRICS,
    MODEL_COST,
    MODEL_TOKENS,
    NO_AGENT,
    NO_MODEL,
    NO_RULE,
    REPEATED_CALL_SECONDS,
    REPEATED_CALLS,
    RESCUE_OUTCOMES,
    RESCUES,
    RULES,
    SESSIONS_EVICTED,
    STOPPED_RUNS,
    STORE_ERRORS,
    STORE_OPS,
    TOKEN_KINDS,
    TOOL_CALLS,
    UNPRICED_MODEL_CALLS,
    WASTED_SECONDS,
    MetricKind,
    token_counts,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

__all__ = ["OpenTelemetryRecorder"]


class OpenTelemetryRecorder:
    """Records the metrics of :data:`METRICS` as instruments of an OpenTelemetry ``Meter``
    (e.g. ``metrics.get_meter("otel_loopguard")`` under a ``MeterProvider`` exporting OTLP).

    Instrument names are :attr:`MetricSpec.name` (counters without ``_total``: a Prometheus
    exporter adds it, giving the same series as :class:`PrometheusRecorder`); histograms carry
    the same bucket boundaries as advice; ``loopguard_sessions`` is an observable gauge read at
    collection. Labels are bounded the same way. Never raises from a recording method.
    """

    def __init__(self, meter: Meter, *, max_label_values: int = DEFAULT_MAX_LABEL_VALUES) -> None:
        limit = check_max_label_values(max_label_values)
        if not hasattr(meter, "create_counter"):
            raise ValueError(f"meter: expected an OpenTelemetry Meter, got {type(meter).__name__}")
        from opentelemetry.metrics import CallbackOptions, Observation

        self.max_label_values = limit
        self.failures = Failures()
        self._sessions: Callable[[], int] = lambda: 0

        self._memory_entries: Callable[[], int] = lambda: 0

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(self._sessions())]

        def observe_memory(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(self._memory_entries())]

        instruments: dict[str, Any] = {}
        for spec in METRICS:
            if spec.kind is MetricKind.COUNTER:
                instruments[spec.name] = meter.create_counter(
                    spec.name, spec.unit, spec.description
                )
            elif spec.kind is MetricKind.GAUGE:
                instruments[spec.name] = meter.create_observable_gauge(
                    spec.name,
                    [observe_memory if spec is MEMORY_ENTRIES else observe],
                    spec.unit,
                    spec.description,
                )
            else:
                instruments[spec.name] = meter.create_histogram(
                    spec.name,
                    spec.unit,
                    spec.description,
                    explicit_bucket_boundaries_advisory=list(spec.buckets),
                )
        self._calls = instruments[TOOL_CALLS.name]
        self._repeated = instruments[REPEATED_CALLS.name]
        self._decisions = instruments[DECISIONS.name]
        self._stopped_runs = instruments[STOPPED_RUNS.name]
        self._wasted = instruments[WASTED_SECONDS.name]
        self._wasted_hist = instruments[REPEATED_CALL_SECONDS.name]
        self._repeats = instruments[DECISION_REPEATS.name]
        self._rescues = instruments[RESCUES.name]
        self._evicted = instruments[SESSIONS_EVICTED.name]
        self._errors = instruments[INTERNAL_ERRORS.name]
        self._store_errors = instruments[STORE_ERRORS.name]
        self._store_ops = Bounded(0, STORE_OPS)
        self._agents = Bounded(limit, none=NO_AGENT)
        self._tools = Bounded(limit)
        self._rules = Bounded(0, RULES + (NO_RULE,))
        self._actions = Bounded(0, ACTIONS)
        self._outcomes = Bounded(0, RESCUE_OUTCOMES)
        self._reasons = Bounded(0, EVICTION_REASONS)
        self._places = Bounded(limit, ERROR_PLACES)
        self._pairs: dict[tuple[object, object], Mapping[str, str]] = {}
        self._lock = threading.Lock()
        for outcome in RESCUE_OUTCOMES:
            self._rescues.add(0, {"outcome": outcome})
        for reason in EVICTION_REASONS:
            self._evicted.add(0, {"reason": reason})
        for place in ERROR_PLACES:
            self._errors.add(0, {"where": place})
        for op in STORE_OPS:
            self._store_errors.add(0, {"op": op})
        self._model_tokens = instruments[MODEL_TOKENS.name]
        self._model_cost = instruments[MODEL_COST.name]
        self._unpriced = instruments[UNPRICED_MODEL_CALLS.name]
        self._loop_tokens = instruments[LOOP_TOKENS.name]
        self._loop_usd = instruments[LOOP_COST.name]
        self._avoided_tokens = instruments[AVOIDED_TOKENS.name]
        self._avoided_usd = instruments[AVOIDED_COST.name]
        self._memory_hits = instruments[MEMORY_HITS.name]
        self._memory_hits.add(0, {"agent": NO_AGENT})  # the series exists before a first hit
        self._models = Bounded(limit, none=NO_MODEL)
        self._sources = Bounded(0, COST_SOURCES)
        # raw (agent, model) -> its attributes; raw agent -> its attributes; both cached.
        self._model_pairs: dict[tuple[object, object], Mapping[str, str]] = {}
        self._spend_agents: dict[object, Mapping[str, str]] = {}

    def observe_sessions(self, count: Callable[[], int]) -> None:
        """Read ``loopguard_sessions`` from ``count()`` at each collection."""
        self._sessions = session_reader(count)

    def observe_memory(self, count: Callable[[], int]) -> None:
        """Read ``loopguard_memory_entries`` from ``count()`` at each collection."""
        self._memory_entries = session_reader(count)

    def memory_hit(self, agent: str | None) -> None:
        try:
            self._memory_hits.add(1, {"agent": self._agents(agent)})
        except Exception as exc:
            self.failures("memory_hit", exc)

    def declare_tools(self, tools: Iterable[str], agent: str | None = None) -> None:
        """Record zero now for ``agent`` with each of ``tools`` (calls, repeats, wasted seconds,
        every rule x action), before their first call, as
        ``PrometheusRecorder.declare_tools`` does. Never raises."""
        try:
            for tool in tools:
                self._pair(agent, tool)
        except Exception as exc:
            self.failures("declare_tools", exc)

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        try:
            attributes = self._pairs.get((agent, tool)) or self._pair(agent, tool)
            self._calls.add(1, attributes)
            if repeated:
                self._repeated.add(1, attributes, _context())
        except Exception as exc:
            self.failures("tool_call", exc)

    def wasted(self, agent: str | None, tool: str, seconds: float) -> None:
        try:
            if not (seconds > 0 and math.isfinite(seconds)):
                return
            attributes = self._pairs.get((agent, tool)) or self._pair(agent, tool)
            self._wasted.add(seconds, attributes)
            self._wasted_hist.record(seconds, None, _context())
        except Exception as exc:
            self.failures("wasted", exc)

    def decision(self, agent: str | None, tool: str, rule: str, action: str, count: int) -> None:
        try:
            pair = self._pairs.get((agent, tool)) or self._pair(agent, tool)
            bounded_action = self._actions(action)
            labels = {**pair, "rule": self._rules(rule), "action": bounded_action}
            self._decisions.add(1, labels, _context())
            self._repeats.record(count, {"action": bounded_action})
        except Exception as exc:
            self.failures("decision", exc)

    def stopped_run(self, agent: str | None, tool: str, rule: str) -> None:
        try:
            pair = self._pairs.get((agent, tool)) or self._pair(agent, tool)
            self._stopped_runs.add(1, {**pair, "rule": self._rules(rule)}, _context())
        except Exception as exc:
            self.failures("stopped_run", exc)

    def rescue(self, outcome: str) -> None:
        try:
            self._rescues.add(1, {"outcome": self._outcomes(outcome)})
        except Exception as exc:
            self.failures("rescue", exc)

    def evicted(self, reason: str) -> None:
        try:
            self._evicted.add(1, {"reason": self._reasons(reason)})
        except Exception as exc:
            self.failures("evicted", exc)

    def internal_error(self, where: str) -> None:
        try:
            self._errors.add(1, {"where": self._places(where)})
        except Exception as exc:
            self.failures("internal_error", exc)

    def store_error(self, op: str) -> None:
        try:
            self._store_errors.add(1, {"op": self._store_ops(op)})
        except Exception as exc:
            self.failures("store_error", exc)

    def model_call(
        self,
        agent: str | None,
        model: str | None,
        input_tokens: int,
        output_tokens: int,
        cache_read_tokens: int,
        cache_write_tokens: int,
        usd: float | None,
        source: str | None,
    ) -> None:
        try:
            pair = self._model_pairs.get((agent, model)) or self._model_pair(agent, model)
            counts = token_counts(
                input_tokens, output_tokens, cache_read_tokens, cache_write_tokens
            )
            for kind, count in zip(TOKEN_KINDS, counts):
                if count > 0:
                    self._model_tokens.add(count, {**pair, "kind": kind})
            if usd is None:
                self._unpriced.add(1, {"model": pair["model"]})
            elif usd > 0 and math.isfinite(usd):
                self._model_cost.add(usd, {**pair, "source": self._sources(source)})
        except Exception as exc:
            self.failures("model_call", exc)

    def loop_spend(self, agent: str | None, tokens: int, usd: float) -> None:
        try:
            attributes = self._spend_agents.get(agent) or self._spend_agent(agent)
            if tokens > 0:
                self._loop_tokens.add(tokens, attributes)
            if usd > 0 and math.isfinite(usd):
                self._loop_usd.add(usd, attributes)
        except Exception as exc:
            self.failures("loop_spend", exc)

    def avoided(self, agent: str | None, tokens: int, usd: float) -> None:
        try:
            attributes = self._spend_agents.get(agent) or self._spend_agent(agent)
            if tokens > 0:
                self._avoided_tokens.add(tokens, attributes)
            if usd > 0 and math.isfinite(usd):
                self._avoided_usd.add(usd, attributes)
        except Exception as exc:
            self.failures("avoided", exc)

    def _model_pair(self, agent: object, model: object) -> Mapping[str, str]:
        """A new raw (agent, model): every token kind, cost source, the model's unpriced calls
        and the agent's loop and avoided spend recorded at zero."""
        attributes = {"agent": self._agents(agent), "model": self._models(model)}
        with self._lock:
            known = self._model_pairs.get((agent, model))
            if known is not None:
                return known
            for kind in TOKEN_KINDS:
                self._model_tokens.add(0, {**attributes, "kind": kind})
            for source in COST_SOURCES:
                self._model_cost.add(0, {**attributes, "source": source})
            self._unpriced.add(0, {"model": attributes["model"]})
            if len(self._model_pairs) < MAX_CACHED_PAIRS:
                self._model_pairs[(agent, model)] = attributes
        self._spend_agent(agent)
        return attributes

    def _spend_agent(self, agent: object) -> Mapping[str, str]:
        """A raw agent's attributes, its loop and avoided spend recorded at zero."""
        attributes = {"agent": self._agents(agent)}
        with self._lock:
            known = self._spend_agents.get(agent)
            if known is not None:
                return known
            for counter in (
                self._loop_tokens,
                self._loop_usd,
                self._avoided_tokens,
                self._avoided_usd,
            ):
                counter.add(0, attributes)
            if len(self._spend_agents) < MAX_CACHED_PAIRS:
                self._spend_agents[agent] = attributes
        return attributes

    def _pair(self, agent: object, tool: object) -> Mapping[str, str]:
        attributes = {"agent": self._agents(agent), "tool": self._tools(tool)}
        with self._lock:
            known = self._pairs.get((agent, tool))
            if known is not None:
                return known
            for rule in RULES:
                for action in ACTIONS:
                    self._decisions.add(0, {**attributes, "rule": rule, "action": action})
                self._stopped_runs.add(0, {**attributes, "rule": rule})
            self._decisions.add(0, {**attributes, "rule": NO_RULE, "action": "stop"})
            self._calls.add(0, attributes)
            self._repeated.add(0, attributes)
            self._wasted.add(0, attributes)
            if len(self._pairs) < MAX_CACHED_PAIRS:
                self._pairs[(agent, tool)] = attributes
        self._spend_agent(agent)
        return attributes


def _context() -> Any:
    """The OpenTelemetry context whose span is the call being counted, so that the SDK's
    exemplar filter (``trace_based`` by default: sampled spans) attaches its trace id and span id;
    ``None`` (the active context) when no span named the call (:mod:`.._exemplars`)."""
    ids = current_call()
    if ids is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    trace_id, span_id = ids
    span = NonRecordingSpan(SpanContext(trace_id, span_id, False, TraceFlags(TraceFlags.SAMPLED)))
    return trace.set_span_in_context(span)
