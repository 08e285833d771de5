"""What the guard reports: the :class:`Recorder` role and the one declaration of every metric.

Every metric is declared once, in :data:`METRICS` (DESIGN §7), with the label values known in
advance; the recorders (:mod:`.prometheus`, :mod:`.otel`) and the dashboards build from it.
Imports nothing beyond the standard library, :mod:`otel_loopguard.config`, the ``Action``
enum of :mod:`otel_loopguard._policy` and the cost sources of :mod:`otel_loopguard._prices`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final, Protocol

from .._policy import Action
from .._prices import COMPUTED, PROVIDER
from .._record import FrozenRecord
from ..config import Rule


class Recorder(Protocol):
    """Receives what the guard observed. Called on application threads; must not block or raise.

    A recorder without :meth:`store_error`, the cost methods (:meth:`model_call`,
    :meth:`loop_spend`, :meth:`avoided`) or :meth:`memory_hit` (one written before them) is not
    called for them."""

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        """A tracked tool-call attempt was counted (``repeated``: its args key was seen before)."""

    def wasted(self, agent: str | None, tool: str, seconds: float) -> None:
        """A repeated call finished after ``seconds``."""

    def decision(self, agent: str | None, tool: str, rule: str, action: str, count: int) -> None:
        """A non-allow decision was made (``action`` as detected, before the mode softened it)."""

    def stopped_run(self, agent: str | None, tool: str, rule: str) -> None:
        """A run was stopped: the first stop since the session's last user message or new run
        (or since it began), at a call of ``tool``, reached by ``rule``. Called once per run,
        also in ``observe`` mode, where later calls keep being decided stop."""

    def rescue(self, outcome: str) -> None:
        """A rescue was attempted: advice, cached, failed, budget or cooldown."""

    def evicted(self, reason: str) -> None:
        """A session was evicted: ttl or capacity."""

    def internal_error(self, where: str) -> None:
        """An exception was caught at ``where`` and a fallback taken."""

    def store_error(self, op: str) -> None:
        """The shared session store (Redis) failed at ``op`` (one of :data:`STORE_OPS`) and the
        decision was made as the policy's ``store_failure`` says."""

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
        """A model call's usage was counted for ``agent``: its tokens (``input_tokens``
        including the cache reads and writes, as the GenAI conventions count them) and its cost
        ``usd`` from ``source`` (one of :data:`COST_SOURCES`); ``usd`` is ``None`` when the
        model has no price (an unpriced call: its tokens are counted, its cost is not)."""

    def loop_spend(self, agent: str | None, tokens: int, usd: float) -> None:
        """A model turn of ``agent`` was found spent in a loop: its ``tokens`` and known cost."""

    def avoided(self, agent: str | None, tokens: int, usd: float) -> None:
        """A stop of ``agent``'s run avoided about ``tokens`` and ``usd`` more (an estimate)."""

    def memory_hit(self, agent: str | None) -> None:
        """A call of ``agent`` was reminded from memory: an earlier run's dead end."""


class NoopRecorder:
    """A recorder that records nothing (the default when metrics are off)."""

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        pass

    def wasted(self, agent: str | None, tool: str, seconds: float) -> None:
        pass

    def decision(self, agent: str | None, tool: str, rule: str, action: str, count: int) -> None:
        pass

    def stopped_run(self, agent: str | None, tool: str, rule: str) -> None:
        pass

    def rescue(self, outcome: str) -> None:
        pass

    def evicted(self, reason: str) -> None:
        pass

    def internal_error(self, where: str) -> None:
        pass

    def store_error(self, op: str) -> None:
        pass

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
        pass

    def loop_spend(self, agent: str | None, tokens: int, usd: float) -> None:
        pass

    def avoided(self, agent: str | None, tokens: int, usd: float) -> None:
        pass

    def memory_hit(self, agent: str | None) -> None:
        pass


# -- the one declaration of names --------------------------------------------------------------


