"""From spans to the guard's session keys: pure helpers shared by every span entrance.

The in-process span processor, the replay reader of recorded traces and the OTLP receiver all
see spans with ids, a parent id, a name and attributes. This module answers, for a tool span,
"whose chain is this?" the same way for all of them; none of it imports OpenTelemetry.

Session keys (DESIGN §3): by default a trace plus the agent running the tool, so sub-agents in
one trace never share a chain. The agent is the nearest ancestor agent span (``invoke_agent``,
OpenInference ``AGENT``, ...): its span id goes into the session key (two runs of one agent in a
trace are two chains), its name is the agent label. Keyed by conversation instead, the session is
the conversation id (from the tool span or its ancestors), so one conversation spanning several
traces shares one state; the agent name keeps sub-agents apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from ._conventions import (
    AGENT_CONVENTIONS,
    TOOL_CONVENTIONS,
    AgentConvention,
    SpanAgent,
    SpanModelCall,
    SpanToolCall,
    ToolConvention,
    agent_from_span,
    conversation_id,
)

__all__ = [
    "MAX_ANCESTRY_DEPTH",
    "START_NAME_PREFIXES",
    "AgentFrame",
    "KeyBy",
    "SpanView",
    "agents_above",
    "ancestor_keys",
    "nearest_agent",
    "session_for",
]

#: Ancestors looked at when resolving a tool span's agent (a guard against cycles in bad input).
MAX_ANCESTRY_DEPTH: Final = 64

#: How many leading characters of a starting span's name the start gate compares: its users
#: test ``name[:4] in START_NAME_PREFIXES`` (one slice and one set lookup per span).
_START_NAME_CHARS: Final = 4


def _start_name_prefixes(
    *tables: Iterable[ToolConvention | AgentConvention],
) -> frozenset[str]:
    """The first :data:`_START_NAME_CHARS` characters of every entry's ``start_names``.

    Raises ValueError for a start name shorter than that: no starting span's name would match.
    """
    prefixes = set()
    for table in tables:
        for entry in table:
            for name in entry.start_names:
                if len(name) < _START_NAME_CHARS:
                    raise ValueError(
                        f"convention {entry.name!r}: start name {name!r} is shorter than "
                        f"{_START_NAME_CHARS} characters"
                    )
                prefixes.add(name[:_START_NAME_CHARS])
    return frozenset(prefixes)


#: The first four characters of the span names that may be a tool span with its arguments, or
#: an agent run, when they start ("execute_tool ...", "running tool", "invoke_agent ...", "agent
#: run"): a cheap gate, so that only those spans are looked at in ``on_start``, and only those
#: can have been decided at their start when a recording is read back. Derived from the
#: ``start_names`` of the conventions tables, and nowhere else.
START_NAME_PREFIXES: Final = _start_name_prefixes(TOOL_CONVENTIONS, AGENT_CONVENTIONS)


class KeyBy(str, Enum):
    """What a span entrance keys session state by."""

    #: Trace id plus the agent running the tool (the default).
    TRACE = "trace"
    #: The conversation id (``gen_ai.conversation.id``, ``session.id``, thread id), falling back
    #: to the trace when a span carries none.
    CONVERSATION = "conversation"


@dataclass(frozen=True, slots=True)
class SpanView:
    """What the resolver needs of one span."""

    name: str
    attributes: Mapping[str, object]
    parent_id: int | None


@dataclass(frozen=True, slots=True)
class AgentFrame:
    """The agent a tool span runs under: the agent span's id and what it says of itself."""

    span_id: int
    agent: SpanAgent


def nearest_agent(
    parent_id: int | None, lookup: Callable[[int], SpanView | None]
) -> AgentFrame | None:
    """Walk up from ``parent_id`` to the nearest ancestor that is an agent span.

    ``lookup`` returns a known span by id, or ``None`` (not seen, already gone, or remote): the
    walk stops there. At most :data:`MAX_ANCESTRY_DEPTH` ancestors are looked at.
    """
    current = parent_id
    for _ in range(MAX_ANCESTRY_DEPTH):
        if current is None:
            return None
        view = lookup(current)
        if view is None:
            return None
        agent = agent_from_span(view.name, view.attributes)
        if agent is not None:
            return AgentFrame(current, agent)
        current = view.parent_id
    return None


