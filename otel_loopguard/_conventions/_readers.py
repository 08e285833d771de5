"""The public readers of tool and agent spans, built on the compiled tables
(:mod:`._dispatch`): every one starts with its table's gate, then its match; a tool-span reader
with :func:`_matched_tool` (the gate, the match and the tool test, written once)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._decoders import (
    _call_id,
    _conversation_id,
    _event_value,
    _Events,
    _first_present,
    _first_text,
    _flag,
    _join_text_blocks,
    decode_json,
    json_arguments,
    text_result,
)
from ._dispatch import _AGENTS, _TOOLS, _agent_gate_bits, _tool_gate_bits
from ._keys import (
    _CALL_ID_PLACEHOLDERS,
    _ERROR_STATUS_KEYS,
    _ERROR_STATUS_VALUES,
    _SUCCESS_STATUS_VALUES,
    ERROR_TYPE,
    EXCEPTION_EVENT,
)
from ._results import MISSING, SpanAgent, SpanToolCall
from ._tables import (
    ARGUMENTS_AT_START_CONVENTIONS,
    ToolConvention,
)

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
    matched = _matched_tool(name, attributes, events)
    if matched is None:
        return None
    convention, tool, events = matched
    return _read_tool_call(convention, tool, attributes, events, status_error)


def _matched_tool(
    name: str, attributes: Mapping[str, object], events: Sequence[tuple[str, Mapping[str, object]]]
) -> tuple[ToolConvention, str, _Events] | None:
    """The entry a span matches, the tool it names and its events (``()`` when not a
    sequence); ``None`` when it is not a tool span, or names no tool (or a skipped one). The
    gate, match and tool test every tool-span reader starts with."""
    bits = _tool_gate_bits(name, attributes)  # the types are checked once a gate is open
    if not bits:
        return None
    if (
        events.__class__ is not tuple
        and events.__class__ is not list
        and not isinstance(events, Sequence)
    ):
        events = ()
    convention = _TOOLS.match(bits, name, attributes, events)
    if convention is None:
        return None
    tool = _first_text(attributes, convention.tool_keys) or convention.tool_from_span_name(name)
    if tool is None or tool in convention.skip_tools:
        return None
    return convention, tool, events


def _read_tool_call(
    convention: ToolConvention,
    tool: str,
    attributes: Mapping[str, object],
    events: _Events,
    status_error: bool | None,
) -> SpanToolCall:
    """Read the call of a span ``convention`` matched, naming ``tool``."""
    arguments, argument_call_id = _read_arguments(convention, attributes, events)
    result, result_call_id, is_error = _read_outcome(convention, attributes, events, status_error)
    return SpanToolCall(
        tool,
        arguments,
        result,
        is_error,
        _read_call_id(convention, attributes) or argument_call_id or result_call_id,
        _first_text(attributes, convention.agent_id_keys),
        _first_text(attributes, convention.agent_name_keys),
        _conversation_id(attributes),
        convention.name,
    )


def _read_outcome(
    convention: ToolConvention,
    attributes: Mapping[str, object],
    events: _Events,
    status_error: bool | None,
) -> tuple[object, str | None, bool | None]:
    """The decoded result, the call id its encoding holds, and whether the call failed."""
    result, result_call_id, result_error = _read_result(convention, attributes, events)
    if convention.error_keys:
        flagged = _flag(attributes, convention.error_keys)
        if flagged is not None and result_error is not True:
            result_error = flagged
    return result, result_call_id, _is_error(attributes, events, status_error, result_error)


def _read_arguments(
    convention: ToolConvention, attributes: Mapping[str, object], events: _Events
) -> tuple[object, str | None]:
    """The decoded arguments (:data:`MISSING` when the span carries none) and the call id their
    encoding holds, if any."""
    raw_arguments = None
    for key in convention.argument_keys:  # _first_present, inline
        raw_arguments = attributes.get(key)
        if raw_arguments is not None:
            break
    if raw_arguments is None and convention.argument_event is not None:
        raw_arguments = _event_value(events, *convention.argument_event)
    if raw_arguments is None:
        return MISSING, None
    arguments_shape = convention.arguments_shape
    # json_arguments reveals nothing but the value: its decoding is applied directly rather
    # than through an _Unwrapped (the common case, and the cheaper one).
    if arguments_shape is json_arguments:
        return decode_json(raw_arguments), None
    unwrapped = arguments_shape(raw_arguments, attributes)
    return unwrapped.value, unwrapped.call_id


def _read_result(
    convention: ToolConvention, attributes: Mapping[str, object], events: _Events
) -> tuple[object, str | None, bool | None]:
    """The decoded result (``None`` when the span carries none), the call id and the error
    flag its encoding holds, if any."""
    raw_result = None
    for key in convention.result_keys:  # _first_present, inline
        raw_result = attributes.get(key)
        if raw_result is not None:
            break
    if raw_result is None and convention.result_event is not None:
        raw_result = _event_value(events, *convention.result_event)
    if raw_result is None:
        return None, None, None
    result_shape = convention.result_shape
    if result_shape is text_result:  # as json_arguments above
        result = decode_json(raw_result)
        if isinstance(result, list):  # _join_text_blocks leaves everything else as is
            result = _join_text_blocks(result)
        return result, None, None
    unwrapped = result_shape(raw_result)
    return unwrapped.value, unwrapped.call_id, unwrapped.is_error


def _read_call_id(convention: ToolConvention, attributes: Mapping[str, object]) -> str | None:
    """The first usable call id among the entry's ``call_id_keys``."""
    for key in convention.call_id_keys:
        value = attributes.get(key)
        if value.__class__ is str:  # _call_id(value), inline for the usual str
            if value and value not in _CALL_ID_PLACEHOLDERS:
                return value
        elif value is not None:
            call_id = _call_id(value)
            if call_id is not None:
                return call_id
    return None


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
    """Whether a tool span is decided at its start: the attributes seen by
    ``SpanProcessor.on_start`` already carry the arguments, and its convention is one of
    :data:`ARGUMENTS_AT_START_CONVENTIONS`.

    True for Pydantic AI (current and legacy), whose tool spans are started with their
    arguments, so detection (and a trip event on the still-open tool span) can run at start.
    False for every instrumentation that sets arguments later, for those whose tool spans are
    named after the tool (OpenInference: Agno, smolagents and CrewAI's event listener start
    them with the arguments too, but a name tells nothing before the attributes are read, so
    every entrance decides them at their end), and for non-tool spans.
    Same cost as rejecting a span in :func:`tool_call_from_span`. Never raises.
    """
    bits = _tool_gate_bits(name, attributes)
    if not bits:
        return False
    convention = _TOOLS.match(bits, name, attributes, ())
    if convention is None or convention.name not in ARGUMENTS_AT_START_CONVENTIONS:
        return False
    return _first_present(attributes, convention.argument_keys) is not None


