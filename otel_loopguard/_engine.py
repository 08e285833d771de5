"""Per-session state, bounded, and the bookkeeping that feeds the rules.

Nothing here locks, logs or counts metrics: the guard holds its lock around these calls and
reports what they return. Every structure is bounded: sessions by ``max_sessions`` (LRU) and
``session_ttl_seconds`` (idle), signatures per session by ``max_signatures_per_session`` (LRU),
the window by ``window_size``, pending hook calls by :data:`MAX_PENDING_CALLS`. Beside it: what a
session remembers for an advisor (:mod:`._trail`), which calls are tracked
(:mod:`._classifier`) and which reports are settled (:mod:`._ledger`).

A session's state can leave the process and come back (:meth:`SessionState.to_bytes`,
:meth:`SessionState.from_bytes`, :meth:`SessionStore.put`): command hooks run one process per
call and keep sessions in a file between calls.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
from ._prices import COMPUTED, PROVIDER, Cost, ModelUsage
from ._trail import Trail
from .config import Policy

__all__ = [
    "MAX_PENDING_CALLS",
    "Pending",
    "SessionState",
    "SessionStore",
    "STORE_SNAPSHOT_VERSION",
    "SignatureState",
    "Spend",
]

#: Hook calls awaiting their ``after_tool`` per session; the oldest is forgotten beyond this.
MAX_PENDING_CALLS: Final = 64
_EXPIRY_INTERVAL_SECONDS: Final = 1.0
#: Version of the :meth:`SessionState.to_bytes` layout; other versions are refused on load.
_SNAPSHOT_VERSION: Final = 1
#: Version of the :meth:`SessionStore.snapshot` layout; :meth:`SessionStore.restore` refuses
#: others.
STORE_SNAPSHOT_VERSION: Final = 1


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


@dataclass(slots=True)
class Pending:
    """A hook attempt whose outcome has not been reported yet."""

    args_key: str
    blocked: bool
    mutating: bool
    outstanding: int = 1


class Spend:
    """Model-call totals of one session: ``calls``; ``input_tokens`` (cached ones included),
    ``output_tokens``, ``cache_read_tokens``, ``cache_write_tokens``; ``provider_usd`` (costs
    the provider reported) and ``computed_usd`` (computed at API prices); ``unpriced_calls``
    (calls whose cost nobody knows: their tokens are counted, their cost is not).

    In loops: a model turn comes before the calls it requests, so its tokens and known cost are
    held (``held``) until the first call after it is counted; when that call repeats an earlier
    one of the epoch (a repeat without progress: progress starts a new epoch), the turn was
    spent in a loop (``loop_turns``, ``loop_tokens``, ``loop_usd``). A turn followed by another
    turn before any call (a final answer, a turn of text) is not. ``refused_after_stop``: calls
    the guard refused because the run was stopped (the stopping call included), for
    :meth:`avoided`."""

    __slots__ = (
        "cache_read_tokens",
        "cache_write_tokens",
        "calls",
        "computed_usd",
        "held",
        "input_tokens",
        "loop_tokens",
        "loop_turns",
        "loop_usd",
        "output_tokens",
        "provider_usd",
        "refused_after_stop",
        "unpriced_calls",
    )

    def __init__(self) -> None:
        self.calls = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cache_read_tokens = 0
        self.cache_write_tokens = 0
        self.provider_usd = 0.0
        self.computed_usd = 0.0
        self.unpriced_calls = 0
        self.held: tuple[int, float] | None = None  # the last turn's (tokens, known usd)
        self.loop_turns = 0
        self.loop_tokens = 0
        self.loop_usd = 0.0
        self.refused_after_stop = 0

    @property
    def tokens(self) -> int:
        """Every token: input (cached ones included) and output."""
        return self.input_tokens + self.output_tokens

    @property
    def cost_usd(self) -> float:
        """The known cost: the provider's figures plus the computed ones (unpriced calls add
        nothing; see :attr:`unpriced_calls`)."""
        return self.provider_usd + self.computed_usd

    def add(self, usage: ModelUsage, cost: Cost) -> None:
        """Count one model call and its cost; hold it until its first tool call is counted."""
        self.calls += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cache_read_tokens += usage.cache_read_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        usd = 0.0
        if cost.usd is None:
            self.unpriced_calls += 1
        elif cost.source == PROVIDER:
            self.provider_usd += cost.usd
            usd = cost.usd
        elif cost.source == COMPUTED:
            self.computed_usd += cost.usd
            usd = cost.usd
        self.held = (usage.input_tokens + usage.output_tokens, usd)

    def call_counted(self, repeated: bool, refused_stopped: bool) -> None:
        """A tool call was counted: the held turn (if any) was spent in a loop when the call
        ``repeated`` an earlier one of the epoch. ``refused_stopped``: refused because the run
        is stopped."""
        held = self.held
        if held is not None:
            self.held = None
            if repeated:
                self.loop_turns += 1
                self.loop_tokens += held[0]
                self.loop_usd += held[1]
        if refused_stopped:
            self.refused_after_stop += 1

    def avoided(self) -> tuple[int, float]:
        """An **estimate** of what the stop avoided, (tokens, USD): the loop's mean tokens and
        known cost per turn times the calls refused because the run was stopped (each refused
        call is taken for one more turn of the loop had the run gone on). (0, 0.0) without a
        stop or a loop."""
        if not self.loop_turns or not self.refused_after_stop:
            return 0, 0.0
        share = self.refused_after_stop / self.loop_turns
        return round(self.loop_tokens * share), self.loop_usd * share

    def copy(self) -> Spend:
        other = Spend()
        for name in Spend.__slots__:
            setattr(other, name, getattr(self, name))
        return other

    def to_plain(self) -> list[object]:
        return [
            self.calls,
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_write_tokens,
            self.provider_usd,
            self.computed_usd,
            self.unpriced_calls,
            None if self.held is None else list(self.held),
            self.loop_turns,
            self.loop_tokens,
            self.loop_usd,
            self.refused_after_stop,
        ]

    @classmethod
    def from_plain(cls, raw: object) -> Spend:
        """The spend :meth:`to_plain` wrote; ``ValueError`` naming the bad field."""
        items = read_list(raw, "spend")
        if len(items) != 13:
            raise ValueError(f"session state: bad spend {raw!r}")
        spend = cls()
        spend.calls = read_count(items[0], "spend calls")
        spend.input_tokens = read_count(items[1], "spend input tokens")
        spend.output_tokens = read_count(items[2], "spend output tokens")
        spend.cache_read_tokens = read_count(items[3], "spend cache read tokens")
        spend.cache_write_tokens = read_count(items[4], "spend cache write tokens")
        spend.provider_usd = read_number(items[5], "spend provider usd")
        spend.computed_usd = read_number(items[6], "spend computed usd")
        spend.unpriced_calls = read_count(items[7], "spend unpriced calls")
        held = items[8]
        if held is not None:
            pair = read_list(held, "spend held turn")
            if len(pair) != 2:
                raise ValueError(f"session state: bad spend held turn {held!r}")
            spend.held = (read_count(pair[0], "spend held tokens"), read_number(pair[1], "usd"))
        spend.loop_turns = read_count(items[9], "spend loop turns")
        spend.loop_tokens = read_count(items[10], "spend loop tokens")
        spend.loop_usd = read_number(items[11], "spend loop usd")
        spend.refused_after_stop = read_count(items[12], "spend refused after stop")
        return spend


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
        "mutation",
        "novel",
        "pending",
        "redundant",
        "rescues",
        "run_length",
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
        self.pending: OrderedDict[str, Pending] | None = None
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

    def signature(self, key: str) -> SignatureState | None:
        return self.signatures.get(key)

    def new_epoch(self, *, clear_stop: bool = False) -> None:
        """Forget the repeat evidence: the agent's world changed."""
        self.epoch += 1
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
            table = self.pending = OrderedDict()
        existing = table.get(ref)
        if existing is not None and existing.args_key == key:
            existing.outstanding += 1
            existing.blocked = blocked
            return
        if len(table) >= MAX_PENDING_CALLS:
            table.popitem(last=False)
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
        pending: OrderedDict[str, Pending] = OrderedDict()
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
            pending.popitem(last=False)
        state.pending = pending or None
        trail = raw.get("trail")
        state.trail = None if trail is None else Trail.from_json(trail)
        spend = raw.get("spend")
        state.spend = None if spend is None else Spend.from_plain(spend)
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
