"""Dead ends in a JSON file (:class:`FileMemory`): bounded, read again when another process
changed it, a damaged one moved aside and rebuilt. Imported when such a memory is opened."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Final

from ._memory_records import (
    FORMAT_VERSION,
    MAX_FILE_BYTES,
    DeadEnd,
    Notes,
    bounded,
    merge,
    move_memory_aside,
)
from .config import Policy

__all__ = ["FileMemory"]

#: Seconds between two looks at whether another process changed a memory file.
RELOAD_SECONDS: Final = 1.0


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
        self._notes = Notes()

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
        if self._entries is not None and now - self._looked < RELOAD_SECONDS:
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
            move_memory_aside(path, f"{stamp[1]} bytes, over {MAX_FILE_BYTES}", self._notes)
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
            move_memory_aside(path, f"not a memory file ({exc})", self._notes)
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
            move_memory_aside(path, f"damaged ({exc})", self._notes)
            return []

    # -- writing --------------------------------------------------------------------------

    def _write(self, entries: dict[tuple[str, str, str], DeadEnd]) -> None:
        """Under the lock: every entry, bounded, written atomically."""
        kept = bounded(entries.values(), self.policy, time.time())
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
                entries[entry.ident] = merge(entries.get(entry.ident), entry)
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
