"""A decision's fields as each place shows them, from one table.

A :class:`~otel_loopguard._policy.Decision` is shown in four shapes (:class:`Shape`): the
``loopguard.decision`` span event and span attributes (the span processor and the exporter), the
fields of ``serve``'s decision log line, the decision API's answer, and a trip-log line.
:data:`FIELDS` says, once per fact, how its value is read and under which name each shape shows
it (or that it does not); :func:`decision_attributes` builds any shape from it. A new
``Decision`` field is one row here.

What a decision does not hold comes from the caller, named in each shape the same way: the agent
(``agent``), the policy's mode (``mode``), the tool call id (``call_id``), the arguments preview
(``arguments``, :func:`arguments_text`), where the decision came from (``source``) and the trip
line's kind (``kind``). Pure: no I/O, no OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from ._calls import SIGNATURE_CHARS, bounded_id, canonical_arguments, canonical_json
from ._policy import Decision, arguments_preview
from .config import Mode, Policy
from .metrics._spec import NO_RULE

__all__ = [
    "ATTR_ACTION",
    "ATTR_ARGUMENTS",
    "ATTR_COUNT",
    "ATTR_LOOP_COST_USD",
    "ATTR_LOOP_TOKENS",
    "ATTR_MODE",
    "ATTR_PHASE",
    "ATTR_RULE",
    "ATTR_SIGNATURE",
    "ATTR_THRESHOLD",
    "ATTR_TOOL_CALL_ID",
    "ATTR_TOOL_NAME",
    "FIELDS",
    "Field",
    "Shape",
    "arguments_text",
    "decision_attributes",
    "log_fields_of_answer",
]

# Span event attribute keys (DESIGN §6), declared once.
ATTR_ACTION: Final = "loopguard.action"
ATTR_RULE: Final = "loopguard.rule"
ATTR_COUNT: Final = "loopguard.count"
ATTR_THRESHOLD: Final = "loopguard.threshold"
ATTR_SIGNATURE: Final = "loopguard.signature"
ATTR_MODE: Final = "loopguard.mode"
#: ``pre`` (before the call ran, or what the guard would have said then) or ``post`` (concluded
#: from the call's result: :class:`~otel_loopguard.Phase`).
ATTR_PHASE: Final = "loopguard.phase"
ATTR_ARGUMENTS: Final = "loopguard.arguments"
#: What the loop now running has used: its tokens, and its known cost in US dollars (only when
#: known: model turns reported, some priced; never with ``cost_in = "tokens"``).
ATTR_LOOP_TOKENS: Final = "loopguard.loop.tokens"
ATTR_LOOP_COST_USD: Final = "loopguard.loop.cost_usd"
ATTR_TOOL_NAME: Final = "gen_ai.tool.name"
ATTR_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"


class Shape(Enum):
    """Where a decision is shown."""

    #: ``loopguard.decision`` span event and span attributes (processor, exporter). A span
    #: attribute cannot be null: no rule is ``"none"``, an absent value is left out.
    SPAN = "span"
    #: ``serve``'s decision log line (text and JSON): session and agent as bounded ids.
    LOG = "log"
    #: The decision API's answer (``POST /v1/decisions/...``).
    API = "api"
    #: A trip-log line (:meth:`otel_loopguard._triplog.TripLog.write`'s arguments): its
    #: ``action`` is what was detected, before the mode softened it.
    TRIP = "trip"


@dataclass(frozen=True, slots=True)
class Field:
    """One fact of a decision: its own name (``key``), how to read it from the decision
    (``None``: the caller gives it, as the keyword argument ``key`` of
    :func:`decision_attributes`) and its name in each shape that shows it; ``known_only``:
    every shape leaves it out when it is unknown (``None``), rather than showing a null."""

    key: str
    read: Callable[[Decision], object] | None
    span: str | None = None
    log: str | None = None
    api: str | None = None
    trip: str | None = None
    known_only: bool = False

    def name(self, shape: Shape) -> str | None:
        """The name of this fact in ``shape``, or ``None`` when that shape does not show it."""
        if shape is Shape.SPAN:
            return self.span
        if shape is Shape.LOG:
            return self.log
        if shape is Shape.API:
            return self.api
        return self.trip


def _rule(decision: Decision) -> str | None:
    return decision.rule.value if decision.rule is not None else None


#: Every fact of a shown decision, in the order the shapes list them.
FIELDS: Final[tuple[Field, ...]] = (
    Field("source", None, log="source"),
    Field("session", lambda d: d.session, log="session", api="session", trip="session"),
    Field("agent", None, log="agent", trip="agent"),
    Field("tool", lambda d: d.tool, span=ATTR_TOOL_NAME, log="tool", api="tool", trip="tool"),
    Field("action", lambda d: d.action.value, log="action", api="action"),
    Field(
        "detected",
        lambda d: d.detected.value,
        span=ATTR_ACTION,
        log="detected",
        api="detected",
        trip="action",
    ),
    Field("blocks", lambda d: d.blocks, api="blocks"),
    Field("message", lambda d: d.message, api="message"),
    Field("rule", _rule, span=ATTR_RULE, log="rule", api="rule", trip="rule"),
    Field("count", lambda d: d.count, span=ATTR_COUNT, log="count", api="count", trip="count"),
    Field(
        "threshold",
        lambda d: d.threshold,
        span=ATTR_THRESHOLD,
        log="threshold",
        api="threshold",
        trip="threshold",
    ),
    Field(
        "signature",
        lambda d: d.signature[:SIGNATURE_CHARS],
        span=ATTR_SIGNATURE,
        log="signature",
        api="signature",
        trip="signature",
    ),
    Field("hash_prefix", lambda d: d.hash_prefix, api="hash_prefix"),
    Field("repeated", lambda d: d.repeated, api="repeated"),
    Field("mode", None, span=ATTR_MODE, trip="mode"),
    Field("phase", lambda d: d.phase.value, span=ATTR_PHASE, log="phase", api="phase"),
    Field("call_id", None, span=ATTR_TOOL_CALL_ID),
    Field("arguments", None, span=ATTR_ARGUMENTS, trip="arguments"),
    Field("kind", None, trip="kind"),
    Field(
        "loop_tokens",
        lambda d: d.loop_tokens,
        span=ATTR_LOOP_TOKENS,
        log="loop_tokens",
        api="loop_tokens",
        trip="loop_tokens",
        known_only=True,
    ),
    Field(
        "loop_cost_usd",
        lambda d: d.loop_cost_usd,
        span=ATTR_LOOP_COST_USD,
        log="loop_cost_usd",
        api="loop_cost_usd",
        trip="loop_cost_usd",
        known_only=True,
    ),
)

#: Facts of a decision the caller may name instead (a first allow carries neither).
_OVERRIDES: Final = frozenset({"session", "tool"})

# Per shape: (name in the shape, fact) for each fact it shows, in table order.
_ROWS: Final = {
    shape: tuple((name, row) for row in FIELDS if (name := row.name(shape)) is not None)
    for shape in Shape
}


def decision_attributes(
    decision: Decision,
    shape: Shape,
    *,
    session: str | None = None,
    tool: str | None = None,
    agent: str | None = None,
    mode: Mode | None = None,
    call_id: str | None = None,
    arguments: str | None = None,
    source: str | None = None,
    kind: str | None = None,
) -> dict[str, object]:
    """``decision`` as ``shape`` shows it (:data:`FIELDS`).

    ``session``/``tool``: as the caller named them, instead of the decision's own (a first
    allow carries none). The other keywords are what a decision does not hold; a shape shows
    each one it lists (``None`` as null, or left out of a span).
    """
    given: dict[str, object] = {
        "session": session,
        "tool": tool,
        "agent": agent,
        "mode": None if mode is None else mode.value,
        "call_id": call_id or None,
        "arguments": arguments,
        "source": source,
        "kind": kind,
    }
    out: dict[str, object] = {}
    for name, row in _ROWS[shape]:
        value = given.get(row.key)
        if row.read is not None and (value is None or row.key not in _OVERRIDES):
            value = row.read(decision)
        if value is not None or not row.known_only:
            out[name] = value
    if shape is Shape.SPAN:
        return _span_shaped(out)
    if shape is Shape.LOG:
        return _log_shaped(out)
    return out


def _span_shaped(out: dict[str, object]) -> dict[str, object]:
    if out[ATTR_RULE] is None:
        out[ATTR_RULE] = NO_RULE
    return {name: value for name, value in out.items() if value is not None}


def _log_shaped(out: dict[str, object]) -> dict[str, object]:
    for name in ("session", "agent"):
        value = out[name]
        if isinstance(value, str):
            out[name] = bounded_id(value)
    out["signature"] = out["signature"] or None
    return out


def log_fields_of_answer(answer: Mapping[str, object], agent: str | None) -> dict[str, object]:
    """The log line's fields of a decision from the decision API's answer (its shape
    :attr:`Shape.API`) and the request's ``agent``: each fact both shapes show, renamed."""
    given: dict[str, object] = {"source": "api", "agent": agent}
    out: dict[str, object] = {}
    for name, row in _ROWS[Shape.LOG]:
        value = answer.get(row.api) if row.api is not None else given.get(row.key)
        if value is not None or not row.known_only:
            out[name] = value
    return _log_shaped(out)


def arguments_text(arguments: object, policy: Policy) -> str:
    """A call's arguments as a decision shows them: canonical JSON (the policy's ignored
    arguments left out), cut to its ``arguments_preview_chars``."""
    canonical = canonical_json(canonical_arguments(arguments, policy.ignored_args))
    return arguments_preview(canonical, policy.arguments_preview_chars)
