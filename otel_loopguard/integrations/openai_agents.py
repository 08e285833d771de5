"""OpenAI Agents SDK: tool guardrails on every function tool of an agent.

::

    from agents import Agent
    from otel_loopguard.integrations.openai_agents import guard_agent

    agent = guard_agent(Agent(name="researcher", tools=[search]), guard)

A tool input guardrail asks the guard before each call; a blocked call is answered with
``ToolGuardrailFunctionOutput.reject_content(message)``: the tool does not run and the model reads
the message as its result. A tool output guardrail reports the result and, for a reminder, hands
the model the result with the reminder appended. A stop ends the run (``on_stop="end"``,
default): the input guardrail trips (``raise_exception``), so ``Runner.run`` raises
``ToolInputGuardrailTripwireTriggered`` whose ``output.output_info`` is the
:class:`~otel_loopguard.Decision`. A stop the guard concludes from a call's result (``phase``
post, e.g. the same call failing the same way again) trips the output guardrail the same way:
``ToolOutputGuardrailTripwireTriggered``, the post :class:`~otel_loopguard.Decision` in
``output.output_info``; with ``on_stop="message"`` the stop text is added to the result instead.
The SDK hands a failed tool's error text to the output guardrail as its output; the guardrail
tells it from a result by the error the SDK puts on the tool's function span (with the SDK's
tracing disabled there is no span, and the outcome is reported as unknown).

With ``processor=`` (on the provider that OpenInference's ``OpenAIAgentsInstrumentor`` writes
to), the guardrails run inside the tool span and ask with the processor's keys; each call counts
once. Session otherwise: the run's ``group_id`` (``RunConfig(group_id=...)``, the SDK's
conversation grouping), else the SDK trace id of the run; a new run in a group starts a new
progress epoch (with the SDK's tracing disabled every run has the same no-op trace, so runs are
not told apart). The latest user message of the run's input (``turn_input``: its text, or the
text parts of its content) is what an advisor is told the task is. Guardrails run on the runner's
event loop and never raise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._guard import LoopGuard
from .._policy import Action
from ._hook import OnStop, Ticket, ToolHook, missing_framework

try:
    from agents import (
        Agent,
        FunctionTool,
        ToolGuardrailFunctionOutput,
        ToolInputGuardrail,
        ToolInputGuardrailData,
        ToolOutputGuardrail,
        ToolOutputGuardrailData,
    )
    from agents.tracing import FunctionSpanData, get_current_span, get_current_trace
    from agents.tracing.spans import NoOpSpan
    from agents.tracing.traces import NoOpTrace
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("openai_agents", "the OpenAI Agents SDK", "openai-agents") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["LoopGuardGuardrails", "guard_agent"]

_GUARDRAIL_NAME = "loopguard"


class LoopGuardGuardrails:
    """The input and output tool guardrails that enforce the guard's decisions.

    ``input`` and ``output`` go in a function tool's ``tool_input_guardrails`` and
    ``tool_output_guardrails``; :func:`guard_agent` adds them to every function tool of an
    agent. Options as in :mod:`otel_loopguard.integrations`.
    """

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
        self.input: ToolInputGuardrail[Any] = ToolInputGuardrail(
            guardrail_function=self._before, name=_GUARDRAIL_NAME
        )
        self.output: ToolOutputGuardrail[Any] = ToolOutputGuardrail(
            guardrail_function=self._after, name=_GUARDRAIL_NAME
        )

    def _keys(self, data: ToolInputGuardrailData) -> tuple[str, str | None]:
        context = data.context
        run_config = getattr(context, "run_config", None)
        group = getattr(run_config, "group_id", None)
        sdk_trace = get_current_trace()
        trace_id = getattr(sdk_trace, "trace_id", None)
        if group is None:
            group = getattr(sdk_trace, "group_id", None)
        agent_name = getattr(data.agent, "name", None)
        keys = self.hook.keys(group or trace_id, agent_name)
        try:
            task = _task(getattr(context, "turn_input", None))
        except Exception as exc:  # never let reading the prompt break the agent
            self.guard.report_internal_error("integration.openai_agents.task", exc)
            task = None
        if sdk_trace is None or isinstance(sdk_trace, NoOpTrace):
            # tracing disabled: no run id to tell this run from the last, only its prompt
            if task:
                self.guard.set_task(keys[0], task, agent=keys[1])
        else:
            self.hook.run_marker(keys, trace_id, task)
        return keys

    def _before(self, data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        context = data.context
        ticket = self.hook.before(
            context.tool_name, context.tool_arguments, context.tool_call_id, self._keys(data)
        )
        decision = ticket.decision
        if not decision.blocks:
            self._tickets[context.tool_call_id] = ticket
            return ToolGuardrailFunctionOutput.allow(output_info=decision)
        if decision.action is Action.STOP:
            return ToolGuardrailFunctionOutput.raise_exception(output_info=decision)
        return ToolGuardrailFunctionOutput.reject_content(decision.message, output_info=decision)

    def _after(self, data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
        ticket = self._tickets.pop(data.context.tool_call_id, None)
        if ticket is None:
            return ToolGuardrailFunctionOutput.allow()
        post = self.hook.after(ticket, result=data.output, error=_failed())
        if self.hook.ends_run(post):
            return ToolGuardrailFunctionOutput.raise_exception(output_info=post)
        reminder = self.hook.reminder(ticket, post)
        if reminder is None:
            return ToolGuardrailFunctionOutput.allow(output_info=ticket.decision)
        # reject_content hands the model this text instead of the output: the output itself,
        # then the reminder.
        return ToolGuardrailFunctionOutput.reject_content(
            f"{data.output}\n\n{reminder}", output_info=ticket.decision
        )


def _task(turn_input: object) -> str | None:
    """The text of the latest user message in a run's input items (its string content, or the
    text parts of a list of content parts)."""
    if not isinstance(turn_input, list):
        return None
    for item in reversed(turn_input):
        if not isinstance(item, dict) or item.get("role") != "user":
            continue
        content = item.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = [
                part["text"]
                for part in content
                if isinstance(part, dict)
                and part.get("type") == "input_text"
                and isinstance(part.get("text"), str)
            ]
            return "\n".join(texts) or None
        return None
    return None


def _failed() -> bool | None:
    """Whether the call whose output guardrails run now failed: the SDK turns a tool's exception
    into the output text and puts the error on the call's function span, current here. ``None``
    (unknown) without a span (the SDK's tracing disabled)."""
    span = get_current_span()
    if (
        span is None
        or isinstance(span, NoOpSpan)
        or not isinstance(span.span_data, FunctionSpanData)
    ):
        return None
    return span.error is not None


def guard_agent(
    agent: Agent[Any],
    guard: LoopGuard | None = None,
    *,
    processor: LoopGuardSpanProcessor | None = None,
    session: str | Callable[[], str] | None = None,
    append_reminders: bool = True,
    on_stop: OnStop = "end",
) -> Agent[Any]:
    """Add the guard's tool guardrails to every function tool of ``agent`` (in place; tools it
    gets later are not covered) and return the agent."""
    guardrails = LoopGuardGuardrails(
        guard,
        processor=processor,
        session=session,
        append_reminders=append_reminders,
        on_stop=on_stop,
    )
    for tool in agent.tools:
        if isinstance(tool, FunctionTool):
            tool.tool_input_guardrails = [*(tool.tool_input_guardrails or ()), guardrails.input]
            tool.tool_output_guardrails = [*(tool.tool_output_guardrails or ()), guardrails.output]
    return agent
