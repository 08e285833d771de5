"""The hook JSON of each host: its stdin events in, the answer it expects out. Pure: no I/O.

Facts from ``shared/reference/wire-and-hooks.md`` (checked against the hosts' own schemas):

- **Claude Code** sends ``PreToolUse`` / ``PostToolUse`` / ``PostToolUseFailure`` /
  ``UserPromptSubmit`` with ``session_id``, ``agent_id`` (sub-agents), ``tool_name``,
  ``tool_input``, ``tool_use_id``, ``tool_response``, ``error``, ``duration_ms``. A pre-tool
  answer can deny (``permissionDecision``) but carries no context for the model, so a reminder
  decided before a call is shown with its result (``PostToolUse`` ``additionalContext``).
- **Gemini CLI** sends ``BeforeTool`` / ``AfterTool`` / ``BeforeAgent`` (no call id, no agent id);
  denies with ``{"decision": "deny", "reason"}``; ``AfterTool`` takes
  ``hookSpecificOutput.additionalContext``. Reminders wait for the result, as for Claude Code.
- **Codex** sends ``PreToolUse`` / ``PostToolUse`` / ``UserPromptSubmit`` and checks answers
  against a strict schema (an unknown field fails the hook, and the tool runs). Its pre-tool
  answer takes ``additionalContext``, so a reminder goes out at once. It refuses ``continue`` and
  ``stopReason`` on ``PreToolUse`` (the whole answer is then ignored and the tool runs): a stop
  decided before a call is a denial whose text tells the model to end the run; the session stays
  stopped (every tracked call denied) until the next prompt.

Every answer is a JSON object; ``{}`` means "nothing to say" to all three. Texts are cut to
:data:`MAX_TEXT_CHARS`.

What the user must read (the hook's own configuration cannot be used, an unknown
``LOOPGUARD_*`` variable) is :attr:`Answer.notice`, shown in each host's user-visible channel:
the top-level ``systemMessage`` of all three (Claude Code's and Gemini CLI's common output
field; in Codex's strict schema on ``PreToolUse``, ``PostToolUse`` and ``UserPromptSubmit``).
Stderr is not such a channel: the hosts show it only when a hook fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Final, Protocol

from .._policy import BLOCKING_ACTIONS, Action
from .._record import FrozenRecord

__all__ = [
    "HOSTS",
    "MAX_TEXT_CHARS",
    "Answer",
    "EventKind",
    "HookEvent",
    "Host",
    "MalformedEvent",
    "cap_text",
]

#: Hosts cap hook strings at this many characters; longer texts are cut with a marker.
MAX_TEXT_CHARS: Final = 10_000
_CUT_MARKER: Final = "… (cut)"

JSONObject = dict[str, object]


class EventKind(str, Enum):
    """What a hook event means to the guard."""

    PRE_TOOL = "pre_tool"
    POST_TOOL = "post_tool"
    USER_PROMPT = "user_prompt"
    #: An event the guard has nothing to say about (answered ``{}``).
    OTHER = "other"


class MalformedEvent(ValueError):
    """Stdin JSON that is not an event this host sends (the hook then allows and says why)."""


@dataclass(frozen=True, slots=True, init=False, repr=False, eq=False)
class HookEvent(FrozenRecord):
    """One host event, reduced to what the guard needs."""

    kind: EventKind
    #: The host's own event name (echoed back as ``hookEventName``).
    name: str
    session: str = ""
    agent: str | None = None
    tool: str = ""
    arguments: object = None
    call_id: str | None = None
    result: object = None
    #: ``None``: the host does not say whether the call failed.
    error: bool | None = False
    duration_seconds: float | None = None
    #: The user's prompt (``prompt`` of a prompt event), when the host sends it.
    prompt: str | None = None
    #: The session's transcript file (``transcript_path``), when the host sends one; read for
    #: model usage where :data:`~._transcript.TRANSCRIPT_TURNS` knows the host's lines.
    transcript_path: str | None = None
    #: The model the host says it runs (Codex's ``model``), for transcript lines that do not
    #: name theirs.
    model: str | None = None
    #: The session's working directory (``cwd``, which all three hosts send): its git root is
    #: the repository scope of dead-end memory.
    cwd: str | None = None

    def __init__(
        self,
        kind: EventKind,
        name: str,
        session: str = "",
        agent: str | None = None,
        tool: str = "",
        arguments: object = None,
        call_id: str | None = None,
        result: object = None,
        error: bool | None = False,
        duration_seconds: float | None = None,
        prompt: str | None = None,
        transcript_path: str | None = None,
        model: str | None = None,
        cwd: str | None = None,
    ) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "session", session)
        object.__setattr__(self, "agent", agent)
        object.__setattr__(self, "tool", tool)
        object.__setattr__(self, "arguments", arguments)
        object.__setattr__(self, "call_id", call_id)
        object.__setattr__(self, "result", result)
        object.__setattr__(self, "error", error)
        object.__setattr__(self, "duration_seconds", duration_seconds)
        object.__setattr__(self, "prompt", prompt)
        object.__setattr__(self, "transcript_path", transcript_path)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "cwd", cwd)


@dataclass(frozen=True, slots=True, init=False, repr=False, eq=False)
class Answer(FrozenRecord):
    """What to tell the host: allow (nothing), a reminder, a denial, or stop; and the text.
    ``notice``: a line for the user (not the model), whatever the action; ``""``: none."""

    action: Action = Action.ALLOW
    message: str = ""
    notice: str = ""

    def __init__(
        self,
        action: Action = Action.ALLOW,
        message: str = "",
        notice: str = "",
    ) -> None:
        object.__setattr__(self, "action", action)
        object.__setattr__(self, "message", message)
        object.__setattr__(self, "notice", notice)


ALLOWED: Final = Answer()


def cap_text(text: str) -> str:
    """``text`` cut to :data:`MAX_TEXT_CHARS` characters, with a marker when cut."""
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[: MAX_TEXT_CHARS - len(_CUT_MARKER)] + _CUT_MARKER


class Host(Protocol):
    """One coding agent's hook contract."""

    #: The name on the command line (``otel-loopguard hook NAME``).
    name: str
    #: Whether a pre-tool answer can carry context for the model (else reminders wait for the
    #: post-tool event of the same call).
    pre_tool_context: bool
    #: The host's event names the guard acts on (install the hook for each); others get ``{}``.
    events: Mapping[str, EventKind]
    #: The top-level answer field the host shows to the user (:attr:`Answer.notice`).
    notice_field: str

    def parse(self, payload: object) -> HookEvent:
        """The event in ``payload`` (parsed stdin JSON); raises :class:`MalformedEvent`."""
        ...

    def render(self, event: HookEvent, answer: Answer) -> JSONObject:
        """The JSON object the host expects for ``answer`` to ``event``."""
        ...


