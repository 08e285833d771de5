"""Metrics: what the guard reports (the :class:`Recorder` role) and where it goes.

The guard calls a :class:`Recorder` outside its lock, on the thread of the hook or span that
caused the report. Implementations must not block or raise.

Every metric is declared once, in :data:`METRICS` (DESIGN §7). Two recorders build from that one
declaration: :class:`PrometheusRecorder` (a private ``CollectorRegistry`` per guard, served on
127.0.0.1 or mounted as a WSGI/ASGI app) and :class:`OpenTelemetryRecorder` (instruments of an
OpenTelemetry ``Meter``, for users who export metrics over OTLP). ``prometheus_client`` and
``opentelemetry`` are imported only when such a recorder is built, so ``import otel_loopguard``
stays light.

Label values are bounded: at most ``max_label_values`` distinct agents and as many tools are
reported by name, later ones as ``other``; so are values that look like identifiers (a UUID, 16
or more hex digits) or are longer than :data:`MAX_LABEL_CHARS`, so a trace id, session id or
argument never becomes a label even if a caller passes one. A call without an agent reports
``agent="none"``.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Protocol

from .config import Rule

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

__all__ = [
    "ACTIONS",
    "DEFAULT_MAX_LABEL_VALUES",
    "ERROR_PLACES",
    "EVICTION_REASONS",
    "MAX_LABEL_CHARS",
    "METRICS",
    "MetricKind",
    "MetricSpec",
    "MetricsServer",
    "NoopRecorder",
    "OTHER",
    "OpenTelemetryRecorder",
    "PrometheusRecorder",
    "RESCUE_OUTCOMES",
    "RULES",
    "Recorder",
    "SessionsObserved",
]

_log = logging.getLogger("otel_loopguard")


class Recorder(Protocol):
    """Receives what the guard observed. Called on application threads; must not block or raise."""

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        """A tracked tool-call attempt was counted (``repeated``: its args key was seen before)."""

    def wasted(self, agent: str | None, tool: str, seconds: float) -> None:
        """A repeated call finished after ``seconds``."""

    def decision(self, agent: str | None, tool: str, rule: str, action: str, count: int) -> None:
        """A non-allow decision was made (``action`` as detected, before the mode softened it)."""

    def rescue(self, outcome: str) -> None:
        """A rescue was attempted: advice, cached, failed, budget or cooldown."""

    def evicted(self, reason: str) -> None:
        """A session was evicted: ttl or capacity."""

    def internal_error(self, where: str) -> None:
        """An exception was caught at ``where`` and a fallback taken."""


class NoopRecorder:
    """A recorder that records nothing (the default when metrics are off)."""

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        pass

    def wasted(self, agent: str | None, tool: str, seconds: float) -> None:
        pass

    def decision(self, agent: str | None, tool: str, rule: str, action: str, count: int) -> None:
        pass

    def rescue(self, outcome: str) -> None:
        pass

    def evicted(self, reason: str) -> None:
        pass

    def internal_error(self, where: str) -> None:
        pass


class SessionsObserved(Protocol):
    """A recorder that reads the tracked-session count itself, at collection time (the guard
    never reports it on the hot path). The guard calls this once, when it is built."""

    def observe_sessions(self, count: Callable[[], int]) -> None:
        """Use ``count()`` (cheap, thread-safe, never raises) for ``loopguard_sessions``."""


# -- the one declaration of names --------------------------------------------------------------


class MetricKind(str, Enum):
    """How a metric aggregates; values are the Prometheus type names."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: ``name`` is the OpenTelemetry instrument name; Prometheus adds ``_total`` to
    a counter's (:attr:`prometheus_name`), as OpenTelemetry's Prometheus exporters do."""

    name: str
    kind: MetricKind
    description: str
    labels: tuple[str, ...] = ()
    unit: str = "1"
    buckets: tuple[float, ...] = ()

    @property
    def prometheus_name(self) -> str:
        return f"{self.name}_total" if self.kind is MetricKind.COUNTER else self.name


TOOL_CALLS: Final = MetricSpec(
    "loopguard_tool_calls", MetricKind.COUNTER, "Tracked tool-call attempts seen.",
    ("agent", "tool"), "{call}")
REPEATED_CALLS: Final = MetricSpec(
    "loopguard_repeated_calls", MetricKind.COUNTER,
    "Tracked tool-call attempts whose arguments were already seen in the progress epoch.",
    ("agent", "tool"), "{call}")
DECISIONS: Final = MetricSpec(
    "loopguard_decisions", MetricKind.COUNTER,
    "Non-allow decisions, by the action detected (before the mode softened it).",
    ("agent", "tool", "rule", "action"), "{decision}")
WASTED_SECONDS: Final = MetricSpec(
    "loopguard_wasted_seconds", MetricKind.COUNTER, "Seconds spent running repeated calls.",
    ("agent", "tool"), "s")
RESCUES: Final = MetricSpec(
    "loopguard_rescues", MetricKind.COUNTER,
    "Rescue attempts by outcome: advice, cached, failed, budget, cooldown.", ("outcome",),
    "{rescue}")
SESSIONS: Final = MetricSpec(
    "loopguard_sessions", MetricKind.GAUGE, "Sessions currently tracked.", (), "{session}")
SESSIONS_EVICTED: Final = MetricSpec(
    "loopguard_sessions_evicted", MetricKind.COUNTER,
    "Sessions forgotten, by reason: ttl (idle too long) or capacity (max_sessions).",
    ("reason",), "{session}")
INTERNAL_ERRORS: Final = MetricSpec(
    "loopguard_internal_errors", MetricKind.COUNTER,
    "Exceptions caught on the hot path (the call was allowed), by where they happened.",
    ("where",), "{error}")
DECISION_REPEATS: Final = MetricSpec(
    "loopguard_decision_repeats", MetricKind.HISTOGRAM,
    "Attempts of the call, as the rule counts them, when a non-allow decision was made.",
    ("action",), "{call}", (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 30, 40, 60, 100))
REPEATED_CALL_SECONDS: Final = MetricSpec(
    "loopguard_repeated_call_seconds", MetricKind.HISTOGRAM,
    "Duration of each repeated call that ran.", (), "s",
    (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))

#: Every metric the recorders export (DESIGN §7), declared once.
METRICS: Final = (TOOL_CALLS, REPEATED_CALLS, DECISIONS, WASTED_SECONDS, RESCUES, SESSIONS,
                  SESSIONS_EVICTED, INTERNAL_ERRORS, DECISION_REPEATS, REPEATED_CALL_SECONDS)

#: Label values known in advance; their series are created at zero.
RULES: Final = tuple(rule.value for rule in Rule)
#: The actions a decision is reported with (allow never is). A stop after an earlier stop in the
#: epoch has no rule: it reports ``rule="none"``.
ACTIONS: Final = ("remind", "deny", "rescue", "stop")
RESCUE_OUTCOMES: Final = ("advice", "cached", "failed", "budget", "cooldown")
EVICTION_REASONS: Final = ("ttl", "capacity")
#: Where the guard and the span processor catch exceptions.
ERROR_PLACES: Final = ("before_tool", "after_tool", "user_message", "new_run", "span_start",
                       "advisor_callback", "span_processor.on_start", "span_processor.on_end")
_NO_RULE: Final = "none"
_NO_AGENT: Final = "none"

#: The value reported for a label beyond its bound, or one that looks like an identifier.
OTHER: Final = "other"
#: Default bound on distinct agents (and, separately, tools) reported by name.
DEFAULT_MAX_LABEL_VALUES: Final = 100
#: Label values longer than this report as ``other``: names are short, payloads are not.
MAX_LABEL_CHARS: Final = 128
#: Raw (agent, tool) pairs whose label children are cached; beyond it they are looked up per call.
_MAX_CACHED_PAIRS: Final = 4096
_ID_LIKE: Final = re.compile(
    r"[0-9a-fA-F]{16,}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _check_max_label_values(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"max_label_values: expected a positive integer, got {value!r}")
    return value


class _Bounded:
    """Raw value -> label value: known values as themselves, then at most ``limit`` new ones,
    the rest (and anything id-like, overlong or not a string) as :data:`OTHER`.

    Lookups are a dict read; a new value is admitted under a lock. Values reported as ``other``
    are not remembered, so a stream of distinct ids never grows the table."""

    __slots__ = ("_limit", "_lock", "_map", "_none")

    def __init__(self, limit: int, known: Iterable[str] = (), none: str = OTHER) -> None:
        self._map: dict[object, str] = {value: value for value in known}
        self._limit = limit + len(self._map)
        self._lock = threading.Lock()
        self._none = none

    def __call__(self, raw: object) -> str:
        value = self._map.get(raw)
        return value if value is not None else self._admit(raw)

    def _admit(self, raw: object) -> str:
        if raw is None:
            return self._none
        if (type(raw) is not str or not raw or len(raw) > MAX_LABEL_CHARS
                or _ID_LIKE.search(raw) is not None):
            return OTHER
        with self._lock:
            if raw in self._map:
                return self._map[raw]
            if len(self._map) >= self._limit:
                return OTHER
            self._map[raw] = raw
        return raw


class _Failures:
    """A recorder's own failures: counted, logged once per kind, never raised."""

    def __init__(self) -> None:
        self.count = 0
        self._logged: set[str] = set()

    def __call__(self, where: str, exc: Exception) -> None:
        try:
            self.count += 1
            kind = f"{where}:{type(exc).__name__}"
            if kind not in self._logged:
                self._logged.add(kind)
                _log.error("loopguard metrics: %s failed (further such failures are counted,"
                           " not logged)", where, exc_info=exc)
        except Exception:  # pragma: no cover - logging itself failed; nothing left to do
            pass


