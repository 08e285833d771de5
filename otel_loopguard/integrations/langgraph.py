"""LangGraph: a tool-call wrapper for ``ToolNode``, sync and async.

::

    from langgraph.prebuilt import ToolNode
    from otel_loopguard.integrations.langgraph import LoopGuardToolWrapper

    wrapper = LoopGuardToolWrapper(guard)
    tools = ToolNode([search], wrap_tool_call=wrapper.wrap_tool_call,
                     awrap_tool_call=wrapper.awrap_tool_call)

Before each call the wrapper asks the guard; a blocked call is answered with
``ToolMessage(content=message, status="error")`` without calling ``execute``, so the model reads
the message as the tool result. After a call it reports the result and appends a reminder to a
string ``ToolMessage`` content. A stop ends the run (``on_stop="end"``, default):
:class:`~otel_loopguard.LoopDetected` is raised, and ``ToolNode`` (with its default
``handle_tool_errors``) lets it out of ``graph.invoke``; with ``handle_tool_errors=True`` it would
turn it into an error message instead, so use ``on_stop="message"`` there. A stop the guard
concludes from a call's result (``phase`` post, e.g. the same call failing the same way again:
a ``ToolMessage`` with ``status="error"``, or an exception from the tool) ends the run the same
way, after the call: ``LoopDetected`` is raised (from the tool's exception, if any); with
``on_stop="message"`` the stop text is added to a string ``ToolMessage`` instead.

Session: the graph's ``thread_id`` (``config={"configurable": {"thread_id": ...}}``); a new user
message in the thread (a new last ``HumanMessage``) starts a new progress epoch, and its text (the
content string, or its text blocks) is what an advisor is told the task is. OpenInference's
LangChain instrumentation does not make its spans current, so with ``processor=`` pass a
processor keyed by conversation (``LoopGuardSpanProcessor(guard, key_by="conversation")``): it
keys the tool spans by the same ``thread_id``, and each call counts once.

The wrapper runs on the graph's worker threads or event loop and never raises except to end a
run on stop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from .._guard import LoopGuard
from .._policy import Action, LoopDetected
from ._hook import OnStop, Ticket, ToolHook, missing_framework

try:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("langgraph", "LangGraph", "langgraph") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["LoopGuardToolWrapper"]

Result: TypeAlias = "ToolMessage | Command[Any]"


def _thread_id(request: ToolCallRequest) -> str | None:
    config = getattr(request.runtime, "config", None) or {}
    configurable = config.get("configurable") or {}
    thread = configurable.get("thread_id")
    return str(thread) if thread is not None else None


def _last_user_message(state: Any) -> HumanMessage | None:
    messages = (
        state.get("messages") if isinstance(state, dict) else getattr(state, "messages", None)
    )
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message
    return None


def _text(content: object) -> str | None:
    """A message's text: its content string, or the text blocks of a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            block if isinstance(block, str) else block["text"]
            for block in content
            if isinstance(block, str)
            or (
                isinstance(block, dict)
                and block.get("type") == "text"
                and isinstance(block.get("text"), str)
            )
        ]
        return "\n".join(texts) or None
    return None


class LoopGuardToolWrapper:
    """``wrap_tool_call`` / ``awrap_tool_call`` for ``ToolNode``: enforces the guard's
    decisions. Options as in :mod:`otel_loopguard.integrations`."""

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

    def _before(self, request: ToolCallRequest) -> tuple[Ticket, ToolMessage | None]:
        call = request.tool_call
        keys = self.hook.keys(_thread_id(request))
        message = _last_user_message(request.state)
        if message is not None:
            try:
                task = _text(message.content)
            except Exception as exc:  # never let reading the prompt break the agent
                self.guard.report_internal_error("integration.langgraph.task", exc)
                task = None
            self.hook.run_marker(keys, message.id or id(message), task)
        ticket = self.hook.before(call["name"], call.get("args", {}), call.get("id"), keys)
        decision = ticket.decision
        if not decision.blocks:
            return ticket, None
        if decision.action is Action.STOP:
            raise LoopDetected(decision)
        return ticket, ToolMessage(
            content=decision.message,
            name=call["name"],
            tool_call_id=call.get("id") or "",
            status="error",
        )

    def _after(self, ticket: Ticket, result: Result) -> Result:
        if not isinstance(result, ToolMessage):
            post = self.hook.after(ticket, result=None, error=None)  # a Command: outcome unknown
            if self.hook.ends_run(post):
                raise LoopDetected(post)
            return result
        content = result.content
        post = self.hook.after(ticket, result=content, error=result.status == "error")
        if self.hook.ends_run(post):
            raise LoopDetected(post)
        if isinstance(content, str) and self.hook.reminder(ticket, post) is not None:
            return result.model_copy(
                update={"content": self.hook.with_reminder(ticket, content, post)}
            )
        return result

    def _failed(self, ticket: Ticket, error: Exception) -> None:
        """The tool raised ``error``: report it; a stop concluded from it ends the run."""
        post = self.hook.after(ticket, result=repr(error), error=True)
        if self.hook.ends_run(post):
            raise LoopDetected(post) from error

    def wrap_tool_call(
        self, request: ToolCallRequest, execute: Callable[[ToolCallRequest], Result]
    ) -> Result:
        """For ``ToolNode(wrap_tool_call=...)``."""
        ticket, blocked = self._before(request)
        if blocked is not None:
            return blocked
        try:
            result = execute(request)
        except Exception as error:
            self._failed(ticket, error)
            raise
        return self._after(ticket, result)

    async def awrap_tool_call(
        self, request: ToolCallRequest, execute: Callable[[ToolCallRequest], Awaitable[Result]]
    ) -> Result:
        """For ``ToolNode(awrap_tool_call=...)``."""
        ticket, blocked = self._before(request)
        if blocked is not None:
            return blocked
        try:
            result = await execute(request)
        except Exception as error:
            self._failed(ticket, error)
            raise
        return self._after(ticket, result)