def _object(payload: object) -> Mapping[str, object]:
    if not isinstance(payload, dict):
        raise MalformedEvent(f"expected a JSON object, got {type(payload).__name__}")
    return payload


def _string(payload: Mapping[str, object], name: str) -> str:
    value = payload.get(name)
    if not isinstance(value, str) or not value:
        raise MalformedEvent(f"{name}: expected a non-empty string, got {value!r}")
    return value


def _optional_string(payload: Mapping[str, object], name: str) -> str | None:
    value = payload.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MalformedEvent(f"{name}: expected a string, got {value!r}")
    return value


def _event(
    payload: object, kinds: Mapping[str, EventKind], *, agent_field: str | None
) -> tuple[Mapping[str, object], HookEvent]:
    """The fields every host shares: event name, session, agent, and for tool events the tool
    and its arguments and call id."""
    data = _object(payload)
    name = _string(data, "hook_event_name")
    kind = kinds.get(name, EventKind.OTHER)
    if kind is EventKind.OTHER:
        return data, HookEvent(EventKind.OTHER, name)
    session = _string(data, "session_id")
    agent = _optional_string(data, agent_field) if agent_field else None
    transcript = data.get("transcript_path")  # only read for usage: a bad one is no error
    transcript = transcript if isinstance(transcript, str) and transcript else None
    cwd = data.get("cwd")  # only the memory's scope: a bad one is no error
    cwd = cwd if isinstance(cwd, str) and cwd else None
    if kind is EventKind.USER_PROMPT:
        prompt = data.get("prompt")  # all three hosts send it; a missing one is no error
        return data, HookEvent(
            kind,
            name,
            session,
            agent,
            prompt=prompt if isinstance(prompt, str) and prompt else None,
            transcript_path=transcript,
            cwd=cwd,
        )
    return data, HookEvent(
        kind,
        name,
        session,
        agent,
        tool=_string(data, "tool_name"),
        arguments=data.get("tool_input"),
        call_id=_optional_string(data, "tool_use_id"),
        transcript_path=transcript,
        cwd=cwd,
    )


def _with_outcome(
    event: HookEvent, result: object, error: bool | None, duration_seconds: float | None = None
) -> HookEvent:
    return replace(event, result=result, error=error, duration_seconds=duration_seconds)


def _deny_permission(event: HookEvent, text: str) -> JSONObject:
    return {
        "hookSpecificOutput": {
            "hookEventName": event.name,
            "permissionDecision": "deny",
            "permissionDecisionReason": text,
        }
    }


def _context(event: HookEvent, text: str) -> JSONObject:
    return {"hookSpecificOutput": {"hookEventName": event.name, "additionalContext": text}}


def _stop(text: str) -> JSONObject:
    return {"continue": False, "stopReason": text}


def _blocks(action: Action) -> bool:
    return action in BLOCKING_ACTIONS


def _with_notice(host: Host, answer: Answer, rendered: JSONObject) -> JSONObject:
    """``rendered`` with the answer's notice in the host's user-visible field."""
    if not answer.notice:
        return rendered
    return {**rendered, host.notice_field: cap_text(answer.notice)}


