"""Reading values out of span attributes and events, never raising.

JSON (and Python-repr) decoding with size caps, identifiers, event lookups, the conversation id,
and the "shapes": the small functions that unwrap how one instrumentation encodes a tool call's
arguments or result. The tables (:mod:`._tables`) name a shape per instrumentation.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import orjson

from ._keys import (
    _CALL_ID_PLACEHOLDERS,
    _CONVERSATION_ID_KEYS,
    _ERROR_STATUS_VALUES,
    _FLAG_VALUES,
    _METADATA_CONVERSATION_KEYS,
    OPENINFERENCE_METADATA,
    OPENINFERENCE_TOOL_JSON_SCHEMA,
    OPENINFERENCE_TOOL_PARAMETERS,
)

MAX_DECODE_CHARS: Final = 1 << 20
"""Strings (and bytes) longer than this (1 MiB) are never parsed and are kept raw.

Parsing cost and memory grow with size; one pathological attribute must not stall the
application thread that ends the span. A raw string still compares and hashes exactly."""

_PYTHON_LITERAL_MAX_CHARS: Final = 64 * 1024
"""Python-repr payloads (LangChain ``input_str``) above this are kept raw: ``ast`` is far slower
than orjson, and such payloads only appear as a fallback when no JSON form exists."""

_METADATA_MAX_CHARS: Final = 64 * 1024
"""OpenInference ``metadata`` JSON above this is not searched for a thread id."""

_JSON_OPENERS: Final = frozenset('{["')
_JSON_CONTAINER_OPENERS: Final = frozenset("{[")
_BLANK: Final = frozenset(" \t\r\n")

_Events = Sequence[tuple[str, Mapping[str, object]]]
"""A span's events as ``(name, attributes)`` pairs (lists, from replayed JSON, work too)."""


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


def _flag(attributes: Mapping[str, object], keys: Sequence[str]) -> bool | None:
    """The first of ``keys`` holding a boolean flag (``True``/``False``, or its text: ``true``,
    ``1``, ``false``, ``0``, any case), else ``None``."""
    for key in keys:
        value = attributes.get(key)
        if value is None:
            continue
        if value is True or value is False:
            return value
        if isinstance(value, str):
            flag = _FLAG_VALUES.get(value.strip().lower())
            if flag is not None:
                return flag
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
# Conversation id
# --------------------------------------------------------------------------------------------


def conversation_id(attributes: Mapping[str, object]) -> str | None:
    """The conversation (session, thread) a span belongs to, or ``None``.

    Tried in order: ``gen_ai.conversation.id``, ``session.id`` (OpenInference, Strands),
    OpenLLMetry association properties (``thread_id``, ``session_id``, ``conversation_id``),
    ADK's ``gcp.vertex.agent.session_id``, CrewAI's run id (``crewai.execution_uuid``, on every
    span of CrewAI's own tracing), then LangGraph's ``thread_id`` inside OpenInference's
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


# --------------------------------------------------------------------------------------------
# Shapes: how one instrumentation encodes arguments and results.
# --------------------------------------------------------------------------------------------


class _Unwrapped:
    """A decoded value plus what its envelope revealed about the call. Read-only by convention.

    A plain slotted class rather than a frozen dataclass: shapes build one or two per tool span,
    and a frozen dataclass's ``__init__`` costs several times as much.
    """

    __slots__ = ("value", "call_id", "is_error")

    def __init__(
        self, value: object, call_id: str | None = None, is_error: bool | None = None
    ) -> None:
        self.value = value
        self.call_id = call_id
        self.is_error = is_error

    def __repr__(self) -> str:
        return (
            f"_Unwrapped(value={self.value!r}, call_id={self.call_id!r},"
            f" is_error={self.is_error!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Unwrapped):
            return NotImplemented
        return (self.value, self.call_id, self.is_error) == (
            other.value,
            other.call_id,
            other.is_error,
        )


ArgumentsShape = Callable[[object, Mapping[str, object]], _Unwrapped]
"""Decodes a raw arguments value; gets the span attributes for schema look-ups."""

ResultShape = Callable[[object], _Unwrapped]
"""Decodes a raw result value."""


def json_arguments(raw: object, attributes: Mapping[str, object]) -> _Unwrapped:
    """Arguments as a JSON string (GenAI semconv, Pydantic AI, Strands, ADK, CrewAI, OpenLIT)."""
    return _Unwrapped(decode_json(raw))


_ENVELOPE_KEYS: Final = frozenset({"args", "kwargs"})
_MCP_CALL_KEYS: Final = frozenset({"tool_name", "arguments"})
_MCP_RESULT_KEYS: Final = frozenset({"result", "is_error"})
_BOUND_CALL_KEYS: Final = frozenset({"args", "kwargs", "sanitize_inputs_outputs"})
"""The bound parameters of a wrapped ``(*args, **kwargs)`` method as OpenInference records them:
smolagents' ``Tool.__call__`` (with its own ``sanitize_inputs_outputs`` flag, which is no tool
argument), LlamaIndex's ``FunctionTool.call``/``acall``."""
_TOOL_OUTPUT_KEYS: Final = frozenset({"tool_name", "raw_input", "raw_output"})
"""Keys every LlamaIndex ``ToolOutput`` serialises (beside ``blocks``/``content``, ``is_error``)."""
_OUTPUT_ENVELOPE_KEYS: Final = frozenset({"output", "kwargs"})


