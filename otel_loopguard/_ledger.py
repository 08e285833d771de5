"""The report ledger: which calls of each session were reported with their outcome, so that a
second report of one call (a framework hook's and its span's) counts once."""

from __future__ import annotations

from collections import OrderedDict

from ._engine import Pending, SessionState
from ._plain import read_flag, read_list, read_optional_text, read_text

__all__ = ["ReportLedger", "Settled"]


#: A reported call: (args key, whether its first report lacked the outcome).
Settled = tuple[str, bool]


class ReportLedger:
    """The calls of each session whose outcome is in, so that a second report of one call (a
    framework hook's and its span's, in either order, with or without the call id) counts once.

    Session key -> {call ref: (args key, awaiting)}, oldest first; ``awaiting``: the first
    report carried no outcome (a span without the result), so the other report may add it;
    bounded by ``max_sessions`` (least recently used dropped) and ``max_calls`` per session
    (oldest dropped). Not thread-safe: the guard calls it under its own lock.
    """

    __slots__ = ("_calls", "_max_calls", "_max_sessions")

    def __init__(self, max_sessions: int, max_calls: int) -> None:
        self._calls: OrderedDict[object, dict[str, Settled]] = OrderedDict()
        self._max_sessions = max_sessions
        self._max_calls = max_calls

    def __bool__(self) -> bool:
        return bool(self._calls)

    def settle(self, store_key: object, ref: str, key: str, awaiting: bool = False) -> None:
        """Remember that the call ``ref`` (arguments ``key``) was reported (``awaiting``: without
        its outcome)."""
        calls = self._calls.get(store_key)
        if calls is None:
            calls = self._calls[store_key] = {}
            if len(self._calls) > self._max_sessions:
                self._calls.popitem(last=False)
        else:
            self._calls.move_to_end(store_key)
        calls[ref] = (key, awaiting)
        if len(calls) > self._max_calls:
            del calls[next(iter(calls))]

    def take(self, store_key: object, ref: str) -> Settled | None:
        """``(args key, awaiting)`` when ``ref`` was reported already; a second report uses it
        up."""
        calls = self._calls.get(store_key)
        return None if calls is None else calls.pop(ref, None)

    def take_by_args(self, store_key: object, key: str) -> Settled | None:
        """Use up the oldest reported call of this session with these arguments, if any."""
        calls = self._calls.get(store_key)
        if not calls:
            return None
        for ref, settled in calls.items():
            if settled[0] == key:
                del calls[ref]
                return settled
        return None

    def take_pending_by_args(
        self, state: SessionState, store_key: object, key: str, awaiting: bool = False
    ) -> Pending | None:
        """The oldest attempt of ``key`` pending under a call id in ``state``, preferring one
        that was allowed to run (a blocked call has no span to report it); settled here."""
        match: str | None = None
        for ref, pending in (state.pending or {}).items():
            if pending.args_key == key:
                if not pending.blocked:
                    match = ref
                    break
                if match is None:
                    match = ref
        if match is None:
            return None
        taken = state.take_pending(match)
        if taken is not None and match not in (state.pending or ()):
            self.settle(store_key, match, key, awaiting and not taken.blocked)
        return taken

    def take_calls(self, store_key: object) -> dict[str, Settled] | None:
        """Remove and return a session's reported calls (for the Redis store, which keeps them
        with the session's state)."""
        return self._calls.pop(store_key, None)

    def put_calls(self, store_key: object, calls: dict[str, Settled]) -> None:
        """Keep ``calls`` as a session's reported calls (the newest ``max_calls``)."""
        while len(calls) > self._max_calls:
            del calls[next(iter(calls))]
        self._calls[store_key] = calls
        self._calls.move_to_end(store_key)
        while len(self._calls) > self._max_sessions:
            self._calls.popitem(last=False)

    def forget(self, store_key: object) -> None:
        """Drop a session's reported calls (a new run may reuse call ids)."""
        self._calls.pop(store_key, None)

    def snapshot(self) -> list[list[object]]:
        """The reported calls as plain data, least recently used session first: ``[[session,
        agent, [[ref, args key, awaiting], ...]], ...]`` (``agent`` ``None`` for a session's own
        key). For :meth:`restore`."""
        out: list[list[object]] = []
        for store_key, calls in self._calls.items():
            session, agent = store_key if type(store_key) is tuple else (store_key, None)
            out.append(
                [session, agent, [[ref, key, awaiting] for ref, (key, awaiting) in calls.items()]]
            )
        return out

    def restore(self, data: object) -> None:
        """Replace the reported calls with a :meth:`snapshot`'s (within this ledger's bounds).
        Raises ``ValueError`` naming what is wrong; the ledger is then unchanged."""
        restored: OrderedDict[object, dict[str, Settled]] = OrderedDict()
        for entry in read_list(data, "reported calls"):
            if not (isinstance(entry, list) and len(entry) == 3):
                raise ValueError(f"session state: bad reported calls entry {entry!r:.80}")
            session = read_text(entry[0], "reported session")
            agent = read_optional_text(entry[1], "reported agent")
            calls: dict[str, Settled] = {}
            for call in read_list(entry[2], "reported calls"):
                if not (isinstance(call, list) and len(call) == 3):
                    raise ValueError(f"session state: bad reported call {call!r:.80}")
                ref, key, awaiting = call
                calls[read_text(ref, "reported ref")] = (
                    read_text(key, "reported key"),
                    read_flag(awaiting, "awaiting"),
                )
            while len(calls) > self._max_calls:
                del calls[next(iter(calls))]
            restored[session if agent is None else (session, agent)] = calls
        while len(restored) > self._max_sessions:
            restored.popitem(last=False)
        self._calls = restored
