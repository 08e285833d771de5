"""AutoGen AgentChat: a workbench that asks the guard before each tool call.

::

    from autogen_agentchat.agents import AssistantAgent
    from otel_loopguard.integrations.autogen import LoopGuardWorkbench

    agent = AssistantAgent("researcher", model_client=client, max_tool_iterations=10,
                           workbench=LoopGuardWorkbench([search], guard))

AgentChat has no before-tool callback; every call an ``AssistantAgent`` makes goes through its
workbench's ``call_tool``, which sees the model's call id. :class:`LoopGuardWorkbench` is a
``StaticWorkbench`` (pass it as ``workbench=`` instead of ``tools=``) that asks the guard; a
blocked call is answered with a ``ToolResult`` holding the guard's message (``is_error``), the
tool not run: the model reads it as the tool's error. After a call it reports the result and
appends a reminder to it. A stop ends the run (``on_stop="end"``, default): the call is answered
with the stop text, a call still to come in that turn too (not run), and the run ends before the
next model call, whatever the model client does: ``agent.run`` raises
``asyncio.CancelledError`` (AutoGen's own way to end a run). Two things end it. The run's
cancellation token is cancelled once no call of the model's turn is still running: a client that
links its request to the token (AutoGen's OpenAI, Azure, Anthropic and Ollama clients) is
cancelled by it. And AgentChat asks the workbench for its tools right before each model call
(``list_tools``, on the agent's own task): for a stopped run the workbench raises
``CancelledError`` there, so a client that ignores the token (``ReplayChatCompletionClient``,
the Semantic Kernel adapter client) is never called again. (Raising from ``call_tool`` would
hang AgentChat 0.7: the agent waits for the tool calls' results on a queue that a failed call
never fills.)
:attr:`~LoopGuardWorkbench.stopped` holds the stop. A stop the guard concludes from a call's
result (``phase`` post, e.g. the same call failing the same way again) ends the run the same
way, its text added to the result; with ``on_stop="message"`` the model reads the stop text and
the run goes on.

With ``processor=`` (on the provider AutoGen's tracer writes to: the global one), the workbench
runs inside the ``invoke_agent`` span and asks with the processor's keys. AutoGen's
``execute_tool`` spans carry the call id but never the arguments: the processor skips them
unless the policy says ``count_calls_without_arguments``, and then the call id makes each call
count once. Session otherwise: ``session=``, else one for the workbench; the agent label is
``agent=``. Each run (a new cancellation token) starts a new progress epoch. The workbench runs
on the agent's event loop, concurrently for the calls of one model turn, and never raises.
"""

from __future__ import annotations

import asyncio
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from .._guard import LoopGuard
from .._policy import Action, Decision
from ._hook import OnStop, ToolHook, missing_framework

try:
    from autogen_core import CancellationToken
    from autogen_core.tools import (
        BaseTool,
        StaticWorkbench,
        TextResultContent,
        ToolResult,
        ToolSchema,
    )
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("autogen", "AutoGen AgentChat", "autogen") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["LoopGuardWorkbench"]

#: Runs (cancellation tokens) with a pending or sent stop, remembered at most.
_MAX_RUNS: Final = 1024
#: The AgentChat function that asks the workbench for its tools before a model call, with the
#: run's token in its ``cancellation_token`` argument (``AssistantAgent._call_llm``, 0.7).
_MODEL_CALL: Final = "_call_llm"
#: Frames looked at above ``list_tools`` for it (a comprehension's own frame is one, in 3.11).
_MODEL_CALL_DEPTH: Final = 4


class _Run:
    """A run's calls in flight and its stop, if any."""

    __slots__ = ("in_flight", "stop")

    def __init__(self) -> None:
        self.in_flight = 0
        self.stop: Decision | None = None


