"""The policy ladder: from the rules' evidence to a :class:`Decision` with the text for the model.

Exceptions, in one place::

    LoopDetected (RuntimeError)     raised by guard.wrap(...) tools when a call is blocked
    AdvisorError (RuntimeError)     raised by an advisor that could not give advice; the guard
                                    catches it, refunds the budget and falls back to a denial

Pure except for :class:`CommandAdvisor`, which runs a process (off the span hot path; see guard).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    import subprocess

from .config import Policy, Rule
from .rules import Trend, Verdict

__all__ = [
    "ALLOW",
    "Action",
    "AdviceRequest",
    "Advisor",
    "AdvisorError",
    "CommandAdvisor",
    "Decision",
    "LoopDetected",
    "MAX_ADVICE_CHARS",
    "Step",
    "arguments_preview",
    "climb",
    "message_for",
]

#: Advice longer than this is cut (hosts cap what they show; the model needs the gist).
MAX_ADVICE_CHARS: Final = 4000
_PREFIX: Final = "[loopguard] "


class Action(str, Enum):
    """What should happen to a tool call; values are the wire strings."""

    ALLOW = "allow"
    REMIND = "remind"
    DENY = "deny"
    RESCUE = "rescue"
    STOP = "stop"


_BLOCKING: Final = frozenset({Action.DENY, Action.RESCUE, Action.STOP})


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to "may this call run?".

    ``action`` is what the caller should do (already softened by the mode); ``detected`` is what
    the ladder reached before the mode was applied (equal in ``enforce`` mode). ``message`` is the
    text for the model (empty for allow). ``count`` is the evidence count of ``rule`` including
    this attempt; ``threshold`` the threshold the action was reached at; ``signature`` the
    12-hex display prefix of the args key; ``repeated`` whether the args key was already seen in
    this epoch.
    """

    action: Action
    message: str = ""
    rule: Rule | None = None
    count: int = 0
    threshold: int = 0
    signature: str = ""
    tool: str = ""
    session: str = ""
    repeated: bool = False
    detected: Action = Action.ALLOW

    @property
    def blocks(self) -> bool:
        """True when the call must not run (deny, rescue, stop)."""
        return self.action in _BLOCKING


#: The decision for untracked calls and for every internal fallback.
ALLOW: Final = Decision(Action.ALLOW)


class LoopDetected(RuntimeError):
    """A tool call was blocked by the guard.

    Carries ``code`` (the action's wire string: deny, rescue or stop), ``tool``, ``count``,
    ``threshold``, ``signature`` (12-hex prefix) and ``session`` — never the arguments, so it can
    be logged and reported safely. ``message`` is the text meant for the model.
    """

    def __init__(self, decision: Decision) -> None:
        self.code = decision.action.value
        self.tool = decision.tool
        self.count = decision.count
        self.threshold = decision.threshold
        self.signature = decision.signature
        self.session = decision.session
        self.message = decision.message
        rule = decision.rule.value if decision.rule else "none"
        super().__init__(
            f"loop detected ({self.code}): tool {self.tool!r} count {self.count}"
            f" threshold {self.threshold} rule {rule} signature {self.signature}"
            f" session {self.session!r}"
        )


@dataclass(frozen=True, slots=True)
class Step:
    """Where the evidence stands on the ladder: the action and why."""

    action: Action
    rule: Rule | None = None
    count: int = 0
    threshold: int = 0
    #: Reminder flavour: gentle (first threshold), detailed (later), polling (spared by outcome).
    detailed: bool = False
    polling: bool = False
    #: Why a stop: the stall rule, or denials that the agent kept retrying.
    denials: int = 0


_ALLOW_STEP: Final = Step(Action.ALLOW)


