"""The guard's reporter: takes a decision to the recorder (metrics) and the trip log.

The one place that knows which metrics a decision counts; its trip line is the decision's
:attr:`~otel_loopguard._attributes.Shape.TRIP` shape (:func:`~otel_loopguard._attributes.
decision_attributes`). The guard decides (:func:`otel_loopguard._policy.decide`) and hands the
decision here, off its lock.
"""

from __future__ import annotations

from typing import Any, Final

from ._policy import Action, Decision, Phase, Step, arguments_preview
from ._triplog import TripLog
from .config import Policy, Rule
from .metrics import NoopRecorder, Recorder
from .metrics._spec import NO_RULE

__all__ = ["Reporter", "TripLine"]

#: The members' wire strings, read once (``.value`` is a Python-level property of enums).
_RULE_VALUES: Final = {rule: rule.value for rule in Rule}
_ACTION_VALUES: Final = {action: action.value for action in Action}

#: The fields of one trip line (:meth:`otel_loopguard._triplog.TripLog.write`'s arguments).
TripLine = dict[str, Any]
#: Recorder methods added with model-call cost (issue 24) and memory (issue 28): a recorder
#: written before them is not called for them (as for ``store_error``), and the rest of it works
#: as before.
_COST_METHODS = ("model_call", "loop_spend", "avoided", "memory_hit")


class _WithoutCost:
    """A recorder that lacks some of :data:`_COST_METHODS`: those it lacks do nothing, the
    others and every other attribute are the recorder's own."""

    __slots__ = ("_inner", "avoided", "loop_spend", "memory_hit", "model_call")

    def __init__(self, inner: object) -> None:
        self._inner = inner
        for name in _COST_METHODS:
            method = getattr(type(inner), name, None)
            setattr(self, name, _skip if method is None else getattr(inner, name))

    # Looked up on the type by their callers, so forwarded here only when the recorder has them.
    def observe_sessions(self, count: Any) -> None:
        observe = getattr(type(self._inner), "observe_sessions", None)
        if observe is not None:
            observe(self._inner, count)

    def store_error(self, op: str) -> None:
        store_error = getattr(type(self._inner), "store_error", None)
        if store_error is not None:
            store_error(self._inner, op)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _skip(*args: object) -> None:
    pass


def _with_cost(recorder: Recorder) -> Recorder:
    """``recorder`` itself when its type has every method of :class:`Recorder`'s cost, else
    wrapped so those it lacks are not called (looked up on the type: a recorder that answers
    any attribute is wrapped too)."""
    kind = type(recorder)
    if all(getattr(kind, name, None) is not None for name in _COST_METHODS):
        return recorder
    return _WithoutCost(recorder)


class Reporter:
    """Counts decisions in ``recorder`` and writes their trip lines to ``trip_log`` (if any).

    Both may be swapped while the guard runs (metrics served later install a recorder; a
    restart applying its log again reports nothing). A recorder written before the cost
    methods (``model_call``, ``loop_spend``, ``avoided``) or ``memory_hit`` is not called for
    them.
    """

    __slots__ = ("_policy", "recorder", "trip_log")

    def __init__(self, policy: Policy, recorder: Recorder, trip_log: TripLog | None) -> None:
        self._policy = policy
        self.recorder = _with_cost(recorder)
        self.trip_log = trip_log

    def trip_line(
        self, decision: Decision, agent: str | None, canonical: bytes | None, kind: str | None
    ) -> TripLine | None:
        """The trip line of ``decision`` (``None`` without a trip log): what was detected, the
        arguments preview only when the log keeps arguments and ``canonical`` is given."""
        trip_log = self.trip_log
        if trip_log is None:
            return None
        # Imported here: a guard without a trip log (a command hook's, usually) never needs them.
        from ._attributes import Shape, decision_attributes
        from ._exemplars import current_call, exemplar_labels

        policy = self._policy
        arguments = (
            arguments_preview(canonical, policy.arguments_preview_chars)
            if trip_log.arguments and canonical is not None
            else None
        )
        line = decision_attributes(
            decision, Shape.TRIP, agent=agent, mode=policy.mode, arguments=arguments, kind=kind
        )
        ids = current_call()
        if ids is not None:
            line.update(exemplar_labels(ids))  # trace_id, span_id: the line joins its trace
        return line

    def write(self, line: TripLine | None) -> None:
        """Append a trip line made by :meth:`trip_line` (nothing for ``None``)."""
        trip_log = self.trip_log
        if line is not None and trip_log is not None:
            trip_log.write(**line)

    def decided(
        self,
        decision: Decision,
        agent: str | None,
        canonical: bytes | None,
        kind: str | None = None,
    ) -> None:
        """A decision that detected more than an allow: count it (``loopguard_decisions_total``,
        by what was detected), and, after the call ran (``post``), the run's stop; then its trip
        line (``canonical``: the arguments, ``None`` to leave them out)."""
        recorder = self.recorder
        if type(recorder) is not NoopRecorder:  # (nothing to count without metrics)
            detected = decision.detected
            rule = _RULE_VALUES[decision.rule] if decision.rule else NO_RULE
            recorder.decision(agent, decision.tool, rule, _ACTION_VALUES[detected], decision.count)
            if decision.phase is Phase.POST and detected is Action.STOP:
                # Concluded only for a run not stopped yet: its first stop.
                recorder.stopped_run(agent, decision.tool, rule)
        if self.trip_log is not None:
            self.write(self.trip_line(decision, agent, canonical, kind))

    def stopped(self, step: Step, agent: str | None, tool: str) -> None:
        """The first stop of a run, decided before a call (``loopguard_stopped_runs_total``)."""
        rule = step.rule.value if step.rule else NO_RULE
        self.recorder.stopped_run(agent, tool, rule)
