"""What ``serve`` logs, and how: one line per decision, as text or as JSON.

Everything goes through the standard :mod:`logging` package, under the ``otel_loopguard``
logger (decisions and the service's own lines under ``otel_loopguard.serve``), so a host
program that embeds :class:`~otel_loopguard.service.Service` routes them as it routes any
other log. ``otel-loopguard serve`` installs one handler on stderr (:func:`install`):

- ``--log-format text`` (default): ``TIME LEVEL LOGGER: MESSAGE``; a decision's message
  carries its fields as ``key=value`` (a value with a space, ``=`` or ``"`` in it, or empty, as a
  JSON string). Control characters anywhere in a line (``\\n``, ``\\r``, ESC, NUL, DEL, the C1
  range and U+2028/U+2029) are written escaped (``\\n``, ``\\x1b``, ``\\u2028``), so a
  session id or tool name cannot start a line of its own or move the terminal's cursor
  (:class:`TextFormatter`); a traceback's lines are indented.
- ``--log-format json``: one JSON object per line with ``time`` (UTC, ISO 8601), ``level``,
  ``logger`` and ``message``, plus a decision's fields as top-level keys (:class:`JsonFormatter`).

Decisions (:func:`log_decision`): a decision where the guard detected something (a reminder, a
denial, a rescue, a stop; also in ``observe`` mode, where the action is allow) is one line at
INFO; a plain allow is one line at DEBUG. The line names where the call came from (``span``:
an ingested tool span; ``api``: a decision request), the session, agent, tool, action (and
what was detected, when the mode softened it), rule, count, threshold, signature and phase,
and the call's ``trace_id`` and ``span_id`` when it has them (a span: the tool span's; a decision
request: its body's ``trace_id`` and ``span_id``, else its W3C ``traceparent`` header), the same
ids as the exemplars of the metrics it counted. Never the call's arguments or result.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any, Final, TextIO

import orjson

from otel_loopguard._attributes import Shape, decision_attributes, log_fields_of_answer
from otel_loopguard._exemplars import exemplar_labels
from otel_loopguard._lazy import LOGGER_NAME
from otel_loopguard._policy import Action, Decision

__all__ = [
    "DECISION_LOGGER",
    "FIELDS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "JsonFormatter",
    "TextFormatter",
    "answer_fields",
    "decision_fields",
    "escape_controls",
    "install",
    "log_decision",
    "trace_fields",
    "uninstall",
    "wants_allow_lines",
]

#: The logger of decisions and of the service's own lines.
DECISION_LOGGER: Final = "otel_loopguard.serve"
#: ``--log-level`` choices, quietest last.
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
#: ``--log-format`` choices.
LOG_FORMATS: Final = ("text", "json")
#: The attribute of a log record that carries its structured fields (``extra={FIELDS: {...}}``).
FIELDS: Final = "loopguard"
_TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_log = logging.getLogger(DECISION_LOGGER)

#: Control characters (C0, DEL, C1) and the Unicode line and paragraph separators, escaped.
_ESCAPES: Final = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))},
    0x09: "\\t",
    0x0A: "\\n",
    0x0D: "\\r",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def escape_controls(text: str) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``)."""
    return text.translate(_ESCAPES)


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE`` with every control character escaped
    (:func:`escape_controls`): one record is one line, whatever its fields hold. A traceback
    (ours) keeps its lines, each indented, with their control characters escaped
    too."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("    " + escape_controls(line) for line in text.splitlines())


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601 with milliseconds), ``level``
    (lower case), ``logger``, ``message``, the record's structured fields (``extra={"loopguard":
    {...}}``) as top-level keys (they never replace the four above), and ``exception`` with the
    traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.gmtime(record.created)
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", seconds) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, Mapping):
            for key, value in fields.items():
                entry.setdefault(str(key), value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def install(level: str, log_format: str, stream: TextIO) -> logging.Handler:
    """Send the ``otel_loopguard`` logs at ``level`` and above to ``stream`` as ``log_format``
    says; returns the handler (remove it with :func:`uninstall`). Raises ``ValueError`` naming
    a bad level or format."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log_level: expected one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if log_format not in LOG_FORMATS:
        raise ValueError(
            f"log_format: expected one of {', '.join(LOG_FORMATS)}, got {log_format!r}"
        )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger(LOGGER_NAME)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False  # one line per record, whatever the host's root logger does
    return handler


def uninstall(handler: logging.Handler) -> None:
    """Undo :func:`install`."""
    root = logging.getLogger(LOGGER_NAME)
    root.removeHandler(handler)
    root.setLevel(logging.NOTSET)
    root.propagate = True


def decision_fields(
    source: str,
    decision: Decision,
    session: str,
    agent: str | None,
    tool: str,
    ids: tuple[int, int] | None = None,
) -> dict[str, object]:
    """The fields of a decision's log line (``session``, ``agent`` and ``tool`` as the caller
    named them: a first allow carries none of its own), with the call's ``trace_id`` and
    ``span_id`` when ``ids`` gives them (:func:`trace_fields`)."""
    fields = decision_attributes(
        decision, Shape.LOG, source=source, session=session, agent=agent, tool=tool
    )
    if ids is not None:
        fields.update(trace_fields(ids))
    return fields


def trace_fields(ids: tuple[int, int] | None) -> dict[str, str]:
    """A decision's ``trace_id`` (32 hex digits) and ``span_id`` (16), the same ids as its
    metrics' exemplars, so that a logs backend links the line to its trace; empty without."""
    return {} if ids is None else exemplar_labels(ids)


def answer_fields(answer: Mapping[str, object], agent: str | None) -> dict[str, object]:
    """The fields of a decision's log line from the decision API's answer
    (:func:`~otel_loopguard.service._decisions.decision_json`) and the request's ``agent``."""
    return log_fields_of_answer(answer, agent)


def log_decision(fields: Mapping[str, object]) -> None:
    """One line for one decision (:func:`decision_fields`): INFO when something was detected,
    DEBUG for a plain allow. Never raises."""
    try:
        level = logging.INFO if fields.get("detected") != Action.ALLOW.value else logging.DEBUG
        if not _log.isEnabledFor(level):
            return
        action, detected = fields.get("action"), fields.get("detected")
        shown = action if action == detected else f"{action} (detected {detected})"
        details = " ".join(
            f"{key}={_shown(value)}"
            for key, value in fields.items()
            if key not in ("source", "action", "detected") and value is not None
        )
        _log.log(
            level,
            "%s decision: %s %s",
            fields.get("source"),
            shown,
            details,
            extra={FIELDS: fields},
        )
    except Exception:  # pragma: no cover - a log line must never break a decision
        pass


def _shown(value: object) -> str:
    """A field's value in a text line: as is, or as a JSON string when it has a space, ``=`` or
    ``"`` in it (so it cannot pass for further fields), or is empty."""
    text = str(value)
    if not text or _QUOTED(text) is not None:
        return orjson.dumps(text).decode()
    return text


#: What makes :func:`_shown` quote a value (``\s`` is ``str.isspace``: both are
#: ``Py_UNICODE_ISSPACE``); one search instead of a test per character.
_QUOTED: Final = re.compile(r'[\s="]').search


def wants_allow_lines() -> bool:
    """Whether plain allows are logged (DEBUG): callers skip building their fields otherwise."""
    return _log.isEnabledFor(logging.DEBUG)
