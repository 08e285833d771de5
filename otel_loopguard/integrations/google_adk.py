"""Google ADK: ``before_tool_callback`` and ``after_tool_callback`` for an ``LlmAgent``.

::

    from google.adk.agents import LlmAgent
    from otel_loopguard.integrations.google_adk import LoopGuardCallbacks

    callbacks = LoopGuardCallbacks(guard)
    agent = LlmAgent(name="researcher", model=model, tools=[search],
                     before_tool_callback=callbacks.before_tool,
                     after_tool_callback=callbacks.after_tool)

``before_tool`` asks the guard; for a blocked call it returns ``{"error": message}``, which ADK
uses as the tool's response without running it, so the model reads the message. ``after_tool``
reports the result and adds a reminder (appended to a string result, or under the key
``"loopguard"`` of a dict result). A stop ends the run (``on_stop="end"``, default): the call is
answered with the stop message and ``tool_context.actions.skip_summarization`` is set, so ADK
does not call the model again and the invocation ends with that response.

A stop the guard concludes from a call's result (``phase`` post, e.g. the same call failing the
same way again) ends the invocation the same way, after the call: ``after_tool`` adds the stop
text to the response (as a reminder is added), ``on_tool_error`` (the failure of a tool that
raised) answers ``{"error": stop text}``, and both set ``skip_summarization``. ADK tells the
callbacks of a failure only through ``on_tool_error_callback``: pass ``callbacks.on_tool_error``
there, first in the list if you recover from tool errors with a callback of your own. With
``on_stop="message"`` the model reads the stop text and the run goes on.

With ``processor=`` (on the provider ADK's tracer writes to), the callbacks run inside the
``execute_tool`` span and ask with the processor's keys; each call counts once (ADK puts the
arguments on that span only with ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY``;
without them the span does not report the call and the callbacks' report is the only one).
Session otherwise: the ADK session id; a new invocation starts a new progress epoch. The text parts
of the user content that started the invocation (``tool_context.user_content``) are what an
advisor is told the task is. Callbacks run on the runner's event loop and never raise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._guard import LoopGuard
from .._policy import Action
from ._hook import OnStop, Ticket, ToolHook, missing_framework

try:
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("google_adk", "Google ADK", "google-adk") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["REMINDER_KEY", "LoopGuardCallbacks"]

#: Where a reminder goes in a dict tool response.
REMINDER_KEY = "loopguard"


def _task(content: object) -> str | None:
    """The text parts of the user content that started the invocation (a ``types.Content``)."""
    texts = [
        part.text
        for part in getattr(content, "parts", None) or ()
        if isinstance(getattr(part, "text", None), str) and not getattr(part, "thought", None)
    ]
    return "\n".join(texts) or None


class LoopGuardCallbacks:
    """``before_tool`` / ``after_tool`` (and ``on_tool_error``) callbacks that enforce the
    guard's decisions. Options as in :mod:`otel_loopguard.integrations`."""

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

    def _keys(self, tool_context: ToolContext) -> tuple[str, str | None]:
        session = getattr(getattr(tool_context, "session", None), "id", None)
        keys = self.hook.keys(session, getattr(tool_context, "agent_name", None))
        try:
            task = _task(getattr(tool_context, "user_content", None))
        except Exception as exc:  # never let reading the prompt break the agent
            self.guard.report_internal_error("integration.google_adk.task", exc)
            task = None
        self.hook.run_marker(keys, getattr(tool_context, "invocation_id", None), task)
        return keys

    def before_tool(
        self, tool: BaseTool, args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        """For ``LlmAgent(before_tool_callback=...)``."""
        call_id = tool_context.function_call_id
        ticket = self.hook.before(tool.name, args, call_id, self._keys(tool_context))
        decision = ticket.decision
        if not decision.blocks:
            if call_id is not None:
                self._tickets[call_id] = ticket
            return None
        if decision.action is Action.STOP:
            tool_context.actions.skip_summarization = True
        return {"error": decision.message}

    def after_tool(
        self, tool: BaseTool, args: dict[str, Any], tool_context: ToolContext, tool_response: Any
    ) -> dict[str, Any] | None:
        """For ``LlmAgent(after_tool_callback=...)``; returns a response with the reminder
        added, or None to keep the tool's."""
        call_id = tool_context.function_call_id
        ticket = self._tickets.pop(call_id, None) if call_id is not None else None
        if ticket is None:
            return None  # blocked (the response is ours) or not seen before
        post = self.hook.after(ticket, result=tool_response)
        if self.hook.ends_run(post):
            tool_context.actions.skip_summarization = True
            reminder: str | None = post.message
        else:
            reminder = self.hook.reminder(ticket, post)
        if reminder is None:
            return None
        if isinstance(tool_response, dict):
            return {**tool_response, REMINDER_KEY: reminder}
        return {"result": f"{tool_response}\n\n{reminder}"}

    def on_tool_error(
        self, tool: BaseTool, args: dict[str, Any], tool_context: ToolContext, error: Exception
    ) -> dict[str, Any] | None:
        """For ``LlmAgent(on_tool_error_callback=...)``: reports the failure and keeps ADK's
        handling (returns None), unless the guard concludes a stop from it: then the call is
        answered with ``{"error": stop text}`` (ending the invocation with ``on_stop="end"``)."""
        call_id = tool_context.function_call_id
        ticket = self._tickets.pop(call_id, None) if call_id is not None else None
        if ticket is None:
            return None
        post = self.hook.after(ticket, result=repr(error), error=True)
        if post is None or post.action is not Action.STOP:
            return None
        if self.hook.ends_run(post):
            tool_context.actions.skip_summarization = True
        return {"error": post.message}
