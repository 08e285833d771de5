"""Replay recorded tool calls through the guard and report what would have tripped.

Input is JSON lines. Each file is read by one *input format*, chosen by sniffing its first records
(or forced by name). A format turns one parsed JSON record into zero or more replay events:

- :class:`CallStarted`: a tool call about to run, fed to ``LoopGuard.before_tool``;
- :class:`CallFinished`: the recorded outcome of a started call, fed to ``LoopGuard.after_tool``;
- :class:`UserPrompt`: a real user message, fed to ``LoopGuard.user_message``;
- :class:`CallDecidedAtStart`: a tool span whose arguments were there when it started (Pydantic
  AI): decided as the span processor decides at ``on_start`` (``LoopGuard.decide_at_span_start``);
- :class:`CallObserved`: a tool span at its end, fed to ``LoopGuard.after_tool`` only, as the span
  processor does at ``on_end``: it counts the call after the fact, or only adds the outcome of a
  call decided at its start.

The last two, the span decoding and the trace buffer live in :mod:`otel_loopguard.traces`,
shared with ``serve``; they are importable from here as before.

Formats live in a registry (:data:`FORMATS`, :func:`register_format`); each is a sniffing
predicate plus a decoder factory. Built in: Claude Code sessions, tool-call transcripts, OTLP JSON
lines (the Collector's ``file`` exporter) and span dumps (the fixtures' span JSON lines).

Recorded traces go through the same conventions, session keys and guard calls as the in-process
:class:`~otel_loopguard.processor.LoopGuardSpanProcessor`, so a replay gives the decisions the
processor gave (see :class:`TraceBuffer` for how a trace is put back in time order).

Bad input never stops a replay: an unparsable line, or a record a decoder rejects, is reported as
``FILE:LINE: reason`` and counted. :func:`run_replay` returns exit status 0 when every line was
read, 1 when some were bad or a file could not be read; usage errors (a missing file, a bad
policy) are raised as :class:`UsageError` before anything is replayed.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, Protocol, TextIO, Union

import orjson

from .spans import KeyBy

from .traces import (
    MAX_BUFFERED_SPANS,
    MAX_SPAN_PROBLEMS,
    MAX_VALUE_DEPTH,
    OTLP_SIGNALS,
    START_NAME_PREFIXES,
    BadSpan,
    CallDecidedAtStart,
    CallObserved,
    RunStarted,
    STATUS_CODE_ERROR,
    RecordedSpan,
    TraceBuffer,
    _id_text,
    _nanos,
    _parent_id,
    feed,
    otlp_json_spans,
)
from .traces import short_value as _short

if TYPE_CHECKING:
    from otel_loopguard.config import Mode, Policy
    from otel_loopguard.guard import LoopGuard
    from otel_loopguard.policy import Decision

__all__ = [
    "BadRecord",
    "CallDecidedAtStart",
    "CallFinished",
    "CallObserved",
    "CallStarted",
    "ClaudeCodeDecoder",
    "Event",
    "FORMATS",
    "InputFormat",
    "LARGE_INPUT_BYTES",
    "LARGE_INPUT_LINES",
    "ListedDecision",
    "MAX_BUFFERED_SPANS",
    "MAX_LISTED_DECISIONS",
    "MAX_REPORTED_BAD_LINES",
    "MAX_VALUE_DEPTH",
    "OtlpJsonDecoder",
    "RecordDecoder",
    "RecordedSpan",
    "ReplayClock",
    "Replayer",
    "START_NAME_PREFIXES",
    "SessionReport",
    "SpanDumpDecoder",
    "TraceBuffer",
    "TranscriptDecoder",
    "UsageError",
    "UserPrompt",
    "detect_format",
    "format_by_name",
    "format_session",
    "format_totals",
    "register_format",
    "run_replay",
]

#: Input above this many bytes (regular files) shows a progress bar when stderr is a terminal.
LARGE_INPUT_BYTES: Final = 5 * 1024 * 1024
#: Input above this many lines (e.g. a pipe of unknown size) shows a progress line likewise.
LARGE_INPUT_LINES: Final = 50_000
#: Bad lines printed per file; the rest are only counted.
MAX_REPORTED_BAD_LINES: Final = 20
#: Non-allow decisions kept and listed per session; the rest are only counted.
MAX_LISTED_DECISIONS: Final = 1_000
#: Calls started but not yet finished, remembered for their outcome (oldest forgotten first).
MAX_PENDING_CALLS: Final = 100_000
#: Records looked at to pick a file's format.
SNIFF_RECORDS: Final = 32

_PROGRESS_INTERVAL_SECONDS: Final = 0.2


class UsageError(Exception):
    """The command line cannot be carried out (missing file, bad policy); exit status 2."""


class BadRecord(BadSpan):
    """A parsed record that its format cannot use; the message is the reason shown to the user.
    (A :class:`~otel_loopguard.traces.BadSpan` from decoding a span is reported the same way.)

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


Event = Union[CallStarted, CallFinished, UserPrompt, CallDecidedAtStart, CallObserved,
              RunStarted]


# --------------------------------------------------------------------------------------------
# Format registry


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


def _session_text(value: object, name: str) -> str:
    # Integers are accepted because some exporters write numeric ids; booleans are a mistake.
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise BadRecord(f"{name!r} must be a non-empty string, got {_short(value)}")


def _optional_text(record: Mapping[str, Any], name: str) -> str | None:
    value = record.get(name)
    if value is None:
        return None
    return _session_text(value, name)


