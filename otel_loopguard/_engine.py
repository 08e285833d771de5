"""Per-session state, bounded, and the bookkeeping that feeds the rules.

Nothing here locks, logs or counts metrics: the guard holds its lock around these calls and
reports what they return. Every structure is bounded: sessions by ``max_sessions`` (LRU) and
``session_ttl_seconds`` (idle), signatures per session by ``max_signatures_per_session`` (LRU),
the window by ``window_size``, pending hook calls by :data:`MAX_PENDING_CALLS`. Beside it: what a
session remembers for an advisor (:mod:`._trail`), which calls are tracked
(:mod:`._classifier`), which reports are settled (:mod:`._ledger`), what model calls cost
(:mod:`._spend`) and the store of sessions (:mod:`._session_store`).

A session's state can leave the process and come back (:meth:`SessionState.to_bytes`,
:meth:`SessionState.from_bytes`, :meth:`._session_store.SessionStore.put`): command hooks run
one process per call and keep sessions in a file between calls.
"""

from __future__ import annotations

from typing import Final

import orjson

from ._plain import (
    read_count,
    read_flag,
    read_list,
    read_number,
    read_optional_text,
    read_text,
)
from ._record import Record
from ._spend import Spend
from ._trail import Trail
from .config import Policy

__all__ = [
    "CLEARED",
    "MAX_MEMORY_MARKS",
    "MAX_PENDING_CALLS",
    "RECORDED",
    "REMINDED",
    "Pending",
    "SessionState",
    "SignatureState",
]

#: Hook calls awaiting their ``after_tool`` per session; the oldest is forgotten beyond this.
MAX_PENDING_CALLS: Final = 64
#: Version of the :meth:`SessionState.to_bytes` layout; other versions are refused on load.
_SNAPSHOT_VERSION: Final = 1
#: Calls per session whose dead-end memory this run settled (:attr:`SessionState.memory`);
#: the oldest is forgotten beyond this.
MAX_MEMORY_MARKS: Final = 256
#: :attr:`SessionState.memory` flags: the call was recorded as a dead end in this run; it was
#: reminded from memory; memory no longer applies to it in this run (it succeeded, or its
#: outcome changed).
RECORDED: Final = 1
REMINDED: Final = 2
CLEARED: Final = 4


class SignatureState:
    """What one session remembers about one signature in the current epoch."""

    __slots__ = (
        "changed",
        "count",
        "failed",
        "last_outcome",
        "looped",
        "novel_seen",
        "refused",
        "same_outcomes",
    )

    def __init__(self) -> None:
        self.count = 0
        self.last_outcome: str | None = None
        self.same_outcomes = 0
        self.changed = False
        self.failed = False  # the last known outcome was a failure
        self.novel_seen = 0  # the session's ``novel`` count at this signature's last attempt
        self.looped = False  # repeated once with nothing new since its previous attempt
        # Attempts refused (they never ran) since last_outcome first came: the no_progress
        # evidence counts them as repeats too (rules.Verdict.refused).
        self.refused = 0


class Pending(Record):
    """A hook attempt whose outcome has not been reported yet."""

    __slots__ = ("args_key", "blocked", "mutating", "outstanding")

    args_key: str
    blocked: bool
    mutating: bool
    outstanding: int

    def __init__(
        self,
        args_key: str,
        blocked: bool,
        mutating: bool,
        outstanding: int = 1,
    ) -> None:
        self.args_key = args_key
        self.blocked = blocked
        self.mutating = mutating
        self.outstanding = outstanding


