"""The tables compiled for the hot path, and the public readers built on them.

At import, each table is compiled into a :class:`_Dispatch`: the cheap first condition of every
entry (its *gate*: an attribute value, a span name or a span-name prefix) is indexed by attribute
key, value and name, so one pass over a handful of keys says which gates a span passes, and only
the entries behind those gates are then tested, in table order, with their remaining conditions
compiled to small functions. The result is the same as testing every entry's :class:`Condition`
in order; ``tests/test_conventions.py`` checks that against the table. The gate is one function,
:meth:`_Dispatch.gate`, compiled per table: every reader calls it first, and
:func:`may_be_tool_span` is the tool table's gate alone, for callers that skip a span before
gathering what :func:`tool_call_from_span` needs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar

from ._decoders import (
    _call_id,
    _conversation_id,
    _event_value,
    _Events,
    _first_present,
    _first_text,
    _flag,
    _is_mapping,
    _is_str,
    _join_text_blocks,
    decode_json,
    json_arguments,
    text_result,
)
from ._keys import (
    _CALL_ID_PLACEHOLDERS,
    _ERROR_STATUS_KEYS,
    _ERROR_STATUS_VALUES,
    _SUCCESS_STATUS_VALUES,
    ERROR_TYPE,
    EXCEPTION_EVENT,
    GEN_AI_AGENT_ID,
    GEN_AI_AGENT_NAME,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_SYSTEM,
    GEN_AI_USAGE_CACHE_READ_TOKENS,
    GEN_AI_USAGE_CACHE_WRITE_TOKENS,
    GEN_AI_USAGE_COST_AMOUNT,
    GEN_AI_USAGE_COST_CURRENCY,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    OPENINFERENCE_AGENT_NAME,
    OPENINFERENCE_LLM_KIND,
    OPENINFERENCE_MODEL_NAME,
    OPENINFERENCE_PROVIDER,
    OPENINFERENCE_SPAN_KIND,
    OPENINFERENCE_SYSTEM,
    OPENINFERENCE_TOKENS_CACHE_READ,
    OPENINFERENCE_TOKENS_CACHE_WRITE,
    OPENINFERENCE_TOKENS_COMPLETION,
    OPENINFERENCE_TOKENS_PROMPT,
    TRACELOOP_SPAN_KIND,
    USAGE_AGGREGATE_KINDS,
    USAGE_AGGREGATE_OPERATIONS,
)
from ._results import MISSING, SpanAgent, SpanModelCall, SpanToolCall
from ._tables import (
    AGENT_CONVENTIONS,
    ARGUMENTS_AT_START_CONVENTIONS,
    TOOL_CONVENTIONS,
    AgentConvention,
    Condition,
    On,
    ToolConvention,
)

_Check = Callable[[str, Mapping[str, object], _Events], bool]
"""A compiled :meth:`Condition.holds`: same arguments, same answer."""

_Convention = TypeVar("_Convention", ToolConvention, AgentConvention)
_Answer = TypeVar("_Answer")
_Gate = Callable[[str, Mapping[str, object]], _Answer | Literal[False]]
"""A table's gate (:meth:`_Dispatch.gate`): ``False``, or what it was given to answer on an open
gate."""


def _compile_check(condition: Condition) -> _Check:
    """A function answering exactly as ``condition.holds``, without its dispatch on ``on``."""
    keys = condition.keys
    if condition.on is On.ATTRIBUTE:
        return _compile_attribute_check(keys, condition.values)
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


def _compile_attribute_check(keys: tuple[str, ...], values: frozenset[str] | None) -> _Check:
    """:func:`_compile_check` of an ``On.ATTRIBUTE`` condition: one key or several, with or
    without values."""
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

    1. :meth:`gate`: whether some gate condition (the first condition of some entry) opens,
       found with one name lookup (:attr:`name_bits`), one ``startswith`` (:attr:`prefixes`)
       and one ``get`` per gate attribute key (:attr:`attribute_gates`). None: not a span of
       this table, the common case. Else :meth:`gate_bits`: one bit per gate the span passes.
    2. :meth:`match`: the entries whose gate-condition bits are all set, in table order
       (memoised per bit set), are tested with their remaining conditions, compiled to
       "steps": an attribute test run inline, or a small function; the first entry that passes
       them all is the answer.

    As before compiling, an attribute gate only opens on a plain ``str`` value; a ``str``
    subclass (an enum member) satisfies the condition once another gate has opened.
    """

    __slots__ = (
        "attribute_gates",
        "name_bits",
        "prefixes",
        "prefix_gates",
        "_plans",
        "_steps_by_bits",
    )

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

        self.attribute_gates: tuple[tuple[str, Mapping[str, int]], ...] = tuple(
            by_attribute.items()
        )
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
        no ``str`` or ``attributes`` no mapping. Called only once :meth:`gate` has opened (the
        common "no gate" case never gets here)."""
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

    def gate(self, opened: Callable[[str, Mapping[str, object]], _Answer]) -> _Gate[_Answer]:
        """This table's gate, the one function every reader calls first: ``gate(opened)(name,
        attributes)`` is ``opened(name, attributes)`` when the span passes the gate (the first
        condition) of some entry, else ``False``: no entry can match it, whatever its events and
        status. Written once here; each reader binds what it needs on an open gate
        (:meth:`gate_bits`, or the type checks of :func:`may_be_tool_span`). Never raises."""
        name_bits, prefixes, attribute_gates = self.name_bits, self.prefixes, self.attribute_gates
        gate_bits = self.gate_bits

        def passes_gate(name: str, attributes: Mapping[str, object]) -> _Answer | Literal[False]:
            try:
                if not (name in name_bits or name.startswith(prefixes)):
                    for key, bits_by_value in attribute_gates:
                        # Only a plain str opens a gate; the class is checked on a hit only.
                        if (
                            attributes.get(key) in bits_by_value
                            and attributes.get(key).__class__ is str
                        ):
                            break
                    else:
                        return False  # no gate open: the common case
            except AttributeError:  # a name that is no str, attributes that are no mapping
                return False
            except TypeError:  # an unhashable name or value: the general test
                if not gate_bits(name, attributes):
                    return False
            return opened(name, attributes)

        return passes_gate

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
                if value is not None and (
                    values is None or (isinstance(value, str) and value in values)
                ):
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
_tool_gate_bits: Final = _TOOLS.gate(_TOOLS.gate_bits)
_agent_gate_bits: Final = _AGENTS.gate(_AGENTS.gate_bits)


def _str_name_and_mapping(name: str, attributes: Mapping[str, object]) -> bool:
    """On an open gate: whether the types are those :meth:`_Dispatch.gate_bits` reads."""
    return (attributes.__class__ is dict or isinstance(attributes, Mapping)) and (
        name.__class__ is str or isinstance(name, str)
    )


may_be_tool_span: Final[Callable[[str, Mapping[str, object]], bool]] = _TOOLS.gate(
    _str_name_and_mapping
)
"""``may_be_tool_span(name, attributes)``: whether a span passes the gate of some
:data:`TOOL_CONVENTIONS` entry (an attribute value, a span name or a span-name prefix), derived
from the table here and nowhere else. ``False``: :func:`tool_call_from_span` returns ``None`` for
this span whatever its events and status, so a caller (the span processor's ``on_end``) can skip
it before gathering them. ``True``: it may return a call. Same cost as rejecting a span in
:func:`tool_call_from_span`; any thread; never raises."""


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
    bits = _tool_gate_bits(name, attributes)
    if not bits:
        return None
    convention = _TOOLS.match(bits, name, attributes, ())
    if (
        convention is None
        or convention.name not in ARGUMENTS_AT_START_CONVENTIONS
        or _first_present(attributes, convention.argument_keys) is None
    ):
        return None
    return _read_tool_call(convention, name, attributes, (), None)


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
    bits = _tool_gate_bits(name, attributes)
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


# -- model calls' usage ------------------------------------------------------------------------
# A model-call span is one that carries token counts of its own call: GenAI semantic-conventions
# usage (gen_ai.usage.input_tokens / output_tokens, or the older prompt_tokens /
# completion_tokens) on a span that is not an agent, workflow or tool span (Strands' and the
# Vercel AI SDK's agent-level spans sum their model calls' usage, so reading them would count
# every token twice), or an OpenInference LLM span with llm.token_count.*.

_INPUT, _PROMPT = GEN_AI_USAGE_INPUT_TOKENS
_OUTPUT, _COMPLETION = GEN_AI_USAGE_OUTPUT_TOKENS
_WHOLE: Final = re.compile(r"[0-9]{1,12}")
#: The attributes of which one marks a span that may be a model call (``may_be_model_span``
#: tests them by hand, for speed; serve's protobuf gate keeps a span that carries one).
MODEL_SPAN_KEYS: Final = (
    _INPUT,
    _OUTPUT,
    OPENINFERENCE_TOKENS_PROMPT,
    _PROMPT,
    OPENINFERENCE_TOKENS_COMPLETION,
)


def may_be_model_span(attributes: Mapping[str, object]) -> bool:
    """Whether a span that is no tool span may be a model call (it carries one of
    :data:`MODEL_SPAN_KEYS`): a few dict lookups, for every span the application ends."""
    return (
        _INPUT in attributes
        or _OUTPUT in attributes
        or OPENINFERENCE_TOKENS_PROMPT in attributes
        or _PROMPT in attributes
        or OPENINFERENCE_TOKENS_COMPLETION in attributes
    )


def _count(attributes: Mapping[str, object], keys: Sequence[str]) -> object:
    """The first of ``keys`` present, as a whole number when it reads as one (OTLP JSON sends
    integers as text), else the raw value; 0 when none is present."""
    for key in keys:
        value = attributes.get(key)
        if value is None:
            continue
        if isinstance(value, str) and _WHOLE.fullmatch(value.strip()):
            return int(value)
        return value
    return 0


def _cost(attributes: Mapping[str, object]) -> object:
    amount = attributes.get(GEN_AI_USAGE_COST_AMOUNT)
    if amount is None:
        return None
    currency = attributes.get(GEN_AI_USAGE_COST_CURRENCY)
    if currency is not None and str(currency).strip().upper() != "USD":
        return None  # another currency: not a figure in dollars; the tokens are priced instead
    if isinstance(amount, str):
        try:
            return float(amount)
        except ValueError:
            return amount
    return amount


def model_call_from_span(name: str, attributes: Mapping[str, object]) -> SpanModelCall | None:
    """The model call a span reports with its usage, or ``None`` (not a model call, or a span
    that sums its children's usage). Never raises."""
    try:
        if not _is_mapping(attributes) or not may_be_model_span(attributes):
            return None
        kind = attributes.get(OPENINFERENCE_SPAN_KIND)
        if kind == OPENINFERENCE_LLM_KIND and (
            OPENINFERENCE_TOKENS_PROMPT in attributes
            or OPENINFERENCE_TOKENS_COMPLETION in attributes
        ):
            return SpanModelCall(
                _first_text(attributes, (OPENINFERENCE_MODEL_NAME, GEN_AI_RESPONSE_MODEL)),
                _first_text(
                    attributes, (OPENINFERENCE_PROVIDER, OPENINFERENCE_SYSTEM, GEN_AI_SYSTEM)
                ),
                _count(attributes, (OPENINFERENCE_TOKENS_PROMPT,)),
                _count(attributes, (OPENINFERENCE_TOKENS_COMPLETION,)),
                _count(attributes, (OPENINFERENCE_TOKENS_CACHE_READ,)),
                _count(attributes, (OPENINFERENCE_TOKENS_CACHE_WRITE,)),
                _cost(attributes),
                _first_text(attributes, (GEN_AI_AGENT_ID,)),
                _first_text(attributes, (GEN_AI_AGENT_NAME, OPENINFERENCE_AGENT_NAME)),
                _conversation_id(attributes),
                "openinference",
            )
        if kind in USAGE_AGGREGATE_KINDS or attributes.get(TRACELOOP_SPAN_KIND) in (
            USAGE_AGGREGATE_KINDS
        ):
            return None
        if attributes.get(GEN_AI_OPERATION_NAME) in USAGE_AGGREGATE_OPERATIONS:
            return None
        if not (_INPUT in attributes or _OUTPUT in attributes or _PROMPT in attributes):
            return None
        return SpanModelCall(
            _first_text(attributes, (GEN_AI_RESPONSE_MODEL, GEN_AI_REQUEST_MODEL)),
            _first_text(attributes, (GEN_AI_PROVIDER_NAME, GEN_AI_SYSTEM)),
            _count(attributes, GEN_AI_USAGE_INPUT_TOKENS),
            _count(attributes, GEN_AI_USAGE_OUTPUT_TOKENS),
            _count(attributes, GEN_AI_USAGE_CACHE_READ_TOKENS),
            _count(attributes, GEN_AI_USAGE_CACHE_WRITE_TOKENS),
            _cost(attributes),
            _first_text(attributes, (GEN_AI_AGENT_ID,)),
            _first_text(attributes, (GEN_AI_AGENT_NAME,)),
            _conversation_id(attributes),
            "genai",
        )
    except Exception:  # the package's contract: never raise on span data
        return None