def climb(
    verdict: Verdict | None,
    stalled: Verdict | None,
    outcome_trend: Trend,
    *,
    denials: int,
    stopped: bool,
    policy: Policy,
    stuck: Verdict | None = None,
) -> Step:
    """Place the evidence on the ladder (pure). ``verdict`` is the strongest signature rule's,
    ``stuck`` the no_progress rule's (same outcome), ``stalled`` the stall rule's.

    1. A session already told to stop, or a stall verdict, gives stop.
    2. A call is blocked when the same outcome came back often enough (``stuck`` reaches
       ``no_progress_threshold``: the strongest evidence, so the earliest block), or from
       ``deny_threshold`` on when there is no sign of progress (same or unknown outcome); a call
       whose outcome keeps changing (polling) is spared until ``poll_limit``.
    3. A blocked call becomes stop once ``stop_after_denials`` attempts were already denied in the
       epoch, rescue from ``rescue_threshold`` on, else deny.
    4. Otherwise a reminder at each of ``remind_thresholds`` and on every call past the last one
       (and on spared polls); gentle at the first threshold, detailed later.
    """
    if stopped:
        return Step(Action.STOP, verdict.rule if verdict else None,
                    verdict.count if verdict else 1, policy.stop_after_denials or 0,
                    denials=denials)
    if stalled is not None:
        return Step(Action.STOP, Rule.STALL, stalled.count, policy.stall_threshold)
    if verdict is None:
        return _ALLOW_STEP
    count = verdict.count
    allow = Step(Action.ALLOW, verdict.rule, count)
    deny = policy.deny_threshold
    stuck_limit = policy.no_progress_threshold
    polling = False
    block: Verdict | None = None
    threshold = 0
    if stuck is not None and stuck_limit is not None and stuck.count >= stuck_limit:
        block, threshold = stuck, stuck_limit
    elif deny is not None and count >= deny:
        spared = (
            outcome_trend is Trend.CHANGING
            and policy.poll_limit is not None
            and count < policy.poll_limit
        )
        if spared:
            polling = True
        else:
            block, threshold = verdict, deny
    if block is not None:
        stop_after = policy.stop_after_denials
        if stop_after is not None and denials >= stop_after:
            return Step(Action.STOP, block.rule, block.count, stop_after, denials=denials)
        rescue = policy.rescue_threshold
        if rescue is not None and count >= rescue:
            return Step(Action.RESCUE, block.rule, block.count, rescue)
        return Step(Action.DENY, block.rule, block.count, threshold)
    thresholds = policy.remind_thresholds
    if not thresholds and not polling:
        return allow
    if polling or count in thresholds or count > thresholds[-1]:
        detailed = polling or count > thresholds[0]
        reached = deny if polling and deny else max(t for t in thresholds if t <= count)
        return Step(Action.REMIND, verdict.rule, count, reached, detailed=detailed, polling=polling)
    return allow


def arguments_preview(canonical: bytes, limit: int) -> str:
    """The canonical arguments as text, cut to ``limit`` characters with ``… (+N more chars)``."""
    text = canonical.decode("utf-8", "replace")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit} more chars)"


def _scope(rule: Rule | None, count: int, policy: Policy) -> str:
    times = "once" if count == 1 else f"{count} times"
    if rule is Rule.CONSECUTIVE:
        return f"{times} in a row"
    if rule is Rule.WINDOW:
        return f"{times} within your last {policy.window_size} tool calls"
    if rule is Rule.NO_PROGRESS:
        return f"{times}, and it returned the same result each time"
    return times


def message_for(step: Step, tool: str, canonical: bytes, policy: Policy, advice: str | None = None,
                action: Action | None = None) -> str:
    """The text shown to the model for ``step`` (``action`` overrides the step's action, e.g. a
    blocking step softened to a reminder in advise mode)."""
    shown = action or step.action
    if shown is Action.ALLOW:
        return ""
    name = f"`{tool}`"
    scope = _scope(step.rule, step.count, policy)
    if step.action is Action.STOP and shown is Action.STOP:
        if step.rule is Rule.STALL:
            return (
                f"{_PREFIX}Stopping: {step.count} of your tool calls since the last change repeated"
                " earlier calls, with no edit or new input in between, so the run is not making"
                " progress. End this run now: tell the user what you tried, what you found, and"
                " what is blocking you. They can continue by sending a new message."
            )
        this_call = f" ({name} with the same arguments, {scope})" if step.rule else ""
        return (
            f"{_PREFIX}Stopping: calls were refused {step.denials} times since the last change"
            f" and retried anyway{this_call}. End this run now: tell the user what you tried,"
            " what you found, and what is blocking you. They can continue by sending a new"
            " message."
        )
    preview = arguments_preview(canonical, policy.arguments_preview_chars)
    if shown in (Action.DENY, Action.RESCUE, Action.STOP):
        earlier = _scope(step.rule, step.count - 1, policy)
        text = (
            f"{_PREFIX}Not run: {name} with these arguments was already called {earlier}."
            f" Arguments: {preview}. It was refused so that you do not spend another call on an"
            " answer you already have. Use the earlier result, change the arguments, or take a"
            " different approach; retrying the same call will end the run."
        )
        if advice:
            text += f"\n\nAdvice from a reviewer model:\n{advice}"
        return text
    if step.polling:
        limit = policy.poll_limit
        return (
            f"{_PREFIX}{name} has now been called with the same arguments {step.count} times and"
            " its result changes each time, so this looks like polling. If you are waiting for"
            " something, wait longer between checks or tell the user what you are waiting for"
            + (f"; from call {limit} on it will be refused." if limit else ".")
        )
    if not step.detailed and step.action is Action.REMIND:
        return (
            f"{_PREFIX}You have called {name} with the same arguments {scope}. Read the last"
            " result before calling it again; if it did not help, change the arguments or the"
            " approach."
        )
    return (
        f"{_PREFIX}Repeated call: {name} with the same arguments, {scope}. Arguments: {preview}."
        " Repeating it will not give a different answer. Next: use the last result, change the"
        " arguments, try a different tool, or tell the user what is blocking you."
    )


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
