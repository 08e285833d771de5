"""What a replay input format produces: the replay events, :class:`BadRecord`, and the
decoder contract (:class:`RecordDecoder`, :class:`InputFormat`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from .._otlp_json import BadSpan
from .._trace_events import CallDecidedAtStart, CallObserved, ModelUsed, RunStarted

#: Calls started but not yet finished, remembered for their outcome (oldest forgotten first).
MAX_PENDING_CALLS: Final = 100_000


class BadRecord(BadSpan):
    """A parsed record that its format cannot use; the message is the reason shown to the user.
    (A :class:`~otel_loopguard._otlp_json.BadSpan` from decoding a span is reported the same way.)

    ``events`` are still replayed: what a record's usable part gave (an OTLP line with one bad
    span among many keeps the others), or traces a full buffer had to replay early.
    """

    def __init__(self, message: str, events: Iterable[Event] = ()) -> None:
        super().__init__(message)
        self.events: tuple[Event, ...] = tuple(events)


# --------------------------------------------------------------------------------------------
# Events


@dataclass(frozen=True, slots=True)
class CallStarted:
    """A tool call about to run. ``token`` pairs it with its :class:`CallFinished` within one
    decoder; ``timestamp`` is seconds since the epoch when the record says."""

    token: int
    session: str
    agent: str | None
    tool: str
    arguments: object
    call_id: str | None = None
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class CallFinished:
    """The recorded outcome of the started call with the same ``token``.

    ``error`` is ``None`` when the record does not say whether the call failed (passed on as
    such: ``after_tool`` treats it as not failed, and with no ``result`` the outcome is unknown).
    """

    token: int
    error: bool | None
    result: object = None
    duration_seconds: float | None = None
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class UserPrompt:
    """A real user message in ``session`` (a new progress epoch)."""

    session: str
    agent: str | None
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class ModelSkipped:
    """A model turn whose usage did not read (``reason``: the bad field): counted by
    ``LoopGuard.model_call_skipped``, as a span's bad usage is."""

    reason: str
    timestamp: float | None = None


Event = (
    CallStarted
    | CallFinished
    | UserPrompt
    | CallDecidedAtStart
    | CallObserved
    | RunStarted
    | ModelUsed
    | ModelSkipped
)


# --------------------------------------------------------------------------------------------
# Decoders


class RecordDecoder(Protocol):
    """Turns the records of one file, in order, into events. One instance per file."""

    def decode(self, record: object) -> Iterable[Event]:
        """Return the events of one record; raise :class:`BadRecord` for a record it rejects."""
        ...

    def finish(self) -> Iterable[Event]:
        """Return events still owed at the end of the file (most formats owe none)."""
        ...


@dataclass(frozen=True, slots=True)
class InputFormat:
    """One input format: ``claims`` says whether a parsed record is surely of this format
    (used on a file's first records, in registry order); ``decoder`` makes a decoder per file."""

    name: str
    description: str
    claims: Callable[[object], bool]
    decoder: Callable[..., RecordDecoder]
    #: The decoder reads recorded traces and takes ``key_by`` (trace or conversation).
    traces: bool = False


def _get(record: Mapping[str, Any], name: str) -> Any:
    if name not in record:
        raise BadRecord(f"missing field {name!r}")
    return record[name]
