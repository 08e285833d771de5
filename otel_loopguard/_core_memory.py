"""The guard core's dead-end memory (issue 28), beside its decisions (:mod:`._core`).

A call denied or stopped on one call's rule is recorded as a dead end of the run's scope; in a
later run of that scope its first repeat with the same outcome is reminded at once. What a call
asks of the store is settled under the guard's lock (which call, its outcome, the flags that
make it once per call and run); the store itself (a file, SQLite, Redis) is read and written
off the lock, so a slow store never holds up other sessions' calls. A base class of
:class:`~otel_loopguard._core.GuardCore`, which sets the attributes declared here.
"""

from __future__ import annotations

import time
from typing import Final

from ._calls import args_key
from ._engine import CLEARED, RECORDED, REMINDED, SessionState
from ._memory import DeadEnd, Memory, recalled, scope_of
from ._policy import BLOCKING_ACTIONS, Step, arguments_preview, remember
from ._record import Record
from ._rules import Verdict
from ._upkeep import Upkeep
from .config import MemoryScope, Rule

__all__ = ["MemoryKeeping", "MemoryWork"]

#: The rules whose blocked call is remembered as a dead end (one call repeated; a stall
#: or a budget is no one call's).
_DEAD_END_RULES: Final = frozenset({Rule.CONSECUTIVE, Rule.WINDOW, Rule.NO_PROGRESS})
#: Stops concluded after a call, waiting for their tool to be recorded; oldest dropped.
_MAX_PENDING_STOPS: Final = 64


class MemoryWork(Record):
    """What a counted call asks of the memory store, settled under the lock and done off it:
    record a dead end (``record``), or recall the scope's dead ends of ``key`` (else)."""

    __slots__ = (
        "record",
        "state",
        "scope",
        "store_key",
        "name",
        "key",
        "outcome",
        "step",
        "canonical",
        "failed",
        "count",
        "refused",
    )

    record: bool
    state: SessionState
    scope: str | None  # the session's own scope (state.scope) when the call was counted
    store_key: object
    name: str
    key: str
    outcome: str | None  # the call's last outcome
    step: Step
    canonical: bytes
    failed: bool
    count: int
    refused: int

    def __init__(
        self,
        record: bool,
        state: SessionState,
        scope: str | None,
        store_key: object,
        name: str,
        key: str,
        outcome: str | None,
        step: Step,
        canonical: bytes = b"",
        failed: bool = False,
        count: int = 0,
        refused: int = 0,
    ) -> None:
        self.record = record
        self.state = state
        self.scope = scope
        self.store_key = store_key
        self.name = name
        self.key = key
        self.outcome = outcome
        self.step = step
        self.canonical = canonical
        self.failed = failed
        self.count = count
        self.refused = refused


