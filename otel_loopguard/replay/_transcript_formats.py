"""Tool-call input formats: tool-call transcripts, the labelled corpus's lines and Claude Code
sessions; with the model usage they carry (:class:`~otel_loopguard._trace_events.ModelUsed`, fed
to ``LoopGuard.model_call`` before the calls of that turn)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final

from .._conventions import SpanModelCall
from .._otlp_json import short_value as _short
from .._trace_events import ModelUsed
from ..hooks._transcript import claude_code_turn
from ._events import (
    MAX_PENDING_CALLS,
    BadRecord,
    CallFinished,
    CallStarted,
    Event,
    ModelSkipped,
    UserPrompt,
    _get,
)

#: A record's ``usage`` field name -> the name ``LoopGuard.model_call`` takes (the corpus's and
#: Anthropic's names for the cached input first, then the hook API's own).
_USAGE_NAMES: Final = (
    ("input_tokens", "input_tokens"),
    ("output_tokens", "output_tokens"),
    ("cache_read_input_tokens", "cache_read_tokens"),
    ("cache_read_tokens", "cache_read_tokens"),
    ("cache_creation_input_tokens", "cache_write_tokens"),
    ("cache_write_tokens", "cache_write_tokens"),
    ("reported_cost_usd", "reported_cost_usd"),
)


def _model_used(
    usage: object, session: str, agent: str | None, timestamp: float | None
) -> ModelUsed:
    """The model turn a record's ``usage`` describes (``{"model", "provider", "input_tokens",
    "output_tokens", "cache_read_input_tokens" or "cache_read_tokens", "cache_write_tokens",
    "reported_cost_usd"}``; input tokens include the cached ones). Raises :class:`BadRecord`
    for a ``usage`` that is not an object or a model or provider that is not text; bad counts
    are checked when it is fed (a counted skip, ``LoopGuard.skipped_model_calls``)."""
    if not isinstance(usage, dict):
        raise BadRecord(f"'usage' must be an object, got {_short(usage)}")
    names: dict[str, object] = {}
    for field, name in _USAGE_NAMES:
        if name not in names and usage.get(field) is not None:
            names[name] = usage[field]
    text = {}
    for name in ("model", "provider"):
        value = usage.get(name)
        if value is not None and not isinstance(value, str):
            raise BadRecord(f"'usage.{name}' must be a string, got {_short(value)}")
        text[name] = value or None
    call = SpanModelCall(
        text["model"],
        text["provider"],
        names.get("input_tokens", 0),
        names.get("output_tokens", 0),
        names.get("cache_read_tokens", 0),
        names.get("cache_write_tokens", 0),
        names.get("reported_cost_usd"),
        None,
        None,
        None,
        "transcript",
    )
    return ModelUsed(session, agent, call, timestamp)


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
            parsed = datetime.fromisoformat(
                f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
            )
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
    ``null`` (unknown; also when absent); ``timestamp`` is epoch seconds or ISO-8601. ``usage``
    (optional): the model turn that requested the call, ``{"model", "provider",
    "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
    "reported_cost_usd"}`` (input tokens include the cached ones; the corpus's
    ``cache_read_input_tokens`` is read too), charged before the call.
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
        agent = _optional_text(record, "agent")
        token = self._next_token
        self._next_token += 1
        events: tuple[Event, ...] = (
            CallStarted(
                token, session, agent, tool, arguments, _optional_text(record, "call_id"), timestamp
            ),
            CallFinished(token, error, record.get("result"), duration, timestamp),
        )
        usage = record.get("usage")
        if usage is None:
            return events
        try:
            return (_model_used(usage, session, agent, timestamp), *events)
        except BadRecord as exc:
            raise BadRecord(str(exc), events) from None  # the call is still replayed

    def finish(self) -> Iterable[Event]:
        return ()


def _claims_transcript(record: object) -> bool:
    return isinstance(record, dict) and (
        "tool" in record or record.get("type") in ("user_message", "tool_call")
    )


class CorpusDecoder:
    """The labelled corpus's lines (``corpus/trajectories/*.jsonl``, one run per file)::

        {"agent": "mini_gemini", "seq": 0, "tool": "bash", "arguments": {"command": "ls"},
         "is_error": false, "result": "sha256:64eefa0f509333d8", "kind_hint": "read",
         "usage": {"model": "google/gemini-3-pro-preview", "input_tokens": 2704,
                   "output_tokens": 314, "cache_read_input_tokens": 0,
                   "reported_cost_usd": 0.009176},
         "source": "owner/repo@commit:path"}
        {"type": "user_message", "agent": "mini_gemini", "source": "owner/repo@commit:path"}

    A run is one session named by its ``source`` (where the run came from), else its
    ``agent``; ``is_error`` is the call's error (``null``: unknown); ``kind_hint`` (the
    labeller's guess, which no deployed detector sees) is ignored; ``usage`` is the model turn
    that requested the call, as in :class:`TranscriptDecoder` (``reported_cost_usd``: the
    provider's own figure, which wins over a computed one). A call without a tool name is
    ``<unnamed>``.
    """

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls = TranscriptDecoder()

    def decode(self, record: object) -> Iterable[Event]:
        if not isinstance(record, dict):
            raise BadRecord(f"expected a JSON object, got {type(record).__name__}")
        session = record.get("source") or record.get("agent")
        if session is None:
            raise BadRecord("missing field 'source' (or 'agent')")
        if record.get("type") == "user_message":
            return self._calls.decode({"type": "user_message", "session": session})
        line = {
            "session": session,
            "tool": _get(record, "tool") or "<unnamed>",
            "arguments": _get(record, "arguments"),
            "error": record.get("is_error"),
            "result": record.get("result"),
        }
        if record.get("usage") is not None:
            line["usage"] = record["usage"]
        return self._calls.decode(line)

    def finish(self) -> Iterable[Event]:
        return ()


def _claims_corpus(record: object) -> bool:
    return (
        isinstance(record, dict)
        and "session" not in record
        and (
            ("seq" in record and "tool" in record)
            or (record.get("type") == "user_message" and "source" in record)
        )
    )


_CLAUDE_CODE_TYPES: Final = frozenset(
    {
        "user",
        "assistant",
        "system",
        "summary",
        "file-history-snapshot",
        "queue-operation",
        "progress",
        "attachment",
    }
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
    5. Model usage: an ``assistant`` line's ``message.usage`` (read as the hook reads it,
       :func:`otel_loopguard.hooks._transcript.claude_code_turn`). Claude Code writes one
       response over several lines with the same ``message.id``, the output count growing to
       its final value on the last; the response is charged once, with its last line's counts,
       before the calls it requested: its lines' events wait until a line of another response
       (or the end of the file). A response id charged before is not charged again; a usage
       that does not read is a counted skip (:class:`~._events.ModelSkipped`).
    """

    __slots__ = ("_charged", "_held", "_next_token", "_pending", "_seen", "_skipped")

    def __init__(self) -> None:
        self._next_token = 0
        self._pending: dict[str, _PendingUse] = {}
        # Ids already counted: a resumed session can repeat earlier lines; each attempt counts once.
        self._seen: dict[str, None] = {}
        # Responses charged (bounded as the calls are), and the one whose lines are still coming.
        self._charged: dict[str, None] = {}
        self._held: _HeldResponse | None = None
        #: Responses whose usage did not read, by field.
        self._skipped: dict[str, int] = {}

    def decode(self, record: object) -> Iterable[Event]:
        if not isinstance(record, dict):
            raise BadRecord(f"expected a JSON object, got {type(record).__name__}")
        kind = record.get("type")
        held = self._held
        message = record.get("message")
        message_id = message.get("id") if isinstance(message, dict) else None
        if kind == "assistant" and held is not None and message_id == held.id:
            # Another line of the response being read: its counts; its calls wait with it.
            held.update(record)
            held.events.extend(self._assistant(record))
            return ()
        events = self._release()
        try:
            if kind == "assistant":
                response = _HeldResponse.of(record, message_id, self._charged)
                if response is None:
                    return [*events, *self._assistant(record)]
                response.events.extend(self._assistant(record))
                self._held = response
                return events
            if kind == "user":
                return [*events, *self._user(record)]
        except BadRecord as exc:  # the response released before it is still replayed
            raise BadRecord(str(exc), [*events, *exc.events]) from None
        return events

    def finish(self) -> Iterable[Event]:
        # Calls without a result (interrupted, or the file ends mid-turn) keep an unknown outcome.
        self._pending.clear()
        return self._release()

    def _release(self) -> list[Event]:
        """The events of the response held: its usage (its last line's), then its calls."""
        held, self._held = self._held, None
        if held is None:
            return []
        _remember(self._charged, held.id, None)
        return held.release()

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
        uses = [
            item for item in content if isinstance(item, dict) and item.get("type") == "tool_use"
        ]
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
                CallStarted(
                    token, session, agent, use["name"], use.get("input", {}), use_id, timestamp
                )
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
                        CallFinished(
                            pending.token,
                            item.get("is_error") is True,
                            item.get("content"),
                            duration,
                            timestamp,
                        )
                    )
                elif item.get("type") in ("text", "image", "document"):
                    prompt = True
        elif not isinstance(content, str):
            raise BadRecord(f"'message.content' must be a string or a list, got {_short(content)}")
        synthetic = any(
            record.get(flag) is True
            for flag in ("isMeta", "isCompactSummary", "isVisibleInTranscriptOnly")
        )
        if prompt and not synthetic:
            session = _session_text(_get(record, "sessionId"), "sessionId")
            events.append(UserPrompt(session, self._agent(record), timestamp))
        return events