class LoopGuardWorkbench(StaticWorkbench):
    """A ``StaticWorkbench`` over ``tools`` that enforces the guard's decisions.
    ``tool_overrides`` as for ``StaticWorkbench``; the other options as in
    :mod:`otel_loopguard.integrations`."""

    def __init__(
        self,
        tools: Sequence[BaseTool[Any, Any]],
        guard: LoopGuard | None = None,
        *,
        processor: LoopGuardSpanProcessor | None = None,
        session: str | Callable[[], str] | None = None,
        agent: str | None = None,
        append_reminders: bool = True,
        on_stop: OnStop = "end",
        tool_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(list(tools), dict(tool_overrides) if tool_overrides else None)
        self.hook = ToolHook(
            guard,
            processor=processor,
            session=session,
            agent=agent,
            append_reminders=append_reminders,
            on_stop=on_stop,
        )
        self.guard = self.hook.guard
        #: The last stop that ended a run of this workbench (``None`` before any).
        self.stopped: Decision | None = None
        self._workbench_session = f"autogen:{id(self)}"
        self._runs: OrderedDict[object, _Run] = OrderedDict()

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        cancellation_token: CancellationToken | None = None,
        call_id: str | None = None,
    ) -> ToolResult:
        run = self._run(cancellation_token)
        if run is not None and run.stop is not None:
            return _answer(name, run.stop.message)  # the turn of a stopped run: not run
        keys = self.hook.keys(self._workbench_session)
        self.hook.run_marker(keys, cancellation_token)
        ticket = self.hook.before(name, dict(arguments or {}), call_id, keys)
        decision = ticket.decision
        if decision.blocks:
            if decision.action is Action.STOP:
                self._stop(run, cancellation_token, decision)
            return _answer(name, decision.message)
        if run is not None:
            run.in_flight += 1
        try:
            result = await super().call_tool(name, arguments, cancellation_token, call_id)
        finally:
            if run is not None:
                run.in_flight -= 1
        text = result.to_text()
        post = self.hook.after(ticket, result=text, error=result.is_error)
        if self.hook.ends_run(post):
            self._stop(run, cancellation_token, post)
            return _answer(name, f"{text}\n\n{post.message}", error=result.is_error)
        reminder = self.hook.reminder(ticket, post)
        if reminder is not None:
            result = _answer(name, f"{text}\n\n{reminder}", error=result.is_error)
        if run is not None:
            self._cancel_if_stopped(run, cancellation_token)  # another call of the turn stopped
        return result

    async def list_tools(self) -> list[ToolSchema]:
        """The tools; before the next model call of a stopped run, ``CancelledError`` instead:
        the run ends there, whatever the model client does with the cancelled token."""
        tools: list[ToolSchema] = await super().list_tools()
        if self._runs:
            run = self._runs.get(_model_call_token())
            if run is not None and run.stop is not None:
                raise asyncio.CancelledError(f"loopguard stopped the run: {run.stop.message}")
        return tools

    def _run(self, token: CancellationToken | None) -> _Run | None:
        if token is None:
            return None
        run = self._runs.get(token)
        if run is None:
            run = self._runs[token] = _Run()
            if len(self._runs) > _MAX_RUNS:
                self._runs.popitem(last=False)
        return run

    def _stop(self, run: _Run | None, token: CancellationToken | None, decision: Decision) -> None:
        """End the run: at once when no other call of this turn is running (cancelling a token
        cancels the calls linked to it, which AgentChat does not survive), else when the last
        one ends."""
        self.stopped = decision
        if run is None or token is None:
            return
        run.stop = decision
        self._cancel_if_stopped(run, token)

    @staticmethod
    def _cancel_if_stopped(run: _Run, token: CancellationToken | None) -> None:
        if run.stop is not None and run.in_flight == 0 and token is not None:
            token.cancel()


def _model_call_token() -> CancellationToken | None:
    """The run's token when ``list_tools`` was called by AgentChat right before a model call
    (a frame of :data:`_MODEL_CALL` just above it), else ``None``: a tool call's own lookup, or
    another caller. Never raises."""
    try:
        frame: FrameType | None = sys._getframe(2)  # above list_tools and this function
        for _ in range(_MODEL_CALL_DEPTH):
            if frame is None:
                return None
            if frame.f_code.co_name == _MODEL_CALL:
                token = frame.f_locals.get("cancellation_token")
                return token if isinstance(token, CancellationToken) else None
            frame = frame.f_back
    except Exception:  # an interpreter without frames: the token alone ends the run
        return None
    return None


def _answer(name: str, text: str, error: bool = True) -> ToolResult:
    return ToolResult(name=name, result=[TextResultContent(content=text)], is_error=error)
