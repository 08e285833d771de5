"""The trip log: one JSON line per non-allow decision, from every entrance.

Each line: ``time`` (RFC 3339, UTC), ``session``, ``agent``, ``tool``, ``rule``, ``action`` (as
detected, before the mode softened it), ``kind``, ``mode``, ``count``, ``threshold``,
``signature`` (12 hex), and ``arguments`` (the canonical arguments, cut to the preview length)
only when ``trip_log_arguments`` is on.

``kind`` is the rescue plugin's name for the line: the action (``remind``, ``deny``, ``rescue``,
``stop``), or ``escalation-failed`` when the advisor was asked and gave no advice (the call got
the local denial: ``action`` is then ``deny``; for an ask nobody waited for, a line of its own
after the decision's ``deny`` line). The path may start with ``~`` (the home directory). Lines
are appended with one ``write`` each, under a lock, so concurrent threads never interleave them.

A missing directory is created (private to its owner). A write failure (unwritable path,
full disk) is counted in :attr:`TripLog.failures` and logged
once; it never raises into the caller.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timezone
from pathlib import Path

import orjson

from ._lazy import logger

__all__ = ["TripLog"]


class TripLog:
    """Appends trip lines to ``path`` (opened per write batch; safe across processes that
    append to the same file, since each line is one ``O_APPEND`` write)."""

    def __init__(self, path: str | os.PathLike[str], *, arguments: bool = False) -> None:
        text = os.fspath(path)
        if not text:
            raise ValueError("trip_log_path: expected a file path, got ''")
        self.path = Path(text).expanduser()
        self.arguments = arguments
        self.failures = 0
        self.written = 0
        self._lock = threading.Lock()
        self._warned = False

    def write(
        self,
        *,
        session: str,
        agent: str | None,
        tool: str,
        rule: str | None,
        action: str,
        mode: str,
        count: int,
        threshold: int,
        signature: str,
        arguments: str | None = None,
        kind: str | None = None,
        trace_id: str | None = None,
        span_id: str | None = None,
        loop_tokens: int | None = None,
        loop_cost_usd: float | None = None,
    ) -> None:
        """Append one trip line (``kind`` defaults to ``action``; ``trace_id`` and ``span_id``,
        of the call decided, only when it has them, so a logs backend links the line to its
        trace; ``loop_tokens`` and ``loop_cost_usd``, what the loop has used, only when
        known). Never raises."""
        record: dict[str, object] = {
            "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "session": session,
            "agent": agent,
            "tool": tool,
            "rule": rule,
            "action": action,
            "kind": kind or action,
            "mode": mode,
            "count": count,
            "threshold": threshold,
            "signature": signature,
        }
        if self.arguments and arguments is not None:
            record["arguments"] = arguments
        if loop_tokens is not None:
            record["loop_tokens"] = loop_tokens
        if loop_cost_usd is not None:
            record["loop_cost_usd"] = loop_cost_usd
        if trace_id is not None and span_id is not None:
            record["trace_id"] = trace_id
            record["span_id"] = span_id
        try:
            line = orjson.dumps(record) + b"\n"
            with self._lock:
                try:
                    descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                except FileNotFoundError:
                    # A missing directory (~/.llmbox on a fresh machine) is made, private.
                    self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(descriptor, line)
                finally:
                    os.close(descriptor)
                self.written += 1
        except Exception as exc:  # an observability side channel must never break the caller
            with self._lock:
                self.failures += 1
                warn, self._warned = not self._warned, True
            if warn:
                logger().warning(
                    "loopguard trip log %s not written: %s (further failures are"
                    " counted, not logged)",
                    self.path,
                    exc,
                )
