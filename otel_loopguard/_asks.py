"""The guard's rescues: the advisor's threads, where asks run, and the asks nobody waited for.

Two worker threads, started on the first ask. An ask made without waiting (a rescue decided at
a span's start) is kept, by (session, agent, signature), so that
:meth:`~otel_loopguard._guard.LoopGuard.await_advice` can still wait for it; the oldest is
forgotten beyond :data:`MAX_UNWAITED_ASKS`. What an ask's answer does to a session (advice
cached, or the budget refunded) is the guard's: it passes a callback.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ._calls import SIGNATURE_CHARS
from ._engine import SessionState
from ._reporter import Reporter, TripLine
from .config import Policy

if TYPE_CHECKING:
    # The advisor's module and the pool's threads are imported by a rescue that asks: a guard
    # that never asks (a command hook's ordinary call) does not import them.
    from concurrent.futures import Future, ThreadPoolExecutor

    from ._advice import AdviceRequest, Advisor

__all__ = ["ADVISOR_GRACE_SECONDS", "MAX_UNWAITED_ASKS", "AdvisorPool", "Rescues", "clean_advice"]

#: Extra seconds a hook waits beyond a command advisor's own timeout, so the kill is reported.
ADVISOR_GRACE_SECONDS: Final = 2.0

#: Asks made without waiting that :meth:`AdvisorPool.take` can still give back.
MAX_UNWAITED_ASKS: Final = 256
_WORKERS: Final = 2

#: An unwaited ask's key: (session, agent, signature).
AskKey = tuple[str, str | None, str]


def clean_advice(advice: object) -> str | None:
    """An advisor's answer as advice: stripped and cut, or ``None`` when it says nothing."""
    if not isinstance(advice, str) or not advice.strip():
        return None
    from ._advice import MAX_ADVICE_CHARS

    return advice.strip()[:MAX_ADVICE_CHARS]


