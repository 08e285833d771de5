"""The guard's machinery behind :class:`~otel_loopguard._guard.LoopGuard`'s hook API.

One lock over the session store and the report ledger. Under it: count an attempt, keep it
pending, end it with its outcome (matching a second report of one call, by id or arguments, so
it counts once), start a new epoch. Off it: key the call (canonical arguments), decide
(:func:`otel_loopguard._policy.decide`), report (:class:`~otel_loopguard._reporter.Reporter`),
ask the advisor (:class:`~otel_loopguard._asks.Rescues`). Its upkeep (sessions in and out,
expiry, new epochs, spend, errors) is :mod:`._upkeep`. Never called but through the guard, which
catches what it raises.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ._asks import Rescues, Reserved
from ._calls import (
    MAX_ID_CHARS,
    MAX_TOOL_NAME_CHARS,
    SIGNATURE_CHARS,
    canonical_and_key,
    canonical_arguments,
    outcome_key,
    tool_name,
)
from ._classifier import Classifier
from ._core_memory import MemoryWork
from ._core_records import (
    Call,
    LoopAndRun,
    Moved,
    Outcome,
    Ran,
    Rescue,
    awaits,
    cut_utf8,
    ended,
    outputtext_of,
    trail_attempt,
)
from ._core_spend import SpendKeeping
from ._engine import Pending, SessionState
from ._ledger import ReportLedger, Settled
from ._memory import Memory, open_memory
from ._policy import (
    ALLOW,
    ALLOW_STEP,
    BLOCKING_ACTIONS,
    Action,
    Decision,
    Phase,
    Step,
    arguments_preview,
    climb,
    conclude,
    decide,
    message_for,
    settle_rescue,
)
from ._prices import Pricer
from ._reporter import Reporter
from ._rules import Verdict, evaluate, no_progress_after_failures, trend
from ._session_store import SessionStore
from ._spend import Spent
from ._trail import MAX_TRAIL_ARGUMENT_CHARS
from ._triplog import TripLog
from ._upkeep import MAX_SETTLED_CALLS, MAX_SETTLED_SESSIONS, text_of
from .config import Mode, Policy, Rule
from .metrics import NoopRecorder, Recorder

if TYPE_CHECKING:
    # The advisor's module is imported by the rescue that asks: a guard that never asks (a
    # command hook's ordinary call) does not import it.
    from ._advice import Advisor

__all__ = ["GuardCore"]


#: Enum members the hot path reads, read once: on Python 3.11 a member read through its class
#: goes through the enum metaclass's ``__getattr__`` hook (several times a plain attribute).
_STOP: Final = Action.STOP
_RESCUE: Final = Action.RESCUE


class GuardCore(SpendKeeping):
    """What a :class:`~otel_loopguard._guard.LoopGuard` keeps and does; see the module."""

    def __init__(
        self,
        policy: Policy,
        advisor: Advisor | None,
        clock: Callable[[], float] | None,
        recorder: Recorder | None,
    ) -> None:
        self.policy = policy
        # Trails cost a little per call: only a guard that can ask an advisor keeps them.
        self._keep_trail = advisor is not None and (
            self.policy.rescue_threshold is not None or self.policy.rescue_on_stall
        )
        self._clock = clock if clock is not None else time.monotonic
        self._lock = threading.Lock()
        self._evictions: list[str] = []
        self.store = SessionStore(
            self.policy.max_sessions,
            self.policy.session_ttl_seconds,
            self._clock,
            on_evict=self._evictions.append,
        )
        self._classifier = Classifier(self.policy)
        self._ignored = frozenset(self.policy.ignored_args)
        self._enforce = self.policy.mode is Mode.ENFORCE
        self.reporter = Reporter(
            self.policy,
            recorder if recorder is not None else NoopRecorder(),
            TripLog(self.policy.trip_log_path, arguments=self.policy.trip_log_arguments)
            if self.policy.trip_log_path
            else None,
        )
        # The rescues report errors back here through a weak reference: no cycle keeps a
        # dropped guard (and the session gauge reading it) alive until the next collection.
        ref = weakref.ref(self)

        def on_error(where: str, exc: BaseException) -> None:
            core = ref()
            if core is not None:
                core.report_internal_error(where, exc)

        def on_failure(kind: str, exc: BaseException) -> None:
            core = ref()
            if core is not None:
                core._internal_once(kind, exc)

        self.rescues = Rescues(
            self.policy, advisor, self._clock, self._lock, self.reporter, on_error, on_failure
        )
        # Per thread, the last call before_tool keyed: (arguments object, tool, session id,
        # agent id, args key, state, store key). An after_tool with the very same objects
        # reuses them instead of keying and looking up again.
        self._last = threading.local()
        # Hook attempts whose outcome is in: session key -> {call id: args key}, oldest first. A
        # second report of such a call (by its id, or by its arguments when it carries no id, as
        # OpenInference tool spans do) only returns None. Cleared per session on a new run.
        self._settled = ReportLedger(MAX_SETTLED_SESSIONS, MAX_SETTLED_CALLS)
        self._errors: dict[str, int] = {}
        # Model calls: priced here; those whose usage could not be read, counted by reason.
        self.pricer = Pricer(dict(self.policy.prices) or None)
        # Budgets (the budget rule): checked only when the policy sets one.
        self._budgets = any(
            value is not None
            for value in (
                policy.max_loop_cost_usd,
                policy.max_loop_tokens,
                policy.max_run_cost_usd,
                policy.max_run_tokens,
            )
        )
        self._run_budget = policy.max_run_cost_usd is not None or policy.max_run_tokens is not None
        self.skipped_model_calls: dict[str, int] = {}
        self._logged: set[tuple[str, str]] = set()
        # Dead ends remembered across runs (issue 28): None when memory is off (an in-process
        # guard's default), so that it costs one test per repeated call.
        self.memory: Memory | None = open_memory(policy)
        self._repository: str | None = None  # the repository scope, looked up once
        # Stops concluded after a call ran, recorded once their tool is at hand (under the
        # lock: (step, state, args key, outcome)).
        self._stops_to_record: list[tuple[Step, SessionState, str, str | None]] = []
        self._recalling: set[tuple[object, str]] = set()
        self._watch_sessions(self.reporter.recorder)

    # -- deciding -----------------------------------------------------------------------------

    def attempt(
        self,
        tool: object,
        arguments: object,
        session: object,
        agent: object,
        call_id: object,
        *,
        wait_for_advice: bool,
        ran: Ran | None = None,
    ) -> Decision:
        """Count one attempt and decide. ``ran``: the attempt already ran (reported only when it
        ended, keyed by ``after_tool``), so its outcome is recorded at once and it is never
        pending; ``None`` for an attempt about to run."""
        name = tool if type(tool) is str and len(tool) <= MAX_TOOL_NAME_CHARS else tool_name(tool)
        if ran is None:
            # _key_call, written out (this runs for every call)
            ignored = self._ignored
            value: object
            if type(arguments) is dict and ignored.isdisjoint(arguments):
                value = arguments
            else:
                value = canonical_arguments(arguments, ignored)
            tracked, mutating = self._classifier.classify(name, value)
            if not tracked:
                return ALLOW
            canonical, key = canonical_and_key(name, value)
        else:
            mutating, canonical, key = ran.mutating, ran.canonical, ran.key
        store_key: object
        if type(session) is str and agent is None and len(session) <= MAX_ID_CHARS:
            sid, aid, store_key = session, None, session  # the common case, without the calls
        else:
            sid, aid = self._ids(session, agent)
            store_key = self._store_key(sid, aid)
        trail_arguments = cut_utf8(canonical, MAX_TRAIL_ARGUMENT_CHARS) if self._keep_trail else ""
        with self._lock:
            state: SessionState = self.store.get(store_key)  # type: ignore[assignment]
            if ran is None:
                # The kept ids (bounded), not the caller's: a long id only misses this memo.
                self._last.call = (arguments, tool, sid, aid, key, state, store_key)
            # A tuple, not an object: this runs for every call (see benchmarks/README.md).
            step, repeated, newly_stopped, post, rescue, moved, spent, work = self._count(
                state, store_key, name, key, mutating, call_id, ran, trail_arguments, canonical
            )
            evictions = self._take_evictions() if self._evictions else None
        if work is not None:
            step = self._memory_work(work)
        recorder = self.reporter.recorder
        if evictions:
            for reason in evictions:
                recorder.evicted(reason)
        if type(recorder) is not NoopRecorder:  # (no call at all without metrics)
            recorder.tool_call(aid, name, repeated)
        if moved is not None:
            self._moved(state, sid, aid, moved)
        if newly_stopped:
            self.reporter.stopped(step, aid, name)
        if ran is not None and repeated and ran.duration_seconds:
            recorder.wasted(aid, name, ran.duration_seconds)
        if step is ALLOW_STEP and not repeated and post is None:
            return ALLOW  # the common case: a call nothing repeats, before it ran
        call = Call(name, canonical, key, sid, aid)
        if spent is not None:
            call.loop, call.run = spent
        return self._decided(step, repeated, post, rescue, call, wait_for_advice)

    def _moved(self, state: SessionState, sid: str, aid: str | None, moved: Moved) -> None:
        """Off the lock: what a counted attempt moved into loop spend, in the metrics."""
        self._spent_in_loop(aid, moved)
        if (moved[0] or moved[1]) and state.spend is not None and state.spend.ancestors:
            # A sub-agent's turn spent in a loop: in each ancestor's loop total too.
            self.charge_ancestors(sid, state.spend.ancestors, moved[0], moved[1], loop=True)

    def _decided(
        self,
        step: Step,
        repeated: bool,
        post: Step | None,
        rescue: Rescue | None,
        call: Call,
        wait: bool,
    ) -> Decision:
        """Off the lock: the decision on a counted attempt that repeats (or concluded a stop
        after it ran), with the advisor asked at rescue."""
        advice, escalation_failed = None, False
        if rescue is not None:
            advice = rescue.advice
            if rescue.context is not None and self.memory is not None:
                rescue.context["dead_ends"] = self._dead_ends(rescue.scope, rescue.store_key)
            if rescue.ask is not None and rescue.context is not None:
                advice, escalation_failed = self._ask(rescue.ask, call, step, rescue.context, wait)
            if rescue.outcome is not None:
                self.reporter.recorder.rescue(rescue.outcome)
        if post is not None:
            return self._post_decision(post, call.name, call.key, call.sid, call.aid)
        if rescue is not None:
            step = settle_rescue(step, advice, asking=not wait and rescue.ask is not None)
        decision = decide(
            step,
            tool=call.name,
            key=call.key,
            session=call.sid,
            policy=self.policy,
            canonical=call.canonical,
            advice=advice,
            repeated=repeated,
            spent=call.loop,
            run=call.run,
        )
        if step.rule is Rule.MEMORY:
            self.reporter.recorder.memory_hit(call.aid)
        if step.action is not Action.ALLOW:
            kind = "escalation-failed" if escalation_failed else None
            self.reporter.decided(decision, call.aid, call.canonical, kind)
        return decision

    def _count(
        self,
        state: SessionState,
        store_key: object,
        name: str,
        key: str,
        mutating: bool,
        call_id: object,
        ran: Ran | None,
        trail_arguments: str,
        canonical: bytes = b"",
    ) -> tuple[
        Step,
        bool,
        bool,
        Step | None,
        Rescue | None,
        Moved | None,
        LoopAndRun | None,
        MemoryWork | None,
    ]:
        """Under the lock: count the attempt in ``state``, keep it pending (or record how it
        ran), and reserve an ask at rescue. (step, repeated, newly stopped, post-call
        conclusion, rescue, what moved into loop spend and what a refused call avoided for
        the metrics (``None`` without model calls), what the loop and the run have spent for
        the decision (``None`` when nothing was or nothing repeats))."""
        policy = self.policy
        spend = state.spend
        stopped = state.stopped
        run: Spent | None = None
        over = None
        if self._budgets:
            over, run = self._over_budget(state, store_key, key)
        verdict: Verdict | None = None
        if over is None and not stopped and key not in state.signatures:
            # The common case, a call new in the epoch: no rule has evidence (see evaluate).
            step = ALLOW_STEP
        else:
            verdict, stuck, stalled = evaluate(state, key, policy)
            if verdict is None and stalled is None and not stopped and over is None:
                step = ALLOW_STEP  # nothing repeats enough
            else:
                step = climb(
                    verdict,
                    stalled,
                    trend(state.signature(key)),
                    denials=state.denials,
                    stopped=stopped,
                    policy=policy,
                    stuck=stuck,
                    stop_threshold=state.stop_threshold,
                    over=over,
                )
        # The first stop of a run (counted once in loopguard_stopped_runs_total; later calls
        # are decided stop again, and in observe mode they keep coming).
        work = None
        if self.memory is not None and key in state.signatures:
            # What to record or recall, done off the lock (a reminder from memory never
            # blocks: the call is counted below as the step it replaces would count it).
            work = self._remember(state, store_key, name, key, step, verdict, canonical)
        action = step.action
        newly_stopped = action is _STOP and not state.stopped
        detected_block = action in BLOCKING_ACTIONS
        enforced_block = detected_block and self._enforce and ran is None
        repeated = state.record_attempt(
            key, policy, blocked=detected_block, explores=not mutating, refused=enforced_block
        )
        moved = spent = None
        if spend is not None or run is not None:
            if spend is not None:  # model calls reported: the turn's spend, in a loop or not
                refused_stopped = enforced_block and action is _STOP
                # The loop now running ends at an enforced stop; in observe and advise mode
                # the run goes on, and so does what its loop costs.
                frozen = stopped and self._enforce
                moved = spend.call_counted(repeated, refused_stopped, stopped=frozen)
            if repeated or step is not ALLOW_STEP:
                spent = self._spent(spend, run)
        if newly_stopped:
            state.stopped = True
            state.stop_threshold = step.threshold
        post = None
        if ran is not None:
            # It ran (we only heard of it afterwards): its outcome, maybe progress.
            post = self._ran(state, key, mutating, ran.outcome, ran.error)
        else:
            ref = key if call_id is None else text_of(call_id)
            state.add_pending(ref, key, enforced_block, mutating)
            if call_id is not None and self._settled:
                self._settled.take(store_key, ref)  # a new attempt under a reused call id
        if self._keep_trail:
            trail_attempt(state, name, key, trail_arguments, enforced_block, ran)
        rescue = None
        if action is _RESCUE:
            advice, outcome, ask = self.rescues.reserve(state, key, store_key)
            context = Rescues.context(state, key) if ask is not None else None
            rescue = Rescue(advice, outcome, ask, context, state.scope, store_key)
        return step, repeated, newly_stopped, post, rescue, moved, spent, work

    def finish(
        self,
        tool: object,
        arguments: object,
        session: object,
        agent: object,
        call_id: object,
        error: bool | None,
        result: object,
        duration_seconds: float | None,
    ) -> Decision | None:
        ref = text_of(call_id) if call_id is not None else None
        output = outputtext_of(result) if self._keep_trail else None
        done: Outcome = (ref, outcome_key(result, error), error, output, duration_seconds)
        last = getattr(self._last, "call", None)
        if (
            last is not None
            and last[0] is arguments
            and last[1] is tool
            and last[2] == session
            and last[3] == agent
        ):
            # The same objects this thread's last before_tool keyed: reuse its key and session.
            # (The Redis store's core drops the state from the memo, and the store key with it.)
            state = last[5]
            store_key = last[6] if state is not None else None
            matched, decision = self._finish_known(
                tool, session, agent, done, last[4], state, store_key
            )
        elif ref is not None:
            matched, decision = self._finish_known(tool, session, agent, done, None, None, None)
        else:
            matched, decision = False, None
        if matched:
            return decision
        return self._finish_by_arguments(tool, arguments, session, agent, call_id, done)

    def _finish_known(
        self,
        tool: object,
        session: object,
        agent: object,
        done: Outcome,
        known_key: str | None,
        known_state: SessionState | None,
        known_store_key: object,
    ) -> tuple[bool, Decision | None]:
        """A report of a call with an id, or keyed by this thread's last ``before_tool``: the
        pending attempt it ends, or the earlier report it repeats. (whether it matched, what
        the guard concludes)."""
        ref, outcome, error, _, duration_seconds = done
        early: Step | None = None
        state: SessionState | None = None
        pending: Pending | None = None
        post: Step | None = None
        # The store key before_tool found with the state, else from the ids.
        store_key: object = (
            known_store_key
            if known_state is not None
            else self._store_key(*self._ids(session, agent))
        )
        with self._lock:
            settled = self._settled.take(store_key, ref) if ref is not None else None
            if settled is not None:
                # This call was reported already (by the hook, or by its span): this report
                # only adds the outcome the first one lacked.
                early = self._late_outcome(store_key, settled, outcome, error)
            else:
                state = known_state or self.store.get(store_key, create=False)
                # The pending attempt it ends, by its call id, else by the key this thread's
                # last before_tool gave it; settled in the ledger. (Written here, not in a
                # function of its own: this runs for every report, see benchmarks/README.md.)
                if state is not None and ref is not None:
                    pending = state.take_pending(ref)
                    if pending is not None:
                        waiting = awaits(pending, outcome)
                        self._settled.settle(store_key, ref, pending.args_key, waiting)
                if state is not None and pending is None and known_key is not None:
                    pending = state.take_pending(known_key)
                    if pending is not None and ref is None:
                        # Reported without an id: a second report of it (the span's, or the
                        # hook's) is matched by its arguments and adds nothing. (A known
                        # outcome awaits nothing: see awaits.)
                        waiting = outcome is None and awaits(pending, outcome)
                        self._settled.settle(store_key, known_key, known_key, waiting)
                if pending is not None:
                    if (
                        outcome is not None
                        and error is not True
                        and not pending.mutating
                        and not pending.blocked
                        and state.trail is None  # type: ignore[union-attr]
                    ):
                        # The common case, what _apply_outcome and _ran come to: a known
                        # outcome that is no failure, of a call that changes nothing, is
                        # recorded and concludes nothing.
                        state.record_outcome(pending.args_key, outcome)  # type: ignore[union-attr]
                    else:
                        post = self._apply_outcome(state, pending, done)  # type: ignore[arg-type]
        if settled is not None:
            return True, self._late_decision(early, tool, settled[0], session, agent)
        if pending is None:
            return False, None
        if duration_seconds:
            self._record_wasted(state, pending, agent, tool, duration_seconds)
        if post is None:
            return True, None
        name = tool_name(tool)
        return True, self._post_decision(post, name, pending.args_key, *self._ids(session, agent))

    def _finish_by_arguments(
        self,
        tool: object,
        arguments: object,
        session: object,
        agent: object,
        call_id: object,
        done: Outcome,
    ) -> Decision | None:
        """A report matched by session and arguments: the pending attempt it ends, an earlier
        report it repeats, or else a call heard of only now (counted as it ran)."""
        ref, outcome, error, output, duration_seconds = done
        store_key = self._store_key(*self._ids(session, agent))
        name = tool_name(tool)
        keyed = self._key_call(name, arguments)
        if keyed is None:
            return None
        mutating, canonical, key = keyed
        settled = None
        late: Step | None = None
        with self._lock:
            state = self.store.get(store_key, create=False)
            pending = None
            if state is not None:
                pending = self._take_by_arguments(state, store_key, key, done)
            post = None
            if pending is not None:
                post = self._apply_outcome(state, pending, done)  # type: ignore[arg-type]
            elif ref is None:
                settled = self._settled.take_by_args(store_key, key)
                if settled is not None:
                    # The hook reported this call with its id; this is the span's echo (or the
                    # other way round): it only adds an outcome the first report lacked.
                    late = self._late_outcome(store_key, settled, outcome, error)
        if settled is not None:
            return self._late_decision(late, name, key, session, agent)
        if pending is not None:
            if duration_seconds:
                self._record_wasted(state, pending, agent, name, duration_seconds)
            if post is None:
                return None
            return self._post_decision(post, name, key, *self._ids(session, agent))
        ran = Ran(mutating, canonical, key, outcome, error, duration_seconds, output)
        return self.attempt(
            name, arguments, session, agent, call_id, wait_for_advice=False, ran=ran
        )

    def _take_by_arguments(
        self, state: SessionState, store_key: object, key: str, done: Outcome
    ) -> Pending | None:
        """Under the lock: the hook may have counted this call without an id (pending under its
        args key), or under an id this report does not carry: match it by its arguments."""
        ref, outcome = done[0], done[1]
        pending = state.take_pending(key)
        if pending is not None and ref is None:
            # Counted without an id, reported without one: remember it, so that the other
            # report of the same call (hook or span, either order) adds nothing.
            self._settled.settle(store_key, key, key, awaits(pending, outcome))
        elif pending is None and state.pending:
            pending = self._settled.take_pending_by_args(state, store_key, key, outcome is None)
        return pending

    def _key_call(self, name: str, arguments: object) -> tuple[bool, bytes, str] | None:
        """(mutating, canonical JSON, args key) of a call of ``name``, or ``None`` when the
        policy does not track it."""
        ignored = self._ignored
        if type(arguments) is dict and ignored.isdisjoint(arguments):
            value: object = arguments  # the common case: what canonical_arguments returns
        else:
            value = canonical_arguments(arguments, ignored)
        tracked, mutating = self._classifier.classify(name, value)
        if not tracked:
            return None
        canonical, key = canonical_and_key(name, value)
        return mutating, canonical, key

    def _apply_outcome(self, state: SessionState, pending: Pending, done: Outcome) -> Step | None:
        if pending.blocked:
            return None  # a denied call never ran: its "result" is our message, never progress
        _, outcome, error, output, _ = done
        if state.trail is not None:
            state.trail.settle(pending.args_key, ended(error), output)
        return self._ran(state, pending.args_key, pending.mutating, outcome, error)

    def _late_outcome(
        self, store_key: object, settled: Settled, outcome: str | None, error: bool | None
    ) -> Step | None:
        """Under the lock: a second report of a call whose first report lacked its outcome (a
        span without the result, before the hook's report) adds the outcome now, and may
        conclude the run is stuck (a stop after the call ran). Nothing else is counted again."""
        key, awaiting = settled
        if not awaiting or outcome is None:
            return None
        state = self.store.get(store_key, create=False)
        if state is None:
            return None
        return self._ran(state, key, False, outcome, error)

    def _late_decision(
        self, late: Step | None, tool: object, key: str, session: object, agent: object
    ) -> Decision | None:
        if late is None:
            return None
        return self._post_decision(late, tool_name(tool), key, *self._ids(session, agent))

    def _ran(
        self, state: SessionState, key: str, mutating: bool, outcome: str | None, error: bool | None
    ) -> Step | None:
        """Under the lock: a call of ``key`` ran with ``outcome``. Record it, start a new epoch
        when it made progress, and return the post-call conclusion (a stop), if any."""
        failed = error is True
        state.record_outcome(key, outcome, failed=failed)
        if mutating and not failed and state.mutated(key, outcome, self.policy):
            return None
        # A stop when its failures say the run is stuck (once: a session already told to stop
        # is told so by the pre-call answers).
        if state.stopped or (outcome is not None and not failed):
            # (A known outcome that is no failure cleared the signature's failure: nothing to
            # conclude, see no_progress_after_failures.)
            return None
        step = conclude(no_progress_after_failures(state, key), policy=self.policy)
        if step is not None and self.memory is not None:
            self._stopped_after(state, key, step)
        if step is not None:
            state.stopped = True
            state.stop_threshold = step.threshold
        return step

    def _post_decision(
        self, step: Step, name: str, key: str, sid: str, aid: str | None
    ) -> Decision:
        """The :class:`Decision` for a post-call conclusion ``step``: reported, and softened by
        the mode like a pre-call one."""
        if self._stops_to_record:
            self._record_stop(step, name, key, sid, aid)
        decision = decide(
            step, tool=name, key=key, session=sid, policy=self.policy, phase=Phase.POST
        )
        self.reporter.decided(decision, aid, None)
        return decision

    def _record_wasted(
        self,
        state: SessionState | None,
        pending: Pending,
        agent: object,
        tool: object,
        duration_seconds: float,
    ) -> None:
        if pending.blocked or state is None:
            return
        signature = state.signatures.get(pending.args_key)
        if signature is not None and signature.count > 1:
            aid = self._ids("", agent)[1]
            self.reporter.recorder.wasted(aid, tool_name(tool), duration_seconds)

    def _ask(
        self, ask: Reserved, call: Call, step: Step, context: dict[str, Any], wait: bool
    ) -> tuple[str | None, bool]:
        """Ask the advisor off the lock; wait only when ``wait`` (hooks), never for spans.
        Returns (advice, whether an ask waited for failed).

        The outcome (advice cached, or budget refunded) is settled by :meth:`_advice_done` when
        the ask ends, whether or not anyone waited for it; an ask nobody waited for that fails
        writes its own ``escalation-failed`` trip line."""
        from ._advice import MAX_QUESTION_ARGUMENT_CHARS, AdviceRequest

        policy = self.policy
        advisor = self.rescues.advisor
        assert advisor is not None
        request = AdviceRequest(
            session=call.sid,
            tool=call.name,
            arguments_preview=arguments_preview(call.canonical, MAX_QUESTION_ARGUMENT_CHARS),
            count=step.count,
            rule=step.rule.value if step.rule else "",
            denial=message_for(step, call.name, call.canonical, policy, action=Action.DENY),
            agent=call.aid,
            signature=call.key[:SIGNATURE_CHARS],
            model=policy.advisor_model,
            **context,
        )
        # Nobody waits for an ask at a span's start: if it fails, its own trip line says so.
        trip = None
        if not wait and self.reporter.trip_log is not None:
            asked = decide(
                step,
                tool=call.name,
                key=call.key,
                session=call.sid,
                policy=policy,
                canonical=call.canonical,
            )
            trip = self.reporter.trip_line(asked, call.aid, call.canonical, "escalation-failed")
        return self.rescues.ask(ask, request, call.key, trip, wait)
