"""Dead ends remembered across runs (issue 28): the second time, the guard knows.

When a loop is denied or stopped, its fingerprint is recorded (:class:`DeadEnd`): the tool, the
args key (the hash of tool and canonical arguments), the outcome key (the hash of the result or
error, its volatile parts removed as the failure rule removes them; ``None`` when the host
reports none), the rule, how many attempts, when, how many runs ended in it, and the scope. In a
later run of the same scope, the first repeat of that call with that outcome is reminded at once
with the history (:class:`Recalled`); the ladder's later steps come at their usual counts.

Scopes (the policy's ``memory_scope``, :func:`scope_of`): ``repository:<git root or working
directory>``, ``agent:<name>``, ``global``. Only hashes, the tool name and, with
``memory_arguments``, the canonical arguments cut to ``arguments_preview_chars`` are stored.

Where (:func:`open_memory`, from the policy's ``memory``): a JSON file (:class:`FileMemory`), a
table in a SQLite file (:class:`SqliteMemory`; the command hooks' state file), or Redis
(:class:`RedisMemory`, the client imported only then). Each is bounded: ``memory_max_entries``
per scope (the least recently recorded dropped first), ``memory_max_age_seconds`` since an
entry's last run, :data:`MAX_SCOPES` scopes in a file. A file that is damaged or over
:data:`MAX_FILE_BYTES` is moved aside (``<file>.corrupt-<UTC time>``) and rebuilt; one written by
another version is left as it is; either way, and when a store cannot be written, one warning is
logged and the guard goes on without (that part of) memory. Nothing here raises into the
application: every public method of a store catches what its medium raises.

Standard library only (``redis`` imported when a Redis memory is built): the command hooks start
a process per tool call.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from ._defaults import STORE_SCHEMES, MemoryScope, redact_url
from .config import Policy

if TYPE_CHECKING:
    import sqlite3

__all__ = [
    "FORMAT_VERSION",
    "MAX_FILE_BYTES",
    "MAX_SCOPES",
    "MAX_SCOPE_CHARS",
    "MEMORY_FILE_NAME",
    "MEMORY_TABLE",
    "DeadEnd",
    "FileMemory",
    "Memory",
    "Recalled",
    "RedisMemory",
    "SqliteMemory",
    "defer_writes",
    "flush_memories",
    "memory_location",
    "open_memory",
    "recalled",
    "repository_root",
    "repository_scope",
    "scope_of",
]

_log = logging.getLogger("otel_loopguard")

#: The layout of a record (``"v"`` in each); records of another version are not read.
FORMAT_VERSION: Final = 1
#: A memory file larger than this is not read (moved aside and rebuilt).
MAX_FILE_BYTES: Final = 8 * 1024 * 1024
#: Scopes kept in one memory file (the one recorded in longest ago dropped first).
MAX_SCOPES: Final = 256
#: Characters of a scope kept (a longer working directory or agent name is cut).
MAX_SCOPE_CHARS: Final = 512
#: Characters of a tool name kept in a record.
_MAX_TOOL_CHARS: Final = 256
#: Suffixes of a memory path kept in SQLite (else JSON).
SQLITE_SUFFIXES: Final = (".sqlite3", ".sqlite", ".db")
#: Seconds between two looks at whether another process changed a memory file.
_RELOAD_SECONDS: Final = 1.0
#: The hooks' and ``serve --state-dir``'s memory file name in a directory of their own.
MEMORY_FILE_NAME: Final = "memory.json"


class DeadEnd:
    """One remembered dead end: ``key`` (args key) with ``outcome`` (outcome key, ``None`` when
    the host reports no result) in ``scope``. ``count``: attempts in the last run that ended in
    it; ``runs``: runs that ended in it; ``first``/``last``: when (seconds since the epoch);
    ``run``: a hash of the last such run's session (so a run is counted once).

    A plain class, not a dataclass: building one costs the command hooks' import a millisecond.
    """

    __slots__ = (
        "arguments",
        "count",
        "first",
        "key",
        "last",
        "outcome",
        "rule",
        "run",
        "runs",
        "scope",
        "tool",
    )

    def __init__(
        self,
        scope: str,
        key: str,
        outcome: str | None,
        tool: str,
        rule: str,
        count: int,
        runs: int,
        first: float,
        last: float,
        run: str = "",
        arguments: str | None = None,
    ) -> None:
        self.scope = scope
        self.key = key
        self.outcome = outcome
        self.tool = tool
        self.rule = rule
        self.count = count
        self.runs = runs
        self.first = first
        self.last = last
        self.run = run
        self.arguments = arguments

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeadEnd) and self.to_plain() == other.to_plain()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return f"DeadEnd({self.to_plain()!r})"

    @property
    def ident(self) -> tuple[str, str, str]:
        return (self.scope, self.key, self.outcome or "")

    def to_plain(self) -> dict[str, Any]:
        plain: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "scope": self.scope,
            "key": self.key,
            "outcome": self.outcome,
            "tool": self.tool,
            "rule": self.rule,
            "count": self.count,
            "runs": self.runs,
            "first": self.first,
            "last": self.last,
            "run": self.run,
        }
        if self.arguments is not None:
            plain["arguments"] = self.arguments
        return plain

    @classmethod
    def from_plain(cls, raw: object) -> DeadEnd:
        """A record :meth:`to_plain` wrote; ``ValueError`` naming what is wrong."""
        if not isinstance(raw, dict):
            raise ValueError("a record is not an object")
        if raw.get("v") != FORMAT_VERSION:
            raise ValueError(f"a record of version {raw.get('v')!r}")

        def text(name: str, optional: bool = False) -> Any:
            value = raw.get(name)
            if (value is None and optional) or isinstance(value, str):
                return value
            raise ValueError(f"record field {name!r}: {value!r}")

        def number(name: str) -> Any:
            value = raw.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                return value
            raise ValueError(f"record field {name!r}: {value!r}")

        return cls(
            text("scope"),
            text("key"),
            text("outcome", True),
            text("tool"),
            text("rule"),
            int(number("count")),
            max(1, int(number("runs"))),
            float(number("first")),
            float(number("last")),
            text("run"),
            text("arguments", True),
        )


class Recalled:
    """What memory knows of a call, as a reminder says it: ``runs`` earlier runs ended in it,
    the last at ``last`` (seconds since the epoch), after ``attempts`` attempts; ``failed``:
    the outcome is a failure (as the call's latest run in this run reported it)."""

    __slots__ = ("attempts", "failed", "last", "runs")

    def __init__(self, runs: int, last: float, attempts: int, failed: bool = False) -> None:
        self.runs = runs
        self.last = last
        self.attempts = attempts
        self.failed = failed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Recalled) and (
            self.runs,
            self.last,
            self.attempts,
            self.failed,
        ) == (other.runs, other.last, other.attempts, other.failed)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Recalled({self.runs}, {self.last}, {self.attempts}, {self.failed})"