class MemoryKeeping(Upkeep):
    """The core's dead-end memory (see the module)."""

    #: Dead ends remembered across runs: ``None`` when memory is off.
    memory: Memory | None
    _repository: str | None  # the repository scope, looked up once
    # Stops concluded after a call ran, recorded once their tool is at hand (under the lock:
    # (step, state, args key, outcome)).
    _stops_to_record: list[tuple[Step, SessionState, str, str | None]]
    # (store key, args key) of the calls whose recall is under way (off the lock).
    _recalling: set[tuple[object, str]]

    def _watch_sessions(self, recorder: object) -> None:
        """The session count, and the dead ends remembered, for the recorder's gauges."""
        super()._watch_sessions(recorder)
        memory = getattr(self, "memory", None)
        observe = getattr(type(recorder), "observe_memory", None)
        if memory is not None and observe is not None:
            observe(recorder, memory.count)

    def _scope(self, state: SessionState, store_key: object) -> str:
        """The memory scope of ``state``'s run (see :meth:`_scope_of`)."""
        return self._scope_of(state.scope, store_key)

    def _scope_of(self, scope: str | None, store_key: object) -> str:
        """The memory scope of a run: the one its entrance set (``scope``; the command hooks:
        the repository of the payload's cwd), else the policy's: this process's repository,
        the agent's name, or global."""
        if scope is not None:
            return scope
        if self.policy.memory_scope is MemoryScope.REPOSITORY:
            if self._repository is None:
                self._repository = scope_of(self.policy)
            return self._repository
        agent = store_key[1] if type(store_key) is tuple else None
        return scope_of(self.policy, agent=agent)

    @staticmethod
    def _run_of(store_key: object) -> str:
        """Which run recorded a dead end: a hash of its session and agent."""
        return args_key("run", repr(store_key).encode())[:16]

    def _remember(
        self,
        state: SessionState,
        store_key: object,
        name: str,
        key: str,
        step: Step,
        verdict: Verdict | None,
        canonical: bytes,
    ) -> MemoryWork | None:
        """Under the lock, memory on, for a call repeated in the epoch: what to ask of the
        store, off the lock (:meth:`_memory_work`).

        1. A blocked repeat (deny, rescue, stop on one call's rule) is recorded as a dead end,
           once per call and run, with its outcome.
        2. Otherwise, at the first repeat of a call this run has not settled, memory is asked:
           a dead end of the scope with the outcome the call just gave is a reminder now
           (rule ``memory``, its history in the text); none, or only other outcomes once the
           outcome is known, settles the call for the run (cleared: a call that succeeds, or a
           change that changes its outcome, is no dead end here). Later steps are the ladder's.
        A reminder never blocks: the step it replaces counted the call the same way.
        """
        signature = state.signatures.get(key)
        if signature is None:
            return None
        marks = state.memory
        flags = marks.get(key, 0) if marks else 0
        outcome = signature.last_outcome
        if step.action in BLOCKING_ACTIONS:
            if not flags & RECORDED and step.rule in _DEAD_END_RULES:
                state.mark_memory(key, RECORDED)
                return MemoryWork(
                    True, state, state.scope, store_key, name, key, outcome, step, canonical
                )
            return None
        if flags & (RECORDED | REMINDED | CLEARED):
            return None
        asking = (store_key, key)
        if asking in self._recalling:
            return None  # another call of it is asking now
        self._recalling.add(asking)
        count = verdict.attempts if verdict is not None else signature.count + 1
        refused = verdict.refused if verdict is not None else 0
        return MemoryWork(
            False,
            state,
            state.scope,
            store_key,
            name,
            key,
            outcome,
            step,
            failed=signature.failed,
            count=count,
            refused=refused,
        )

    def _memory_work(self, work: MemoryWork) -> Step:
        """Off the lock: record the dead end, or recall the scope's; the step the call gets
        (a reminder from memory, else the step it had)."""
        memory = self.memory
        assert memory is not None
        scope = self._scope_of(work.scope, work.store_key)
        if work.record:
            self._record(
                scope, work.store_key, work.name, work.key, work.outcome, work.step, work.canonical
            )
            return work.step
        entries = history = None
        done = False
        try:
            entries = memory.recall(scope, work.key)
            run = self._run_of(work.store_key)
            history = recalled(entries, work.outcome, run) if entries else None
            done = True
        finally:
            with self._lock:
                self._recalling.discard((work.store_key, work.key))
                # A store that failed settles nothing: the call is asked about again next time.
                if done and history is not None:
                    work.state.mark_memory(work.key, REMINDED)
                elif done and (not entries or work.outcome is not None):
                    work.state.mark_memory(work.key, CLEARED)
        if history is None:
            return work.step
        history.failed = work.failed
        return remember(work.count, work.refused, history)

    def _record(
        self,
        scope: str,
        store_key: object,
        name: str,
        key: str,
        outcome: str | None,
        step: Step,
        canonical: bytes,
    ) -> None:
        """``key`` (with ``outcome``) recorded as a dead end of ``scope``: hashes, the tool,
        and the cut arguments only with ``memory_arguments``."""
        memory = self.memory
        assert memory is not None
        policy = self.policy
        now = time.time()
        arguments = None
        if policy.memory_arguments and canonical:
            arguments = arguments_preview(canonical, policy.arguments_preview_chars)
        rule = step.rule.value if step.rule is not None else ""
        run = self._run_of(store_key)
        memory.record(
            DeadEnd(scope, key, outcome, name, rule, step.count, 1, now, now, run, arguments)
        )

    def _stopped_after(self, state: SessionState, key: str, step: Step) -> None:
        """Under the lock: a stop concluded after a call ran is a dead end too, recorded once
        its tool is at hand (:meth:`_record_stop`)."""
        signature = state.signatures.get(key)
        if signature is None or state.mark_memory(key, RECORDED) & RECORDED:
            return
        stops = self._stops_to_record
        if len(stops) >= _MAX_PENDING_STOPS:
            del stops[0]
        stops.append((step, state, key, signature.last_outcome))

    def _record_stop(self, step: Step, name: str, key: str, sid: str, aid: str | None) -> None:
        """Off the lock: the stop ``step`` concluded after a call of ``name`` ran, recorded."""
        found = None
        with self._lock:
            stops = self._stops_to_record
            for index, entry in enumerate(stops):
                if entry[0] is step:
                    found = stops.pop(index)
                    break
        if found is None:
            return
        _, state, key, outcome = found
        store_key = self._store_key(sid, aid)
        self._record(self._scope(state, store_key), store_key, name, key, outcome, step, b"")

    def _dead_ends(self, scope: str | None, store_key: object) -> tuple[str, ...]:
        """Off the lock, at a rescue: the scope's dead ends for the advisor's question, one
        line each, the most recent first (this run's own not counted). ``scope``: the
        session's own (state.scope)."""
        from ._advice import MAX_DEAD_ENDS

        memory = self.memory
        assert memory is not None
        run = self._run_of(store_key)
        lines: list[str] = []
        for entry in memory.entries(self._scope_of(scope, store_key)):
            runs = entry.runs - (1 if entry.run == run else 0)
            if runs <= 0:
                continue
            what = entry.arguments if entry.arguments is not None else f"[{entry.key[:12]}]"
            day = time.strftime("%Y-%m-%d", time.gmtime(entry.last))
            earlier = "1 earlier run" if runs == 1 else f"{runs} earlier runs"
            lines.append(
                f"{entry.tool} {what}: refused or stopped ({entry.rule}) in {earlier}, last on"
                f" {day} after {entry.count} attempts"
            )
            if len(lines) >= MAX_DEAD_ENDS:
                break
        return tuple(lines)
