"""Tool-call input formats: tool-call transcripts and Claude Code sessions."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final

from .._otlp_json import short_value as _short
from ._events import (
    MAX_PENDING_CALLS,
    BadRecord,
    CallFinished,
    CallStarted,
    Event,
    UserPrompt,
    _get,
)


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
                token,
                session,
                _optional_text(record, "agent"),
                tool,
                arguments,
                _optional_text(record, "call_id"),
                timestamp,
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


def _remember(store: dict[str, Any], key: str, value: object) -> None:
    """Insert into a bounded insertion-ordered map, forgetting the oldest entry when full."""
    store[key] = value
    if len(store) > MAX_PENDING_CALLS:
        del store[next(iter(store))]
