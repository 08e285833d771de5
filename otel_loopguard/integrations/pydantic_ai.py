"""Pydantic AI: a capability that asks the guard before each tool call.

::

    from pydantic_ai import Agent
    from otel_loopguard.integrations.pydantic_ai import LoopGuardCapability

    agent = Agent(model, capabilities=[LoopGuardCapability(guard)])

``before_tool_execute`` asks the guard; a blocked call raises ``SkipToolExecution(message)``, so
the tool does not run and the model reads the message as its result. ``after_tool_execute``
reports the result and appends a reminder to a string result. A stop ends the run
(``on_stop="end"``, default): :class:`~otel_loopguard.LoopDetected` is raised out of
``agent.run``; with ``on_stop="message"`` the model reads the stop text instead.

A stop the guard concludes from a call's result (``phase`` post, e.g. the same call failing the
same way again) ends the run the same way, after the call: ``LoopDetected`` is raised from
``after_tool_execute`` or, for a failure the model is told of (``ToolFailed``, ``ModelRetry``:
they skip the other tool hooks), from ``wrap_tool_execute``; with ``on_stop="message"`` the model
reads the stop text as the result (a ``ToolFailed`` for a failure).

With ``processor=`` (the :class:`~otel_loopguard.processor.LoopGuardSpanProcessor` on the
provider given to ``instrument=``), the decision the processor made when the tool span started
(Pydantic AI puts the arguments there) is used as is, and each call counts once. Session
otherwise: the run's ``conversation_id``; a new run in it starts a new progress epoch. The run's
prompt (``RunContext.prompt``: a string, or the text parts of structured content; else the latest
user prompt in the message history) is what an advisor is told the task is.

Hooks run on the agent's event loop; they never raise except to end a run on stop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._guard import LoopGuard
from .._policy import Action, LoopDetected
from ._hook import OnStop, Ticket, ToolHook, missing_framework

try:
    from pydantic_ai import RunContext, SkipToolExecution
    from pydantic_ai.capabilities import AbstractCapability, WrapToolExecuteHandler
    from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ToolFailed
    from pydantic_ai.messages import ModelRequest, TextContent, ToolCallPart, UserPromptPart
    from pydantic_ai.tools import ToolDefinition
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("pydantic_ai", "Pydantic AI", "pydantic-ai") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["LoopGuardCapability"]


def _agent_name(ctx: RunContext[Any]) -> str | None:
    agent = getattr(ctx, "agent", None)
    name = getattr(agent, "name", None)
    return name if isinstance(name, str) else None


def _text(content: object) -> str | None:
    """The text of a user prompt: a string, or the text parts of structured content."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = [
            part if isinstance(part, str) else part.content
            for part in content
            if isinstance(part, (str, TextContent))
        ]
        return "\n".join(texts) or None
    return None


def _task(ctx: RunContext[Any]) -> str | None:
    """The run's prompt; without one (a run continuing a history), the latest user prompt."""
    if ctx.prompt is not None:
        return _text(ctx.prompt)
    for message in reversed(ctx.messages or ()):
        if isinstance(message, ModelRequest):
            for part in reversed(message.parts):
                if isinstance(part, UserPromptPart):
                    return _text(part.content)
    return None


@dataclass
class LoopGuardCapability(AbstractCapability[Any]):
    """Enforces the guard's decisions on every tool call of the agent it is given to.

    Options as in :mod:`otel_loopguard.integrations`.
    """

    guard: LoopGuard | None = None
    processor: LoopGuardSpanProcessor | None = None
    session: str | Callable[[], str] | None = None
    agent: str | None = None
    append_reminders: bool = True
    on_stop: OnStop = "end"
    _hook: ToolHook = field(init=False, repr=False, compare=False)
    _tickets: dict[str, Ticket] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._hook = ToolHook(
            self.guard,
            processor=self.processor,
            session=self.session,
            agent=self.agent,
            append_reminders=self.append_reminders,
            on_stop=self.on_stop,
        )
        self.guard = self._hook.guard
        self._tickets = {}
        if getattr(self, "id", None) is None:
            self.id = "loopguard"  # one per agent: a second one merges with the first

    def _keys(self, ctx: RunContext[Any]) -> tuple[str, str | None]:
        return self._hook.keys(ctx.conversation_id or ctx.run_id, _agent_name(ctx))

    async def before_run(self, ctx: RunContext[Any]) -> None:
        try:
            task = _task(ctx)
        except Exception as exc:  # never let reading the prompt break the agent
            self._hook.guard.report_internal_error("integration.pydantic_ai.task", exc)
            task = None
        self._hook.run_marker(self._keys(ctx), ctx.run_id, task)

    async def before_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
    ) -> Any:
        decision = None
        if self._hook.processor is not None:
            from ..processor import current_decision

            decision = current_decision()  # made (and counted) when the tool span started
        ticket = self._hook.before(
            call.tool_name, call.args_as_dict(), call.tool_call_id, self._keys(ctx), decision
        )
        decision = ticket.decision
        if not decision.blocks:
            self._tickets[call.tool_call_id] = ticket
            return args
        if decision.action is Action.STOP:
            raise LoopDetected(decision)
        raise SkipToolExecution(decision.message)

    async def after_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        result: Any,
    ) -> Any:
        ticket = self._tickets.pop(call.tool_call_id, None)
        if ticket is None:
            return result
        post = self._hook.after(ticket, result=result)
        if self._hook.ends_run(post):
            raise LoopDetected(post)
        if isinstance(result, str):
            return self._hook.with_reminder(ticket, result, post)
        return result

    async def on_tool_execute_error(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        error: Exception,
    ) -> Any:
        ticket = self._tickets.pop(call.tool_call_id, None)
        if ticket is not None:
            post = self._hook.after(ticket, result=repr(error), error=True)
            if self._hook.ends_run(post):
                raise LoopDetected(post) from error
        raise error

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        try:
            return await handler(args)
        except (CallDeferred, ApprovalRequired):
            self._tickets.pop(call.tool_call_id, None)  # not ended: nothing to report yet
            raise
        except Exception as error:
            # A failure the model is told of (ToolFailed, ModelRetry) skips after_tool_execute
            # and on_tool_execute_error: the ticket is still here. Anything else has been
            # reported already (or the call was blocked) and passes through.
            ticket = self._tickets.pop(call.tool_call_id, None)
            if ticket is None:
                raise
            post = self._hook.after(ticket, result=str(error), error=True)
            if post is not None and post.action is Action.STOP:
                if self._hook.ends_run(post):
                    raise LoopDetected(post) from error
                raise ToolFailed(post.message) from error  # on_stop="message"
            raise
