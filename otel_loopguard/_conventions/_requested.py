"""The tool calls a model span says the model requested, and what the model said beside them.

A model call's span ends before the tools it asked for start, and with content capture on it
carries the request: each call's tool name, arguments and call id. Reading it lets the guard
decide a call before it runs (issue 27), for every instrumentation below, not only those that
put the arguments on the tool span at its start.

One reader per convention, in :data:`REQUEST_CONVENTIONS` (first match wins), each gated by one
attribute key (:data:`REQUEST_GATE_KEYS`, tested by :func:`may_request_calls`), or,
for Strands' events, by its chat operation on a span that already passed the model-usage gate:

* GenAI ``gen_ai.output.messages`` (parts of type ``tool_call``: ``id``, ``name``,
  ``arguments``; OpenAI-style ``tool_calls`` too), on the span or, for Strands' latest semantic
  conventions, in its ``gen_ai.client.inference.operation.details`` event: Pydantic AI,
  OpenLLMetry's LangChain instrumentation, Strands.
* OpenInference ``llm.output_messages.N.message.tool_calls.M.tool_call.function.name`` /
  ``.function.arguments`` / ``.id`` (Agno, LangGraph, LlamaIndex, smolagents; smolagents leaves
  the arguments out, and they are read from ``output.value``).
* OpenLLMetry's older ``gen_ai.completion.N.tool_calls.M.name`` / ``.arguments`` / ``.id``.
* The Vercel AI SDK's ``ai.response.toolCalls`` on ``ai.*.doGenerate`` / ``doStream`` spans.
* Haystack's ``haystack.agent.step.llm.output`` (``tool_call`` content parts).
* Strands' ``gen_ai.choice`` event (``toolUse`` blocks) on its ``chat`` spans.

Spans that sum a run (agent, workflow and tool spans) are never read: their messages repeat
their model calls'. Nor are spans made after the fact from an event bus (CrewAI's own tracing,
:data:`AFTER_THE_FACT_KEYS`): their model span may end after the tool's hook ran. Arguments
are decoded (a JSON string becomes its object); a call without them has
:data:`~._results.MISSING`. Pure, never raises (the package's contract).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from ._decoders import _call_id, _Events, _is_mapping, decode_json
from ._keys import (
    GEN_AI_OPERATION_NAME,
    OPENINFERENCE_SPAN_KIND,
    TRACELOOP_SPAN_KIND,
    USAGE_AGGREGATE_KINDS,
    USAGE_AGGREGATE_OPERATIONS,
)
from ._results import MISSING

__all__ = [
    "ANONYMOUS_TOOL_SPANS",
    "REQUEST_CONVENTIONS",
    "REQUEST_GATE_KEYS",
    "RequestedCall",
    "Requested",
    "may_request_calls",
    "requested_from_span",
]

GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
OPENINFERENCE_OUTPUT_PREFIX: Final = "llm.output_messages."
OPENINFERENCE_FIRST_TOOL_NAME: Final = (
    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name"
)
OPENINFERENCE_OUTPUT_VALUE: Final = "output.value"
OPENLLMETRY_FIRST_TOOL_NAME: Final = "gen_ai.completion.0.tool_calls.0.name"
VERCEL_TOOL_CALLS: Final = "ai.response.toolCalls"
VERCEL_TEXT: Final = "ai.response.text"
VERCEL_OPERATION_ID: Final = "ai.operationId"
HAYSTACK_LLM_OUTPUT: Final = "haystack.agent.step.llm.output"
STRANDS_CHOICE_EVENT: Final = "gen_ai.choice"
GEN_AI_DETAILS_EVENT: Final = "gen_ai.client.inference.operation.details"
OPERATION_CHAT: Final = "chat"

#: One of these keys marks a span that may carry requested calls (Strands' events aside).
REQUEST_GATE_KEYS: Final = frozenset(
    {
        GEN_AI_OUTPUT_MESSAGES,
        OPENINFERENCE_FIRST_TOOL_NAME,
        OPENLLMETRY_FIRST_TOOL_NAME,
        VERCEL_TOOL_CALLS,
        HAYSTACK_LLM_OUTPUT,
    }
)

#: Attributes of spans made after the fact, from an event bus on another thread (CrewAI's own
#: tracing): their model span may end after the tool's hook ran, so its request is never read.
AFTER_THE_FACT_KEYS: Final = ("crewai.event_name",)

#: Tool spans that name no tool at their start (the tool is set at their end): Haystack's agent
#: step and LlamaIndex's FunctionTool. A call requested of any tool may be theirs.
ANONYMOUS_TOOL_SPANS: Final = frozenset(
    {"haystack.agent.step.tool", "FunctionTool.acall", "FunctionTool.call"}
)

# Bounds: a response asks for a handful of calls; a hostile span must not make us loop long.
_MAX_MESSAGES: Final = 8
_MAX_CALLS: Final = 64
_MAX_TEXT_CHARS: Final = 4096


@dataclass(frozen=True, slots=True)
class RequestedCall:
    """One tool call a model response asks for: ``tool``, decoded ``arguments``
    (:data:`~._results.MISSING` when the span leaves them out) and ``call_id`` (``None`` when
    the response gives none)."""

    tool: str
    arguments: object
    call_id: str | None


@dataclass(frozen=True, slots=True)
class Requested:
    """What one model response asks for (``calls``, in order) and what it said beside them
    (``text``, cut to 4096 characters; ``""`` when it said nothing or capture is off);
    ``convention`` names the reader that matched."""

    calls: tuple[RequestedCall, ...]
    text: str
    convention: str


def may_request_calls(attributes: Mapping[str, object], usage: bool = False) -> bool:
    """Whether a span may carry requested calls: one of :data:`REQUEST_GATE_KEYS` in its
    attributes, tested by hand (five dict lookups, about twice as fast as a set's
    ``isdisjoint``; a test checks they name the same keys); or, for a span that reports model
    usage (``usage``: it passed the model-usage gate), a ``chat`` operation, whose events may
    carry them (Strands). Reading a span's events costs microseconds: only such spans do."""
    return (
        GEN_AI_OUTPUT_MESSAGES in attributes
        or OPENINFERENCE_FIRST_TOOL_NAME in attributes
        or OPENLLMETRY_FIRST_TOOL_NAME in attributes
        or VERCEL_TOOL_CALLS in attributes
        or HAYSTACK_LLM_OUTPUT in attributes
        or (usage and attributes.get(GEN_AI_OPERATION_NAME) == OPERATION_CHAT)
    )


