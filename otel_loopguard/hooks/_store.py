"""Hook sessions in one SQLite file, shared by every hook process on the machine.

Each hook invocation is a process of its own, so a session's state lives here between calls:
one row per host session (and sub-agent) holding the guard's :class:`SessionState` as bytes,
and the reminders decided before a call that the host only shows after it (``notes``).

Concurrency: an invocation is one transaction begun with ``BEGIN IMMEDIATE``, so the write lock
is taken before the state is read and two invocations can never both read a state and both
write it back (no lost counts). Others wait up to the busy timeout, then fail. The journal is
WAL, so a commit is one append and readers never wait.

Bounds: rows idle longer than the policy's ``session_ttl_seconds`` are deleted, and the least
recently updated beyond ``max_sessions``, whenever a new session is stored.

Where each session's transcript was last read (:class:`~._transcript.Mark`, for the model usage
it carries) is a row of its own table, ``transcripts``, keyed as ``sessions`` and bounded the same
way on its own: the ``--server`` backend keeps it here too, with no session row. The table is
created in files of schema version 1 when first needed (older versions of the hooks ignore it).
So is ``memory``, the dead ends remembered across runs (:class:`~otel_loopguard._memory.
SqliteMemory`), created in each transaction if missing: the guard reads it through a
connection of its own, and writes to it after the transaction (it would wait for it).

A corrupt file (not a database, or a damaged one) is moved aside to
``<file>.corrupt-<UTC timestamp>`` (with its ``-wal``/``-shm`` files) and a fresh one is made,
with one line on stderr: the counts it held are lost, but the hooks work again instead of
failing open (or, with ``--fail-closed``, denying) on every call forever. Any other problem with
the file (cannot be created, unwritable, locked past the busy timeout, written by a newer
schema), or a file still corrupt after that, is raised as :class:`StoreError`, naming the file.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import orjson

from .._env import LOOPGUARD_HOOK_STORE
from .._memory_records import move_aside
from .._memory_sqlite import MEMORY_TABLE
from .._record import Record

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_SECONDS",
    "HookStore",
    "Row",
    "SCHEMA_VERSION",
    "STORE_ENV",
    "StoreError",
    "default_store_path",
]

STORE_ENV: Final = LOOPGUARD_HOOK_STORE
"""Path of the hooks' SQLite state file (``--store`` overrides it). Default:
``$XDG_STATE_HOME/otel-loopguard/hooks.sqlite3``, else
``~/.local/state/otel-loopguard/hooks.sqlite3``. An empty value means the default."""

#: Seconds an invocation waits for another one's transaction before giving up (then it fails
#: open, or closed). Hook calls hold the lock for about a millisecond; a rescue holds it while
#: the advisor is asked, so the runner adds ``advisor_timeout_seconds`` when an advisor is set.
DEFAULT_BUSY_TIMEOUT_SECONDS: Final = 10.0
#: The layout of the ``sessions`` table (``PRAGMA user_version``); a file with another is refused.
SCHEMA_VERSION: Final = 1
#: The transcript marks' table (added to files of schema version 1 when first needed).
_TRANSCRIPTS_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS transcripts ("
    " key TEXT PRIMARY KEY,"  # as in sessions
    " updated REAL NOT NULL,"  # seconds since the epoch, of the last write
    " mark BLOB NOT NULL)"  # hooks._transcript.Mark.to_bytes()
)
_APP_DIRECTORY: Final = "otel-loopguard"
_FILE_NAME: Final = "hooks.sqlite3"


class StoreError(Exception):
    """The state file cannot be used; the message names the file and what went wrong."""


class _CorruptFile(StoreError):
    """The state file is not a database, or a damaged one (moved aside and rebuilt once)."""


def _is_corrupt(exc: sqlite3.Error) -> bool:
    text = str(exc)
    return isinstance(exc, sqlite3.DatabaseError) and (
        "not a database" in text or "malformed" in text
    )


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


def default_store_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the hooks keep state when ``--store`` is not given (see :data:`STORE_ENV`).

    Raises :class:`StoreError` when there is no home directory to put it in.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(STORE_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    state_home = env.get("XDG_STATE_HOME", "").strip()
    if state_home and os.path.isabs(state_home):  # the XDG spec ignores relative paths
        return Path(state_home) / _APP_DIRECTORY / _FILE_NAME
    try:
        home = Path.home()
    except RuntimeError as exc:
        raise StoreError(
            f"no home directory for the default state file ({exc}); set {STORE_ENV} or pass --store"
        ) from None
    return home / ".local" / "state" / _APP_DIRECTORY / _FILE_NAME


class Row(Record):
    """One session's row, as read; set :attr:`save` to write a new state back."""

    __slots__ = (
        "state",
        "notes",
        "problems",
        "save",
        "related",
        "related_save",
        "transcript",
        "transcript_save",
    )

    #: The saved state bytes (``None`` for a session not seen before).
    state: bytes | None
    #: Reminders waiting for the result of their call: call reference -> text.
    notes: dict[str, str]
    #: What is wrong with the row as read (the session then starts afresh).
    problems: list[str]
    #: The state to store at the end of the transaction (``None``: leave the row as it is).
    save: bytes | None
    #: With ``related_prefix``: the other rows whose key starts with it, key -> state bytes.
    related: dict[str, bytes]
    #: New states for some of :attr:`related`, written at the end of the transaction.
    related_save: dict[str, bytes]
    #: With ``transcript=True``: where the session's transcript was last read (``None``: never).
    transcript: bytes | None
    #: The new transcript mark to store at the end of the transaction (``None``: leave it).
    transcript_save: bytes | None

    def __init__(
        self,
        state: bytes | None,
        notes: dict[str, str] | None = None,
        problems: list[str] | None = None,
        save: bytes | None = None,
        related: dict[str, bytes] | None = None,
        related_save: dict[str, bytes] | None = None,
        transcript: bytes | None = None,
        transcript_save: bytes | None = None,
    ) -> None:
        self.state = state
        self.notes = {} if notes is None else notes
        self.problems = [] if problems is None else problems
        self.save = save
        self.related = {} if related is None else related
        self.related_save = {} if related_save is None else related_save
        self.transcript = transcript
        self.transcript_save = transcript_save


