"""DSPy: the guard around the tools of a ``dspy.ReAct`` agent.

::

    import dspy
    from otel_loopguard.integrations.dspy import LoopGuardTools

    react = dspy.ReAct("question -> answer", tools=LoopGuardTools(guard).wrap([search]))

DSPy's tool callbacks (``BaseCallback.on_tool_start``) only watch: DSPy logs an exception raised
there and runs the tool anyway. :meth:`LoopGuardTools.wrap` returns each tool as a ``dspy.Tool``
(its name, description and arguments the tool's own) whose call asks the guard first; a blocked
call returns the message as the tool's observation, the tool not run. After a call the result is
reported and a reminder is appended to a string result. A stop ends the run (``on_stop="end"``,
default): :class:`LoopStopped` is raised out of the module call, a ``BaseException`` (ReAct turns
every ``Exception`` a tool raises into an observation, "Execution error in ...", and goes on);
with ``on_stop="message"`` the model reads the stop text and the run goes on. A stop the guard
concludes from a call's result (``phase`` post, e.g. the same call failing the same way again)
ends the run the same way, after the call. A failure is a tool that raised: it is reported,
then raised on (ReAct hands the model the error).

ReAct's own ``finish`` tool (ReAct adds it itself) marks the final answer: it is never wrapped,
and the span processor does not track OpenInference's span of it.

With ``processor=`` (on the provider OpenInference's DSPy instrumentation writes to) the tools
ask with the processor's keys: ReAct's spans have no agent span, so the session is the trace
(one per module call, so each question starts afresh). OpenInference's tool span
(``<tool>.__call__`` or ``<tool>.acall``, with no ``tool.name``: the conventions take the tool's
name from the span name) starts inside the wrapped call, after the guard was asked: a refused
call has no tool span, and a call that ran is reported by its span first and counts once. ReAct
gives no call id: a call is matched to its result by its arguments. Session otherwise:
``session=``, else one per :class:`LoopGuardTools` (no new run is seen: pass a callable
``session`` that names each question, or call ``guard.new_run``). The tools run on the
caller's thread (``acall`` on its event loop) and never raise except to end a run on stop.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from .._conventions._keys import DSPY_FINISH_TOOL
from .._guard import LoopGuard
from .._policy import Action, Decision
from ._hook import OnStop, Ticket, ToolHook, missing_framework

try:
    import dspy
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("dspy", "DSPy", "dspy") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["FINISH_TOOL", "LoopGuardTools", "LoopStopped"]

#: The tool ReAct adds itself to end the trajectory: a final answer, never asked about.
FINISH_TOOL: Final = DSPY_FINISH_TOOL


class LoopStopped(BaseException):
    """The guard stopped the run: raised out of the module call (``react(question=...)``).

    A ``BaseException``, as ``KeyboardInterrupt`` is: DSPy's ReAct catches every ``Exception``
    a tool raises and shows it to the model as an observation. ``decision`` is the stop,
    ``message`` its text, ``code`` ``"stop"``."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.message)
        self.decision = decision
        self.message = decision.message
        self.code = decision.action.value


class LoopGuardTools:
    """Wraps DSPy tools so that each call asks the guard first. Options as in
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
        #: The last stop that ended a run through these tools (``None`` before any).
        self.stopped: Decision | None = None
        self._session = f"dspy:{id(self)}"

    def wrap(self, tools: Iterable[Callable[..., Any] | dspy.Tool]) -> list[dspy.Tool]:
        """Each tool (a function or a ``dspy.Tool``) as a ``dspy.Tool`` that asks the guard;
        ReAct's ``finish`` is passed through as it is."""
        wrapped: list[dspy.Tool] = []
        for tool in tools:
            if not isinstance(tool, dspy.Tool):
                tool = dspy.Tool(tool)
            if tool.name == FINISH_TOOL or isinstance(tool, _GuardedTool):
                wrapped.append(tool)
                continue
            wrapped.append(_GuardedTool(tool, self))
        return wrapped

    # -- the call ----------------------------------------------------------------------------

    def _before(self, name: str, arguments: dict[str, Any]) -> Ticket:
        return self.hook.before(name, arguments, None, self.hook.keys(self._session))

    def _blocked(self, ticket: Ticket) -> str:
        """The observation of a blocked call; a stop that ends the run raises instead."""
        decision = ticket.decision
        if decision.action is Action.STOP:  # on_stop="message" answers a stop as a denial
            self.stopped = decision
            raise LoopStopped(decision)
        return decision.message

    def _after(self, ticket: Ticket, result: object) -> object:
        post = self.hook.after(ticket, result=result, error=False)
        if self.hook.ends_run(post):
            self.stopped = post
            raise LoopStopped(post)
        if isinstance(result, str):
            return self.hook.with_reminder(ticket, result, post)
        return result

    def _failed(self, ticket: Ticket, error: Exception) -> None:
        """Report a tool that raised; a stop concluded from it ends the run."""
        post = self.hook.after(ticket, result=f"{type(error).__name__}: {error}", error=True)
        if self.hook.ends_run(post):
            self.stopped = post
            raise LoopStopped(post) from error


class _GuardedTool(dspy.Tool):
    """A ``dspy.Tool`` whose calls ask the guard before the tool runs (``__call__`` and
    ``acall``; the wrapped tool's own spans and callbacks run inside, as before)."""

    def __init__(self, tool: dspy.Tool, guard: LoopGuardTools) -> None:
        super().__init__(
            tool.func,
            name=tool.name,
            desc=tool.desc,
            args=tool.args,
            arg_types=tool.arg_types,
            arg_desc=tool.arg_desc,
        )
        self._loopguard = guard

    def __call__(self, **kwargs: Any) -> Any:
        guard = self._loopguard
        ticket = guard._before(self.name or "", dict(kwargs))
        if ticket.decision.blocks:
            return guard._blocked(ticket)
        try:
            result = super().__call__(**kwargs)
        except Exception as error:
            guard._failed(ticket, error)
            raise
        return guard._after(ticket, result)

    async def acall(self, **kwargs: Any) -> Any:
        guard = self._loopguard
        ticket = guard._before(self.name or "", dict(kwargs))
        if ticket.decision.blocks:
            return guard._blocked(ticket)
        try:
            result = super().acall(**kwargs)
            if inspect.isawaitable(result):
                result = await result
        except Exception as error:
            guard._failed(ticket, error)
            raise
        return guard._after(ticket, result)
