"""Replaying: feeding events to a guard on the recording's clock, and the per-session reports
this builds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from ..traces import RunStarted, feed
from ._events import MAX_PENDING_CALLS, CallFinished, CallStarted, Event, UserPrompt

if TYPE_CHECKING:
    from otel_loopguard.guard import LoopGuard
    from otel_loopguard.policy import Decision

#: Non-allow decisions kept and listed per session; the rest are only counted.
MAX_LISTED_DECISIONS: Final = 1_000


class ReplayClock:
    """The guard's clock during a replay: the latest recorded timestamp seen (seconds since the
    epoch), so idle TTLs and cooldowns follow the recording, not the wall clock. It never goes
    back; input without timestamps leaves it still."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def observe(self, timestamp: float | None) -> None:
        if timestamp is not None and timestamp > self.now:
            self.now = timestamp

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True, slots=True)
class ListedDecision:
    """One non-allow decision as listed in the report."""

    index: int
    tool: str
    rule: str | None
    action: str
    count: int


@dataclass(slots=True)
class SessionReport:
    """What the guard would have done in one session (one session id and agent)."""

    label: str
    calls: int = 0
    repeated: int = 0
    first_index: dict[str, int] = field(default_factory=dict)
    decisions: list[ListedDecision] = field(default_factory=list)
    decision_count: int = 0
    blocked: int = 0
    blocked_seconds: float = 0.0
    blocked_timed: int = 0


@dataclass(slots=True)
class _Open:
    report: SessionReport
    session: str
    agent: str | None
    tool: str
    arguments: object
    call_id: str | None
    blocked: bool
    index: int


def _first_key(action: str) -> str:
    # A rescue is a denial that carries advice: it counts as the first deny.
    return "deny" if action == "rescue" else action


class Replayer:
    """Feeds events to a guard, keeps per-session reports, and returns each call's decision.

    A transcript call is ``before_tool`` then ``after_tool`` with its recorded outcome, as a live
    hook would see it. A call the guard blocks is still reported to ``after_tool``; the guard
    ignores the outcome of a blocked call (live, it would not have run), so from the first block
    on the report is what the guard would say had the agent kept to its recorded path. Every
    blocked call counts as saved: after a stop, the rest of the run would not have happened at all.

    A recorded span is fed as the span processor feeds it: ``decide_at_span_start`` at its start
    when it carried the arguments then (:class:`CallDecidedAtStart`), ``after_tool`` at its end
    (:class:`CallObserved`); the call's decision is whichever of the two returned one.

    A conclusion the guard reaches after a call ran (``after_tool`` returning a decision with
    ``phase`` ``post``, e.g. a stop at the third identical failure) is listed under the same call
    index, after the call's own decision.
    """

    def __init__(self, guard: LoopGuard, clock: ReplayClock) -> None:
        self._guard = guard
        self._clock = clock
        self.reports: dict[tuple[str, str | None], SessionReport] = {}
        self._open: dict[tuple[int, int], _Open] = {}

    def _report(self, session: str, agent: str | None) -> SessionReport:
        key = (session, agent)
        report = self.reports.get(key)
        if report is None:
            label = session if agent is None else f"{session}/{agent}"
            report = self.reports[key] = SessionReport(label)
        return report

    def handle(self, source: int, event: Event) -> tuple[SessionReport, int, Decision] | None:
        """Feed one event from input ``source``; for a call it counts (a started, decided or
        newly observed call), return its session report, its 1-based index in the session and
        the guard's decision; for a finished call the guard concluded something about after it
        ran, the same with that post-call decision."""
        self._clock.observe(event.timestamp)
        if isinstance(event, UserPrompt):
            self._guard.user_message(event.session, agent=event.agent)
            return None
        if isinstance(event, CallFinished):
            return self._finish(source, event)
        if isinstance(event, CallStarted):
            return self._start(source, event)
        if isinstance(event, RunStarted):
            feed(self._guard, event)
            return None
        observed = feed(self._guard, event)
        if observed is None:
            return None  # already counted when its span started: only the outcome was added
        return self._count(event.session, event.agent, event.tool, observed,
                           event.duration_seconds)

    def _count(self, session: str, agent: str | None, tool: str, decision: Decision,
               duration_seconds: float | None) -> tuple[SessionReport, int, Decision]:
        """Add one counted call and its decision to its session's report. A recorded duration
        of a blocked call (spans: known as soon as the call is) is what the block would save."""
        report = self._record(session, agent, tool, decision)
        if decision.blocks and duration_seconds is not None:
            report.blocked_seconds += duration_seconds
            report.blocked_timed += 1
        return report, report.calls, decision

    def _record(self, session: str, agent: str | None, tool: str, decision: Decision
                ) -> SessionReport:
        report = self._report(session, agent)
        report.calls += 1
        if decision.repeated:
            report.repeated += 1
        self._list(report, report.calls, tool, decision)
        if decision.blocks:
            report.blocked += 1
        return report

    @staticmethod
    def _list(report: SessionReport, index: int, tool: str, decision: Decision) -> None:
        """Add a non-allow decision for call ``index`` to the report's list and firsts."""
        action = decision.action.value
        if action != "allow":
            report.first_index.setdefault(_first_key(action), index)
            report.decision_count += 1
            if len(report.decisions) < MAX_LISTED_DECISIONS:
                rule = decision.rule.value if decision.rule is not None else None
                report.decisions.append(ListedDecision(index, tool, rule, action, decision.count))

    def _start(self, source: int, event: CallStarted) -> tuple[SessionReport, int, Decision]:
        decision: Decision = self._guard.before_tool(
            event.tool, event.arguments, session=event.session, agent=event.agent,
            call_id=event.call_id,
        )
        report = self._record(event.session, event.agent, event.tool, decision)
        index = report.calls
        _remember_open(self._open, (source, event.token), _Open(
            report, event.session, event.agent, event.tool, event.arguments, event.call_id,
            decision.blocks, index,
        ))
        return report, index, decision

    def _finish(self, source: int, event: CallFinished
                ) -> tuple[SessionReport, int, Decision] | None:
        call = self._open.pop((source, event.token), None)
        if call is None:
            return None
        if call.blocked and event.duration_seconds is not None:
            call.report.blocked_seconds += event.duration_seconds
            call.report.blocked_timed += 1
        # Always reported, even when nothing is known (error and result None): it closes the
        # call the guard holds as pending, as a live hook's after_tool would.
        post = self._guard.after_tool(
            call.tool, call.arguments, session=call.session, agent=call.agent,
            call_id=call.call_id, error=event.error, result=event.result,
            duration_seconds=event.duration_seconds,
        )
        if post is None or post.action.value == "allow":
            return None
        self._list(call.report, call.index, call.tool, post)
        return call.report, call.index, post


def _remember_open(store: dict[tuple[int, int], _Open], key: tuple[int, int], value: _Open) -> None:
    store[key] = value
    if len(store) > MAX_PENDING_CALLS:
        del store[next(iter(store))]
