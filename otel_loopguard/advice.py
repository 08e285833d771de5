"""Advice from a stronger model when a loop is denied: the :class:`Advisor` protocol, the
request it is given, and :class:`CommandAdvisor`, which runs a command.

Not on the span hot path: the guard asks advisors on a worker thread (see ``LoopGuard``).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    import subprocess

__all__ = ["MAX_ADVICE_CHARS", "AdviceRequest", "Advisor", "AdvisorError", "CommandAdvisor"]

#: Advice longer than this is cut (hosts cap what they show; the model needs the gist).
MAX_ADVICE_CHARS: Final = 4000


@dataclass(frozen=True, slots=True)
class AdviceRequest:
    """What an advisor is told about a loop (arguments only as the bounded preview)."""

    session: str
    tool: str
    arguments_preview: str
    count: int
    rule: str
    denial: str
    recent_calls: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "session": self.session,
                "tool": self.tool,
                "arguments_preview": self.arguments_preview,
                "count": self.count,
                "rule": self.rule,
                "denial": self.denial,
                "recent_calls": list(self.recent_calls),
            }
        )


class AdvisorError(RuntimeError):
    """An advisor could not give advice (the reason is in the message)."""


class Advisor(Protocol):
    """A stronger model asked for advice when a loop is denied.

    Called on a guard worker thread, never on a span processor's thread; may block up to the
    policy's ``advisor_timeout_seconds`` (a hook waits that long at most). Returns the advice
    text, or ``None``/raises :class:`AdvisorError` when it has none.
    """

    def __call__(self, request: AdviceRequest) -> str | None: ...


class CommandAdvisor:
    """An advisor that runs a command: one argv string (split like a shell, never run by one),
    the request as JSON on stdin, advice on stdout, exit 0. Anything else means unavailable.

    On timeout the command and every process it started (its process group) are killed.
    """

    def __init__(self, command: str, timeout_seconds: float = 30.0) -> None:
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ValueError(f"advisor_command: {command!r} cannot be split: {exc}") from None
        if not argv:
            raise ValueError(f"advisor_command: {command!r} is empty")
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds: expected a number > 0, got {timeout_seconds!r}")
        self.argv: Sequence[str] = argv
        self.timeout_seconds = timeout_seconds

    def __repr__(self) -> str:
        return f"CommandAdvisor({shlex.join(self.argv)!r}, timeout_seconds={self.timeout_seconds})"

    def __call__(self, request: AdviceRequest) -> str:
        import subprocess  # here: few processes ever ask, and hook processes start per call

        try:
            process = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise AdvisorError(f"advisor command {self.argv[0]!r} could not start: {exc}") from None
        try:
            stdout, _ = process.communicate(request.to_json().encode(), timeout=self.timeout_seconds)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise AdvisorError(
                f"advisor command {self.argv[0]!r} timed out after {self.timeout_seconds}s"
                " and was killed"
            ) from None
        if process.returncode != 0:
            raise AdvisorError(
                f"advisor command {self.argv[0]!r} exited with {process.returncode}"
            )
        advice = stdout.decode("utf-8", "replace").strip()
        if not advice:
            raise AdvisorError(f"advisor command {self.argv[0]!r} printed no advice")
        return advice[:MAX_ADVICE_CHARS]


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    import signal
    import subprocess

    try:
        if hasattr(os, "killpg"):
            os.killpg(process.pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows
            process.kill()
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - a grandchild escaped the group
        process.kill()