class SessionState:
    """One session's state: the current epoch's history plus the ladder's bookkeeping.

    Implements :class:`otel_loopguard._rules.History`.
    """

    __slots__ = (
        "advice",
        "denials",
        "epoch",
        "last_key",
        "last_rescue_at",
        "last_seen",
        "memory",
        "mutation",
        "novel",
        "pending",
        "redundant",
        "rescues",
        "run_length",
        "scope",
        "signatures",
        "spend",
        "stopped",
        "stop_threshold",
        "trail",
        "window",
    )

    def __init__(self, now: float) -> None:
        self.epoch = 0
        self.window: list[str] = []
        self.last_key: str | None = None
        self.run_length = 0
        self.redundant = 0
        self.signatures: dict[str, SignatureState] = {}  # least recently used first
        self.denials = 0
        self.stopped = False
        # The threshold of the stop that stopped the session (the later stops show it).
        self.stop_threshold = 0
        # Insertion order is age: the oldest is forgotten first. (A dict, not an OrderedDict:
        # a table is made for most calls, as an idle session keeps none.)
        self.pending: dict[str, Pending] | None = None
        self.advice: dict[str, str] | None = None  # args key -> advice, this epoch
        self.rescues = 0
        self.last_rescue_at: float | None = None
        self.last_seen = now
        self.trail: Trail | None = None  # kept only by a guard that can ask an advisor
        # The mutation (args key and outcome) that started this epoch: repeating it is not progress.
        self.mutation: str | None = None
        # Calls this epoch that were new (their signature's first attempt): exploration.
        self.novel = 0
        # Model calls' tokens and cost (None until one is reported): kept across epochs.
        self.spend: Spend | None = None
        # Dead-end memory (issue 28), kept across epochs: args key -> RECORDED, REMINDED,
        # CLEARED flags of this run (None until memory settles a call); and the run's scope
        # when its entrance knows it (the command hooks: the repository of the payload's cwd).
        self.memory: dict[str, int] | None = None
        self.scope: str | None = None

    def mark_memory(self, key: str, flag: int) -> int:
        """Add ``flag`` to ``key``'s memory flags in this run; return the flags it had."""
        marks = self.memory
        if marks is None:
            marks = self.memory = {}
        had = marks.pop(key, 0)
        if len(marks) >= MAX_MEMORY_MARKS:
            del marks[next(iter(marks))]
        marks[key] = had | flag
        return had

    def signature(self, key: str) -> SignatureState | None:
        return self.signatures.get(key)

    def new_epoch(self, *, clear_stop: bool = False) -> None:
        """Forget the repeat evidence: the agent's world changed (the loop now running, if
        any, is over; the spend in all is kept)."""
        self.epoch += 1
        if self.spend is not None:
            self.spend.new_loop()
        self.window.clear()
        self.last_key = None
        self.run_length = 0
        self.redundant = 0
        self.signatures = {}
        self.denials = 0
        self.advice = None
        self.mutation = None
        self.novel = 0
        if clear_stop:
            self.stopped = False
            self.stop_threshold = 0

    def mutated(self, key: str, outcome: str | None, policy: Policy) -> bool:
        """A mutating call of ``key`` succeeded with ``outcome``; return whether that is progress.

        1. The same mutation (args key and outcome) as the one that started this epoch changed
           nothing new (the same ``git commit`` thirty times, a ``sed -i`` that changes nothing):
           no new epoch, so its repeats count like any other call's.
        2. Any other mutation starts a new epoch that begins with this call: its signature is
           remembered with one attempt and its outcome, so repeating it is a repeat from the
           first time on.
        """
        mutation = f"{key}:{outcome or ''}"
        if mutation == self.mutation:
            return False
        signature = self.signatures.get(key)
        failed = signature.failed if signature is not None else False
        self.new_epoch()
        self.mutation = mutation
        self.record_attempt(key, policy, blocked=False)
        self.record_outcome(key, outcome, failed=failed)
        return True

    def record_attempt(
        self,
        key: str,
        policy: Policy,
        *,
        blocked: bool,
        explores: bool = True,
        refused: bool = False,
    ) -> bool:
        """Count one tracked attempt of ``key``; return whether it repeats an earlier one.
        ``blocked``: the ladder blocked it (a denial, counted whatever the mode); ``refused``:
        it does not run, so no outcome will come for it. ``explores``: a first attempt of
        ``key`` counts as exploration (a read that runs; not a mutating call, which may fail
        and change nothing, nor a blocked one)."""
        signatures = self.signatures
        signature = signatures.pop(key, None)
        repeated = signature is not None
        if signature is None:
            signature = SignatureState()
            if len(signatures) >= policy.max_signatures_per_session:
                self._prune(policy.max_signatures_per_session)
            if explores and not blocked:
                self.novel += 1
        else:
            self.redundant += 1
            if self.novel == signature.novel_seen:
                signature.looped = True
        self.signatures[key] = signature  # (re)inserted last: least recently used stay first
        signature.count += 1
        signature.novel_seen = self.novel
        if self.last_key == key:
            self.run_length += 1
        else:
            self.last_key = key
            self.run_length = 1
        window = self.window
        window.append(key)
        if len(window) >= policy.window_size:
            del window[0]
        if blocked:
            self.denials += 1
        if refused:
            signature.refused += 1
        return repeated

    def _prune(self, limit: int) -> None:
        """Forget the least recently used quarter of the signatures at once.

        Rebuilding in batches keeps eviction amortised O(1) and the dict compact (deleting from
        the front one entry at a time makes each next(iter(...)) scan more deleted slots).
        Keys still in the window are among the most recent (limit >= window size), so kept.
        """
        keep = limit - max(1, limit // 4)
        items = list(self.signatures.items())
        self.signatures = dict(items[len(items) - keep :])

    def record_outcome(self, key: str, outcome: str | None, *, failed: bool = False) -> None:
        """Add the outcome of a finished attempt of ``key`` (ignored if the signature was evicted);
        ``failed``: the call reported a failure."""
        if outcome is None:
            return
        signature = self.signatures.get(key)
        if signature is None:
            return
        signature.failed = failed
        if outcome == signature.last_outcome:
            signature.same_outcomes += 1
            signature.changed = False
        else:
            signature.changed = signature.last_outcome is not None
            signature.last_outcome = outcome
            signature.same_outcomes = 1
            signature.refused = 0

    def add_pending(self, ref: str, key: str, blocked: bool, mutating: bool) -> None:
        """Remember a hook attempt until its outcome arrives (``ref``: call id, else args key)."""
        table = self.pending
        if table is None:
            table = self.pending = {}
        existing = table.get(ref)
        if existing is not None and existing.args_key == key:
            existing.outstanding += 1
            existing.blocked = blocked
            return
        if len(table) >= MAX_PENDING_CALLS:
            del table[next(iter(table))]
        table[ref] = Pending(key, blocked, mutating)

    def take_pending(self, ref: str) -> Pending | None:
        """Match a finished call to the hook attempt that counted it (``ref``: call id, else
        args key)."""
        table = self.pending
        if not table:
            return None
        pending = table.get(ref)
        if pending is None:
            return None
        pending.outstanding -= 1
        if pending.outstanding <= 0:
            del table[ref]
            if not table:
                self.pending = None  # an idle session keeps no empty table
        return pending

    def to_bytes(self) -> bytes:
        """The whole state as compact JSON, to keep outside the process (see :meth:`from_bytes`).

        Signatures are listed least recently used first, as kept; the window and the last key
        refer to them by position, so each 128-bit key is written once. The trail (see
        :class:`Trail`) is written only when there is one.
        """
        signatures = self.signatures
        position = {key: index for index, key in enumerate(signatures)}
        last = self.last_key
        extra: dict[str, object] = {} if self.trail is None else {"trail": self.trail.to_json()}
        if self.spend is not None:
            extra["spend"] = self.spend.to_plain()
        if self.memory:
            extra["mem"] = [[key, flags] for key, flags in self.memory.items()]
        if self.scope is not None:
            extra["scope"] = self.scope
        return orjson.dumps(
            {
                "v": _SNAPSHOT_VERSION,
                "epoch": self.epoch,
                "sigs": [
                    [
                        key,
                        s.count,
                        s.last_outcome,
                        s.same_outcomes,
                        s.changed,
                        s.failed,
                        s.novel_seen,
                        s.looped,
                        s.refused,
                    ]
                    for key, s in signatures.items()
                ],
                "window": [position.get(key, key) for key in self.window],
                "last": None if last is None else position.get(last, last),
                "run": self.run_length,
                "redundant": self.redundant,
                "denials": self.denials,
                "stopped": self.stopped,
                "stop_at": self.stop_threshold,
                "pending": [
                    [ref, p.args_key, p.blocked, p.mutating, p.outstanding]
                    for ref, p in (self.pending or {}).items()
                ],
                "advice": self.advice,
                "rescues": self.rescues,
                "rescue_at": self.last_rescue_at,
                "seen": self.last_seen,
                "mutation": self.mutation,
                "novel": self.novel,
                **extra,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes, policy: Policy) -> SessionState:
        """Rebuild a state written by :meth:`to_bytes`, within ``policy``'s bounds.

        1. Parse and check every field's type; anything else raises ``ValueError`` (the caller
           decides whether to start afresh).
        2. Keep the most recent ``max_signatures_per_session`` signatures, ``window_size - 1``
           window entries and :data:`MAX_PENDING_CALLS` pending calls, so a state written under
           a larger policy still fits this one.
        """
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"session state: not JSON ({exc})") from None
        return cls.from_plain(raw, policy)

    @classmethod
    def from_plain(cls, raw: object, policy: Policy) -> SessionState:
        """:meth:`from_bytes` of the state already parsed (an object inside a larger JSON
        value, as the Redis store keeps it)."""
        if not isinstance(raw, dict):
            raise ValueError("session state: expected an object")
        if raw.get("v") != _SNAPSHOT_VERSION:
            raise ValueError(f"session state: unknown version {raw.get('v')!r}")
        state = cls(read_number(raw.get("seen"), "seen"))
        state.epoch = read_count(raw.get("epoch"), "epoch")
        keys, signatures = _read_signatures(read_list(raw.get("sigs"), "sigs"))

        def resolve(item: object) -> str:
            if isinstance(item, int) and not isinstance(item, bool) and 0 <= item < len(keys):
                return keys[item]
            return read_text(item, "window key")

        window = [resolve(item) for item in read_list(raw.get("window"), "window")]
        last = raw.get("last")
        state.last_key = None if last is None else resolve(last)
        state.run_length = read_count(raw.get("run"), "run")
        state.redundant = read_count(raw.get("redundant"), "redundant")
        state.denials = read_count(raw.get("denials"), "denials")
        state.stopped = read_flag(raw.get("stopped"), "stopped")
        state.stop_threshold = read_count(raw.get("stop_at", 0), "stop_at")
        pending: dict[str, Pending] = {}
        for entry in read_list(raw.get("pending"), "pending"):
            if not (isinstance(entry, list) and len(entry) == 5):
                raise ValueError(f"session state: bad pending entry {entry!r}")
            ref, key, blocked, mutating, outstanding = entry
            pending[read_text(ref, "pending ref")] = Pending(
                read_text(key, "pending key"),
                read_flag(blocked, "blocked"),
                read_flag(mutating, "mutating"),
                max(1, read_count(outstanding, "outstanding")),
            )
        advice = raw.get("advice")
        if advice is not None:
            if not isinstance(advice, dict):
                raise ValueError("session state: advice must be an object")
            state.advice = {
                read_text(k, "advice key"): read_text(v, "advice")
                for k, v in advice.items()
                if k in signatures
            }
        state.mutation = read_optional_text(raw.get("mutation"), "mutation")
        state.novel = read_count(raw.get("novel", 0), "novel")
        state.rescues = read_count(raw.get("rescues"), "rescues")
        rescue_at = raw.get("rescue_at")
        state.last_rescue_at = None if rescue_at is None else read_number(rescue_at, "rescue_at")
        limit = policy.max_signatures_per_session
        state.signatures = (
            dict(list(signatures.items())[-limit:]) if len(signatures) > limit else signatures
        )
        state.window = window[-(policy.window_size - 1) :] if policy.window_size > 1 else []
        while len(pending) > MAX_PENDING_CALLS:
            del pending[next(iter(pending))]
        state.pending = pending or None
        trail = raw.get("trail")
        state.trail = None if trail is None else Trail.from_json(trail)
        spend = raw.get("spend")
        state.spend = None if spend is None else Spend.from_plain(spend)
        marks = raw.get("mem")
        if marks is not None:
            memory: dict[str, int] = {}
            for entry in read_list(marks, "mem")[-MAX_MEMORY_MARKS:]:
                if not (isinstance(entry, list) and len(entry) == 2):
                    raise ValueError(f"session state: bad memory entry {entry!r}")
                memory[read_text(entry[0], "memory key")] = read_count(entry[1], "memory flags")
            state.memory = memory or None
        state.scope = read_optional_text(raw.get("scope"), "scope")
        return state


def _read_signatures(entries: list[object]) -> tuple[list[str], dict[str, SignatureState]]:
    """The signatures of a state :meth:`SessionState.to_bytes` wrote: (keys in order, key ->
    state). Raises ``ValueError`` naming the bad field."""
    keys: list[str] = []
    signatures: dict[str, SignatureState] = {}
    new = SignatureState.__new__
    for entry in entries:
        if type(entry) is list and len(entry) == 9:
            # The current layout, every field of its exact type, checked inline (the Redis
            # store reads a session per call); anything else is read below, naming the field.
            key, count, last_outcome, same, changed, failed, seen, looped, refused = entry
            if (
                type(key) is str
                and type(count) is int
                and count >= 0
                and (last_outcome is None or type(last_outcome) is str)
                and type(same) is int
                and same >= 0
                and type(changed) is bool
                and type(failed) is bool
                and type(seen) is int
                and seen >= 0
                and type(looped) is bool
                and type(refused) is int
                and refused >= 0
            ):
                signature = new(SignatureState)
                signature.count = count
                signature.last_outcome = last_outcome
                signature.same_outcomes = same
                signature.changed = changed
                signature.failed = failed
                signature.novel_seen = seen
                signature.looped = looped
                signature.refused = refused
                keys.append(key)
                signatures[key] = signature
                continue
        key, signature = _read_signature(entry)
        keys.append(key)
        signatures[key] = signature
    return keys, signatures


def _read_signature(entry: object) -> tuple[str, SignatureState]:
    """One signature entry of any layout written so far, each field checked by name."""
    # Five fields in states written before failures and exploration were remembered,
    # eight before refused attempts were.
    if not (isinstance(entry, list) and len(entry) in (5, 8, 9)):
        raise ValueError(f"session state: bad signature entry {entry!r}")
    key, count, last_outcome, same, changed = entry[:5]
    signature = SignatureState()
    if len(entry) >= 8:
        signature.failed = read_flag(entry[5], "failed")
        signature.novel_seen = read_count(entry[6], "novel seen")
        signature.looped = read_flag(entry[7], "looped")
    if len(entry) == 9:
        signature.refused = read_count(entry[8], "refused")
    signature.count = read_count(count, "count")
    signature.last_outcome = read_optional_text(last_outcome, "last outcome")
    signature.same_outcomes = read_count(same, "same outcomes")
    signature.changed = read_flag(changed, "changed")
    return read_text(key, "signature key"), signature
