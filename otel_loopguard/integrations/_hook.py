"""What every framework adapter shares: the guard, the session keys, and the text for the model.

Internal. Threading contract: an adapter's hook runs on the framework's thread or event loop,
concurrently for parallel tool calls; :class:`ToolHook` keeps only small dicts whose single
operations are atomic, and never raises (a failure resolving keys falls back to the framework's
own session id; the guard's hook methods never raise).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, TypeGuard

from .._guard import LoopGuard
from .._lazy import LOGGER_NAME
from .._policy import Action, Decision, Phase

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["DEFAULT_SESSION", "OnStop", "Ticket", "ToolHook", "missing_framework"]

_log = logging.getLogger(LOGGER_NAME)

#: The session used when neither a span, the caller nor the framework names one.
DEFAULT_SESSION: Final = "default"
#: Sessions whose last run marker is remembered, to notice a new run (oldest forgotten first).
_MAX_RUN_MARKERS: Final = 1024

OnStop = Literal["end", "message"]


def missing_framework(module: str, framework: str, extra: str) -> ImportError:
    """The error an adapter raises when its framework is not installed."""
    return ImportError(
        f"otel_loopguard.integrations.{module} needs {framework}: "
        f"pip install '.[{extra}]' from a checkout of the repository"
    )


@dataclass(frozen=True, slots=True)
class Ticket:
    """One tool call between the hook before it and the hook after it."""

    tool: str
    arguments: object
    session: str
    agent: str | None
    call_id: str | None
    decision: Decision
    started: float


class ToolHook:
    """The guard as a framework hook sees it: keys, decisions, outcomes, reminders.

    ``guard`` defaults to ``processor.guard`` (so the adapter and the span processor share one
    state), else to a new :class:`LoopGuard`. ``session`` (a string or a callable returning one)
    names the session when no span of ``processor`` is current; else the framework's own id.
    ``agent`` labels the agent when no span gives one.
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
        if guard is not None and not isinstance(guard, LoopGuard):
            raise ValueError(f"guard: expected a LoopGuard, got {type(guard).__name__}")
        if processor is not None and not callable(getattr(processor, "current_session", None)):
            raise ValueError(
                f"processor: expected a LoopGuardSpanProcessor, got {type(processor).__name__}"
            )
        if guard is not None and processor is not None and processor.guard is not guard:
            raise ValueError(
                "processor: it feeds another guard; pass LoopGuardSpanProcessor(guard) "
                "to the provider, or only the processor here"
            )
        if session is not None and not (isinstance(session, str) or callable(session)):
            raise ValueError(f"session: expected a string or a callable, got {session!r}")
        if on_stop not in ("end", "message"):
            raise ValueError(f"on_stop: expected 'end' or 'message', got {on_stop!r}")
        if guard is None:
            guard = processor.guard if processor is not None else LoopGuard()
        self.guard: Final = guard
        self.processor: Final = processor
        self.append_reminders = bool(append_reminders)
        self.on_stop: OnStop = on_stop
        self._session = session
        self._agent = agent
        self._runs: OrderedDict[tuple[str, str | None], object] = OrderedDict()

    # -- keys --------------------------------------------------------------------------------

    def keys(
        self,
        framework_session: str | None = None,
        framework_agent: str | None = None,
        *,
        current_span: bool = True,
    ) -> tuple[str, str | None]:
        """(session, agent) for a call made now: the processor's keys inside one of its spans,
        else the caller's ``session``, else the framework's id, else :data:`DEFAULT_SESSION`.
        ``current_span=False``: not the processor's keys (the framework's ids are what its
        spans are keyed by, and a current span is another tracer's)."""
        if self.processor is not None and current_span:
            try:
                keys = self.processor.current_session()
            except Exception as exc:  # never let key resolution break the agent
                self.guard.report_internal_error("integration.keys", exc)
                keys = None
            if keys is not None:
                return keys
        session: str | None = None
        if self._session is not None:
            try:
                session = self._session() if callable(self._session) else self._session
            except Exception as exc:
                self.guard.report_internal_error("integration.session", exc)
        agent = self._agent if self._agent is not None else framework_agent
        return (session or framework_session or DEFAULT_SESSION), agent

    def run_marker(
        self, keys: tuple[str, str | None], marker: object, task: str | None = None
    ) -> None:
        """Start a new progress epoch when ``marker`` (a run, invocation or user-message id)
        differs from the last one seen in this session; the first marker seen only records.
        ``task``, the run's prompt when the framework has it, is what an advisor is told the
        task is."""
        if marker is None:
            return
        previous = self._runs.get(keys)
        if previous == marker:
            return
        self._runs[keys] = marker
        self._runs.move_to_end(keys)
        if len(self._runs) > _MAX_RUN_MARKERS:
            self._runs.popitem(last=False)
        if previous is not None:
            self.guard.new_run(keys[0], agent=keys[1], task=task)
        elif task:
            self.guard.set_task(keys[0], task, agent=keys[1])

    # -- the call ----------------------------------------------------------------------------

    def before(
        self,
        tool: str,
        arguments: object,
        call_id: str | None,
        keys: tuple[str, str | None],
        decision: Decision | None = None,
    ) -> Ticket:
        """Ask the guard (counting the attempt), unless ``decision`` was already made for this
        call (by the span processor at span start)."""
        session, agent = keys
        if decision is None:
            decision = self.guard.before_tool(
                tool, arguments, session=session, agent=agent, call_id=call_id
            )
        elif decision.action is Action.RESCUE:
            # Decided at the span's start, which never waits for the advisor: wait here, on the
            # thread about to run the tool, as before_tool would have.
            decision = self.guard.await_advice(decision, agent=agent)
        if self.processor is not None and decision.signature:
            # A conclusion kept at the span end of an earlier attempt that no hook took.
            self._concluded(session, agent, decision.signature)
        if decision.action is Action.STOP and self.on_stop == "message":
            decision = _as_deny(decision)
        return Ticket(tool, arguments, session, agent, call_id, decision, time.perf_counter())

    def after(
        self, ticket: Ticket, *, result: object = None, error: bool | None = False
    ) -> Decision | None:
        """Report how a call that ran ended (never for a blocked call) and return what the guard
        concluded from its result (``phase`` post) when there is something to act on: a stop
        (:meth:`ends_run` says whether it ends the run) or, in advise mode, a reminder
        (:meth:`reminder` adds it to the result); else ``None``."""
        if ticket.decision.blocks:
            return None
        post = self.guard.after_tool(
            ticket.tool,
            ticket.arguments,
            session=ticket.session,
            agent=ticket.agent,
            call_id=ticket.call_id,
            error=error,
            result=result,
            duration_seconds=time.perf_counter() - ticket.started,
        )
        if post is None and self.processor is not None and ticket.decision.signature:
            # The call's span ended first and reported it (LangGraph, Strands): the guard handed
            # its conclusion to the span. A conclusion needs repeats, so the call has a signature.
            post = self._concluded(ticket.session, ticket.agent, ticket.decision.signature)
        # A pre-phase answer here is the guard counting the call anew (keyed apart from the
        # before hook): what it would have said before the call, already acted on.
        if post is None or post.phase is not Phase.POST or post.action is Action.ALLOW:
            return None
        return post

    def _concluded(self, session: str, agent: str | None, signature: str) -> Decision | None:
        """The processor's conclusion at the span end of this call, taken (never raises)."""
        assert self.processor is not None
        try:
            return self.processor.take_concluded(session, agent, signature)
        except Exception as exc:
            self.guard.report_internal_error("integration.concluded", exc)
            return None

    def ends_run(self, post: Decision | None) -> TypeGuard[Decision]:
        """Whether ``post`` (from :meth:`after`) ends the run: a stop, with ``on_stop="end"``.
        The adapter then ends it as it ends a run on a stop before a call, with the stop text."""
        return post is not None and post.action is Action.STOP and self.on_stop == "end"

    def reminder(self, ticket: Ticket, post: Decision | None = None) -> str | None:
        """The text to add to this call's result, if any: its reminder (with
        ``append_reminders``), then the guard's conclusion after it when that does not end the
        run (a stop answered as a message, ``on_stop="message"``; a reminder in advise mode)."""
        texts = []
        decision = ticket.decision
        if self.append_reminders and decision.action is Action.REMIND and decision.message:
            texts.append(decision.message)
        if post is not None and post.message and not self.ends_run(post):
            if post.action is Action.STOP or self.append_reminders:
                texts.append(post.message)
        return "\n\n".join(texts) if texts else None

    def with_reminder(self, ticket: Ticket, result: str, post: Decision | None = None) -> str:
        """``result`` with :meth:`reminder`'s text appended (unchanged when there is none)."""
        text = self.reminder(ticket, post)
        return result if text is None else f"{result}\n\n{text}"


def _as_deny(decision: Decision) -> Decision:
    """A stop answered like a denial (``on_stop="message"``): the model reads the stop text as
    the tool result and the run goes on, so the model can wrap up itself."""
    from dataclasses import replace

    return replace(decision, action=Action.DENY)
