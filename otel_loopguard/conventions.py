"""Recognise tool calls and agents in spans, whichever instrumentation made them.

This module turns the fields of one span (name, attributes, events, error status) into a
:class:`SpanToolCall` or a :class:`SpanAgent`, or ``None`` for every other span. It is pure and
data-driven: stdlib and orjson only, no OpenTelemetry import, so the in-process span processor,
the OTLP receiver and the replay reader all share it.

How a span is read is a table, :data:`TOOL_CONVENTIONS` (and :data:`AGENT_CONVENTIONS`): each
entry says how to recognise one instrumentation's tool span (:class:`Condition`) and which
attributes or events carry the tool name, arguments, result and call id, plus the small "shape"
function that unwraps that instrumentation's encoding. Adding an instrumentation is one table
entry and one test. The first entry whose conditions all hold wins, so specific entries come
before the generic GenAI semantic-conventions ones.

Contract shared by every public function here:

* It never raises, whatever the value types (non-str values, bytes, huge strings, deeply nested
  or invalid JSON, NaN). Anything it cannot read is treated as absent or kept raw.
* It never mutates its inputs and keeps no state, so it may be called concurrently from any
  thread, including the application's threads through ``SpanProcessor.on_start``/``on_end``.
* Deciding that a span is *not* a tool span costs a few dict lookups (see
  :func:`tool_call_from_span`), because it runs for every span the application ends.

Speed: the tables are compiled once, at import, into a dispatch (:class:`_Dispatch`): the cheap
first condition of every entry (its *gate*: an attribute value, a span name or a span-name
prefix) is indexed by attribute key, value and name, so one pass over a handful of keys says which
gates a span passes, and only the entries behind those gates are then tested, in table order,
with their remaining conditions compiled to small functions. Decoding happens once per
attribute and only for a recognised span. The result is the same as testing every entry's
:class:`Condition` in order; ``tests/test_conventions.py`` checks that against the table.

Normalisation goal: the same call made through different instrumentations gives the same decoded
arguments (``search(query="weather in Paris")`` -> ``{"query": "weather in Paris"}``) and, where
the instrumentation allows, the same decoded result (``"results for ..."`` whether it arrived as
a plain string, a JSON string, Strands text blocks, a LangChain ``ToolMessage`` or ADK's
``{"result": ...}`` wrapper).
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

import orjson

__all__ = [
    "AGENT_CONVENTIONS",
    "ARGUMENTS_AT_START_CONVENTIONS",
    "MAX_DECODE_CHARS",
    "MISSING",
    "TOOL_CONVENTIONS",
    "AgentConvention",
    "Condition",
    "Missing",
    "SpanAgent",
    "SpanToolCall",
    "ToolConvention",
    "agent_from_span",
    "arguments_available_at_start",
    "conversation_id",
    "decode_json",
    "tool_call_from_span",
]

# --------------------------------------------------------------------------------------------
# Attribute keys. The opentelemetry-semantic-conventions package marks its gen_ai constants as
# moved, so the keys this project reads are declared here, once.
# --------------------------------------------------------------------------------------------

GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
GEN_AI_TOOL_STATUS: Final = "gen_ai.tool.status"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_SYSTEM: Final = "gen_ai.system"
ERROR_TYPE: Final = "error.type"
SESSION_ID: Final = "session.id"

OPERATION_EXECUTE_TOOL: Final = "execute_tool"
OPERATION_INVOKE_AGENT: Final = "invoke_agent"
EXECUTE_TOOL_SPAN_PREFIX: Final = "execute_tool "
INVOKE_AGENT_SPAN_PREFIX: Final = "invoke_agent "

# Pydantic AI instrumentation version 2 ("running tool" spans).
PYDANTIC_AI_LEGACY_ARGUMENTS: Final = "tool_arguments"
PYDANTIC_AI_LEGACY_RESULT: Final = "tool_response"
PYDANTIC_AI_LEGACY_AGENT_NAME: Final = "agent_name"
LOGFIRE_MSG: Final = "logfire.msg"

# OpenInference.
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OPENINFERENCE_TOOL_NAME: Final = "tool.name"
OPENINFERENCE_TOOL_PARAMETERS: Final = "tool.parameters"
OPENINFERENCE_TOOL_JSON_SCHEMA: Final = "tool.json_schema"
OPENINFERENCE_TOOL_CALL_ID: Final = "tool_call.id"
OPENINFERENCE_INPUT_VALUE: Final = "input.value"
OPENINFERENCE_OUTPUT_VALUE: Final = "output.value"
OPENINFERENCE_METADATA: Final = "metadata"
OPENINFERENCE_AGENT_NAME: Final = "agent.name"

# OpenLLMetry (traceloop).
TRACELOOP_SPAN_KIND: Final = "traceloop.span.kind"
TRACELOOP_ENTITY_NAME: Final = "traceloop.entity.name"
TRACELOOP_ENTITY_INPUT: Final = "traceloop.entity.input"
TRACELOOP_ENTITY_OUTPUT: Final = "traceloop.entity.output"
TRACELOOP_WORKFLOW_NAME: Final = "traceloop.workflow.name"
TRACELOOP_TASK_STATUS: Final = "gen_ai.task.status"
TRACELOOP_THREAD_ID: Final = "traceloop.association.properties.thread_id"
TRACELOOP_SESSION_ID: Final = "traceloop.association.properties.session_id"
TRACELOOP_CONVERSATION_ID: Final = "traceloop.association.properties.conversation_id"

# Strands Agents (default semconv: arguments and result travel in span events).
STRANDS_PROVIDER: Final = "strands-agents"
STRANDS_TOOL_MESSAGE_EVENT: Final = "gen_ai.tool.message"
STRANDS_CHOICE_EVENT: Final = "gen_ai.choice"

# Google ADK legacy schema.
ADK_TOOL_CALL_ARGS: Final = "gcp.vertex.agent.tool_call_args"
ADK_TOOL_RESPONSE: Final = "gcp.vertex.agent.tool_response"
ADK_EVENT_ID: Final = "gcp.vertex.agent.event_id"
ADK_SESSION_ID: Final = "gcp.vertex.agent.session_id"
ADK_MERGED_TOOLS: Final = "(merged tools)"

# OpenLIT before it adopted gen_ai.tool.call.arguments.
OPENLIT_TOOL_ARGS: Final = "gen_ai.tool.args"

EXCEPTION_EVENT: Final = "exception"

MAX_DECODE_CHARS: Final = 1 << 20
"""Strings (and bytes) longer than this (1 MiB) are never parsed and are kept raw.

