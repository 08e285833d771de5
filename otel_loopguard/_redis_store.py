"""Sessions in Redis, shared by every process that decides calls (``store="redis://..."``).

The guard's own code runs unchanged (:class:`~otel_loopguard._core.GuardCore`); only what its
lock means changes. A :class:`RedisCore` runs each entrance (an attempt, a report, a user
message, a new run) inside one session's transaction, on the thread that called it:

1. Each block the core runs under its lock starts by reading the session's one Redis value
   (every agent's :class:`~otel_loopguard._engine.SessionState` and its reported calls) into
   the in-process store, and ends by taking it out again and writing it back with a
   compare-and-set script: written only if the value is still the one read.
2. When another process wrote the session in between, the block raises :class:`_Conflict`
   before the core reports anything (metrics, trip lines, asks happen after its lock block),
   and the whole entrance runs again on the new value, at most :data:`MAX_TRIES` times.
   So concurrent processes give exactly the counts one process gives.
3. A Redis that fails (unreachable, slow beyond ``store_timeout_seconds``, out of memory,
   read-only) raises :class:`StoreDown`: the entrance is answered as ``store_failure`` says
   (open: allow; closed: deny, in enforce mode), counted in ``loopguard_store_errors_total{op}``
   and logged once per kind; the store is not tried again for :data:`RETRY_AFTER_SECONDS`, so a
   Redis that never answers costs one timeout a second, not one per call. Never raised into
   the application.
4. A value that cannot be read (another version, damaged) is reset to an empty session, with a
   warning and ``loopguard_store_errors_total{op="decode"}``.

Keys: ``<store_prefix>{<session>}``; the braces are a hash tag, so a session keeps one Redis
Cluster slot. Each write sets the key's TTL to ``session_ttl_seconds``: Redis forgets idle
sessions. The ``redis`` client (redis-py; Valkey speaks the same protocol) is imported when a
guard with a store is built (``pip install 'otel-loopguard[redis]'``).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import orjson

from ._advice import Advisor
from ._calls import tool_name
from ._core import GuardCore
from ._engine import SessionState
from ._lazy import LOGGER_NAME
from ._ledger import Settled
from ._plain import read_flag, read_list, read_optional_text, read_text
from ._policy import ALLOW, Action, Decision
from ._prices import Cost, ModelUsage
from ._session_store import SessionStore
from ._settings import redact_url
from .config import Mode, Policy, StoreFailure
from .metrics import Recorder

__all__ = ["MAX_TRIES", "RETRY_AFTER_SECONDS", "RedisCore", "RedisSessions", "StoreDown"]

_log = logging.getLogger(LOGGER_NAME)

T = TypeVar("T")

#: Runs of one entrance when other processes keep writing its session in between.
MAX_TRIES: Final = 32
#: Sessions whose last value is kept decoded (see :meth:`RedisCore._take_out`).
MAX_DECODED: Final = 4096
#: After a failure, seconds during which calls are decided without trying Redis.
RETRY_AFTER_SECONDS: Final = 1.0
#: Version of the session value's layout; another version is reset (``decode``).
VALUE_VERSION: Final = 1
_STRIPES: Final = 64
#: The message of a call refused because the store failed (``store_failure = "closed"``).
CLOSED_MESSAGE: Final = (
    "Loop guard: the shared session store is unavailable, so this call was not run"
    " (store_failure = closed). Try again shortly."
)

# Compare-and-set: write ARGV[2] (delete when empty) only if the key still holds ARGV[1]
# ('' for no key), and return 1; else return {0, the value it holds} (so a try again needs no
# read of its own). A session value is never empty.
_CAS_SCRIPT: Final = """
local current = redis.call('GET', KEYS[1])
if current == false then current = '' end
if current ~= ARGV[1] then return {0, current} end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
"""


#: No value found by a compare-and-set is waiting for the next try.
_NOTHING: Final = object()


class StoreDown(BaseException):
    """Redis failed at ``op`` (``read`` or ``write``). A ``BaseException``: it passes the
    core's own ``except Exception`` fallbacks and reaches :class:`RedisCore`, which answers."""

    def __init__(self, op: str, cause: BaseException) -> None:
        super().__init__(op, cause)
        self.op = op
        self.cause = cause


class _Conflict(BaseException):
    """Another process wrote the session during a block: run the entrance again."""


