"""What a :class:`~otel_loopguard._traces.TraceBuffer` holds of each trace until it is judged:
its parent links, agent spans and unjudged tool and model spans (:class:`HeldTrace`,
:class:`HeldTool`, :class:`HeldModel`), and those as plain data for the buffer's snapshot
(:func:`trace_data`, :func:`trace_back`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ._conventions import (
    ARGUMENTS_AT_START_CONVENTIONS,
    MISSING,
    SpanAgent,
    SpanModelCall,
    SpanToolCall,
)
from ._otlp_json import RecordedSpan
from ._span_calls import call_at_end, call_at_start
from ._spans import AgentFrame, SpanView, nearest_agent
from ._trace_events import SpanRef

__all__ = ["HeldModel", "HeldTool", "HeldTrace", "held_tool", "trace_back", "trace_data"]

#: Ancestors counted for a span's depth (only breaks ties between equal timestamps).
_MAX_DEPTH: Final = 1024


_NO_ATTRIBUTES: Final[Mapping[str, object]] = {}


@dataclass(slots=True, unsafe_hash=True)  # built per span: not frozen (4x the __init__), never set
class HeldTool:
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


@dataclass(slots=True, unsafe_hash=True)  # built per span: not frozen (4x the __init__), never set
class HeldModel:
    """What a buffered model-call span keeps: its usage as read, and where it is."""

    span_id: int
    parent_id: int | None  # local parent: None for a root or a remote parent
    call: SpanModelCall
    end_ns: int
    order: int
    ref: SpanRef


@dataclass(slots=True)
class HeldTrace:
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
    tools: list[HeldTool] = field(default_factory=list)
    models: list[HeldModel] = field(default_factory=list)
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


def held_tool(span: RecordedSpan, local_parent: int | None, order: int) -> HeldTool | None:
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
    return HeldTool(
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


def _tool_data(tool: HeldTool) -> dict[str, Any]:
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


def _tool_back(data: Mapping[str, Any]) -> HeldTool:
    attributes = dict(data["attributes"])
    start_attributes = data["start_attributes"]
    trace_id, span_id, parent_id, parent_remote = data["ref"]
    return HeldTool(
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


def _model_data(model: HeldModel) -> dict[str, Any]:
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


def _model_back(data: Mapping[str, Any]) -> HeldModel:
    trace_id, span_id, parent_id, parent_remote = data["ref"]
    return HeldModel(
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


def trace_data(trace_id: int, trace: HeldTrace, now: float) -> dict[str, Any]:
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


def trace_back(data: Mapping[str, Any], now: float) -> HeldTrace:
    due_in = data["due_in"]
    return HeldTrace(
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