def agents_above(
    frame: AgentFrame | None, lookup: Callable[[int], SpanView | None], limit: int
) -> list[AgentFrame]:
    """The agent spans above ``frame``'s, nearest first, at most ``limit`` of them (each found
    as :func:`nearest_agent` finds one; a span not known ends the walk)."""
    above: list[AgentFrame] = []
    seen = set()
    while frame is not None and len(above) < limit and frame.span_id not in seen:
        seen.add(frame.span_id)
        view = lookup(frame.span_id)
        if view is None:
            break
        frame = nearest_agent(view.parent_id, lookup)
        if frame is not None:
            above.append(frame)
    return above


def ancestor_keys(
    call: SpanModelCall,
    trace_id: int,
    frame: AgentFrame | None,
    key_by: KeyBy,
    lookup: Callable[[int], SpanView | None],
    keys: tuple[str, str | None],
    limit: int,
) -> tuple[tuple[str, str | None], ...]:
    """The (session, agent) keys of the agents a model call's agent (``frame``, whose keys are
    ``keys``) runs under, nearest first: each agent span above it, keyed as a call under that
    span would be (:func:`session_for`). Keys equal to ``keys`` or repeated are left out."""
    if frame is None:
        return ()
    found: list[tuple[str, str | None]] = []
    for above in agents_above(frame, lookup, limit):
        key = session_for(call, trace_id, above, key_by)
        if key != keys and key not in found:
            found.append(key)
    return tuple(found)


#: Session keys by (trace id, agent span id or None): :func:`session_for` formats each once.
#: Emptied when full; a racing thread formats the same text, so no lock.
_SESSIONS: Final[dict[tuple[int, int | None], str]] = {}
_MAX_SESSIONS: Final = 4096


def _agent_label(call: SpanToolCall | SpanModelCall, frame: AgentFrame | None) -> str | None:
    # The agent span's name first: a hook asking from inside that agent's span gets the same
    # key without knowing what the tool span will carry.
    if frame is not None and (frame.agent.agent_name or frame.agent.agent_id):
        return frame.agent.agent_name or frame.agent.agent_id
    return call.agent_name or call.agent_id


def session_for(
    call: SpanToolCall | SpanModelCall,
    trace_id: int,
    frame: AgentFrame | None,
    key_by: KeyBy,
    tool_attributes: Mapping[str, object] | None = None,
    ancestor_conversation: str | None = None,
) -> tuple[str, str | None]:
    """The guard's (session, agent) for a tool call (or a model call: the same rules) found in
    a span of trace ``trace_id``.

    Keyed by trace: ``"<trace id hex>"``, plus ``"/<agent span id hex>"`` when an agent span was
    found; the agent label is the agent span's name, else the tool span's own.
    Keyed by conversation: the conversation id of the tool span, of its agent span, or
    ``ancestor_conversation``, else the trace as above.
    """
    agent = _agent_label(call, frame)
    if key_by is KeyBy.CONVERSATION:
        conversation = (
            call.conversation_id
            or (conversation_id(tool_attributes) if tool_attributes is not None else None)
            or (frame.agent.conversation_id if frame is not None else None)
            or ancestor_conversation
        )
        if conversation:
            return conversation, agent
    # "<trace id hex>[/<agent span id hex>]", formatted once per trace and agent span.
    key = (trace_id, frame.span_id if frame is not None else None)
    session = _SESSIONS.get(key)
    if session is None:
        session = f"{trace_id:032x}"
        if frame is not None:
            session = f"{session}/{frame.span_id:016x}"
        if len(_SESSIONS) >= _MAX_SESSIONS:
            _SESSIONS.clear()
        _SESSIONS[key] = session
    return session, agent
