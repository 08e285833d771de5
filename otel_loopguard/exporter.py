"""LoopGuardSpanExporter: loop detection on the SDK's batch worker, nothing on the application's
thread.

Put it in the ``BatchSpanProcessor`` you already run::

    provider.add_span_processor(BatchSpanProcessor(LoopGuardSpanExporter()))

or chain it in front of your real exporter, which then gets every batch unchanged plus the
decision spans::

    provider.add_span_processor(
        BatchSpanProcessor(LoopGuardSpanExporter(next=OTLPSpanExporter(...)))
    )

The application's thread only enqueues the finished span (the ``BatchSpanProcessor``'s own
cost); this exporter runs on the processor's worker thread. It feeds the finished spans through
the same conventions (:mod:`otel_loopguard._conventions`), session keys
(:mod:`otel_loopguard._spans`), ordered trace buffer
(:class:`~otel_loopguard._traces.TraceBuffer`) and guard calls
(:func:`~otel_loopguard._trace_events.feed`) as ``otel-loopguard serve`` and ``replay``, so its
decisions and the guard's metrics are theirs.

Ordering. A batch carries spans in the order they ended: children before their parents, the
agent span after its tools. Spans are held per trace until the trace's local root (no parent, or
a parent in another process) is exported, then judged in the order the span processor would have
seen them. A trace whose root has not come is judged at the first export (or flush) after its
tool spans waited ``hold_seconds``, with the ancestors seen so far: an agent run longer than that
is keyed by its trace alone until its agent span ends (as ``serve`` does). ``force_flush`` and
``shutdown`` judge every trace still held. The ``BatchSpanProcessor``'s own ``force_flush`` does
not call its exporter's, so ``provider.force_flush()`` only empties the queue into this exporter;
call ``exporter.force_flush()`` to have the traces still held judged too.

Decisions. Each decision other than allow becomes a ``loopguard.decision`` span: a sibling of the
tool span (a child of its parent; of the tool span itself when it has no local parent), zero
length, at the moment the processor would have decided (the tool span's start for calls whose
arguments are there at start, else its end), with the processor's event attributes on the span
and on one ``loopguard.decision`` event. Chained (``next``), they are built here as
``ReadableSpan`` objects and exported through ``next`` with the batch they came from: they never
enter the application's pipeline, so they cannot loop back. Unchained, they are started with
``tracer_provider``'s tracer (default: the global provider), so they reach the exporters of that
provider, this one included: it recognises its own decision spans and skips them. An exporter
sees finished spans only, which do not lead back to their provider (the span processor does
better: :mod:`otel_loopguard.processor`), so unchained on a provider that is not the global one,
pass ``tracer_provider=`` (or chain with ``next``): without it, the first time decision spans
would demonstrably miss the tool spans' provider (no SDK provider is set globally, so they are
dropped; or the global provider's resource is not the tool spans'), one warning says so.

Threading contract: ``export``, ``force_flush`` and ``shutdown`` may be called from any thread
(the worker, a thread flushing); one lock serialises them. While it judges a batch, ``export``
hands the GIL over about every :data:`YIELD_EVERY_NS` (0.2 ms) of work, so an application thread
waits about that long for it, not the interpreter's 5 ms switch interval, and a thread that never
lets go of the GIL loses under 4% of its time to the judging. Such an application thereby defers
the judging, and if it makes spans faster than the worker's share allows, the
``BatchSpanProcessor``'s queue fills and drops spans. ``export`` never raises:
an error is counted in ``guard.internal_errors`` (``where="exporter.export"``, one log line per
kind) and the batch is still forwarded; it returns ``next``'s result when chained, else
``SUCCESS`` (``FAILURE`` once shut down). Memory: at most ``max_buffered_spans`` spans are held
(parent links included); past it the oldest traces are judged early.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from ._attributes import Shape, arguments_text, decision_attributes
from ._conventions import agent_from_span, may_be_model_span, may_be_tool_span
from ._guard import LoopGuard
from ._lazy import LOGGER_NAME
from ._otlp_json import RecordedSpan
from ._policy import Action, Decision
from ._sdk_spans import span_attributes, span_events, span_failed
from ._spans import KeyBy
from ._trace_events import CallDecidedAtStart, CallObserved, SpanRef, TraceEvent, feed
from ._traces import MAX_BUFFERED_SPANS, TraceBuffer
from .processor import DECISION_EVENT, SCOPE_NAME

__all__ = [
    "DEFAULT_HOLD_SECONDS",
    "SCOPE_NAME",
    "YIELD_EVERY_NS",
    "LoopGuardSpanExporter",
]

#: Seconds a trace's tool spans wait for its root before they are judged with the ancestors seen
#: so far (as ``serve``'s ``--hold-seconds``). They are judged at the first export or flush after
#: that, so with the ``BatchSpanProcessor``'s 5 s schedule a tool span waits about one batch.
DEFAULT_HOLD_SECONDS: Final = 2.0

#: Nanoseconds of work after which ``export`` hands the GIL to other threads (``time.sleep(0)``),
#: so an application thread waiting for it while a batch is judged waits about this long, not the
#: interpreter's switch interval (5 ms). An application thread that never lets go of the GIL gets
#: it back from the worker after at most this long, and gives it up again only after the switch
#: interval: the worker takes at most 0.2 / (5 + 0.2), under 4%, of that thread's time (issue
#: 29's budget is 5%; at 0.5 ms it was up to 9%).
YIELD_EVERY_NS: Final = 200_000

_log = logging.getLogger(LOGGER_NAME)

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)


@dataclass(frozen=True, slots=True)
class _Decided:
    """A decision to show in the trace: beside which span, when, with what attributes."""

    ref: SpanRef
    time_ns: int
    attributes: dict[str, Any]


class LoopGuardSpanExporter(SpanExporter):
    """Feeds the tool spans of each exported batch to a :class:`LoopGuard`, in trace order, and
    shows its decisions as ``loopguard.decision`` spans (see the module docstring).

    ``guard``: share one with the hook API (a call reported by both counts once); default: a new
    guard with the ``default`` preset and ``LOOPGUARD_*`` overrides. ``shutdown`` closes it.
    ``next``: the exporter to forward every batch to, unchanged, with the decision spans; its
    result is ``export``'s.
    ``key_by``: ``"trace"`` (trace + agent; default) or ``"conversation"``.
    ``capture_arguments``: add the canonical arguments (cut to the policy's preview length) to
    the decision spans; off by default, since arguments may hold secrets.
    ``hold_seconds``: how long a trace's tool spans wait for its root (``None``: until the root
    comes, a flush, or the capacity bound); default :data:`DEFAULT_HOLD_SECONDS`.
    ``max_buffered_spans``: spans held at most, across traces.
    ``tracer_provider``: unchained only, where decision spans are started (default: the global
    provider); chained they go to ``next``, so passing both is an error.
    ``clock``: seconds, for the hold (tests inject one).
    """

    def __init__(
        self,
        guard: LoopGuard | None = None,
        *,
        next: SpanExporter | None = None,
        key_by: KeyBy | str = KeyBy.TRACE,
        capture_arguments: bool = False,
        hold_seconds: float | None = DEFAULT_HOLD_SECONDS,
        max_buffered_spans: int = MAX_BUFFERED_SPANS,
        tracer_provider: trace.TracerProvider | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if guard is not None and not isinstance(guard, LoopGuard):
            raise ValueError(f"guard: expected a LoopGuard, got {type(guard).__name__}")
        if next is not None and not callable(getattr(next, "export", None)):
            raise ValueError(f"next: expected a SpanExporter, got {type(next).__name__}")
        if next is not None and tracer_provider is not None:
            raise ValueError(
                "tracer_provider: decision spans go to next when it is given; pass one or the other"
            )
        if (
            isinstance(max_buffered_spans, bool)
            or not isinstance(max_buffered_spans, int)
            or max_buffered_spans < 1
        ):
            raise ValueError(
                f"max_buffered_spans: expected a positive integer, got {max_buffered_spans!r}"
            )
        self._buffer = TraceBuffer(
            max_buffered_spans, hold_seconds=hold_seconds, key_by=key_by, clock=clock
        )
        self.key_by = KeyBy(key_by)
        self.guard = guard if guard is not None else LoopGuard()
        self.capture_arguments = bool(capture_arguments)
        self._next = next
        self._tracer_provider = tracer_provider
        self._tracer: trace.Tracer | None = None
        self._ids = RandomIdGenerator()
        self._scope = InstrumentationScope(SCOPE_NAME)
        self._resource: Resource = Resource.get_empty()
        self._lock = threading.Lock()
        self._shutdown = False
        # Unchained without tracer_provider: whether the warning that decision spans miss the
        # tool spans' provider was logged (it is checked until it is).
        self._warned_destination = False

    # -- what it holds ---------------------------------------------------------------------

    @property
    def buffered_spans(self) -> int:
        """Spans held now, waiting for their trace's root (parent links included)."""
        return self._buffer.buffered_spans

    @property
    def flushed_early_time(self) -> int:
        """Trace flushes after ``hold_seconds``, before the trace's root came."""
        return self._buffer.flushed_early_time

    @property
    def flushed_early_capacity(self) -> int:
        """Traces judged before their root came because ``max_buffered_spans`` was reached."""
        return self._buffer.flushed_early_capacity

    # -- SpanExporter ----------------------------------------------------------------------

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Called on the ``BatchSpanProcessor``'s worker (or whichever thread flushes it) with
        finished spans in the order they ended. Holds the lock while the batch is judged; never
        raises. Returns ``next``'s result when chained, else ``SUCCESS`` (``FAILURE`` once shut
        down)."""
        decided: list[_Decided] = []
        try:
            with self._lock:
                if self._shutdown:
                    return SpanExportResult.FAILURE
                self._add(spans)
                buffer = self._buffer
                decided = self._feed(buffer.take_ready())
                decided += self._feed(buffer.take_due())
        except Exception as exc:  # never raise into the SDK's worker
            self.guard.report_internal_error("exporter.export", exc)
        return self._forward(spans, decided)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Judge every trace still held (their roots have not come), export the decision spans,
        then flush ``next``. Any thread; never raises. False once shut down."""
        try:
            with self._lock:
                if self._shutdown:
                    return False
                decided = self._feed(self._buffer.finish())
        except Exception as exc:
            self.guard.report_internal_error("exporter.export", exc)
            decided = []
        self._forward((), decided)
        if self._next is None:
            return True
        try:
            return bool(self._next.force_flush(timeout_millis))
        except Exception as exc:
            self.guard.report_internal_error("exporter.next", exc)
            return False

    def shutdown(self) -> None:
        """Judge every trace still held, export the decision spans, shut ``next`` down and close
        the guard (its advisor worker). Later exports return ``FAILURE``. Never raises."""
        try:
            with self._lock:
                if self._shutdown:
                    return
                self._shutdown = True
                decided = self._feed(self._buffer.finish())
        except Exception as exc:
            self.guard.report_internal_error("exporter.export", exc)
            decided = []
        self._forward((), decided)
        if self._next is not None:
            try:
                self._next.shutdown()
            except Exception as exc:
                self.guard.report_internal_error("exporter.next", exc)
        try:
            self.guard.close()
        except Exception as exc:
            self.guard.report_internal_error("exporter.export", exc)

    # -- internals -------------------------------------------------------------------------

    def _add(self, spans: Sequence[ReadableSpan]) -> None:
        """Buffer a batch: tool, model-call and agent spans in full, every other span as a
        parent link."""
        buffer = self._buffer
        add, add_link = buffer.add, buffer.add_link
        clock = time.perf_counter_ns
        due = clock() + YIELD_EVERY_NS
        for span in spans:
            if clock() >= due:
                time.sleep(0)  # let the application's threads have the GIL
                due = clock() + YIELD_EVERY_NS
            try:
                context = span.context
                if context is None:
                    continue
                name = span.name
                if name == DECISION_EVENT and (
                    span.instrumentation_scope is not None
                    and span.instrumentation_scope.name == SCOPE_NAME
                ):
                    continue  # ours, back through the provider
                parent = span.parent
                # In-process, a span whose parent is in another process is its trace's local
                # root: it ends after every span under it, so its trace is complete here.
                parent_id = parent.span_id if parent is not None and not parent.is_remote else None
                attributes = span_attributes(span)
                if (
                    not may_be_tool_span(name, attributes)
                    and not may_be_model_span(attributes)
                    and agent_from_span(name, attributes) is None
                ):
                    add_link(context.trace_id, context.span_id, parent_id)
                    continue
                add(
                    RecordedSpan(
                        context.trace_id,
                        context.span_id,
                        parent_id,
                        name,
                        attributes,
                        span_events(span),
                        span_failed(span),
                        span.start_time or 0,
                        span.end_time or 0,
                    )
                )
                self._resource = span.resource
            except Exception as exc:  # one bad span does not lose the batch
                self.guard.report_internal_error("exporter.export", exc)

    def _feed(self, events: list[TraceEvent]) -> list[_Decided]:
        """Feed events to the guard in order; the decisions to show in the trace."""
        guard = self.guard
        decided: list[_Decided] = []
        clock = time.perf_counter_ns
        due = clock() + YIELD_EVERY_NS
        for event in events:
            if clock() >= due:
                time.sleep(0)
                due = clock() + YIELD_EVERY_NS
            decision = feed(guard, event)
            if decision is None or decision.detected is Action.ALLOW:
                continue
            if not isinstance(event, (CallDecidedAtStart, CallObserved)) or event.span is None:
                continue
            time_ns = int(event.timestamp * 1e9) if event.timestamp is not None else time.time_ns()
            decided.append(_Decided(event.span, time_ns, self._attributes(decision, event)))
        return decided

    def _attributes(
        self, decision: Decision, event: CallDecidedAtStart | CallObserved
    ) -> dict[str, Any]:
        """The span processor's ``loopguard.decision`` event attributes (the same builder; the
        tests compare them with the processor's, attribute for attribute)."""
        policy = self.guard.policy
        return decision_attributes(
            decision,
            Shape.SPAN,
            mode=policy.mode,
            call_id=event.call_id,
            arguments=arguments_text(event.arguments, policy) if self.capture_arguments else None,
        )

    def _forward(self, spans: Sequence[ReadableSpan], decided: list[_Decided]) -> SpanExportResult:
        """Hand the batch and the decision spans on; outside the lock (a tracer's processors may
        call back into ``export``)."""
        following = self._next
        if following is None:
            if decided:
                self._start_decision_spans(decided)
            return SpanExportResult.SUCCESS
        batch: Sequence[ReadableSpan] = spans
        if decided:
            try:
                batch = [*spans, *(self._decision_span(item) for item in decided)]
            except Exception as exc:
                self.guard.report_internal_error("exporter.export", exc)
        if not batch:
            return SpanExportResult.SUCCESS
        try:
            return following.export(batch)
        except Exception as exc:
            self.guard.report_internal_error("exporter.next", exc)
            return SpanExportResult.FAILURE

    def _parent(self, ref: SpanRef) -> SpanContext:
        parent_id = ref.span_id if ref.parent_id is None else ref.parent_id
        return SpanContext(ref.trace_id, parent_id, ref.parent_remote, _SAMPLED)

    def _decision_span(self, item: _Decided) -> ReadableSpan:
        """A finished decision span built here, for ``next``."""
        ref = item.ref
        context = SpanContext(ref.trace_id, self._ids.generate_span_id(), False, _SAMPLED)
        return ReadableSpan(
            name=DECISION_EVENT,
            context=context,
            parent=self._parent(ref),
            resource=self._resource,
            attributes=item.attributes,
            events=(Event(DECISION_EVENT, item.attributes, item.time_ns),),
            instrumentation_scope=self._scope,
            start_time=item.time_ns,
            end_time=item.time_ns,
        )

    def _start_decision_spans(self, decided: list[_Decided]) -> None:
        """Unchained: decision spans through ``tracer_provider``'s tracer. Never raises."""
        try:
            if self._tracer_provider is None and not self._warned_destination:
                self._check_destination()
            tracer = self._tracer
            if tracer is None:
                provider = self._tracer_provider or trace.get_tracer_provider()
                tracer = self._tracer = provider.get_tracer(SCOPE_NAME)
            for item in decided:
                parent = trace.set_span_in_context(NonRecordingSpan(self._parent(item.ref)))
                span = tracer.start_span(
                    DECISION_EVENT,
                    context=parent,
                    attributes=item.attributes,
                    start_time=item.time_ns,
                )
                span.add_event(DECISION_EVENT, item.attributes, timestamp=item.time_ns)
                span.end(end_time=item.time_ns)
        except Exception as exc:
            self.guard.report_internal_error("exporter.export", exc)

    def _check_destination(self) -> None:
        """Warn once when the global provider demonstrably is not the tool spans' provider: no
        SDK provider is set (decision spans are dropped), or its resource differs from the tool
        spans' (a provider's spans carry its resource). Two providers with equal resources
        (both the default one) cannot be told apart here."""
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            what = (
                f"no SDK tracer provider is set globally ({type(provider).__name__}),"
                " so they are dropped"
            )
        elif provider.resource != self._resource:
            what = (
                "the global provider's resource is not the tool spans', so they go to another"
                " provider's exporters"
            )
        else:
            return
        self._warned_destination = True
        _log.warning(
            "loopguard: LoopGuardSpanExporter starts its loopguard.decision spans on the global"
            " tracer provider, and %s; pass tracer_provider= (the provider it is on) or chain it"
            " with next=",
            what,
        )
