"""Advice from a stronger model when a loop is denied: the :class:`Advisor` protocol, the
request it is given (with :meth:`AdviceRequest.question`, the question as text), and
:class:`CommandAdvisor`, which runs a command.

Not on the span hot path: the guard asks advisors on a worker thread (see ``LoopGuard``).

The question is bounded: the task and the latest user message (each up to
:data:`MAX_QUESTION_TASK_CHARS`), the refused call's arguments
(:data:`MAX_QUESTION_ARGUMENT_CHARS`) and latest output (:data:`MAX_QUESTION_OUTPUT_CHARS`), up to
eight recent calls with their arguments and outputs (:data:`MAX_RECENT_ARGUMENT_CHARS`,
:data:`MAX_RECENT_OUTPUT_CHARS` each), earlier advice (:data:`MAX_EARLIER_ADVICE_CHARS` each),
and the whole cut to :data:`MAX_QUESTION_CHARS` characters: at most 64 KiB in UTF-8, half of the
128 KiB Linux allows in one argv element.
"""

from __future__ import annotations

import json
import os
import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from ._env import policy_variable
from .config import AdvisorInput

if TYPE_CHECKING:
    import subprocess

__all__ = [
    "MAX_ADVICE_CHARS",
    "MAX_DEAD_ENDS",
    "MAX_EARLIER_ADVICE_CHARS",
    "MAX_QUESTION_ARGUMENT_CHARS",
    "MAX_QUESTION_CHARS",
    "MAX_QUESTION_OUTPUT_CHARS",
    "MAX_QUESTION_TASK_CHARS",
    "MAX_RECENT_ARGUMENT_CHARS",
    "MAX_RECENT_OUTPUT_CHARS",
    "MODEL_VARIABLE",
    "AdviceRequest",
    "Advisor",
    "AdvisorError",
    "AdvisorInput",
    "CallRecord",
    "CommandAdvisor",
]

#: Advice longer than this is cut (hosts cap what they show; the model needs the gist).
MAX_ADVICE_CHARS: Final = 4000
#: The whole question, in characters (UTF-8: at most 4 bytes each, so at most 64 KiB).
MAX_QUESTION_CHARS: Final = 16_000
#: The task and the latest user message, each.
MAX_QUESTION_TASK_CHARS: Final = 2000
#: The refused call's canonical arguments.
MAX_QUESTION_ARGUMENT_CHARS: Final = 1000
#: The refused call's latest output.
MAX_QUESTION_OUTPUT_CHARS: Final = 1000
#: Each recent call's arguments, and its output, in the list of recent calls.
MAX_RECENT_ARGUMENT_CHARS: Final = 200
MAX_RECENT_OUTPUT_CHARS: Final = 200
#: Each piece of advice already given in this epoch.
MAX_EARLIER_ADVICE_CHARS: Final = 500
#: Dead ends of earlier runs (memory) listed in a question, the most recent first.
MAX_DEAD_ENDS: Final = 10
#: The environment variable that gives a command advisor the policy's ``advisor_model``: the
#: field's own override variable (declared once, by :func:`otel_loopguard._env.policy_variable`).
MODEL_VARIABLE: Final = policy_variable("advisor_model")

_RULE_WORDS: Final = {
    "consecutive": "in a row",
    "window": "within its latest calls",
    "no_progress": "with the same result each time",
    "stall": "while most of its calls since the last change repeated earlier ones",
}


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit} more chars)"