def _session_reader(count: Callable[[], int]) -> Callable[[], int]:
    """``count`` wrapped so a failure reads as 0 (collection must not break a scrape)."""

    def read() -> int:
        try:
            return int(count())
        except Exception:
            return 0

    return read


# -- Prometheus --------------------------------------------------------------------------------


class _Pair:
    """One (agent, tool) label pair: its per-call counts and its wasted-seconds child.

    The two counts bumped on every call are ``itertools.count`` objects: ``next()`` on one is
    a single C call, atomic under the GIL, several times cheaper than a locked counter child
    (see benchmarks/README.md). They are read at collection by :func:`_count_value`.
    """

    __slots__ = ("agent", "calls", "repeated", "tool", "wasted")

    def __init__(self, agent: str, tool: str, wasted: Any) -> None:
        self.agent = agent
        self.tool = tool
        self.calls = itertools.count()
        self.repeated = itertools.count()
        self.wasted = wasted


def _count_value(counter: itertools.count[int]) -> int:
    """How far ``counter`` (started at 0, step 1) has counted, without advancing it: its repr
    is ``count(N)``."""
    return int(repr(counter)[6:-1])


class _CallCounts:
    """Collects ``loopguard_tool_calls_total`` and ``loopguard_repeated_calls_total`` from the
    pairs' counts at scrape time (copied under the lock, rendered outside it)."""

    def __init__(self, pairs: dict[tuple[str, str], _Pair], lock: threading.Lock) -> None:
        self._pairs = pairs
        self._lock = lock

    def describe(self) -> list[Any]:
        return self._families([])

    def collect(self) -> list[Any]:
        with self._lock:
            pairs = list(self._pairs.values())
        return self._families(pairs)

    @staticmethod
    def _families(pairs: list[_Pair]) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily

        calls = CounterMetricFamily(TOOL_CALLS.name, TOOL_CALLS.description,
                                    labels=TOOL_CALLS.labels)
        repeated = CounterMetricFamily(REPEATED_CALLS.name, REPEATED_CALLS.description,
                                       labels=REPEATED_CALLS.labels)
        for pair in pairs:
            calls.add_metric([pair.agent, pair.tool], _count_value(pair.calls))
            repeated.add_metric([pair.agent, pair.tool], _count_value(pair.repeated))
        return [calls, repeated]