def recalled(entries: Iterable[DeadEnd], outcome: str | None, run: str = "") -> Recalled | None:
    """The history of the entries of one call whose outcome is ``outcome``, without the run
    ``run`` (the one asking: its own dead end is no earlier run's); ``None`` if none."""
    found = [entry for entry in entries if entry.outcome == outcome]
    runs = sum(entry.runs - (1 if run and entry.run == run else 0) for entry in found)
    if runs <= 0:
        return None
    latest = max(found, key=lambda entry: entry.last)
    return Recalled(runs, latest.last, latest.count)


def repository_root(directory: str | os.PathLike[str]) -> str:
    """The git root above ``directory`` (the first directory holding ``.git``, a directory or a
    worktree's file), else ``directory`` itself, absolute. Reads no file, runs no program."""
    start = Path(os.path.abspath(directory))
    for candidate in (start, *start.parents):
        if (candidate / ".git").exists():
            return str(candidate)
    return str(start)


def scope_of(policy: Policy, *, directory: str | None = None, agent: str | None = None) -> str:
    """The scope a run belongs to under ``policy.memory_scope``: ``repository:<root>`` (the git
    root of ``directory``, default the working directory), ``agent:<name>`` or ``global``."""
    scope = policy.memory_scope
    if scope is MemoryScope.GLOBAL:
        return "global"
    if scope is MemoryScope.AGENT:
        return f"agent:{agent or ''}"[:MAX_SCOPE_CHARS]
    try:
        root = repository_root(directory if directory is not None else os.getcwd())
    except OSError:
        root = directory or ""
    return repository_scope(root)


