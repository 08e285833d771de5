"""The one way from a span to the guard: what a span (open or ended) is as tool calls and agent
runs, and the guard calls it makes.

Every entrance goes through here: the span processor on the live span (at its start and at its
end), and, through :mod:`otel_loopguard._traces` (its trace buffer and :func:`~otel_loopguard.
traces.feed`), the exporter, ``serve`` and ``replay`` on finished spans. So which spans are
decided at start, how a call is read from a span (its failure included: the conventions read
it), how a call without arguments counts, and what a call is counted under (:data:`Keys`, which a
call decided at start keeps for its end) are each written once, here. Session keys themselves
come from :func:`otel_loopguard._spans.session_for`.

Pure: the package's own modules only, no OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from ._conventions import (
    MISSING,
    Requested,
    SpanModelCall,
    SpanToolCall,
    agent_from_span,
    conversation_id,
    tool_call_from_span,
)
from ._conventions._readers import tool_call_at_start, tool_outcome_from_span
from ._exemplars import COUNTED_CALL, counting
from ._prices import ModelUsage
from ._spans import START_NAME_PREFIXES

if TYPE_CHECKING:
    from ._guard import LoopGuard
    from ._policy import Decision

__all__ = [
    "Ended",
    "Keys",
    "call_at_end",
    "call_at_start",
    "call_ended",
    "call_outcome_at_end",
    "call_started",
    "duration_seconds",
    "model_ended",
    "model_usage",
    "requested_ended",
    "run_started",
]

#: What a call is counted under: session, agent and call id. A call decided at its span's start
#: keeps its start's keys for its end.
Keys = tuple[str, str | None, str | None]


#: A call reported at its span's end: its keys, the arguments it was counted with (``{}`` for a
#: span recognised without arguments) and the guard's decision (``None`` when the end only
#: added the outcome of a call decided at start). A plain tuple: made on the hot path.
Ended = tuple[Keys, object, "Decision | None"]


#: A span's end reads its call from its final attributes, its events and whether it failed.
call_at_end: Final = tool_call_from_span

#: A span whose call was read at its start (:func:`call_at_start`) reads only (tool, result,
#: failed) at its end, as :data:`call_at_end` would read them; ``None`` when that reads no call.
call_outcome_at_end: Final = tool_outcome_from_span


def call_at_start(name: str, attributes: Mapping[str, object]) -> SpanToolCall | None:
    """The tool call a span carries at its start, with its arguments (decided then, before it
    runs), or ``None``: most spans (the start gate, a name prefix, stops them at once), tool
    spans whose arguments come later, and spans recognised without arguments."""
    if name[:4] not in START_NAME_PREFIXES:
        return None
    call = tool_call_at_start(name, attributes)
    if call is None or call.arguments is MISSING:
        return None
    return call


def run_started(name: str, attributes: Mapping[str, object]) -> tuple[str, str | None] | None:
    """The conversation and agent of an agent run a span starts, when it names its
    conversation (keyed by conversation, a run starts a new progress epoch); else ``None``."""
    run = agent_from_span(name, attributes)
    if run is None:
        return None
    conversation = run.conversation_id or conversation_id(attributes)
    if not conversation:
        return None
    return conversation, run.agent_name or run.agent_id


def duration_seconds(start_ns: int | None, end_ns: int | None) -> float | None:
    """A span's duration (what denying its call would have saved); ``None`` when unknown."""
    if start_ns is None or end_ns is None:
        return None
    return max(0.0, (end_ns - start_ns) / 1e9)


def call_started(
    guard: LoopGuard,
    tool: str,
    arguments: object,
    keys: Keys,
    span: tuple[int, int] | None = None,
) -> Decision:
    """Decide a call at its span's start, under ``keys`` (which its end reuses): counted then,
    never waiting for an advisor. ``span``: the (trace id, span id) of the call's span, the
    exemplar of what it counts (:mod:`._exemplars`). Never raises (the guard's hook contract)."""
    session, agent, call_id = keys
    if span is None:
        return guard.decide_at_span_start(tool, arguments, session, agent, call_id)
    named = COUNTED_CALL.set(span)  # counting(*span), inline: around every call a span reports
    try:
        return guard.decide_at_span_start(tool, arguments, session, agent, call_id)
    finally:
        COUNTED_CALL.reset(named)


