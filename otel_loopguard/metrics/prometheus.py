"""The Prometheus backend: :class:`PrometheusRecorder`, the metrics of :data:`~._spec.METRICS` in
a ``CollectorRegistry`` (a private one per guard by default), served by :mod:`._exposition`.

``prometheus_client`` is imported when a recorder is built, never at import.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from .._exemplars import current_call, exemplar_labels
from . import _exposition
from ._exposition import MetricsServer
from ._failsafe import Failures, session_reader
from ._labels import (
    DEFAULT_MAX_LABEL_VALUES,
    DEFAULT_MAX_SERIES,
    MAX_CACHED_PAIRS,
    OTHER,
    Bounded,
    check_max_label_values,
)
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
    SESSIONS,
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

__all__ = ["PrometheusRecorder", "SERIES_PER_MODEL_PAIR", "SERIES_PER_PAIR"]

#: Series one (agent, tool) label pair has: calls, repeats, wasted seconds, a decision series
#: for every rule x action and for a stop without a rule, and stopped runs by rule.
SERIES_PER_PAIR: Final = 3 + len(RULES) * len(ACTIONS) + 1 + len(RULES)
#: Series one (agent, model) label pair has: its tokens by kind and its cost by source.
SERIES_PER_MODEL_PAIR: Final = len(TOKEN_KINDS) + len(COST_SOURCES)
_OVERFLOW: Final = (OTHER, OTHER)


def _exemplar() -> dict[str, str] | None:
    """The exemplar of the call being counted (its trace and span id), or ``None``."""
    ids = current_call()
    return None if ids is None else exemplar_labels(ids)


class _Pair:
    """One (agent, tool) label pair: its per-call counts and its wasted-seconds child.

    The two counts bumped on every call are ``itertools.count`` objects: ``next()`` on one is
    a single C call, atomic under the GIL, several times cheaper than a locked counter child
    (see benchmarks/README.md). They are read at collection by :func:`_count_value`.
    """

    __slots__ = ("agent", "calls", "repeated", "repeated_exemplar", "tool", "wasted")

    def __init__(self, agent: str, tool: str, wasted: Any) -> None:
        self.agent = agent
        self.tool = tool
        self.calls = itertools.count()
        self.repeated = itertools.count()
        # The latest repeat's call (its exemplar's labels) and when it was counted.
        self.repeated_exemplar: tuple[dict[str, str], float] | None = None
        self.wasted = wasted


class _ModelPair:
    """One (agent, model) label pair: its token children by kind (in :data:`TOKEN_KINDS`'
    order) and its cost children by source."""

    __slots__ = ("agent", "cost", "model", "tokens")

    def __init__(self, agent: str, model: str, tokens: tuple[Any, ...], cost: dict[str, Any]):
        self.agent = agent
        self.model = model
        self.tokens = tokens
        self.cost = cost


class _AgentSpend:
    """One agent label's loop and avoided children: tokens and US dollars of each."""

    __slots__ = ("avoided_tokens", "avoided_usd", "loop_tokens", "loop_usd")

    def __init__(self, loop_tokens: Any, loop_usd: Any, avoided_tokens: Any, avoided_usd: Any):
        self.loop_tokens = loop_tokens
        self.loop_usd = loop_usd
        self.avoided_tokens = avoided_tokens
        self.avoided_usd = avoided_usd


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
        from prometheus_client.core import CounterMetricFamily, Exemplar

        calls = CounterMetricFamily(
            TOOL_CALLS.name, TOOL_CALLS.description, labels=TOOL_CALLS.labels
        )
        repeated = CounterMetricFamily(
            REPEATED_CALLS.name, REPEATED_CALLS.description, labels=REPEATED_CALLS.labels
        )
        for pair in pairs:
            calls.add_metric([pair.agent, pair.tool], _count_value(pair.calls))
            latest = pair.repeated_exemplar
            exemplar = None if latest is None else Exemplar(latest[0], 1.0, latest[1])
            repeated.add_metric(
                [pair.agent, pair.tool], _count_value(pair.repeated), exemplar=exemplar
            )
        return [calls, repeated]