class AdvisorPool:
    """Runs asks on its own threads; keeps the futures of asks nobody waited for.

    Thread-safe. :meth:`close` stops the threads; the next ask starts them again.
    """

    __slots__ = ("_executor", "_lock", "_unwaited")

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._unwaited: OrderedDict[AskKey, Future[str | None]] = OrderedDict()

    def submit(
        self,
        advisor: Advisor,
        request: AdviceRequest,
        on_done: Callable[[Future[str | None]], None],
    ) -> Future[str | None]:
        """Ask ``advisor`` on a worker thread; ``on_done`` runs when the ask ends, whether or
        not anyone waits for it."""
        executor = self._executor
        if executor is None:
            from concurrent.futures import ThreadPoolExecutor

            executor = self._executor = ThreadPoolExecutor(
                max_workers=_WORKERS, thread_name_prefix="loopguard-advisor"
            )
        future: Future[str | None] = executor.submit(advisor, request)
        future.add_done_callback(on_done)
        return future

    def keep(self, key: AskKey, future: Future[str | None]) -> None:
        """Keep an ask nobody waits for now, so that :meth:`take` can give it back."""
        with self._lock:
            unwaited = self._unwaited
            unwaited[key] = future
            while len(unwaited) > MAX_UNWAITED_ASKS:
                unwaited.popitem(last=False)

    def take(self, key: AskKey) -> Future[str | None] | None:
        """The kept ask of ``key`` (used up), or ``None``."""
        with self._lock:
            return self._unwaited.pop(key, None)

    @staticmethod
    def wait(future: Future[str | None], timeout: float) -> tuple[str | None, bool]:
        """Wait at most ``timeout`` seconds: (the advice, whether the ask failed: it raised,
        timed out or said nothing)."""
        from concurrent.futures import TimeoutError as FutureTimeout

        try:
            advice = future.result(timeout=timeout)
        except (FutureTimeout, Exception):
            return None, True
        cleaned = clean_advice(advice)
        return cleaned, cleaned is None

    def close(self, *, wait: bool = False) -> None:
        """Stop the workers: queued asks are abandoned; with ``wait``, an ask under way is waited
        for (its callback has run when this returns)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=wait, cancel_futures=True)


#: A reserved ask: the session, its epoch then, its cooldown before the reservation, and its
#: key in the guard's store.
Reserved = tuple[SessionState, int, float | None, object]


class Rescues:
    """The rescue rung's asks for one guard: the budget and cooldown reserved per session, the
    question built from what the session knows, the ask run on an :class:`AdvisorPool`, and
    its answer cached for the signature and epoch (or the budget refunded).

    ``lock`` is the guard's: :meth:`reserve` and :meth:`context` run under it, the rest takes
    it only to settle an answer. ``on_error(where, exc)`` reports an internal error;
    ``on_failure(kind, exc)`` an advisor's own failure (expected, logged once).
    """

    __slots__ = (
        "_clock",
        "_lock",
        "_on_error",
        "_on_failure",
        "_policy",
        "_reporter",
        "advisor",
        "pool",
        "settle",
    )

    def __init__(
        self,
        policy: Policy,
        advisor: Advisor | None,
        clock: Callable[[], float],
        lock: threading.Lock,
        reporter: Reporter,
        on_error: Callable[[str, BaseException], None],
        on_failure: Callable[[str, BaseException], None],
    ) -> None:
        self._policy = policy
        self.advisor = advisor
        self._clock = clock
        self._lock = lock
        self._reporter = reporter
        self._on_error = on_error
        self._on_failure = on_failure
        self.pool = AdvisorPool()
        # How an answer reaches a session kept outside the process (the Redis store):
        # settle(store key, change) applies change to the session's kept state. None: the
        # state reserved is changed in place, under the lock.
        self.settle: Callable[[object, Callable[[SessionState], None]], None] | None = None

    def reserve(
        self, state: SessionState, key: str, store_key: object = None
    ) -> tuple[str | None, str | None, Reserved | None]:
        """Under the lock: (cached advice, why no ask: ``cached``/``budget``/``cooldown``, or
        the ask reserved)."""
        if self.advisor is None:
            return None, None, None
        cached = state.advice.get(key) if state.advice else None
        if cached is not None:
            return cached, "cached", None
        policy = self._policy
        if state.rescues >= policy.max_rescues:
            return None, "budget", None
        now = self._clock()
        if (
            state.last_rescue_at is not None
            and now - state.last_rescue_at < policy.cooldown_seconds
        ):
            return None, "cooldown", None
        # Reserve the budget now; a failed ask refunds it (and the cooldown) in _done.
        previous = state.last_rescue_at
        state.rescues += 1
        state.last_rescue_at = now
        return None, None, (state, state.epoch, previous, store_key)

    @staticmethod
    def context(state: SessionState, key: str) -> dict[str, Any]:
        """Under the lock: what the session knows for the advisor's question (a snapshot of
        its trail; :class:`AdviceRequest` fields)."""
        from ._advice import CallRecord

        trail = state.trail
        context: dict[str, Any] = {
            "earlier_advice": tuple(state.advice.values()) if state.advice else (),
            "refusals": state.denials,
        }
        if trail is not None:
            context.update(
                recent_calls=tuple(
                    CallRecord(
                        c.tool,
                        c.arguments,
                        c.outcome,
                        c.output,
                        c.key[:SIGNATURE_CHARS],
                        c.times,
                        c.refused,
                    )
                    for c in trail.calls
                ),
                task=trail.task,
                latest_user_message=trail.latest_message,
                latest_output=trail.latest_output(key),
            )
        return context

    def ask(
        self,
        reserved: Reserved,
        request: AdviceRequest,
        key: str,
        trip: TripLine | None,
        wait: bool,
    ) -> tuple[str | None, bool]:
        """Ask the advisor off the lock; wait only when ``wait`` (hooks), never for spans.
        Returns (advice, whether an ask waited for failed).

        The outcome (advice cached, or budget refunded) is settled when the ask ends, whether
        or not anyone waited for it; an ask nobody waited for that fails writes ``trip``, its
        own ``escalation-failed`` trip line. One not waited for is kept for :meth:`awaited`."""
        advisor = self.advisor
        assert advisor is not None
        state, epoch, previous, store_key = reserved
        future = self.pool.submit(
            advisor,
            request,
            lambda done: self._done(done, state, epoch, previous, key, trip, store_key),
        )
        if not wait:
            self.pool.keep((request.session, request.agent, request.signature), future)
            return None, False
        return self.pool.wait(future, self.timeout())

    def awaited(self, session: str, agent: str | None, signature: str) -> str | None:
        """The advice of an ask made without waiting, waited for now (at most :meth:`timeout`);
        ``None`` when it failed or is not known."""
        future = self.pool.take((session, agent, signature))
        if future is None:
            return None
        return self.pool.wait(future, self.timeout())[0]

    def timeout(self) -> float:
        """How long a caller waits for an ask: the policy's advisor timeout, plus a grace for a
        command advisor, so its own timeout kills it and says so first. A wrapper (serve
        --state-dir logs each answer) names the advisor it wraps ``inner``."""
        from ._advice import CommandAdvisor

        timeout = self._policy.advisor_timeout_seconds
        if isinstance(getattr(self.advisor, "inner", self.advisor), CommandAdvisor):
            timeout += ADVISOR_GRACE_SECONDS
        return timeout

    def _done(
        self,
        future: Future[str | None],
        state: SessionState,
        epoch: int,
        previous: float | None,
        key: str,
        trip: TripLine | None,
        store_key: object = None,
    ) -> None:
        """On the advisor thread: cache advice for this signature and epoch, or refund (and,
        for an ask nobody waited for, write its ``escalation-failed`` trip line)."""
        try:
            error = future.exception() if not future.cancelled() else None
            advice = (
                None if future.cancelled() or error is not None else clean_advice(future.result())
            )

            def change(state: SessionState) -> None:
                if advice:
                    if state.epoch == epoch:
                        if state.advice is None:
                            state.advice = {}
                        state.advice[key] = advice
                else:
                    state.rescues = max(0, state.rescues - 1)
                    if state.last_rescue_at is not None:
                        state.last_rescue_at = previous

            settle = self.settle
            if settle is None:
                with self._lock:
                    change(state)
            else:
                settle(store_key, change)
            self._reporter.recorder.rescue("advice" if advice else "failed")
            if not advice:
                self._reporter.write(trip)
            if error is not None:
                self._on_failure("advisor", error)
        except Exception as exc:  # never let a callback kill the advisor thread
            self._on_error("advisor_callback", exc)
