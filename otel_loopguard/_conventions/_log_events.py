"""Coding agents' own telemetry: the OpenTelemetry *log events* Claude Code, Gemini CLI and Codex
emit once a tool call has run, read into a :class:`LogToolCall` (or ``None`` for every other log
record). Pure: stdlib only, no OpenTelemetry import; ``serve``'s ``/v1/logs`` and gRPC
``LogsService`` readers (:mod:`otel_loopguard.service._otlp_logs`) call it per record.

Field names, as each agent publishes them (docs/serve.md "Coding agents' own telemetry" has the
table; tests/data/logs/README.md the exact versions):

- **Claude Code** (``code.claude.com/docs/en/monitoring-usage``, "Tool result event"): event
  ``claude_code.tool_result`` (the record's body or ``event_name``; attribute ``event.name`` is
  ``tool_result``), ``tool_name``, ``tool_use_id`` (the id its hooks get too), ``success``
  (``"true"``/``"false"``), ``duration_ms``, ``error``, ``session.id``, ``prompt.id``; the
  arguments only with ``OTEL_LOG_TOOL_DETAILS=1``: ``tool_input`` (JSON) or else
  ``tool_parameters`` (JSON); an MCP tool is ``tool_name`` ``mcp_tool`` with
  ``mcp_server_name``/``mcp_tool_name`` in ``tool_parameters`` (named ``mcp__server__tool`` here,
  as its hooks name it).
- **Gemini CLI** (``google-gemini/gemini-cli`` ``packages/core/src/telemetry/types.ts``,
  ``ToolCallEvent``): attribute ``event.name`` ``gemini_cli.tool_call``, ``function_name``,
  ``function_args`` (JSON, when prompts are logged: ``telemetry.logPrompts``, on by default),
  ``success`` (boolean), ``error``, ``duration_ms``, ``decision``, ``session.id``,
  ``prompt_id``. No call id.
- **Codex** (``openai/codex`` ``codex-rs/otel/src/events/session_telemetry.rs``,
  ``tool_result``): attribute ``event.name`` ``codex.tool_result``, ``tool_name``, ``call_id``,
  ``arguments`` (JSON text), ``success`` (``"true"``/``"false"``), ``duration_ms``, ``output``,
  ``conversation.id``. Its shell tool's ``output`` starts with a header whose ``Chunk ID`` and
  ``Wall time`` lines differ on every run of the same command (``ExecCommandToolOutput``'s
  ``response_text`` in ``codex-rs``); they are dropped from the result
  (:func:`codex_output`), so that the same output reads the same.

Each such event is one call that already ran. Its session is the agent's own session id
(``session.id``, Codex's ``conversation.id``), the id its command hooks send as
``session_id``, with no agent (hooks name only sub-agents): a call reported by a hook and by the
telemetry with the same call id is counted once by the guard's report ledger. A record without
a call id gets one made from its own fields (:func:`record_call_id`), so that an exporter's retry
of the same batch counts once too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "AGENT_LOG_EVENTS",
    "BadLogRecord",
    "LogEventConvention",
    "LogToolCall",
    "tool_call_from_log",
]

#: Characters of an attribute value quoted in a problem's message.
_SHOWN: Final = 60


class BadLogRecord(ValueError):
    """A coding agent's tool event that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class LogEventConvention:
    """How one coding agent's tool event is recognised and read: the event's names (the record's
    ``event_name``, its string body, or its ``event.name`` attribute), then the attribute of each
    field (``None``: the agent does not send it)."""

    agent: str
    event_names: frozenset[str]
    tool: str
    session: tuple[str, ...]
    arguments: tuple[str, ...]
    call_id: str | None
    success: str
    duration_ms: str
    error: tuple[str, ...]
    result: str | None
    #: ``event.name`` values that mean this event only when the resource's ``service.name`` is
    #: this agent's (Claude Code's ``event.name`` is a bare ``tool_result``).
    short_name: tuple[str, str] | None = None


#: One entry per coding agent (see the module docstring for the sources).
AGENT_LOG_EVENTS: Final = (
    LogEventConvention(
        agent="claude-code",
        event_names=frozenset({"claude_code.tool_result"}),
        tool="tool_name",
        session=("session.id", "prompt.id"),
        arguments=("tool_input", "tool_parameters"),
        call_id="tool_use_id",
        success="success",
        duration_ms="duration_ms",
        error=("error", "error_type"),
        result=None,
        short_name=("tool_result", "claude-code"),
    ),
    LogEventConvention(
        agent="gemini-cli",
        event_names=frozenset({"gemini_cli.tool_call"}),
        tool="function_name",
        session=("session.id", "prompt_id"),
        arguments=("function_args",),
        call_id=None,
        success="success",
        duration_ms="duration_ms",
        error=("error", "error.message"),
        result=None,
    ),
    LogEventConvention(
        agent="codex",
        event_names=frozenset({"codex.tool_result"}),
        tool="tool_name",
        session=("conversation.id",),
        arguments=("arguments",),
        call_id="call_id",
        success="success",
        duration_ms="duration_ms",
        error=(),
        result="output",
    ),
)

_BY_NAME: Final = {name: entry for entry in AGENT_LOG_EVENTS for name in entry.event_names}
_BY_SHORT_NAME: Final = {
    entry.short_name: entry for entry in AGENT_LOG_EVENTS if entry.short_name is not None
}
#: What Claude Code names an MCP tool in its events (the real name is in ``tool_parameters``).
_CLAUDE_MCP_TOOL: Final = "mcp_tool"
#: The header lines of Codex's shell output that differ between two runs of one command.
_CODEX_VOLATILE: Final = ("Chunk ID: ", "Wall time: ")
#: Where the header of Codex's shell output ends and the command's output starts.
_CODEX_OUTPUT: Final = "\nOutput:\n"