class PrometheusRecorder:
    """Records the metrics of :data:`METRICS` in a Prometheus ``CollectorRegistry``.

    ``registry``: where to register (default: a new private one, :attr:`registry`; pass your own
    to expose them beside other metrics; registering twice in one registry raises ``ValueError``).
    ``max_label_values``: distinct agents, and separately tools, reported by name; the rest as
    ``other``. ``max_series``: the series of all (agent, tool) pairs together
    (:data:`SERIES_PER_PAIR` each) stay within it: once a new pair would pass it, the pair
    reports as (``other``, ``other``), room for which is kept. At least two pairs' worth. The
    series of all (agent, model) pairs (:data:`SERIES_PER_MODEL_PAIR` each: tokens by kind, cost
    by source) stay within it the same way, separately; models are bounded by
    ``max_label_values`` as agents are. Per agent (loop and avoided spend) and per model
    (unpriced calls) the series are bounded by the labels' bound.

    Series that exist at zero before anything happens: rescues by outcome, evictions by reason,
    internal errors by place, the repeat-count histogram by action; and, from the first call of
    each (agent, tool), or earlier from :meth:`declare_tools`, its calls, repeats, wasted
    seconds and a decision series for every rule and action; from an agent's first call or model
    call, its loop and avoided spend; from the first call of each (agent, model), its tokens of
    every kind, its cost from every source and the model's unpriced calls. (A counter that first
    appears at 3 shows no increase in ``rate()``; one declared before its first call shows every
    call.)

    Every method may be called from any thread and never raises: a failure is counted in
    :attr:`failures` and logged once per kind. Label children are cached per (agent, tool), so
    a call costs a dict lookup and one or two increments.
    """

    def __init__(
        self,
        registry: Any = None,
        *,
        max_label_values: int = DEFAULT_MAX_LABEL_VALUES,
        max_series: int = DEFAULT_MAX_SERIES,
    ) -> None:
        limit = check_max_label_values(max_label_values)
        if (
            isinstance(max_series, bool)
            or not isinstance(max_series, int)
            or max_series < 2 * SERIES_PER_PAIR
        ):
            raise ValueError(
                f"max_series: expected an integer >= {2 * SERIES_PER_PAIR}, got {max_series!r}"
            )
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry: Any = registry if registry is not None else CollectorRegistry()
        self.max_label_values = limit
        self.max_series = max_series
        # Pairs admitted by name, keeping room for the overflow pair.
        self._max_named_pairs = max_series // SERIES_PER_PAIR - 1
        self.failures = Failures()
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
                metrics[spec.name] = Counter(
                    spec.name, spec.description, spec.labels, registry=self.registry
                )
            elif spec.kind is MetricKind.GAUGE:
                metrics[spec.name] = Gauge(
                    spec.name, spec.description, spec.labels, registry=self.registry
                )
            else:
                metrics[spec.name] = Histogram(
                    spec.name,
                    spec.description,
                    spec.labels,
                    registry=self.registry,
                    buckets=spec.buckets,
                )
        metrics[SESSIONS.name].set_function(lambda: self._sessions())
        self._memory_entries: Callable[[], int] = lambda: 0
        metrics[MEMORY_ENTRIES.name].set_function(lambda: self._memory_entries())
        self._memory_hits = metrics[MEMORY_HITS.name]
        self.registry.register(_CallCounts(self._by_labels, self._lock))
        self._decisions = metrics[DECISIONS.name]
        self._stopped_runs = metrics[STOPPED_RUNS.name]
        self._wasted = metrics[WASTED_SECONDS.name]
        self._wasted_hist = metrics[REPEATED_CALL_SECONDS.name]
        self._agents = Bounded(limit, none=NO_AGENT)
        self._tools = Bounded(limit)
        self._rules = Bounded(0, RULES + (NO_RULE,))
        self._actions = Bounded(0, ACTIONS)
        self._outcomes = Bounded(0, RESCUE_OUTCOMES)
        self._reasons = Bounded(0, EVICTION_REASONS)
        self._places = Bounded(limit, ERROR_PLACES)
        self._repeats = {
            action: metrics[DECISION_REPEATS.name].labels(action) for action in ACTIONS + (OTHER,)
        }
        self._rescues = {o: metrics[RESCUES.name].labels(o) for o in RESCUE_OUTCOMES + (OTHER,)}
        self._evicted = {
            r: metrics[SESSIONS_EVICTED.name].labels(r) for r in EVICTION_REASONS + (OTHER,)
        }
        self._errors_metric = metrics[INTERNAL_ERRORS.name]
        self._errors = {p: self._errors_metric.labels(p) for p in ERROR_PLACES}
        self._decision_children: dict[tuple[object, ...], Any] = {}
        self._store_ops = Bounded(0, STORE_OPS)
        self._store_errors = {
            op: metrics[STORE_ERRORS.name].labels(op) for op in STORE_OPS + (OTHER,)
        }
        self._models = Bounded(limit, none=NO_MODEL)
        self._sources = Bounded(0, COST_SOURCES)
        self._max_named_model_pairs = max_series // SERIES_PER_MODEL_PAIR - 1
        self._model_tokens = metrics[MODEL_TOKENS.name]
        self._model_cost = metrics[MODEL_COST.name]
        self._unpriced_metric = metrics[UNPRICED_MODEL_CALLS.name]
        self._spend_metrics = tuple(
            metrics[spec.name] for spec in (LOOP_TOKENS, LOOP_COST, AVOIDED_TOKENS, AVOIDED_COST)
        )
        # (agent label, model label) -> its pair; raw (agent, model) -> the same pair, cached.
        self._model_by_labels: dict[tuple[str, str], _ModelPair] = {}
        self._model_pairs: dict[tuple[object, object], _ModelPair] = {}
        # agent label -> its loop and avoided children; raw agent -> the same, cached.
        self._spend_by_label: dict[str, _AgentSpend] = {}
        self._spend: dict[object, _AgentSpend] = {}
        # raw model -> its unpriced-calls child, cached.
        self._unpriced: dict[object, Any] = {}

    # -- Recorder ------------------------------------------------------------------------

    def observe_sessions(self, count: Callable[[], int]) -> None:
        """Read ``loopguard_sessions`` from ``count()`` at each collection."""
        self._sessions = session_reader(count)

    def observe_memory(self, count: Callable[[], int]) -> None:
        """Read ``loopguard_memory_entries`` from ``count()`` at each collection."""
        self._memory_entries = session_reader(count)

    def memory_hit(self, agent: str | None) -> None:
        try:
            self._memory_hits.labels(self._agents(agent)).inc()
        except Exception as exc:
            self.failures("memory_hit", exc)

    def declare_tools(self, tools: Iterable[str], agent: str | None = None) -> None:
        """Create the series of ``agent`` with each of ``tools`` at zero now, before their first
        call: calls, repeats, wasted seconds and every rule x action. Without it a pair's series
        appear at its first call with that call already counted, and ``increase()`` over the
        first scrapes misses it. Call it when an agent's tools are known (when it is built);
        the labels are bounded as for any call. Never raises."""
        try:
            for tool in tools:
                if self._pairs.get((agent, tool)) is None:
                    self._pair(agent, tool)
        except Exception as exc:
            self.failures("declare_tools", exc)

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        try:
            pair = self._pairs.get((agent, tool))
            if pair is None:
                pair = self._pair(agent, tool)
            next(pair.calls)
            if repeated:
                next(pair.repeated)
                ids = current_call()
                if ids is not None:
                    pair.repeated_exemplar = (exemplar_labels(ids), time.time())
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
            self._wasted_hist.observe(seconds, _exemplar())
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
                if len(self._decision_children) < MAX_CACHED_PAIRS:
                    self._decision_children[key] = child
            child.inc(1, _exemplar())
            self._repeats[self._actions(action)].observe(count)
        except Exception as exc:
            self.failures("decision", exc)

    def stopped_run(self, agent: str | None, tool: str, rule: str) -> None:
        try:
            pair = self._pairs.get((agent, tool)) or self._pair(agent, tool)
            self._stopped_runs.labels(pair.agent, pair.tool, self._rules(rule)).inc(1, _exemplar())
        except Exception as exc:
            self.failures("stopped_run", exc)

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

    def store_error(self, op: str) -> None:
        try:
            self._store_errors[self._store_ops(op)].inc()
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
            for child, count in zip(pair.tokens, counts):
                if count > 0:
                    child.inc(count)
            if usd is None:
                child = self._unpriced.get(model) or self._unpriced_child(model)
                child.inc()
            elif usd > 0 and math.isfinite(usd):
                label = self._sources(source)
                child = pair.cost.get(label)
                if child is None:
                    child = self._model_cost.labels(pair.agent, pair.model, label)
                child.inc(usd)
        except Exception as exc:
            self.failures("model_call", exc)

    def loop_spend(self, agent: str | None, tokens: int, usd: float) -> None:
        try:
            spend = self._spend.get(agent) or self._agent_spend(agent)
            if tokens > 0:
                spend.loop_tokens.inc(tokens)
            if usd > 0 and math.isfinite(usd):
                spend.loop_usd.inc(usd)
        except Exception as exc:
            self.failures("loop_spend", exc)

    def avoided(self, agent: str | None, tokens: int, usd: float) -> None:
        try:
            spend = self._spend.get(agent) or self._agent_spend(agent)
            if tokens > 0:
                spend.avoided_tokens.inc(tokens)
            if usd > 0 and math.isfinite(usd):
                spend.avoided_usd.inc(usd)
        except Exception as exc:
            self.failures("avoided", exc)

    # -- exposition ----------------------------------------------------------------------

    def exposition(self, accept: str | None = None) -> bytes:
        """The registry as ``/metrics`` serves it: in the format an ``Accept`` header asks for
        (OpenMetrics, with exemplars, when it names ``application/openmetrics-text``), the
        Prometheus text format otherwise (see :meth:`page` for the content type too)."""
        return _exposition.exposition(self.registry, accept)

    def page(self, accept: str | None = None) -> tuple[bytes, str]:
        """``/metrics``'s answer to a scraper whose ``Accept`` header is ``accept``: the body
        (:meth:`exposition`) and its ``Content-Type``."""
        return _exposition.exposition(self.registry, accept), _exposition.content_type(accept)

    def wsgi_app(self) -> Callable[..., Iterable[bytes]]:
        """A WSGI app serving the registry (mount it at ``/metrics`` in your own server)."""
        return _exposition.wsgi_app(self.registry)

    def asgi_app(self) -> Callable[..., Any]:
        """An ASGI app serving the registry (e.g. ``app.mount("/metrics", ...)`` in Starlette
        or FastAPI)."""
        return _exposition.asgi_app(self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1") -> MetricsServer:
        """Serve ``/metrics`` over HTTP from a daemon thread on ``addr`` (loopback by default;
        ``"0.0.0.0"`` to let other machines scrape). ``port=0`` picks a free port (see
        :attr:`MetricsServer.port`). Raises ``ValueError`` for a bad port, ``OSError`` when the
        address cannot be bound."""
        return _exposition.serve(self.registry, port, addr)

    # -- internals -----------------------------------------------------------------------

    def _pair(self, agent: object, tool: object) -> _Pair:
        """The pair of a new raw (agent, tool); a new label pair is created with every rule x
        action at zero."""
        agent_label, tool_label = self._agents(agent), self._tools(tool)
        with self._lock:
            pair = self._pairs.get((agent, tool)) or self._by_labels.get((agent_label, tool_label))
            if pair is None and len(self._by_labels) >= self._max_named_pairs:
                # The global series budget: every further pair is the overflow pair.
                agent_label, tool_label = _OVERFLOW
                pair = self._by_labels.get(_OVERFLOW)
            if pair is None:
                pair = _Pair(agent_label, tool_label, self._wasted.labels(agent_label, tool_label))
                for rule in RULES:
                    for action in ACTIONS:
                        self._decisions.labels(agent_label, tool_label, rule, action)
                    self._stopped_runs.labels(agent_label, tool_label, rule)
                self._decisions.labels(agent_label, tool_label, NO_RULE, "stop")
                self._by_labels[(agent_label, tool_label)] = pair
                self._spend_of_label(agent_label)
            if len(self._pairs) < MAX_CACHED_PAIRS:
                self._pairs[(agent, tool)] = pair
        return pair

    def _model_pair(self, agent: object, model: object) -> _ModelPair:
        """The pair of a new raw (agent, model); a new label pair is created with every token
        kind and cost source at zero, and so are its model's unpriced calls and its agent's
        loop and avoided spend."""
        agent_label, model_label = self._agents(agent), self._models(model)
        with self._lock:
            pair = self._model_pairs.get((agent, model)) or self._model_by_labels.get(
                (agent_label, model_label)
            )
            if pair is None and len(self._model_by_labels) >= self._max_named_model_pairs:
                agent_label, model_label = _OVERFLOW
                pair = self._model_by_labels.get(_OVERFLOW)
            if pair is None:
                tokens = tuple(
                    self._model_tokens.labels(agent_label, model_label, kind)
                    for kind in TOKEN_KINDS
                )
                cost = {
                    source: self._model_cost.labels(agent_label, model_label, source)
                    for source in COST_SOURCES
                }
                pair = _ModelPair(agent_label, model_label, tokens, cost)
                self._unpriced_metric.labels(model_label)
                self._model_by_labels[(agent_label, model_label)] = pair
                self._spend_of_label(agent_label)
            if len(self._model_pairs) < MAX_CACHED_PAIRS:
                self._model_pairs[(agent, model)] = pair
        return pair

    def _unpriced_child(self, model: object) -> Any:
        child = self._unpriced_metric.labels(self._models(model))
        if len(self._unpriced) < MAX_CACHED_PAIRS:
            self._unpriced[model] = child
        return child

    def _agent_spend(self, agent: object) -> _AgentSpend:
        label = self._agents(agent)
        with self._lock:
            spend = self._spend_of_label(label)
            if len(self._spend) < MAX_CACHED_PAIRS:
                self._spend[agent] = spend
        return spend

    def _spend_of_label(self, label: str) -> _AgentSpend:
        """The loop and avoided children of an agent label, created at zero (under the lock)."""
        spend = self._spend_by_label.get(label)
        if spend is None:
            spend = _AgentSpend(*(metric.labels(label) for metric in self._spend_metrics))
            self._spend_by_label[label] = spend
        return spend