def _password(policy: Policy) -> str | None:
    path = policy.store_password_file
    if path is None:
        return None
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"store_password_file: cannot read {path!r}: {exc}") from None
    lines = text.splitlines()
    if not lines or not lines[0]:
        raise ValueError(f"store_password_file: {path!r} has no password on its first line")
    return lines[0]


class RedisSessions:
    """One session's value in Redis: read it, and compare-and-set it. Thread-safe (redis-py's
    connection pool); every command waits at most ``store_timeout_seconds``, and is not
    retried by the client (a failure is the caller's to answer)."""

    def __init__(self, policy: Policy) -> None:
        url = policy.store
        if url is None:
            raise ValueError("store: expected a Redis URL, got None")
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ValueError(
                f"store: {redact_url(url)!r} needs the Redis client:"
                " pip install 'otel-loopguard[redis]'"
            ) from None
        timeout = policy.store_timeout_seconds
        options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
            "retry_on_timeout": False,
            "health_check_interval": 0,
        }
        # No CLIENT SETINFO round trip on each new connection (driver_info from redis-py 7).
        if importlib.util.find_spec("redis.driver_info") is not None:
            options["driver_info"] = None
        else:
            options.update(lib_name=None, lib_version=None)
        password = _password(policy)
        if password is not None:
            options["password"] = password
        try:
            self.client: Any = redis.Redis.from_url(url, **options)
        except ValueError as exc:
            raise ValueError(f"store: {redact_url(url)!r} is not a Redis URL: {exc}") from None
        self.prefix = policy.store_prefix
        self.ttl_ms = max(1, int(policy.session_ttl_seconds * 1000))
        self._cas = self.client.register_script(_CAS_SCRIPT)
        self.url = redact_url(url)

    def key(self, session: str) -> str:
        """The Redis key of ``session``: the prefix, then the session in a hash tag."""
        return f"{self.prefix}{{{session}}}"

    def load(self, session: str) -> bytes | None:
        """The session's value (``None`` when Redis has none). Raises :class:`StoreDown`."""
        try:
            value = self.client.get(self.key(session))
        except Exception as exc:
            raise StoreDown("read", exc) from None
        return cast("bytes | None", value)

    def swap(self, session: str, old: bytes | None, new: bytes | None) -> tuple[bool, bytes | None]:
        """Write ``new`` (delete for ``None``) if the value is still ``old``: (whether it was,
        else the value it is). Raises :class:`StoreDown`."""
        try:
            done = self._cas(keys=[self.key(session)], args=[old or b"", new or b"", self.ttl_ms])
        except Exception as exc:
            raise StoreDown("write", exc) from None
        if isinstance(done, list):
            current = done[1] if len(done) > 1 else None
            return False, bytes(current) if current else None
        return True, None

    def close(self) -> None:
        self.client.close()


#: One agent's part of a session value: (agent, state, reported calls).
_Entry = tuple[str | None, SessionState | None, dict[str, Settled]]


def encode(entries: list[_Entry]) -> bytes | None:
    """A session's value: ``{"v": 1, "agents": [[agent, state, [[ref, key, awaiting], ...]],
    ...]}`` (``agent`` ``None`` for the session's own key, ``state`` as
    :meth:`SessionState.to_bytes` writes it, or ``None``); ``None`` when there is nothing."""
    if not entries:
        return None
    return orjson.dumps(
        {
            "v": VALUE_VERSION,
            "agents": [
                [
                    agent,
                    None if state is None else orjson.Fragment(state.to_bytes()),
                    [[ref, key, awaiting] for ref, (key, awaiting) in calls.items()],
                ]
                for agent, state, calls in entries
            ],
        }
    )


def decode(value: bytes, policy: Policy) -> list[_Entry]:
    """The entries of a value :func:`encode` wrote. Raises ``ValueError`` naming what is
    wrong."""
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"session value: not JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("v") != VALUE_VERSION:
        version = raw.get("v") if isinstance(raw, dict) else None
        raise ValueError(f"session value: unknown version {version!r}")
    entries: list[_Entry] = []
    for entry in read_list(raw.get("agents"), "agents"):
        if not (isinstance(entry, list) and len(entry) == 3):
            raise ValueError(f"session value: bad agent entry {entry!r:.80}")
        agent = read_optional_text(entry[0], "agent")
        state = None if entry[1] is None else SessionState.from_plain(entry[1], policy)
        calls: dict[str, Settled] = {}
        for call in read_list(entry[2], "reported calls"):
            if not (isinstance(call, list) and len(call) == 3):
                raise ValueError(f"session value: bad reported call {call!r:.80}")
            calls[read_text(call[0], "reported ref")] = (
                read_text(call[1], "reported key"),
                read_flag(call[2], "awaiting"),
            )
        entries.append((agent, state, calls))
    return entries


