"""Strands Agents: a hook provider on ``BeforeToolCallEvent`` and ``AfterToolCallEvent``.

::

    from strands import Agent
    from otel_loopguard.integrations.strands import LoopGuardHooks

    agent = Agent(model=model, tools=[search], hooks=[LoopGuardHooks(guard)])

Before each call the guard is asked; a blocked call sets ``event.cancel_tool = message``: the
tool does not run and the model reads the message as an error tool result. After a call the
result is reported and a reminder is added to its content. A stop ends the run
(``on_stop="end"``, default): the call is cancelled and ``agent.cancel(message=...,
after_current_tools=True)`` ends the invocation before the next model call, with
``stop_reason == "cancelled"`` and the stop text as the last message. A stop the guard concludes
from a call's result (``phase`` post, e.g. the same call failing the same way again) ends the
invocation the same way from ``AfterToolCallEvent`` (the call's result stays as it is); with
``on_stop="message"`` the stop text is added to the result instead.

With ``processor=`` (on the provider Strands' tracer writes to), the hooks run inside the event
loop cycle span and ask with the processor's keys; each call counts once (Strands emits no tool
span for a cancelled call, so the guard's own count is the only one there). Session otherwise:
``trace_attributes["session.id"]``, else the session manager's id, else the agent id; each
invocation starts a new progress epoch, and the text of its input's latest user message
(``BeforeInvocationEvent.messages``) is what an advisor is told the task is. Hooks run on the
agent's event loop and never raise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._guard import LoopGuard
from .._policy import Action
from ._hook import OnStop, Ticket, ToolHook, missing_framework

try:
    from strands.hooks import (
        AfterToolCallEvent,
        BeforeInvocationEvent,
        BeforeToolCallEvent,
        HookProvider,
        HookRegistry,
    )
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("strands", "Strands Agents", "strands") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["LoopGuardHooks"]


def _framework_keys(agent: Any) -> tuple[str | None, str | None]:
    attributes = getattr(agent, "trace_attributes", None) or {}
    session = attributes.get("session.id")
    if session is None:
        manager = getattr(agent, "_session_manager", None) or getattr(
            agent, "session_manager", None
        )
        session = getattr(manager, "session_id", None)
    if session is None:
        agent_id = getattr(agent, "agent_id", None)
        session = f"strands:{agent_id}" if agent_id is not None else None
    name = getattr(agent, "name", None)
    return (str(session) if session is not None else None, name if isinstance(name, str) else None)


def _task(messages: object) -> str | None:
    """The text blocks of the latest user message among an invocation's input messages."""
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            texts = [
                block["text"]
                for block in message.get("content") or ()
                if isinstance(block, dict) and isinstance(block.get("text"), str)
            ]
            return "\n".join(texts) or None
    return None


class LoopGuardHooks(HookProvider):
    """Enforces the guard's decisions on every tool call of the agent it is given to.
    Options as in :mod:`otel_loopguard.integrations`."""

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
        self._tickets: dict[str, Ticket] = {}
        self._invocations = 0

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeInvocationEvent, self.before_invocation)
        registry.add_callback(BeforeToolCallEvent, self.before_tool_call)
        registry.add_callback(AfterToolCallEvent, self.after_tool_call)

    def _keys(self, agent: Any) -> tuple[str, str | None]:
        return self.hook.keys(*_framework_keys(agent))

    def before_invocation(self, event: BeforeInvocationEvent) -> None:
        """A new invocation (a user request): a new progress epoch in this session."""
        self._invocations += 1
        try:
            task = _task(event.messages)
        except Exception as exc:  # never let reading the prompt break the agent
            self.guard.report_internal_error("integration.strands.task", exc)
            task = None
        self.hook.run_marker(self._keys(event.agent), self._invocations, task)

    def before_tool_call(self, event: BeforeToolCallEvent) -> None:
        tool_use = event.tool_use
        call_id = str(tool_use.get("toolUseId"))
        ticket = self.hook.before(
            tool_use["name"], tool_use.get("input"), call_id, self._keys(event.agent)
        )
        decision = ticket.decision
        if not decision.blocks:
            self._tickets[call_id] = ticket
            return
        event.cancel_tool = decision.message
        if decision.action is Action.STOP:
            event.agent.cancel(message=decision.message, after_current_tools=True)

    def after_tool_call(self, event: AfterToolCallEvent) -> None:
        ticket = self._tickets.pop(str(event.tool_use.get("toolUseId")), None)
        if ticket is None or event.cancel_message is not None:
            return
        result = event.result
        content = result.get("content") or []
        text = "\n".join(block["text"] for block in content if "text" in block)
        post = self.hook.after(
            ticket,
            result=text,
            error=event.exception is not None or result.get("status") == "error",
        )
        if self.hook.ends_run(post):
            event.agent.cancel(message=post.message, after_current_tools=True)
            return
        reminder = self.hook.reminder(ticket, post)
        if reminder is not None:
            event.result = {**result, "content": [*content, {"text": reminder}]}