def _arguments(value: object) -> object:
    if value is None:
        return MISSING
    decoded = decode_json(value)
    return decoded


def _texts(parts: list[str]) -> str:
    return "\n".join(part for part in parts if part)[:_MAX_TEXT_CHARS]


def _openai_tool_calls(value: object, calls: list[RequestedCall]) -> None:
    """OpenAI-style ``tool_calls`` (``[{"id", "function": {"name", "arguments"}}]``)."""
    if not isinstance(value, list):
        return
    for item in value[:_MAX_CALLS]:
        if not isinstance(item, dict):
            continue
        function = item.get("function")
        function = function if isinstance(function, dict) else item
        name = function.get("name")
        if isinstance(name, str) and name:
            arguments = function.get("arguments", function.get("args"))
            calls.append(RequestedCall(name, _arguments(arguments), _call_id(item.get("id"))))


def _genai_messages(value: object) -> tuple[list[RequestedCall], list[str]]:
    """GenAI output messages (``[{"role", "parts": [...]}]``, or OpenAI-style messages)."""
    calls: list[RequestedCall] = []
    texts: list[str] = []
    messages = decode_json(value)
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list):
        return calls, texts
    for message in messages[:_MAX_MESSAGES]:
        if not isinstance(message, dict):
            continue
        parts = message.get("parts")
        if isinstance(parts, list):
            for part in parts[:_MAX_CALLS]:
                if not isinstance(part, dict):
                    continue
                kind = part.get("type")
                if kind == "tool_call":
                    name = part.get("name")
                    if isinstance(name, str) and name:
                        calls.append(
                            RequestedCall(
                                name, _arguments(part.get("arguments")), _call_id(part.get("id"))
                            )
                        )
                elif kind == "text" and isinstance(part.get("content"), str):
                    texts.append(part["content"])
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        _openai_tool_calls(message.get("tool_calls"), calls)
    return calls[:_MAX_CALLS], texts


def _read_genai(
    name: str, attributes: Mapping[str, object], events: Callable[[], _Events]
) -> Requested | None:
    if GEN_AI_OUTPUT_MESSAGES not in attributes:
        return None
    calls, texts = _genai_messages(attributes[GEN_AI_OUTPUT_MESSAGES])
    return Requested(tuple(calls), _texts(texts), "genai")


@dataclass(frozen=True, slots=True)
class _Flattened:
    """Where a convention flattens a response's messages into attributes: message ``m`` under
    ``{messages}{m}{message}`` (its ``role`` and ``content``), its call ``c`` under
    ``{message prefix}{calls}{c}{call}`` (``name``, ``arguments`` and ``call_id`` keys).
    ``content_goes_on``: a message with content but no role does not end the walk."""

    messages: str
    message: str
    calls: str
    call: str
    name: str
    arguments: str
    call_id: str
    content_goes_on: bool