class _SessionLock:
    """The guard's lock, which on a thread inside a session's transaction (:attr:`tx`'s
    ``session`` set) also brings the session in from Redis when a block starts and writes it
    back when the block ends (see the module). Elsewhere a plain lock."""

    __slots__ = ("_core", "_lock", "tx")

    def __init__(self, core: RedisCore) -> None:
        self._core = core
        self._lock = threading.Lock()
        self.tx = threading.local()

    def __enter__(self) -> None:
        session: str | None = getattr(self.tx, "session", None)
        if session is None:
            self._lock.acquire()
            return
        tx = self.tx
        core = self._core
        # After a conflict: the value the compare-and-set found. Else what this process wrote
        # last, taken without asking (the write at the end checks it); else Redis is read.
        value: bytes | None
        if tx.found is not _NOTHING:
            value, tx.found, tx.verified = tx.found, _NOTHING, True
        else:
            cached = core._decoded.get(session)
            tx.verified = cached is None
            # Off the lock: other sessions go on.
            value = core.sessions.load(session) if cached is None else cached[0]
        self._lock.acquire()
        try:
            self.tx.keys, self.tx.unreadable = self._core._bring_in(session, value)
        except BaseException:
            self._lock.release()
            raise
        self.tx.value = value

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        session: str | None = getattr(self.tx, "session", None)
        if session is None:
            self._lock.release()
            return
        try:
            value = self._core._take_out(session, self.tx.keys, keep=kind is None)
        finally:
            self._lock.release()
        unreadable = self.tx.unreadable
        if unreadable is not None:
            self.tx.unreadable = None
            self._core._store_failed("decode", unreadable)
        if kind is not None:
            return  # the block failed: nothing is written; the error goes on
        old: bytes | None = self.tx.value
        if value == old and self.tx.verified:
            return
        done, found = self._core.sessions.swap(session, old, value)
        if not done:
            self.tx.found = found
            raise _Conflict()

    # The Rescues' lock role: acquire/release for ``with``.
    def acquire(self) -> bool:
        return self._lock.acquire()

    def release(self) -> None:
        self._lock.release()


