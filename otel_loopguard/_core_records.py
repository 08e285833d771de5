"""What the guard's core (:mod:`._core`) carries for one call between its steps: the call
keyed (:class:`Call`), a call reported only after it ran (:class:`Ran`), what a rescue reserved
(:class:`Rescue`), how a reported call ended (:data:`Outcome`), what a counted call moved into
loop spend (:data:`Moved`); and the attempt written to the session's trail for the advisor."""

from __future__ import annotations

from typing import Any

from ._asks import Reserved
from ._calls import canonical_arguments, canonical_json
from ._engine import Pending, SessionState
from ._record import Record
from ._spend import Spent
from ._trail import MAX_TRAIL_OUTPUT_CHARS, Trail

__all__ = [
    "Call",
    "LoopAndRun",
    "Moved",
    "Outcome",
    "Ran",
    "Rescue",
    "awaits",
    "cut_utf8",
    "ended",
    "outputtext_of",
    "trail_attempt",
]


def cut_utf8(data: bytes, limit: int) -> str:
    """The first ``limit`` characters of UTF-8 ``data``, decoding no more than needed."""
    return data[: limit * 4].decode("utf-8", "ignore")[:limit]


def outputtext_of(result: object) -> str | None:
    """A call's result as text for the advisor's question, cut (``None`` when there is none).
    Only a guard that keeps trails pays for this."""
    if result is None:
        return None
    if type(result) is str:
        return result[:MAX_TRAIL_OUTPUT_CHARS]
    if isinstance(result, (bytes, bytearray)):
        return cut_utf8(bytes(result[: MAX_TRAIL_OUTPUT_CHARS * 4]), MAX_TRAIL_OUTPUT_CHARS)
    return cut_utf8(canonical_json(canonical_arguments(result)), MAX_TRAIL_OUTPUT_CHARS)


def ended(error: bool | None) -> str:
    """How a call that ran ended, as the advisor's question says it."""
    return "error" if error is True else "ok" if error is False else "ran"


class Ran(Record):
    """A call reported only after it ran: how ``after_tool`` classified and keyed it (so nothing
    is computed twice) and how it ended."""

    __slots__ = ("mutating", "canonical", "key", "outcome", "error", "duration_seconds", "output")
    mutating: bool
    canonical: bytes
    key: str
    outcome: str | None
    error: bool | None
    duration_seconds: float | None
    output: str | None  # cut result text, only when the guard keeps trails

    def __init__(
        self,
        mutating: bool,
        canonical: bytes,
        key: str,
        outcome: str | None,
        error: bool | None,
        duration_seconds: float | None,
        output: str | None = None,
    ) -> None:
        self.mutating = mutating
        self.canonical = canonical
        self.key = key
        self.outcome = outcome
        self.error = error
        self.duration_seconds = duration_seconds
        self.output = output


class Call(Record):
    """One attempt, keyed: the tool's name, canonical arguments, args key, and the bounded
    session and agent ids."""

    __slots__ = ("name", "canonical", "key", "sid", "aid", "loop", "run")
    name: str
    canonical: bytes
    key: str
    sid: str
    aid: str | None
    loop: Spent | None  # what the loop now running has used, when model turns were
    run: Spent | None  # what the run has used, under a run budget

    def __init__(
        self,
        name: str,
        canonical: bytes,
        key: str,
        sid: str,
        aid: str | None,
        loop: Spent | None = None,
        run: Spent | None = None,
    ) -> None:
        self.name = name
        self.canonical = canonical
        self.key = key
        self.sid = sid
        self.aid = aid
        self.loop = loop
        self.run = run


class Rescue(Record):
    """What counting an attempt at rescue reserved under the lock: the cached advice, the
    rescue metric's outcome, and the ask to make (with its question's context) if any."""

    __slots__ = ("advice", "outcome", "ask", "context", "scope", "store_key")
    advice: str | None
    outcome: str | None
    ask: Reserved | None
    context: dict[str, Any] | None
    scope: str | None  # the session's memory scope, when it has its own
    store_key: object

    def __init__(
        self,
        advice: str | None,
        outcome: str | None,
        ask: Reserved | None,
        context: dict[str, Any] | None,
        scope: str | None = None,
        store_key: object = None,
    ) -> None:
        self.advice = advice
        self.outcome = outcome
        self.ask = ask
        self.context = context
        self.scope = scope
        self.store_key = store_key


#: What a counted call moved into loop spend (tokens, USD) and what it avoided, refused after
#: a stop (tokens, USD: an estimate); what the loop and the run have spent (either ``None``).
Moved = tuple[int, float, int, float]
LoopAndRun = tuple[Spent | None, Spent | None]

#: How a reported call ended (``after_tool``'s report): (call id as text, outcome key, error,
#: cut output, duration seconds). A tuple, not an object: built for every report.
Outcome = tuple[str | None, str | None, bool | None, str | None, float | None]


def awaits(pending: Pending, outcome: str | None) -> bool:
    """Whether a reported call still lacks its outcome (a blocked call never has one)."""
    return outcome is None and not pending.blocked and not pending.mutating


def trail_attempt(
    state: SessionState,
    name: str,
    key: str,
    trail_arguments: str,
    refused: bool,
    ran: Ran | None,
) -> None:
    """Under the lock: the attempt in the session's trail (kept for the advisor)."""
    trail = state.trail
    if trail is None:
        trail = state.trail = Trail()
    if ran is None:
        trail.add(name, trail_arguments, key, "refused" if refused else None, None)
    else:
        trail.add(name, trail_arguments, key, ended(ran.error), ran.output)
