"""The host answer protocol, shared by every entrance that answers a coding agent's hook.

Three entrances give a host its answers: the command hooks' local backend
(:class:`~._runner.LocalBackend`, a guard on the session kept in SQLite), the remote backend
(:class:`~._remote.RemoteBackend`, which asks ``otel-loopguard serve``) and serve's decision API
(``POST /v1/decisions/before``, ``/after``) that the remote backend asks. The same events must
get the same answers from each, so the rules are here, once:

- :func:`decide_before`: count a call before it runs; a reminder for a host that shows text
  only with a call's result waits in a :class:`Reminders` under :func:`reminder_ref` (the call
  id, else the call's :func:`call_signature`).
- :func:`answer_before`: what the host is told before the call (deny, rescue and stop block it;
  a reminder goes out only where the host takes context before a call).
- :func:`decide_after`: report how a call ended; a call counted before it ran gets the reminder
  that waited for it, or the stop the guard concludes from its result (``phase`` post); a call
  counted only now gets :func:`after_the_fact` (it can only be reminded about, or the run
  stopped).
- :class:`Backend` and :class:`Unavailable`: the role of a backend of the command hooks, and how
  it says it cannot decide; :class:`Misconfigured` when the reason is the hook's own
  configuration, which the user has to fix (so the host shows it to the user).

Pure: no I/O, no state store, no HTTP; neither the runner nor the remote backend is imported.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from .._calls import SIGNATURE_CHARS, args_key, canonical_arguments, canonical_json, tool_name
from .._policy import Action, Decision, Phase, Step, message_for
from ..config import Policy
from ._hosts import ALLOWED, Answer, HookEvent, Host

if TYPE_CHECKING:
    from .._guard import LoopGuard

__all__ = [
    "Backend",
    "Misconfigured",
    "Reminders",
    "Unavailable",
    "after_the_fact",
    "answer_before",
    "call_signature",
    "decide_after",
    "decide_before",
    "reminder_ref",
]


class Unavailable(Exception):
    """The guard cannot decide (policy or state store unusable, server not answering); the
    message says why."""


class Misconfigured(Unavailable):
    """The guard cannot decide because the hook's own configuration cannot be used (a policy
    or plugin file, the command line, a token setting): the user has to fix it, so a call
    allowed without a check is answered with the message for the user as well (with
    ``--fail-closed`` the denial's reason carries it). The message names the file or option and
    the problem."""


class Backend(Protocol):
    """Decides hook events. Raises :class:`Unavailable` when it cannot."""

    def answer(self, host: Host, event: HookEvent) -> Answer: ...


class Reminders(Protocol):
    """Where reminders decided before a call wait for that call's result, by
    :func:`reminder_ref`. ``len`` 0 means none waits (the signature is then not computed)."""

    def __len__(self) -> int: ...

    def hold(self, ref: str, text: str) -> None:
        """Keep ``text`` under ``ref`` (newest last; holding again renews)."""
        ...

    def take(self, ref: str) -> str | None:
        """The text kept under ``ref``, removed; ``None`` when there is none."""
        ...


def decide_before(
    guard: LoopGuard,
    tool: str,
    arguments: object,
    *,
    session: str,
    agent: str | None,
    call_id: str | None,
    held: Reminders | None,
) -> Decision:
    """Count a call before it runs and return the guard's decision. ``held``: where a reminder
    waits for the call's result when the caller shows text only then (``None``: the caller
    shows it now). Every answer names the call (tool, session, signature), the first one too:
    the guard's plain allow does not, to keep its hot path lean."""
    decision = guard.before_tool(tool, arguments, session=session, agent=agent, call_id=call_id)
    if not decision.tool:
        decision = replace(
            decision,
            tool=tool_name(tool),
            session=session,
            signature=call_signature(tool, arguments, guard.policy),
        )
    if held is not None and decision.action is Action.REMIND:
        held.hold(reminder_ref(call_id, decision.signature), decision.message)
    return decision


def decide_after(
    guard: LoopGuard,
    tool: str,
    arguments: object,
    *,
    session: str,
    agent: str | None,
    call_id: str | None,
    error: bool | None,
    result: object,
    duration_seconds: float | None,
    held: Reminders,
    policy: Policy,
) -> tuple[Decision | None, Answer]:
    """Report how a call ended: the guard's decision and what to show with the result.

    For a call counted before it ran, the decision is ``None`` and the reminder that waited in
    ``held`` is shown, unless the guard concludes from the result that the run is stuck now
    (``phase`` post): then that decision, shown by :func:`after_the_fact` (a stop ends the run;
    in advise mode a reminder). For a call counted only now, its decision (or that conclusion)
    and :func:`after_the_fact` (``policy``: the guard's)."""
    decision = guard.after_tool(
        tool,
        arguments,
        session=session,
        agent=agent,
        call_id=call_id,
        error=error,
        result=result,
        duration_seconds=duration_seconds,
    )
    kept = None
    if len(held) and (decision is None or decision.phase is Phase.POST):
        # The reminder held for this call: shown now, or dropped for the post-call conclusion.
        kept = held.take(
            reminder_ref(
                call_id, None if call_id is not None else call_signature(tool, arguments, policy)
            )
        )
    if decision is not None:
        return decision, after_the_fact(decision, arguments, policy)
    return None, (Answer(Action.REMIND, kept) if kept else ALLOWED)


def answer_before(host: Host, action: Action, message: str) -> Answer:
    """What ``host`` is told before a call the guard decided ``action`` for: deny, rescue and
    stop block it; a reminder goes out only where the host takes context before a call (else it
    is kept for the call's result)."""
    if action is Action.REMIND:
        return Answer(Action.REMIND, message) if host.pre_tool_context else ALLOWED
    if action in (Action.DENY, Action.RESCUE):
        return Answer(Action.DENY, message)
    if action is Action.STOP:
        return Answer(Action.STOP, message)
    return ALLOWED


def reminder_ref(call_id: str | None, signature: str | None) -> str:
    """Where a reminder waiting for its call's result is kept: the call id, else the call's
    signature (hosts without call ids match a result to its call by its arguments)."""
    return call_id if call_id is not None else f"signature:{signature}"


def call_signature(tool: object, arguments: object, policy: Policy) -> str:
    """The signature the guard gives this call (to find a reminder kept without a call id)."""
    canonical = canonical_json(canonical_arguments(arguments, policy.ignored_args))
    return args_key(tool_name(tool), canonical)[:SIGNATURE_CHARS]


def after_the_fact(decision: Decision, arguments: object, policy: Policy) -> Answer:
    """What to show with the result of a call the guard counted only after it ran (no pre-tool
    event counted it): it can only be reminded about, or the run stopped."""
    if decision.action is Action.STOP:
        return Answer(Action.STOP, decision.message)
    if decision.action is Action.REMIND:
        return Answer(Action.REMIND, decision.message)
    if decision.action is Action.ALLOW:
        return ALLOWED
    # A denial for a call that already ran: its text ("Not run: ...") would be untrue.
    step = Step(decision.detected, decision.rule, decision.count, decision.threshold, detailed=True)
    canonical = canonical_json(canonical_arguments(arguments, policy.ignored_args))
    return Answer(
        Action.REMIND, message_for(step, decision.tool, canonical, policy, action=Action.REMIND)
    )
