"""The tables compiled for the hot path (the readers built on them are in :mod:`._readers`).

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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar

from ._decoders import (
    _Events,
    _is_mapping,
    _is_str,
)
from ._tables import (
    AGENT_CONVENTIONS,
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