def _optional_seconds(record: Mapping[str, Any], name: str) -> float | None:
    value = record.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRecord(f"{name!r} must be a number of seconds, got {_short(value)}")
    if not math.isfinite(value) or value < 0:
        raise BadRecord(f"{name!r} must be a finite number >= 0, got {_short(value)}")
    return float(value)


def _timestamp(value: object) -> float | None:
    """Seconds since the epoch from a number or an ISO-8601 string; ``None`` when absent or
    unreadable (timestamps only drive the replay clock, so a bad one is not worth a bad line)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str) or not value:
        return None
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        # Python 3.10 takes only 3 or 6 fractional digits; cut or pad to 6 and retry once.
        head, dot, rest = text.partition(".")
        if not dot:
            return None
        digits = len(rest) - len(rest.lstrip("0123456789"))
        try:
            parsed = datetime.fromisoformat(f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}")
        except ValueError:
            return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


class TranscriptDecoder:
    """Tool-call transcripts, one record per call or user message::

        {"session": "s1", "tool": "grep", "arguments": {"q": "x"}, "error": false,
         "result": "...", "call_id": "c1", "agent": "a", "duration_seconds": 0.4,
         "timestamp": 1767225600.0}
        {"type": "user_message", "session": "s1"}

    ``session``, ``tool`` and ``arguments`` are required; ``error`` is ``true``, ``false`` or
    ``null`` (unknown; also when absent); ``timestamp`` is epoch seconds or ISO-8601.
    """

    __slots__ = ("_next_token",)

    def __init__(self) -> None:
        self._next_token = 0

    def decode(self, record: object) -> Iterable[Event]:
        if not isinstance(record, dict):
            raise BadRecord(f"expected a JSON object, got {type(record).__name__}")
        kind = record.get("type")
        timestamp = _timestamp(record.get("timestamp"))
        if kind == "user_message":
            session = _session_text(_get(record, "session"), "session")
            return (UserPrompt(session, _optional_text(record, "agent"), timestamp),)
        if kind not in (None, "tool_call"):
            raise BadRecord(
                f"unknown record type {_short(kind)} (expected 'tool_call' or 'user_message')"
            )
        session = _session_text(_get(record, "session"), "session")
        tool = _get(record, "tool")
        if not isinstance(tool, str) or not tool:
            raise BadRecord(f"'tool' must be a non-empty string, got {_short(tool)}")
        arguments = _get(record, "arguments")
        error = record.get("error")
        if error is not None and not isinstance(error, bool):
            raise BadRecord(f"'error' must be true, false or null, got {_short(error)}")
        duration = _optional_seconds(record, "duration_seconds")
        token = self._next_token
        self._next_token += 1
        return (
            CallStarted(
                token, session, _optional_text(record, "agent"), tool, arguments,
                _optional_text(record, "call_id"), timestamp,
            ),
            CallFinished(token, error, record.get("result"), duration, timestamp),
        )

    def finish(self) -> Iterable[Event]:
        return ()


def _claims_transcript(record: object) -> bool:
    return isinstance(record, dict) and (
        "tool" in record or record.get("type") in ("user_message", "tool_call")
    )


_CLAUDE_CODE_TYPES: Final = frozenset(
    {"user", "assistant", "system", "summary", "file-history-snapshot", "queue-operation",
     "progress", "attachment"}
)


def _claims_claude_code(record: object) -> bool:
    return (
        isinstance(record, dict)
        and "tool" not in record
        and isinstance(record.get("type"), str)
        and record["type"] in _CLAUDE_CODE_TYPES
        and ("sessionId" in record or "leafUuid" in record or "snapshot" in record)
    )


@dataclass(slots=True)
class _PendingUse:
    token: int
    timestamp: float | None


class ClaudeCodeDecoder:
    """Claude Code session transcripts (``~/.claude/projects/<project>/<session>.jsonl``).

    1. An ``assistant`` line's ``message.content`` ``tool_use`` items (``id``, ``name``,
       ``input``) start calls in session ``sessionId``; sub-agent lines (``isSidechain``) are a
       separate agent, named by ``agentId`` (or ``sidechain`` in older files), so a sub-agent
       never shares a chain with its parent. A ``tool_use`` id seen before is not counted again.
    2. A ``user`` line's ``tool_result`` items (``tool_use_id``, ``is_error``, ``content``) finish
       the call with that id; the duration is the time between the two lines' timestamps.
    3. A ``user`` line whose content is a string, or has text or image parts, is a real user
       prompt, unless it is marked ``isMeta``, ``isCompactSummary`` or
       ``isVisibleInTranscriptOnly`` (system-made lines the model did not get from a person).
    4. Every other line type (``summary``, ``system``, snapshots ...) carries no calls.
    """

    __slots__ = ("_next_token", "_pending", "_seen")

    def __init__(self) -> None:
        self._next_token = 0
        self._pending: dict[str, _PendingUse] = {}
        # Ids already counted: a resumed session can repeat earlier lines; each attempt counts once.
        self._seen: dict[str, None] = {}

    def decode(self, record: object) -> Iterable[Event]:
        if not isinstance(record, dict):
            raise BadRecord(f"expected a JSON object, got {type(record).__name__}")
        kind = record.get("type")
        if kind == "assistant":
            return self._assistant(record)
        if kind == "user":
            return self._user(record)
        return ()

    def finish(self) -> Iterable[Event]:
        # Calls without a result (interrupted, or the file ends mid-turn) keep an unknown outcome.
        self._pending.clear()
        return ()

    @staticmethod
    def _content(record: Mapping[str, Any]) -> object:
        message = _get(record, "message")
        if not isinstance(message, dict):
            raise BadRecord(f"'message' must be an object, got {_short(message)}")
        return _get(message, "content")

    @staticmethod
    def _agent(record: Mapping[str, Any]) -> str | None:
        if record.get("isSidechain") is not True:
            return None
        agent_id = record.get("agentId")
        return agent_id if isinstance(agent_id, str) and agent_id else "sidechain"

    def _assistant(self, record: Mapping[str, Any]) -> list[Event]:
        content = self._content(record)
        if not isinstance(content, list):
            return []
        uses = [item for item in content if isinstance(item, dict) and item.get("type") == "tool_use"]
        if not uses:
            return []
        session = _session_text(_get(record, "sessionId"), "sessionId")
        agent = self._agent(record)
        timestamp = _timestamp(record.get("timestamp"))
        # Validate every item first so a bad line starts no call at all.
        for use in uses:
            if not isinstance(use.get("id"), str) or not use["id"]:
                raise BadRecord(f"tool_use without an 'id': {_short(use)}")
            if not isinstance(use.get("name"), str) or not use["name"]:
                raise BadRecord(f"tool_use {use['id']!r} without a 'name'")
        events: list[Event] = []
        for use in uses:
            use_id: str = use["id"]
            if use_id in self._seen:
                continue
            _remember(self._seen, use_id, None)
            token = self._next_token
            self._next_token += 1
            _remember(self._pending, use_id, _PendingUse(token, timestamp))
            events.append(
                CallStarted(token, session, agent, use["name"], use.get("input", {}), use_id, timestamp)
            )
        return events

    def _user(self, record: Mapping[str, Any]) -> list[Event]:
        content = self._content(record)
        timestamp = _timestamp(record.get("timestamp"))
        events: list[Event] = []
        prompt = isinstance(content, str) and bool(content.strip())
        if isinstance(content, list):
            for item in content:
                if not isinstance(item, dict):
                    continue
                if item.get("type") == "tool_result":
                    use_id = item.get("tool_use_id")
                    pending = self._pending.pop(use_id, None) if isinstance(use_id, str) else None
                    if pending is None:
                        continue  # result of a call before this file started: nothing to finish
                    duration = None
                    if timestamp is not None and pending.timestamp is not None:
                        duration = max(0.0, timestamp - pending.timestamp)
                    events.append(
                        CallFinished(pending.token, item.get("is_error") is True,
                                     item.get("content"), duration, timestamp)
                    )
                elif item.get("type") in ("text", "image", "document"):
                    prompt = True
        elif not isinstance(content, str):
            raise BadRecord(f"'message.content' must be a string or a list, got {_short(content)}")
        synthetic = any(record.get(flag) is True for flag in
                        ("isMeta", "isCompactSummary", "isVisibleInTranscriptOnly"))
        if prompt and not synthetic:
            session = _session_text(_get(record, "sessionId"), "sessionId")
            events.append(UserPrompt(session, self._agent(record), timestamp))
        return events


def _remember(store: dict[str, Any], key: str, value: object) -> None:
    """Insert into a bounded insertion-ordered map, forgetting the oldest entry when full."""
    store[key] = value
    if len(store) > MAX_PENDING_CALLS:
        del store[next(iter(store))]


# --------------------------------------------------------------------------------------------
# Recorded traces: OTLP JSON lines and span dumps (decoding and buffering: ``traces``)

def _buffered(buffer: TraceBuffer, spans: Iterable[RecordedSpan], problems: list[str],
              bad_spans: int = 0) -> list[Event]:
    """Buffer the good spans of one record; return the events now ready, or raise
    :class:`BadRecord` carrying them when the record had bad spans or overflowed the buffer."""
    for span in spans:
        buffer.add(span)
    early = buffer.replayed_early
    events: list[Event] = list(buffer.take_ready())
    early = buffer.replayed_early - early
    reasons = list(problems[:MAX_SPAN_PROBLEMS])
    hidden = bad_spans - len(reasons)
    if hidden > 0:
        reasons.append(f"and {hidden} more bad span{'s' if hidden != 1 else ''}")
    if early:
        reasons.append(
            f"more than {buffer.max_spans:,} spans of unfinished traces buffered: {early} trace"
            f"{'s' if early != 1 else ''} replayed before the root span arrived (decisions"
            " may differ)"
        )
    if reasons:
        raise BadRecord("; ".join(reasons), events)
    return events


# -- span dumps -------------------------------------------------------------------------------


def _sdk_attributes(value: object, name: str) -> dict[str, object]:
    """A dump's attribute object as the SDK holds it: lists as tuples, nulls dropped."""
    if not isinstance(value, dict):
        raise BadRecord(f"{name!r} must be an object of attributes, got {_short(value)}")
    attributes: dict[str, object] = {}
    for key, item in value.items():
        if item is None:
            continue
        attributes[key] = tuple(item) if isinstance(item, list) else item
    return attributes


