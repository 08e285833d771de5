"""Where the span processor's ``loopguard.decision`` spans go: through the tool span's own
provider (a private ``TracerProvider`` on that span's processor pipeline), else the one given as
``tracer_provider``, else the global provider (counted, logged once). A mixin of
:class:`~otel_loopguard.processor.LoopGuardSpanProcessor`, which owns the state it declares."""

from __future__ import annotations

import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace
from opentelemetry.sdk.trace import (
    ConcurrentMultiSpanProcessor,
    Span,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)
from opentelemetry.trace import NonRecordingSpan

from ._lazy import LOGGER_NAME

if TYPE_CHECKING:
    from ._guard import LoopGuard

__all__ = ["DECISION_EVENT", "SCOPE_NAME", "DecisionSpans"]

_log = logging.getLogger(LOGGER_NAME)

#: Name of the span event (and of the fallback span) that records a non-allow decision.
DECISION_EVENT: Final = "loopguard.decision"

#: The instrumentation scope of the decision spans (the processor's and the exporter's); with
#: their name, how the exporter knows its own spans when they come back through a provider.
SCOPE_NAME: Final = "otel_loopguard"

#: Tool-span pipelines (providers) a processor keeps a decision tracer for; one in practice.
_MAX_PIPELINES: Final = 16


class DecisionSpans:
    """The decision spans' tracers (see the module)."""

    guard: LoopGuard
    _tracer_provider: trace.TracerProvider | None
    _explicit: tuple[trace.Tracer, bool] | None
    _pipelines: dict[SpanProcessor, tuple[trace.Tracer, bool]]
    _global: tuple[trace.Tracer, bool] | None
    decisions_to_global_provider: int
    _fallback_lock: threading.Lock

    def _decision_tracer(self, tracked: weakref.ref[Span] | None) -> tuple[trace.Tracer, bool]:
        """The tracer a decision span about a tool span is started with, and whether its
        provider runs span processors on a pool: ``tracer_provider``'s when given; else one on
        the tool span's own pipeline; else the global provider's (counted, logged once).

        The SDK span knows its provider's span processor (``_span_processor``), sampler and
        limits, and its resource, but not the provider. A private ``TracerProvider`` is built
        on that same span processor (never shut down: the pipeline is the application's), so the
        decision span goes through every processor of the tool span's provider, with its sampler
        and resource. One is kept per pipeline (a processor is on one provider in practice; at
        most ``_MAX_PIPELINES``). Never raises."""
        if self._tracer_provider is not None:
            explicit = self._explicit
            if explicit is None:
                explicit = self._explicit = _tracer_on(self._tracer_provider)
            return explicit
        live = tracked() if tracked is not None else None
        pipeline = getattr(live, "_span_processor", None)
        if live is None:
            reason = (
                "the tool span was not tracked from its start (the processor was added later, or"
                " forgot it past max_tracked_spans or span_ttl_seconds)"
            )
        elif isinstance(pipeline, (SynchronousMultiSpanProcessor, ConcurrentMultiSpanProcessor)):
            pipelines = self._pipelines
            known = pipelines.get(pipeline)
            if known is not None:
                return known
            try:
                tracer, concurrent = _tracer_on(
                    TracerProvider(
                        sampler=getattr(live, "_sampler", None),
                        resource=live.resource,
                        shutdown_on_exit=False,
                        active_span_processor=pipeline,
                        span_limits=getattr(live, "_limits", None),
                    )
                )
            except Exception as exc:
                reason = f"no tracer on its span processor ({type(exc).__name__}: {exc})"
            else:
                if len(pipelines) >= _MAX_PIPELINES:
                    pipelines.clear()
                pipelines[pipeline] = (tracer, concurrent)
                return tracer, concurrent
        else:
            reason = f"the SDK span has no span processor pipeline ({type(pipeline).__name__})"
        return self._to_global(reason)

    def _to_global(self, reason: str) -> tuple[trace.Tracer, bool]:
        """The global provider's tracer, for a decision span whose tool span's provider was not
        found; counted, and the first one logged."""
        with self._fallback_lock:
            self.decisions_to_global_provider += 1
            first = self.decisions_to_global_provider == 1
        if first:
            _log.warning(
                "loopguard: a loopguard.decision span goes to the global tracer provider, not"
                " the tool span's: %s. Pass tracer_provider= to LoopGuardSpanProcessor to choose"
                " the provider (further ones are counted in decisions_to_global_provider, not"
                " logged)",
                reason,
            )
        known = self._global
        if known is None:
            known = self._global = _tracer_on(trace.get_tracer_provider())
        return known

    def _emit_decision(
        self, tracer: trace.Tracer, anchor: trace.SpanContext, attributes: dict[str, Any]
    ) -> None:
        try:
            context = trace.set_span_in_context(NonRecordingSpan(anchor))
            decision_span = tracer.start_span(
                DECISION_EVENT, context=context, attributes=attributes
            )
            decision_span.add_event(DECISION_EVENT, attributes)
            decision_span.end()
        except Exception as exc:  # never into the application, nor the emitter thread
            self.guard.report_internal_error("span_processor.decision_span", exc)


def _tracer_on(provider: trace.TracerProvider) -> tuple[trace.Tracer, bool]:
    """``provider``'s tracer for decision spans, and whether it runs its span processors on a
    pool (a ``ConcurrentMultiSpanProcessor``)."""
    concurrent = isinstance(
        getattr(provider, "_active_span_processor", None), ConcurrentMultiSpanProcessor
    )
    return provider.get_tracer(SCOPE_NAME), concurrent
