"""Recorded and received spans, put back in the order the span processor would have seen them.

Shared by every entrance that gets finished spans from outside the process: ``replay`` reads
them from files (OTLP JSON lines, span dumps), ``serve`` receives them over OTLP (protobuf and
JSON; see :mod:`otel_loopguard.service`). Both decode a span into a
:class:`~otel_loopguard._otlp_json.RecordedSpan`, hold the spans of each trace in a
:class:`TraceBuffer` (what it holds of a trace: :mod:`._trace_state`) until its tool spans can be
judged with their ancestors, and feed the resulting events
(:mod:`._trace_events`) to a guard with :func:`~otel_loopguard._trace_events.feed`, exactly as
``LoopGuardSpanProcessor`` calls it in-process: the same conventions
(:mod:`otel_loopguard._conventions`), session keys (:mod:`otel_loopguard._spans`) and guard calls.

Pure Python (stdlib and the package's own modules): no OpenTelemetry SDK, no protobuf.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from itertools import repeat
from typing import Any, Final

from ._conventions import (
    MISSING,
    agent_from_span,
    may_be_model_span,
    model_call_from_span,
)
from ._otlp_json import RecordedSpan, short_value
from ._span_calls import (
    Keys,
    duration_seconds,
    run_started,
)
from ._spans import (
    KeyBy,
    SpanView,
    ancestor_keys,
    session_for,
)
from ._spend import MAX_ANCESTORS
from ._trace_events import (
    CallDecidedAtStart,
    CallObserved,
    ModelUsed,
    RunStarted,
    SpanRef,
    TraceEvent,
)
from ._trace_state import HeldModel, HeldTrace, held_tool, trace_back, trace_data

__all__ = ["MAX_BUFFERED_SPANS", "MAX_SEEN_SPANS", "SNAPSHOT_VERSION", "TraceBuffer"]


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
        self._traces: dict[int, HeldTrace] = {}
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
        trace_id = span.trace_id
        span_id = span.span_id
        parent_id = span.parent_id
        trace = self._traces.get(trace_id)
        if trace is None:
            trace = self._traces[trace_id] = HeldTrace()
        if span_id in trace.parents or self._forgotten(trace_id, span_id):
            self.duplicate_spans += 1
            return
        trace.parents[span_id] = parent_id
        local_parent = parent_id
        if span.parent_remote:
            trace.remote.add(span_id)
            local_parent = None
        name = span.name
        attributes = span.attributes
        if agent_from_span(name, attributes) is not None:
            trace.agents[span_id] = SpanView(name, attributes, local_parent)
            if trace.agentless:
                lost = [p for p in trace.agentless if trace.under(p, span.span_id)]
                if lost:
                    self.agents_lost += 1
                    trace.agentless.difference_update(lost)
            if self._key_by is KeyBy.CONVERSATION:
                trace.runs[span.span_id] = (span.start_ns, self._order)
        tool = held_tool(span, local_parent, self._order)
        model = None
        if tool is None and may_be_model_span(attributes):
            call = model_call_from_span(name, attributes)
            if call is not None:
                ref = SpanRef(trace_id, span_id, parent_id, span.parent_remote)
                model = HeldModel(span_id, local_parent, call, span.end_ns, self._order, ref)
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
        if parent_id is None:
            self._complete[trace_id] = None

    def add_link(
        self, trace_id: int, span_id: int, parent_id: int | None, parent_remote: bool = False
    ) -> None:
        """Buffer a span known to be neither a tool nor an agent span: only its parent link
        counts (the same as :meth:`add` of such a span, without looking at it)."""
        trace = self._traces.get(trace_id)
        if trace is None:
            trace = self._traces[trace_id] = HeldTrace()
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

    def add_links(self, links: Iterable[tuple[int, int, int | None, bool]]) -> None:
        """:meth:`add_link` of each ``(trace_id, span_id, parent_id, parent_remote)``, in order,
        in one call (serve adds most spans of a request this way: the clock is read once)."""
        traces = self._traces
        complete = self._complete
        seen, seen_before = self._seen, self._seen_before
        check = bool(seen or seen_before)
        now = None if self._hold is None else self._clock()
        added = 0
        for trace_id, span_id, parent_id, parent_remote in links:
            trace = traces.get(trace_id)
            if trace is None:
                trace = traces[trace_id] = HeldTrace()
            parents = trace.parents
            if span_id in parents or (
                check and ((key := hash((trace_id, span_id))) in seen or key in seen_before)
            ):
                self.duplicate_spans += 1
                continue
            parents[span_id] = parent_id
            if parent_remote:
                trace.remote.add(span_id)
            if now is not None:
                trace.seen = now
            added += 1
            if parent_id is None:
                complete[trace_id] = None
        self._spans += added

    def _forgotten(self, trace_id: int, span_id: int) -> bool:
        """Whether the span was in a trace already flushed and forgotten (a retried export)."""
        if not self._seen_before and not self._seen:
            return False
        key = hash((trace_id, span_id))
        return key in self._seen or key in self._seen_before

    def _remember(self, trace: HeldTrace, trace_id: int) -> None:
        """Keep the span ids of a trace being forgotten (bounded: two generations)."""
        seen = self._seen
        parents = trace.parents
        if len(seen) + len(parents) < self._seen_max:
            # the whole trace fits in this generation: hashed in one call (the same hashes)
            seen.update(map(hash, zip(repeat(trace_id), parents)))
            return
        for span_id in parents:
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
                trace_data(trace_id, trace, now) for trace_id, trace in self._traces.items()
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
            traces = {int(item["id"]): trace_back(item, now) for item in data["traces"]}
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
            above = ancestor_keys(
                model.call, trace_id, frame, key_by, trace.lookup, (session, agent), MAX_ANCESTORS
            )
            depth = trace.depth(model.span_id)
            steps.append(
                (
                    (model.end_ns, 1, -depth, model.order),
                    ModelUsed(session, agent, model.call, model.end_ns / 1e9, model.ref, above),
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
