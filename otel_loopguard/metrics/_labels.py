"""Bounded label values, shared by the recorders.

At most ``max_label_values`` distinct agents and as many tools are reported by name, later ones
as :data:`OTHER`; so are values that look like identifiers (a UUID, 16 or more hex digits) or are
longer than :data:`MAX_LABEL_CHARS`, so a trace id, session id or argument never becomes a label
even if a caller passes one.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Final

#: The value reported for a label beyond its bound, or one that looks like an identifier.
OTHER: Final = "other"
#: Default bound on distinct agents (and, separately, tools) reported by name.
DEFAULT_MAX_LABEL_VALUES: Final = 100
#: Default bound on the series of all (agent, tool) pairs together: past it a new pair reports as
#: (``other``, ``other``). 10,000 series is a /metrics page of about 1 MB.
DEFAULT_MAX_SERIES: Final = 10_000
#: Label values longer than this report as ``other``: names are short, payloads are not.
MAX_LABEL_CHARS: Final = 128
#: Raw (agent, tool) pairs whose label children are cached; beyond it they are looked up per call.
MAX_CACHED_PAIRS: Final = 4096
#: Label values that look like ids (long hex, UUIDs) report as ``other``; compiled on the first
#: new value (:func:`_id_like`): a process that labels nothing (a command hook's) never does.
_ID_LIKE: Final = (
    r"[0-9a-fA-F]{16,}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
_compiled: list[re.Pattern[str]] = []


def _id_like() -> re.Pattern[str]:
    if not _compiled:
        _compiled.append(re.compile(_ID_LIKE))
    return _compiled[0]


def check_max_label_values(value: object) -> int:
    """``value`` if it is a positive integer (not a bool); else ``ValueError``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"max_label_values: expected a positive integer, got {value!r}")
    return value


class Bounded:
    """Raw value -> label value: known values as themselves, then at most ``limit`` new ones,
    the rest (and anything id-like, overlong or not a string) as :data:`OTHER`.

    Lookups are a dict read; a new value is admitted under a lock. Values reported as ``other``
    are not remembered, so a stream of distinct ids never grows the table."""

    __slots__ = ("_limit", "_lock", "_map", "_none")

    def __init__(self, limit: int, known: Iterable[str] = (), none: str = OTHER) -> None:
        self._map: dict[object, str] = {value: value for value in known}
        self._limit = limit + len(self._map)
        self._lock = threading.Lock()
        self._none = none

    def __call__(self, raw: object) -> str:
        value = self._map.get(raw)
        return value if value is not None else self._admit(raw)

    def _admit(self, raw: object) -> str:
        if raw is None:
            return self._none
        if (
            type(raw) is not str
            or not raw
            or len(raw) > MAX_LABEL_CHARS
            or _id_like().search(raw) is not None
        ):
            return OTHER
        with self._lock:
            if raw in self._map:
                return self._map[raw]
            if len(self._map) >= self._limit:
                return OTHER
            self._map[raw] = raw
        return raw