_OPENINFERENCE_LAYOUT: Final = _Flattened(
    OPENINFERENCE_OUTPUT_PREFIX,
    ".message.",
    "tool_calls.",
    ".tool_call.",
    "function.name",
    "function.arguments",
    "id",
    content_goes_on=False,
)
_OPENLLMETRY_LAYOUT: Final = _Flattened(
    "gen_ai.completion.",
    ".",
    "tool_calls.",
    ".",
    "name",
    "arguments",
    "id",
    content_goes_on=True,
)


def _flattened_calls(
    attributes: Mapping[str, object], layout: _Flattened
) -> tuple[list[RequestedCall], list[str]]:
    """The calls and texts of messages flattened into ``N.`` … ``M.`` indexed attributes, walked
    in order until a message (or a message's call) is missing; at most :data:`_MAX_MESSAGES`
    messages of :data:`_MAX_CALLS` calls."""
    calls: list[RequestedCall] = []
    texts: list[str] = []
    for m in range(_MAX_MESSAGES):
        message = f"{layout.messages}{m}{layout.message}"
        content = attributes.get(message + "content")
        if isinstance(content, str):
            texts.append(content)
        for c in range(_MAX_CALLS):
            call = f"{message}{layout.calls}{c}{layout.call}"
            tool = attributes.get(call + layout.name)
            if tool is None:
                break
            if isinstance(tool, str) and tool:
                calls.append(
                    RequestedCall(
                        tool,
                        _arguments(attributes.get(call + layout.arguments)),
                        _call_id(attributes.get(call + layout.call_id)),
                    )
                )
        if message + "role" not in attributes and not (
            layout.content_goes_on and content is not None
        ):
            break
    return calls, texts


def _read_openinference(
    name: str, attributes: Mapping[str, object], events: Callable[[], _Events]
) -> Requested | None:
    if OPENINFERENCE_FIRST_TOOL_NAME not in attributes:
        return None
    calls, texts = _flattened_calls(attributes, _OPENINFERENCE_LAYOUT)
    if any(call.arguments is MISSING for call in calls):
        calls = _arguments_from_output(calls, attributes.get(OPENINFERENCE_OUTPUT_VALUE))
    return Requested(tuple(calls[:_MAX_CALLS]), _texts(texts), "openinference")


def _arguments_from_output(calls: list[RequestedCall], output: object) -> list[RequestedCall]:
    """smolagents leaves ``function.arguments`` out: its ``output.value`` (the message as
    JSON) has them; matched by call id, else by position."""
    found: list[RequestedCall] = []
    decoded = decode_json(output)
    if isinstance(decoded, dict):
        _openai_tool_calls(decoded.get("tool_calls"), found)
    elif isinstance(decoded, list):
        for message in decoded[:_MAX_MESSAGES]:
            if isinstance(message, dict):
                _openai_tool_calls(message.get("tool_calls"), found)
    if not found:
        return calls
    by_id = {call.call_id: call for call in found if call.call_id is not None}
    filled = []
    for index, call in enumerate(calls):
        if call.arguments is MISSING:
            source = by_id.get(call.call_id) if call.call_id is not None else None
            if source is None and index < len(found) and found[index].tool == call.tool:
                source = found[index]
            if source is not None:
                call = RequestedCall(call.tool, source.arguments, call.call_id)
        filled.append(call)
    return filled


def _read_openllmetry(
    name: str, attributes: Mapping[str, object], events: Callable[[], _Events]
) -> Requested | None:
    if OPENLLMETRY_FIRST_TOOL_NAME not in attributes:
        return None
    calls, texts = _flattened_calls(attributes, _OPENLLMETRY_LAYOUT)
    return Requested(tuple(calls[:_MAX_CALLS]), _texts(texts), "openllmetry")


def _read_vercel(
    name: str, attributes: Mapping[str, object], events: Callable[[], _Events]
) -> Requested | None:
    raw = attributes.get(VERCEL_TOOL_CALLS)
    if raw is None:
        return None
    operation = attributes.get(VERCEL_OPERATION_ID)
    if isinstance(operation, str) and not operation.endswith((".doGenerate", ".doStream")):
        return None  # ai.generateText / ai.streamText sum their steps
    calls: list[RequestedCall] = []
    decoded = decode_json(raw)
    if isinstance(decoded, list):
        for item in decoded[:_MAX_CALLS]:
            if not isinstance(item, dict):
                continue
            tool = item.get("toolName")
            if isinstance(tool, str) and tool:
                arguments = item.get("input", item.get("args"))
                calls.append(
                    RequestedCall(tool, _arguments(arguments), _call_id(item.get("toolCallId")))
                )
    text = attributes.get(VERCEL_TEXT)
    return Requested(tuple(calls), _texts([text] if isinstance(text, str) else []), "vercel_ai")


