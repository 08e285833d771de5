"""LlamaIndex agents: the guard in the ``call_tool`` workflow step of an agent class.

::

    from llama_index.core.agent.workflow import FunctionAgent
    from otel_loopguard.integrations.llama_index import guard_class

    GuardedAgent = guard_class(FunctionAgent, guard)
    agent = GuardedAgent(name="researcher", tools=[search], llm=llm)

LlamaIndex's agents have no pre-tool hook; each tool call is a ``ToolCall`` event handled by the
``call_tool`` workflow step (``FunctionAgent``, ``ReActAgent``, ``CodeActAgent`` and the
multi-agent ``AgentWorkflow`` alike), and overriding a step in a subclass is how LlamaIndex is
extended. :func:`guard_class` makes that subclass (``LoopGuard<Base>``); a subclass of your own can
call :meth:`LoopGuardToolCalls.call_tool` from its ``call_tool`` step instead.

Before each call the guard is asked (with the model's call id, ``ev.tool_id``); a blocked call is
answered with ``ToolCallResult(tool_output=ToolOutput(content=message, is_error=True))`` without
running the tool: the model reads the message as the tool result. After a call the result is
reported and a reminder is appended to its text. A stop ends the run (``on_stop="end"``,
default): the call is answered with the stop text as a ``return_direct`` result, which ends the
run without another model call, the stop text as the agent's response. A stop the guard
concludes from a call's result (``phase`` post, e.g. the same call failing the same way again:
an ``is_error`` output, the tool raised) ends the run the same way, after the call. With
``on_stop="message"`` the model reads the stop text and the run goes on.

With ``processor=`` (on the provider that OpenInference's LlamaIndex instrumentation writes to)
the step asks with the processor's keys; each call counts once (the tool span, which has no call
id, ends before the step reports; a blocked call has no tool span). Session otherwise:
``session=``, else the conversation, an id kept in the workflow context's store
(``loopguard_session``), so runs that continue a ``Context`` share it; the agent label is the
agent's name. Each run starts a new progress epoch, and its user message (the text LlamaIndex
keeps in the store as ``user_msg_str``) is what an advisor is told the agent's task is. The step
runs on the workflow's event loop and never raises.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, TypeVar

from .._guard import LoopGuard
from .._policy import Action, Decision
from ._hook import OnStop, Ticket, ToolHook, missing_framework

try:
    from llama_index.core.agent.workflow import ToolCall, ToolCallResult
    from llama_index.core.llms import TextBlock
    from llama_index.core.tools import ToolOutput
    from llama_index.core.workflow import Context, Workflow, step
    from llama_index_instrumentation.dispatcher import active_instrument_tags
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("llama_index", "LlamaIndex", "llama-index") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["SESSION_KEY", "LoopGuardToolCalls", "guard_class"]

#: The key of the conversation's session id in the workflow context's store.
SESSION_KEY: Final = "loopguard_session"
#: The instrumentation tag LlamaIndex workflows set to the id of the current run.
_RUN_ID_TAG: Final = "llamaindex.run_id"
#: The key under which LlamaIndex's agents keep the text of the run's user message.
_PROMPT_KEY: Final = "user_msg_str"

W = TypeVar("W", bound=Workflow)
CallNext = Callable[[Context, ToolCall], Awaitable[ToolCallResult]]


def _text_only(output: ToolOutput) -> bool:
    return all(isinstance(block, TextBlock) for block in output.blocks)


class LoopGuardToolCalls:
    """Enforces the guard's decisions on the tool calls of a LlamaIndex agent workflow.
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

    async def _keys(self, workflow: Workflow, ctx: Context) -> tuple[str, str | None]:
        session: str | None = None
        agent = getattr(workflow, "name", None)
        prompt: object = None
        try:
            store = ctx.store
            session = await store.get(SESSION_KEY, default=None)
            if session is None:
                session = f"llama_index:{uuid.uuid4().hex}"
                await store.set(SESSION_KEY, session)
            # AgentWorkflow: the agent whose turn it is
            agent = await store.get("current_agent_name", default=None) or agent
            # the run's prompt: the text of its user message, as the agent's init_run keeps it
            prompt = await store.get(_PROMPT_KEY, default=None)
        except Exception as exc:  # a typed store without the key: the run is the session
            self.guard.report_internal_error("integration.llama_index.store", exc)
        run_id = active_instrument_tags.get().get(_RUN_ID_TAG)
        keys = self.hook.keys(session or run_id, agent if isinstance(agent, str) else None)
        self.hook.run_marker(keys, run_id, prompt if isinstance(prompt, str) else None)
        return keys

    async def call_tool(
        self, workflow: Workflow, ctx: Context, ev: ToolCall, call_next: CallNext
    ) -> ToolCallResult:
        """The ``call_tool`` step of ``workflow``: ask the guard, then ``call_next(ctx, ev)``
        (the base class's step) unless the call is blocked."""
        keys = await self._keys(workflow, ctx)
        ticket = self.hook.before(ev.tool_name, ev.tool_kwargs, ev.tool_id, keys)
        decision = ticket.decision
        if decision.blocks:
            result = self._answer(ev, decision.message, decision.action is Action.STOP)
            ctx.write_event_to_stream(result)
            return result
        result = await call_next(ctx, ev)
        output = result.tool_output
        post = self.hook.after(ticket, result=output.content, error=output.is_error)
        if self.hook.ends_run(post):
            return self._answer(ev, post.message, True, raw_output=output.raw_output)
        return self._with_reminder(ticket, result, post)

    def _answer(
        self, ev: ToolCall, message: str, stop: bool, raw_output: object = None
    ) -> ToolCallResult:
        """The guard's answer to a call: an error result (a denial), or the stop text as a
        result that ends the run (``return_direct`` applies to results that are no error)."""
        return ToolCallResult(
            tool_name=ev.tool_name,
            tool_kwargs=ev.tool_kwargs,
            tool_id=ev.tool_id,
            tool_output=ToolOutput(
                content=message,
                tool_name=ev.tool_name,
                raw_input=ev.tool_kwargs,
                raw_output=message if raw_output is None else raw_output,
                is_error=not stop,
            ),
            return_direct=stop,
        )

    def _with_reminder(
        self, ticket: Ticket, result: ToolCallResult, post: Decision | None
    ) -> ToolCallResult:
        reminder = self.hook.reminder(ticket, post)
        if reminder is None:
            return result
        output = result.tool_output
        if _text_only(output):
            content = self.hook.with_reminder(ticket, output.content, post)
            new_output = ToolOutput(
                content=content,
                tool_name=output.tool_name,
                raw_input=output.raw_input,
                raw_output=output.raw_output,
                is_error=output.is_error,
            )
        else:
            new_output = output.model_copy(
                update={"blocks": [*output.blocks, TextBlock(text=reminder)]}
            )
        return result.model_copy(update={"tool_output": new_output})

    def agent_class(self, base: type[W]) -> type[W]:
        """A subclass of ``base`` (an agent workflow with a ``call_tool`` step) whose
        ``call_tool`` step asks the guard first."""
        if not (isinstance(base, type) and issubclass(base, Workflow)):
            raise ValueError(f"base: expected an agent workflow class, got {base!r}")
        if not callable(getattr(base, "call_tool", None)):
            raise ValueError(f"base: {base.__name__} has no call_tool step")
        guard = self

        class Guarded(base):  # type: ignore[valid-type,misc]
            @step  # type: ignore[untyped-decorator,unused-ignore]  # untyped without LlamaIndex
            async def call_tool(self, ctx: Context, ev: ToolCall) -> ToolCallResult:
                return await guard.call_tool(self, ctx, ev, super().call_tool)

        Guarded.__name__ = Guarded.__qualname__ = f"LoopGuard{base.__name__}"
        return Guarded


def guard_class(
    base: type[W],
    guard: LoopGuard | None = None,
    *,
    processor: LoopGuardSpanProcessor | None = None,
    session: str | Callable[[], str] | None = None,
    agent: str | None = None,
    append_reminders: bool = True,
    on_stop: OnStop = "end",
) -> type[W]:
    """A subclass of the agent workflow class ``base`` (``FunctionAgent``, ``ReActAgent``,
    ``AgentWorkflow`` ...) that enforces the guard's decisions on every tool call of its
    instances. Options as in :mod:`otel_loopguard.integrations`."""
    return LoopGuardToolCalls(
        guard,
        processor=processor,
        session=session,
        agent=agent,
        append_reminders=append_reminders,
        on_stop=on_stop,
    ).agent_class(base)
