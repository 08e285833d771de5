"""Sessions by key, bounded by count (LRU) and idle time (TTL), on an injected clock: the
in-memory :class:`SessionStore` a guard keeps (``SessionStore.snapshot``/``restore``: versioned
plain data)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Final

import orjson

from ._engine import SessionState
from ._plain import read_list, read_optional_text, read_text
from .config import Policy

__all__ = ["STORE_SNAPSHOT_VERSION", "SessionStore"]

_EXPIRY_INTERVAL_SECONDS: Final = 1.0
#: Version of the :meth:`SessionStore.snapshot` layout; :meth:`SessionStore.restore` refuses
#: others.
STORE_SNAPSHOT_VERSION: Final = 1


class SessionStore:
    """Sessions by key, bounded by count (LRU) and idle time (TTL), on an injected clock.

    A key that is a ``(session, agent)`` pair is also listed under its session
    (:meth:`agent_keys`), so that what happens to a whole session (a user message) can reach
    each of its agents. The index holds only kept keys: an evicted key leaves it at once, so it
    is bounded as the store is.

    Not thread-safe: the owner locks around every call.
    """

    def __init__(
        self,
        max_sessions: int,
        ttl_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[str], None] | None = None,
    ) -> None:
        self._sessions: OrderedDict[object, SessionState] = OrderedDict()
        # session -> its (session, agent) keys kept now, in the order they were added.
        self._agents: dict[object, dict[object, None]] = {}
        self._max = max_sessions
        self._ttl = ttl_seconds
        self._next_expiry = float("-inf")
        self.clock = clock
        self._on_evict = on_evict

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, key: object) -> bool:
        return key in self._sessions

    def get(self, key: object, *, create: bool = True) -> SessionState | None:
        """Return the session for ``key`` (created when missing and ``create``), marking it used."""
        now = self.clock()
        if now >= self._next_expiry:
            self._expire(now)
        sessions = self._sessions
        state = sessions.get(key)
        if state is None:
            if not create:
                return None
            state = SessionState(now)
            sessions[key] = state
            self._index(key)
            if len(sessions) > self._max:
                self._drop_oldest("capacity")
        else:
            sessions.move_to_end(key)
            state.last_seen = now
        return state

    def put(self, key: object, state: SessionState) -> None:
        """Keep ``state`` for ``key`` (replacing any), as the most recently used session.

        For states saved outside the process (:meth:`SessionState.from_bytes`). Its
        ``last_seen`` is kept: a state idle beyond the TTL is forgotten at once (a ``ttl``
        eviction), as if it had stayed here. The least recently used sessions beyond
        ``max_sessions`` are evicted.
        """
        sessions = self._sessions
        if sessions.pop(key, None) is not None:
            self._unindex(key)
        if self.clock() - state.last_seen >= self._ttl:
            if self._on_evict is not None:
                self._on_evict("ttl")
            return
        sessions[key] = state
        self._index(key)
        while len(sessions) > self._max:
            self._drop_oldest("capacity")

    def take(self, key: object) -> SessionState | None:
        """Remove and return the state of ``key`` (``None`` when not kept); no eviction is
        reported. For a store that only holds sessions in flight (the Redis store's)."""
        state = self._sessions.pop(key, None)
        if state is not None:
            self._unindex(key)
        return state

    def agent_keys(self, session: object) -> list[object]:
        """The ``(session, agent)`` keys of ``session`` kept now, oldest first (not the
        session's own key; not marked used)."""
        keys = self._agents.get(session)
        return list(keys) if keys else []

    def _index(self, key: object) -> None:
        if type(key) is tuple and len(key) == 2:
            self._agents.setdefault(key[0], {})[key] = None

    def _unindex(self, key: object) -> None:
        if type(key) is tuple and len(key) == 2:
            keys = self._agents.get(key[0])
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._agents[key[0]]

    def _drop_oldest(self, reason: str) -> None:
        key, _ = self._sessions.popitem(last=False)
        self._unindex(key)
        if self._on_evict is not None:
            self._on_evict(reason)

    def _expire(self, now: float) -> None:
        # Sweeping at most once per second keeps TTL eviction off the per-call cost; a session
        # may outlive its TTL by up to that second.
        if now < self._next_expiry:
            return
        self._next_expiry = now + _EXPIRY_INTERVAL_SECONDS
        sessions = self._sessions
        deadline = now - self._ttl
        while sessions:
            oldest = next(iter(sessions.values()))
            if oldest.last_seen > deadline:
                return
            self._drop_oldest("ttl")

    def expire(self) -> None:
        """Drop sessions idle for longer than the TTL now (``get`` does so at most once a
        second)."""
        self._next_expiry = float("-inf")
        self._expire(self.clock())

    def snapshot(self) -> dict[str, object]:
        """Every kept session as plain data, least recently used first: ``{"version": 1,
        "sessions": [{"session", "agent", "state"}, ...]}`` (``agent`` ``None`` for a session's
        own key; ``state`` the object :meth:`SessionState.to_bytes` writes). For
        :meth:`restore` in another process."""
        sessions = []
        for key, state in self._sessions.items():
            session, agent = key if type(key) is tuple else (key, None)
            sessions.append(
                {"session": session, "agent": agent, "state": orjson.loads(state.to_bytes())}
            )
        return {"version": STORE_SNAPSHOT_VERSION, "sessions": sessions}

    def restore(self, data: object, policy: Policy) -> None:
        """Replace the kept sessions with a :meth:`snapshot`'s (each state within ``policy``'s
        bounds, as :meth:`SessionState.from_bytes` reads it; idle ones are kept as they were,
        and expire at the next sweep). Raises ``ValueError`` naming what is wrong (an unknown
        ``version`` names it); the store is then unchanged."""
        if not isinstance(data, Mapping):
            raise ValueError(f"session store snapshot: expected a mapping, got {data!r:.80}")
        version = data.get("version")
        if version != STORE_SNAPSHOT_VERSION:
            raise ValueError(
                f"session store snapshot: unknown version {version!r}"
                f" (this is {STORE_SNAPSHOT_VERSION})"
            )
        sessions: OrderedDict[object, SessionState] = OrderedDict()
        for entry in read_list(data.get("sessions"), "sessions"):
            if not isinstance(entry, Mapping):
                raise ValueError(f"session store snapshot: bad session entry {entry!r:.80}")
            session = read_text(entry.get("session"), "session")
            agent = read_optional_text(entry.get("agent"), "agent")
            state = SessionState.from_bytes(orjson.dumps(entry.get("state")), policy)
            sessions[session if agent is None else (session, agent)] = state
        while len(sessions) > self._max:
            sessions.popitem(last=False)
        self._sessions = sessions
        self._agents = {}
        for key in sessions:
            self._index(key)