def _one_line(text: str, limit: int) -> str:
    return _cut(" ".join(text.split()), limit)


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One recent call as the advisor sees it (or a run of it repeated back to back): tool,
    canonical arguments (cut), how the latest attempt ended (``"ok"``, ``"error"``, ``"ran"``
    when its failure is unknown, ``"refused"`` by the guard, or ``None`` when not reported), the
    latest output (cut; ``None`` when unknown), its signature (12 hex), the attempts in the run
    and how many of them were refused."""

    tool: str
    arguments: str
    outcome: str | None = None
    output: str | None = None
    signature: str = ""
    times: int = 1
    refused: int = 0


@dataclass(frozen=True, slots=True)
class AdviceRequest:
    """What an advisor is told about a loop.

    ``arguments_preview`` is the refused call's canonical arguments cut to
    :data:`MAX_QUESTION_ARGUMENT_CHARS`; ``latest_output`` its latest output (cut), when known;
    ``recent_calls`` the session's latest calls, oldest first; ``task`` the first user message
    or the run's prompt and ``latest_user_message`` a later one, when the host passed them
    (``user_message(text=...)``, ``new_run(task=...)``); ``earlier_advice`` advice already
    given in this epoch; ``refusals`` calls already refused in this epoch; ``denial`` the text
    the agent gets without advice; ``dead_ends`` the calls earlier runs of the same scope were
    refused or stopped for (memory, issue 28), one line each. :meth:`question` puts it all into
    one bounded text.
    """

    session: str
    tool: str
    arguments_preview: str
    count: int
    rule: str
    denial: str
    recent_calls: tuple[CallRecord, ...] = ()
    task: str | None = None
    latest_user_message: str | None = None
    latest_output: str | None = None
    earlier_advice: tuple[str, ...] = ()
    refusals: int = 0
    agent: str | None = None
    signature: str = ""
    model: str | None = None
    dead_ends: tuple[str, ...] = ()

    def question(self) -> str:
        """The question for the advisor, as plain text of at most :data:`MAX_QUESTION_CHARS`
        characters, without NUL characters (it may travel as one argv element)."""
        parts = [
            "An AI agent is stuck repeating tool calls, and its loop guard refused its latest"
            " call. Suggest a way out from the facts below, answering as described at the end.",
            "",
            "## The agent's task",
            _cut(self.task, MAX_QUESTION_TASK_CHARS)
            if self.task
            else "(not known: the agent's host did not pass the user's request)",
        ]
        if self.latest_user_message:
            parts += [
                "",
                "Latest user message:",
                _cut(self.latest_user_message, MAX_QUESTION_TASK_CHARS),
            ]
        rule = _RULE_WORDS.get(self.rule, "")
        parts += [
            "",
            "## The refused call",
            f"Tool: {self.tool}",
            f"Arguments: {_cut(self.arguments_preview, MAX_QUESTION_ARGUMENT_CHARS)}",
            f"Attempts: {self.count}{' ' + rule if rule else ''} (rule {self.rule or 'none'});"
            f" calls refused since the last change: {self.refusals}",
            "",
            "## Its latest output",
            _cut(self.latest_output, MAX_QUESTION_OUTPUT_CHARS)
            if self.latest_output is not None
            else "(not reported)",
        ]
        if self.recent_calls:
            parts += ["", "## Recent calls, oldest first"]
            for number, call in enumerate(self.recent_calls, 1):
                line = (
                    f"{number}. {call.tool} {_one_line(call.arguments, MAX_RECENT_ARGUMENT_CHARS)}"
                )
                if call.times > 1:
                    line += f" ({call.times} times in a row)"
                line += f" -> {call.outcome or 'not reported'}"
                if call.output:
                    latest = "latest output" if call.times > 1 else "output"
                    line += f"; {latest}: {_one_line(call.output, MAX_RECENT_OUTPUT_CHARS)}"
                parts.append(line)
            parts += ["", "## Already tried"]
            tried: Counter[tuple[str, str]] = Counter()
            refused: Counter[tuple[str, str]] = Counter()
            for call in self.recent_calls:
                tried[(call.tool, call.arguments)] += call.times
                refused[(call.tool, call.arguments)] += call.refused
            for (tool, arguments), times in tried.items():
                note = (
                    f", {refused[(tool, arguments)]} refused" if refused[(tool, arguments)] else ""
                )
                parts.append(
                    f"- {tool} {_one_line(arguments, MAX_RECENT_ARGUMENT_CHARS)}:"
                    f" {times} time{'s' if times != 1 else ''}{note}"
                )
        for advice in self.earlier_advice:
            parts.append(f"- advice already given: {_one_line(advice, MAX_EARLIER_ADVICE_CHARS)}")
        if self.dead_ends:
            parts += ["", "## Dead ends of earlier runs (refused or stopped there)"]
            parts += [
                f"- {_one_line(line, MAX_RECENT_ARGUMENT_CHARS + 120)}"
                for line in self.dead_ends[:MAX_DEAD_ENDS]
            ]
        parts += [
            "",
            "## What a good answer looks like",
            "One concrete next step the agent can take now, in at most five sentences: a"
            " different tool or different arguments, what to conclude from the output it"
            " already has, or what to ask the user. Do not suggest repeating the refused call."
            " Plain text without preamble: the agent reads it as it is, next to the refusal.",
        ]
        text = "\n".join(parts).replace("\x00", "\ufffd")
        return _cut(text, MAX_QUESTION_CHARS - 30)

    def to_json(self) -> str:
        """Every field as one JSON object, the question included (``"question"``)."""
        return json.dumps(
            {
                "session": self.session,
                "agent": self.agent,
                "tool": self.tool,
                "arguments_preview": self.arguments_preview,
                "count": self.count,
                "rule": self.rule,
                "signature": self.signature,
                "denial": self.denial,
                "task": self.task,
                "latest_user_message": self.latest_user_message,
                "latest_output": self.latest_output,
                "recent_calls": [
                    {
                        "tool": c.tool,
                        "arguments": c.arguments,
                        "outcome": c.outcome,
                        "output": c.output,
                        "signature": c.signature,
                        "times": c.times,
                        "refused": c.refused,
                    }
                    for c in self.recent_calls
                ],
                "earlier_advice": list(self.earlier_advice),
                "refusals": self.refusals,
                "model": self.model,
                "dead_ends": list(self.dead_ends),
                "question": self.question(),
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
    """An advisor that runs a command, never through a shell: ``command`` is split like a
    shell would (a word starting with ``~`` is expanded to the home directory, quoted or not).

    ``input_mode`` ``"argv"`` (the default, the rescue plugin's ``askCommand`` contract): the
    question (:meth:`AdviceRequest.question`) is one extra argv element and stdin is empty.
    ``"stdin_json"``: no extra argument; the request is one JSON object on stdin
    (:meth:`AdviceRequest.to_json`, the question included). Either way the advice is read from
    stdout, exit 0; a non-zero exit, empty stdout, a failure to start or a timeout means
    unavailable (:class:`AdvisorError`). A request's ``model`` reaches the command in the
    environment variable :data:`MODEL_VARIABLE`.

    On timeout the command and every process it started (its process group) are killed.
    """

    def __init__(
        self,
        command: str,
        timeout_seconds: float = 30.0,
        *,
        input_mode: AdvisorInput | str = AdvisorInput.ARGV,
    ) -> None:
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ValueError(f"advisor_command: {command!r} cannot be split: {exc}") from None
        if not argv:
            raise ValueError(f"advisor_command: {command!r} is empty")
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds: expected a number > 0, got {timeout_seconds!r}")
        try:
            self.input_mode = AdvisorInput(input_mode)
        except ValueError:
            choices = ", ".join(m.value for m in AdvisorInput)
            raise ValueError(f"input_mode: {input_mode!r} is not one of {choices}") from None
        self.argv: Sequence[str] = [os.path.expanduser(w) if w.startswith("~") else w for w in argv]
        self.timeout_seconds = timeout_seconds

    def __repr__(self) -> str:
        return (
            f"CommandAdvisor({shlex.join(self.argv)!r}, timeout_seconds="
            f"{self.timeout_seconds}, input_mode={self.input_mode.value!r})"
        )

    def __call__(self, request: AdviceRequest) -> str:
        import subprocess  # here: few processes ever ask, and hook processes start per call

        if self.input_mode is AdvisorInput.ARGV:
            argv, stdin, data = [*self.argv, request.question()], subprocess.DEVNULL, None
        else:
            argv, stdin, data = list(self.argv), subprocess.PIPE, request.to_json().encode()
        env = None if not request.model else {**os.environ, MODEL_VARIABLE: request.model}
        try:
            process = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        except (OSError, ValueError) as exc:
            raise AdvisorError(f"advisor command {self.argv[0]!r} could not start: {exc}") from None
        try:
            stdout, _ = process.communicate(data, timeout=self.timeout_seconds)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise AdvisorError(
                f"advisor command {self.argv[0]!r} timed out after {self.timeout_seconds}s"
                " and was killed"
            ) from None
        if process.returncode != 0:
            raise AdvisorError(f"advisor command {self.argv[0]!r} exited with {process.returncode}")
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