class MetricKind(str, Enum):
    """How a metric aggregates; values are the Prometheus type names."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True, init=False, repr=False, eq=False)
class MetricSpec(FrozenRecord):
    """One metric: ``name`` is the OpenTelemetry instrument name; Prometheus adds ``_total`` to
    a counter's (:attr:`prometheus_name`), as OpenTelemetry's Prometheus exporters do."""

    name: str
    kind: MetricKind
    description: str
    labels: tuple[str, ...] = ()
    unit: str = "1"
    buckets: tuple[float, ...] = ()

    def __init__(
        self,
        name: str,
        kind: MetricKind,
        description: str,
        labels: tuple[str, ...] = (),
        unit: str = "1",
        buckets: tuple[float, ...] = (),
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "unit", unit)
        object.__setattr__(self, "buckets", buckets)

    @property
    def prometheus_name(self) -> str:
        return f"{self.name}_total" if self.kind is MetricKind.COUNTER else self.name


TOOL_CALLS: Final = MetricSpec(
    "loopguard_tool_calls",
    MetricKind.COUNTER,
    "Tracked tool-call attempts seen.",
    ("agent", "tool"),
    "{call}",
)
REPEATED_CALLS: Final = MetricSpec(
    "loopguard_repeated_calls",
    MetricKind.COUNTER,
    "Tracked tool-call attempts whose arguments were already seen in the progress epoch.",
    ("agent", "tool"),
    "{call}",
)
DECISIONS: Final = MetricSpec(
    "loopguard_decisions",
    MetricKind.COUNTER,
    "Non-allow decisions, by the action detected (before the mode softened it).",
    ("agent", "tool", "rule", "action"),
    "{decision}",
)
STOPPED_RUNS: Final = MetricSpec(
    "loopguard_stopped_runs",
    MetricKind.COUNTER,
    "Runs stopped, counted once per run (a run ends at a user message, a new run, or when its"
    " session is forgotten), by the tool and rule that stopped it; also in observe mode, where"
    " every later call of the run is another stop decision.",
    ("agent", "tool", "rule"),
    "{run}",
)
WASTED_SECONDS: Final = MetricSpec(
    "loopguard_wasted_seconds",
    MetricKind.COUNTER,
    "Seconds spent running repeated calls.",
    ("agent", "tool"),
    "s",
)
RESCUES: Final = MetricSpec(
    "loopguard_rescues",
    MetricKind.COUNTER,
    "Rescue attempts by outcome: advice, cached, failed, budget, cooldown.",
    ("outcome",),
    "{rescue}",
)
SESSIONS: Final = MetricSpec(
    "loopguard_sessions", MetricKind.GAUGE, "Sessions currently tracked.", (), "{session}"
)
SESSIONS_EVICTED: Final = MetricSpec(
    "loopguard_sessions_evicted",
    MetricKind.COUNTER,
    "Sessions forgotten, by reason: ttl (idle too long) or capacity (max_sessions).",
    ("reason",),
    "{session}",
)
INTERNAL_ERRORS: Final = MetricSpec(
    "loopguard_internal_errors",
    MetricKind.COUNTER,
    "Exceptions caught on the hot path (the call was allowed), by where they happened.",
    ("where",),
    "{error}",
)
STORE_ERRORS: Final = MetricSpec(
    "loopguard_store_errors",
    MetricKind.COUNTER,
    "Failures of the shared session store (Redis), by operation: read, write, conflict (too many"
    " concurrent updates), decode (a stored state that could not be read, reset); the decision"
    " was made as the policy's store_failure says.",
    ("op",),
    "{error}",
)
#: Counts are whole numbers: one bucket per count up to 20, so ``ceil(histogram_quantile(...))``
#: is the exact count there (a count n lies in the bucket (n-1, n], which linear interpolation
#: never leaves); above 20 the buckets are coarser and a quantile is only bounded by them.
DECISION_REPEAT_BUCKETS: Final = (*range(1, 21), 25, 30, 40, 50, 60, 80, 100)
DECISION_REPEATS: Final = MetricSpec(
    "loopguard_decision_repeats",
    MetricKind.HISTOGRAM,
    "Attempts of the call, as the rule counts them, when a non-allow decision was made.",
    ("action",),
    "{call}",
    tuple(float(bound) for bound in DECISION_REPEAT_BUCKETS),
)
REPEATED_CALL_SECONDS: Final = MetricSpec(
    "loopguard_repeated_call_seconds",
    MetricKind.HISTOGRAM,
    "Duration of each repeated call that ran.",
    (),
    "s",
    (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)

MODEL_TOKENS: Final = MetricSpec(
    "loopguard_model_tokens",
    MetricKind.COUNTER,
    "Tokens of model calls, by kind: input (read neither from nor into a cache), output,"
    " cache_read, cache_write; the four kinds add up to every token of the calls.",
    ("agent", "model", "kind"),
    "{token}",
)
MODEL_COST: Final = MetricSpec(
    "loopguard_model_cost_usd",
    MetricKind.COUNTER,
    "Cost of model calls in US dollars, by source: provider (the provider reported it) or"
    " computed (from the tokens at API prices). Calls of a model with no price add nothing"
    " here (loopguard_unpriced_model_calls_total).",
    ("agent", "model", "source"),
    "{USD}",
)
UNPRICED_MODEL_CALLS: Final = MetricSpec(
    "loopguard_unpriced_model_calls",
    MetricKind.COUNTER,
    "Model calls of a model with no price: their tokens are counted, their cost is not.",
    ("model",),
    "{call}",
)
LOOP_TOKENS: Final = MetricSpec(
    "loopguard_loop_tokens",
    MetricKind.COUNTER,
    "Tokens of model turns spent in loops: turns whose first tool call repeated an earlier call"
    " of the progress epoch.",
    ("agent",),
    "{token}",
)
LOOP_COST: Final = MetricSpec(
    "loopguard_loop_cost_usd",
    MetricKind.COUNTER,
    "Known cost in US dollars (provider-reported or computed) of model turns spent in loops.",
    ("agent",),
    "{USD}",
)
AVOIDED_TOKENS: Final = MetricSpec(
    "loopguard_avoided_tokens",
    MetricKind.COUNTER,
    "An estimate: tokens the stops avoided, the loop's mean tokens per turn times the calls"
    " refused because the run was stopped.",
    ("agent",),
    "{token}",
)
AVOIDED_COST: Final = MetricSpec(
    "loopguard_avoided_cost_usd",
    MetricKind.COUNTER,
    "An estimate: US dollars the stops avoided, the loop's mean known cost per turn times the"
    " calls refused because the run was stopped.",
    ("agent",),
    "{USD}",
)

MEMORY_HITS: Final = MetricSpec(
    "loopguard_memory_hits",
    MetricKind.COUNTER,
    "Calls reminded from memory: repeated with the outcome an earlier run of the same scope was"
    " denied or stopped for.",
    ("agent",),
    "{call}",
)
MEMORY_ENTRIES: Final = MetricSpec(
    "loopguard_memory_entries",
    MetricKind.GAUGE,
    "Dead ends remembered (every scope of the memory the guard uses; 0 without memory).",
    (),
    "{entry}",
)

#: Every metric the recorders export (DESIGN §7), declared once.
METRICS: Final = (
    TOOL_CALLS,
    REPEATED_CALLS,
    DECISIONS,
    STOPPED_RUNS,
    WASTED_SECONDS,
    RESCUES,
    SESSIONS,
    SESSIONS_EVICTED,
    INTERNAL_ERRORS,
    STORE_ERRORS,
    DECISION_REPEATS,
    REPEATED_CALL_SECONDS,
    MODEL_TOKENS,
    MODEL_COST,
    UNPRICED_MODEL_CALLS,
    LOOP_TOKENS,
    LOOP_COST,
    AVOIDED_TOKENS,
    AVOIDED_COST,
    MEMORY_HITS,
    MEMORY_ENTRIES,
)

#: Label values known in advance; their series are created at zero.
RULES: Final = tuple(rule.value for rule in Rule)
#: The actions a decision is reported with (allow never is). A stop after an earlier stop in the
#: epoch has no rule: it reports ``rule="none"``.
ACTIONS: Final = tuple(action.value for action in Action if action is not Action.ALLOW)
RESCUE_OUTCOMES: Final = ("advice", "cached", "failed", "budget", "cooldown")
EVICTION_REASONS: Final = ("ttl", "capacity")
#: Where the guard, the span processor and the span exporter catch exceptions
#: (``exporter.next``: the exporter chained after it raised).
ERROR_PLACES: Final = (
    "before_tool",
    "after_tool",
    "user_message",
    "new_run",
    "span_start",
    "advisor_callback",
    "span_processor.on_start",
    "span_processor.on_end",
    "span_processor.decision_span",
    "exporter.export",
    "exporter.next",
)
#: What the shared session store reports failing (``loopguard_store_errors_total{op}``).
STORE_OPS: Final = ("read", "write", "conflict", "decode")
#: Token kinds of ``loopguard_model_tokens_total{kind}``: ``input`` is the input read neither
#: from nor into a cache, so the kinds partition a call's tokens.
TOKEN_KINDS: Final = ("input", "output", "cache_read", "cache_write")


def token_counts(
    input_tokens: int, output_tokens: int, cache_read_tokens: int, cache_write_tokens: int
) -> tuple[int, int, int, int]:
    """A model call's tokens by :data:`TOKEN_KINDS`, which partition them: ``input`` is the
    uncached input (the input counts include the cached tokens), then output, cache reads,
    cache writes."""
    return (
        input_tokens - cache_read_tokens - cache_write_tokens,
        output_tokens,
        cache_read_tokens,
        cache_write_tokens,
    )


#: Where a cost came from (``loopguard_model_cost_usd_total{source}``).
COST_SOURCES: Final = (PROVIDER, COMPUTED)
NO_RULE: Final = "none"
NO_AGENT: Final = "none"
#: The ``model`` label of a model call whose telemetry named no model.
NO_MODEL: Final = "unknown"
