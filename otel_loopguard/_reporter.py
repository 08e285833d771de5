"""The guard's reporter: takes a decision to the recorder (metrics) and the trip log.

The one place that knows which metrics a decision counts and what a trip line holds; the guard
decides (:mod:`otel_loopguard.policy`) and hands the step here, off its lock.
"""

from __future__ import annotations

from typing import Any

from .calls import SIGNATURE_CHARS
from .config import Policy
from .metrics import Recorder
from .metrics._spec import NO_RULE
from .policy import Action, Step, arguments_preview
from .triplog import TripLog

__all__ = ["Reporter", "TripLine"]

#: The fields of one trip line (:meth:`otel_loopguard.triplog.TripLog.write`'s arguments).
TripLine = dict[str, Any]


def _rule(step: Step) -> str | None:
    return step.rule.value if step.rule else None


class Reporter:
    """Counts decisions in ``recorder`` and writes their trip lines to ``trip_log`` (if any).

    Both may be swapped while the guard runs (metrics served later install a recorder; a
    restart applying its log again reports nothing: :meth:`silenced`).
    """

    __slots__ = ("_policy", "recorder", "trip_log")

    def __init__(self, policy: Policy, recorder: Recorder, trip_log: TripLog | None) -> None:
        self._policy = policy
        self.recorder = recorder
        self.trip_log = trip_log

    def trip_line(
        self,
        step: Step,
        *,
        session: str,
        agent: str | None,
        tool: str,
        key: str,
        canonical: bytes | None,
        kind: str | None = None,
    ) -> TripLine | None:
        """The trip line of ``step`` (``None`` without a trip log); the arguments preview only
        when the log keeps arguments and ``canonical`` is given."""
        trip_log = self.trip_log
        if trip_log is None:
            return None
        policy = self._policy
        return {
            "session": session,
            "agent": agent,
            "tool": tool,
            "rule": _rule(step),
            "action": step.action.value,
            "mode": policy.mode.value,
            "count": step.count,
            "threshold": step.threshold,
            "signature": key[:SIGNATURE_CHARS],
            "arguments": arguments_preview(canonical, policy.arguments_preview_chars)
            if trip_log.arguments and canonical is not None
            else None,
            "kind": kind,
        }

    def write(self, line: TripLine | None) -> None:
        """Append a trip line made by :meth:`trip_line` (nothing for ``None``)."""
        trip_log = self.trip_log
        if line is not None and trip_log is not None:
            trip_log.write(**line)

    def decided(
        self,
        step: Step,
        *,
        session: str,
        agent: str | None,
        tool: str,
        key: str,
        canonical: bytes | None,
        kind: str | None = None,
    ) -> None:
        """A non-allow ``step`` was decided: count it (``loopguard_decisions_total``) and write
        its trip line."""
        self.recorder.decision(agent, tool, _rule(step) or NO_RULE, step.action.value, step.count)
        if self.trip_log is not None:
            self.write(
                self.trip_line(
                    step,
                    session=session,
                    agent=agent,
                    tool=tool,
                    key=key,
                    canonical=canonical,
                    kind=kind,
                )
            )

    def stopped(self, step: Step, agent: str | None, tool: str) -> None:
        """The first stop of a run (``loopguard_stopped_runs_total``)."""
        self.recorder.stopped_run(agent, tool, _rule(step) or NO_RULE)

    def decided_after(
        self, step: Step, *, session: str, agent: str | None, tool: str, key: str
    ) -> None:
        """A conclusion after the call ran (a stop): counted, the run's stop counted, its trip
        line written without arguments."""
        self.recorder.decision(agent, tool, _rule(step) or NO_RULE, step.action.value, step.count)
        if step.action is Action.STOP:  # concluded only for a run not stopped yet
            self.stopped(step, agent, tool)
        if self.trip_log is not None:
            self.write(
                self.trip_line(
                    step, session=session, agent=agent, tool=tool, key=key, canonical=None
                )
            )