@dataclass(frozen=True, slots=True)
class LogToolCall:
    """One tool call a coding agent reported after it ran. ``arguments`` is the agent's JSON text
    (the guard parses it), ``None`` when the event carried none (``OTEL_LOG_TOOL_DETAILS`` off).
    ``error``: the call failed (``None``: unknown)."""

    agent: str
    session: str
    tool: str
    arguments: object
    call_id: str | None
    error: bool | None
    result: object
    duration_seconds: float | None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def convention_of(
    event_name: str, body: object, attributes: Mapping[str, object], service: object
) -> LogEventConvention | None:
    """The convention a record's names select, or ``None`` (not a coding agent's tool event)."""
    for name in (event_name, body, attributes.get("event.name")):
        if isinstance(name, str) and name in _BY_NAME:
            return _BY_NAME[name]
    short = attributes.get("event.name")
    if isinstance(short, str) and isinstance(service, str):
        return _BY_SHORT_NAME.get((short, service))
    return None


def _text(attributes: Mapping[str, object], key: str) -> str | None:
    value = attributes.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise BadLogRecord(f"{key!r} must be a string, got {_short(value)}")


def _success(attributes: Mapping[str, object], key: str) -> bool | None:
    value = attributes.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise BadLogRecord(f"{key!r} must be true or false, got {_short(value)}")


def _duration(attributes: Mapping[str, object], key: str) -> float | None:
    value = attributes.get(key)
    if value is None:
        return None
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not 0 <= number < float("inf"):
        raise BadLogRecord(f"{key!r} must be milliseconds >= 0, got {_short(value)}")
    return number / 1000


def _claude_mcp_name(parameters: object) -> str | None:
    """``mcp__server__tool`` from Claude Code's ``tool_parameters`` JSON, as its hooks name an
    MCP tool; ``None`` when it does not say."""
    if not isinstance(parameters, str):
        return None
    try:
        decoded = json.loads(parameters)
    except ValueError:
        return None
    if not isinstance(decoded, dict):
        return None
    server, tool = decoded.get("mcp_server_name"), decoded.get("mcp_tool_name")
    if isinstance(server, str) and isinstance(tool, str) and server and tool:
        return f"mcp__{server}__{tool}"
    return None


def codex_output(output: object) -> object:
    """Codex's tool ``output`` without the header lines that differ on every run (its
    ``Chunk ID`` and ``Wall time``); any other value as it is."""
    if not isinstance(output, str):
        return output
    header, marker, rest = output.partition(_CODEX_OUTPUT)
    if not marker:
        return output
    kept = [line for line in header.split("\n") if not line.startswith(_CODEX_VOLATILE)]
    return "\n".join(kept) + marker + rest


def record_call_id(agent: str, session: str, tool: str, stamp: tuple[object, ...]) -> str:
    """A call id made from a record's own fields (its times, sequence, tool and arguments): the
    same record sent again gets the same id, two calls never do (their times differ)."""
    digest = hashlib.blake2b(
        json.dumps([agent, session, tool, *stamp], default=repr).encode(), digest_size=12
    )
    return f"log:{digest.hexdigest()}"


def tool_call_from_log(
    attributes: Mapping[str, object],
    *,
    event_name: str = "",
    body: object = None,
    service: object = None,
    times: tuple[int, int] = (0, 0),
) -> LogToolCall | None:
    """The tool call a log record reports, or ``None`` when it is not a coding agent's tool event.

    ``attributes``: the record's (the resource's ``service.name`` is ``service``); ``event_name``
    and ``body``: the record's ``event_name`` field and body; ``times``: its
    ``time_unix_nano`` and ``observed_time_unix_nano`` (for a call id made when the event has
    none; a record with no time at all gets none). Raises :class:`BadLogRecord` naming the
    field when a tool event cannot be read (no tool name, no session, a success flag that is
    not a boolean)."""
    entry = convention_of(event_name, body, attributes, service)
    if entry is None:
        return None
    tool = _text(attributes, entry.tool)
    if tool is None:
        raise BadLogRecord(f"{entry.agent} tool event without {entry.tool!r}")
    session = next((s for s in (_text(attributes, key) for key in entry.session) if s), None)
    if session is None:
        names = " or ".join(repr(key) for key in entry.session)
        raise BadLogRecord(f"{entry.agent} tool event without {names}")
    arguments: object = None
    for key in entry.arguments:
        value = attributes.get(key)
        if value is not None and value != "":
            arguments = value
            break
    if entry.agent == "claude-code" and tool == _CLAUDE_MCP_TOOL:
        tool = _claude_mcp_name(attributes.get("tool_parameters")) or tool
    success = _success(attributes, entry.success)
    error = None if success is None else not success
    if entry.agent == "gemini-cli" and attributes.get("decision") == "reject":
        error = True  # the user refused it: it did not run
    duration = _duration(attributes, entry.duration_ms)
    result = attributes.get(entry.result) if entry.result is not None else None
    if entry.agent == "codex":
        result = codex_output(result)
    if result is None and error:
        result = next((attributes[key] for key in entry.error if attributes.get(key)), None)
    call_id = _text(attributes, entry.call_id) if entry.call_id is not None else None
    if call_id is None and (any(times) or attributes.get("event.timestamp")):
        stamp = (
            *times,
            attributes.get("event.timestamp"),
            attributes.get("event.sequence"),
            json.dumps(arguments, default=repr, sort_keys=True),
        )
        call_id = record_call_id(entry.agent, session, tool, stamp)
    return LogToolCall(entry.agent, session, tool, arguments, call_id, error, result, duration)