def call_ended(
    guard: LoopGuard,
    tool: str,
    arguments: object,
    keys: Keys | Callable[[], Keys],
    error: bool | None,
    result: object,
    duration: float | None,
    span: tuple[int, int] | None = None,
) -> Ended | None:
    """Report a call at its span's end (``after_tool``): counted now, or only its outcome added
    when it was decided at start (the decision is then ``None``). ``arguments``
    :data:`~otel_loopguard._conventions.MISSING`: the span was recognised without arguments
    (content capture off, or an instrumentation that publishes none), a call of the tool without
    arguments (``{}``) when the policy counts those, else skipped: ``None``. ``keys``: or the
    function that finds them, called only for a call reported. ``span``: as for
    :func:`call_started`. Never raises (the guard's hook contract)."""
    if arguments is MISSING:
        if not guard.policy.count_calls_without_arguments:
            return None
        arguments = {}
    if not isinstance(keys, tuple):
        keys = keys()
    session, agent, call_id = keys
    if span is None:
        decision = guard.after_tool(
            tool,
            arguments,
            session=session,
            agent=agent,
            call_id=call_id,
            error=error,
            result=result,
            duration_seconds=duration,
        )
        return keys, arguments, decision
    named = COUNTED_CALL.set(span)  # as in call_started
    try:
        decision = guard.after_tool(
            tool,
            arguments,
            session=session,
            agent=agent,
            call_id=call_id,
            error=error,
            result=result,
            duration_seconds=duration,
        )
    finally:
        COUNTED_CALL.reset(named)
    return keys, arguments, decision


def model_usage(call: SpanModelCall) -> ModelUsage:
    """The checked usage of a model call read from a span; ``ValueError`` naming the bad field.

    Input tokens include the cached ones (the GenAI and OpenInference conventions); a span whose
    cache reads and writes exceed its input counts them apart, as Anthropic's API does, and they
    are added to it."""
    input_tokens = call.input_tokens
    cached = call.cache_read_tokens, call.cache_write_tokens
    if (
        type(input_tokens) is int
        and type(cached[0]) is int
        and type(cached[1]) is int
        and cached[0] + cached[1] > input_tokens
    ):
        input_tokens += cached[0] + cached[1]
    return ModelUsage.checked(
        call.model,
        call.provider,
        input_tokens=input_tokens,
        output_tokens=call.output_tokens,
        cache_read_tokens=cached[0],
        cache_write_tokens=cached[1],
        reported_cost_usd=call.reported_cost_usd,
    )


ModelKeys = tuple[str, str | None] | tuple[str, str | None, tuple[tuple[str, str | None], ...]]


def model_ended(
    guard: LoopGuard,
    call: SpanModelCall,
    keys: ModelKeys | Callable[[], ModelKeys],
) -> None:
    """Report a model call's usage at its span's end, under ``keys`` (session and agent, as
    :func:`~otel_loopguard._spans.session_for` gives them for the span, then optionally the
    keys of the agents above, :func:`~otel_loopguard._spans.ancestor_keys`; or the function
    that finds them, called only for usage that reads). A bad value is a counted skip
    (``guard.skipped_model_calls``). Never raises (the guard's hook contract)."""
    try:
        usage = model_usage(call)
    except ValueError as exc:
        guard.model_call_skipped(str(exc).split(":", 1)[0])
        return
    if not isinstance(keys, tuple):
        keys = keys()
    if len(keys) == 3:
        guard.model_call(usage, session=keys[0], agent=keys[1], ancestors=keys[2])
    else:
        guard.model_call(usage, session=keys[0], agent=keys[1])


def requested_ended(
    guard: LoopGuard,
    requested: Requested,
    keys: tuple[str, str | None],
    at: float | None,
    span: tuple[int, int] | None = None,
) -> list[tuple[object, str | None, Decision]]:
    """Decide the calls a model span's response requests, at its end (``at``, seconds since
    the epoch), under the (session, agent) ``keys`` their tool spans get
    (:meth:`~otel_loopguard._guard.LoopGuard.decide_requested`): (arguments, call id, decision)
    for each, in order; a call whose arguments the span left out is not decided (allow).
    ``span``: as for :func:`call_started`. Never raises (the guard's hook contract)."""
    calls = [
        (call.tool, None if call.arguments is MISSING else call.arguments, call.call_id)
        for call in requested.calls
    ]
    session, agent = keys
    if span is None:
        decisions = guard.decide_requested(
            calls, session=session, agent=agent, text=requested.text, at=at
        )
    else:
        with counting(*span):
            decisions = guard.decide_requested(
                calls, session=session, agent=agent, text=requested.text, at=at
            )
    return [
        (arguments, call_id, decision)
        for (_, arguments, call_id), decision in zip(calls, decisions, strict=False)
    ]