class RedisCore(GuardCore):
    """A :class:`GuardCore` whose sessions live in Redis (see the module)."""

    def __init__(
        self,
        policy: Policy,
        advisor: Advisor | None,
        clock: Callable[[], float] | None,
        recorder: Recorder | None,
    ) -> None:
        self.sessions = RedisSessions(policy)
        # Wall-clock time: session times (last seen, the advisor's cooldown) are compared
        # across processes and machines.
        super().__init__(policy, advisor, clock if clock is not None else time.time, recorder)
        # Only sessions in flight are kept here: no capacity limit of its own (Redis's TTL
        # forgets idle sessions).
        self.store = SessionStore(
            sys.maxsize, policy.session_ttl_seconds, self._clock, self._evictions.append
        )
        self._session_lock = _SessionLock(self)
        self._lock = cast(threading.Lock, self._session_lock)
        self.rescues._lock = self._lock
        self.rescues.settle = self._settle_answer
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._down_until = 0.0
        self._store_logged: set[str] = set()
        self.store_errors: dict[str, int] = {}
        self.retries = 0  # entrances run again after another process wrote their session
        # Session -> (the value this process last wrote or read, its entries), oldest first.
        self._decoded: dict[str, tuple[bytes, list[_Entry]]] = {}

    # -- the transaction around one entrance -------------------------------------------------

    def _in_session(self, session: object, agent: object, run: Callable[[], T]) -> T | None:
        """``run()`` inside ``session``'s transaction, again on a conflict; ``None`` when the
        store failed (counted and logged here). What the entrance charges other sessions (a
        sub-agent's spend, to its ancestors) is charged after it, each in its own transaction."""
        tx = self._session_lock.tx
        if getattr(tx, "session", None) is not None:
            return run()  # an entrance inside another (a report heard of first): one transaction
        try:
            return self._in_one_session(session, agent, run)
        finally:
            later = getattr(tx, "later", None)
            if later:
                tx.later = None
                for sid, ancestors, tokens, usd, loop in later:
                    GuardCore.charge_ancestors(self, sid, ancestors, tokens, usd, loop=loop)

    def charge_ancestors(
        self,
        session: str,
        ancestors: tuple[tuple[str, str | None], ...],
        tokens: int,
        usd: float | None,
        *,
        loop: bool = False,
    ) -> None:
        tx = self._session_lock.tx
        if getattr(tx, "session", None) is None:
            GuardCore.charge_ancestors(self, session, ancestors, tokens, usd, loop=loop)
            return
        # Inside another session's transaction: after it (see _in_session).
        later = getattr(tx, "later", None)
        if later is None:
            later = tx.later = []
        later.append((session, ancestors, tokens, usd, loop))

    def charge_below(
        self,
        session: str,
        agent: str | None,
        tokens: int,
        usd: float | None,
        *,
        apart: bool,
        loop: bool = False,
    ) -> None:
        self._in_session(
            session,
            agent,
            lambda: GuardCore.charge_below(
                self, session, agent, tokens, usd, apart=apart, loop=loop
            ),
        )

    def _in_one_session(self, session: object, agent: object, run: Callable[[], T]) -> T | None:
        tx = self._session_lock.tx
        if self._down_until and time.monotonic() < self._down_until:
            self._store_failed(None, None)
            return None
        sid = self._ids(session, agent)[0]
        with self._stripes[hash(sid) % _STRIPES]:  # this process's calls of a session in turn
            tx.session = sid
            tx.found = _NOTHING
            try:
                for _ in range(MAX_TRIES):
                    tx.later = None  # what a conflicting try would charge is not charged
                    try:
                        result = run()
                    except _Conflict:
                        self.retries += 1
                        continue
                    self._down_until = 0.0
                    return result
                failure: tuple[str, BaseException | None] = ("conflict", None)
            except StoreDown as down:
                self._down_until = time.monotonic() + RETRY_AFTER_SECONDS
                failure = (down.op, down.cause)
            finally:
                tx.session = None
                tx.value = None
                tx.found = _NOTHING
        self._store_failed(*failure)
        return None

    def _bring_in(self, session: str, value: bytes | None) -> tuple[list[object], Exception | None]:
        """Under the lock: the session's value into the in-process store and ledger; (the keys
        brought in, why the value could not be read). An unreadable value is left out: the
        session starts afresh, and the next write replaces it (reported by the lock, off it)."""
        if value is None:
            return [], None
        cached = self._decoded.pop(session, None)
        if cached is not None and cached[0] == value:
            entries = cached[1]  # what this process wrote last: the same states, not decoded
        else:
            try:
                entries = decode(value, self.policy)
            except Exception as exc:
                return [], exc
        keys: list[object] = []
        for agent, state, calls in entries:
            key = self._store_key(session, agent)
            keys.append(key)
            if state is not None:
                self.store.put(key, state)
            if calls:
                self._settled.put_calls(key, calls)
        return keys, None

    def _take_out(self, session: str, brought: list[object], *, keep: bool) -> bytes | None:
        """Under the lock: the session's value, taken out of the in-process store and ledger;
        with ``keep``, its states kept beside it, so that reading the same value back needs no
        decoding (:data:`MAX_DECODED`)."""
        entries: list[tuple[str | None, SessionState | None, dict[str, Settled]]] = []
        keys: list[object] = [session, *self.store.agent_keys(session)]
        keys.extend(key for key in brought if key not in keys)
        for key in keys:
            state = self.store.take(key)
            calls = self._settled.take_calls(key) or {}
            if state is not None or calls:
                agent = key[1] if type(key) is tuple else None
                entries.append((agent, state, calls))
        value = encode(entries)
        if keep and value is not None:
            decoded = self._decoded
            decoded[session] = (value, entries)
            if len(decoded) > MAX_DECODED:
                del decoded[next(iter(decoded))]
        return value

    def _settle_answer(self, store_key: object, change: Callable[[SessionState], None]) -> None:
        """On the advisor's thread: its answer (advice cached, or the budget refunded) applied
        to the session as Redis keeps it, in a transaction of its own."""
        sid, agent = store_key if type(store_key) is tuple else (store_key, None)

        def run() -> None:
            with self._lock:
                state = self.store.get(store_key, create=False)
                if state is not None:
                    change(state)

        self._in_session(sid, agent, run)

    def _store_failed(self, op: str | None, exc: BaseException | None) -> None:
        """Count a store failure (``op`` ``None``: a call made while the store is not tried,
        counted under the failure that stopped it, not again) and log it once per kind."""
        if op is None:
            return
        self.store_errors[op] = self.store_errors.get(op, 0) + 1
        recorder = self.reporter.recorder
        store_error = getattr(type(recorder), "store_error", None)
        if store_error is not None:
            try:
                store_error(recorder, op)
            except Exception as error:
                self.report_internal_error("store_error", error)
        if op in self._store_logged:
            return
        self._store_logged.add(op)
        if op == "decode":
            _log.warning(
                "loopguard: a session stored in %s could not be read (%s); it starts afresh"
                " (further such sessions are counted, not logged)",
                self.sessions.url,
                exc,
            )
        else:
            what = {"read": "reading", "write": "writing", "conflict": "updating"}.get(op, op)
            _log.warning(
                "loopguard: %s a session in %s failed (%s); calls are decided as"
                " store_failure=%s says until it works again (further %s failures are counted,"
                " not logged)",
                what,
                self.sessions.url,
                exc if exc is not None else f"{MAX_TRIES} concurrent updates in a row",
                self.policy.store_failure.value,
                op,
            )

    def _failed_decision(self, tool: object, session: object) -> Decision:
        policy = self.policy
        if policy.store_failure is StoreFailure.OPEN or policy.mode is not Mode.ENFORCE:
            return ALLOW
        return Decision(
            Action.DENY,
            CLOSED_MESSAGE,
            tool=tool_name(tool),
            session=session if isinstance(session, str) else tool_name(session),
            detected=Action.DENY,
        )

    # -- the entrances -------------------------------------------------------------------------

    def attempt(
        self,
        tool: object,
        arguments: object,
        session: object,
        agent: object,
        call_id: object,
        *,
        wait_for_advice: bool,
        ran: Any = None,
    ) -> Decision:
        decision = self._in_session(
            session,
            agent,
            lambda: GuardCore.attempt(
                self,
                tool,
                arguments,
                session,
                agent,
                call_id,
                wait_for_advice=wait_for_advice,
                ran=ran,
            ),
        )
        return decision if decision is not None else self._failed_decision(tool, session)

    def finish(
        self,
        tool: object,
        arguments: object,
        session: object,
        agent: object,
        call_id: object,
        error: bool | None,
        result: object,
        duration_seconds: float | None,
    ) -> Decision | None:
        last = getattr(self._last, "call", None)
        if last is not None and last[5] is not None:
            # The state it remembers is a copy taken out of Redis: read the session again.
            self._last.call = (*last[:5], None)
        return self._in_session(
            session,
            agent,
            lambda: GuardCore.finish(
                self, tool, arguments, session, agent, call_id, error, result, duration_seconds
            ),
        )

    def reset(
        self, session: object, agent: object, where: str, text: object = None, *, task: bool = False
    ) -> None:
        self._in_session(
            session, agent, lambda: GuardCore.reset(self, session, agent, where, text, task=task)
        )

    def model_call(
        self,
        usage: ModelUsage,
        session: object,
        agent: object,
        ancestors: tuple[tuple[str, str | None], ...] = (),
    ) -> Cost | None:
        return self._in_session(
            session, agent, lambda: GuardCore.model_call(self, usage, session, agent, ancestors)
        )

    def set_task(self, session: str, task: str, agent: str | None) -> None:
        self._in_session(session, agent, lambda: GuardCore.set_task(self, session, task, agent))

    def set_scope(self, session: str, scope: str, agent: str | None) -> None:
        self._in_session(session, agent, lambda: GuardCore.set_scope(self, session, scope, agent))

    def export_session(self, session: str, agent: str | None) -> SessionState | None:
        state = self._in_session(
            session, agent, lambda: GuardCore.export_session(self, session, agent)
        )
        self._forget_decoded(session, agent)  # the caller holds the state now
        return state

    def import_session(self, session: str, state: SessionState, agent: str | None) -> None:
        self._in_session(
            session, agent, lambda: GuardCore.import_session(self, session, state, agent)
        )
        self._forget_decoded(session, agent)  # the caller may change its state later

    def _forget_decoded(self, session: str, agent: str | None) -> None:
        with self._lock:
            self._decoded.pop(self._ids(session, agent)[0], None)

    def count_sessions(self) -> int:
        """0: the sessions are Redis's (count its keys with ``--scan --pattern``)."""
        return 0

    def restore(self, data: Any) -> None:
        raise ValueError(
            f"restore: sessions are kept in {self.sessions.url} (store); there is nothing to"
            " restore into this process"
        )