class PrometheusRecorder:
    """Records the metrics of :data:`METRICS` in a Prometheus ``CollectorRegistry``.

    ``registry``: where to register (default: a new private one, :attr:`registry`; pass your own
    to expose them beside other metrics; registering twice in one registry raises ``ValueError``).
    ``max_label_values``: distinct agents, and separately tools, reported by name; the rest as
    ``other``.

    Series that exist at zero before anything happens: rescues by outcome, evictions by reason,
    internal errors by place, the repeat-count histogram by action; and, from the first call of
    each (agent, tool), its calls, repeats, wasted seconds and a decision series for every rule
    and action. (A counter that first appears at 3 shows no increase in ``rate()``.)

    Every method may be called from any thread and never raises: a failure is counted in
    :attr:`failures` and logged once per kind. Label children are cached per (agent, tool), so
    a call costs a dict lookup and one or two increments.
    """

    def __init__(self, registry: Any = None, *,
                 max_label_values: int = DEFAULT_MAX_LABEL_VALUES) -> None:
        limit = _check_max_label_values(max_label_values)
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry: Any = registry if registry is not None else CollectorRegistry()
        self.max_label_values = limit
        self.failures = _Failures()
        self._sessions: Callable[[], int] = lambda: 0
        metrics: dict[str, Any] = {}
        self._lock = threading.Lock()
        # (agent label, tool label) -> its pair; raw (agent, tool) -> the same pair, cached.
        self._by_labels: dict[tuple[str, str], _Pair] = {}
        self._pairs: dict[tuple[object, object], _Pair] = {}
        for spec in METRICS:
            if spec in (TOOL_CALLS, REPEATED_CALLS):
                continue  # counted per call without a lock: collected by _CallCounts
            if spec.kind is MetricKind.COUNTER:
                metrics[spec.name] = Counter(spec.name, spec.description, spec.labels,
                                             registry=self.registry)
            elif spec.kind is MetricKind.GAUGE:
                metrics[spec.name] = Gauge(spec.name, spec.description, spec.labels,
                                           registry=self.registry)
            else:
                metrics[spec.name] = Histogram(spec.name, spec.description, spec.labels,
                                               registry=self.registry, buckets=spec.buckets)
        metrics[SESSIONS.name].set_function(lambda: self._sessions())
        self.registry.register(_CallCounts(self._by_labels, self._lock))
        self._decisions = metrics[DECISIONS.name]
        self._wasted = metrics[WASTED_SECONDS.name]
        self._wasted_hist = metrics[REPEATED_CALL_SECONDS.name]
        self._agents = _Bounded(limit, none=_NO_AGENT)
        self._tools = _Bounded(limit)
        self._rules = _Bounded(0, RULES + (_NO_RULE,))
        self._actions = _Bounded(0, ACTIONS)
        self._outcomes = _Bounded(0, RESCUE_OUTCOMES)
        self._reasons = _Bounded(0, EVICTION_REASONS)
        self._places = _Bounded(limit, ERROR_PLACES)
        self._repeats = {action: metrics[DECISION_REPEATS.name].labels(action)
                         for action in ACTIONS + (OTHER,)}
        self._rescues = {o: metrics[RESCUES.name].labels(o) for o in RESCUE_OUTCOMES + (OTHER,)}
        self._evicted = {r: metrics[SESSIONS_EVICTED.name].labels(r)
                         for r in EVICTION_REASONS + (OTHER,)}
        self._errors_metric = metrics[INTERNAL_ERRORS.name]
        self._errors = {p: self._errors_metric.labels(p) for p in ERROR_PLACES}
        self._decision_children: dict[tuple[object, ...], Any] = {}

    # -- Recorder ------------------------------------------------------------------------

    def observe_sessions(self, count: Callable[[], int]) -> None:
        """Read ``loopguard_sessions`` from ``count()`` at each collection."""
        self._sessions = _session_reader(count)

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        try:
            pair = self._pairs.get((agent, tool))
            if pair is None:
                pair = self._pair(agent, tool)
            next(pair.calls)
            if repeated:
                next(pair.repeated)
        except Exception as exc:
            self.failures("tool_call", exc)

    def wasted(self, agent: str | None, tool: str, seconds: float) -> None:
        try:
            if not (seconds > 0 and math.isfinite(seconds)):
                return
            pair = self._pairs.get((agent, tool))
            if pair is None:
                pair = self._pair(agent, tool)
            pair.wasted.inc(seconds)
            self._wasted_hist.observe(seconds)
        except Exception as exc:
            self.failures("wasted", exc)

    def decision(self, agent: str | None, tool: str, rule: str, action: str, count: int) -> None:
        try:
            key = (agent, tool, rule, action)
            child = self._decision_children.get(key)
            if child is None:
                pair = self._pairs.get((agent, tool)) or self._pair(agent, tool)
                labels = (pair.agent, pair.tool, self._rules(rule), self._actions(action))
                child = self._decisions.labels(*labels)
                if len(self._decision_children) < _MAX_CACHED_PAIRS:
                    self._decision_children[key] = child
            child.inc()
            self._repeats[self._actions(action)].observe(count)
        except Exception as exc:
            self.failures("decision", exc)

    def rescue(self, outcome: str) -> None:
        try:
            self._rescues[self._outcomes(outcome)].inc()
        except Exception as exc:
            self.failures("rescue", exc)

    def evicted(self, reason: str) -> None:
        try:
            self._evicted[self._reasons(reason)].inc()
        except Exception as exc:
            self.failures("evicted", exc)

    def internal_error(self, where: str) -> None:
        try:
            child = self._errors.get(where)
            if child is None:
                child = self._errors_metric.labels(self._places(where))
            child.inc()
        except Exception as exc:
            self.failures("internal_error", exc)

    # -- exposition ----------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format, as ``/metrics`` serves it."""
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))

    def wsgi_app(self) -> Callable[..., Iterable[bytes]]:
        """A WSGI app serving the registry (mount it at ``/metrics`` in your own server)."""
        from prometheus_client import make_wsgi_app

        return make_wsgi_app(self.registry)

    def asgi_app(self) -> Callable[..., Any]:
        """An ASGI app serving the registry (e.g. ``app.mount("/metrics", ...)`` in Starlette
        or FastAPI)."""
        from prometheus_client import make_asgi_app

        return make_asgi_app(self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1") -> MetricsServer:
        """Serve ``/metrics`` over HTTP from a daemon thread on ``addr`` (loopback by default;
        ``"0.0.0.0"`` to let other machines scrape). ``port=0`` picks a free port (see
        :attr:`MetricsServer.port`). Raises ``ValueError`` for a bad port, ``OSError`` when the
        address cannot be bound."""
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(f"port: expected an integer from 0 to 65535, got {port!r}")
        if not isinstance(addr, str) or not addr:
            raise ValueError(f"addr: expected a host address, got {addr!r}")
        from prometheus_client import start_http_server

        server, thread = start_http_server(port, addr=addr, registry=self.registry)
        return MetricsServer(server, thread)

    # -- internals -----------------------------------------------------------------------

    def _pair(self, agent: object, tool: object) -> _Pair:
        """The pair of a new raw (agent, tool); a new label pair is created with every rule x
        action at zero."""
        agent_label, tool_label = self._agents(agent), self._tools(tool)
        with self._lock:
            pair = self._pairs.get((agent, tool)) or self._by_labels.get((agent_label, tool_label))
            if pair is None:
                pair = _Pair(agent_label, tool_label, self._wasted.labels(agent_label, tool_label))
                for rule in RULES:
                    for action in ACTIONS:
                        self._decisions.labels(agent_label, tool_label, rule, action)
                self._decisions.labels(agent_label, tool_label, _NO_RULE, "stop")
                self._by_labels[(agent_label, tool_label)] = pair
            if len(self._pairs) < _MAX_CACHED_PAIRS:
                self._pairs[(agent, tool)] = pair
        return pair


class MetricsServer:
    """A running ``/metrics`` HTTP server (see :meth:`PrometheusRecorder.serve`)."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        address = server.server_address
        self.host: str = str(address[0])
        self.port: int = int(address[1])

    @property
    def url(self) -> str:
        """Where to scrape, e.g. ``http://127.0.0.1:9464/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- OpenTelemetry -----------------------------------------------------------------------------


class OpenTelemetryRecorder:
    """Records the metrics of :data:`METRICS` as instruments of an OpenTelemetry ``Meter``
    (e.g. ``metrics.get_meter("otel_loopguard")`` under a ``MeterProvider`` exporting OTLP).

    Instrument names are :attr:`MetricSpec.name` (counters without ``_total``: a Prometheus
    exporter adds it, giving the same series as :class:`PrometheusRecorder`); histograms carry
    the same bucket boundaries as advice; ``loopguard_sessions`` is an observable gauge read at
    collection. Labels are bounded the same way. Never raises from a recording method.
    """

    def __init__(self, meter: Meter, *,
                 max_label_values: int = DEFAULT_MAX_LABEL_VALUES) -> None:
        limit = _check_max_label_values(max_label_values)
        if not hasattr(meter, "create_counter"):
            raise ValueError(f"meter: expected an OpenTelemetry Meter, got {type(meter).__name__}")
        from opentelemetry.metrics import CallbackOptions, Observation

        self.max_label_values = limit
        self.failures = _Failures()
        self._sessions: Callable[[], int] = lambda: 0

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(self._sessions())]

        instruments: dict[str, Any] = {}
        for spec in METRICS:
            if spec.kind is MetricKind.COUNTER:
                instruments[spec.name] = meter.create_counter(spec.name, spec.unit,
                                                              spec.description)
            elif spec.kind is MetricKind.GAUGE:
                instruments[spec.name] = meter.create_observable_gauge(
                    spec.name, [observe], spec.unit, spec.description)
            else:
                instruments[spec.name] = meter.create_histogram(
                    spec.name, spec.unit, spec.description,
                    explicit_bucket_boundaries_advisory=list(spec.buckets))
        self._calls = instruments[TOOL_CALLS.name]
        self._repeated = instruments[REPEATED_CALLS.name]
        self._decisions = instruments[DECISIONS.name]
        self._wasted = instruments[WASTED_SECONDS.name]
        self._wasted_hist = instruments[REPEATED_CALL_SECONDS.name]
        self._repeats = instruments[DECISION_REPEATS.name]
        self._rescues = instruments[RESCUES.name]
        self._evicted = instruments[SESSIONS_EVICTED.name]
        self._errors = instruments[INTERNAL_ERRORS.name]
        self._agents = _Bounded(limit, none=_NO_AGENT)
        self._tools = _Bounded(limit)
        self._rules = _Bounded(0, RULES + (_NO_RULE,))
        self._actions = _Bounded(0, ACTIONS)
        self._outcomes = _Bounded(0, RESCUE_OUTCOMES)
        self._reasons = _Bounded(0, EVICTION_REASONS)
        self._places = _Bounded(limit, ERROR_PLACES)
        self._pairs: dict[tuple[object, object], Mapping[str, str]] = {}
        self._lock = threading.Lock()
        for outcome in RESCUE_OUTCOMES:
            self._rescues.add(0, {"outcome": outcome})
        for reason in EVICTION_REASONS:
            self._evicted.add(0, {"reason": reason})
        for place in ERROR_PLACES:
            self._errors.add(0, {"where": place})

    def observe_sessions(self, count: Callable[[], int]) -> None:
        """Read ``loopguard_sessions`` from ``count()`` at each collection."""
        self._sessions = _session_reader(count)

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        try:
            attributes = self._pairs.get((agent, tool)) or self._pair(agent, tool)
            self._calls.add(1, attributes)
            if repeated:
                self._repeated.add(1, attributes)
        except Exception as exc:
            self.failures("tool_call", exc)

    def wasted(self, agent: str | None, tool: str, seconds: float) -> None:
        try:
            if not (seconds > 0 and math.isfinite(seconds)):
                return
            attributes = self._pairs.get((agent, tool)) or self._pair(agent, tool)
            self._wasted.add(seconds, attributes)
            self._wasted_hist.record(seconds)
        except Exception as exc:
            self.failures("wasted", exc)

    def decision(self, agent: str | None, tool: str, rule: str, action: str, count: int) -> None:
        try:
            pair = self._pairs.get((agent, tool)) or self._pair(agent, tool)
            bounded_action = self._actions(action)
            self._decisions.add(1, {**pair, "rule": self._rules(rule), "action": bounded_action})
            self._repeats.record(count, {"action": bounded_action})
        except Exception as exc:
            self.failures("decision", exc)

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

    def _pair(self, agent: object, tool: object) -> Mapping[str, str]:
        attributes = {"agent": self._agents(agent), "tool": self._tools(tool)}
        with self._lock:
            known = self._pairs.get((agent, tool))
            if known is not None:
                return known
            for rule in RULES:
                for action in ACTIONS:
                    self._decisions.add(0, {**attributes, "rule": rule, "action": action})
            self._decisions.add(0, {**attributes, "rule": _NO_RULE, "action": "stop"})
            self._calls.add(0, attributes)
            self._repeated.add(0, attributes)
            self._wasted.add(0, attributes)
            if len(self._pairs) < _MAX_CACHED_PAIRS:
                self._pairs[(agent, tool)] = attributes
        return attributes
