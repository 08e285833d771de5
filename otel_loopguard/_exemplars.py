"""Which call a metric sample counts: its trace id and span id, for exemplars.

A call reported through a span (the processor, and through :mod:`._traces` the exporter,
``serve`` and ``replay`` of traces) names its span with :func:`counting`, around the guard's
call; a call reported through the hook API or a framework adapter is the active span's, read from
OpenTelemetry's context when nothing was named. A recorder asks :func:`current_call` when it
counts a repeat, a decision or a stop: the ids of the call, or ``None`` (no trace: command hooks
without telemetry, or ids that are zero, out of range or not integers; those are counted in
:data:`DROPPED`, never raised).
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Final

__all__ = ["COUNTED_CALL", "DROPPED", "counting", "current_call", "exemplar_labels"]

#: (trace id, span id) of the call being counted on this thread or task, when a span named it.
#: The hot path (:mod:`._span_calls`, around every call a span reports) sets and resets it
#: itself, ``token = COUNTED_CALL.set(ids)`` … ``COUNTED_CALL.reset(token)`` in ``finally``: no
#: object and no method calls of ours per call; elsewhere :class:`counting` does the same.
COUNTED_CALL: Final[ContextVar[tuple[object, object] | None]] = ContextVar(
    "otel_loopguard_counted_call", default=None
)
_CALL: Final = COUNTED_CALL
_MAX_TRACE_ID: Final = (1 << 128) - 1
_MAX_SPAN_ID: Final = (1 << 64) - 1


class _Dropped:
    """How many calls named ids that cannot be an exemplar (zero, out of range, not integers)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


#: Ids dropped since the process started (read by tests and by ``LoopGuard.internal_errors``'s
#: neighbours; never raised).
DROPPED: Final = _Dropped()


class counting:  # noqa: N801 - used as a function: ``with counting(trace_id, span_id):``
    """Within this block, the call being counted is the span ``(trace_id, span_id)``. A class,
    not a generator: it runs around every call a span reports."""

    __slots__ = ("_ids", "_token")

    def __init__(self, trace_id: object, span_id: object) -> None:
        self._ids = (trace_id, span_id)

    def __enter__(self) -> None:
        self._token: Token[tuple[object, object] | None] = _CALL.set(self._ids)

    def __exit__(self, *exc: object) -> None:
        _CALL.reset(self._token)


def current_call() -> tuple[int, int] | None:
    """The (trace id, span id) of the call being counted, or ``None``. Never raises."""
    try:
        named = _CALL.get()
        if named is None:
            return _active_span()
        trace_id, span_id = named
        if (
            type(trace_id) is int
            and type(span_id) is int
            and 0 < trace_id <= _MAX_TRACE_ID
            and 0 < span_id <= _MAX_SPAN_ID
        ):
            return trace_id, span_id
        DROPPED.count += 1
        return None
    except Exception:
        DROPPED.count += 1
        return None


def _active_span() -> tuple[int, int] | None:
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return context.trace_id, context.span_id


def exemplar_labels(ids: tuple[int, int]) -> dict[str, str]:
    """An exemplar's labels for ``ids``: ``trace_id`` (32 hex digits) and ``span_id`` (16), as
    Grafana links them to a trace (63 characters with the names: within OpenMetrics' 128)."""
    trace_id, span_id = ids
    return {"trace_id": f"{trace_id:032x}", "span_id": f"{span_id:016x}"}
