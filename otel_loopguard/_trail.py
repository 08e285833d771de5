"""What a session remembers for an advisor's question (kept only by a guard that can ask one):
the task, the latest user message and the latest calls, every text cut to its bound."""

from __future__ import annotations

from collections import deque
from typing import Final

from ._calls import MAX_TOOL_NAME_CHARS as MAX_TOOL_CHARS
from ._plain import read_count, read_list, read_optional_text, read_text

__all__ = [
    "MAX_TASK_CHARS",
    "MAX_TRAIL_ARGUMENT_CHARS",
    "MAX_TRAIL_CALLS",
    "MAX_TRAIL_OUTPUT_CHARS",
    "Trail",
    "TrailCall",
]

#: Its latest calls (oldest forgotten first), each call's canonical arguments and output cut to
#: these many characters, and the task and the latest user message cut to MAX_TASK_CHARS.
MAX_TRAIL_CALLS: Final = 8
MAX_TRAIL_ARGUMENT_CHARS: Final = 300
MAX_TRAIL_OUTPUT_CHARS: Final = 1000
MAX_TASK_CHARS: Final = 2000
_MAX_KEY_CHARS: Final = 64


class TrailCall:
    """One remembered call, or a run of the same call repeated back to back: tool, cut
    canonical arguments, args key, how the latest attempt ended (``"ok"``, ``"error"``,
    ``"ran"`` (failure unknown), ``"refused"``, or ``None`` while unknown), the latest cut
    output, the attempts in the run (``times``) and how many of them were refused."""

    __slots__ = ("arguments", "key", "outcome", "output", "refused", "times", "tool")

    def __init__(
        self,
        tool: str,
        arguments: str,
        key: str,
        outcome: str | None,
        output: str | None,
        times: int = 1,
        refused: int = 0,
    ) -> None:
        self.tool = tool
        self.arguments = arguments
        self.key = key
        self.outcome = outcome
        self.output = output
        self.times = times
        self.refused = refused


class Trail:
    """What a session remembers so that an advisor can be asked a real question: the task,
    the latest user message and the latest :data:`MAX_TRAIL_CALLS` calls, every text cut to
    its bound (a session's trail stays under about 17k characters, tool names included)."""

    __slots__ = ("calls", "latest_message", "task")

    def __init__(self) -> None:
        self.calls: deque[TrailCall] = deque(maxlen=MAX_TRAIL_CALLS)  # the oldest falls out
        self.task: str | None = None
        self.latest_message: str | None = None

    def add(
        self,
        tool: str,
        arguments: str,
        key: str,
        outcome: str | None,
        output: str | None,
        times: int = 1,
        refused: int = 0,
    ) -> None:
        """Remember a call: a repeat of the latest one adds to its run (so a loop does not push
        the calls before it out); another starts an entry (the oldest is forgotten beyond the
        bound)."""
        calls = self.calls
        if output is not None:
            output = output[:MAX_TRAIL_OUTPUT_CHARS]
        if calls and calls[-1].key == key:
            last = calls[-1]
            last.times += times
            last.refused += refused if outcome != "refused" else max(refused, 1)
            last.outcome = outcome
            if output is not None:
                last.output = output
            return
        if outcome == "refused":
            refused = max(refused, 1)
        calls.append(
            TrailCall(
                tool, arguments[:MAX_TRAIL_ARGUMENT_CHARS], key, outcome, output, times, refused
            )
        )

    def settle(self, key: str, outcome: str, output: str | None) -> None:
        """Give the latest call of ``key`` still without an outcome its outcome and output."""
        for call in reversed(self.calls):
            if call.key == key and call.outcome is None:
                call.outcome = outcome
                if output is not None:
                    call.output = output[:MAX_TRAIL_OUTPUT_CHARS]
                return

    def latest_output(self, key: str) -> str | None:
        """The output of the latest remembered call of ``key`` that has one."""
        for call in reversed(self.calls):
            if call.key == key and call.output is not None:
                return call.output
        return None

    def user_message(self, text: str) -> None:
        """A user message: the task if none is known yet, else the latest message."""
        text = text[:MAX_TASK_CHARS]
        if self.task is None:
            self.task = text
        else:
            self.latest_message = text

    def new_task(self, text: str) -> None:
        """A run's prompt: the task from now on."""
        self.task = text[:MAX_TASK_CHARS]
        self.latest_message = None

    def to_json(self) -> dict[str, object]:
        return {
            "task": self.task,
            "latest": self.latest_message,
            "calls": [
                [c.tool, c.arguments, c.key, c.outcome, c.output, c.times, c.refused]
                for c in self.calls
            ],
        }

    @classmethod
    def from_json(cls, raw: object) -> Trail:
        """Rebuild from :meth:`to_json` output, within the bounds; raises ``ValueError``."""
        if not isinstance(raw, dict):
            raise ValueError("session state: trail must be an object")
        trail = cls()
        task, latest = raw.get("task"), raw.get("latest")
        trail.task = None if task is None else read_text(task, "task")[:MAX_TASK_CHARS]
        if latest is not None:
            trail.latest_message = read_text(latest, "latest")[:MAX_TASK_CHARS]
        for entry in read_list(raw.get("calls"), "trail calls")[-MAX_TRAIL_CALLS:]:
            if not (isinstance(entry, list) and len(entry) == 7):
                raise ValueError(f"session state: bad trail entry {entry!r}")
            tool, arguments, key, outcome, output, times, refused = entry
            trail.calls.append(
                TrailCall(
                    read_text(tool, "trail tool")[:MAX_TOOL_CHARS],
                    read_text(arguments, "trail arguments")[:MAX_TRAIL_ARGUMENT_CHARS],
                    read_text(key, "trail key")[:_MAX_KEY_CHARS],
                    read_optional_text(outcome, "trail outcome"),
                    None
                    if output is None
                    else read_text(output, "trail output")[:MAX_TRAIL_OUTPUT_CHARS],
                    max(1, read_count(times, "trail times")),
                    read_count(refused, "trail refused"),
                )
            )
        return trail