def tool_call_at_start(name: str, attributes: Mapping[str, object]) -> SpanToolCall | None:
    """The tool call a starting span carries with its arguments, when it is decided at its
    start (:func:`arguments_available_at_start`): ``tool_call_from_span(name, attributes)``
    then, else ``None``. One gate and one match for both questions (the span processor's
    ``on_start`` asked them apart). Never raises."""
    matched = _matched_tool(name, attributes, ())
    if matched is None:
        return None
    convention, tool, _ = matched
    if (
        convention.name not in ARGUMENTS_AT_START_CONVENTIONS
        or _first_present(attributes, convention.argument_keys) is None
    ):
        return None
    return _read_tool_call(convention, tool, attributes, (), None)


def tool_outcome_from_span(
    name: str,
    attributes: Mapping[str, object],
    events: Sequence[tuple[str, Mapping[str, object]]] = (),
    status_error: bool | None = None,
) -> tuple[str, object, bool | None] | None:
    """The tool, result and failure of the call :func:`tool_call_from_span` reads from the same
    span, or ``None`` when it reads none: for a span whose call was read at its start
    (:func:`tool_call_at_start`), only the outcome is new at its end. The same gate, match and
    tool test; the arguments, call id, agent and conversation are not read. Never raises."""
    matched = _matched_tool(name, attributes, events)
    if matched is None:
        return None
    convention, tool, events = matched
    result, _, is_error = _read_outcome(convention, attributes, events, status_error)
    return tool, result, is_error


def agent_from_span(name: str, attributes: Mapping[str, object]) -> SpanAgent | None:
    """The agent a span marks the run of, or ``None`` when it is not an agent span.

    Recognises GenAI ``invoke_agent`` spans (Pydantic AI incl. legacy ``agent run``, Strands,
    Google ADK, OpenLLMetry LangGraph), OpenInference AGENT spans (named after the agent) and
    OpenLLMetry agent/workflow spans. Same cost and threading contract as
    :func:`tool_call_from_span`.
    """
    bits = _agent_gate_bits(name, attributes)
    if not bits:
        return None
    convention = _AGENTS.match(bits, name, attributes, ())
    if convention is None:
        return None
    return SpanAgent(
        agent_id=_first_text(attributes, convention.id_keys),
        agent_name=_first_text(attributes, convention.name_keys)
        or convention.name_from_span_name(name),
        conversation_id=_conversation_id(attributes),
    )
