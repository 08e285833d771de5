"""smolagents: the guard around a ``ToolCallingAgent``'s ``execute_tool_call``.

::

    from smolagents import ToolCallingAgent
    from otel_loopguard.integrations.smolagents import guard_agent

    agent = guard_agent(ToolCallingAgent(tools=[search], model=model), guard)

smolagents has no pre-tool hook; ``ToolCallingAgent.execute_tool_call(tool_name, arguments)`` is
the public method every tool call of the agent goes through, and :func:`guard_agent` wraps it
on the agent (in place; the agent's class is left alone). Before each call the guard is asked; a
blocked call is answered with the message instead of running the tool: the model reads it as
the call's observation. After a call the result is reported and a reminder is appended to a
string result. A stop ends the run (``on_stop="end"``, default):
:class:`~otel_loopguard.LoopDetected` is raised out of ``agent.run`` (smolagents lets an
exception that is not one of its own agent errors out); with ``on_stop="message"`` the model
reads the stop text instead. A stop the guard concludes from a call's result (``phase`` post,
e.g. the same call failing the same way again: smolagents' ``AgentToolExecutionError``) ends the
run the same way, after the call; with ``on_stop="message"`` the stop text is added to the
result, or to the error the model reads.

The call id: ``execute_tool_call`` does not get it; the wrapper takes it from the model's tool
calls of the step (``process_tool_calls``), matched to the call by its argument object. The
``final_answer`` tool is never asked about (a reminder would become part of the answer). With
``processor=`` (on the provider that OpenInference's smolagents instrumentation writes to) the
wrapper runs inside the agent's step span and asks with the processor's keys; each call counts
once (the tool span, which has no call id, ends before the wrapper reports; a blocked call has
no tool span). Session otherwise: ``session=``, else one per guarded agent; the agent label is
its name. Each ``agent.run`` starts a new progress epoch, and its ``task`` (the prompt) is what
an advisor is told the agent's task is. The wrapper runs on the agent's thread, or on
smolagents' pool threads for parallel calls, and never raises except to end a run on stop.

CodeAgent runs tools from the code the model writes, not through ``execute_tool_call``: it is
not covered.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, Final

from .._guard import LoopGuard
from .._policy import Action, LoopDetected
from ._hook import OnStop, ToolHook, missing_framework

try:
    from smolagents import ToolCallingAgent
    from smolagents.utils import AgentToolExecutionError
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("smolagents", "smolagents", "smolagents") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["FINAL_ANSWER_TOOL", "LoopGuardToolCalls", "guard_agent"]

#: The tool smolagents ends a run with: never asked about, never given a reminder.
FINAL_ANSWER_TOOL: Final = "final_answer"
#: Numbers the agents guarded in this process, for their default sessions.
_AGENTS: Final = itertools.count(1)


class LoopGuardToolCalls:
    """Enforces the guard's decisions on a ``ToolCallingAgent``'s tool calls (:meth:`install`,
    or :func:`guard_agent`): one per agent, whose default session and runs it keeps. Options as
    in :mod:`otel_loopguard.integrations`."""

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
        # id(argument object) -> call ids of the model's calls in the step being processed
        self._call_ids: dict[int, list[str]] = {}
        self._runs = 0
        # the agent's current run: its number and its prompt (``run``'s ``task``)
        self._run: tuple[int | None, str | None] = (None, None)
        self._lock = threading.Lock()
        self._session = f"smolagents:{next(_AGENTS)}"

    def install(self, agent: ToolCallingAgent) -> ToolCallingAgent:
        """Wrap ``agent``'s ``run``, ``process_tool_calls`` and ``execute_tool_call`` (instance
        attributes that call the class's methods, looked up at each call, so instrumentation
        applied later is kept) and return the agent."""
        if not isinstance(agent, ToolCallingAgent):
            raise ValueError(f"agent: expected a ToolCallingAgent, got {type(agent).__name__}")
        cls = type(agent)

        def run(*args: Any, **kwargs: Any) -> Any:
            task = args[0] if args else kwargs.get("task")
            with self._lock:
                self._runs += 1
                self._run = (self._runs, task if isinstance(task, str) else None)
                run_number, prompt = self._run
            self.hook.run_marker(self._keys(agent), run_number, prompt)
            return cls.run(agent, *args, **kwargs)

        def process_tool_calls(chat_message: Any, memory_step: Any) -> Iterator[Any]:
            return self._process_tool_calls(cls, agent, chat_message, memory_step)

        def execute_tool_call(tool_name: str, arguments: Any) -> Any:
            return self._execute_tool_call(cls, agent, tool_name, arguments)

        vars(agent).update(
            run=run, process_tool_calls=process_tool_calls, execute_tool_call=execute_tool_call
        )
        return agent

    def _keys(self, agent: ToolCallingAgent) -> tuple[str, str | None]:
        name = getattr(agent, "name", None)
        return self.hook.keys(self._session, name if isinstance(name, str) else None)

    def _process_tool_calls(
        self, cls: type[ToolCallingAgent], agent: ToolCallingAgent, chat_message: Any, memory: Any
    ) -> Generator[Any, None, None]:
        """The model's call ids, by the argument object smolagents hands ``execute_tool_call``
        (``ToolCall.arguments``, the same object), while the step's calls run."""
        registered: list[int] = []
        for call in getattr(chat_message, "tool_calls", None) or ():
            arguments = getattr(getattr(call, "function", None), "arguments", None)
            if arguments and isinstance(getattr(call, "id", None), str):
                self._call_ids.setdefault(id(arguments), []).append(call.id)
                registered.append(id(arguments))
        try:
            yield from cls.process_tool_calls(agent, chat_message, memory)
        finally:
            for key in registered:
                self._call_ids.pop(key, None)

    def _call_id(self, arguments: object) -> str | None:
        ids = self._call_ids.get(id(arguments))
        if not ids:
            return None
        try:
            return ids.pop(0)
        except IndexError:  # taken by a parallel call with the same (interned) arguments
            return None

    def _execute_tool_call(
        self, cls: type[ToolCallingAgent], agent: ToolCallingAgent, tool_name: str, arguments: Any
    ) -> Any:
        if tool_name == FINAL_ANSWER_TOOL:
            return cls.execute_tool_call(agent, tool_name, arguments)
        keys = self._keys(agent)
        # Inside the step span (``processor=``) the keys are the processor's, not those ``run``
        # saw before the span began: tell them the run and its prompt too.
        self.hook.run_marker(keys, *self._run)
        ticket = self.hook.before(tool_name, arguments, self._call_id(arguments), keys)
        decision = ticket.decision
        if decision.blocks:
            if decision.action is Action.STOP:
                raise LoopDetected(decision)
            return decision.message
        try:
            result = cls.execute_tool_call(agent, tool_name, arguments)
        except Exception as error:
            message = getattr(error, "message", None)
            post = self.hook.after(ticket, result=message or str(error), error=True)
            if self.hook.ends_run(post):
                raise LoopDetected(post) from error
            reminder = self.hook.reminder(ticket, post)
            if reminder is not None and isinstance(error, AgentToolExecutionError):
                raise AgentToolExecutionError(
                    f"{error.message}\n\n{reminder}", agent.logger
                ) from error
            raise
        post = self.hook.after(ticket, result=result)
        if self.hook.ends_run(post):
            raise LoopDetected(post)
        if isinstance(result, str):
            return self.hook.with_reminder(ticket, result, post)
        return result


def guard_agent(
    agent: ToolCallingAgent,
    guard: LoopGuard | None = None,
    *,
    processor: LoopGuardSpanProcessor | None = None,
    session: str | Callable[[], str] | None = None,
    append_reminders: bool = True,
    on_stop: OnStop = "end",
) -> ToolCallingAgent:
    """Enforce the guard's decisions on every tool call of ``agent`` (in place) and return it."""
    return LoopGuardToolCalls(
        guard,
        processor=processor,
        session=session,
        append_reminders=append_reminders,
        on_stop=on_stop,
    ).install(agent)
