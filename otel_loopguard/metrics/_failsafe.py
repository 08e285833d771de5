"""How a recorder fails: never raising into the guard, never breaking a collection."""

from __future__ import annotations

import logging
from collections.abc import Callable

from .._lazy import LOGGER_NAME

_log = logging.getLogger(LOGGER_NAME)


class Failures:
    """A recorder's own failures: counted, logged once per kind, never raised."""

    def __init__(self) -> None:
        self.count = 0
        self._logged: set[str] = set()

    def __call__(self, where: str, exc: Exception) -> None:
        try:
            self.count += 1
            kind = f"{where}:{type(exc).__name__}"
            if kind not in self._logged:
                self._logged.add(kind)
                _log.error(
                    "loopguard metrics: %s failed (further such failures are counted, not logged)",
                    where,
                    exc_info=exc,
                )
        except Exception:  # pragma: no cover - logging itself failed; nothing left to do
            pass


def session_reader(count: Callable[[], int]) -> Callable[[], int]:
    """``count`` wrapped so a failure reads as 0 (collection must not break a scrape)."""

    def read() -> int:
        try:
            return int(count())
        except Exception:
            return 0

    return read
