"""The in-flight byte budget both receivers share: request bytes read or being decoded at once.

A request costs many times its body while it is decoded (the bytes, the decoded message and the
spans read from it: 13 to 19 times the body for OTLP JSON), so the receivers take its size from
the budget before reading its body (HTTP) or decoding it (gRPC), and give it back once its spans
are queued; a gzip body's inflated bytes are taken too, step by step as they grow (HTTP). The
decision API has a budget of its own (``_http``). Past the budget a request is answered 429 /
``RESOURCE_EXHAUSTED`` with a retry delay, its body unread: memory stays bounded however many
clients send at once.
"""

from __future__ import annotations

import threading

__all__ = ["ByteBudget"]


class ByteBudget:
    """At most ``limit`` bytes taken at once; a request larger than the whole budget is still
    admitted when nothing else is in flight (so no single request is refused forever)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used = 0
        self._lock = threading.Lock()

    def take(self, size: int, ceiling: int | None = None, held: int = 0) -> bool:
        """Take ``size`` bytes; False (nothing taken) when they do not fit under ``ceiling``
        (the whole budget when None). ``held``: bytes the same request holds already (a
        request growing its share is alone when nothing else is in flight)."""
        top = self.limit if ceiling is None else ceiling
        with self._lock:
            if self._used > held and self._used + size > top:
                return False
            self._used += size
            return True

    def give(self, size: int) -> None:
        """Give back bytes :meth:`take` took."""
        with self._lock:
            self._used = max(0, self._used - size)

    @property
    def used(self) -> int:
        """Bytes taken now."""
        return self._used
