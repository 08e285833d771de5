"""Metrics: what the guard reports (the :class:`Recorder` role) and where it goes.

The guard calls a :class:`Recorder` outside its lock, on the thread of the hook or span that
caused the report. Implementations must not block or raise. A recorder with an
``observe_sessions(count)`` method is handed a reader of the session count for
``loopguard_sessions`` (see :class:`~otel_loopguard._guard.LoopGuard`).

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

Everything public is importable from here. Modules (imports point down the list only):

- ``_spec``: the :class:`Recorder` protocol, :class:`NoopRecorder`, and the one declaration of
  metrics (:class:`MetricSpec`, :data:`METRICS`, one constant per metric) and known label values
- ``_labels``: bounded label values (:data:`OTHER`, :data:`MAX_LABEL_CHARS`)
- ``_failsafe``: a recorder's own failures, counted and logged once, never raised
- ``_exposition``: serving a registry: text format, WSGI/ASGI apps, :class:`MetricsServer`
- :mod:`.prometheus` (public): :class:`PrometheusRecorder`
- :mod:`.otel` (public): :class:`OpenTelemetryRecorder`
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from ._labels import DEFAULT_MAX_LABEL_VALUES, DEFAULT_MAX_SERIES, MAX_LABEL_CHARS, OTHER
from ._spec import (
    ACTIONS,
    COST_SOURCES,
    ERROR_PLACES,
    EVICTION_REASONS,
    METRICS,
    RESCUE_OUTCOMES,
    RULES,
    STORE_OPS,
    TOKEN_KINDS,
    MetricKind,
    MetricSpec,
    NoopRecorder,
    Recorder,
)

# One constant per metric (the dashboards build from them); reachable here, not in __all__.
from ._spec import AVOIDED_COST as AVOIDED_COST
from ._spec import AVOIDED_TOKENS as AVOIDED_TOKENS
from ._spec import DECISION_REPEATS as DECISION_REPEATS
from ._spec import DECISIONS as DECISIONS
from ._spec import INTERNAL_ERRORS as INTERNAL_ERRORS
from ._spec import LOOP_COST as LOOP_COST
from ._spec import LOOP_TOKENS as LOOP_TOKENS
from ._spec import MODEL_COST as MODEL_COST
from ._spec import MODEL_TOKENS as MODEL_TOKENS
from ._spec import REPEATED_CALL_SECONDS as REPEATED_CALL_SECONDS
from ._spec import REPEATED_CALLS as REPEATED_CALLS
from ._spec import RESCUES as RESCUES
from ._spec import SESSIONS as SESSIONS
from ._spec import SESSIONS_EVICTED as SESSIONS_EVICTED
from ._spec import STOPPED_RUNS as STOPPED_RUNS
from ._spec import STORE_ERRORS as STORE_ERRORS
from ._spec import TOOL_CALLS as TOOL_CALLS
from ._spec import UNPRICED_MODEL_CALLS as UNPRICED_MODEL_CALLS
from ._spec import WASTED_SECONDS as WASTED_SECONDS

if TYPE_CHECKING:
    from ._exposition import MetricsServer
    from .otel import OpenTelemetryRecorder
    from .prometheus import PrometheusRecorder

__all__ = [
    "ACTIONS",
    "COST_SOURCES",
    "DEFAULT_MAX_LABEL_VALUES",
    "DEFAULT_MAX_SERIES",
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
    "STORE_OPS",
    "TOKEN_KINDS",
]


# The two recorders' modules and the server are imported on first use (PEP 562): a guard without
# a recorder (a command hook's) does not import them.
_BACKENDS = {
    "MetricsServer": "_exposition",
    "OpenTelemetryRecorder": "otel",
    "PrometheusRecorder": "prometheus",
}
__getattr__, __dir__ = lazy_names(__name__, __name__, _BACKENDS, globals(), __all__)
