"""Replaying: feeding events to a guard on the recording's clock, and the per-session reports
this builds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from .._calls import (
    SIGNATURE_CHARS,
    args_key,
    canonical_arguments,
    canonical_json,
    tool_name,
)
from .._classifier import Classifier
from .._trace_events import ModelUsed, RunStarted, feed
from ._events import (
    MAX_PENDING_CALLS,
    CallFinished,
    CallStarted,
    Event,
    ModelSkipped,
    UserPrompt,
)

if TYPE_CHECKING:
    from otel_loopguard._guard import LoopGuard
    from otel_loopguard._policy import Decision
    from otel_loopguard._spend import Spend

#: Non-allow decisions kept and listed per session; the rest are only counted.
MAX_LISTED_DECISIONS: Final = 1_000
#: The detected actions, strongest first (:meth:`SessionReport.severity`).
SEVERITY_ORDER: Final = ("stop", "rescue", "deny", "remind")
#: Timelines kept while replaying, per timeline drawn: room to keep the worst sessions' timelines
#: when quiet ones started first (a quiet one is dropped for a newcomer).
TIMELINE_CANDIDATES_FACTOR: Final = 2
#: Distinct call signatures per session described in a timeline's legend; the rest are counted.
MAX_TIMELINE_SIGNATURES: Final = 50
#: Characters of canonical arguments kept per signature for a timeline's legend.
TIMELINE_PREVIEW_CHARS: Final = 200


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
    """One decision as listed in the report: the guard acted (``action`` is not allow) or
    detected something (``detected``, what the ladder reached before the mode softened it; equal
    to ``action`` in the enforce mode)."""

    index: int
    tool: str
    rule: str | None
    action: str
    count: int
    detected: str = ""

    def __post_init__(self) -> None:
        if not self.detected:
            object.__setattr__(self, "detected", self.action)


@dataclass(frozen=True, slots=True)
class TimelineCall:
    """One call as drawn on a session's timeline. ``signature`` is empty for an untracked call;
    ``action`` is what the guard answered, ``detected`` what the ladder reached (they differ
    only in the observe and advise modes); ``threshold`` the threshold the detected action was
    reached at (0 for an allowed call)."""

    index: int
    tool: str
    signature: str
    action: str
    detected: str
    rule: str | None
    count: int
    repeated: bool
    threshold: int = 0


@dataclass(frozen=True, slots=True)
class TimelineMark:
    """A new progress epoch the input shows (``kind``: ``user message`` or ``new run``), drawn
    before the call ``before_index``."""

    before_index: int
    kind: str


@dataclass(slots=True)
class SignatureSummary:
    """One call signature of a session: its tool, the start of its canonical arguments, and
    what happened to its calls (``actions``: non-allow decisions by action)."""

    tool: str
    preview: str
    calls: int = 0
    repeated: int = 0
    actions: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Timeline:
    """The bounded record of a session's calls behind ``replay --html``: the first
    ``max_calls`` calls and epoch marks; later ones are only counted (``calls_dropped``,
    ``decisions_dropped``); the first :data:`MAX_TIMELINE_SIGNATURES` signatures are described,
    the calls of later ones counted in ``other_signature_calls``."""

    max_calls: int
    calls: list[TimelineCall] = field(default_factory=list)
    marks: list[TimelineMark] = field(default_factory=list)
    signatures: dict[str, SignatureSummary] = field(default_factory=dict)
    calls_dropped: int = 0
    decisions_dropped: int = 0
    marks_dropped: int = 0
    other_signature_calls: int = 0

    def add_call(self, call: TimelineCall, canonical: object) -> None:
        """Add the next call (``canonical``: its canonical arguments, for the legend)."""
        if len(self.calls) < self.max_calls:
            self.calls.append(call)
        else:
            self.calls_dropped += 1
            if call.action != "allow":
                self.decisions_dropped += 1
        if not call.signature:
            return
        summary = self.signatures.get(call.signature)
        if summary is None:
            if len(self.signatures) >= MAX_TIMELINE_SIGNATURES:
                self.other_signature_calls += 1
                return
            summary = self.signatures[call.signature] = SignatureSummary(
                call.tool, _preview(canonical)
            )
        summary.calls += 1
        if call.repeated:
            summary.repeated += 1
        if call.action != "allow":
            summary.actions[call.action] = summary.actions.get(call.action, 0) + 1

    def add_mark(self, before_index: int, kind: str) -> None:
        if len(self.marks) < self.max_calls and before_index <= self.max_calls:
            self.marks.append(TimelineMark(before_index, kind))
        else:
            self.marks_dropped += 1


def _preview(canonical: object) -> str:
    text = canonical_json(canonical).decode("utf-8", "replace")
    if len(text) <= TIMELINE_PREVIEW_CHARS:
        return text
    return f"{text[:TIMELINE_PREVIEW_CHARS]}… (+{len(text) - TIMELINE_PREVIEW_CHARS} more chars)"


@dataclass(slots=True)
class SessionReport:
    """What the guard would have done in one session (one session id and agent).

    ``actions`` counts the non-allow decisions by action, ``detected`` what the ladder reached
    before the mode softened it (equal in the enforce mode); ``decisions`` lists (and
    ``decision_count`` counts) the calls where either is not allow. ``timeline`` is kept only
    when the replayer was asked for timelines (``replay --html``), for its first sessions."""

    label: str
    calls: int = 0
    repeated: int = 0
    first_index: dict[str, int] = field(default_factory=dict)
    decisions: list[ListedDecision] = field(default_factory=list)
    decision_count: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    detected: dict[str, int] = field(default_factory=dict)
    blocked: int = 0
    blocked_seconds: float = 0.0
    blocked_timed: int = 0
    timeline: Timeline | None = None
    #: What the session's model calls spent (``None``: the input reported no usage for it),
    #: set once the input is read (:meth:`Replayer.settle_spend`).
    spend: Spend | None = None

    def severity(self) -> tuple[int, ...]:
        """Worst first, as the HTML index sorts: the detected actions counted strongest first
        (stop, rescue, deny, remind), then the calls a deny would have saved, then the calls."""
        counts = tuple(self.detected.get(action, 0) for action in SEVERITY_ORDER)
        return (*counts, self.blocked, self.calls)


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

    With ``timeline_sessions`` above 0, sessions also keep a :class:`Timeline` of up to
    ``timeline_calls`` calls each (for ``replay --html``), at most
    ``TIMELINE_CANDIDATES_FACTOR * timeline_sessions`` at a time: when a new session starts and
    that many are kept, the timeline of the least severe session so far (fewest calls among
    equals) is dropped for it, so the worst sessions keep theirs even when they start late in
    the input (:meth:`keep_drawn_timelines` keeps the ``timeline_sessions`` worst). Memory stays
    within ``TIMELINE_CANDIDATES_FACTOR * timeline_sessions * timeline_calls`` calls.

    A conclusion the guard reaches after a call ran (``after_tool`` returning a decision with
    ``phase`` ``post``, e.g. a stop at the third identical failure) is listed under the same call
    index, after the call's own decision.
    """

    def __init__(
        self,
        guard: LoopGuard,
        clock: ReplayClock,
        *,
        timeline_sessions: int = 0,
        timeline_calls: int = 0,
    ) -> None:
        self._guard = guard
        self._clock = clock
        self.reports: dict[tuple[str, str | None], SessionReport] = {}
        self._open: dict[tuple[int, int], _Open] = {}
        self._timeline_sessions = timeline_sessions
        self._timeline_calls = timeline_calls
        # the sessions holding a timeline, in the order they started
        self._timeline_keys: dict[tuple[str, str | None], None] = {}
        self._classifier = Classifier(guard.policy) if timeline_sessions > 0 else None
        # The spend of each session last seen after one of its model calls: what it reports if
        # the guard forgot the session before the end (idle beyond the TTL, or past the bound).
        self._spent: dict[tuple[str, str | None], Spend] = {}

    def _report(self, session: str, agent: str | None) -> SessionReport:
        key = (session, agent)
        report = self.reports.get(key)
        if report is None:
            label = session if agent is None else f"{session}/{agent}"
            report = self.reports[key] = SessionReport(label)
            if self._timeline_sessions > 0:
                self._keep_timeline(key, report)
        return report

    def _keep_timeline(self, key: tuple[str, str | None], report: SessionReport) -> None:
        if len(self._timeline_keys) >= TIMELINE_CANDIDATES_FACTOR * self._timeline_sessions:
            # min() keeps the first of equals: the earliest-started of the quietest sessions
            dropped = min(
                self._timeline_keys,
                key=lambda kept: (self.reports[kept].severity(), self.reports[kept].calls),
            )
            self.reports[dropped].timeline = None
            del self._timeline_keys[dropped]
        report.timeline = Timeline(self._timeline_calls)
        self._timeline_keys[key] = None

    def keep_drawn_timelines(self) -> None:
        """Once the input is read: keep the timelines of the ``timeline_sessions`` most severe
        sessions that have one (those the HTML report draws), drop the others."""
        ranked = sorted(
            self._timeline_keys, key=lambda kept: self.reports[kept].severity(), reverse=True
        )
        for dropped in ranked[self._timeline_sessions :]:
            self.reports[dropped].timeline = None
            del self._timeline_keys[dropped]

    def settle_spend(self) -> None:
        """Once the input is read: give each session's report what its model calls spent (the
        guard's figures, with the loop spend of the calls after its last turn)."""
        for key, report in self.reports.items():
            spent = self._guard.spend(key[0], agent=key[1])
            report.spend = spent if spent is not None else self._spent.get(key)

    def _mark(self, session: str, agent: str | None, kind: str) -> None:
        # A session's first prompt comes before its first call: its report does not exist yet,
        # and the start of a timeline needs no mark. With no agent named, the mark is every
        # agent's of the session, as the guard's new epoch is.
        if agent is None:
            reports = [self.reports[key] for key in self._timeline_keys if key[0] == session]
        else:
            reports = [report] if (report := self.reports.get((session, agent))) else []
        for report in reports:
            if report.timeline is not None:
                report.timeline.add_mark(report.calls + 1, kind)

    def handle(self, source: int, event: Event) -> tuple[SessionReport, int, Decision] | None:
        """Feed one event from input ``source``; for a call it counts (a started, decided or
        newly observed call), return its session report, its 1-based index in the session and
        the guard's decision; for a finished call the guard concluded something about after it
        ran, the same with that post-call decision."""
        self._clock.observe(event.timestamp)
        if isinstance(event, UserPrompt):
            self._guard.user_message(event.session, agent=event.agent)
            self._mark(event.session, event.agent, "user message")
            return None
        if isinstance(event, CallFinished):
            return self._finish(source, event)
        if isinstance(event, CallStarted):
            return self._start(source, event)
        if isinstance(event, RunStarted):
            feed(self._guard, event)
            self._mark(event.session, event.agent, "new run")
            return None
        if isinstance(event, ModelUsed):
            feed(self._guard, event)  # the session's spend, in the guard's state
            spent = self._guard.spend(event.session, agent=event.agent)
            if spent is not None:
                self._spent[(event.session, event.agent)] = spent
            return None
        if isinstance(event, ModelSkipped):
            self._guard.model_call_skipped(event.reason)
            return None
        observed = feed(self._guard, event)
        if observed is None:
            return None  # already counted when its span started: only the outcome was added
        return self._count(
            event.session,
            event.agent,
            event.tool,
            event.arguments,
            observed,
            event.duration_seconds,
        )

    def _count(
        self,
        session: str,
        agent: str | None,
        tool: str,
        arguments: object,
        decision: Decision,
        duration_seconds: float | None,
    ) -> tuple[SessionReport, int, Decision]:
        """Add one counted call and its decision to its session's report. A recorded duration
        of a blocked call (spans: known as soon as the call is) is what the block would save."""
        report = self._record(session, agent, tool, arguments, decision)
        if decision.blocks and duration_seconds is not None:
            report.blocked_seconds += duration_seconds
            report.blocked_timed += 1
        return report, report.calls, decision

    def _record(
        self, session: str, agent: str | None, tool: str, arguments: object, decision: Decision
    ) -> SessionReport:
        report = self._report(session, agent)
        report.calls += 1
        if decision.repeated:
            report.repeated += 1
        self._list(report, report.calls, tool, decision)
        if decision.blocks:
            report.blocked += 1
        if report.timeline is not None:
            action = decision.action.value
            rule = decision.rule.value if decision.rule is not None else None
            signature, canonical = self._signature(tool, arguments, decision)
            report.timeline.add_call(
                TimelineCall(
                    report.calls,
                    tool,
                    signature,
                    action,
                    decision.detected.value,
                    rule if action != "allow" or decision.detected.value != "allow" else None,
                    decision.count,
                    decision.repeated,
                    decision.threshold,
                ),
                canonical,
            )
        return report

    @staticmethod
    def _list(report: SessionReport, index: int, tool: str, decision: Decision) -> None:
        """Add a decision for call ``index`` that acted or detected something to the report's
        list, counts and firsts (the firsts are of what the guard did)."""
        action = decision.action.value
        # What the ladder reached; a decision that does not say is taken as what it does.
        detected = decision.detected.value if decision.detected.value != "allow" else action
        if action == "allow" and detected == "allow":
            return
        rule = decision.rule.value if decision.rule is not None else None
        report.decision_count += 1
        if action != "allow":
            report.first_index.setdefault(_first_key(action), index)
            report.actions[action] = report.actions.get(action, 0) + 1
        if detected != "allow":
            report.detected[detected] = report.detected.get(detected, 0) + 1
        if len(report.decisions) < MAX_LISTED_DECISIONS:
            report.decisions.append(
                ListedDecision(index, tool, rule, action, decision.count, detected)
            )

    def _signature(self, tool: str, arguments: object, decision: Decision) -> tuple[str, object]:
        """The call's signature (empty when the policy does not track it) and canonical
        arguments. A first, allowed call's decision carries no signature: derived as the guard
        derives it."""
        canonical = canonical_arguments(arguments, self._guard.policy.ignored_args)
        if decision.signature:
            return decision.signature, canonical
        name = tool_name(tool)
        assert self._classifier is not None  # kept whenever timelines are
        tracked, _ = self._classifier.classify(name, canonical)
        if not tracked:
            return "", canonical
        return args_key(name, canonical_json(canonical))[:SIGNATURE_CHARS], canonical

    def _start(self, source: int, event: CallStarted) -> tuple[SessionReport, int, Decision]:
        decision: Decision = self._guard.before_tool(
            event.tool,
            event.arguments,
            session=event.session,
            agent=event.agent,
            call_id=event.call_id,
        )
        report = self._record(event.session, event.agent, event.tool, event.arguments, decision)
        index = report.calls
        _remember_open(
            self._open,
            (source, event.token),
            _Open(
                report,
                event.session,
                event.agent,
                event.tool,
                event.arguments,
                event.call_id,
                decision.blocks,
                index,
            ),
        )
        return report, index, decision

    def _finish(
        self, source: int, event: CallFinished
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
            call.tool,
            call.arguments,
            session=call.session,
            agent=call.agent,
            call_id=call.call_id,
            error=event.error,
            result=event.result,
            duration_seconds=event.duration_seconds,
        )
        if post is None or (post.action.value == "allow" and post.detected.value == "allow"):
            return None
        self._list(call.report, call.index, call.tool, post)
        return call.report, call.index, post


def _remember_open(store: dict[tuple[int, int], _Open], key: tuple[int, int], value: _Open) -> None:
    store[key] = value
    if len(store) > MAX_PENDING_CALLS:
        del store[next(iter(store))]