def repository_scope(root: str) -> str:
    """The scope of the runs of the repository at ``root`` (its git root)."""
    return f"repository:{root}"[:MAX_SCOPE_CHARS]


class Memory(Protocol):
    """Where dead ends are kept. No method raises: a medium's failure is logged once and the
    guard goes on as if the entry were not there."""

    where: str

    def recall(self, scope: str, key: str) -> list[DeadEnd]:
        """The entries of the call ``key`` in ``scope`` (any outcome)."""
        ...

    def record(self, entry: DeadEnd) -> None:
        """Add ``entry``, or update the one with its identity (a new run counts once more)."""
        ...

    def entries(self, scope: str | None = None) -> list[DeadEnd]:
        """Every entry of ``scope`` (every scope's with ``None``), most recent first."""
        ...

    def forget(self, scope: str | None, key_prefix: str) -> int:
        """Drop the entries whose args key starts with ``key_prefix``; how many."""
        ...

    def clear(self, scope: str | None = None) -> int:
        """Drop every entry of ``scope`` (of every scope with ``None``); how many."""
        ...

    def count(self) -> int:
        """How many entries are kept (``loopguard_memory_entries``)."""
        ...

    def flush(self) -> None:
        """Write what could not be written yet (a busy SQLite file)."""
        ...


def _merge(old: DeadEnd | None, new: DeadEnd) -> DeadEnd:
    """``new`` recorded over ``old`` (same identity): one run more when it is another run."""
    if old is None:
        return new
    runs = old.runs + (0 if old.run == new.run else new.runs)
    return DeadEnd(
        new.scope,
        new.key,
        new.outcome,
        new.tool,
        new.rule,
        max(new.count, old.count) if old.run == new.run else new.count,
        runs,
        min(old.first, new.first),
        max(old.last, new.last),
        new.run,
        new.arguments if new.arguments is not None else old.arguments,
    )


def _bounded(entries: Iterable[DeadEnd], policy: Policy, now: float) -> list[DeadEnd]:
    """``entries`` within the bounds: none older than ``memory_max_age_seconds``, at most
    ``memory_max_entries`` per scope and :data:`MAX_SCOPES` scopes, the most recent kept;
    most recent first."""
    oldest = now - policy.memory_max_age_seconds
    per_scope: dict[str, int] = {}
    kept: list[DeadEnd] = []
    for entry in sorted(entries, key=lambda e: e.last, reverse=True):
        if entry.last < oldest:
            continue
        seen = per_scope.get(entry.scope, 0)
        if seen >= policy.memory_max_entries:
            continue
        if seen == 0 and len(per_scope) >= MAX_SCOPES:
            continue
        per_scope[entry.scope] = seen + 1
        kept.append(entry)
    return kept