def openllmetry_envelope_arguments(raw: object, attributes: Mapping[str, object]) -> _Unwrapped:
    """OpenLLMetry envelopes.

    * LangChain: ``{"input_str": "<python repr>", "tags": ..., "metadata": ...,
      "inputs": {<arguments>}, "kwargs": {"tool_call_id": ...}}``: ``inputs`` are the arguments
      (``input_str`` only when ``inputs`` is absent), the call id is ``kwargs.tool_call_id``.
    * ``@tool`` decorator: ``{"args": [...], "kwargs": {...}}``: keyword arguments when there
      are any, else the positional list (the parameter names are not recorded).
    * MCP (``opentelemetry-instrumentation-mcp``, client ``<tool>.tool`` spans):
      ``{"tool_name": "search", "arguments": {...}}``: the arguments (``null``: none, ``{}``).
      A ``@tool`` function with parameters of those names is recorded in the envelope above,
      so the two never meet.
    """
    value = decode_json(raw)
    if not isinstance(value, dict):
        return _Unwrapped(value)
    if value.keys() == _MCP_CALL_KEYS:
        arguments = value["arguments"]
        return _Unwrapped({} if arguments is None else arguments)
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
    * The bound parameters of the wrapped call method (:func:`_bound_call`): smolagents'
      ``{"args": [], "sanitize_inputs_outputs": true, "kwargs": {...}}``, LlamaIndex's
      ``{"kwargs": {...}}``: the keyword arguments, as the framework passes them to the tool.
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
        if "kwargs" in value:
            bound = _bound_call(value)
            if bound is not None:
                return _Unwrapped(bound)
        return _Unwrapped(value)
    if isinstance(value, str):
        parameter = _single_parameter(attributes)
        if parameter is not None:
            name, json_type = parameter
            return _Unwrapped({name: _coerce_scalar(value, json_type)})
    return _Unwrapped(value)


def _bound_call(value: dict[str, object]) -> object:
    """The arguments in a bound-call envelope (:data:`_BOUND_CALL_KEYS`), or ``None`` when
    ``value`` is no such envelope.

    The keyword arguments when there are any, or when there are no positional ones either
    (``{}``); else one positional dict (smolagents calls ``tool({...})`` with the arguments as
    one dict), else the positional list (the parameter names are not recorded). A tool whose
    only parameter is named ``kwargs`` is read as this envelope: the names cannot tell them apart.
    """
    kwargs = value.get("kwargs")
    args = value.get("args", [])
    if not isinstance(kwargs, dict) or not isinstance(args, list):
        return None
    if not value.keys() <= _BOUND_CALL_KEYS:
        return None
    if kwargs or not args:
        return kwargs
    if len(args) == 1 and isinstance(args[0], dict):
        return args[0]
    return args


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
    return _message_result(decode_json(raw))


def _message_result(value: object) -> _Unwrapped:
    """:func:`langchain_message_result` of a decoded value."""
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
        is_error = status in _ERROR_STATUS_VALUES
    return _Unwrapped(
        _join_text_blocks(decode_json(message["content"])),
        _call_id(message.get("tool_call_id")),
        is_error,
    )


def openinference_result(raw: object) -> _Unwrapped:
    """OpenInference ``output.value``: a LlamaIndex ``ToolOutput``, else as
    :func:`langchain_message_result`.

    LlamaIndex records the whole ``ToolOutput``: ``{"blocks": [{"text": ...}], "tool_name",
    "raw_input", "raw_output", "is_error"}``. The result is ``raw_output`` (what the tool
    returned; decoded like :func:`text_result`), else the text of ``blocks`` (``content`` in
    older releases); ``is_error`` says whether the call failed.
    """
    value = decode_json(raw)
    if isinstance(value, dict) and value.keys() >= _TOOL_OUTPUT_KEYS:
        result = value["raw_output"]
        if result is None:
            result = value.get("blocks", value.get("content"))
        is_error = value.get("is_error")
        return _Unwrapped(
            _join_text_blocks(decode_json(result)),
            None,
            is_error if isinstance(is_error, bool) else None,
        )
    return _message_result(value)


def openllmetry_tool_result(raw: object) -> _Unwrapped:
    """OpenLLMetry ``traceloop.entity.output`` of a tool span: the MCP instrumentation's
    ``{"result": <first text content>}`` (plus ``"is_error": true`` for an error result)
    unwrapped, anything else as :func:`langchain_message_result`."""
    value = decode_json(raw)
    if isinstance(value, dict) and "result" in value and value.keys() <= _MCP_RESULT_KEYS:
        is_error = value.get("is_error")
        return _Unwrapped(
            _join_text_blocks(decode_json(value["result"])),
            None,
            is_error if isinstance(is_error, bool) else None,
        )
    return _message_result(value)


def adk_result(raw: object) -> _Unwrapped:
    """Google ADK wraps a non-dict tool return as ``{"result": value}``; unwrap it."""
    value = decode_json(raw)
    if isinstance(value, dict) and len(value) == 1 and "result" in value:
        return _Unwrapped(_join_text_blocks(value["result"]))
    return _Unwrapped(_join_text_blocks(value))
