"""Dead ends in the ``memory`` table of a SQLite file (:class:`SqliteMemory`): the command
hooks' state file. Imported when such a memory is opened (and by the hooks' store, for the
table)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ._memory_records import (
    DEFERRED,
    MAX_SCOPES,
    DeadEnd,
    Notes,
    merge,
    move_memory_aside,
)
from .config import Policy

if TYPE_CHECKING:
    import sqlite3

__all__ = ["MEMORY_TABLE", "SqliteMemory"]


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
        self._notes = Notes()
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
                move_memory_aside(path, str(exc), self._notes)
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
                self._waiting[entry.ident] = merge(self._waiting.get(entry.ident), entry)
            if not DEFERRED[0]:
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
                merged = merge(old, entry)
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
