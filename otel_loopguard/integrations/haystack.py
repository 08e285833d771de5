"""Haystack agents: ``before_run``, ``before_tool`` and ``after_tool`` hooks for an ``Agent``.

::

    from haystack.components.agents import Agent
    from otel_loopguard.integrations.haystack import LoopGuardHooks

    agent = Agent(chat_generator=generator, tools=[search], hooks=LoopGuardHooks(guard).hooks())

Haystack 3's ``Agent(hooks={point: [hook, ...]})`` runs each hook with the run's live ``State``.
The ``before_tool`` hook asks the guard about each pending tool call of the model's last message
(with the model's call id); a blocked call is taken out of that message and answered with a tool
result ``ChatMessage.from_tool(message, origin=call, error=True)``, as Haystack's own
``ConfirmationHook`` answers a rejected call: the tool does not run and the model reads the
message. The ``after_tool`` hook reports each result and appends a reminder to a text result. A
stop ends the run (``on_stop="end"``, default): the call is answered with the stop text and the
hook sets the ``stop_run`` state key, so the Agent ends the run before its next model call, with
``exit_reason`` :data:`STOP_REASON` and the stop text as the last message. A stop the guard
concludes from a call's result (``phase`` post, e.g. the same call failing the same way again: a
tool result with ``error`` set) ends the run the same way, the stop text appended to that result.
With ``on_stop="message"`` the model reads the stop text and the run goes on.

With ``processor=`` (on the provider of the ``OpenTelemetryTracer`` given to
``haystack.tracing.enable_tracing``) the hooks run inside Haystack's ``haystack.agent.hook`` span
and ask with the processor's keys; each call counts once (the tool spans, which have no call id,
end before the ``after_tool`` hook; a blocked call has no tool span). Haystack names no
conversation: the session is ``session=``, else each run is its own (an Agent serving concurrent
requests keeps them apart); with ``session=`` each run starts a new progress epoch. The run's last
user message (in the State at ``before_run``) is what an advisor is told the agent's task is.
Hooks run on the Agent's thread or event loop (``run_async``) and never raise.

The hooks hold a live guard, so they are not serialisable (``to_dict`` raises): add them to an
Agent loaded from YAML after loading it.
"""

from __future__ import annotations

import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from .._guard import LoopGuard
from .._policy import Action
from ._hook import OnStop, Ticket, ToolHook, missing_framework

try:
    from haystack.components.agents.state import State, replace_values
    from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
    from haystack.hooks import AFTER_TOOL, BEFORE_RUN, BEFORE_TOOL, Hook
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("haystack", "Haystack", "haystack") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["STOP_REASON", "LoopGuardHooks"]

#: The Agent's ``exit_reason`` when the guard stopped the run.
STOP_REASON: Final = "loopguard_stop"
#: Calls between their before and after hooks remembered at most (oldest forgotten first): a
#: run that ends between them (a tool that raised with ``raise_on_tool_invocation_failure``)
#: must not leak.
_MAX_PENDING: Final = 4096


