"""The span processor's ledger of calls a model requested (issue 27's early decisions): a model
span's end decides the calls its response requests before they run, and a tool span's start
claims the one it runs (its decision becomes the span's), or gives it back when it ends without
being its tool span.

A mixin of :class:`~otel_loopguard.processor.LoopGuardSpanProcessor`, which owns the state it
reads (declared below) and the agent-frame and decision-span helpers it calls; the same
threading contract (any thread, never blocks, never raises into the SDK: the processor's hooks
catch).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, Final

from opentelemetry.sdk.trace import ReadableSpan, Span

from ._conventions import (
    ANONYMOUS_TOOL_SPANS,
    MISSING,
    SpanModelCall,
    SpanToolCall,
    may_be_tool_span,
    requested_from_span,
    tool_call_from_span,
)
from ._early import Early
from ._guard import LoopGuard
from ._policy import Action, Decision
from ._sdk_spans import span_attributes, span_events
from ._span_calls import requested_ended
from ._spans import AgentFrame, KeyBy, session_for

__all__ = ["MAX_CACHED_FRAMES", "NO_CALL", "RequestLedger"]

#: Entries of the processor's small caches (agent frames, ancestors' keys, requested keys); a
#: full cache is cleared.
MAX_CACHED_FRAMES: Final = 4096

#: The call a span's keys are resolved for when it carries none (no agent or conversation of
#: its own).
NO_CALL: Final = SpanToolCall("", MISSING, None, None, None, None, None, None, "hook")


# Decisions made at span start, by span id, for current_decision(); removed at span end.
_START_DECISIONS: dict[int, Decision] = {}


class RequestLedger:
    """The requested-call methods of the span processor (see the module docstring)."""

    guard: LoopGuard
    key_by: KeyBy
    # Tool spans decided at start: span id -> (session, agent, call id).
    _started: dict[int, tuple[str, str | None, str | None]]
    # Tool spans that claimed a requested call (a subset of _started): span id -> the call.
    _claimed: dict[int, Early]
    # Keyed by conversation: the keys an agent's requested calls were kept under.
    _requested_keys: dict[tuple[int, int | None], tuple[str, str | None]]

    def _frame(self, span: ReadableSpan) -> AgentFrame | None:
        raise NotImplementedError  # the processor's

    def _record_after(
        self,
        span: ReadableSpan,
        decision: Decision,
        call_id: str | None,
        arguments: object,
        tracked: weakref.ref[Span] | None = None,
    ) -> None:
        raise NotImplementedError  # the processor's

    def _requested(
        self,
        span: ReadableSpan,
        name: str,
        attributes: Mapping[str, Any],
        trace_id: int,
        model: SpanModelCall | None,
        tracked: weakref.ref[Span] | None,
    ) -> None:
        """A model span ended: decide the calls its response requests, before they run (kept by
        the guard for their tool spans and hooks). Its non-allow decisions are recorded like a
        decision at a tool span's end (a ``loopguard.decision`` span beside it), with
        ``loopguard.phase`` ``request``."""
        requested = requested_from_span(name, attributes, lambda: span_events(span))
        if requested is None or not requested.calls:
            return
        frame = self._frame(span)
        conversation = self.key_by is KeyBy.CONVERSATION
        if conversation and frame is not None and frame.agent.conversation_id:
            # Keyed by conversation, the calls are kept under the conversation their agent
            # names, as its tool spans are: a model span may name another of its own (CrewAI's
            # own tracing gives its task id).
            keys = session_for(NO_CALL, trace_id, frame, self.key_by)
        else:
            keys = session_for(
                model if model is not None else NO_CALL, trace_id, frame, self.key_by, attributes
            )
        if conversation:
            # A tool span may name its conversation only after its start (Strands, LangGraph):
            # its start looks the calls up under the keys its agent's requests were kept by.
            requested_keys = self._requested_keys
            if len(requested_keys) >= MAX_CACHED_FRAMES:
                requested_keys.clear()
            requested_keys[(trace_id, frame.span_id if frame is not None else None)] = keys
        ended = span.end_time
        context = span.get_span_context()
        decided = requested_ended(
            self.guard,
            requested,
            keys,
            ended / 1e9 if ended else None,
            (trace_id, context.span_id) if context is not None else None,
        )
        for arguments, call_id, decision in decided:
            if decision.detected is not Action.ALLOW:
                self._record_after(span, decision, call_id, arguments, tracked)

    def _claim(
        self,
        span: Span,
        name: str,
        span_id: int,
        trace_id: int,
        call: SpanToolCall | None,
    ) -> bool:
        """A span started while calls a model requested wait for their tool spans: when it is
        the tool span of one (by its call id, else tool and arguments, when it carries them at
        its start; else by its tool's name, or any kept call for the frameworks whose tool
        spans name no tool at their start), the call's early decision becomes this span's
        (``current_decision()``), recorded on it when not an allow; ``True`` then. The start
        gate: a name that may be a kept call's tool, or the tool-span gate."""
        early = self.guard.early
        tools = early.tools
        names = _tool_names(name, tools)
        attributes = span_attributes(span)
        if call is None and (names or may_be_tool_span(name, attributes)):
            call = tool_call_from_span(name, attributes, (), None)
        if call is not None:
            if call.tool not in tools:
                return False
            names = (call.tool,)
        elif not names:
            return False
        call_id = call.call_id if call is not None else None
        key = None
        if call is not None and call_id is None and call.arguments is not MISSING:
            key = self.guard.requested_key(call.tool, call.arguments)
        frame = self._frame(span)
        session, agent = session_for(
            call if call is not None else NO_CALL, trace_id, frame, self.key_by, attributes
        )
        found = early.claim(session, agent, names, call_id, key, span_id)
        if found is None and self.key_by is KeyBy.CONVERSATION:
            kept = self._requested_keys.get((trace_id, frame.span_id if frame else None))
            if kept is not None and kept != (session, agent):
                session, agent = kept
                found = early.claim(session, agent, names, call_id, key, span_id)
        if found is None:
            return False
        self._started[span_id] = (session, agent, found.call_id or call_id)
        self._claimed[span_id] = found
        # Recorded once, at the model span's end (not again on this span).
        _START_DECISIONS[span_id] = found.decision
        return True

    def _unclaim(self, span_id: int) -> None:
        """A span that claimed a requested call ended without being its tool span: the call
        waits for its own span again."""
        found = self._claimed.pop(span_id, None)
        if self._started.pop(span_id, None) is not None:
            _START_DECISIONS.pop(span_id, None)
        if found is not None:
            found.span = None


def _tool_names(name: str, tools: Mapping[str, int]) -> tuple[str, ...]:
    """The kept tools a span's name at its start may run: the name itself (OpenInference names
    a tool span after its tool), the part after a space (``execute_tool <tool>``), the part
    before the first dot (``<tool>.run``, ``<tool>.tool``); any kept tool for the spans that
    name no tool at their start (Haystack's, LlamaIndex's), oldest first."""
    if name in ANONYMOUS_TOOL_SPANS:
        return tuple(tools)
    found = []
    for candidate in (name, name.rpartition(" ")[2], name.partition(".")[0]):
        if candidate in tools and candidate not in found:
            found.append(candidate)
    return tuple(found)