class ClaudeCode:
    """Claude Code command hooks (``settings.json`` ``hooks``)."""

    name = "claude-code"
    pre_tool_context = False
    notice_field = "systemMessage"
    events: Mapping[str, EventKind] = {
        "PreToolUse": EventKind.PRE_TOOL,
        "PostToolUse": EventKind.POST_TOOL,
        "PostToolUseFailure": EventKind.POST_TOOL,
        "UserPromptSubmit": EventKind.USER_PROMPT,
    }

    def parse(self, payload: object) -> HookEvent:
        data, event = _event(payload, self.events, agent_field="agent_id")
        if event.kind is not EventKind.POST_TOOL:
            return event
        duration = data.get("duration_ms")
        seconds = (
            duration / 1000
            if isinstance(duration, (int, float))
            and not isinstance(duration, bool)
            and duration >= 0
            else None
        )
        if event.name == "PostToolUseFailure":
            return _with_outcome(event, data.get("error"), True, seconds)
        return _with_outcome(event, data.get("tool_response"), False, seconds)

    def render(self, event: HookEvent, answer: Answer) -> JSONObject:
        return _with_notice(self, answer, self._render(event, answer))

    def _render(self, event: HookEvent, answer: Answer) -> JSONObject:
        text = cap_text(answer.message)
        if event.kind is EventKind.PRE_TOOL and _blocks(answer.action):
            denial = _deny_permission(event, text)
            # continue:false ends the agent; the denial keeps the call from running regardless.
            return {**_stop(text), **denial} if answer.action is Action.STOP else denial
        if event.kind is EventKind.POST_TOOL:
            if answer.action is Action.STOP:
                return _stop(text)
            if answer.action is Action.REMIND:
                return _context(event, text)  # hookEventName: PostToolUse or PostToolUseFailure
        return {}


class GeminiCli:
    """Gemini CLI command hooks (``settings.json`` ``hooks``)."""

    name = "gemini-cli"
    pre_tool_context = False
    notice_field = "systemMessage"
    events: Mapping[str, EventKind] = {
        "BeforeTool": EventKind.PRE_TOOL,
        "AfterTool": EventKind.POST_TOOL,
        "BeforeAgent": EventKind.USER_PROMPT,
    }

    def parse(self, payload: object) -> HookEvent:
        data, event = _event(payload, self.events, agent_field=None)
        if event.kind is not EventKind.POST_TOOL:
            return event
        response = data.get("tool_response")
        if isinstance(response, dict):
            # {llmContent, returnDisplay, error?}: the model sees llmContent; error means failed.
            error = response.get("error")
            if error:
                return _with_outcome(event, error, True)
            return _with_outcome(event, response.get("llmContent", response), False)
        return _with_outcome(event, response, False)

    def render(self, event: HookEvent, answer: Answer) -> JSONObject:
        return _with_notice(self, answer, self._render(event, answer))

    def _render(self, event: HookEvent, answer: Answer) -> JSONObject:
        text = cap_text(answer.message)
        if event.kind is EventKind.PRE_TOOL and _blocks(answer.action):
            denial: JSONObject = {"decision": "deny", "reason": text}  # the model reads reason
            return {**denial, **_stop(text)} if answer.action is Action.STOP else denial
        if event.kind is EventKind.POST_TOOL:
            if answer.action is Action.STOP:
                return _stop(text)
            if answer.action is Action.REMIND:
                return _context(event, text)
        return {}


class Codex:
    """Codex command hooks (``hooks.json``, or ``[hooks]`` in ``config.toml``)."""

    name = "codex"
    pre_tool_context = True
    notice_field = "systemMessage"
    events: Mapping[str, EventKind] = {
        "PreToolUse": EventKind.PRE_TOOL,
        "PostToolUse": EventKind.POST_TOOL,
        "UserPromptSubmit": EventKind.USER_PROMPT,
    }

    def parse(self, payload: object) -> HookEvent:
        data, event = _event(payload, self.events, agent_field="agent_id")
        model = data.get("model")
        if isinstance(model, str) and model:
            event = replace(event, model=model)
        if event.kind is not EventKind.POST_TOOL:
            return event
        # Codex does not say whether the call failed: the outcome is the response, error unknown.
        return _with_outcome(event, data.get("tool_response"), None)

    def render(self, event: HookEvent, answer: Answer) -> JSONObject:
        return _with_notice(self, answer, self._render(event, answer))

    def _render(self, event: HookEvent, answer: Answer) -> JSONObject:
        # Only fields of Codex's strict output schema, and on PreToolUse only those it accepts
        # there (no continue/stopReason: a stop is a denial, see the module docstring).
        text = cap_text(answer.message)
        if event.kind is EventKind.PRE_TOOL:
            if _blocks(answer.action):
                return _deny_permission(event, text)
            if answer.action is Action.REMIND:
                return _context(event, text)
        if event.kind is EventKind.POST_TOOL:
            if answer.action is Action.STOP:
                return _stop(text)
            if answer.action is Action.REMIND:
                return _context(event, text)
        return {}


#: The hosts by command-line name.
HOSTS: Final[Mapping[str, Host]] = {
    host.name: host for host in (ClaudeCode(), GeminiCli(), Codex())
}
