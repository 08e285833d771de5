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
    DECISION_REPEATS,
    DECISIONS,
    ERROR_PLACES,
    EVICTION_REASONS,
    INTERNAL_ERRORS,
    METRICS,
    NO_AGENT,
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
    TOOL_CALLS,
    WASTED_SECONDS,
    MetricKind,
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

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(self._sessions())]

        instruments: dict[str, Any] = {}
        for spec in METRICS:
            if spec.kind is MetricKind.COUNTER:
                instruments[spec.name] = meter.create_counter(
                    spec.name, spec.unit, spec.description
                )
            elif spec.kind is MetricKind.GAUGE:
                instruments[spec.name] = meter.create_observable_gauge(
                    spec.name, [observe], spec.unit, spec.description
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

    def observe_sessions(self, count: Callable[[], int]) -> None:
        """Read ``loopguard_sessions`` from ``count()`` at each collection."""
        self._sessions = session_reader(count)

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
