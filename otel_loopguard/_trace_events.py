"""What a trace reader gives a guard: the events of tool spans and runs, in the order the span
processor would have seen them (:class:`CallDecidedAtStart`, :class:`CallObserved`,
:class:`RunStarted`, :class:`ModelUsed`), and :func:`feed`, which hands one to a guard exactly
as ``LoopGuardSpanProcessor`` does (through :mod:`._span_calls`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._conventions import MISSING, SpanModelCall
from ._span_calls import call_ended, call_started, model_ended

if TYPE_CHECKING:
    from ._guard import LoopGuard
    from ._policy import Decision

__all__ = [
    "CallDecidedAtStart",
    "CallObserved",
    "ModelUsed",
    "RunStarted",
    "SpanRef",
    "TraceEvent",
    "feed",
]


@dataclass(slots=True, unsafe_hash=True)  # built per span: not frozen (4x the __init__), never set
class SpanRef:
    """Where a call's tool span is in its trace: its ids, its parent's id (``None`` for a root)
    and whether that parent is in another process. What an entrance needs to put something
    beside the tool span (the exporter's ``loopguard.decision`` span)."""

    trace_id: int
    span_id: int
    parent_id: int | None
    parent_remote: bool = False


@dataclass(slots=True, unsafe_hash=True)  # built per span: not frozen (4x the __init__), never set
class CallDecidedAtStart:
    """A tool call decided when its span started, because the span carried the arguments then
    (Pydantic AI). Fed to the guard's span-start decision, which counts it; the span's end comes
    as a :class:`CallObserved` with the same session, agent and call id, which then only adds
    the outcome. ``duration_seconds`` is the recorded span duration (what a deny would save).
    ``span``: the tool span, when the event came from a :class:`TraceBuffer`."""

    session: str
    agent: str | None
    tool: str
    arguments: object
    call_id: str | None = None
    duration_seconds: float | None = None
    timestamp: float | None = None
    span: SpanRef | None = None


@dataclass(slots=True, unsafe_hash=True)  # built per span: not frozen (4x the __init__), never set
class CallObserved:
    """A tool call seen only once it had run (a tool span at its end), fed to ``after_tool``.

    The guard counts it then, and the decision it returns is the call's; or, when a call
    decided at start is pending under the same call id (or arguments), it only adds the outcome
    and returns nothing: the call was already counted. ``span``: the tool span, when the event
    came from a :class:`TraceBuffer`. ``without_arguments``: the span was recognised but carried
    no arguments (``arguments`` is then ``{}``); :func:`feed` counts it only when the guard's
    policy says ``count_calls_without_arguments``.
    """

    session: str
    agent: str | None
    tool: str
    arguments: object
    call_id: str | None = None
    error: bool | None = None
    result: object = None
    duration_seconds: float | None = None
    timestamp: float | None = None
    span: SpanRef | None = None
    without_arguments: bool = False


@dataclass(slots=True, unsafe_hash=True)  # built per span: not frozen (4x the __init__), never set
class RunStarted:
    """An agent run started in a conversation (keyed by conversation only): as the span
    processor does at an agent span's start, fed to ``new_run`` (a new progress epoch)."""

    session: str
    agent: str | None
    timestamp: float | None = None


@dataclass(slots=True, unsafe_hash=True)  # built per span: not frozen (4x the __init__), never set
class ModelUsed:
    """A model call's span ended with its usage (not yet checked: :func:`feed` checks it, a bad
    value being a counted skip), under the session and agent its turn's tool calls get. Fed to
    ``LoopGuard.model_call``; its decision is always ``None``."""

    session: str
    agent: str | None
    call: SpanModelCall
    timestamp: float | None = None
    span: SpanRef | None = None
    #: The (session, agent) keys of the agents the call's agent runs under, nearest first.
    ancestors: tuple[tuple[str, str | None], ...] = ()

    @property
    def tool(self) -> str:
        """The model's name, for entrances that name an event by what it called."""
        return self.call.model or ""


#: What a :class:`TraceBuffer` gives for its tool spans, its model calls' usage (and, keyed by
#: conversation, its runs).
TraceEvent = CallDecidedAtStart | CallObserved | RunStarted | ModelUsed


def feed(guard: LoopGuard, event: TraceEvent) -> Decision | None:
    """Feed one event to ``guard`` as ``LoopGuardSpanProcessor`` does: a call decided at its
    span's start goes to the span-start decision (which counts it and never waits for an
    advisor), a tool span at its end to ``after_tool``. Returns the call's decision, or ``None``
    when the end only added the outcome of a call already counted at its start, or when the
    span carried no arguments and the policy does not ``count_calls_without_arguments`` (the
    call is then skipped, as the span processor skips it). Never raises (the guard's hook
    contract)."""
    span = event.span if not isinstance(event, RunStarted) else None
    ids = None if span is None else (span.trace_id, span.span_id)  # the exemplar's
    if isinstance(event, CallDecidedAtStart):
        keys = (event.session, event.agent, event.call_id)
        return call_started(guard, event.tool, event.arguments, keys, ids)
    if isinstance(event, RunStarted):
        guard.new_run(event.session, agent=event.agent)
        return None
    if isinstance(event, ModelUsed):
        model_ended(guard, event.call, (event.session, event.agent, event.ancestors))
        return None
    ended = call_ended(
        guard,
        event.tool,
        MISSING if event.without_arguments else event.arguments,
        (event.session, event.agent, event.call_id),
        event.error,
        event.result,
        event.duration_seconds,
        ids,
    )
    return None if ended is None else ended[2]


# --------------------------------------------------------------------------------------------
# Spans and traces