class HookStore:
    """The sessions of command hooks in the SQLite file at ``path`` (created on first use,
    with its directory; readable by the owner only)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_seconds: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
    ) -> None:
        if not busy_timeout_seconds > 0:
            raise ValueError(
                f"busy_timeout_seconds: expected a number > 0, got {busy_timeout_seconds!r}"
            )
        self.path = Path(path)
        self.busy_timeout_seconds = busy_timeout_seconds

    @contextmanager
    def session(
        self,
        key: str,
        *,
        now: float,
        ttl_seconds: float,
        max_sessions: int,
        related_prefix: str | None = None,
        transcript: bool = False,
    ) -> Iterator[Row]:
        """One transaction on the row of ``key``: yields it as read; on a normal exit writes
        :attr:`Row.save` (if set) with ``now`` as its time, and commits. With
        ``related_prefix``, the other rows whose key starts with it (live ones: updated within
        ``ttl_seconds``) are read too (:attr:`Row.related`), and :attr:`Row.related_save`
        written. With ``transcript``, the session's transcript mark is read too
        (:attr:`Row.transcript`) and :attr:`Row.transcript_save` written (its own row, kept
        with or without a session row). An exception from the body rolls back and propagates; a
        problem with the file raises :class:`StoreError`."""
        connection, found = self._begin(key)
        try:
            row = _decode(found)
            if transcript:
                row.transcript = self._read_mark(connection, key)
            if related_prefix:
                try:
                    for other, state in connection.execute(
                        "SELECT key, state FROM sessions WHERE substr(key, 1, ?) = ?"
                        " AND key != ? AND updated > ?",
                        (len(related_prefix), related_prefix, key, now - ttl_seconds),
                    ):
                        if isinstance(state, (bytes, memoryview)):
                            row.related[str(other)] = bytes(state)
                except sqlite3.Error as exc:
                    raise self._error(exc) from None
            yield row
            try:
                for other, state in row.related_save.items():
                    connection.execute(
                        "UPDATE sessions SET state = ?, updated = ? WHERE key = ?",
                        (state, now, other),
                    )
                if row.transcript_save is not None:
                    if row.transcript is None:
                        self._make_room(
                            connection, now, ttl_seconds, max_sessions, table="transcripts"
                        )
                    connection.execute(
                        "INSERT OR REPLACE INTO transcripts (key, updated, mark) VALUES (?, ?, ?)",
                        (key, now, row.transcript_save),
                    )
                if row.save is not None:
                    if found is None:
                        self._make_room(connection, now, ttl_seconds, max_sessions)
                    connection.execute(
                        "INSERT OR REPLACE INTO sessions (key, updated, state, notes)"
                        " VALUES (?, ?, ?, ?)",
                        (key, now, row.save, orjson.dumps(row.notes) if row.notes else None),
                    )
                connection.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self._error(exc) from None
        finally:
            try:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # closing below discards the transaction anyway
            connection.close()

    def _begin(self, key: str) -> tuple[sqlite3.Connection, tuple[object, object] | None]:
        """Open the file, begin the transaction and read the row of ``key``; a corrupt file is
        moved aside and rebuilt once."""
        healed = False
        while True:
            identity = _identity(self.path)
            connection: sqlite3.Connection | None = None
            try:
                connection = self._connect()
                try:
                    connection.execute("BEGIN IMMEDIATE")
                    self._ensure_schema(connection)
                    connection.execute(MEMORY_TABLE)  # dead ends (issue 28): see _memory
                    found = connection.execute(
                        "SELECT state, notes FROM sessions WHERE key = ?", (key,)
                    ).fetchone()
                except sqlite3.Error as exc:
                    raise self._error(exc) from None
                return connection, found
            except _CorruptFile as exc:
                if connection is not None:
                    connection.close()
                if healed:
                    raise
                self._move_aside(identity, exc)
                healed = True
            except BaseException:
                if connection is not None:
                    connection.close()
                raise

    def _read_mark(self, connection: sqlite3.Connection, key: str) -> bytes | None:
        """The transcript mark of ``key``; the table is made first in a file that lacks it."""
        try:
            connection.execute(_TRANSCRIPTS_TABLE)
            found = connection.execute(
                "SELECT mark FROM transcripts WHERE key = ?", (key,)
            ).fetchone()
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        mark = None if found is None else found[0]
        return bytes(mark) if isinstance(mark, (bytes, memoryview)) else None

    def _move_aside(self, identity: tuple[int, int] | None, problem: StoreError) -> None:
        """Move the corrupt file (and its WAL files) aside, unless another hook process did
        already (the file at the path is then another one); one line on stderr."""
        path = self.path
        if identity is None or _identity(path) != identity:
            return
        try:
            aside = move_aside(path)
        except OSError as exc:
            raise StoreError(f"{problem}; could not move it aside: {exc.strerror or exc}") from None
        print(
            f"otel-loopguard: {problem}: moved it to {str(aside)!r} and started a new one"
            " (its sessions' counts are lost)",
            file=sys.stderr,
        )

    def _connect(self) -> sqlite3.Connection:
        path = self.path
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Created here rather than by SQLite so that it (and its -wal/-shm files, which
            # SQLite gives the same mode) is private: reminders quote call arguments.
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            connection = sqlite3.connect(
                path, timeout=self.busy_timeout_seconds, isolation_level=None
            )
        except OSError as exc:
            raise StoreError(f"state file {str(path)!r}: {exc.strerror or exc}") from None
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        try:
            if connection.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")  # durable in WAL but for power loss
        except sqlite3.Error as exc:
            connection.close()
            raise self._error(exc) from None
        return connection

    def _ensure_schema(self, connection: sqlite3.Connection) -> None:
        """Inside the transaction, so concurrent first uses create the table once."""
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version != 0:
            raise StoreError(
                f"state file {str(self.path)!r}: schema version {version}, this"
                f" otel-loopguard reads version {SCHEMA_VERSION}"
            )
        connection.execute(
            "CREATE TABLE IF NOT EXISTS sessions ("
            " key TEXT PRIMARY KEY,"
            " updated REAL NOT NULL,"  # seconds since the epoch, of the last write
            " state BLOB NOT NULL,"  # SessionState.to_bytes()
            " notes BLOB)"  # JSON object, call reference -> reminder text; NULL when none
        )
        connection.execute("CREATE INDEX IF NOT EXISTS sessions_by_updated ON sessions (updated)")
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @staticmethod
    def _make_room(
        connection: sqlite3.Connection,
        now: float,
        ttl_seconds: float,
        max_sessions: int,
        table: str = "sessions",
    ) -> None:
        """Before a new session is stored in ``table`` (``sessions`` or ``transcripts``): drop
        idle rows, and the oldest beyond the bound."""
        connection.execute(f"DELETE FROM {table} WHERE updated <= ?", (now - ttl_seconds,))
        connection.execute(
            f"DELETE FROM {table} WHERE key IN (SELECT key FROM {table}"
            " ORDER BY updated DESC LIMIT -1 OFFSET ?)",
            (max(0, max_sessions - 1),),
        )

    def _error(self, exc: sqlite3.Error) -> StoreError:
        kind = _CorruptFile if _is_corrupt(exc) else StoreError
        return kind(f"state file {str(self.path)!r}: {exc}")


def _decode(found: tuple[object, object] | None) -> Row:
    if found is None:
        return Row(None)
    state, notes = found
    row = Row(bytes(state) if isinstance(state, (bytes, memoryview)) else None)
    if row.state is None:
        row.problems.append(f"state is {type(state).__name__}, not bytes")
    if notes is not None:
        try:
            parsed = orjson.loads(notes) if isinstance(notes, (bytes, str)) else None
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict) and all(isinstance(v, str) for v in parsed.values()):
            row.notes = parsed
        else:
            row.problems.append("reminder notes are unreadable")
    return row
