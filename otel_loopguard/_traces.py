"""Recorded and received spans, put back in the order the span processor would have seen them.

Shared by every entrance that gets finished spans from outside the process: ``replay`` reads
them from files (OTLP JSON lines, span dumps), ``serve`` receives them over OTLP (protobuf and
JSON; see :mod:`otel_loopguard.service`). Both decode a span into a :class:`RecordedSpan`, hold
the spans of each trace in a :class:`TraceBuffer` until its tool spans can be judged with their
ancestors, and feed the resulting :class:`CallDecidedAtStart` / :class:`CallObserved` events to
a guard with :func:`feed`, exactly as ``LoopGuardSpanProcessor`` calls it in-process: the same
conventions (:mod:`otel_loopguard._conventions`), session keys (:mod:`otel_loopguard._spans`) and
guard calls.

Pure Python (stdlib and the package's own modules): no OpenTelemetry SDK, no protobuf. Decoding
problems raise :class:`BadSpan` whose message is the reason shown to the user.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ._conventions import (
    ARGUMENTS_AT_START_CONVENTIONS,
    MISSING,
    SpanAgent,
    SpanModelCall,
    SpanToolCall,
    agent_from_span,
    may_be_model_span,
    model_call_from_span,
)
from ._span_calls import (
    Keys,
    call_at_end,
    call_at_start,
    call_ended,
    call_started,
    duration_seconds,
    model_ended,
    run_started,
)
from ._spans import (
    START_NAME_PREFIXES,
    AgentFrame,
    KeyBy,
    SpanView,
    nearest_agent,
    session_for,
)

if TYPE_CHECKING:
    from ._guard import LoopGuard
    from ._policy import Decision

__all__ = [
    "BadSpan",
    "CallDecidedAtStart",
    "CallObserved",
    "RunStarted",
    "MAX_BUFFERED_SPANS",
    "MAX_SEEN_SPANS",
    "MAX_SPAN_PROBLEMS",
    "MAX_VALUE_DEPTH",
    "ModelUsed",
    "OTLP_SIGNALS",
    "OtlpSpans",
    "RecordedSpan",
    "START_NAME_PREFIXES",
    "SpanLink",
    "SpanRef",
    "SNAPSHOT_VERSION",
    "STATUS_CODE_ERROR",
    "TraceBuffer",
    "TraceEvent",
    "feed",
    "otlp_json_spans",
    "short_value",
]


class BadSpan(ValueError):
    """A span (or a request or record holding spans) that cannot be used; the message says why,
    naming the field."""


def short_value(value: object, limit: int = 60) -> str:
    """``value`` as JSON (a string as its repr), cut to ``limit`` characters for a message."""
    text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _required(record: Mapping[str, Any], name: str) -> Any:
    if name not in record:
        raise BadSpan(f"missing field {name!r}")
    return record[name]


# --------------------------------------------------------------------------------------------
# Events: what a buffered trace gives, in the span processor's order


@dataclass(frozen=True, slots=True)
class SpanRef:
    """Where a call's tool span is in its trace: its ids, its parent's id (``None`` for a root)
    and whether that parent is in another process. What an entrance needs to put something
    beside the tool span (the exporter's ``loopguard.decision`` span)."""

    trace_id: int
    span_id: int
    parent_id: int | None
    parent_remote: bool = False


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class RunStarted:
    """An agent run started in a conversation (keyed by conversation only): as the span
    processor does at an agent span's start, fed to ``new_run`` (a new progress epoch)."""

    session: str
    agent: str | None
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class ModelUsed:
    """A model call's span ended with its usage (not yet checked: :func:`feed` checks it, a bad
    value being a counted skip), under the session and agent its turn's tool calls get. Fed to
    ``LoopGuard.model_call``; its decision is always ``None``."""

    session: str
    agent: str | None
    call: SpanModelCall
    timestamp: float | None = None
    span: SpanRef | None = None

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
        model_ended(guard, event.call, (event.session, event.agent))
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


#: Spans of unfinished traces held at once by default; past it the oldest traces are flushed
#: before their root arrived (their decisions may then differ).
MAX_BUFFERED_SPANS: Final = 100_000
#: Span ids of forgotten traces remembered by default, so that an exporter's retry of a batch
#: already judged is dropped instead of counted twice: a span is remembered while fewer than
#: this many spans of later forgotten traces came after it (forgotten before twice as many
#: did). Between this many and twice as many are kept (about 70 bytes each).
MAX_SEEN_SPANS: Final = 262_144
#: The flush counts of a snapshot written before they were renamed (``replayed_early`` counted
#: the flushes for capacity): read when the new name is missing.
_OLD_COUNT_NAMES: Final = {
    "flushed_early_capacity": "replayed_early",
    "flushed_early_time": "flushed_early",
}
#: Nesting of OTLP attribute values (arrays, key-value lists) read before a span is refused.
MAX_VALUE_DEPTH: Final = 32
#: Bad spans named per OTLP request (or line); the rest are only counted.
MAX_SPAN_PROBLEMS: Final = 3
#: Ancestors counted for a span's depth (only breaks ties between equal timestamps).
_MAX_DEPTH: Final = 1024


_HEX: Final = re.compile(r"[0-9a-fA-F]+")
_DECIMAL: Final = re.compile(r"-?[0-9]{1,20}")
_NO_ATTRIBUTES: Final[Mapping[str, object]] = {}
#: The top-level keys of OTLP JSON requests, one per signal.
OTLP_SIGNALS: Final = ("resourceSpans", "resourceMetrics", "resourceLogs", "resourceProfiles")
#: ``Status.code`` of a failed span (``STATUS_CODE_ERROR``).
STATUS_CODE_ERROR: Final = 2


@dataclass(frozen=True, slots=True)
class RecordedSpan:
    """One finished span as a trace reader decoded it.

    ``attributes`` and event attributes are as the SDK would hold them (arrays as tuples).
    ``start_name``/``start_attributes`` are what ``on_start`` saw; ``None`` when the recording
    does not say (OTLP), and then the final name and attributes stand in for them.
    ``parent_remote``: the parent is in another process (the processor never sees it).
    """

    trace_id: int
    span_id: int
    parent_id: int | None
    name: str
    attributes: Mapping[str, object]
    events: tuple[tuple[str, Mapping[str, object]], ...]
    status_error: bool
    start_ns: int
    end_ns: int
    start_name: str | None = None
    start_attributes: Mapping[str, object] | None = None
    parent_remote: bool = False


@dataclass(frozen=True, slots=True)
class _ToolSpan:
    """What a buffered tool span keeps: its calls as decoded at start and at end."""

    span_id: int
    parent_id: int | None  # local parent: None for a root or a remote parent
    start_call: SpanToolCall | None  # set when the processor would decide at start
    start_attributes: Mapping[str, object]
    end_call: SpanToolCall | None  # None: not a tool span at its end; MISSING arguments: none
    attributes: Mapping[str, object]
    start_ns: int
    end_ns: int
    order: int
    ref: SpanRef


@dataclass(frozen=True, slots=True)
class _ModelSpan:
    """What a buffered model-call span keeps: its usage as read, and where it is."""

    span_id: int
    parent_id: int | None  # local parent: None for a root or a remote parent
    call: SpanModelCall
    end_ns: int
    order: int
    ref: SpanRef


@dataclass(slots=True)
class _Trace:
    """The buffered part of one trace: parent links of every span, views of its agent spans
    (final attributes) and its tool spans not yet flushed. Other spans keep nothing but their
    parent link. ``resolved``: the agent found for each parent of a flushed tool span (kept
    while a partly flushed trace waits for more spans); ``due``/``seen``: when its tool spans
    must be flushed, and when it last got a span (``TraceBuffer`` with ``hold_seconds``)."""

    parents: dict[int, int | None] = field(default_factory=dict)
    remote: set[int] = field(default_factory=set)
    agents: dict[int, SpanView] = field(default_factory=dict)
    # Keyed by conversation: agent spans whose run start is still to be given, with their start
    # time and depth order; and the latest time already given (a run starting before it arrived
    # too late to start a new epoch without splitting calls already judged).
    runs: dict[int, tuple[int, int]] = field(default_factory=dict)
    given_until_ns: int = 0
    tools: list[_ToolSpan] = field(default_factory=list)
    models: list[_ModelSpan] = field(default_factory=list)
    resolved: dict[int | None, AgentFrame | None] = field(default_factory=dict)
    # Parents of tool spans flushed early without an agent: an agent span arriving above one
    # of them later is a run that lost its agent (TraceBuffer.agents_lost).
    agentless: set[int] = field(default_factory=set)
    due: float | None = None
    seen: float = 0.0

    def agent_of(self, parent_id: int | None) -> AgentFrame | None:
        """The agent a tool span with parent ``parent_id`` runs under; the first answer given
        for a parent holds for the rest of the trace."""
        if parent_id in self.resolved:
            return self.resolved[parent_id]
        frame = nearest_agent(parent_id, self.lookup)
        self.resolved[parent_id] = frame
        return frame

    def lookup(self, span_id: int) -> SpanView | None:
        view = self.agents.get(span_id)
        if view is not None:
            return view
        if span_id not in self.parents:
            return None
        parent = None if span_id in self.remote else self.parents[span_id]
        return SpanView("", _NO_ATTRIBUTES, parent)

    def under(self, span_id: int, ancestor: int) -> bool:
        """Whether ``ancestor`` is ``span_id`` or one of its ancestors, as far as the parent
        links received so far go (cycles and depth bounded)."""
        current: int | None = span_id
        seen: set[int] = set()
        while current is not None and current not in seen and len(seen) < _MAX_DEPTH:
            if current == ancestor:
                return True
            seen.add(current)
            current = None if current in self.remote else self.parents.get(current)
        return False

    def depth(self, span_id: int) -> int:
        """Ancestors of ``span_id`` present in the trace (cycles and depth bounded)."""
        depth = 0
        seen = {span_id}
        current = self.parents.get(span_id)
        while current is not None and current in self.parents and current not in seen:
            depth += 1
            if depth >= _MAX_DEPTH:
                break
            seen.add(current)
            current = self.parents[current]
        return depth


def _tool_span(span: RecordedSpan, local_parent: int | None, order: int) -> _ToolSpan | None:
    """The calls the span processor would find in ``span`` at start and at end, or ``None``."""
    end_call = call_at_end(span.name, span.attributes, span.events, span.status_error)
    start_name = span.name if span.start_name is None else span.start_name
    start_attributes = span.attributes if span.start_attributes is None else span.start_attributes
    start_call = None
    # Judged by its final attributes (OTLP), only a span of an instrumentation that starts tool
    # spans with their arguments can have been decided at start.
    # (The final attributes hold the arguments for every convention: judged by them alone, calls
    # the processor decides at end would be decided at start.)
    if span.start_attributes is not None:
        start_call = call_at_start(start_name, start_attributes)
    elif end_call is not None and end_call.convention in ARGUMENTS_AT_START_CONVENTIONS:
        start_call = call_at_start(start_name, start_attributes)
        if start_call is not None and start_call.convention not in ARGUMENTS_AT_START_CONVENTIONS:
            start_call = None
    if start_call is None and end_call is None:
        return None
    return _ToolSpan(
        span.span_id,
        local_parent,
        start_call,
        start_attributes,
        end_call,
        span.attributes,
        span.start_ns,
        span.end_ns,
        order,
        SpanRef(span.trace_id, span.span_id, span.parent_id, span.parent_remote),
    )


class TraceBuffer:
    """Holds the spans of each trace until its tool spans can be judged as the span processor
    judged them, and gives them back as events in the processor's order.

    A trace is flushed once its root span (no parent) has arrived, after the rest of the batch
    it came in (exporters send a span when it ends, and a root ends last), or at the end of the
    input (:meth:`finish`). Its tool spans then become events in the processor's order: a
    timeline of span starts and ends by timestamp (at equal times a start before an end, parents
    starting before children and children ending before parents, then the order the spans were
    read). A span whose arguments were there at start gives a :class:`CallDecidedAtStart` at its
    start; every tool span gives a :class:`CallObserved` at its end, with the session, agent and
    call id of its start when it was decided then.

    Session keys come from :func:`otel_loopguard._spans.session_for` (trace + agent), the agent
    from the nearest ancestor agent span, looked for over the trace as received so far, with
    each span's final attributes. In-process only ancestors still open, with their attributes as
    of then, are visible: where the processor could not tell an agent span while the tools ran
    (OpenInference marks a LangGraph agent span an agent only when it ends) its session is the
    bare trace, and this buffer's names the agent. With one agent run per trace the chains, and
    so the decisions, are the same; with several, the buffer keeps apart the runs the processor
    had to put in one chain.

    A live receiver cannot wait for a root forever: with ``hold_seconds`` set, :meth:`take_due`
    flushes the tool spans of a trace that have waited that long (measured by ``clock``, seconds)
    with the ancestors known so far, and keeps the trace's parent links for its later spans
    (:attr:`flushed_early_time` counts such flushes). Children sent before their parents, within
    ``hold_seconds``, still find their agent; an agent span that arrives later above tool spans
    already flushed without one is a run that lost its agent (:attr:`agents_lost` counts them:
    the exporters batch for longer than the hold). Each parent span, once it has been resolved to an
    agent (or to none) for a flushed tool span, keeps that answer for the rest of the trace, so
    the tool spans of one run stay in one chain even when the run's agent span arrives after some
    of them were flushed. A trace that has held no tool span for ``trace_ttl_seconds`` is
    forgotten by :meth:`take_due`.

    Memory is bounded by ``max_spans`` buffered spans (parent links included): past it the oldest
    traces are flushed and forgotten before their root arrived (:attr:`flushed_early_capacity`
    counts them). A span id seen twice in a trace (an exporter's retry) counts once, also after its
    trace was flushed and forgotten: the span ids of forgotten traces are remembered as 64-bit
    hashes of (trace id, span id), and a span among them is dropped (:attr:`duplicate_spans` counts
    the spans dropped either way). A span stays remembered while fewer than ``max_seen_spans`` spans
    of later forgotten traces came after it, and is forgotten before ``2 * max_seen_spans`` did (two
    generations of ``max_seen_spans`` hashes each: memory is that of ``2 * max_seen_spans`` hashes
    at most). A hash collision drops a new span with a probability about ``2 * max_seen_spans`` /
    2**63.

    Not thread-safe: one thread adds and takes.
    """

    __slots__ = (
        "_clock",
        "_complete",
        "_hold",
        "_key_by",
        "_max",
        "_order",
        "_seen",
        "_seen_before",
        "_seen_max",
        "_spans",
        "_traces",
        "_ttl",
        "agents_lost",
        "duplicate_spans",
        "flushed_early_capacity",
        "flushed_early_time",
    )

    def __init__(
        self,
        max_spans: int = MAX_BUFFERED_SPANS,
        *,
        hold_seconds: float | None = None,
        trace_ttl_seconds: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        key_by: KeyBy | str = KeyBy.TRACE,
        max_seen_spans: int = MAX_SEEN_SPANS,
    ) -> None:
        try:
            self._key_by = KeyBy(key_by)
        except ValueError:
            raise ValueError(
                f"key_by: expected 'trace' or 'conversation', got {key_by!r}"
            ) from None
        if isinstance(max_spans, bool) or not isinstance(max_spans, int) or max_spans < 1:
            raise ValueError(f"max_spans: expected a positive integer, got {max_spans!r}")
        if (
            isinstance(max_seen_spans, bool)
            or not isinstance(max_seen_spans, int)
            or max_seen_spans < 2
        ):
            raise ValueError(f"max_seen_spans: expected an integer >= 2, got {max_seen_spans!r}")
        if hold_seconds is not None and (
            isinstance(hold_seconds, bool)
            or not isinstance(hold_seconds, (int, float))
            or not 0 <= hold_seconds < float("inf")
        ):
            raise ValueError(f"hold_seconds: expected a finite number >= 0, got {hold_seconds!r}")
        if (
            isinstance(trace_ttl_seconds, bool)
            or not isinstance(trace_ttl_seconds, (int, float))
            or not trace_ttl_seconds > 0
        ):
            raise ValueError(f"trace_ttl_seconds: expected a number > 0, got {trace_ttl_seconds!r}")
        self._traces: dict[int, _Trace] = {}
        self._complete: dict[int, None] = {}
        self._max = max_spans
        self._hold = None if hold_seconds is None else float(hold_seconds)
        self._ttl = float(trace_ttl_seconds)
        self._clock = clock
        self._spans = 0
        self._order = 0
        # Two generations of span-id hashes of forgotten traces: the newer fills to the bound,
        # then replaces the older (O(1), no per-entry order to keep); a hash stays while fewer
        # than the bound came after it.
        self._seen: set[int] = set()
        self._seen_before: set[int] = set()
        self._seen_max = max_seen_spans
        self.duplicate_spans = 0
        self.flushed_early_capacity = 0
        self.flushed_early_time = 0
        self.agents_lost = 0

    @property
    def buffered_spans(self) -> int:
        """Spans currently held (parent links of partly flushed traces included)."""
        return self._spans

    @property
    def buffered_traces(self) -> int:
        """Traces currently held."""
        return len(self._traces)

    @property
    def max_spans(self) -> int:
        """Spans held at most before the oldest traces are flushed early."""
        return self._max

    def add(self, span: RecordedSpan) -> None:
        """Buffer one span; :meth:`take_ready` then returns the events it completed."""
        trace = self._traces.get(span.trace_id)
        if trace is None:
            trace = self._traces[span.trace_id] = _Trace()
        if span.span_id in trace.parents or self._forgotten(span.trace_id, span.span_id):
            self.duplicate_spans += 1
            return
        trace.parents[span.span_id] = span.parent_id
        local_parent = span.parent_id
        if span.parent_remote:
            trace.remote.add(span.span_id)
            local_parent = None
        if agent_from_span(span.name, span.attributes) is not None:
            trace.agents[span.span_id] = SpanView(span.name, span.attributes, local_parent)
            if trace.agentless:
                lost = [p for p in trace.agentless if trace.under(p, span.span_id)]
                if lost:
                    self.agents_lost += 1
                    trace.agentless.difference_update(lost)
            if self._key_by is KeyBy.CONVERSATION:
                trace.runs[span.span_id] = (span.start_ns, self._order)
        tool = _tool_span(span, local_parent, self._order)
        model = None
        if tool is None and may_be_model_span(span.attributes):
            call = model_call_from_span(span.name, span.attributes)
            if call is not None:
                ref = SpanRef(span.trace_id, span.span_id, span.parent_id, span.parent_remote)
                model = _ModelSpan(span.span_id, local_parent, call, span.end_ns, self._order, ref)
        self._order += 1
        if self._hold is not None:
            trace.seen = self._clock()
            if (tool is not None or model is not None) and not (trace.tools or trace.models):
                trace.due = trace.seen + self._hold
        if tool is not None:
            trace.tools.append(tool)
        elif model is not None:
            trace.models.append(model)
        self._spans += 1
        if span.parent_id is None:
            self._complete[span.trace_id] = None

    def add_link(
        self, trace_id: int, span_id: int, parent_id: int | None, parent_remote: bool = False
    ) -> None:
        """Buffer a span known to be neither a tool nor an agent span: only its parent link
        counts (the same as :meth:`add` of such a span, without looking at it)."""
        trace = self._traces.get(trace_id)
        if trace is None:
            trace = self._traces[trace_id] = _Trace()
        if span_id in trace.parents or self._forgotten(trace_id, span_id):
            self.duplicate_spans += 1
            return
        trace.parents[span_id] = parent_id
        if parent_remote:
            trace.remote.add(span_id)
        if self._hold is not None:
            trace.seen = self._clock()
        self._spans += 1
        if parent_id is None:
            self._complete[trace_id] = None

    def _forgotten(self, trace_id: int, span_id: int) -> bool:
        """Whether the span was in a trace already flushed and forgotten (a retried export)."""
        if not self._seen_before and not self._seen:
            return False
        key = hash((trace_id, span_id))
        return key in self._seen or key in self._seen_before

    def _remember(self, trace: _Trace, trace_id: int) -> None:
        """Keep the span ids of a trace being forgotten (bounded: two generations)."""
        seen = self._seen
        for span_id in trace.parents:
            seen.add(hash((trace_id, span_id)))
            if len(seen) >= self._seen_max:
                self._seen_before = seen
                seen = self._seen = set()

    def take_ready(self) -> list[TraceEvent]:
        """Events of the traces whose root arrived, then of the oldest traces while more than
        ``max_spans`` spans are buffered."""
        events: list[TraceEvent] = []
        for trace_id in list(self._complete):
            events.extend(self._flush(trace_id))
        self._complete.clear()
        if self._spans > self._max:
            # The oldest traces, found in one pass: taking the first key again after each
            # deletion scans the deleted slots at the dict's front each time (quadratic).
            excess = self._spans - self._max
            oldest: list[int] = []
            for trace_id, trace in self._traces.items():
                if excess <= 0:
                    break
                oldest.append(trace_id)
                excess -= len(trace.parents)
            for trace_id in oldest:
                events.extend(self._flush(trace_id))
                self.flushed_early_capacity += 1
        return events

    def take_due(self) -> list[TraceEvent]:
        """With ``hold_seconds``: events of the tool spans that have waited that long for their
        root, with the ancestors known so far; and forget traces idle past
        ``trace_ttl_seconds``. Without: nothing."""
        if self._hold is None or not self._traces:
            return []
        now = self._clock()
        events: list[TraceEvent] = []
        idle_before = now - self._ttl
        for trace_id, trace in list(self._traces.items()):
            if trace.tools or trace.models:
                if trace.due is not None and trace.due <= now:
                    events.extend(self._flush(trace_id, keep=True))
                    self.flushed_early_time += 1
            elif trace.seen <= idle_before:
                self._flush(trace_id)
        return events

    def finish(self) -> list[TraceEvent]:
        """Events of every trace still buffered (the input ended before their root span)."""
        events: list[TraceEvent] = []
        for trace_id in list(self._traces):
            events.extend(self._flush(trace_id))
        self._complete.clear()
        return events

    # -- state for --state-dir ---------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The buffer's contents as plain data (dicts, lists, strings, numbers, ``None``, and
        span attribute values as spans hold them: tuples for arrays, bytes), for
        :meth:`restore` in another process. Versioned (``"version"``); serve's state format
        (``service._durable``) keeps it exactly.

        The settings (``max_spans``, ``hold_seconds``, ``key_by``, ...) are not in it: they are
        the restoring buffer's own. Times read from ``clock`` are kept as seconds before now
        (when a trace last got a span) and seconds to go (when its tool spans are due), since
        another process's clock has another origin."""
        now = self._clock() if self._hold is not None else 0.0
        return {
            "version": SNAPSHOT_VERSION,
            "traces": [
                _trace_data(trace_id, trace, now) for trace_id, trace in self._traces.items()
            ],
            "complete": list(self._complete),
            "spans": self._spans,
            "order": self._order,
            "seen": list(self._seen),
            "seen_before": list(self._seen_before),
            "duplicate_spans": self.duplicate_spans,
            "flushed_early_capacity": self.flushed_early_capacity,
            "flushed_early_time": self.flushed_early_time,
            "agents_lost": self.agents_lost,
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace the buffer's contents with a :meth:`snapshot`'s. Raises ``ValueError`` naming
        what is wrong when ``data`` is not a snapshot of this version; the buffer is then
        unchanged."""
        if not isinstance(data, Mapping):
            raise ValueError(f"trace buffer snapshot: expected a mapping, got {short_value(data)}")
        version = data.get("version")
        if version != SNAPSHOT_VERSION:
            raise ValueError(
                f"trace buffer snapshot: version: expected {SNAPSHOT_VERSION}, got {version!r}"
            )
        now = self._clock() if self._hold is not None else 0.0
        try:
            traces = {int(item["id"]): _trace_back(item, now) for item in data["traces"]}
            complete = {int(trace_id): None for trace_id in data["complete"]}
            # the two flush counts under their names before 2026-12 too (the v2 snapshot)
            counts = [
                int(data[name] if name in data else data[_OLD_COUNT_NAMES[name]])
                for name in (
                    "spans",
                    "order",
                    "duplicate_spans",
                    "flushed_early_capacity",
                    "flushed_early_time",
                    "agents_lost",
                )
            ]
            seen = {int(key) for key in data["seen"]}
            seen_before = {int(key) for key in data["seen_before"]}
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"trace buffer snapshot: malformed ({type(exc).__name__}: {exc})"
            ) from None
        self._traces = traces
        self._complete = complete
        (
            self._spans,
            self._order,
            self.duplicate_spans,
            self.flushed_early_capacity,
            self.flushed_early_time,
            self.agents_lost,
        ) = counts
        self._seen = seen
        self._seen_before = seen_before

    def _flush(self, trace_id: int, keep: bool = False) -> list[TraceEvent]:
        """The events of a trace's buffered tool spans; the trace is forgotten unless ``keep``
        (then its parent links, agents and resolved parents stay for its later spans)."""
        if keep:
            trace = self._traces[trace_id]
        else:
            popped = self._traces.pop(trace_id, None)
            if popped is None:
                return []
            trace = popped
            self._spans -= len(trace.parents)
            self._remember(trace, trace_id)
        steps: list[tuple[tuple[int, int, int, int], TraceEvent]] = []
        key_by = self._key_by
        for span_id, (start_ns, order) in list(trace.runs.items()):
            del trace.runs[span_id]
            if start_ns < trace.given_until_ns:
                continue  # its calls were judged already: a new epoch now would split them
            view = trace.agents[span_id]
            run = run_started(view.name, view.attributes)
            if run is not None:
                steps.append(
                    (
                        (start_ns, 0, trace.depth(span_id), order),
                        RunStarted(run[0], run[1], start_ns / 1e9),
                    )
                )
        for tool in trace.tools:
            depth = trace.depth(tool.span_id)
            frame = trace.agent_of(tool.parent_id)
            if keep and frame is None and tool.parent_id is not None:
                trace.agentless.add(tool.parent_id)
            duration = duration_seconds(tool.start_ns, tool.end_ns)
            started: Keys | None = None
            call = tool.start_call
            if call is not None:
                session, agent = session_for(call, trace_id, frame, key_by, tool.start_attributes)
                started = (session, agent, call.call_id)
                steps.append(
                    (
                        (tool.start_ns, 0, depth, tool.order),
                        CallDecidedAtStart(
                            session,
                            agent,
                            call.tool,
                            call.arguments,
                            call.call_id,
                            duration,
                            tool.start_ns / 1e9,
                            tool.ref,
                        ),
                    )
                )
            call = tool.end_call
            if call is not None:
                if started is not None:
                    session, agent, call_id = started
                else:
                    session, agent = session_for(call, trace_id, frame, key_by, tool.attributes)
                    call_id = call.call_id
                # No arguments on the span: fed as such (call_ended's rule).
                without_arguments = call.arguments is MISSING
                steps.append(
                    (
                        (tool.end_ns, 1, -depth, tool.order),
                        CallObserved(
                            session,
                            agent,
                            call.tool,
                            {} if without_arguments else call.arguments,
                            call_id,
                            call.is_error,
                            call.result,
                            duration,
                            tool.end_ns / 1e9,
                            tool.ref,
                            without_arguments,
                        ),
                    )
                )
        for model in trace.models:
            frame = trace.agent_of(model.parent_id)
            session, agent = session_for(model.call, trace_id, frame, key_by)
            depth = trace.depth(model.span_id)
            steps.append(
                (
                    (model.end_ns, 1, -depth, model.order),
                    ModelUsed(session, agent, model.call, model.end_ns / 1e9, model.ref),
                )
            )
        if keep:
            if trace.tools:
                trace.given_until_ns = max(
                    trace.given_until_ns, max(tool.start_ns for tool in trace.tools)
                )
            trace.tools = []
            trace.models = []
            trace.due = None
        steps.sort(key=lambda step: step[0])
        return [event for _, event in steps]


# -- TraceBuffer snapshots ---------------------------------------------------------------------

#: Version of :meth:`TraceBuffer.snapshot`'s data; :meth:`TraceBuffer.restore` refuses others.
SNAPSHOT_VERSION: Final = 1


def _call_data(call: SpanToolCall | None) -> dict[str, Any] | None:
    if call is None:
        return None
    data: dict[str, Any] = {
        "tool": call.tool,
        "result": call.result,
        "is_error": call.is_error,
        "call_id": call.call_id,
        "agent_id": call.agent_id,
        "agent_name": call.agent_name,
        "conversation_id": call.conversation_id,
        "convention": call.convention,
    }
    if call.arguments is not MISSING:  # absent: the span carried no arguments
        data["arguments"] = call.arguments
    return data


def _call_back(data: Mapping[str, Any] | None) -> SpanToolCall | None:
    if data is None:
        return None
    return SpanToolCall(
        data["tool"],
        data.get("arguments", MISSING),
        data["result"],
        data["is_error"],
        data["call_id"],
        data["agent_id"],
        data["agent_name"],
        data["conversation_id"],
        data["convention"],
    )


def _tool_data(tool: _ToolSpan) -> dict[str, Any]:
    ref = tool.ref
    return {
        "span_id": tool.span_id,
        "parent_id": tool.parent_id,
        "start_call": _call_data(tool.start_call),
        # None: the same as the final attributes (a span read without its start, OTLP).
        "start_attributes": (
            None if tool.start_attributes is tool.attributes else dict(tool.start_attributes)
        ),
        "end_call": _call_data(tool.end_call),
        "attributes": dict(tool.attributes),
        "start_ns": tool.start_ns,
        "end_ns": tool.end_ns,
        "order": tool.order,
        "ref": [ref.trace_id, ref.span_id, ref.parent_id, ref.parent_remote],
    }


def _tool_back(data: Mapping[str, Any]) -> _ToolSpan:
    attributes = dict(data["attributes"])
    start_attributes = data["start_attributes"]
    trace_id, span_id, parent_id, parent_remote = data["ref"]
    return _ToolSpan(
        int(data["span_id"]),
        data["parent_id"],
        _call_back(data["start_call"]),
        attributes if start_attributes is None else dict(start_attributes),
        _call_back(data["end_call"]),
        attributes,
        int(data["start_ns"]),
        int(data["end_ns"]),
        int(data["order"]),
        SpanRef(trace_id, span_id, parent_id, bool(parent_remote)),
    )


def _model_data(model: _ModelSpan) -> dict[str, Any]:
    ref = model.ref
    call = model.call
    return {
        "span_id": model.span_id,
        "parent_id": model.parent_id,
        "call": [
            call.model,
            call.provider,
            call.input_tokens,
            call.output_tokens,
            call.cache_read_tokens,
            call.cache_write_tokens,
            call.reported_cost_usd,
            call.agent_id,
            call.agent_name,
            call.conversation_id,
            call.convention,
        ],
        "end_ns": model.end_ns,
        "order": model.order,
        "ref": [ref.trace_id, ref.span_id, ref.parent_id, ref.parent_remote],
    }


def _model_back(data: Mapping[str, Any]) -> _ModelSpan:
    trace_id, span_id, parent_id, parent_remote = data["ref"]
    return _ModelSpan(
        int(data["span_id"]),
        data["parent_id"],
        SpanModelCall(*data["call"]),
        int(data["end_ns"]),
        int(data["order"]),
        SpanRef(trace_id, span_id, parent_id, bool(parent_remote)),
    )


def _frame_data(frame: AgentFrame | None) -> list[Any] | None:
    if frame is None:
        return None
    agent = frame.agent
    return [frame.span_id, agent.agent_id, agent.agent_name, agent.conversation_id]


def _frame_back(data: list[Any] | None) -> AgentFrame | None:
    if data is None:
        return None
    span_id, agent_id, agent_name, conversation = data
    return AgentFrame(int(span_id), SpanAgent(agent_id, agent_name, conversation))


def _trace_data(trace_id: int, trace: _Trace, now: float) -> dict[str, Any]:
    return {
        "id": trace_id,
        "parents": [[span_id, parent] for span_id, parent in trace.parents.items()],
        "remote": list(trace.remote),
        "agents": [
            [span_id, view.name, dict(view.attributes), view.parent_id]
            for span_id, view in trace.agents.items()
        ],
        "runs": [[span_id, start_ns, order] for span_id, (start_ns, order) in trace.runs.items()],
        "given_until_ns": trace.given_until_ns,
        "tools": [_tool_data(tool) for tool in trace.tools],
        "models": [_model_data(model) for model in trace.models],
        "resolved": [[parent, _frame_data(frame)] for parent, frame in trace.resolved.items()],
        "agentless": list(trace.agentless),
        "due_in": None if trace.due is None else trace.due - now,
        "idle": now - trace.seen,
    }


def _trace_back(data: Mapping[str, Any], now: float) -> _Trace:
    due_in = data["due_in"]
    return _Trace(
        parents={int(span_id): parent for span_id, parent in data["parents"]},
        remote={int(span_id) for span_id in data["remote"]},
        agents={
            int(span_id): SpanView(name, dict(attributes), parent)
            for span_id, name, attributes, parent in data["agents"]
        },
        runs={int(span_id): (int(start), int(order)) for span_id, start, order in data["runs"]},
        given_until_ns=int(data["given_until_ns"]),
        tools=[_tool_back(tool) for tool in data["tools"]],
        models=[_model_back(model) for model in data.get("models", ())],
        resolved={parent: _frame_back(frame) for parent, frame in data["resolved"]},
        agentless={int(span_id) for span_id in data["agentless"]},
        due=None if due_in is None else now + float(due_in),
        seen=now - float(data["idle"]),
    )


def read_id(value: object, size: int, name: str, base64_too: bool) -> int:
    """A trace (16 bytes) or span (8 bytes) id from hex, or base64 of the right length."""
    digits = 2 * size
    if isinstance(value, str) and len(value) == digits and _HEX.fullmatch(value):
        number = int(value, 16)
    else:
        raw: bytes | None = None
        if base64_too and isinstance(value, str) and value:
            try:
                raw = base64.b64decode(value, validate=True)
            except ValueError:  # binascii.Error
                raw = None
        if raw is None or len(raw) != size:
            also = " (or base64)" if base64_too else ""
            raise BadSpan(
                f"{name!r} must be {size} bytes: {digits} hex digits{also},"
                f" got {short_value(value)}"
            )
        number = int.from_bytes(raw, "big")
    if number == 0:
        raise BadSpan(f"{name!r} is all zeros (an invalid id)")
    return number


def read_parent_id(value: object, name: str, base64_too: bool) -> int | None:
    if value is None or value == "":
        return None
    return read_id(value, 8, name, base64_too)


def read_nanos(value: object, name: str, text_too: bool) -> int:
    """Nanoseconds since the epoch, an unsigned 64-bit integer (OTLP JSON: also its decimal
    string)."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif text_too and isinstance(value, str) and _DECIMAL.fullmatch(value):
        number = int(value)
    if number is None or not 0 <= number < 1 << 64:
        kind = "an integer (or its decimal string)" if text_too else "an integer"
        raise BadSpan(
            f"{name!r} must be {kind} of nanoseconds >= 0 (64 bits), got {short_value(value)}"
        )
    return number


# -- OTLP JSON ---------------------------------------------------------------------------------


def _any_value(value: object, where: str, depth: int) -> object:
    """One OTLP ``AnyValue`` as the SDK would hold it; ``None`` for an empty (or unknown) one."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadSpan(f"{where}: value must be an AnyValue object, got {short_value(value)}")
    if depth > MAX_VALUE_DEPTH:
        raise BadSpan(f"{where}: value nested more than {MAX_VALUE_DEPTH} levels deep")
    for kind, decode in _ANY_VALUE_KINDS:
        if kind in value:
            return decode(value[kind], where, depth)
    return None


def _string_value(text: object, where: str, depth: int) -> object:
    if not isinstance(text, str):
        raise BadSpan(f"{where}: stringValue must be a string, got {short_value(text)}")
    return text


def _bool_value(flag: object, where: str, depth: int) -> object:
    if not isinstance(flag, bool):
        raise BadSpan(f"{where}: boolValue must be true or false, got {short_value(flag)}")
    return flag


def _int_value(number: object, where: str, depth: int) -> object:
    if isinstance(number, int) and not isinstance(number, bool):
        return number
    if isinstance(number, str) and _DECIMAL.fullmatch(number):
        return int(number)
    raise BadSpan(
        f"{where}: intValue must be an integer or its decimal string, got {short_value(number)}"
    )


def _double_value(double: object, where: str, depth: int) -> object:
    if isinstance(double, (int, float)) and not isinstance(double, bool):
        return float(double)
    if isinstance(double, str):
        try:
            return float(double)  # "NaN", "Infinity", "-Infinity", or a number as text
        except ValueError:
            pass
    raise BadSpan(f"{where}: doubleValue must be a number, got {short_value(double)}")


def _array_value(array: object, where: str, depth: int) -> object:
    items = _values_list(array, where, "arrayValue")
    return tuple(_any_value(item, where, depth + 1) for item in items)


def _kvlist_value(pairs: object, where: str, depth: int) -> object:
    return _otlp_attributes(_values_list(pairs, where, "kvlistValue"), where, depth + 1)


def _bytes_value(encoded: object, where: str, depth: int) -> object:
    try:
        if not isinstance(encoded, str):
            raise ValueError
        return base64.b64decode(encoded, validate=True)
    except ValueError:
        raise BadSpan(
            f"{where}: bytesValue must be base64 text, got {short_value(encoded)}"
        ) from None


#: The fields of an ``AnyValue``, in the order they are looked for, with their decoders.
_ANY_VALUE_KINDS: Final[tuple[tuple[str, Callable[[object, str, int], object]], ...]] = (
    ("stringValue", _string_value),
    ("boolValue", _bool_value),
    ("intValue", _int_value),
    ("doubleValue", _double_value),
    ("arrayValue", _array_value),
    ("kvlistValue", _kvlist_value),
    ("bytesValue", _bytes_value),
)


def _values_list(container: object, where: str, kind: str) -> list[object]:
    if container is None:
        return []
    if not isinstance(container, dict):
        raise BadSpan(
            f"{where}: {kind} must be an object with 'values', got {short_value(container)}"
        )
    values = container.get("values")
    if values is None:
        return []
    if not isinstance(values, list):
        raise BadSpan(f"{where}: {kind}.values must be a list, got {short_value(values)}")
    return values


def _otlp_attributes(value: object, where: str, depth: int = 0) -> dict[str, object]:
    """OTLP ``[{"key", "value": AnyValue}]`` as a dict (the last of a repeated key wins, empty
    values are dropped, as the SDK does)."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise BadSpan(f"{where} must be a list of {{key, value}} objects, got {short_value(value)}")
    attributes: dict[str, object] = {}
    for item in value:
        if not isinstance(item, dict):
            raise BadSpan(
                f"{where}: an attribute must be a {{key, value}} object, got {short_value(item)}"
            )
        key = item.get("key")
        if not isinstance(key, str):
            raise BadSpan(f"{where}: attribute 'key' must be a string, got {short_value(key)}")
        decoded = _any_value(item.get("value"), f"{where} {key!r}", depth)
        if decoded is not None:
            attributes[key] = decoded
    return attributes


def _otlp_events(value: object) -> tuple[tuple[str, Mapping[str, object]], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadSpan(f"'events' must be a list, got {short_value(value)}")
    events: list[tuple[str, Mapping[str, object]]] = []
    for index, event in enumerate(value):
        if not isinstance(event, dict):
            raise BadSpan(f"events[{index}] must be an object, got {short_value(event)}")
        event_name = event.get("name", "")
        if not isinstance(event_name, str):
            raise BadSpan(f"events[{index}].name must be a string, got {short_value(event_name)}")
        events.append(
            (event_name, _otlp_attributes(event.get("attributes"), f"events[{index}].attributes"))
        )
    return tuple(events)


def _otlp_status_error(value: object) -> bool:
    if value is None:
        return False
    if not isinstance(value, dict):
        raise BadSpan(f"'status' must be an object, got {short_value(value)}")
    return value.get("code") in (STATUS_CODE_ERROR, "STATUS_CODE_ERROR")


def _otlp_span(raw: object) -> RecordedSpan:
    if not isinstance(raw, dict):
        raise BadSpan(f"a span must be an object, got {short_value(raw)}")
    trace_id = read_id(_required(raw, "traceId"), 16, "traceId", True)
    span_id = read_id(_required(raw, "spanId"), 8, "spanId", True)
    parent_id = read_parent_id(raw.get("parentSpanId"), "parentSpanId", True)
    flags = raw.get("flags")
    # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE (0x100) and SPAN_FLAGS_CONTEXT_IS_REMOTE (0x200).
    remote = (
        parent_id is not None
        and isinstance(flags, int)
        and not isinstance(flags, bool)
        and flags & 0x300 == 0x300
    )
    name = raw.get("name", "")
    if not isinstance(name, str):
        raise BadSpan(f"'name' must be a string, got {short_value(name)}")
    start = read_nanos(_required(raw, "startTimeUnixNano"), "startTimeUnixNano", True)
    end = read_nanos(_required(raw, "endTimeUnixNano"), "endTimeUnixNano", True)
    return RecordedSpan(
        trace_id,
        span_id,
        parent_id,
        name,
        _otlp_attributes(raw.get("attributes"), "attributes"),
        _otlp_events(raw.get("events")),
        _otlp_status_error(raw.get("status")),
        start,
        end,
        parent_remote=remote,
    )


def _list_field(record: Mapping[str, Any], name: str, where: str) -> list[object]:
    value = record.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadSpan(f"{where}{name} must be a list, got {short_value(value)}")
    return value


#: A span known to be neither a tool nor an agent span, as the buffer keeps it: (trace id, span
#: id, parent span id or None, whether the parent is remote).
SpanLink = tuple[int, int, int | None, bool]


@dataclass(frozen=True, slots=True)
class OtlpSpans:
    """The spans read from one OTLP request: the good ones, up to a few reasons for the bad ones
    (each naming the span's path in the request), and how many were bad. ``links``: spans a
    decoder already knows to be neither tool nor agent spans, kept as parent links only."""

    spans: list[RecordedSpan]
    problems: list[str]
    bad_spans: int
    links: list[SpanLink] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        """Spans read (recorded ones and links)."""
        return len(self.spans) + len(self.links)


def otlp_json_spans(record: Mapping[str, Any]) -> OtlpSpans:
    """The spans of an OTLP JSON ``ExportTraceServiceRequest`` (a parsed object).

    Ids are hex; base64 of the right length (protobuf's own JSON) is read too. 64-bit integers
    may be decimal strings or numbers; enums integers (or their names); unknown fields are
    ignored; fields proto3 leaves out when empty (name, attributes, events, status, parent) may
    be absent. ``traceId``, ``spanId`` and the two times are required. A bad span is left out
    and named in :attr:`OtlpSpans.problems`; the others still count. A request without
    ``resourceSpans`` has no spans (the caller decides whether that is an error).
    """
    spans: list[RecordedSpan] = []
    problems: list[str] = []
    bad_spans = 0
    for i, resource in enumerate(_list_field(record, "resourceSpans", "")):
        where = f"resourceSpans[{i}]"
        try:
            if not isinstance(resource, dict):
                raise BadSpan(f"must be an object, got {short_value(resource)}")
            scopes = _list_field(resource, "scopeSpans", "")
        except BadSpan as exc:
            bad_spans += 1
            problems.append(f"{where}: {exc}")
            continue
        for j, scope in enumerate(scopes):
            at = f"{where}.scopeSpans[{j}]"
            try:
                if not isinstance(scope, dict):
                    raise BadSpan(f"must be an object, got {short_value(scope)}")
                raw_spans = _list_field(scope, "spans", "")
            except BadSpan as exc:
                bad_spans += 1
                problems.append(f"{at}: {exc}")
                continue
            for k, raw in enumerate(raw_spans):
                try:
                    spans.append(_otlp_span(raw))
                except BadSpan as exc:
                    bad_spans += 1
                    if len(problems) < MAX_SPAN_PROBLEMS:
                        problems.append(f"{at}.spans[{k}]: {exc}")
    return OtlpSpans(spans, problems, bad_spans)
