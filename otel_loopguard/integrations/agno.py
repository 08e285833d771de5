"""Agno: a tool hook (Agno's middleware around each tool call).

::

    from agno.agent import Agent
    from otel_loopguard.integrations.agno import LoopGuardToolHook

    agent = Agent(model=model, tools=[search], tool_hooks=[LoopGuardToolHook(guard)])

The hook runs around each call (sync and async runs alike: in an async run it hands Agno a
coroutine that finishes the call). It asks the guard; a blocked call is answered with the
guard's message without calling the tool: the model reads it as the tool result. After a call it
reports the result and appends a reminder to a string result; a tool that raised is reported as
failed and its exception passes on (Agno hands the model the error). A stop ends the run
(``on_stop="end"``, default): the hook raises Agno's ``StopAgentRun(message)``, so the run ends
without another model call, with the stop text as the last (tool) message. A stop the guard
concludes from a call's result (``phase`` post, e.g. the same call failing the same way again)
ends it the same way, after the call; with ``on_stop="message"`` the model reads the stop text.

Agno's hooks see no call id: a call is matched to its result by its arguments. With
``processor=`` (on the provider OpenInference's Agno instrumentation writes to), the hook runs
inside the tool span and asks with the processor's keys; each call counts once (the hook reports
before the tool span ends; a blocked call has a tool span too, whose result is the guard's
message). Session otherwise: the run's ``session_id``; the agent label is the agent's (or
team's) name. Each run starts a new progress epoch, and its last user message (in the run's
messages Agno hands the hook) is what an advisor is told the agent's task is. The hook runs on
the agent's thread or event loop and never raises except to end a run on stop.
"""

from __future__ import annotations

from collections.abc import Callable
from inspect import isawaitable
from typing import TYPE_CHECKING, Any

from .._guard import LoopGuard
from .._policy import Action, Decision
from ._hook import OnStop, Ticket, ToolHook, missing_framework

try:
    from agno.exceptions import StopAgentRun
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("agno", "Agno", "agno") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["LoopGuardToolHook"]


class LoopGuardToolHook:
    """For ``Agent(tool_hooks=[...])`` (or a Team's, or ``@tool(tool_hooks=[...])``): enforces
    the guard's decisions. Put it first, so it sees every call. Options as in
    :mod:`otel_loopguard.integrations`."""

    def __init__(
        self,
        guard: LoopGuard | None = None,
        *,
        processor: LoopGuardSpanProcessor | None = None,
        session: str | Callable[[], str] | None = None,
        agent: str | None = None,
        append_reminders: bool = True,
        on_stop: OnStop = "end",
    ) -> None:
        self.hook = ToolHook(
            guard,
            processor=processor,
            session=session,
            agent=agent,
            append_reminders=append_reminders,
            on_stop=on_stop,
        )
        self.guard = self.hook.guard

    def __call__(
        self,
        function_name: str,
        function_call: Callable[..., Any],
        arguments: dict[str, Any],
        agent: Any = None,
        team: Any = None,
        run_context: Any = None,
    ) -> Any:
        """Agno passes the parameters by name (``agent``, ``team`` and ``run_context`` when the
        hook declares them)."""
        owner = agent if agent is not None else team
        name = getattr(owner, "name", None)
        session = getattr(run_context, "session_id", None)
        keys = self.hook.keys(
            str(session) if session is not None else None, name if isinstance(name, str) else None
        )
        self.hook.run_marker(keys, getattr(run_context, "run_id", None), self._prompt(run_context))
        ticket = self.hook.before(function_name, dict(arguments or {}), None, keys)
        decision = ticket.decision
        if decision.blocks:
            if decision.action is Action.STOP:
                raise StopAgentRun(decision.message)
            return decision.message
        try:
            result = function_call(**(arguments or {}))
        except Exception as error:
            self._failed(ticket, error)
            raise
        if isawaitable(result):
            return self._finish_async(ticket, result)
        return self._finish(ticket, result)

    def _prompt(self, run_context: Any) -> str | None:
        """The run's prompt: the text of the last user message in ``run_context.messages`` (the
        run's live message list Agno hands tool hooks), or ``None``."""
        try:
            for message in reversed(getattr(run_context, "messages", None) or ()):
                if getattr(message, "role", None) == "user":
                    return _text(getattr(message, "content", None))
        except Exception as exc:  # never let the prompt break the agent
            self.guard.report_internal_error("integration.agno.prompt", exc)
        return None

    async def _finish_async(self, ticket: Ticket, pending: Any) -> Any:
        try:
            result = await pending
        except Exception as error:
            self._failed(ticket, error)
            raise
        return self._finish(ticket, result)

    def _finish(self, ticket: Ticket, result: Any) -> Any:
        post = self.hook.after(ticket, result=result)
        if self.hook.ends_run(post):
            raise _stop(post)
        if isinstance(result, str):
            return self.hook.with_reminder(ticket, result, post)
        return result

    def _failed(self, ticket: Ticket, error: Exception) -> None:
        """The tool raised ``error``: report it; a stop concluded from it ends the run."""
        post = self.hook.after(ticket, result=str(error), error=True)
        if self.hook.ends_run(post):
            raise _stop(post) from error


def _text(content: object) -> str | None:
    """A message's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [
        part if isinstance(part, str) else part.get("text")
        for part in content
        if isinstance(part, (str, dict))
    ]
    return "\n".join(text for text in texts if isinstance(text, str)) or None


def _stop(decision: Decision) -> StopAgentRun:
    return StopAgentRun(decision.message)