def _dump_events(value: object) -> tuple[tuple[str, Mapping[str, object]], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRecord(f"'events' must be a list, got {_short(value)}")
    events: list[tuple[str, Mapping[str, object]]] = []
    for index, event in enumerate(value):
        if not isinstance(event, dict):
            raise BadRecord(f"events[{index}] must be an object, got {_short(event)}")
        event_name = _get(event, "name")
        if not isinstance(event_name, str):
            raise BadRecord(f"events[{index}].name must be a string, got {_short(event_name)}")
        raw = event.get("attributes")
        events.append((event_name, _sdk_attributes(raw, f"events[{index}].attributes")
                       if raw is not None else {}))
    return tuple(events)


def _dump_status_error(value: object) -> bool:
    if value is None:
        return False
    if not isinstance(value, dict):
        raise BadRecord(f"'status' must be an object, got {_short(value)}")
    return value.get("code") in ("ERROR", "STATUS_CODE_ERROR", STATUS_CODE_ERROR)


def _dump_span(record: Mapping[str, Any]) -> RecordedSpan:
    name = _get(record, "name")
    if not isinstance(name, str):
        raise BadRecord(f"'name' must be a string, got {_short(name)}")
    trace_id = _id_text(_get(record, "trace_id"), 16, "trace_id", False)
    span_id = _id_text(_get(record, "span_id"), 8, "span_id", False)
    parent_id = _parent_id(record.get("parent_span_id"), "parent_span_id", False)
    start = _nanos(_get(record, "start_time_ns"), "start_time_ns", False)
    end = _nanos(_get(record, "end_time_ns"), "end_time_ns", False)
    attributes = _sdk_attributes(_get(record, "attributes"), "attributes")
    start_name = record.get("name_at_start")
    if start_name is not None and not isinstance(start_name, str):
        raise BadRecord(f"'name_at_start' must be a string, got {_short(start_name)}")
    raw_start = record.get("attributes_at_start")
    start_attributes = (None if raw_start is None
                        else _sdk_attributes(raw_start, "attributes_at_start"))
    return RecordedSpan(
        trace_id, span_id, parent_id, name, attributes, _dump_events(record.get("events")),
        _dump_status_error(record.get("status")), start, end, start_name, start_attributes,
    )


class _TraceDecoder:
    """What the recorded-trace decoders share: one :class:`TraceBuffer` per file, which puts the
    spans back in time order and gives the rest of its events when the input ends."""

    __slots__ = ("_buffer",)

    def __init__(self, max_buffered_spans: int | None = None,
                 key_by: KeyBy | str = KeyBy.TRACE) -> None:
        self._buffer = TraceBuffer(
            MAX_BUFFERED_SPANS if max_buffered_spans is None else max_buffered_spans,
            key_by=key_by)

    def finish(self) -> Iterable[Event]:
        return self._buffer.finish()


class SpanDumpDecoder(_TraceDecoder):
    """Span dumps: one finished span per line, in the order spans ended (the fixtures' format)::

        {"name": "execute_tool search", "kind": "INTERNAL", "trace_id": "<32 hex>",
         "span_id": "<16 hex>", "parent_span_id": "<16 hex>" | null, "scope": "pydantic-ai",
         "start_time_ns": 1796049783492744705, "end_time_ns": ..., "attributes": {...},
         "events": [{"name", "timestamp_ns", "attributes"}], "status": {"code": "ERROR", ...},
         "name_at_start": "...", "attributes_at_start": {...}}

    ``name``, ``trace_id``, ``span_id``, the two times and ``attributes`` are required.
    ``name_at_start``/``attributes_at_start`` are what ``SpanProcessor.on_start`` saw; without
    ``attributes_at_start`` the span is judged as an OTLP span is. Traces are put back in time order
    by a :class:`TraceBuffer`.
    """

    __slots__ = ()

    def decode(self, record: object) -> Iterable[Event]:
        if not isinstance(record, dict):
            raise BadRecord(f"expected a JSON object (one span), got {type(record).__name__}")
        return _buffered(self._buffer, (_dump_span(record),), [])


def _claims_span_dump(record: object) -> bool:
    return (isinstance(record, dict) and "span_id" in record and "trace_id" in record
            and "name" in record and "resourceSpans" not in record)


class OtlpJsonDecoder(_TraceDecoder):
    """OTLP JSON lines: one ``ExportTraceServiceRequest`` per line, as the Collector's ``file``
    exporter writes them::

        {"resourceSpans": [{"resource": {...}, "scopeSpans": [{"scope": {...}, "spans": [
          {"traceId": "<32 hex>", "spanId": "<16 hex>", "parentSpanId": "<16 hex>" | "",
           "name": "execute_tool search", "kind": 1, "startTimeUnixNano": "1796...",
           "endTimeUnixNano": "...", "attributes": [{"key": "gen_ai.tool.name",
           "value": {"stringValue": "search"}}], "events": [{"timeUnixNano", "name",
           "attributes"}], "status": {"code": 2}}]}]}]}

    Ids are hex; base64 of the right length (protobuf's own JSON) is read too. 64-bit integers
    may be decimal strings or numbers; enums integers (or their names); unknown fields are
    ignored; fields proto3 leaves out when empty (name, attributes, events, status, parent) may
    be absent. ``traceId``, ``spanId`` and the two times are required. Lines of other signals
    (``resourceMetrics``, ``resourceLogs``) carry no calls. A bad span makes its line bad, named
    by its path in the line, but the line's other spans still count. OTLP does not record what a
    span carried when it started: the final name and attributes stand in, and a tool span is
    decided at its start only for the instrumentations known to start tool spans with their
    arguments (Pydantic AI), as the span processor would have; every other one at its end.
    """

    __slots__ = ()

    def decode(self, record: object) -> Iterable[Event]:
        if not isinstance(record, dict):
            raise BadRecord(f"expected a JSON object (an ExportTraceServiceRequest), got"
                            f" {type(record).__name__}")
        if "resourceSpans" not in record:
            if any(signal in record for signal in OTLP_SIGNALS):
                return ()
            raise BadRecord("missing field 'resourceSpans'")
        read = otlp_json_spans(record)
        return _buffered(self._buffer, read.spans, read.problems, read.bad_spans)


def _claims_otlp_json(record: object) -> bool:
    return isinstance(record, dict) and any(
        isinstance(record.get(signal), list) for signal in OTLP_SIGNALS)


#: The input formats, most specific first: the first whose ``claims`` accepts one of a file's
#: first records reads the file.
FORMATS: list[InputFormat] = [
    InputFormat(
        "claude-code",
        "Claude Code session transcripts (~/.claude/projects/*/*.jsonl)",
        _claims_claude_code,
        ClaudeCodeDecoder,
    ),
    InputFormat(
        "transcript",
        'tool-call transcripts: {"session", "tool", "arguments", "error"} per line',
        _claims_transcript,
        TranscriptDecoder,
    ),
    # Recorded traces. Their records carry none of the keys the formats above claim by.
    InputFormat(
        "otlp-json",
        "OTLP JSON lines: one ExportTraceServiceRequest per line (the Collector's file exporter)",
        _claims_otlp_json,
        OtlpJsonDecoder,
        traces=True,
    ),
    InputFormat(
        "span-dump",
        'span JSON lines: {"name", "trace_id", "span_id", "attributes", ...} per finished span',
        _claims_span_dump,
        SpanDumpDecoder,
        traces=True,
    ),
]

#: Read with this format when no record is claimed (its errors then say what is missing).
_FALLBACK_FORMAT: Final = "transcript"


def register_format(fmt: InputFormat, *, before: str | None = None) -> None:
    """Add ``fmt`` to :data:`FORMATS` (before the format named ``before``, else last).

    Raises ``ValueError`` when a format of that name is already registered or ``before`` is
    unknown.
    """
    if any(existing.name == fmt.name for existing in FORMATS):
        raise ValueError(f"format: {fmt.name!r} is already registered")
    if before is None:
        FORMATS.append(fmt)
        return
    for position, existing in enumerate(FORMATS):
        if existing.name == before:
            FORMATS.insert(position, fmt)
            return
    raise ValueError(f"before: no format named {before!r}")


def format_by_name(name: str) -> InputFormat:
    """Return the registered format ``name``; raises ``ValueError`` naming the known ones."""
    for fmt in FORMATS:
        if fmt.name == name:
            return fmt
    raise ValueError(f"format: {name!r} is not one of {', '.join(f.name for f in FORMATS)}")


def detect_format(records: Iterable[object]) -> InputFormat:
    """Pick the format of a file from its first records: the first record any registered
    format claims decides; when none is claimed, the transcript format."""
    for record in records:
        for fmt in FORMATS:
            try:
                claimed = fmt.claims(record)
            except (TypeError, ValueError, KeyError, AttributeError):
                claimed = False  # a predicate tripping over odd input has not claimed it
            if claimed:
                return fmt
    return format_by_name(_FALLBACK_FORMAT)


# --------------------------------------------------------------------------------------------
# Reading lines


def _parse(line: bytes) -> object:
    """Parse one JSON line; raises :class:`BadRecord` with a readable reason."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    # orjson rejects some valid JSON (integers beyond 64 bits, NaN); the standard parser decides,
    # and its message is the clearer one.
    try:
        text = line.decode("utf-8")  # decoded here: json.loads would guess UTF-16/32 from bytes
    except UnicodeDecodeError as exc:
        raise BadRecord(f"not UTF-8 text ({exc.reason} at byte {exc.start + 1})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRecord(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise BadRecord("not readable JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. integer text past the interpreter's digit limit
        raise BadRecord(f"not readable JSON ({exc})") from None


class _Progress:
    """A one-line progress bar on a terminal's stderr; silent until the input proves large."""

    def __init__(self, stream: TextIO, total_bytes: int | None, enabled: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream
        self._total = total_bytes
        self._enabled = enabled
        self._clock = clock
        self._bytes = 0
        self._lines = 0
        self._shown = False
        self._next_draw = 0.0
        self._name = ""

    def start_file(self, name: str) -> None:
        self._name = name

    def advance(self, nbytes: int) -> None:
        self._bytes += nbytes
        self._lines += 1
        if not self._enabled or self._lines & 0xFF:
            return  # checking the clock every 256 lines keeps the bar off the hot path
        now = self._clock()
        if now < self._next_draw:
            return
        if not (self._shown or self._lines > LARGE_INPUT_LINES
                or (self._total or 0) > LARGE_INPUT_BYTES):
            return
        self._next_draw = now + _PROGRESS_INTERVAL_SECONDS
        self._draw()

    def _draw(self) -> None:
        name = self._name if len(self._name) <= 30 else "…" + self._name[-29:]
        if self._total:
            fraction = min(1.0, self._bytes / self._total)
            filled = int(fraction * 30)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%}"
        else:
            bar = f"{self._bytes / 1e6:,.1f} MB"
        self._stream.write(f"\r{bar}  {self._lines:,} lines  {name}\x1b[K")
        self._stream.flush()
        self._shown = True

    def clear(self) -> None:
        """Erase the bar (before another message is written to the same stream)."""
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._shown = False
            self._next_draw = 0.0


@dataclass(slots=True)
class _BadLines:
    """Reports bad lines on stderr (the first few per file) and counts them all."""

    stream: TextIO
    progress: _Progress
    total: int = 0
    per_file: dict[str, int] = field(default_factory=dict)
    unreadable_files: int = 0

    def bad(self, name: str, lineno: int, reason: str) -> None:
        self.total += 1
        seen = self.per_file.get(name, 0) + 1
        self.per_file[name] = seen
        if seen <= MAX_REPORTED_BAD_LINES:
            self.progress.clear()
            self.stream.write(f"{name}:{lineno}: {reason}\n")

    def unreadable(self, name: str, reason: str) -> None:
        self.unreadable_files += 1
        self.progress.clear()
        self.stream.write(f"{name}: cannot read: {reason}\n")

    def end_file(self, name: str) -> None:
        hidden = self.per_file.get(name, 0) - MAX_REPORTED_BAD_LINES
        if hidden > 0:
            self.progress.clear()
            self.stream.write(f"{name}: {hidden} more bad lines not shown\n")


def _read_events(
    name: str,
    handle: IO[bytes],
    fmt: InputFormat | None,
    bad: _BadLines,
    progress: _Progress,
    key_by: KeyBy = KeyBy.TRACE,
) -> Iterator[Event]:
    """Yield the events of one open file, reporting bad lines to ``bad``."""
    progress.start_file(name)
    lines = enumerate(handle, start=1)
    # Parse the first records ahead to sniff the format, then replay them in order.
    head: list[tuple[int, object, str | None]] = []
    if fmt is None:
        records = 0
        for lineno, line in lines:
            progress.advance(len(line))
            if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
            if not line.strip():
                continue
            try:
                head.append((lineno, _parse(line), None))
                records += 1
            except BadRecord as exc:
                head.append((lineno, None, str(exc)))
            if records >= SNIFF_RECORDS:
                break
        fmt = detect_format(record for _, record, problem in head if problem is None)
    decoder = fmt.decoder(key_by=key_by) if fmt.traces else fmt.decoder()

    def decode(lineno: int, record: object) -> Iterable[Event]:
        try:
            return decoder.decode(record)
        except BadSpan as exc:  # a BadRecord, or a span a shared decoder rejected
            bad.bad(name, lineno, str(exc))
            return exc.events if isinstance(exc, BadRecord) else ()
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            # A shape no check foresaw is still only one bad line, never a crash.
            bad.bad(name, lineno, f"unexpected record shape ({type(exc).__name__}: {exc})")
        return ()

    for lineno, record, problem in head:
        if problem is not None:
            bad.bad(name, lineno, problem)
        else:
            yield from decode(lineno, record)
    for lineno, line in lines:
        progress.advance(len(line))
        if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        if not line.strip():
            continue
        try:
            record = _parse(line)
        except BadRecord as exc:
            bad.bad(name, lineno, str(exc))
            continue
        yield from decode(lineno, record)
    yield from decoder.finish()


# --------------------------------------------------------------------------------------------
# Replaying


class ReplayClock:
    """The guard's clock during a replay: the latest recorded timestamp seen (seconds since the
    epoch), so idle TTLs and cooldowns follow the recording, not the wall clock. It never goes
    back; input without timestamps leaves it still."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def observe(self, timestamp: float | None) -> None:
        if timestamp is not None and timestamp > self.now:
            self.now = timestamp

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True, slots=True)
class ListedDecision:
    """One non-allow decision as listed in the report."""

    index: int
    tool: str
    rule: str | None
    action: str
    count: int


@dataclass(slots=True)
class SessionReport:
    """What the guard would have done in one session (one session id and agent)."""

    label: str
    calls: int = 0
    repeated: int = 0
    first_index: dict[str, int] = field(default_factory=dict)
    decisions: list[ListedDecision] = field(default_factory=list)
    decision_count: int = 0
    blocked: int = 0
    blocked_seconds: float = 0.0
    blocked_timed: int = 0


@dataclass(slots=True)
class _Open:
    report: SessionReport
    session: str
    agent: str | None
    tool: str
    arguments: object
    call_id: str | None
    blocked: bool


def _first_key(action: str) -> str:
    # A rescue is a denial that carries advice: it counts as the first deny.
    return "deny" if action == "rescue" else action


class Replayer:
    """Feeds events to a guard, keeps per-session reports, and returns each call's decision.

    A transcript call is ``before_tool`` then ``after_tool`` with its recorded outcome, as a live
    hook would see it. A call the guard blocks is still reported to ``after_tool``; the guard
    ignores the outcome of a blocked call (live, it would not have run), so from the first block
    on the report is what the guard would say had the agent kept to its recorded path. Every
    blocked call counts as saved: after a stop, the rest of the run would not have happened at all.

    A recorded span is fed as the span processor feeds it: ``decide_at_span_start`` at its start when
    it carried the arguments then (:class:`CallDecidedAtStart`), ``after_tool`` at its end
    (:class:`CallObserved`); the call's decision is whichever of the two returned one.
    """

    def __init__(self, guard: LoopGuard, clock: ReplayClock) -> None:
        self._guard = guard
        self._clock = clock
        self.reports: dict[tuple[str, str | None], SessionReport] = {}
        self._open: dict[tuple[int, int], _Open] = {}

    def _report(self, session: str, agent: str | None) -> SessionReport:
        key = (session, agent)
        report = self.reports.get(key)
        if report is None:
            label = session if agent is None else f"{session}/{agent}"
            report = self.reports[key] = SessionReport(label)
        return report

    def handle(self, source: int, event: Event) -> tuple[SessionReport, int, Decision] | None:
        """Feed one event from input ``source``; for a call it counts (a started, decided or
        newly observed call), return its session report, its 1-based index in the session and
        the guard's decision."""
        self._clock.observe(event.timestamp)
        if isinstance(event, UserPrompt):
            self._guard.user_message(event.session, agent=event.agent)
            return None
        if isinstance(event, CallFinished):
            self._finish(source, event)
            return None
        if isinstance(event, CallStarted):
            return self._start(source, event)
        if isinstance(event, RunStarted):
            feed(self._guard, event)
            return None
        observed = feed(self._guard, event)
        if observed is None:
            return None  # already counted when its span started: only the outcome was added
        return self._count(event.session, event.agent, event.tool, observed,
                           event.duration_seconds)

    def _count(self, session: str, agent: str | None, tool: str, decision: Decision,
               duration_seconds: float | None) -> tuple[SessionReport, int, Decision]:
        """Add one counted call and its decision to its session's report. A recorded duration
        of a blocked call (spans: known as soon as the call is) is what the block would save."""
        report = self._record(session, agent, tool, decision)
        if decision.blocks and duration_seconds is not None:
            report.blocked_seconds += duration_seconds
            report.blocked_timed += 1
        return report, report.calls, decision

    def _record(self, session: str, agent: str | None, tool: str, decision: Decision
                ) -> SessionReport:
        report = self._report(session, agent)
        report.calls += 1
        index = report.calls
        if decision.repeated:
            report.repeated += 1
        action = decision.action.value
        if action != "allow":
            report.first_index.setdefault(_first_key(action), index)
            report.decision_count += 1
            if len(report.decisions) < MAX_LISTED_DECISIONS:
                rule = decision.rule.value if decision.rule is not None else None
                report.decisions.append(ListedDecision(index, tool, rule, action, decision.count))
        if decision.blocks:
            report.blocked += 1
        return report

    def _start(self, source: int, event: CallStarted) -> tuple[SessionReport, int, Decision]:
        decision: Decision = self._guard.before_tool(
            event.tool, event.arguments, session=event.session, agent=event.agent,
            call_id=event.call_id,
        )
        report = self._record(event.session, event.agent, event.tool, decision)
        index = report.calls
        _remember_open(self._open, (source, event.token), _Open(
            report, event.session, event.agent, event.tool, event.arguments, event.call_id,
            decision.blocks,
        ))
        return report, index, decision

    def _finish(self, source: int, event: CallFinished) -> None:
        call = self._open.pop((source, event.token), None)
        if call is None:
            return
        if call.blocked and event.duration_seconds is not None:
            call.report.blocked_seconds += event.duration_seconds
            call.report.blocked_timed += 1
        # Always reported, even when nothing is known (error and result None): it closes the
        # call the guard holds as pending, as a live hook's after_tool would.
        self._guard.after_tool(
            call.tool, call.arguments, session=call.session, agent=call.agent,
            call_id=call.call_id, error=event.error, result=event.result,
            duration_seconds=event.duration_seconds,
        )


def _remember_open(store: dict[tuple[int, int], _Open], key: tuple[int, int], value: _Open) -> None:
    store[key] = value
    if len(store) > MAX_PENDING_CALLS:
        del store[next(iter(store))]


# --------------------------------------------------------------------------------------------
# Output


def _json_line(report: SessionReport, index: int, tool: str, decision: Decision) -> str:
    """One ``--json`` line. ``rule`` is null for an allowed call (no rule acted, even when
    evidence is building up); ``count`` is the decision's evidence count (0 for a new call)."""
    acted = decision.action.value != "allow" and decision.rule is not None
    rule = decision.rule.value if acted and decision.rule is not None else None
    return orjson.dumps({
        "session": report.label, "index": index, "tool": tool,
        "action": decision.action.value, "rule": rule, "count": decision.count,
    }).decode() + "\n"


def _seconds(report_seconds: float, timed: int, blocked: int) -> str:
    if blocked == 0 or timed == 0:
        return ""
    if timed == blocked:
        return f" ({report_seconds:,.1f} s)"
    return f" (at least {report_seconds:,.1f} s; {blocked - timed} without a duration)"


def format_session(report: SessionReport) -> str:
    """The text report of one session: its decisions, then a summary line."""
    lines = [f"session {report.label}"]
    if report.decisions:
        tool_width = min(30, max(4, *(len(d.tool) for d in report.decisions)))
        lines.append(f"  {'call':>6}  {'tool':<{tool_width}}  {'rule':<11}  {'action':<7}  count")
        for d in report.decisions:
            tool = d.tool if len(d.tool) <= tool_width else d.tool[: tool_width - 1] + "…"
            lines.append(
                f"  {d.index:>6}  {tool:<{tool_width}}  {d.rule or '-':<11}  {d.action:<7}"
                f"  {d.count:>5}"
            )
        hidden = report.decision_count - len(report.decisions)
        if hidden > 0:
            lines.append(f"  … and {hidden} more decisions not listed")
    firsts = ", ".join(
        f"first {action} #{report.first_index[action]}" if action in report.first_index
        else f"no {action}"
        for action in ("remind", "deny", "stop")
    )
    saved = (
        f"a deny would have saved {report.blocked} call{'s' if report.blocked != 1 else ''}"
        f"{_seconds(report.blocked_seconds, report.blocked_timed, report.blocked)}"
    )
    lines.append(f"  {report.calls} calls, {report.repeated} repeated; {firsts}; {saved}")
    return "\n".join(lines) + "\n"


def format_totals(reports: Sequence[SessionReport], files: int, bad_lines: int) -> str:
    """The closing line of a text report."""
    calls = sum(r.calls for r in reports)
    repeated = sum(r.repeated for r in reports)
    blocked = sum(r.blocked for r in reports)
    seconds = sum(r.blocked_seconds for r in reports)
    timed = sum(r.blocked_timed for r in reports)
    tripped = sum(1 for r in reports if r.decision_count)
    return (
        f"total: {files} file{'s' if files != 1 else ''}, {len(reports)} session"
        f"{'s' if len(reports) != 1 else ''} ({tripped} with decisions), {calls} calls,"
        f" {repeated} repeated; a deny would have saved {blocked} call"
        f"{'s' if blocked != 1 else ''}{_seconds(seconds, timed, blocked)};"
        f" {bad_lines} bad line{'s' if bad_lines != 1 else ''}\n"
    )


# --------------------------------------------------------------------------------------------
# Entry point


def _expand(paths: Sequence[str]) -> list[str]:
    """Check the inputs before anything is replayed; a directory means its ``*.jsonl`` files.
    Raises :class:`UsageError` naming a missing or unusable path."""
    inputs: list[str] = []
    for raw in paths:
        if raw == "-":
            inputs.append(raw)
            continue
        path = Path(raw)
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*.jsonl") if p.is_file())
            if not found:
                raise UsageError(f"no .jsonl files in directory: {raw}")
            inputs.extend(found)
        elif not path.exists():
            raise UsageError(f"no such file: {raw}")
        elif not os.access(path, os.R_OK):
            raise UsageError(f"cannot read file (permission denied): {raw}")
        else:
            inputs.append(raw)
    return inputs


def _input_size(inputs: Sequence[str]) -> int | None:
    total = 0
    for name in inputs:
        if name == "-":
            return None
        try:
            total += os.stat(name).st_size
        except OSError:
            return None
    return total


def run_replay(
    paths: Sequence[str],
    policy: Policy,
    *,
    json_output: bool = False,
    format_name: str | None = None,
    mode: Mode | None = None,
    stdin: IO[bytes] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    progress: bool | None = None,
    key_by: KeyBy | str = KeyBy.TRACE,
) -> int:
    """Replay ``paths`` (``-`` is stdin; a directory is its ``*.jsonl`` files) through a fresh
    guard with ``policy`` and write the report; return the exit status (0 all input read, 1 some
    lines bad or a file unreadable).

    ``mode`` overrides the policy's mode. ``key_by`` keys recorded traces' sessions by trace and
    agent (default) or by conversation, as the span processor and ``serve`` can. The policy's advisor is dropped: a replay reports where a
    rescue would trip but never buys advice. ``progress`` forces the progress bar on or off
    (default: on when ``stderr`` is a terminal and the input is large). Raises
    :class:`UsageError` for a missing or unreadable path or an unknown format name.
    """
    from otel_loopguard.guard import LoopGuard

    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    source_in = stdin if stdin is not None else sys.stdin.buffer
    try:
        fmt = format_by_name(format_name) if format_name is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        keyed_by = KeyBy(key_by)
    except ValueError:
        raise UsageError(f"key_by: expected 'trace' or 'conversation', got {key_by!r}") from None
    inputs = _expand(paths)
    changes: dict[str, object] = {"advisor_command": None}
    if mode is not None:
        changes["mode"] = mode
    policy = policy.replace(**changes)

    clock = ReplayClock()
    replayer = Replayer(LoopGuard(policy=policy, clock=clock), clock)
    show_progress = err.isatty() if progress is None else progress
    bar = _Progress(err, _input_size(inputs), show_progress)
    bad = _BadLines(err, bar)

    for source, name in enumerate(inputs):
        label = "<stdin>" if name == "-" else name
        try:
            handle: IO[bytes] = source_in if name == "-" else open(name, "rb")  # noqa: SIM115
        except OSError as exc:
            bad.unreadable(label, exc.strerror or str(exc))
            continue
        try:
            for event in _read_events(label, handle, fmt, bad, bar, keyed_by):
                started = replayer.handle(source, event)
                if started is not None and json_output:
                    report, index, decision = started
                    assert isinstance(event, (CallStarted, CallDecidedAtStart, CallObserved))
                    out.write(_json_line(report, index, event.tool, decision))
        except OSError as exc:
            bad.unreadable(label, exc.strerror or str(exc))
        finally:
            if handle is not source_in:
                handle.close()
        bad.end_file(label)
    bar.clear()

    reports = list(replayer.reports.values())
    if not json_output:
        out.write(f"replay: {len(inputs)} input{'s' if len(inputs) != 1 else ''},"
                  f" mode {policy.mode.value}\n\n")
        for report in reports:
            out.write(format_session(report))
            out.write("\n")
        out.write(format_totals(reports, len(inputs), bad.total))
    out.flush()
    if bad.total or bad.unreadable_files:
        parts = []
        if bad.total:
            parts.append(f"{bad.total} bad line{'s' if bad.total != 1 else ''} skipped")
        if bad.unreadable_files:
            parts.append(f"{bad.unreadable_files} file{'s' if bad.unreadable_files != 1 else ''}"
                         " unreadable")
        err.write(f"otel-loopguard replay: {' and '.join(parts)}; not all input was read"
                  " (exit status 1)\n")
        return 1
    return 0
