"""The guard's advisor threads: where asks run, and the asks nobody waited for.

Two worker threads, started on the first ask. An ask made without waiting (a rescue decided at
a span's start) is kept, by (session, agent, signature), so that
:meth:`~otel_loopguard.guard.LoopGuard.await_advice` can still wait for it; the oldest is
forgotten beyond :data:`MAX_UNWAITED_ASKS`. What an ask's answer does to a session (advice
cached, or the budget refunded) is the guard's: it passes a callback.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Final

from .advice import MAX_ADVICE_CHARS, AdviceRequest, Advisor

__all__ = ["MAX_UNWAITED_ASKS", "AdvisorPool", "clean_advice"]

#: Asks made without waiting that :meth:`AdvisorPool.take` can still give back.
MAX_UNWAITED_ASKS: Final = 256
_WORKERS: Final = 2

#: An unwaited ask's key: (session, agent, signature).
AskKey = tuple[str, str | None, str]


def clean_advice(advice: object) -> str | None:
    """An advisor's answer as advice: stripped and cut, or ``None`` when it says nothing."""
    if not isinstance(advice, str) or not advice.strip():
        return None
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
