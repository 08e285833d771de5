"""Semantic Kernel: an auto function invocation filter.

::

    from semantic_kernel.filters import FilterTypes
    from otel_loopguard.integrations.semantic_kernel import LoopGuardFilter

    kernel.add_filter(FilterTypes.AUTO_FUNCTION_INVOCATION, LoopGuardFilter(guard))
    # or LoopGuardFilter(guard).add_to(agent.kernel)

The filter runs for each function the model calls through ``FunctionChoiceBehavior.Auto()``,
before the function is invoked, and sees the model's call id. It asks the guard; a blocked call
is answered with ``context.function_result`` set to the guard's message without calling
``next``: the function does not run and the model reads the message as its result. After a call
it reports the result and appends a reminder to a string result. A stop ends the run
(``on_stop="end"``, default): the call is answered with the stop text and ``context.terminate``
is set, so the auto-invoke loop ends without another model call and the response is that
function result. A stop the guard concludes from a call's result (``phase`` post, e.g. the same
call failing the same way again) ends it the same way, the stop text appended to the result;
with ``on_stop="message"`` the model reads the stop text and the run goes on. A failure is a
function that raised (Semantic Kernel hands the model ``"An error occurred while invoking the
function ..."``).

Tools are named as the model calls them, ``<plugin>-<function>`` (``tools-search``), as on
Semantic Kernel's ``execute_tool`` spans. With ``processor=`` (on the provider Semantic Kernel's
tracer writes to; its spans carry the arguments only with
``SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS_SENSITIVE=true``), the filter runs
inside the auto-invoke loop's span and asks with the processor's keys; each call counts once
(the tool span, with the call id, ends before the filter reports; a blocked call has no tool
span). Session otherwise: the chat history the loop works on (one per agent invocation: pass
``session=`` to keep a conversation's state across them); a new user message in it starts a new
progress epoch, and the last user message's text is what an advisor is told the agent's task
is. The filter runs on the kernel's event loop (concurrently for the calls of one model turn)
and never raises.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._guard import LoopGuard
from .._policy import Action
from ._hook import OnStop, ToolHook, missing_framework

try:
    from semantic_kernel.contents import TextContent
    from semantic_kernel.contents.utils.author_role import AuthorRole
    from semantic_kernel.filters import AutoFunctionInvocationContext, FilterTypes
    from semantic_kernel.functions import FunctionResult
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("semantic_kernel", "Semantic Kernel", "semantic-kernel") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["LoopGuardFilter"]

#: What Semantic Kernel gives the model for a function that raised, before the function's name.
_ERROR_PREFIX = "An error occurred while invoking the function "


def _last_user_message(context: AutoFunctionInvocationContext) -> tuple[int | None, str | None]:
    """The position of the last user message in the loop's chat history (stable while the loop
    runs, larger for each new user message) and its text (its text items, joined), the run's
    prompt."""
    history = context.chat_history
    messages = getattr(history, "messages", None) or []
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if getattr(message, "role", None) == AuthorRole.USER:
            texts = [
                item.text
                for item in getattr(message, "items", None) or ()
                if isinstance(item, TextContent) and isinstance(item.text, str)
            ]
            return index, "\n".join(texts) or None
    return None, None


class LoopGuardFilter:
    """An ``AUTO_FUNCTION_INVOCATION`` filter that enforces the guard's decisions.
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

    def add_to(self, kernel: Any) -> LoopGuardFilter:
        """``kernel.add_filter(FilterTypes.AUTO_FUNCTION_INVOCATION, self)``; returns ``self``.
        Semantic Kernel runs the filter added first outermost."""
        kernel.add_filter(FilterTypes.AUTO_FUNCTION_INVOCATION, self)
        return self

    async def __call__(
        self,
        context: AutoFunctionInvocationContext,
        next: Callable[[AutoFunctionInvocationContext], Awaitable[None]],  # noqa: A002 - SK's name
    ) -> None:
        function = context.function
        tool = function.fully_qualified_name
        call = context.function_call_content
        call_id = getattr(call, "id", None)
        framework_session = f"semantic-kernel:{id(context.chat_history)}"
        keys = self.hook.keys(framework_session)
        self.hook.run_marker(keys, *_last_user_message(context))
        # The arguments the function is invoked with (and Semantic Kernel's span records): the
        # model's, over any the caller put in the agent's or kernel's KernelArguments.
        arguments = dict(context.arguments or {})
        ticket = self.hook.before(tool, arguments, call_id, keys)
        decision = ticket.decision
        if decision.blocks:
            context.function_result = FunctionResult(
                function=function.metadata, value=decision.message
            )
            if decision.action is Action.STOP:
                context.terminate = True
            return
        await next(context)
        result = context.function_result
        value = result.value if result is not None else None
        error = isinstance(value, str) and value.startswith(f"{_ERROR_PREFIX}{tool}:")
        post = self.hook.after(ticket, result=value, error=error)
        if self.hook.ends_run(post):
            text = post.message if value is None else f"{value}\n\n{post.message}"
            context.function_result = FunctionResult(function=function.metadata, value=text)
            context.terminate = True
            return
        if isinstance(value, str) and result is not None:
            result.value = self.hook.with_reminder(ticket, value, post)