def _read_haystack(
    name: str, attributes: Mapping[str, object], events: Callable[[], _Events]
) -> Requested | None:
    """Haystack's agent step: ``{"replies": [{"content": [{"tool_call": {"tool_name",
    "arguments", "id"}}, {"text": ...}]}]}``."""
    raw = attributes.get(HAYSTACK_LLM_OUTPUT)
    if raw is None:
        return None
    calls: list[RequestedCall] = []
    texts: list[str] = []
    decoded = decode_json(raw)
    replies = decoded.get("replies") if isinstance(decoded, dict) else None
    for reply in replies[:_MAX_MESSAGES] if isinstance(replies, list) else ():
        content = reply.get("content") if isinstance(reply, dict) else None
        for part in content[:_MAX_CALLS] if isinstance(content, list) else ():
            if not isinstance(part, dict):
                continue
            call = part.get("tool_call")
            if isinstance(call, dict):
                tool = call.get("tool_name")
                if isinstance(tool, str) and tool:
                    calls.append(
                        RequestedCall(
                            tool, _arguments(call.get("arguments")), _call_id(call.get("id"))
                        )
                    )
            elif isinstance(part.get("text"), str):
                texts.append(part["text"])
    return Requested(tuple(calls[:_MAX_CALLS]), _texts(texts), "haystack")


def _strands_blocks(value: object, calls: list[RequestedCall], texts: list[str]) -> None:
    blocks = decode_json(value)
    if not isinstance(blocks, list):
        return
    for block in blocks[:_MAX_CALLS]:
        if not isinstance(block, dict):
            continue
        use = block.get("toolUse")
        if isinstance(use, dict):
            tool = use.get("name")
            if isinstance(tool, str) and tool:
                calls.append(
                    RequestedCall(
                        tool, _arguments(use.get("input")), _call_id(use.get("toolUseId"))
                    )
                )
        elif isinstance(block.get("text"), str):
            texts.append(block["text"])


def _read_events(
    name: str, attributes: Mapping[str, object], events: Callable[[], _Events]
) -> Requested | None:
    """Strands' chat spans: the ``gen_ai.choice`` event's ``message`` (content blocks), or the
    latest conventions' details event with ``gen_ai.output.messages``."""
    if attributes.get(GEN_AI_OPERATION_NAME) != OPERATION_CHAT:
        return None
    calls: list[RequestedCall] = []
    texts: list[str] = []
    found = False
    for event in events():
        event_name, event_attributes = event[0], event[1]
        if not _is_mapping(event_attributes):
            continue
        if event_name == STRANDS_CHOICE_EVENT and "message" in event_attributes:
            found = True
            _strands_blocks(event_attributes["message"], calls, texts)
        elif event_name == GEN_AI_DETAILS_EVENT and GEN_AI_OUTPUT_MESSAGES in event_attributes:
            found = True
            more, said = _genai_messages(event_attributes[GEN_AI_OUTPUT_MESSAGES])
            calls.extend(more)
            texts.extend(said)
    if not found:
        return None
    return Requested(tuple(calls[:_MAX_CALLS]), _texts(texts), "strands")


_Reader = Callable[[str, Mapping[str, object], Callable[[], _Events]], "Requested | None"]

#: The readers, in order; the first that finds its convention's key answers.
REQUEST_CONVENTIONS: Final[tuple[tuple[str, _Reader], ...]] = (
    ("genai", _read_genai),
    ("openinference", _read_openinference),
    ("openllmetry", _read_openllmetry),
    ("vercel_ai", _read_vercel),
    ("haystack", _read_haystack),
    ("strands", _read_events),
)


def _no_events() -> _Events:
    return ()


def _sums_a_run(attributes: Mapping[str, object]) -> bool:
    return (
        attributes.get(GEN_AI_OPERATION_NAME) in USAGE_AGGREGATE_OPERATIONS
        or attributes.get(OPENINFERENCE_SPAN_KIND) in USAGE_AGGREGATE_KINDS
        or attributes.get(TRACELOOP_SPAN_KIND) in USAGE_AGGREGATE_KINDS
    )


def requested_from_span(
    name: str,
    attributes: Mapping[str, object],
    events: Callable[[], _Events] = _no_events,
) -> Requested | None:
    """The calls a model span's response requests (with its text), or ``None``: not a model
    response with content, or a span that sums a run. ``events``: a function giving the span's
    events (read only for Strands' chat spans). A response with text and no call gives a
    :class:`Requested` without calls. Never raises."""
    try:
        if not _is_mapping(attributes) or _sums_a_run(attributes):
            return None
        if any(key in attributes for key in AFTER_THE_FACT_KEYS):
            return None
        for _, reader in REQUEST_CONVENTIONS:
            found = reader(name, attributes, events)
            if found is not None:
                return found
        return None
    except Exception:  # the package's contract: never raise on span data
        return None
