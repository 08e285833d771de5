"""CrewAI: before- and after-tool-call hooks, and a before-LLM-call hook that ends a stopped run.

::

    from crewai import Agent, Crew, Task
    from otel_loopguard.integrations.crewai import LoopGuardHooks

    hooks = LoopGuardHooks(guard).register()  # before the crew's first kickoff
    Crew(agents=[agent], tasks=[task]).kickoff()

CrewAI's tool hooks are global (``register_before_tool_call_hook`` and friends, which
:meth:`LoopGuardHooks.register` calls; :meth:`~LoopGuardHooks.unregister`, or ``with
LoopGuardHooks(guard).register():``, removes them). Register them before other hooks that rewrite
tool results, and before the crew's first kickoff: an agent takes a snapshot of the LLM hooks
when it first runs.

Before each call the guard is asked; a blocked call is refused (the before hook returns
``False``, so the tool does not run) and the after hook, which CrewAI runs for a refused call
too, replaces CrewAI's fixed "Tool execution blocked by hook" text with the guard's message: the
model reads it as the tool result. After a call that ran, the result is reported and a reminder
is appended to it. A stop ends the run (``on_stop="end"``, default): the call is refused with the
stop text as its result, and the next model call of that agent raises :class:`LoopStopped` (a
:class:`~otel_loopguard.LoopDetected` and a CrewAI ``HookAborted``, the one exception CrewAI lets
out of a hook) out of ``kickoff()``. A stop the guard concludes from a call's result (``phase``
post, e.g. the same call failing the same way again) ends the run the same way; with
``on_stop="message"`` the stop text is added to the result instead. A failure is a tool that
raised (CrewAI hands the model ``"Error executing tool: ..."``) or returned a ``ToolFailure``.
In ReAct text mode CrewAI itself refuses a call whose tool and input are its last call's ("I
tried reusing the same input, ..."), without running it: the hooks read that as a call that did
not run and learnt nothing, ending as the run it repeats did (no progress), so the guard's
ladder is the one it climbs when every repeat runs.

CrewAI's hooks see no call id: a call is matched to its result by its arguments (the after hook
gets the same argument dict as the before hook). With ``processor=`` (on the provider that
OpenInference's CrewAI instrumentation writes to, in its default wrapper mode), the hooks run
inside the agent span and ask with the processor's keys; each call counts once (the tool span
ends before the after hook; a refused call has no tool span). Session otherwise: the crew's id,
else the agent's; the agent label is its role. Each task an agent starts (its first model call)
starts a new progress epoch.

CrewAI's own tracing (``crewai.telemetry.tracing.telemetry_session``, which makes a
TracerProvider for the run; a host passes it ``processors=`` and ``exporters=``): put the
processor among its processors and pass it here. Its spans are never current on the crew's
thread, so inside such a session the hooks ask with the keys the processor gives that run's tool
spans: keyed by trace, those of the agent's open span (``execute agent``, found by its
``gen_ai.agent.id``); keyed by conversation, the run's ``gen_ai.conversation.id`` (when the
session was given one), else its kickoff id (``crewai.execution_uuid``, on every span of the
run). The agent is its role (``crewai.agent.role`` on its span). The after hook first waits
(up to five seconds) for CrewAI's event bus, whose threads end the tool span, so the span
reports the call before the hook does; each call counts once. A
decision drawn at a tool span's end goes through the run's provider, so it reaches the run's
exporters.

CrewAI stops a run by itself on the fifth identical (tool, arguments, result) call; the guard's
reminders and denials change the result text, and it denies and stops earlier with the default
policy. Hooks run on the crew's threads and never raise except to end a run on stop.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace

from .._conventions._keys import GEN_AI_AGENT_ID
from .._guard import LoopGuard
from .._policy import Action, Decision, LoopDetected
from .._spans import KeyBy
from ._hook import OnStop, Ticket, ToolHook, missing_framework

try:
    from crewai.events.event_bus import crewai_event_bus
    from crewai.hooks import (
        HookAborted,
        LLMCallHookContext,
        ToolCallHookContext,
        register_after_tool_call_hook,
        register_before_llm_call_hook,
        register_before_tool_call_hook,
        unregister_after_tool_call_hook,
        unregister_before_llm_call_hook,
        unregister_before_tool_call_hook,
    )
    from crewai.telemetry.tracing.context import get_telemetry_context
    from crewai.tools.tool_failure import ToolFailure
    from crewai.utilities.i18n import I18N_DEFAULT
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("crewai", "CrewAI", "crewai") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["LoopGuardHooks", "LoopStopped"]

#: The text CrewAI gives the model for a call a before hook refused (``... Tool: <name>``).
_BLOCKED_PREFIX: Final = "Tool execution blocked by hook."
#: The text CrewAI gives the model for a tool that raised.
_ERROR_PREFIX: Final = "Error executing tool:"
#: The text CrewAI gives the model, without running the tool, for a call whose tool and input
#: are its last call's (ReAct text mode: "I tried reusing the same input, ...").
_REPEATED_INPUT: Final = str(I18N_DEFAULT.errors("task_repeated_usage")).strip()
#: How long the after hook waits, under CrewAI's own tracing, for the event bus to end the call's
#: tool span (its handlers run on the bus's threads) before reporting the call itself.
_SPAN_WAIT_SECONDS: Final = 5.0
#: Calls between their before and after hooks, and stops waiting for the next model call,
#: remembered at most (oldest forgotten first): a hook CrewAI never pairs must not leak.
_MAX_PENDING: Final = 4096


class LoopStopped(LoopDetected, HookAborted):
    """The guard stopped the run: raised by the before-LLM-call hook, so CrewAI lets it out of
    ``kickoff()`` (it swallows any other exception a hook raises). A
    :class:`~otel_loopguard.LoopDetected`: ``code`` is ``"stop"``, ``message`` the stop text."""

    def __init__(self, decision: Decision) -> None:
        LoopDetected.__init__(self, decision)
        self.reason = self.message
        self.source: Any = None


def _framework_keys(crew: Any, agent: Any) -> tuple[str | None, str | None]:
    owner = crew if getattr(crew, "id", None) is not None else agent
    owner_id = getattr(owner, "id", None)
    role = getattr(agent, "role", None)
    return (
        f"crewai:{owner_id}" if owner_id is not None else None,
        role if isinstance(role, str) else None,
    )


def _traced_keys(agent: Any) -> tuple[str | None, str | None] | None:
    """Under CrewAI's own tracing (a telemetry session active on this thread): the run's
    conversation id, else its kickoff id (what every span of the run carries:
    ``gen_ai.conversation.id``, ``crewai.execution_uuid``), and the agent's role (on its agent
    span: ``crewai.agent.role``); else ``None``."""
    context = get_telemetry_context()
    if context is None:
        return None
    session = context.conversation_id or context.kickoff_id
    role = getattr(agent, "role", None)
    return (
        session if isinstance(session, str) and session else None,
        role if isinstance(role, str) else None,
    )


def _refused_repeat(raw: object) -> bool:
    """Whether CrewAI refused the call itself, as a repeat of its last call (it did not run)."""
    return isinstance(raw, str) and bool(_REPEATED_INPUT) and raw.strip() == _REPEATED_INPUT


def _agent_span(agent: Any) -> trace.Span | None:
    """Under CrewAI's own tracing, the open span of ``agent``'s run (``gen_ai.agent.id`` is
    the agent's id), else ``None``."""
    context = get_telemetry_context()
    agent_id = getattr(agent, "id", None)
    if context is None or agent_id is None:
        return None
    wanted = str(agent_id)
    spans: list[trace.Span] = list(context.active_spans.values())
    for span in spans:
        attributes = getattr(span, "attributes", None) or {}
        if attributes.get(GEN_AI_AGENT_ID) == wanted and span.is_recording():
            return span
    return None


def _failed(raw: object, text: object) -> bool:
    """Whether a call that ran failed: it returned a ``ToolFailure``, or raised (CrewAI then
    gives the model ``"Error executing tool: ..."`` as both the raw and the shown result)."""
    if isinstance(raw, ToolFailure):
        return True
    return isinstance(raw, str) and raw == text and raw.startswith(_ERROR_PREFIX)


def _outcome_key(ticket: Ticket) -> tuple[str, str | None, str, str] | None:
    """What a call's last outcome is remembered under; ``None`` for arguments JSON cannot
    hold."""
    try:
        arguments = json.dumps(ticket.arguments, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return None
    return ticket.session, ticket.agent, ticket.tool, arguments


class LoopGuardHooks:
    """CrewAI hooks that enforce the guard's decisions on every tool call.
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
        # id(tool_input) -> (the dict, its ticket): CrewAI hands both hooks of a call the same
        # argument dict and nothing else that ties them together.
        self._tickets: OrderedDict[int, tuple[object, Ticket]] = OrderedDict()
        # keys -> a stop to raise at that agent's next model call
        self._stops: OrderedDict[tuple[str, str | None], Decision] = OrderedDict()
        # (session, agent, tool, arguments as JSON) -> how its last run ended (result, failed):
        # the outcome of a call CrewAI refuses as a repeat of it
        self._outcomes: OrderedDict[tuple[str, str | None, str, str], tuple[object, bool]] = (
            OrderedDict()
        )

    # -- registration ------------------------------------------------------------------------

    def register(self) -> LoopGuardHooks:
        """Register the three hooks globally (CrewAI's tool and LLM hooks are process-wide);
        returns ``self``, a context manager that unregisters them."""
        register_before_tool_call_hook(self.before_tool_call)
        register_after_tool_call_hook(self.after_tool_call)
        register_before_llm_call_hook(self.before_llm_call)
        return self

    def unregister(self) -> None:
        """Remove the hooks :meth:`register` added (agents that already ran keep their snapshot
        of the LLM hooks)."""
        unregister_before_tool_call_hook(self.before_tool_call)
        unregister_after_tool_call_hook(self.after_tool_call)
        unregister_before_llm_call_hook(self.before_llm_call)

    def __enter__(self) -> LoopGuardHooks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.unregister()

    # -- the hooks ---------------------------------------------------------------------------

    def _keys(self, context: ToolCallHookContext | LLMCallHookContext) -> tuple[str, str | None]:
        processor = self.hook.processor
        if processor is not None:
            # CrewAI's own spans are never current on the crew's thread (a current span there
            # is another tracer's): the processor keys them by the run's ids, or by the trace
            # and the agent span
            keys = self._traced_keys(processor, context.agent)
            if keys is not None:
                return keys
        return self.hook.keys(*_framework_keys(context.crew, context.agent))

    def _traced_keys(
        self, processor: LoopGuardSpanProcessor, agent: Any
    ) -> tuple[str, str | None] | None:
        """The processor's keys for this agent's calls under CrewAI's own tracing; ``None``
        outside it (or, keyed by trace, before the agent's span is there)."""
        traced = _traced_keys(agent)
        if traced is None:
            return None
        if processor.key_by is KeyBy.CONVERSATION:
            return self.hook.keys(*traced, current_span=False)
        span = _agent_span(agent)
        if span is None:
            return None
        with trace.use_span(span, end_on_exit=False):
            return processor.current_session()

    def before_llm_call(self, context: LLMCallHookContext) -> None:
        """For ``register_before_llm_call_hook``: raises :class:`LoopStopped` for a stop decided
        at this agent's last tool calls; the first model call of a task starts a new epoch."""
        keys = self._keys(context)
        if context.iterations == 0:
            task = getattr(context.task, "description", None)
            self.hook.run_marker(keys, object(), task if isinstance(task, str) else None)
        stop = self._stops.pop(keys, None)
        if stop is not None:
            raise LoopStopped(stop)

    def before_tool_call(self, context: ToolCallHookContext) -> bool | None:
        """For ``register_before_tool_call_hook``: ``False`` refuses the call."""
        arguments = context.tool_input
        ticket = self.hook.before(context.tool_name, arguments, None, self._keys(context))
        self._remember(arguments, ticket)
        decision = ticket.decision
        if not decision.blocks:
            return None
        if decision.action is Action.STOP:
            self._stop((ticket.session, ticket.agent), decision)
        return False

    def after_tool_call(self, context: ToolCallHookContext) -> str | None:
        """For ``register_after_tool_call_hook``: the result the model reads, or ``None`` to
        keep CrewAI's."""
        pending = self._tickets.pop(id(context.tool_input), None)
        if pending is None or pending[0] is not context.tool_input:
            return None
        if self.hook.processor is not None and get_telemetry_context() is not None:
            # CrewAI's own tracing ends the tool span on the event bus's threads, at an event
            # emitted before this hook: let it report the call first, as a span that ends before
            # the hook does, so that a late span never takes the next identical call for its own
            crewai_event_bus.flush(timeout=_SPAN_WAIT_SECONDS)
        ticket = pending[1]
        if ticket.decision.blocks:
            return ticket.decision.message
        result = context.tool_result
        if isinstance(result, str) and result.startswith(_BLOCKED_PREFIX):
            return None  # another hook refused it: it did not run
        raw = context.raw_tool_result
        ran = _outcome_key(ticket)
        if _refused_repeat(raw):
            # CrewAI refused it as a repeat of its last call: not run, and nothing learnt, so
            # it ends as that run did (no progress; a changed "result" would read as polling)
            last = self._outcomes.get(ran) if ran is not None else None
            post = self.hook.after(
                ticket,
                result=last[0] if last is not None else None,
                error=last[1] if last is not None else None,
            )
        else:
            failed = _failed(raw, result)
            post = self.hook.after(ticket, result=result, error=failed)
            if ran is not None:
                self._remember_outcome(ran, result, failed)
        if self.hook.ends_run(post):
            self._stop((ticket.session, ticket.agent), post)
            return post.message
        if isinstance(result, str):
            return self.hook.with_reminder(ticket, result, post)
        return None

    # -- bookkeeping -------------------------------------------------------------------------

    def _remember(self, arguments: object, ticket: Ticket) -> None:
        tickets = self._tickets
        tickets[id(arguments)] = (arguments, ticket)
        if len(tickets) > _MAX_PENDING:
            tickets.popitem(last=False)

    def _remember_outcome(
        self, ran: tuple[str, str | None, str, str], result: object, failed: bool
    ) -> None:
        outcomes = self._outcomes
        outcomes[ran] = (result, failed)
        outcomes.move_to_end(ran)
        if len(outcomes) > _MAX_PENDING:
            outcomes.popitem(last=False)

    def _stop(self, keys: tuple[str, str | None], decision: Decision) -> None:
        """End the run at this agent's next model call (a stop only reaches here with
        ``on_stop="end"``)."""
        self._stops[keys] = decision
        if len(self._stops) > _MAX_PENDING:
            self._stops.popitem(last=False)