Parsing cost and memory grow with size; one pathological attribute must not stall the
application thread that ends the span. A raw string still compares and hashes exactly."""

_PYTHON_LITERAL_MAX_CHARS: Final = 64 * 1024
"""Python-repr payloads (LangChain ``input_str``) above this are kept raw: ``ast`` is far slower
than orjson, and such payloads only appear as a fallback when no JSON form exists."""

_METADATA_MAX_CHARS: Final = 64 * 1024
"""OpenInference ``metadata`` JSON above this is not searched for a thread id."""

_CALL_ID_PLACEHOLDERS: Final = frozenset({"<not specified>", "N/A"})
"""Values instrumentations write when they have no call id (Google ADK)."""

_ERROR_STATUS_KEYS: Final = (GEN_AI_TOOL_STATUS, TRACELOOP_TASK_STATUS)
_ERROR_STATUS_VALUES: Final = frozenset({"error", "failure", "failed"})
_SUCCESS_STATUS_VALUES: Final = frozenset({"success", "ok"})

_JSON_OPENERS: Final = frozenset("{[\"")
_JSON_CONTAINER_OPENERS: Final = frozenset("{[")
_BLANK: Final = frozenset(" \t\r\n")


class Missing(enum.Enum):
    """Type of :data:`MISSING`; an enum so the sentinel is a typed singleton that pickles."""

    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = Missing.MISSING
"""``SpanToolCall.arguments`` when the span carries no arguments at all (content capture off,
or not yet set). Distinct from ``{}``, which is a real call without arguments."""


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpanToolCall:
    """One tool call recognised in a span.

    ``arguments`` is the decoded arguments (a dict normally; a bare scalar or list when the
    instrumentation gives no parameter names; :data:`MISSING` when the span carries none).
    ``result`` is the decoded result, ``None`` when unknown. ``is_error`` is ``None`` when the
    span says nothing either way. ``agent_id``/``agent_name`` are only what the tool span itself
    carries; the caller falls back to the nearest ancestor agent span. ``convention`` names the
    :data:`TOOL_CONVENTIONS` entry that matched.
    """

    tool: str
    arguments: object
    result: object
    is_error: bool | None
    call_id: str | None
    agent_id: str | None
    agent_name: str | None
    conversation_id: str | None
    convention: str


@dataclass(frozen=True, slots=True)
class SpanAgent:
    """An agent-run span (``invoke_agent``, OpenInference AGENT, OpenLLMetry agent/workflow).

    Both identity fields may be ``None``: the span still marks the start of an agent run.
    """

    agent_id: str | None
    agent_name: str | None
    conversation_id: str | None


class _SpanToolCallBuilder:
    """Builds :class:`SpanToolCall` instances for about a third of the cost of its ``__init__``.

    A frozen dataclass's generated ``__init__`` sets every field through
    ``object.__setattr__``, about 0.1 us per field: ~1 us for a SpanToolCall, as much as
    everything else in reading a Pydantic AI tool span. This class has the very same slots, so
    an instance filled with plain attribute stores can become a ``SpanToolCall`` by
    ``__class__`` assignment (CPython allows it between classes of identical layout). Tests
    check that the result equals the one ``SpanToolCall(...)`` builds.
    """

    __slots__ = SpanToolCall.__slots__

    def __init__(
        self,
        tool: str,
        arguments: object,
        result: object,
        is_error: bool | None,
        call_id: str | None,
        agent_id: str | None,
        agent_name: str | None,
        conversation_id: str | None,
        convention: str,
    ) -> None:
        self.tool = tool
        self.arguments = arguments
        self.result = result
        self.is_error = is_error
        self.call_id = call_id
        self.agent_id = agent_id
        self.agent_name = agent_name
        self.conversation_id = conversation_id
        self.convention = convention


def _new_span_tool_call(
    tool: str,
    arguments: object,
    result: object,
    is_error: bool | None,
    call_id: str | None,
    agent_id: str | None,
    agent_name: str | None,
    conversation_id: str | None,
    convention: str,
) -> SpanToolCall:
    """``SpanToolCall(...)``, same positional fields, without the frozen ``__init__`` cost."""
    call = _SpanToolCallBuilder(
        tool, arguments, result, is_error, call_id, agent_id, agent_name, conversation_id, convention
    )
    call.__class__ = SpanToolCall  # type: ignore[assignment]
    return call  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


def decode_json(value: object) -> object:
    """Decode a JSON object, array or quoted string held in ``value``; else return it unchanged.

    * ``str``: parsed with orjson when its first non-blank character is ``{``, ``[`` or ``"``
      and it is at most :data:`MAX_DECODE_CHARS` long. Bare scalars (``weather in Paris``,
      ``42``, ``true``) stay strings on purpose: instrumentations disagree on whether a string
      result is JSON-quoted, and keeping scalars raw makes ``"42"`` and ``'"42"'`` agree.
      A decoded string that itself holds a JSON object or array is decoded once more
      (double-encoded payloads).
    * ``bytes``/``bytearray``/``memoryview`` (OTLP receivers): decoded as UTF-8 with
      replacement, then as ``str``; above the size cap they are returned unchanged.
    * anything unparsable (invalid JSON, NaN, nesting orjson refuses) is returned unchanged.
    * every other type is returned unchanged.

    Never raises.
    """
    if value.__class__ is not str:  # exact-type test first: attribute values are plain str
        if isinstance(value, (bytes, bytearray, memoryview)):
            if len(value) > MAX_DECODE_CHARS:
                return value
            value = bytes(value).decode("utf-8", "replace")
        elif not isinstance(value, str):
            return value
    # _decode_text(value, _JSON_OPENERS), inline: called up to three times per tool span.
    if len(value) > MAX_DECODE_CHARS:
        return value
    head = value[:1]
    if head not in _JSON_OPENERS:
        if head not in _BLANK or value.lstrip()[:1] not in _JSON_OPENERS:
            return value  # plain text, the usual result: two set look-ups
    try:
        decoded = orjson.loads(value)
    except ValueError:  # orjson.JSONDecodeError: invalid JSON, NaN, lone surrogates, depth.
        return value
    if decoded.__class__ is str:
        # A JSON string holding JSON: decode the inner container once, never deeper.
        return _decode_text(decoded, _JSON_CONTAINER_OPENERS)
    return decoded


def _decode_text(text: str, openers: frozenset[str]) -> object:
    if len(text) > MAX_DECODE_CHARS:
        return text
    head = text[:1]
    if head in _BLANK:
        head = text.lstrip()[:1]
    if head not in openers:
        return text
    try:
        return orjson.loads(text)
    except ValueError:  # orjson.JSONDecodeError: invalid JSON, NaN, lone surrogates, depth.
        return text


def _decode_python_literal(text: str) -> object:
    """Parse a Python repr of a dict or list (LangChain ``input_str``); else return ``text``."""
    if len(text) > _PYTHON_LITERAL_MAX_CHARS or text.lstrip()[:1] not in _JSON_CONTAINER_OPENERS:
        return text
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text
    # Only containers JSON can express; a set or tuple repr is not an argument mapping.
    return parsed if isinstance(parsed, (dict, list)) else text


def _text(value: object) -> str | None:
    """A usable identifier: non-empty ``str`` (or a non-bool int, rendered), else ``None``."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        # Python caps decimal str() of huge ints (ValueError); such an "identifier" is useless
        # anyway, so it is treated as absent rather than failing the span.
        return str(value) if value.bit_length() <= 14_000 else None
    return None


def _call_id(value: object) -> str | None:
    text = _text(value)
    return None if text in _CALL_ID_PLACEHOLDERS else text


def _first_text(attributes: Mapping[str, object], keys: Sequence[str]) -> str | None:
    """``_text`` of the first of ``keys`` that gives one, else ``None``."""
    for key in keys:
        value = attributes.get(key)
        if value.__class__ is str:  # the common case, without a call to _text
            if value:
                return value
        elif value is not None:
            text = _text(value)
            if text is not None:
                return text
    return None


def _first_present(attributes: Mapping[str, object], keys: Sequence[str]) -> object:
    for key in keys:
        value = attributes.get(key)
        if value is not None:
            return value
    return None


def _join_text_blocks(value: object) -> object:
    """``[{"text": "a"}, {"type": "text", "text": "b"}]`` -> ``"a\\nb"``; anything else as is.

    Strands, MCP and LangChain content lists wrap a tool's text output in blocks; joining them
    makes the result equal to the plain string other instrumentations record.
    """
    if not isinstance(value, list) or not value:
        return value
    if len(value) == 1:  # the usual single block, without the list and the join
        block = value[0]
        if isinstance(block, dict):
            text = block.get("text")
            if isinstance(text, str) and block.get("type", "text") == "text" and len(block) <= 2:
                return text
        return value
    texts: list[str] = []
    for block in value:
        if not isinstance(block, dict):
            return value
        text = block.get("text")
        if not isinstance(text, str) or block.get("type", "text") != "text" or len(block) > 2:
            return value
        texts.append(text)
    return "\n".join(texts)


# --------------------------------------------------------------------------------------------
# Shapes: how one instrumentation encodes arguments and results.
# --------------------------------------------------------------------------------------------


class _Unwrapped:
    """A decoded value plus what its envelope revealed about the call. Read-only by convention.

    A plain slotted class rather than a frozen dataclass: shapes build one or two per tool span,
    and a frozen dataclass's ``__init__`` costs several times as much.
    """

    __slots__ = ("value", "call_id", "is_error")

    def __init__(self, value: object, call_id: str | None = None, is_error: bool | None = None) -> None:
        self.value = value
        self.call_id = call_id
        self.is_error = is_error

    def __repr__(self) -> str:
        return f"_Unwrapped(value={self.value!r}, call_id={self.call_id!r}, is_error={self.is_error!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Unwrapped):
            return NotImplemented
        return (self.value, self.call_id, self.is_error) == (other.value, other.call_id, other.is_error)


ArgumentsShape = Callable[[object, Mapping[str, object]], _Unwrapped]
"""Decodes a raw arguments value; gets the span attributes for schema look-ups."""

ResultShape = Callable[[object], _Unwrapped]
"""Decodes a raw result value."""


def json_arguments(raw: object, attributes: Mapping[str, object]) -> _Unwrapped:
    """Arguments as a JSON string (GenAI semconv, Pydantic AI, Strands, ADK, CrewAI, OpenLIT)."""
    return _Unwrapped(decode_json(raw))


_ENVELOPE_KEYS: Final = frozenset({"args", "kwargs"})
_OUTPUT_ENVELOPE_KEYS: Final = frozenset({"output", "kwargs"})


def openllmetry_envelope_arguments(raw: object, attributes: Mapping[str, object]) -> _Unwrapped:
    """OpenLLMetry envelopes.

    * LangChain: ``{"input_str": "<python repr>", "tags": ..., "metadata": ...,
      "inputs": {<arguments>}, "kwargs": {"tool_call_id": ...}}``: ``inputs`` are the arguments
      (``input_str`` only when ``inputs`` is absent), the call id is ``kwargs.tool_call_id``.
    * ``@tool`` decorator: ``{"args": [...], "kwargs": {...}}``: keyword arguments when there
      are any, else the positional list (the parameter names are not recorded).
    """
    value = decode_json(raw)
    if not isinstance(value, dict):
        return _Unwrapped(value)
    kwargs = value.get("kwargs")
    if "inputs" in value or "input_str" in value:
        call_id = _call_id(kwargs.get("tool_call_id")) if isinstance(kwargs, dict) else None
        if "inputs" in value:
            return _Unwrapped(value["inputs"], call_id)
        # Older releases only give input_str: a Python repr of the arguments.
        arguments = decode_json(value["input_str"])
        if isinstance(arguments, str):
            arguments = _decode_python_literal(arguments)
        return _Unwrapped(arguments, call_id)
    if value and value.keys() <= _ENVELOPE_KEYS:
        if isinstance(kwargs, dict) and kwargs:
            return _Unwrapped(kwargs)
        args = value.get("args")
        if isinstance(args, list) and args:
            return _Unwrapped(args)
        return _Unwrapped({})
    return _Unwrapped(value)


def openinference_arguments(raw: object, attributes: Mapping[str, object]) -> _Unwrapped:
    """OpenInference ``input.value``.

    * JSON object (OpenAI Agents SDK's raw model string, LangChain multi-argument tools).
    * Python repr of a dict (older LangChain paths): parsed with ``ast.literal_eval``.
    * A LangChain ``ToolCall`` dict (``{"name", "args", "id", "type": "tool_call"}``).
    * A bare scalar (LangChain one-argument tools): mapped to ``{name: value}`` when
      ``tool.parameters``/``tool.json_schema`` declares exactly one property; else kept as is,
      because the parameter name is not on the span.
    """
    value = decode_json(raw)
    if isinstance(value, str):
        value = _decode_python_literal(value)
    if isinstance(value, dict):
        args = value.get("args")
        if value.get("type") == "tool_call" and isinstance(args, dict):
            return _Unwrapped(args, _call_id(value.get("id")))
        return _Unwrapped(value)
    if isinstance(value, str):
        parameter = _single_parameter(attributes)
        if parameter is not None:
            name, json_type = parameter
            return _Unwrapped({name: _coerce_scalar(value, json_type)})
    return _Unwrapped(value)


def _single_parameter(attributes: Mapping[str, object]) -> tuple[str, str | None] | None:
    """The only property of the tool's JSON schema, with its JSON type, or ``None``."""
    for key in (OPENINFERENCE_TOOL_PARAMETERS, OPENINFERENCE_TOOL_JSON_SCHEMA):
        raw = attributes.get(key)
        if raw is None:  # the usual case (LangGraph records no schema): nothing to decode
            continue
        schema = decode_json(raw)
        if not isinstance(schema, dict):
            continue
        # Accept a bare schema, {"parameters": schema} and OpenAI's {"function": {...}}.
        function = schema.get("function")
        if isinstance(function, dict):
            schema = function
        parameters = schema.get("parameters")
        if isinstance(parameters, dict):
            schema = parameters
        properties = schema.get("properties")
        if isinstance(properties, dict) and len(properties) == 1:
            ((name, spec),) = properties.items()
            if isinstance(name, str):
                json_type = spec.get("type") if isinstance(spec, dict) else None
                return name, json_type if isinstance(json_type, str) else None
    return None


_SCALAR_TYPES: Final[Mapping[str, tuple[type, ...]]] = {
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def _coerce_scalar(text: str, json_type: str | None) -> object:
    """Turn ``"5"`` back into ``5`` when the schema says the parameter is not a string."""
    expected = _SCALAR_TYPES.get(json_type or "")
    if expected is None or len(text) > MAX_DECODE_CHARS:
        return text
    try:
        parsed = orjson.loads(text)
    except ValueError:
        return text
    if isinstance(parsed, bool) and bool not in expected:
        return text
    return parsed if isinstance(parsed, expected) else text


def text_result(raw: object) -> _Unwrapped:
    """A JSON or plain-text result; text blocks are joined (Strands, MCP)."""
    return _Unwrapped(_join_text_blocks(decode_json(raw)))


def langchain_message_result(raw: object) -> _Unwrapped:
    """A LangChain ``ToolMessage`` as OpenInference or OpenLLMetry record it.

    * OpenInference: ``{"type": "tool", "data": {"content", "tool_call_id", "status"}}``.
    * OpenLLMetry: ``{"output": {"lc": 1, "type": "constructor", "id": [..., "ToolMessage"],
      "kwargs": {"content", "tool_call_id", "status"}}, "kwargs": {...}}``.

    The result is the message ``content``; its ``tool_call_id`` and ``status`` are reported.
    Any other value (the OpenAI Agents SDK's plain output) is decoded like :func:`text_result`.
    """
    value = decode_json(raw)
    if isinstance(value, dict) and "output" in value and value.keys() <= _OUTPUT_ENVELOPE_KEYS:
        value = value["output"]
    message: object = None
    if isinstance(value, dict):
        if value.get("lc") == 1:
            message = value.get("kwargs")
        elif value.get("type") == "tool":
            message = value.get("data")
    if not isinstance(message, dict) or "content" not in message:
        return _Unwrapped(_join_text_blocks(value))
    status = message.get("status")
    is_error = None
    if isinstance(status, str):
        is_error = True if status in _ERROR_STATUS_VALUES else False
    return _Unwrapped(
        _join_text_blocks(decode_json(message["content"])), _call_id(message.get("tool_call_id")), is_error
    )


def adk_result(raw: object) -> _Unwrapped:
    """Google ADK wraps a non-dict tool return as ``{"result": value}``; unwrap it."""
    value = decode_json(raw)
    if isinstance(value, dict) and len(value) == 1 and "result" in value:
        return _Unwrapped(_join_text_blocks(value["result"]))
    return _Unwrapped(_join_text_blocks(value))


# --------------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------------


class On(enum.Enum):
    """What a :class:`Condition` looks at."""

    ATTRIBUTE = "attribute"
    SPAN_NAME = "span_name"
    SPAN_NAME_PREFIX = "span_name_prefix"
    EVENT = "event"


# Module-level aliases: reading an enum member through its class costs ~0.07 us in 3.11.
_ON_ATTRIBUTE: Final = On.ATTRIBUTE
_ON_SPAN_NAME: Final = On.SPAN_NAME
_ON_SPAN_NAME_PREFIX: Final = On.SPAN_NAME_PREFIX

_Events = Sequence[tuple[str, Mapping[str, object]]]


@dataclass(frozen=True, slots=True)
class Condition:
    """One test a span must pass for a convention to apply.

    * ``On.ATTRIBUTE``: one of ``keys`` is present; with ``values``, its value is one of them.
    * ``On.SPAN_NAME``: the span name is one of ``keys``.
    * ``On.SPAN_NAME_PREFIX``: the span name starts with one of ``keys``.
    * ``On.EVENT``: the span has an event named one of ``keys`` (only known at span end).

    The first condition of every entry is its *gate* and must be cheap (an attribute with
    ``values``, a span name or a span-name prefix): gates are indexed when the tables are
    compiled, so a span that passes no gate costs a few lookups.
    """

    on: On
    keys: tuple[str, ...]
    values: frozenset[str] | None = None

    def holds(self, name: str, attributes: Mapping[str, object], events: _Events) -> bool:
        """Whether the span passes this condition; never raises."""
        on = self.on
        if on is _ON_ATTRIBUTE:
            values = self.values
            for key in self.keys:
                value = attributes.get(key)
                if value is None:
                    continue
                if values is None or (isinstance(value, str) and value in values):
                    return True
            return False
        if on is _ON_SPAN_NAME:
            return name in self.keys
        if on is _ON_SPAN_NAME_PREFIX:
            return name.startswith(self.keys)
        keys = self.keys
        for event in events:
            if _event_name(event) in keys:
                return True
        return False


def attribute_is(key: str, *values: str) -> Condition:
    """The attribute ``key`` equals one of ``values``."""
    return Condition(On.ATTRIBUTE, (key,), frozenset(values))


def attribute_present(*keys: str) -> Condition:
    """At least one of ``keys`` is present."""
    return Condition(On.ATTRIBUTE, keys)


def span_name_is(*names: str) -> Condition:
    """The span name is one of ``names``."""
    return Condition(On.SPAN_NAME, names)


def span_name_starts(*prefixes: str) -> Condition:
    """The span name starts with one of ``prefixes``."""
    return Condition(On.SPAN_NAME_PREFIX, prefixes)


def has_event(*names: str) -> Condition:
    """The span has an event with one of ``names``."""
    return Condition(On.EVENT, names)


def _after_prefix(prefix: str) -> Callable[[str], str | None]:
    def tool_from_name(name: str) -> str | None:
        return (name[len(prefix) :] or None) if name.startswith(prefix) else None

    return tool_from_name


def _before_suffix(suffix: str) -> Callable[[str], str | None]:
    def tool_from_name(name: str) -> str | None:
        return (name[: -len(suffix)] or None) if name.endswith(suffix) else None

    return tool_from_name


def _whole_name(name: str) -> str | None:
    return name or None


def _no_name(name: str) -> str | None:
    return None


_execute_tool_suffix: Final = _after_prefix(EXECUTE_TOOL_SPAN_PREFIX)


@dataclass(frozen=True, slots=True)
class ToolConvention:
    """How one instrumentation marks a tool call.

    Keys are tried in order; the first present one wins. ``argument_event`` and
    ``result_event`` are ``(event name, attribute key)`` pairs read when no attribute key is
    present (Strands' default semconv). ``tool_from_span_name`` derives the tool name from the
    span name when no ``tool_keys`` attribute is present.
    """

    name: str
    when: tuple[Condition, ...]
    tool_keys: tuple[str, ...] = (GEN_AI_TOOL_NAME,)
    tool_from_span_name: Callable[[str], str | None] = _execute_tool_suffix
    argument_keys: tuple[str, ...] = (GEN_AI_TOOL_CALL_ARGUMENTS,)
    argument_event: tuple[str, str] | None = None
    arguments_shape: ArgumentsShape = json_arguments
    result_keys: tuple[str, ...] = (GEN_AI_TOOL_CALL_RESULT,)
    result_event: tuple[str, str] | None = None
    result_shape: ResultShape = text_result
    call_id_keys: tuple[str, ...] = (GEN_AI_TOOL_CALL_ID,)
    agent_id_keys: tuple[str, ...] = (GEN_AI_AGENT_ID,)
    agent_name_keys: tuple[str, ...] = (GEN_AI_AGENT_NAME,)
    skip_tools: frozenset[str] = field(default_factory=frozenset)
    """Tool names that mark an aggregate span rather than one call (ADK "(merged tools)")."""


_ADK_TOOL_CLASSES: Final = frozenset(
    {
        # gen_ai.tool.type is the Python class name in Google ADK, not function/extension/...
        "AgentTool",
        "APIHubTool",
        "AuthenticatedFunctionTool",
        "BaseTool",
        "CrewaiTool",
        "FunctionTool",
        "LangchainTool",
        "LongRunningFunctionTool",
        "MCPTool",
        "McpTool",
        "RestApiTool",
        "TransferToAgentTool",
    }
)

_EXECUTE_TOOL: Final = attribute_is(GEN_AI_OPERATION_NAME, OPERATION_EXECUTE_TOOL)

TOOL_CONVENTIONS: Final[tuple[ToolConvention, ...]] = (
    # Pydantic AI instrumentation version 2: arguments already at span start.
    ToolConvention(
        name="pydantic_ai_legacy",
        when=(span_name_is("running tool"),),
        tool_from_span_name=_no_name,
        argument_keys=(PYDANTIC_AI_LEGACY_ARGUMENTS,),
        result_keys=(PYDANTIC_AI_LEGACY_RESULT,),
    ),
    # CrewAI's own tracing (a private TracerProvider) with gen_ai.* keys.
    ToolConvention(
        name="crewai",
        when=(span_name_is("call tool"),),
        tool_from_span_name=_no_name,
    ),
    # OpenLLMetry's LangChain instrumentation: gen_ai.tool.call.arguments is an envelope.
    ToolConvention(
        name="openllmetry_langchain",
        when=(attribute_is(TRACELOOP_SPAN_KIND, "tool"), _EXECUTE_TOOL),
        tool_keys=(GEN_AI_TOOL_NAME, TRACELOOP_ENTITY_NAME),
        argument_keys=(GEN_AI_TOOL_CALL_ARGUMENTS, TRACELOOP_ENTITY_INPUT),
        arguments_shape=openllmetry_envelope_arguments,
        result_keys=(GEN_AI_TOOL_CALL_RESULT, TRACELOOP_ENTITY_OUTPUT),
        result_shape=langchain_message_result,
    ),
    # OpenLLMetry's @tool decorator: span "<name>.tool", {"args": [...], "kwargs": {...}}.
    ToolConvention(
        name="openllmetry_tool",
        when=(attribute_is(TRACELOOP_SPAN_KIND, "tool"),),
        tool_keys=(GEN_AI_TOOL_NAME, TRACELOOP_ENTITY_NAME),
        tool_from_span_name=_before_suffix(".tool"),
        argument_keys=(TRACELOOP_ENTITY_INPUT, GEN_AI_TOOL_CALL_ARGUMENTS),
        arguments_shape=openllmetry_envelope_arguments,
        result_keys=(TRACELOOP_ENTITY_OUTPUT, GEN_AI_TOOL_CALL_RESULT),
        result_shape=langchain_message_result,
    ),
    # OpenInference (LangChain/LangGraph, OpenAI Agents SDK, ...): span named after the tool.
    ToolConvention(
        name="openinference",
        when=(attribute_is(OPENINFERENCE_SPAN_KIND, "TOOL"),),
        tool_keys=(OPENINFERENCE_TOOL_NAME, GEN_AI_TOOL_NAME),
        tool_from_span_name=_whole_name,
        argument_keys=(OPENINFERENCE_INPUT_VALUE,),
        arguments_shape=openinference_arguments,
        result_keys=(OPENINFERENCE_OUTPUT_VALUE,),
        result_shape=langchain_message_result,
        call_id_keys=(OPENINFERENCE_TOOL_CALL_ID, GEN_AI_TOOL_CALL_ID),
    ),
    # Strands default: arguments and result in span events.
    ToolConvention(
        name="strands_event",
        when=(_EXECUTE_TOOL, has_event(STRANDS_TOOL_MESSAGE_EVENT)),
        argument_event=(STRANDS_TOOL_MESSAGE_EVENT, "content"),
        result_event=(STRANDS_CHOICE_EVENT, "message"),
    ),
    # Strands with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental.
    ToolConvention(
        name="strands",
        when=(
            _EXECUTE_TOOL,
            Condition(On.ATTRIBUTE, (GEN_AI_PROVIDER_NAME, GEN_AI_SYSTEM), frozenset({STRANDS_PROVIDER})),
        ),
    ),
    # Google ADK, legacy gcp.vertex.agent.* schema (also still set next to gen_ai.* keys).
    ToolConvention(
        name="google_adk",
        when=(_EXECUTE_TOOL, attribute_present(ADK_TOOL_CALL_ARGS, ADK_TOOL_RESPONSE, ADK_EVENT_ID)),
        argument_keys=(GEN_AI_TOOL_CALL_ARGUMENTS, ADK_TOOL_CALL_ARGS),
        result_keys=(GEN_AI_TOOL_CALL_RESULT, ADK_TOOL_RESPONSE),
        result_shape=adk_result,
        skip_tools=frozenset({ADK_MERGED_TOOLS}),
    ),
    # Google ADK 2.x with only gen_ai.* keys: recognised by its class-name tool type.
    ToolConvention(
        name="google_adk",
        when=(_EXECUTE_TOOL, Condition(On.ATTRIBUTE, (GEN_AI_TOOL_TYPE,), _ADK_TOOL_CLASSES)),
        argument_keys=(GEN_AI_TOOL_CALL_ARGUMENTS, ADK_TOOL_CALL_ARGS),
        result_keys=(GEN_AI_TOOL_CALL_RESULT, ADK_TOOL_RESPONSE),
        result_shape=adk_result,
        skip_tools=frozenset({ADK_MERGED_TOOLS}),
    ),
    # Pydantic AI (instrumentation version 3+): plain GenAI semconv, arguments at start.
    ToolConvention(
        name="pydantic_ai",
        when=(_EXECUTE_TOOL, attribute_present(LOGFIRE_MSG)),
    ),
    # Older OpenLIT releases wrote gen_ai.tool.args; current ones are plain "genai".
    ToolConvention(
        name="openlit",
        when=(_EXECUTE_TOOL, attribute_present(OPENLIT_TOOL_ARGS)),
        argument_keys=(GEN_AI_TOOL_CALL_ARGUMENTS, OPENLIT_TOOL_ARGS),
    ),
    # GenAI semantic conventions: util-genai, OpenLIT, ADK 2.x, anything conformant.
    ToolConvention(name="genai", when=(_EXECUTE_TOOL,)),
    # A conformant span name before its attributes arrive (ADK sets them at the end).
    ToolConvention(name="genai", when=(span_name_starts(EXECUTE_TOOL_SPAN_PREFIX),)),
)
"""Tool-span conventions, most specific first; the first entry whose conditions hold wins."""

#: Conventions whose instrumentation starts tool spans with the arguments already set (Pydantic
#: AI): a recording that does not say what a span carried at start (OTLP) can only have been
#: decided at start for these. A test checks it against every fixture dump with
#: :func:`arguments_available_at_start`.
ARGUMENTS_AT_START_CONVENTIONS: Final = frozenset({"pydantic_ai", "pydantic_ai_legacy"})


@dataclass(frozen=True, slots=True)
class AgentConvention:
    """How one instrumentation marks an agent-run span."""

    name: str
    when: tuple[Condition, ...]
    id_keys: tuple[str, ...] = (GEN_AI_AGENT_ID,)
    name_keys: tuple[str, ...] = (GEN_AI_AGENT_NAME,)
    name_from_span_name: Callable[[str], str | None] = _after_prefix(INVOKE_AGENT_SPAN_PREFIX)


AGENT_CONVENTIONS: Final[tuple[AgentConvention, ...]] = (
    # GenAI semconv (Pydantic AI incl. legacy "agent run", Strands, ADK, OpenLLMetry LangGraph).
    AgentConvention(
        name="genai",
        when=(attribute_is(GEN_AI_OPERATION_NAME, OPERATION_INVOKE_AGENT),),
        name_keys=(GEN_AI_AGENT_NAME, PYDANTIC_AI_LEGACY_AGENT_NAME),
    ),
    # OpenInference AGENT spans are named after the agent (LangGraph graph, Agents SDK agent).
    AgentConvention(
        name="openinference",
        when=(attribute_is(OPENINFERENCE_SPAN_KIND, "AGENT"),),
        id_keys=("agent.id", GEN_AI_AGENT_ID),
        name_keys=(OPENINFERENCE_AGENT_NAME, GEN_AI_AGENT_NAME),
        name_from_span_name=_whole_name,
    ),
    # OpenLLMetry @agent and @workflow spans ("<name>.agent", "<name>.workflow").
    AgentConvention(
        name="openllmetry",
        when=(attribute_is(TRACELOOP_SPAN_KIND, "agent", "workflow"),),
        name_keys=(GEN_AI_AGENT_NAME, TRACELOOP_ENTITY_NAME, TRACELOOP_WORKFLOW_NAME),
        name_from_span_name=_no_name,
    ),
)
"""Agent-span conventions; the first entry whose conditions hold wins."""



# --------------------------------------------------------------------------------------------
# The tables, compiled
# --------------------------------------------------------------------------------------------

_Check = Callable[[str, Mapping[str, object], _Events], bool]
"""A compiled :meth:`Condition.holds`: same arguments, same answer."""

_Convention = TypeVar("_Convention", ToolConvention, AgentConvention)


def _compile_check(condition: Condition) -> _Check:
    """A function answering exactly as ``condition.holds``, without its dispatch on ``on``."""
    keys, values = condition.keys, condition.values
    if condition.on is On.ATTRIBUTE:
        if len(keys) == 1:
            (key,) = keys
            if values is None:

                def has_attribute(name: str, attributes: Mapping[str, object], events: _Events) -> bool:
                    return attributes.get(key) is not None

                return has_attribute

            def attribute_in(name: str, attributes: Mapping[str, object], events: _Events) -> bool:
                value = attributes.get(key)
                return isinstance(value, str) and value in values

            return attribute_in
        if values is None:

            def has_any_attribute(name: str, attributes: Mapping[str, object], events: _Events) -> bool:
                for key in keys:
                    if attributes.get(key) is not None:
                        return True
                return False

            return has_any_attribute

        def any_attribute_in(name: str, attributes: Mapping[str, object], events: _Events) -> bool:
            for key in keys:
                value = attributes.get(key)
                if isinstance(value, str) and value in values:
                    return True
            return False

        return any_attribute_in
    if condition.on is On.SPAN_NAME:

        def name_in(name: str, attributes: Mapping[str, object], events: _Events) -> bool:
            return name in keys

        return name_in
    if condition.on is On.SPAN_NAME_PREFIX:

        def name_starts(name: str, attributes: Mapping[str, object], events: _Events) -> bool:
            return name.startswith(keys)

        return name_starts

    def has_event(name: str, attributes: Mapping[str, object], events: _Events) -> bool:
        for event in events:
            # _event_name(event) in keys, inline; keys hold no None
            if isinstance(event, (tuple, list)) and len(event) == 2 and event[0] in keys:
                return True
        return False

    return has_event


def _all_of(checks: Sequence[_Check]) -> _Check | None:
    """One check for a sequence of them; ``None`` when there is nothing to check."""
    if not checks:
        return None
    if len(checks) == 1:
        return checks[0]

    def all_hold(name: str, attributes: Mapping[str, object], events: _Events) -> bool:
        for check in checks:
            if not check(name, attributes, events):
                return False
        return True

    return all_hold


_Step = tuple[str | None, frozenset[str] | None, _Check | None, _Convention]
"""One test of a compiled entry: ``(key, values, check, convention)``. With a ``key``: the
attribute is present and, with ``values``, a str among them (an attribute condition, inline);
else ``check`` holds, or there is nothing left to test when it is ``None``. The first step that
passes gives ``convention``."""


def _steps(convention: _Convention, rest: Sequence[Condition]) -> tuple[_Step[_Convention], ...]:
    """The steps testing ``rest``, the conditions of ``convention`` its gate bits do not cover."""
    if len(rest) == 1 and rest[0].on is On.ATTRIBUTE:
        # "Any of these keys": one inline step per key, all giving the same convention.
        return tuple((key, rest[0].values, None, convention) for key in rest[0].keys)
    return ((None, None, _all_of([_compile_check(c) for c in rest]), convention),)


@dataclass(frozen=True, slots=True)
class _Plan(Generic[_Convention]):
    """One table entry, compiled.

    ``required_bits``: the gate bits of every condition of the entry that is some entry's gate
    (its own first condition always is). ``steps``: the test of its other conditions.
    """

    required_bits: int
    steps: tuple[_Step[_Convention], ...]


class _Dispatch(Generic[_Convention]):
    """A conventions table compiled for the hot path; answers exactly as the table read in order.

    Algorithm, per span:

    1. :meth:`gate_bits`: one bit per distinct gate condition (the first condition of some
       entry) that the span passes, found with one ``get`` per gate attribute key
       (:attr:`attribute_gates`), one name lookup (:attr:`name_bits`) and one ``startswith``
       (:attr:`prefixes`). No bit: not a span of this table, the common case.
    2. :meth:`match`: the entries whose gate-condition bits are all set, in table order
       (memoised per bit set), are tested with their remaining conditions, compiled to
       "steps": an attribute test run inline, or a small function; the first entry that passes
       them all is the answer.

    As before compiling, an attribute gate only opens on a plain ``str`` value; a ``str``
    subclass (an enum member) satisfies the condition once another gate has opened.
    """

    __slots__ = ("attribute_gates", "name_bits", "prefixes", "prefix_gates", "_plans", "_steps_by_bits")

    def __init__(self, table: Sequence[_Convention]) -> None:
        gate_bits: dict[Condition, int] = {}
        for convention in table:
            gate = convention.when[0]
            cheap = gate.on in (On.SPAN_NAME, On.SPAN_NAME_PREFIX) or (
                gate.on is On.ATTRIBUTE and gate.values is not None
            )
            if not cheap:
                raise ValueError(
                    f"convention {convention.name!r}: first condition {gate!r} is not a cheap gate"
                )
            gate_bits.setdefault(gate, 1 << len(gate_bits))

        by_attribute: dict[str, dict[str, int]] = {}
        name_bits: dict[str, int] = {}
        prefix_bits: list[tuple[tuple[str, ...], int]] = []
        for gate, bit in gate_bits.items():
            if gate.on is On.ATTRIBUTE:
                for key in gate.keys:
                    bits_by_value = by_attribute.setdefault(key, {})
                    for value in gate.values or ():
                        bits_by_value[value] = bits_by_value.get(value, 0) | bit
            elif gate.on is On.SPAN_NAME:
                for name in gate.keys:
                    name_bits[name] = name_bits.get(name, 0) | bit
            else:
                prefix_bits.append((gate.keys, bit))

        self.attribute_gates: tuple[tuple[str, Mapping[str, int]], ...] = tuple(by_attribute.items())
        """``(attribute key, {value: bits})`` for every key some gate reads."""
        self.name_bits: Mapping[str, int] = name_bits
        """Span name -> bits of the name gates it passes."""
        self.prefixes: tuple[str, ...] = tuple(p for prefixes, _ in prefix_bits for p in prefixes)
        """Every gate prefix: a name starting with none of them passes no prefix gate."""
        self.prefix_gates: tuple[tuple[tuple[str, ...], int], ...] = tuple(prefix_bits)
        """``(prefixes, bit)`` of every prefix gate."""
        self._plans: tuple[_Plan[_Convention], ...] = tuple(
            _Plan(
                required_bits=_or(gate_bits.get(condition, 0) for condition in convention.when),
                steps=_steps(convention, [c for c in convention.when if c not in gate_bits]),
            )
            for convention in table
        )
        # At most 2 ** (number of gates) entries; filled on first use of each bit set. A racing
        # thread computes the same tuple, so the memo needs no lock.
        self._steps_by_bits: dict[int, tuple[_Step[_Convention], ...]] = {}

    def gate_bits(self, name: str, attributes: Mapping[str, object]) -> int:
        """Bits of the gate conditions the span passes; 0 when none opens, or when ``name`` is
        no ``str`` or ``attributes`` no mapping.

        :func:`tool_call_from_span` and :func:`agent_from_span` inline this method, because a
        call costs a sixth of rejecting a span; keep the three alike.
        """
        try:
            bits = self.name_bits[name] if name in self.name_bits else 0
            if name.startswith(self.prefixes):
                for prefixes, bit in self.prefix_gates:
                    if name.startswith(prefixes):
                        bits |= bit
            subclass_bits = 0
            for key, bits_by_value in self.attribute_gates:
                value = attributes.get(key)
                if value is None:
                    continue
                if value.__class__ is str:
                    if value in bits_by_value:
                        bits |= bits_by_value[value]
                elif isinstance(value, str):
                    subclass_bits |= bits_by_value.get(value, 0)
        except (AttributeError, TypeError):  # a name that is no str, attributes that are no mapping
            return 0
        if not bits or not _is_mapping(attributes) or not _is_str(name):
            return 0
        return bits | subclass_bits

    def match(
        self, bits: int, name: str, attributes: Mapping[str, object], events: _Events
    ) -> _Convention | None:
        """The first entry, in table order, whose conditions all hold; ``bits`` from
        :meth:`gate_bits` (non-zero)."""
        steps = self._steps_by_bits.get(bits)
        if steps is None:
            steps = tuple(
                step
                for plan in self._plans
                if plan.required_bits & bits == plan.required_bits
                for step in plan.steps
            )
            self._steps_by_bits[bits] = steps
        for key, values, check, convention in steps:
            if key is not None:
                value = attributes.get(key)  # Condition.holds for one attribute key, inline
                if value is not None and (values is None or (isinstance(value, str) and value in values)):
                    return convention
            elif check is None or check(name, attributes, events):
                return convention
        return None


def _or(bits: Iterable[int]) -> int:
    result = 0
    for bit in bits:
        result |= bit
    return result


_TOOLS: Final = _Dispatch(TOOL_CONVENTIONS)
_AGENTS: Final = _Dispatch(AGENT_CONVENTIONS)
# The gate data the public functions read inline, as module globals (cheaper than attributes).
_TOOL_ATTRIBUTE_GATES: Final = _TOOLS.attribute_gates
_TOOL_NAME_BITS: Final = _TOOLS.name_bits
_TOOL_PREFIXES: Final = _TOOLS.prefixes
_TOOL_PREFIX_GATES: Final = _TOOLS.prefix_gates
_AGENT_ATTRIBUTE_GATES: Final = _AGENTS.attribute_gates
_AGENT_NAME_BITS: Final = _AGENTS.name_bits
_AGENT_PREFIXES: Final = _AGENTS.prefixes
_AGENT_PREFIX_GATES: Final = _AGENTS.prefix_gates


def _event_name(event: object) -> object:
    # Tolerate lists too: replayed JSON gives [name, attributes] pairs.
    return event[0] if isinstance(event, (tuple, list)) and len(event) == 2 else None


def _event_value(events: _Events, event_name: str, key: str) -> object:
    """The attribute ``key`` of the first event named ``event_name`` that has it, else None."""
    for event in events:
        # _event_name(event) == event_name, inline
        if isinstance(event, (tuple, list)) and len(event) == 2 and event[0] == event_name:
            event_attributes = event[1]
            if event_attributes.__class__ is dict or isinstance(event_attributes, Mapping):
                value = event_attributes.get(key)
                if value is not None:
                    return value
    return None


def _is_mapping(value: object) -> bool:
    # Exact-type test first: ``isinstance`` against the Mapping ABC costs ~0.1 us.
    return value.__class__ is dict or isinstance(value, Mapping)


def _is_str(value: object) -> bool:
    return value.__class__ is str or isinstance(value, str)


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------


def tool_call_from_span(
    name: str,
    attributes: Mapping[str, object],
    events: Sequence[tuple[str, Mapping[str, object]]] = (),
    status_error: bool | None = None,
) -> SpanToolCall | None:
    """The tool call a span records, or ``None`` when the span is not a tool span.

    ``events`` are ``(name, attributes)`` pairs (Strands carries arguments there).
    ``status_error``: ``True`` when the span status is ERROR, ``False`` when the span ended
    with another status, ``None`` when unknown (for instance at span start).

    Cost: a span that no convention's gate accepts returns after one ``get`` per gate
    attribute key (three today), a name lookup and a ``startswith``; decoding happens only for
    recognised tool spans. A plain ``dict`` of attributes is the fast case; any ``Mapping``
    works. Called on any thread, concurrently; never blocks, never raises.
    """
    # _TOOLS.gate_bits, inline: this runs for every span the application ends. The types are
    # checked after the gate, which a wrong type fails or raises on.
    try:
        bits = _TOOL_NAME_BITS[name] if name in _TOOL_NAME_BITS else 0
        if name.startswith(_TOOL_PREFIXES):
            for prefixes, bit in _TOOL_PREFIX_GATES:
                if name.startswith(prefixes):
                    bits |= bit
        subclass_bits = 0
        for key, bits_by_value in _TOOL_ATTRIBUTE_GATES:
            value = attributes.get(key)
            if value is None:
                continue
            if value.__class__ is str:
                if value in bits_by_value:  # cheaper than get() for the usual miss
                    bits |= bits_by_value[value]
            elif isinstance(value, str):
                subclass_bits |= bits_by_value.get(value, 0)
    except (AttributeError, TypeError):  # a name that is no str, attributes that are no mapping
        return None
    if not bits:
        return None
    if attributes.__class__ is not dict and not isinstance(attributes, Mapping):
        return None
    if name.__class__ is not str and not isinstance(name, str):
        return None
    if events.__class__ is not tuple and events.__class__ is not list and not isinstance(events, Sequence):
        events = ()
    convention = _TOOLS.match(bits | subclass_bits, name, attributes, events)
    if convention is None:
        return None
    return _read_tool_call(convention, name, attributes, events, status_error)


def _read_tool_call(
    convention: ToolConvention,
    name: str,
    attributes: Mapping[str, object],
    events: _Events,
    status_error: bool | None,
) -> SpanToolCall | None:
    """Read a span ``convention`` matched; ``None`` when it names no tool (or a skipped one)."""
    tool = _first_text(attributes, convention.tool_keys) or convention.tool_from_span_name(name)
    if tool is None or tool in convention.skip_tools:
        return None

    # json_arguments and text_result reveal nothing but the value: apply their decoding
    # directly rather than through an _Unwrapped (the common case, and the cheaper one).
    arguments: object = MISSING
    argument_call_id = None
    raw_arguments = None
    for key in convention.argument_keys:  # _first_present, inline
        raw_arguments = attributes.get(key)
        if raw_arguments is not None:
            break
    if raw_arguments is None and convention.argument_event is not None:
        raw_arguments = _event_value(events, *convention.argument_event)
    if raw_arguments is not None:
        arguments_shape = convention.arguments_shape
        if arguments_shape is json_arguments:
            arguments = decode_json(raw_arguments)
        else:
            unwrapped = arguments_shape(raw_arguments, attributes)
            arguments, argument_call_id = unwrapped.value, unwrapped.call_id

    result: object = None
    result_call_id = None
    result_error = None
    raw_result = None
    for key in convention.result_keys:  # _first_present, inline
        raw_result = attributes.get(key)
        if raw_result is not None:
            break
    if raw_result is None and convention.result_event is not None:
        raw_result = _event_value(events, *convention.result_event)
    if raw_result is not None:
        result_shape = convention.result_shape
        if result_shape is text_result:
            result = decode_json(raw_result)
            if isinstance(result, list):  # _join_text_blocks leaves everything else as is
                result = _join_text_blocks(result)
        else:
            unwrapped = result_shape(raw_result)
            result, result_call_id, result_error = unwrapped.value, unwrapped.call_id, unwrapped.is_error

    call_id = None
    for key in convention.call_id_keys:
        value = attributes.get(key)
        if value.__class__ is str:  # _call_id(value), inline for the usual str
            if value and value not in _CALL_ID_PLACEHOLDERS:
                call_id = value
                break
        elif value is not None:
            call_id = _call_id(value)
            if call_id is not None:
                break

    return _new_span_tool_call(
        tool,
        arguments,
        result,
        _is_error(attributes, events, status_error, result_error),
        call_id or argument_call_id or result_call_id,
        _first_text(attributes, convention.agent_id_keys),
        _first_text(attributes, convention.agent_name_keys),
        _conversation_id(attributes),
        convention.name,
    )


def _is_error(
    attributes: Mapping[str, object],
    events: _Events,
    status_error: bool | None,
    result_error: bool | None,
) -> bool | None:
    """Error evidence wins over success evidence; no evidence either way is ``None``."""
    if status_error is True or result_error is True:
        return True
    succeeded = status_error is False or result_error is False
    for key in _ERROR_STATUS_KEYS:
        status = attributes.get(key)
        if status is not None and isinstance(status, str):
            status = status.lower()
            if status in _ERROR_STATUS_VALUES:
                return True
            succeeded = succeeded or status in _SUCCESS_STATUS_VALUES
    if attributes.get(ERROR_TYPE) not in (None, ""):
        return True
    for event in events:
        # _event_name(event) == EXCEPTION_EVENT, inline
        if isinstance(event, (tuple, list)) and len(event) == 2 and event[0] == EXCEPTION_EVENT:
            return True
    return False if succeeded else None


def arguments_available_at_start(name: str, attributes: Mapping[str, object]) -> bool:
    """Whether the attributes seen by ``SpanProcessor.on_start`` already carry the arguments.

    True for Pydantic AI (current and legacy), whose tool spans are started with their
    arguments, so detection (and a trip event on the still-open tool span) can run at start.
    False for every instrumentation that sets arguments later, and for non-tool spans.
    Same cost as rejecting a span in :func:`tool_call_from_span`. Never raises.
    """
    bits = _TOOLS.gate_bits(name, attributes)
    if not bits:
        return False
    convention = _TOOLS.match(bits, name, attributes, ())
    if convention is None:
        return False
    return _first_present(attributes, convention.argument_keys) is not None


def agent_from_span(name: str, attributes: Mapping[str, object]) -> SpanAgent | None:
    """The agent a span marks the run of, or ``None`` when it is not an agent span.

    Recognises GenAI ``invoke_agent`` spans (Pydantic AI incl. legacy ``agent run``, Strands,
    Google ADK, OpenLLMetry LangGraph), OpenInference AGENT spans (named after the agent) and
    OpenLLMetry agent/workflow spans. Same cost and threading contract as
    :func:`tool_call_from_span`.
    """
    # _AGENTS.gate_bits, inline, as in tool_call_from_span (today's agent gates are all
    # attribute values, so the name tests are skipped on a constant).
    try:
        bits = _AGENT_NAME_BITS[name] if _AGENT_NAME_BITS and name in _AGENT_NAME_BITS else 0
        if _AGENT_PREFIXES and name.startswith(_AGENT_PREFIXES):
            for prefixes, bit in _AGENT_PREFIX_GATES:
                if name.startswith(prefixes):
                    bits |= bit
        subclass_bits = 0
        for key, bits_by_value in _AGENT_ATTRIBUTE_GATES:
            value = attributes.get(key)
            if value is None:
                continue
            if value.__class__ is str:
                if value in bits_by_value:
                    bits |= bits_by_value[value]
            elif isinstance(value, str):
                subclass_bits |= bits_by_value.get(value, 0)
    except (AttributeError, TypeError):
        return None
    if not bits or not _is_mapping(attributes) or not _is_str(name):
        return None
    convention = _AGENTS.match(bits | subclass_bits, name, attributes, ())
    if convention is None:
        return None
    return SpanAgent(
        agent_id=_first_text(attributes, convention.id_keys),
        agent_name=_first_text(attributes, convention.name_keys) or convention.name_from_span_name(name),
        conversation_id=_conversation_id(attributes),
    )


_CONVERSATION_ID_KEYS: Final = (
    GEN_AI_CONVERSATION_ID,
    SESSION_ID,
    TRACELOOP_THREAD_ID,
    TRACELOOP_SESSION_ID,
    TRACELOOP_CONVERSATION_ID,
    ADK_SESSION_ID,
)
_METADATA_CONVERSATION_KEYS: Final = ("thread_id", "session_id", "conversation_id")


def conversation_id(attributes: Mapping[str, object]) -> str | None:
    """The conversation (session, thread) a span belongs to, or ``None``.

    Tried in order: ``gen_ai.conversation.id``, ``session.id`` (OpenInference, Strands),
    OpenLLMetry association properties (``thread_id``, ``session_id``, ``conversation_id``),
    ADK's ``gcp.vertex.agent.session_id``, then LangGraph's ``thread_id`` inside OpenInference's
    ``metadata`` JSON. Never raises.
    """
    if not _is_mapping(attributes):
        return None
    return _conversation_id(attributes)


def _conversation_id(attributes: Mapping[str, object]) -> str | None:
    found = _first_text(attributes, _CONVERSATION_ID_KEYS)
    if found is not None:
        return found
    metadata = attributes.get(OPENINFERENCE_METADATA)
    # The substring test keeps unrelated metadata from being parsed on every span.
    if isinstance(metadata, str) and len(metadata) <= _METADATA_MAX_CHARS and "_id" in metadata:
        decoded = decode_json(metadata)
        if isinstance(decoded, dict):
            return _first_text(decoded, _METADATA_CONVERSATION_KEYS)
    return None
