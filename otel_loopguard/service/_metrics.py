"""The metrics of ``serve`` itself (the guard's own are in :mod:`otel_loopguard.metrics`), served
on ``/metrics`` beside the guard's from the same Prometheus registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from otel_loopguard.metrics import MetricKind, MetricSpec

from ._decisions import DECISION_ENDPOINTS

__all__ = [
    "DECISION_REQUESTS",
    "INGEST_QUEUE_SPANS",
    "OTLP_REQUESTS",
    "OTLP_SPANS",
    "OUTCOMES",
    "SERVICE_METRICS",
    "STATE_ERRORS",
    "TRACE_AGENTS_LOST",
    "TRACE_FLUSHES_EARLY",
    "ServiceMetrics",
]

OTLP_SPANS: Final = MetricSpec(
    "loopguard_otlp_spans",
    MetricKind.COUNTER,
    "Spans received over OTLP, by result: accepted, rejected (bad data), throttled (queue full);"
    " duplicate: accepted, then dropped as a span already received (an exporter's retry).",
    ("result",),
    "{span}",
)
OTLP_REQUESTS: Final = MetricSpec(
    "loopguard_otlp_requests",
    MetricKind.COUNTER,
    "OTLP export requests, by transport (http, grpc) and outcome: ok, partial, bad_request,"
    " too_large, throttled (ingest queue full), over_budget (request bytes in flight past"
    " max_inflight_bytes), unauthorized, unsupported, unavailable (draining, or the state"
    " directory cannot be written), error.",
    ("transport", "outcome"),
    "{request}",
)
TRACE_FLUSHES_EARLY: Final = MetricSpec(
    "loopguard_trace_flushes_early",
    MetricKind.COUNTER,
    "Tool spans judged before their trace's root arrived, by reason: time (hold_seconds passed;"
    " counted per trace flush) or capacity (max_buffered_spans; per trace).",
    ("reason",),
    "{flush}",
)
TRACE_AGENTS_LOST: Final = MetricSpec(
    "loopguard_trace_agents_lost",
    MetricKind.COUNTER,
    "Agent runs whose tool spans were judged before the agent span arrived (they count under"
    ' agent="none"): the exporters batch for longer than hold_seconds.',
    (),
    "{run}",
)
INGEST_QUEUE_SPANS: Final = MetricSpec(
    "loopguard_ingest_queue_spans",
    MetricKind.GAUGE,
    "Spans accepted and not yet fed to the guard.",
    (),
    "{span}",
)
DECISION_REQUESTS: Final = MetricSpec(
    "loopguard_decision_requests",
    MetricKind.COUNTER,
    "Decision API requests answered 200, by endpoint.",
    ("endpoint",),
    "{request}",
)
STATE_ERRORS: Final = MetricSpec(
    "loopguard_state_errors",
    MetricKind.COUNTER,
    "serve --state-dir: what failed, by what: log (a write failed: a batch or a decision"
    " answered 503, not applied), snapshot (the log is kept longer), damaged (a damaged"
    " stretch of the log found at a start: skipped, the good frames after it replayed).",
    ("what",),
    "{error}",
)
#: The service's own metrics, declared once; registered beside the guard's.
SERVICE_METRICS: Final = (
    OTLP_SPANS,
    OTLP_REQUESTS,
    TRACE_FLUSHES_EARLY,
    TRACE_AGENTS_LOST,
    INGEST_QUEUE_SPANS,
    DECISION_REQUESTS,
    STATE_ERRORS,
)
#: The outcomes of an OTLP request (``loopguard_otlp_requests_total{outcome}``).
OUTCOMES: Final = (
    "ok",
    "partial",
    "bad_request",
    "too_large",
    "throttled",
    "over_budget",
    "unauthorized",
    "unsupported",
    "unavailable",
    "error",
)


class ServiceMetrics:
    """The service's counters in the guard's Prometheus registry."""

    def __init__(self, registry: Any, queue_size: Callable[[], int]) -> None:
        from prometheus_client import Counter, Gauge

        self.spans = Counter(
            OTLP_SPANS.name, OTLP_SPANS.description, OTLP_SPANS.labels, registry=registry
        )
        self.requests = Counter(
            OTLP_REQUESTS.name, OTLP_REQUESTS.description, OTLP_REQUESTS.labels, registry=registry
        )
        self.flushes = Counter(
            TRACE_FLUSHES_EARLY.name,
            TRACE_FLUSHES_EARLY.description,
            TRACE_FLUSHES_EARLY.labels,
            registry=registry,
        )
        self.agents_lost = Counter(
            TRACE_AGENTS_LOST.name, TRACE_AGENTS_LOST.description, registry=registry
        )
        self.decisions = Counter(
            DECISION_REQUESTS.name,
            DECISION_REQUESTS.description,
            DECISION_REQUESTS.labels,
            registry=registry,
        )
        self.state_errors = Counter(
            STATE_ERRORS.name, STATE_ERRORS.description, STATE_ERRORS.labels, registry=registry
        )
        for what in ("log", "snapshot", "damaged"):
            self.state_errors.labels(what)
        queue = Gauge(INGEST_QUEUE_SPANS.name, INGEST_QUEUE_SPANS.description, registry=registry)
        queue.set_function(queue_size)
        for result in ("accepted", "rejected", "throttled", "duplicate"):
            self.spans.labels(result)
        self.duplicates = self.spans.labels("duplicate")
        for transport in ("http", "grpc"):
            for outcome in OUTCOMES:
                self.requests.labels(transport, outcome)
        self.flush_time = self.flushes.labels("time")
        self.flush_capacity = self.flushes.labels("capacity")
        for endpoint in sorted(DECISION_ENDPOINTS):
            self.decisions.labels(endpoint)