@dataclass(slots=True)
class _HeldResponse:
    """A Claude Code model response whose lines are still being read: its latest usage line,
    and the events of its lines so far."""

    id: str
    record: Mapping[str, Any]
    events: list[Event]

    @classmethod
    def of(
        cls, record: Mapping[str, Any], message_id: object, charged: Mapping[str, None]
    ) -> _HeldResponse | None:
        """A response to hold from its first line; ``None`` for a line with no usage or an id
        already charged."""
        if not isinstance(message_id, str) or not message_id or message_id in charged:
            return None
        message = record.get("message")
        if not isinstance(message, dict) or message.get("usage") is None:
            return None
        return cls(message_id, record, [])

    def update(self, record: Mapping[str, Any]) -> None:
        message = record.get("message")
        if isinstance(message, dict) and message.get("usage") is not None:
            self.record = record

    def release(self) -> list[Event]:
        record = self.record
        try:
            turn = claude_code_turn(record)
        except ValueError as exc:  # a counted skip, as a span's bad usage is
            return [ModelSkipped(str(exc).split(":", 1)[0]), *self.events]
        if turn is None:
            return self.events
        session = record.get("sessionId")
        if not isinstance(session, str) or not session:
            return self.events
        usage = turn.usage
        call = SpanModelCall(
            usage.model,
            usage.provider,
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            None,
            None,
            None,
            None,
            "claude-code",
        )
        used = ModelUsed(session, turn.agent, call, _timestamp(record.get("timestamp")))
        return [used, *self.events]


def _remember(store: dict[str, Any], key: str, value: object) -> None:
    """Insert into a bounded insertion-ordered map, forgetting the oldest entry when full."""
    store[key] = value
    if len(store) > MAX_PENDING_CALLS:
        del store[next(iter(store))]
