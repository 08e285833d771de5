"""The metrics recorder role: what the guard reports, and a recorder that drops it.

The guard calls a :class:`Recorder` outside its lock, on the thread of the hook or span that
caused the report. Implementations must not block or raise. A Prometheus implementation (with
the metric names of DESIGN §7) plugs in here.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NoopRecorder", "Recorder"]


class Recorder(Protocol):
    """Receives what the guard observed. Called on application threads; must not block or raise."""

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        """A tracked tool-call attempt was counted (``repeated``: its args key was seen before)."""

    def wasted(self, agent: str | None, tool: str, seconds: float) -> None:
        """A repeated call finished after ``seconds``."""

    def decision(self, agent: str | None, tool: str, rule: str, action: str, count: int) -> None:
        """A non-allow decision was made (``action`` as detected, before the mode softened it)."""

    def rescue(self, outcome: str) -> None:
        """A rescue was attempted: advice, cached, failed, budget or cooldown."""

    def evicted(self, reason: str) -> None:
        """A session was evicted: ttl or capacity."""

    def internal_error(self, where: str) -> None:
        """An exception was caught at ``where`` and a fallback taken."""


class NoopRecorder:
    """A recorder that records nothing (the default when metrics are off)."""

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        pass

    def wasted(self, agent: str | None, tool: str, seconds: float) -> None:
        pass

    def decision(self, agent: str | None, tool: str, rule: str, action: str, count: int) -> None:
        pass

    def rescue(self, outcome: str) -> None:
        pass

    def evicted(self, reason: str) -> None:
        pass

    def internal_error(self, where: str) -> None:
        pass
