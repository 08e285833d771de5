"""The service's clock and the gate between decision calls and a snapshot (``serve
--state-dir``, :mod:`._durable`): a restart's replay reads the logged times, and a snapshot never
sees a decision half done."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Gate", "ServiceClock"]


class ServiceClock:
    """The service's clock: monotonic, but anchored to the wall clock when the process started,
    so times kept in a snapshot mean the same after a restart (also after a reboot). While a
    restart replays the log it reads the time of the frame being applied (:meth:`pin`, for every
    thread); a thread applying one logged input reads that input's logged time
    (:meth:`pinned_here`), so the replay sees the same times."""

    __slots__ = ("_here", "_offset", "_pinned")

    def __init__(self) -> None:
        self._offset = time.time() - time.monotonic()
        self._pinned: float | None = None
        self._here = threading.local()

    def __call__(self) -> float:
        pinned = self._pinned
        if pinned is None:
            pinned = getattr(self._here, "time", None)
        return pinned if pinned is not None else time.monotonic() + self._offset

    def pin(self, value: float | None) -> None:
        self._pinned = value

    @contextmanager
    def pinned_here(self, value: float) -> Iterator[None]:
        """This thread reads ``value`` while inside."""
        here = self._here
        before = getattr(here, "time", None)
        here.time = value
        try:
            yield
        finally:
            here.time = before


class Gate:
    """Many decision calls at once (each logs its decision and applies it in one step), or one
    snapshot (which must see no decision half done)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if not self._shared:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self, timeout: float) -> Iterator[bool]:
        """Yields whether it got the gate within ``timeout`` (never keeping decisions waiting
        meanwhile: a decision that waits for its advisor holds the shared side for seconds)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._shared:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            got = not self._shared
            if got:
                self._exclusive = True
        try:
            yield got
        finally:
            if got:
                with self._cond:
                    self._exclusive = False
                    self._cond.notify_all()