class _Notes:
    """One warning per kind of problem per store (a note, never an exception)."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def once(self, kind: str, message: str, *args: object) -> None:
        if kind not in self._said:
            self._said.add(kind)
            _log.warning("memory: " + message, *args)


def _move_aside(path: Path, problem: str, notes: _Notes) -> None:
    """Move a damaged memory file aside (``<file>.corrupt-<UTC time>``), with a note."""
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    try:
        os.replace(path, aside)
        for suffix in ("-wal", "-shm"):
            try:
                os.replace(f"{path}{suffix}", f"{aside}{suffix}")
            except FileNotFoundError:
                pass
    except OSError as exc:
        notes.once(
            "aside",
            "%s: %s; could not move it aside (%s): going on without memory",
            path,
            problem,
            exc.strerror or exc,
        )
        return
    notes.once(
        "aside",
        "%s: %s: moved it to %s and started a new one (what it remembered is lost)",
        path,
        problem,
        aside,
    )


class FileMemory:
    """Dead ends in one JSON file (``{"v": 1, "entries": [...]}``), for an in-process guard
    (``memory = "path"``) and ``serve --state-dir``. Read when first needed and again when the
    file changed (looked at no more than once a second); written whole, atomically (a new file
    renamed over the old), private to the owner. Thread-safe."""

    def __init__(self, path: str | os.PathLike[str], policy: Policy) -> None:
        self.path = Path(path).expanduser()
        self.where = str(self.path)
        self.policy = policy
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str], DeadEnd] | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._looked = 0.0
        self._broken = False  # another version's file: left alone, memory off
        self._notes = _Notes()

    # -- reading --------------------------------------------------------------------------

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return (stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def _loaded(self) -> dict[tuple[str, str, str], DeadEnd]:
        """Under the lock: the entries, read again when the file changed."""
        now = time.monotonic()
        if self._entries is not None and now - self._looked < _RELOAD_SECONDS:
            return self._entries
        self._looked = now
        stamp = self._file_stamp()
        if self._entries is not None and stamp == self._stamp:
            return self._entries
        self._stamp = stamp
        self._entries = {entry.ident: entry for entry in self._read(stamp)}
        return self._entries

    def _read(self, stamp: tuple[int, int, int] | None) -> list[DeadEnd]:
        if stamp is None:
            return []
        path = self.path
        if stamp[1] > MAX_FILE_BYTES:
            _move_aside(path, f"{stamp[1]} bytes, over {MAX_FILE_BYTES}", self._notes)
            return []
        try:
            raw = json.loads(path.read_bytes())
        except OSError as exc:
            self._notes.once(
                "read",
                "%s: cannot read it (%s): going on without memory",
                path,
                exc.strerror or exc,
            )
            return []
        except ValueError as exc:  # not JSON, or not UTF-8
            _move_aside(path, f"not a memory file ({exc})", self._notes)
            return []
        if isinstance(raw, dict) and raw.get("v") != FORMAT_VERSION and "entries" in raw:
            self._broken = True
            self._notes.once(
                "version",
                "%s: written by another version (format %r, this one"
                " reads %d): left as it is, going on without memory",
                path,
                raw.get("v"),
                FORMAT_VERSION,
            )
            return []
        try:
            if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list):
                raise ValueError("no list of entries")
            return [DeadEnd.from_plain(item) for item in raw["entries"]]
        except ValueError as exc:
            _move_aside(path, f"damaged ({exc})", self._notes)
            return []

    # -- writing --------------------------------------------------------------------------

    def _write(self, entries: dict[tuple[str, str, str], DeadEnd]) -> None:
        """Under the lock: every entry, bounded, written atomically."""
        kept = _bounded(entries.values(), self.policy, time.time())
        self._entries = {entry.ident: entry for entry in kept}
        if self._broken:
            return
        data = json.dumps(
            {"v": FORMAT_VERSION, "entries": [entry.to_plain() for entry in kept]},
            separators=(",", ":"),
        ).encode()
        path = self.path
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(data)
            os.replace(temporary, path)
        except OSError as exc:
            self._notes.once(
                "write",
                "%s: cannot write it (%s): what this process learns is kept in memory only",
                path,
                exc.strerror or exc,
            )
            try:
                temporary.unlink()
            except OSError:
                pass
            return
        self._stamp = self._file_stamp()

    # -- the store ------------------------------------------------------------------------

    def recall(self, scope: str, key: str) -> list[DeadEnd]:
        try:
            with self._lock:
                return [e for e in self._loaded().values() if e.key == key and e.scope == scope]
        except Exception as exc:  # never into the application
            self._notes.once("recall", "%s: %r", self.path, exc)
            return []

    def record(self, entry: DeadEnd) -> None:
        try:
            with self._lock:
                self._looked = 0.0  # read what other processes wrote before writing over it
                entries = dict(self._loaded())
                entries[entry.ident] = _merge(entries.get(entry.ident), entry)
                self._write(entries)
        except Exception as exc:
            self._notes.once("record", "%s: %r", self.path, exc)

    def entries(self, scope: str | None = None) -> list[DeadEnd]:
        with self._lock:
            self._looked = 0.0
            found = [e for e in self._loaded().values() if scope is None or e.scope == scope]
        return sorted(found, key=lambda e: e.last, reverse=True)

    def _drop(self, keep: Any) -> int:
        with self._lock:
            self._looked = 0.0
            entries = self._loaded()
            kept = {ident: e for ident, e in entries.items() if keep(e)}
            dropped = len(entries) - len(kept)
            if dropped:
                self._write(kept)
            return dropped

    def forget(self, scope: str | None, key_prefix: str) -> int:
        return self._drop(
            lambda e: not (e.key.startswith(key_prefix) and (scope is None or e.scope == scope))
        )

    def clear(self, scope: str | None = None) -> int:
        return self._drop(lambda e: scope is not None and e.scope != scope)

    def count(self) -> int:
        try:
            with self._lock:
                return len(self._loaded())
        except Exception:  # read at a scrape: never an error there
            return 0

    def flush(self) -> None:
        return None


#: The ``memory`` table of a SQLite memory (the command hooks' state file creates it too, in its
#: own transaction, so that a read during a hook's transaction never waits to create it).
MEMORY_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS memory ("
    " scope TEXT NOT NULL,"
    " key TEXT NOT NULL,"
    " outcome TEXT NOT NULL,"  # '' when unknown
    " last REAL NOT NULL,"  # seconds since the epoch: the bounds read it
    " entry BLOB NOT NULL,"  # DeadEnd.to_plain() as JSON
    " PRIMARY KEY (scope, key, outcome))"
)


class SqliteMemory:
    """Dead ends in the ``memory`` table of a SQLite file: the command hooks' state file (a
    process per tool call, so the table is read per repeat, never loaded whole). A write the
    file is too busy for (the hook's own transaction holds it) waits in this process until
    :meth:`flush` (:func:`flush_memories`; the hook runner calls it after its transaction)."""

    def __init__(self, path: str | os.PathLike[str], policy: Policy) -> None:
        self.path = Path(path).expanduser()
        self.where = str(self.path)
        self.policy = policy
        self._lock = threading.Lock()
        self._waiting: dict[tuple[str, str, str], DeadEnd] = {}
        self._notes = _Notes()
        self._off = False

    def _connect(self, timeout: float) -> sqlite3.Connection | None:
        import sqlite3  # here: only a SQLite memory needs it

        if self._off:
            return None
        path = self.path
        try:
            if path.exists() and path.stat().st_size > 0:
                with path.open("rb") as handle:
                    if handle.read(16) != b"SQLite format 3\x00":
                        raise sqlite3.DatabaseError("file is not a database")
            else:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            connection = sqlite3.connect(path, timeout=timeout, isolation_level=None)
            connection.execute(MEMORY_TABLE)
            return connection
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc) or "malformed" in str(exc):
                _move_aside(path, str(exc), self._notes)
            else:
                self._notes.once("open", "%s: %s: going on without memory", path, exc)
            return None
        except OSError as exc:
            self._notes.once("open", "%s: %s: going on without memory", path, exc.strerror or exc)
            self._off = True
            return None

    def _rows(self, sql: str, args: Sequence[object]) -> list[DeadEnd]:
        import sqlite3  # here: only a SQLite memory needs it

        connection = self._connect(1.0)
        if connection is None:
            return []
        try:
            found = []
            for (blob,) in connection.execute(sql, args):
                try:
                    found.append(DeadEnd.from_plain(json.loads(blob)))
                except ValueError as exc:
                    self._notes.once("entry", "%s: an entry is skipped (%s)", self.path, exc)
            return found
        except sqlite3.Error as exc:
            self._notes.once("read", "%s: %s: going on without memory", self.path, exc)
            return []
        finally:
            connection.close()

    def recall(self, scope: str, key: str) -> list[DeadEnd]:
        try:
            found = self._rows(
                "SELECT entry FROM memory WHERE scope = ? AND key = ? AND last > ?",
                (scope, key, time.time() - self.policy.memory_max_age_seconds),
            )
            with self._lock:
                waiting = [e for e in self._waiting.values() if e.scope == scope and e.key == key]
            return found + waiting
        except Exception as exc:
            self._notes.once("recall", "%s: %r", self.path, exc)
            return []

    def record(self, entry: DeadEnd) -> None:
        try:
            with self._lock:
                self._waiting[entry.ident] = _merge(self._waiting.get(entry.ident), entry)
            if not _DEFERRED[0]:
                self._write(0.05)
        except Exception as exc:
            self._notes.once("record", "%s: %r", self.path, exc)

    def flush(self) -> None:
        try:
            self._write(2.0)
        except Exception as exc:
            self._notes.once("record", "%s: %r", self.path, exc)

    def _write(self, timeout: float) -> None:
        import sqlite3  # here: only a SQLite memory needs it

        with self._lock:
            waiting = list(self._waiting.values())
        if not waiting:
            return
        connection = self._connect(timeout)
        if connection is None:
            return
        policy = self.policy
        try:
            connection.execute("BEGIN IMMEDIATE")
            for entry in waiting:
                row = connection.execute(
                    "SELECT entry FROM memory WHERE scope = ? AND key = ? AND outcome = ?",
                    entry.ident,
                ).fetchone()
                old = None
                if row is not None:
                    try:
                        old = DeadEnd.from_plain(json.loads(row[0]))
                    except ValueError:
                        old = None
                merged = _merge(old, entry)
                connection.execute(
                    "INSERT OR REPLACE INTO memory (scope, key, outcome, last, entry)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (*merged.ident, merged.last, json.dumps(merged.to_plain())),
                )
                connection.execute(
                    "DELETE FROM memory WHERE scope = ? AND (last <= ? OR rowid IN (SELECT rowid"
                    " FROM memory WHERE scope = ? ORDER BY last DESC LIMIT -1 OFFSET ?))",
                    (
                        entry.scope,
                        time.time() - policy.memory_max_age_seconds,
                        entry.scope,
                        policy.memory_max_entries,
                    ),
                )
            # Every scope together: MAX_SCOPES scopes' worth, the least recently recorded dropped.
            connection.execute(
                "DELETE FROM memory WHERE rowid IN (SELECT rowid FROM memory"
                " ORDER BY last DESC LIMIT -1 OFFSET ?)",
                (policy.memory_max_entries * MAX_SCOPES,),
            )
            connection.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                self._notes.once(
                    "write", "%s: %s: what this process learns is not kept", self.path, exc
                )
                with self._lock:
                    self._waiting.clear()
            return  # busy: kept waiting for flush()
        except sqlite3.Error as exc:
            self._notes.once(
                "write", "%s: %s: what this process learns is not kept", self.path, exc
            )
            with self._lock:
                self._waiting.clear()
            return
        finally:
            if connection.in_transaction:
                try:
                    connection.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            connection.close()
        with self._lock:
            for entry in waiting:
                if self._waiting.get(entry.ident) is entry:
                    del self._waiting[entry.ident]

    def entries(self, scope: str | None = None) -> list[DeadEnd]:
        self.flush()  # what this process recorded, first
        if scope is None:
            found = self._rows("SELECT entry FROM memory", ())
        else:
            found = self._rows("SELECT entry FROM memory WHERE scope = ?", (scope,))
        return sorted(found, key=lambda e: e.last, reverse=True)

    def _delete(self, sql: str, args: Sequence[object]) -> int:
        import sqlite3  # here: only a SQLite memory needs it

        connection = self._connect(5.0)
        if connection is None:
            return 0
        try:
            return connection.execute(sql, args).rowcount
        except sqlite3.Error as exc:
            self._notes.once("write", "%s: %s", self.path, exc)
            return 0
        finally:
            connection.close()

    def forget(self, scope: str | None, key_prefix: str) -> int:
        self.flush()
        if scope is None:
            return self._delete(
                "DELETE FROM memory WHERE substr(key, 1, ?) = ?", (len(key_prefix), key_prefix)
            )
        return self._delete(
            "DELETE FROM memory WHERE scope = ? AND substr(key, 1, ?) = ?",
            (scope, len(key_prefix), key_prefix),
        )

    def clear(self, scope: str | None = None) -> int:
        self.flush()
        if scope is None:
            return self._delete("DELETE FROM memory", ())
        return self._delete("DELETE FROM memory WHERE scope = ?", (scope,))

    def count(self) -> int:
        import sqlite3

        connection = self._connect(1.0)
        if connection is None:
            return 0
        try:
            return int(connection.execute("SELECT count(*) FROM memory").fetchone()[0])
        except sqlite3.Error:
            return 0
        finally:
            connection.close()


class RedisMemory:
    """Dead ends in Redis, shared by every process that uses it: one hash per scope
    (``<store_prefix>memory:<scope>``, field ``<args key>|<outcome key>``, each write renewing
    its TTL to ``memory_max_age_seconds``) and a set of the scopes. A Redis that fails is
    logged once and answered as "nothing remembered"."""

    def __init__(self, url: str, policy: Policy) -> None:
        try:
            import redis
        except ImportError:
            raise ValueError(
                f"memory: {redact_url(url)!r} needs the Redis client:"
                " pip install 'otel-loopguard[redis]'"
            ) from None
        timeout = policy.store_timeout_seconds
        options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        if url == policy.store and policy.store_password_file:
            try:
                lines = Path(policy.store_password_file).expanduser().read_text().splitlines()
            except OSError as exc:
                raise ValueError(f"store_password_file: cannot read it: {exc}") from None
            if lines and lines[0]:
                options["password"] = lines[0]
        try:
            self.client: Any = redis.Redis.from_url(url, **options)
        except ValueError as exc:
            raise ValueError(f"memory: {redact_url(url)!r} is not a Redis URL: {exc}") from None
        self.where = redact_url(url)
        self.policy = policy
        self.prefix = f"{policy.store_prefix}memory:"
        self._notes = _Notes()

    def _hash(self, scope: str) -> str:
        return f"{self.prefix}{scope}"

    def _read(self, scope: str) -> list[DeadEnd]:
        found = []
        for blob in self.client.hvals(self._hash(scope)):
            try:
                found.append(DeadEnd.from_plain(json.loads(blob)))
            except ValueError as exc:
                self._notes.once("entry", "%s: an entry is skipped (%s)", self.where, exc)
        return found

    def recall(self, scope: str, key: str) -> list[DeadEnd]:
        try:
            return [e for e in self._read(scope) if e.key == key]
        except Exception as exc:
            self._notes.once("redis", "%s: %r: going on without memory", self.where, exc)
            return []

    def record(self, entry: DeadEnd) -> None:
        try:
            name = self._hash(entry.scope)
            field = f"{entry.key}|{entry.outcome or ''}"
            old_blob = self.client.hget(name, field)
            old = None
            if old_blob is not None:
                try:
                    old = DeadEnd.from_plain(json.loads(old_blob))
                except ValueError:
                    old = None
            merged = _merge(old, entry)
            ttl = max(1, int(self.policy.memory_max_age_seconds))
            pipe = self.client.pipeline()
            pipe.hset(name, field, json.dumps(merged.to_plain()))
            pipe.expire(name, ttl)
            pipe.sadd(f"{self.prefix}scopes", entry.scope)
            pipe.expire(f"{self.prefix}scopes", ttl)
            pipe.execute()
            if self.client.hlen(name) > self.policy.memory_max_entries:
                kept = {
                    f"{e.key}|{e.outcome or ''}"
                    for e in _bounded(self._read(entry.scope), self.policy, time.time())
                }
                stale = [f.decode() if isinstance(f, bytes) else f for f in self.client.hkeys(name)]
                drop = [f for f in stale if f not in kept]
                if drop:
                    self.client.hdel(name, *drop)
        except Exception as exc:
            self._notes.once("redis", "%s: %r: going on without memory", self.where, exc)

    def _scopes(self) -> list[str]:
        members = self.client.smembers(f"{self.prefix}scopes")
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)

    def entries(self, scope: str | None = None) -> list[DeadEnd]:
        scopes = [scope] if scope is not None else self._scopes()
        found = [entry for name in scopes for entry in self._read(name)]
        oldest = time.time() - self.policy.memory_max_age_seconds
        return sorted((e for e in found if e.last > oldest), key=lambda e: e.last, reverse=True)

    def forget(self, scope: str | None, key_prefix: str) -> int:
        dropped = 0
        for entry in self.entries(scope):
            if entry.key.startswith(key_prefix):
                dropped += int(
                    self.client.hdel(self._hash(entry.scope), f"{entry.key}|{entry.outcome or ''}")
                )
        return dropped

    def clear(self, scope: str | None = None) -> int:
        scopes = [scope] if scope is not None else self._scopes()
        dropped = 0
        for name in scopes:
            dropped += int(self.client.hlen(self._hash(name)))
            self.client.delete(self._hash(name))
        if scope is None:
            self.client.delete(f"{self.prefix}scopes")
        return dropped

    def count(self) -> int:
        try:
            return sum(int(self.client.hlen(self._hash(name))) for name in self._scopes())
        except Exception:
            return 0

    def flush(self) -> None:
        return None


#: Set by an entrance that holds the SQLite file while the guard decides (the command hooks'
#: transaction): a record then waits for :func:`flush_memories` instead of for the file.
_DEFERRED: list[bool] = [False]


def defer_writes() -> None:
    """From now on in this process, SQLite memories write only when flushed."""
    _DEFERRED[0] = True


#: The memories this process opened, by where they are: guards on one place share one store
#: (the hook runner builds two guards per call; its writes are flushed once, after them).
_OPEN: dict[tuple[object, ...], Memory] = {}
_OPEN_LOCK = threading.Lock()


def memory_location(policy: Policy, *, default: str | None = None) -> str | None:
    """Where ``policy`` keeps dead ends: its ``memory`` path or URL; with ``memory = true`` the
    entrance's ``default`` (the hooks' state file, ``serve``'s state directory's file, a shared
    Redis store's URL), else nowhere (``None``; an in-process guard's default)."""
    memory = policy.memory
    if memory is False:
        return None
    if memory is True:
        return default
    return str(memory)


def open_memory(policy: Policy, *, default: str | None = None) -> Memory | None:
    """The store of :func:`memory_location` (``None`` when memory is off). A Redis URL whose
    client is not installed raises ``ValueError`` (configuration); nothing else raises."""
    where = memory_location(policy, default=default)
    if where is None:
        return None
    ident = (
        where,
        policy.store_prefix,
        policy.memory_max_entries,
        policy.memory_max_age_seconds,
        policy.store_timeout_seconds,
    )
    with _OPEN_LOCK:
        found = _OPEN.get(ident)
        if found is not None:
            return found
        memory: Memory
        if where.partition("://")[0].lower() in STORE_SCHEMES and "://" in where:
            memory = RedisMemory(where, policy)
        elif where.lower().endswith(SQLITE_SUFFIXES):
            memory = SqliteMemory(where, policy)
        else:
            memory = FileMemory(where, policy)
        if len(_OPEN) >= 64:
            _OPEN.pop(next(iter(_OPEN)))
        _OPEN[ident] = memory
        return memory


def flush_memories() -> None:
    """Write what every memory of this process still holds (a busy SQLite file's records)."""
    with _OPEN_LOCK:
        memories = list(_OPEN.values())
    for memory in memories:
        memory.flush()
