"""What the guard's core (:mod:`._core`) reads of a session's spend under the lock: the budget a
call passes, what the run has spent, what the loop now running has used; and loop spend and
avoided spend to the metrics off it. A base class of :class:`~otel_loopguard._core.GuardCore`."""

from __future__ import annotations

from ._core_memory import MemoryKeeping
from ._core_records import LoopAndRun, Moved
from ._engine import SessionState
from ._rules import Overspent, budget
from ._spend import Spend, Spent
from .config import Mode

__all__ = ["SpendKeeping"]


class SpendKeeping(MemoryKeeping):
    """The core's reading of spend and budgets (see the module)."""

    #: Whether the policy sets a run budget (``max_run_cost_usd`` or ``max_run_tokens``).
    _run_budget: bool

    def _over_budget(
        self, state: SessionState, store_key: object, key: str
    ) -> tuple[Overspent | None, Spent | None]:
        """Under the lock, before the call is counted: the budget it passes, if any, and what
        the run has spent (``None`` without a run budget)."""
        policy = self.policy
        spend = state.spend
        stopped = state.stopped
        loop = None
        # The loop as it is once this call is counted: only a repeat adds to it (a session
        # stopped keeps what passed its budget); an enforced stop ends it.
        if spend is not None and (stopped or key in state.signatures):
            frozen = stopped and policy.mode is Mode.ENFORCE
            loop = spend.current_loop(key in state.signatures, frozen)
        run = self._run_spent(state, store_key) if self._run_budget else None
        return budget(loop, run, policy), run

    def _run_spent(self, state: SessionState, store_key: object) -> Spent:
        """Under the lock: what the whole run has spent (the run budget's figure): every model
        turn of the session, its own state's (``state`` is ``store_key``'s) and each of its
        agents'."""
        own = state.spend
        total = own.run() if own is not None else Spent()
        store = self.store
        sid = store_key[0] if type(store_key) is tuple else store_key
        for key in (sid, *store.agent_keys(sid)) if sid is not store_key else store.agent_keys(sid):
            if key == store_key:
                continue
            other = store.get(key, create=False)
            if other is not None and other.spend is not None:
                total = total.plus(other.spend.run())
        return total

    @staticmethod
    def _spent(spend: Spend | None, run: Spent | None) -> LoopAndRun | None:
        """What the loop now running has used (and the run, under a run budget), for a
        decision's text and fields; ``None`` when neither has a turn."""
        loop = spend.current_loop() if spend is not None else None
        if loop is not None and not loop.turns:
            loop = None
        if run is not None and not run.turns:
            run = None
        return None if loop is None and run is None else (loop, run)

    def _spent_in_loop(self, aid: str | None, moved: Moved) -> None:
        """Off the lock: a model turn's spend moved into a loop, and what a call refused
        because the run was stopped avoided (an estimate), to the metrics."""
        tokens, usd, avoided_tokens, avoided_usd = moved
        recorder = self.reporter.recorder
        if tokens or usd:
            recorder.loop_spend(aid, tokens, usd)
        if avoided_tokens or avoided_usd:
            recorder.avoided(aid, avoided_tokens, avoided_usd)
