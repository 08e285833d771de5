"""What ``serve`` logs, and how: one line per decision, as text or as JSON.

Everything goes through the standard :mod:`logging` package, under the ``otel_loopguard``
logger (decisions and the service's own lines under ``otel_loopguard.serve``), so a host
program that embeds :class:`~otel_loopguard.service.Service` routes them as it routes any
other log. ``otel-loopguard serve`` installs one handler on stderr (:func:`install`):

- ``--log-format text`` (default): ``TIME LEVEL LOGGER: MESSAGE``; a decision's message
  carries its fields as ``key=value``.
- ``--log-format json``: one JSON object per line with ``time`` (UTC, ISO 8601), ``level``,
  ``logger`` and ``message``, plus a decision's fields as top-level keys (:class:`JsonFormatter`).

Decisions (:func:`log_decision`): a decision where the guard detected something (a reminder, a
denial, a rescue, a stop; also in ``observe`` mode, where the action is allow) is one line at
INFO; a plain allow is one line at DEBUG. The line names where the call came from (``span``:
an ingested tool span; ``api``: a decision request), the session, agent, tool, action (and
what was detected, when the mode softened it), rule, count, threshold, signature and phase.
Never the call's arguments or result.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Final, TextIO

import orjson

from otel_loopguard._attributes import Shape, decision_attributes, log_fields_of_answer
from otel_loopguard._policy import Action, Decision

__all__ = [
    "DECISION_LOGGER",
    "FIELDS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "JsonFormatter",
    "answer_fields",
    "decision_fields",
    "install",
    "log_decision",
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
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT_FORMAT)
    )
    root = logging.getLogger("otel_loopguard")
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False  # one line per record, whatever the host's root logger does
    return handler


def uninstall(handler: logging.Handler) -> None:
    """Undo :func:`install`."""
    root = logging.getLogger("otel_loopguard")
    root.removeHandler(handler)
    root.setLevel(logging.NOTSET)
    root.propagate = True


def decision_fields(
    source: str, decision: Decision, session: str, agent: str | None, tool: str
) -> dict[str, object]:
    """The fields of a decision's log line (``session``, ``agent`` and ``tool`` as the caller
    named them: a first allow carries none of its own)."""
    return decision_attributes(
        decision, Shape.LOG, source=source, session=session, agent=agent, tool=tool
    )


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
            f"{key}={value}"
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


def wants_allow_lines() -> bool:
    """Whether plain allows are logged (DEBUG): callers skip building their fields otherwise."""
    return _log.isEnabledFor(logging.DEBUG)
