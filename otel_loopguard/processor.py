"""LoopGuardSpanProcessor: tool calls from the spans an application already emits.

``provider.add_span_processor(LoopGuardSpanProcessor())`` is all it takes. Tool spans of the
common instrumentations (see :mod:`otel_loopguard._conventions`) are fed to a :class:`LoopGuard`;
its decisions become ``loopguard.decision`` span events.

Threading contract (the SDK's): ``on_start`` and ``on_end`` are called on the thread that starts
or ends the span, concurrently from any number of threads. They never block (the advisor is
never waited for here) and never raise: the SDK does not catch exceptions from processors, so
every hook catches everything, logs once per kind, counts it in ``guard.internal_errors`` and
returns.

Where detection runs: with ``decide_requests``, at the end of the model span that requested
the call, when it carries the request (content capture on: :mod:`otel_loopguard._conventions.
_requested`), before the tool runs; the tool span's start then finds that decision (by call id,
else tool and arguments, else its tool's name), so code inside the tool span can read it with
:func:`current_decision` (or obey it with ``@otel_loopguard.enforce``), and the span's end only
adds the outcome. Else at ``on_start`` when the span already carries the arguments (Pydantic
AI), so the decision is on the still-open tool span and code inside it can read it the same
way; else at ``on_end``, where the call has already run and the decision is
recorded on a short ``loopguard.decision`` span, a sibling of the tool span that ends at once
(so the decision is exported even when an ancestor never ends, and no span object is held for
it). That span goes through the tool span's own provider (its span processors, so its
exporters; its sampler and resource), whichever provider the processor was added to, unless
``tracer_provider=`` names another (see :class:`LoopGuardSpanProcessor`). At ``on_end`` the guard
may also conclude from the call's result that the run is stuck now (``phase`` post, e.g. a stop
at the third identical failure): recorded the same way, with ``loopguard.phase`` ``post``, and
kept for a framework adapter whose own report of the call comes after the span's
(:meth:`~LoopGuardSpanProcessor.take_concluded`).

Bookkeeping per open span lets a tool span find its agent among its ancestors. It is a weak
reference to the span, never the span itself: a span the application drops without ending it is
freed with everything it carries, whatever its size, and the processor keeps a few dozen bytes for
it (bounded by ``max_tracked_spans``; spans never ended are forgotten after ``span_ttl_seconds``,
or once the application dropped them). The reference is weak rather than a copy of what the
resolver reads because that (an agent span's name, conversation id, even its
``gen_ai.operation.name``) is often set just after the span starts, and an ancestor is read only
when a tool span under it needs its agent.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import (
    ReadableSpan,
    Span,
    SpanProcessor,
)

from ._attributes import Shape, arguments_text, decision_attributes
from ._conventions import (
    SpanModelCall,
    SpanToolCall,
    may_be_model_span,
    may_be_tool_span,
    may_request_calls,
    model_call_from_span,
)
from ._conventions._gates import (
    END_GATE_KEYS,
    END_GATE_OPERATIONS,
    name_may_matter_at_end,
)
from ._conventions._keys import GEN_AI_OPERATION_NAME as _OPERATION
from ._decision_spans import DECISION_EVENT as DECISION_EVENT
from ._decision_spans import SCOPE_NAME as SCOPE_NAME
from ._decision_spans import DecisionSpans
from ._early import Early
from ._guard import LoopGuard
from ._lazy import LOGGER_NAME
from ._policy import Action, Decision, Phase
from ._request_ledger import _START_DECISIONS, MAX_CACHED_FRAMES, NO_CALL, RequestLedger

# Importable from here as before (the exporter's readers of an SDK span).
from ._sdk_spans import span_attributes as span_attributes
from ._sdk_spans import span_events as span_events
from ._sdk_spans import span_failed as span_failed
from ._span_calls import (
    Keys,
    call_at_end,
    call_at_start,
    call_ended,
    call_outcome_at_end,
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
    ancestor_keys,
    nearest_agent,
    session_for,
)
from ._spend import MAX_ANCESTORS

__all__ = [
    "DECISION_EVENT",
    "SCOPE_NAME",
    "LoopGuardSpanProcessor",
    "current_decision",
]

_log = logging.getLogger(LOGGER_NAME)

#: Post-call conclusions kept for framework adapters (:meth:`LoopGuardSpanProcessor.
#: take_concluded`); the oldest is dropped beyond this (nobody took it: no adapter).
_MAX_CONCLUDED: Final = 1024

# An open span as the processor tracks it (see the module docstring): a weak reference, one
# fixed-size object made in C, so tracking costs about a dict insert.
_track: Final = weakref.ref

#: Span names known to be plain: no name gate at a span's end opens for one
#: (:func:`name_may_matter_at_end`) and no agent run or tool span starts with one
#: (:data:`START_NAME_PREFIXES`). A name decides nothing alone (the attributes are tested too):
#: this answers the name's part of both tests with one set lookup. Learned by
#: :func:`_plain_name`, emptied when it holds :data:`_MAX_PLAIN_NAMES` (names of unbounded
#: cardinality then cost a test each, as without it). Shared by every processor: the tests are
#: the tables', the same for all.
_PLAIN_NAMES: Final[set[str]] = set()
_MAX_PLAIN_NAMES: Final = 4096


def _plain_name(name: object) -> bool:
    """Whether no name gate at a span's end opens for ``name`` (``False`` for a name that is
    not a ``str``: the exact tests decide); remembered in :data:`_PLAIN_NAMES` when no agent
    run or tool span starts with it either. Never raises."""
    if type(name) is not str or name_may_matter_at_end(name):
        return False
    if name[:4] not in START_NAME_PREFIXES:
        plain = _PLAIN_NAMES
        if len(plain) >= _MAX_PLAIN_NAMES:
            plain.clear()
        plain.add(name)
    return True


def current_decision() -> Decision | None:
    """The decision made at the start of the current span (a tool span whose instrumentation
    passes the arguments at start, e.g. Pydantic AI), or ``None``.

    A tool body or decorator running inside that span can enforce it::

        decision = current_decision()
        if decision is not None and decision.blocks:
            return decision.message
    """
    span = trace.get_current_span()
    return _START_DECISIONS.get(span.get_span_context().span_id)


class LoopGuardSpanProcessor(RequestLedger, DecisionSpans, SpanProcessor):
    """Feeds tool-call spans to a :class:`LoopGuard` and records its decisions as span events.

    ``guard``: share one with the hook API; default: a new guard with the ``default`` preset and
    ``LOOPGUARD_*`` overrides.
    ``key_by``: ``"trace"`` (trace + agent; default) or ``"conversation"`` (see
    :mod:`otel_loopguard._spans`).
    ``capture_arguments``: add the canonical arguments (cut to the policy's preview length) to
    decision events; off by default, since arguments may hold secrets.
    ``tracer_provider``: where the ``loopguard.decision`` spans (decisions made at a tool span's
    end) are started. Default: the tool span's own provider, reached through the SDK span
    (its private ``_span_processor``, ``_sampler`` and ``_limits``, read with ``getattr``), so
    they reach the exporters of the provider the processor is on. Where that cannot be read (a
    tool span not tracked from its start: the processor was added later, or forgot it past
    ``max_tracked_spans`` or ``span_ttl_seconds``; or an SDK without those attributes) they go
    to the global provider: counted in :attr:`decisions_to_global_provider`, logged once.
    ``decide_requests``: decide each tool call a model span's response requests when the model
    span ends, before the tool runs (content capture on; every framework whose model spans
    carry the request, see :mod:`otel_loopguard._conventions._requested`): the tool span's
    start then finds the decision, so ``current_decision()`` and ``@otel_loopguard.enforce``
    inside it act on it, a framework hook's ``before_tool`` gets it without counting the call
    again, and the tool span's end only adds the outcome. The decisions are recorded at the
    model span's end with ``loopguard.phase`` ``request``. Off by default: the exporter,
    ``replay`` and ``serve`` decide at the tool span.
    """

    def __init__(
        self,
        guard: LoopGuard | None = None,
        *,
        key_by: KeyBy | str = KeyBy.TRACE,
        capture_arguments: bool = False,
        max_tracked_spans: int = 100_000,
        span_ttl_seconds: float = 3600.0,
        tracer_provider: trace.TracerProvider | None = None,
        decide_requests: bool = False,
    ) -> None:
        if guard is not None and not isinstance(guard, LoopGuard):
            raise ValueError(f"guard: expected a LoopGuard, got {type(guard).__name__}")
        try:
            self.key_by = KeyBy(key_by)
        except ValueError:
            raise ValueError(
                f"key_by: expected 'trace' or 'conversation', got {key_by!r}"
            ) from None
        if (
            not isinstance(max_tracked_spans, int)
            or isinstance(max_tracked_spans, bool)
            or (max_tracked_spans < 1)
        ):
            raise ValueError(
                f"max_tracked_spans: expected a positive integer, got {max_tracked_spans!r}"
            )
        if (
            isinstance(span_ttl_seconds, bool)
            or not isinstance(span_ttl_seconds, (int, float))
            or (not span_ttl_seconds > 0)
        ):
            raise ValueError(f"span_ttl_seconds: expected a number > 0, got {span_ttl_seconds!r}")
        self.guard = guard if guard is not None else LoopGuard()
        # Tool names with a kept requested call (the guard's early table, never replaced):
        # read at every span's start.
        self._early_tools = self.guard.early.tools
        self.capture_arguments = bool(capture_arguments)
        if not isinstance(decide_requests, bool):
            raise ValueError(f"decide_requests: expected true or false, got {decide_requests!r}")
        self.decide_requests = decide_requests
        self._max_spans = max_tracked_spans
        self._ttl_ns = int(span_ttl_seconds * 1e9)
        self._tracer_provider = tracer_provider
        # Where decision spans are started, with whether that provider runs its processors on a
        # pool (see _emitter), made on first need: tracer_provider's; the tool span's own
        # provider's, by the SDK span processor its spans end through; the global provider's.
        self._explicit: tuple[trace.Tracer, bool] | None = None
        self._pipelines: dict[SpanProcessor, tuple[trace.Tracer, bool]] = {}
        self._global: tuple[trace.Tracer, bool] | None = None
        #: Decision spans sent to the global provider because the tool span's own provider could
        #: not be found (see the class docstring); the first is logged.
        self.decisions_to_global_provider = 0
        self._fallback_lock = threading.Lock()
        # Under a ConcurrentMultiSpanProcessor, on_end runs on the provider's pool: starting the
        # decision span there would wait on that same pool. Those spans are emitted from one
        # thread of ours instead (created on first need).
        self._emitter: ThreadPoolExecutor | None = None
        self._emitter_lock = threading.Lock()
        # Open spans by span id, oldest first, as weak references: a span the application drops
        # unended is freed, not kept here. Plain dict operations are atomic under the GIL; the
        # lock only guards the occasional pruning.
        self._open: dict[int, weakref.ref[Span]] = {}
        self._prune_lock = threading.Lock()
        # Tool spans decided at start: span id -> (session, agent, call id).
        self._started: dict[int, tuple[str, str | None, str | None]] = {}
        # The call a tool span decided at start was read as then (a subset of _started): span
        # id -> the call; its end reads only the outcome.
        self._start_calls: dict[int, SpanToolCall] = {}
        # Tool spans that claimed a call decided from the model's request (a subset of
        # _started): span id -> the kept call, forgotten at the span's end.
        self._claimed: dict[int, Early] = {}
        # Keyed by conversation: the keys an agent's requested calls were kept under, by (trace
        # id, agent span id), for tool spans that name their conversation only later.
        self._requested_keys: dict[tuple[int, int | None], tuple[str, str | None]] = {}
        # The agent frame found above a tool span's parent, by parent span id: the next tool
        # span under the same parent (an agent, an event-loop cycle) skips the walk. Span ids are
        # unique, so entries never go stale; the table is simply cleared when full.
        self._frames: dict[int, AgentFrame | None] = {}
        # The keys of the agents above a model span's agent (ancestor_keys), by (agent span id,
        # the model span's keys and agent labels): the same for every turn of that agent.
        self._above: dict[
            tuple[int, tuple[str, str | None], str | None, str | None],
            tuple[tuple[str, str | None], ...],
        ] = {}
        # Post-call conclusions at span end, by (session, agent, signature), oldest first, until
        # a framework adapter takes them (take_concluded).
        self._concluded: dict[tuple[str, str | None, str], Decision] = {}
        self._concluded_lock = threading.Lock()
        self.evicted_spans = 0

    # -- SpanProcessor ---------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Called on the thread starting ``span``; must not block or raise."""
        try:
            try:  # the SDK span's own fields: its properties cost more than a plain span's rest
                span_id = span._context[1]  # type: ignore[index] # a tuple; .span_id: a property
                name = span._name
            except Exception:  # not the SDK's span: its public API
                context = span.get_span_context()
                if context is None:
                    return
                span_id, name = context.span_id, span.name
            opened = self._open
            opened[span_id] = _track(span)
            if name in _PLAIN_NAMES or name[:4] not in START_NAME_PREFIXES:
                if self._early_tools:  # calls a model requested wait for their tool spans
                    self._claim(span, name, span_id, span.get_span_context().trace_id, None)
            else:  # may be an agent run, or a tool span with its arguments already set
                self._start(span, name, span_id, span.get_span_context().trace_id)
            # After _start and _claim: pruning also forgets what they kept for a span it drops
            # (even this one, when its start time is already older than the TTL).
            if len(opened) > self._max_spans:
                self._prune()
        except Exception as exc:  # the SDK does not catch processor errors
            self.guard.report_internal_error("span_processor.on_start", exc)

    def on_end(self, span: ReadableSpan) -> None:
        """Called on the thread ending ``span``; must not block or raise."""
        try:
            try:  # the SDK span's own fields, as on_start, and its attributes' inner dict
                span_id = span._context[1]  # type: ignore[index]
                name = span._name
                attributes = span._attributes._dict  # type: ignore[union-attr]
                if attributes.__class__ is not dict:
                    attributes = span_attributes(span)
            except Exception:  # not the SDK's span: its public API
                context = span.get_span_context()
                if context is None:
                    return
                span_id, name, attributes = context.span_id, span.name, span_attributes(span)
            # Most spans end here: not decided or claimed at start, and no reader at the end
            # (tool, model usage, requested calls) can answer anything for them. This is
            # may_matter_at_end, inline (a call costs as much as the test), its name's part
            # answered by _PLAIN_NAMES; test_processor_plain_spans checks that both agree.
            started = self._started
            if (
                (not started or span_id not in started)
                and END_GATE_KEYS.isdisjoint(attributes)
                and (
                    _OPERATION not in attributes
                    or (
                        (operation := attributes[_OPERATION]).__class__ is str
                        and operation not in END_GATE_OPERATIONS
                    )
                )
            ):
                try:
                    plain = name in _PLAIN_NAMES or _plain_name(name)
                except TypeError:  # an unhashable name: the exact tests decide
                    plain = False
                if plain:
                    try:
                        del self._open[span_id]
                    except KeyError:  # not tracked: started before this processor, or pruned
                        pass
                    return
            tracked = self._open.pop(span_id, None)
            context = span.get_span_context()
            if context is not None:
                self._ended(span, name, attributes, span_id, context.trace_id, tracked)
        except Exception as exc:
            self.guard.report_internal_error("span_processor.on_end", exc)

    def _ended(
        self,
        span: ReadableSpan,
        name: str,
        attributes: Mapping[str, Any],
        span_id: int,
        trace_id: int,
        tracked: weakref.ref[Span] | None,
    ) -> None:
        """A span that may matter has ended (on_end, past its gate)."""
        # A tool span decided at its start (not merely claiming a requested call) is a tool
        # span: its end skips the gate.
        if (
            (span_id in self._started and span_id not in self._claimed)
            or may_be_tool_span(name, attributes)
        ) and self._end(span, name, attributes, span_id, trace_id, tracked):
            return
        if self._claimed and span_id in self._claimed:
            self._unclaim(span_id)  # it started like a requested call's tool span; it was not
        model = None
        usage = may_be_model_span(attributes)  # a few dict lookups; most spans end here
        if usage:
            model = model_call_from_span(name, attributes)
            if model is not None:
                self._model_end(model, span, trace_id, attributes)
        if self.decide_requests and may_request_calls(attributes, usage):
            self._requested(span, name, attributes, trace_id, model, tracked)

    def shutdown(self) -> None:
        """Forget all bookkeeping and stop the guard's advisor worker."""
        self._open.clear()
        self._frames.clear()
        self._above.clear()
        with self._concluded_lock:
            self._concluded.clear()
        for span_id in list(self._started):
            _START_DECISIONS.pop(span_id, None)
        self._started.clear()
        self._start_calls.clear()
        self._claimed.clear()
        self._requested_keys.clear()
        self.guard.early.clear()
        if self._emitter is not None:
            self._emitter.shutdown(wait=True)
        self.guard.close()

    def current_session(self) -> tuple[str, str | None] | None:
        """The (session, agent) this processor keys the current span's tool calls by, so a
        framework hook asking ``guard.before_tool(..., session=..., agent=..., call_id=...)``
        from inside the agent (or tool) span shares state with the spans and each call counts
        once. ``None`` outside any span of this provider."""
        span = trace.get_current_span()
        context = span.get_span_context()
        if not context.is_valid:
            return None
        started = self._started.get(context.span_id)
        if started is not None:  # a tool span decided at its start: the keys it was decided by
            return started[0], started[1]
        frame = nearest_agent(context.span_id, self._view)
        attributes = span_attributes(span) if isinstance(span, ReadableSpan) else {}
        return session_for(NO_CALL, context.trace_id, frame, self.key_by, attributes)

    def take_concluded(self, session: str, agent: str | None, signature: str) -> Decision | None:
        """The conclusion (``phase`` post, not allow) the guard drew at the end of a tool span
        of the call with ``signature`` (:attr:`Decision.signature`) in ``session`` and ``agent``,
        handed over once; ``None`` when there is none.

        For framework adapters given ``processor=``: where the tool span ends before the
        framework's after-call hook (LangGraph's and Strands' do), the span reports the call
        first, so the guard hands its conclusion to the span, and the hook's own report of the
        call gets ``None``; the hook takes it here and ends the run. An adapter takes (and drops)
        it also before a new attempt of the same call, so a conclusion that no hook took never
        reaches a later call. Called on the framework's thread; never blocks for long."""
        if not self._concluded:
            return None
        with self._concluded_lock:
            return self._concluded.pop((session, agent, signature), None)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered: decisions are made on the calling thread. Returns True."""
        return True

    # -- internals -------------------------------------------------------------------------

    def _prune(self) -> None:
        """Forget the oldest quarter of the open spans, any older than the TTL and any the
        application dropped without ending them, with what was kept for them (decisions made at
        their start).

        Entries are deleted from the live table, never swapped for a new one: another thread may
        be inserting a span right now, and its insert must not land in a discarded table.
        """
        with self._prune_lock:
            opened = self._open
            if len(opened) <= self._max_spans:
                return
            items = list(opened.items())  # one C-level copy: atomic under the GIL
            drop_before = len(items) // 4
            deadline = time.time_ns() - self._ttl_ns
            dropped = []
            for index, (span_id, tracked) in enumerate(items):
                span = tracked()
                if index < drop_before or span is None or (span.start_time or 0) < deadline:
                    dropped.append(span_id)
            for span_id in dropped:
                opened.pop(span_id, None)
                if self._started.pop(span_id, None) is not None:
                    _START_DECISIONS.pop(span_id, None)
                self._claimed.pop(span_id, None)
                self._start_calls.pop(span_id, None)
            self.evicted_spans += len(dropped)

    def _view(self, span_id: int) -> SpanView | None:
        """An open span as the resolver sees it, read now (its name and attributes may have
        changed since it started); ``None`` when not tracked, or dropped unended."""
        tracked = self._open.get(span_id)
        span = tracked() if tracked is not None else None
        if span is None:
            return None
        parent = span.parent
        return SpanView(span.name, span_attributes(span), parent.span_id if parent else None)

    def _keys(
        self,
        call: SpanToolCall | SpanModelCall,
        span: ReadableSpan,
        trace_id: int,
        attributes: Mapping[str, Any],
    ) -> tuple[str, str | None]:
        return session_for(call, trace_id, self._frame(span), self.key_by, attributes)

    def _frame(self, span: ReadableSpan) -> AgentFrame | None:
        # A remote parent is followed too, as current_session() and the ancestors' own links
        # are: one this processor tracks is in this process (an MCP server's tools/call span,
        # its parent from the request's _meta, under the host's agent span), and one it never
        # saw ends the walk at once.
        parent = span.parent
        parent_id = parent.span_id if parent else None
        frames = self._frames
        if parent_id is not None and parent_id in frames:
            frame = frames[parent_id]
        else:
            frame = nearest_agent(parent_id, self._view)
            if parent_id is not None:
                if len(frames) >= MAX_CACHED_FRAMES:
                    frames.clear()
                frames[parent_id] = frame
        return frame

    def _start(self, span: Span, name: str, span_id: int, trace_id: int) -> None:
        """A span that may be an agent run or a tool span with its arguments already set."""
        attributes = span_attributes(span)
        call = call_at_start(name, attributes)
        if self._early_tools and self._claim(span, name, span_id, trace_id, call):
            return  # decided from the model's request: not counted again
        if call is None:
            if self.key_by is KeyBy.CONVERSATION:
                run = run_started(name, attributes)
                if run is not None:
                    self.guard.new_run(run[0], agent=run[1])
            return
        session, agent = self._keys(call, span, trace_id, attributes)
        keys = (session, agent, call.call_id)
        decision = call_started(self.guard, call.tool, call.arguments, keys, (trace_id, span_id))
        self._started[span_id] = keys
        self._start_calls[span_id] = call
        _START_DECISIONS[span_id] = decision
        if decision.detected is not Action.ALLOW:
            self._record(span, decision, call)

    def _end(
        self,
        span: ReadableSpan,
        name: str,
        attributes: Mapping[str, Any],
        span_id: int,
        trace_id: int,
        tracked: weakref.ref[Span] | None = None,
    ) -> bool:
        """A span that passed the tool-span gate has ended; whether it was a tool span.
        ``tracked``: the live SDK span, as tracked since its start (the way to its provider's
        pipeline)."""
        if name == DECISION_EVENT:
            return True  # ours, back through the pipeline: never a tool call (nor a model's)
        started = self._started.pop(span_id, None)
        claimed = None
        at_start = None
        if started is not None:
            _START_DECISIONS.pop(span_id, None)
            if self._claimed:
                claimed = self._claimed.pop(span_id, None)
            at_start = self._start_calls.pop(span_id, None)
        if at_start is not None and started is not None:
            # Read at its start (never a claimed call's span): only the outcome is new. The call
            # keeps the objects its start was decided with (the guard then finds its attempt by
            # identity).
            outcome = call_outcome_at_end(name, attributes, span_events(span), span_failed(span))
            if outcome is None:
                return True
            tool, arguments, call_id = at_start.tool, at_start.arguments, at_start.call_id
            keys: Keys | Callable[[], Keys] = started
            _, result, failed = outcome
        else:
            call = call_at_end(name, attributes, span_events(span), span_failed(span))
            if claimed is not None and started is not None:
                # A requested call's tool span ended: it ran (whether it failed, for the intent
                # sentence); forget the kept decision.
                ended_at = (span.end_time or time.time_ns()) / 1e9
                self.guard.requested_ran(
                    started[0], started[1], claimed, call.is_error if call else None, ended_at
                )
            if call is None:
                return started is not None
            tool, arguments, call_id = call.tool, call.arguments, call.call_id
            result, failed = call.result, call.is_error
            keys = (
                started
                if started is not None
                else lambda: (*self._keys(call, span, trace_id, attributes), call.call_id)
            )
        ended = call_ended(
            self.guard,
            tool,
            arguments,
            keys,
            failed,
            result,
            duration_seconds(span.start_time, span.end_time),
            (trace_id, span_id),  # the exemplar of what it counts
        )
        if ended is None:
            return True
        (session, agent, _), arguments, decision = ended
        if decision is not None and decision.detected is not Action.ALLOW:
            self._record_after(span, decision, call_id, arguments, tracked)
            if decision.phase is Phase.POST and decision.action is not Action.ALLOW:
                self._conclude(session, agent, decision)
        return True

    def _model_end(
        self,
        model: SpanModelCall,
        span: ReadableSpan,
        trace_id: int,
        attributes: Mapping[str, Any],
    ) -> None:
        """A model call's span ended: its usage, under the keys its turn's tool calls get (the
        same agent ancestry)."""

        def keys() -> tuple[str, str | None, tuple[tuple[str, str | None], ...]]:
            frame = self._frame(span)
            found = session_for(model, trace_id, frame, self.key_by, attributes)
            if frame is None:
                return (*found, ())
            # The agents above a model span's agent are found once per agent and keys: the
            # next model span of that agent (every turn) skips the walk. Keyed by trace, the
            # keys hold the trace and the agent's span id, and the label only a frame without a
            # name takes from the model span.
            cached = (frame.span_id, found, model.agent_name, model.agent_id)
            above_keys = self._above
            above = above_keys.get(cached)
            if above is None:
                above = ancestor_keys(
                    model, trace_id, frame, self.key_by, self._view, found, MAX_ANCESTORS
                )
                if len(above_keys) >= MAX_CACHED_FRAMES:
                    above_keys.clear()
                above_keys[cached] = above
            return (*found, above)

        model_ended(self.guard, model, keys)

    def _conclude(self, session: str, agent: str | None, decision: Decision) -> None:
        """Keep a post-call conclusion for the adapter whose report comes after the span's."""
        with self._concluded_lock:
            concluded = self._concluded
            concluded[(session, agent, decision.signature)] = decision
            while len(concluded) > _MAX_CONCLUDED:
                del concluded[next(iter(concluded))]

    def _event_attributes(
        self, decision: Decision, call_id: str | None, arguments: object
    ) -> dict[str, Any]:
        policy = self.guard.policy
        return decision_attributes(
            decision,
            Shape.SPAN,
            mode=policy.mode,
            call_id=call_id,
            arguments=arguments_text(arguments, policy) if self.capture_arguments else None,
        )

    def _record(self, span: Span, decision: Decision, call: SpanToolCall) -> None:
        """At start: the decision goes on the (still open) tool span itself."""
        span.add_event(
            DECISION_EVENT, self._event_attributes(decision, call.call_id, call.arguments)
        )

    def _record_after(
        self,
        span: ReadableSpan,
        decision: Decision,
        call_id: str | None,
        arguments: object,
        tracked: weakref.ref[Span] | None = None,
    ) -> None:
        """At end: a short ``loopguard.decision`` span, a sibling of the tool span (a child of
        its parent; of the tool span itself when it has none), carrying the decision as its
        attributes and as one event. It ends at once, so the decision reaches the exporter
        whatever the application does next (an ancestor that never ends, because its agent
        raised, would have kept an event on it from ever being exported), and no span object is
        held for it. It is started through the tool span's own provider unless
        ``tracer_provider`` was given (:meth:`_decision_tracer`). Under a
        ``ConcurrentMultiSpanProcessor`` (whose pool runs this ``on_end``, and would be waited on
        by a span started here) the decision span is emitted from one thread of this processor
        instead, moments later; ``shutdown`` waits for it."""
        attributes = self._event_attributes(decision, call_id, arguments)
        span_context = span.get_span_context()
        if span_context is None:
            return
        parent = span.parent
        anchor = parent if parent is not None else span_context
        tracer, concurrent = self._decision_tracer(tracked)
        if concurrent:
            with self._emitter_lock:
                emitter = self._emitter
                if emitter is None:
                    emitter = self._emitter = ThreadPoolExecutor(
                        1, thread_name_prefix="loopguard-decisions"
                    )
            emitter.submit(self._emit_decision, tracer, anchor, attributes)
        else:
            self._emit_decision(tracer, anchor, attributes)