class _HookPoint:
    """One hook point's ``Hook`` (Haystack calls ``run`` with the State and nothing else, so
    each point gets its own object)."""

    def __init__(self, name: str, function: Callable[[State], None], guard: LoopGuard) -> None:
        self.name = name
        self._function = function
        self._guard = guard

    def run(self, state: State) -> None:
        try:
            self._function(state)
        except Exception as exc:  # never let a hook break the agent
            self._guard.report_internal_error(f"integration.haystack.{self.name}", exc)

    async def run_async(self, state: State) -> None:
        # on the event loop itself (Haystack would run a sync-only hook in a thread)
        self.run(state)

    def to_dict(self) -> dict[str, Any]:
        raise TypeError(
            "otel_loopguard's Haystack hooks hold a live guard and cannot be serialised; "
            "add LoopGuardHooks(...).hooks() to the Agent after loading it"
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> _HookPoint:
        raise TypeError("otel_loopguard's Haystack hooks cannot be deserialised")

    def __repr__(self) -> str:
        return f"<loopguard {self.name} hook>"


class LoopGuardHooks:
    """Enforces the guard's decisions on every tool call of the Agents given :meth:`hooks`.
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
        self.before_run: Final = _HookPoint(BEFORE_RUN, self._before_run, self.guard)
        self.before_tool: Final = _HookPoint(BEFORE_TOOL, self._before_tool, self.guard)
        self.after_tool: Final = _HookPoint(AFTER_TOOL, self._after_tool, self.guard)
        # the run's own session, by its State (one object for the whole run)
        self._runs: weakref.WeakKeyDictionary[State, str] = weakref.WeakKeyDictionary()
        # id(ToolCall) -> (the call, its ticket): the after hook gets the same objects
        self._pending: OrderedDict[int, tuple[ToolCall, Ticket]] = OrderedDict()

    def hooks(self) -> dict[str, list[Hook]]:
        """``Agent(hooks=...)``: a new dict, to extend with hooks of your own (list these
        first where other hooks rewrite tool calls or results)."""
        return {
            BEFORE_RUN: [self.before_run],
            BEFORE_TOOL: [self.before_tool],
            AFTER_TOOL: [self.after_tool],
        }

    # -- keys --------------------------------------------------------------------------------

    def _run_id(self, state: State) -> str:
        run = self._runs.get(state)
        if run is None:
            run = self._runs.setdefault(state, f"haystack:{uuid.uuid4().hex}")
        return run

    def _keys(self, state: State) -> tuple[str, str | None]:
        return self.hook.keys(self._run_id(state))

    # -- the hook points ---------------------------------------------------------------------

    def _before_run(self, state: State) -> None:
        """A new run: its own session, or a new progress epoch in ``session=``'s; its prompt
        (the text of the last user message it starts with) is the task an advisor is told."""
        self.hook.run_marker(self._keys(state), self._run_id(state), self._prompt(state))

    def _prompt(self, state: State) -> str | None:
        try:
            for message in reversed(state.data.get("messages") or []):
                if isinstance(message, ChatMessage) and message.is_from(ChatRole.USER):
                    return "\n".join(message.texts) or None
        except Exception as exc:  # never let the prompt keep the run from its epoch
            self.guard.report_internal_error("integration.haystack.prompt", exc)
        return None

    def _before_tool(self, state: State) -> None:
        messages = state.data.get("messages") or []
        if not messages or not messages[-1].tool_calls:
            return
        last: ChatMessage = messages[-1]
        keys = self._keys(state)
        allowed: list[ToolCall] = []
        answered: list[ChatMessage] = []
        stop = False
        for call in last.tool_calls:
            ticket = self.hook.before(call.tool_name, call.arguments, call.id, keys)
            decision = ticket.decision
            if not decision.blocks:
                allowed.append(call)
                self._remember(call, ticket)
                continue
            stop = stop or decision.action is Action.STOP
            answered += [
                _assistant(last, [call]),
                ChatMessage.from_tool(tool_result=decision.message, origin=call, error=True),
            ]
        if not answered:
            return
        rest = [_assistant(last, allowed)] if allowed else []
        state.set("messages", [*messages[:-1], *answered, *rest], handler_override=replace_values)
        if stop:
            state.set("stop_run", STOP_REASON)

    def _after_tool(self, state: State) -> None:
        messages: list[ChatMessage] = list(state.data.get("messages") or [])
        changed = stop = False
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            result = message.tool_call_result
            if result is None:
                break  # the tool results of this step are the last messages
            pending = self._pending.pop(id(result.origin), None)
            if pending is None or pending[0] is not result.origin:
                continue
            ticket = pending[1]
            text = result.result if isinstance(result.result, str) else None
            post = self.hook.after(ticket, result=text, error=result.error)
            if self.hook.ends_run(post):
                stop = True
                addition: str | None = post.message
            else:
                addition = self.hook.reminder(ticket, post)
            if addition is not None and text is not None:
                messages[index] = ChatMessage.from_tool(
                    tool_result=f"{text}\n\n{addition}",
                    origin=result.origin,
                    error=result.error,
                    meta=message.meta,
                )
                changed = True
        if changed:
            state.set("messages", messages, handler_override=replace_values)
        if stop:
            state.set("stop_run", STOP_REASON)

    def _remember(self, call: ToolCall, ticket: Ticket) -> None:
        pending = self._pending
        pending[id(call)] = (call, ticket)
        while len(pending) > _MAX_PENDING:
            pending.popitem(last=False)


def _assistant(message: ChatMessage, calls: list[ToolCall]) -> ChatMessage:
    """``message`` (the model's) with only ``calls``, as ``ConfirmationHook`` rebuilds it."""
    return ChatMessage.from_assistant(
        text=message.text,
        meta=message.meta,
        name=message.name,
        tool_calls=calls,
        reasoning=message.reasoning,
    )
