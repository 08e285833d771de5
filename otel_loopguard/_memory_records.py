"""Dead ends remembered across runs: the records and what every store shares.

:class:`DeadEnd` (a loop's fingerprint), :class:`Recalled` (what a later run is reminded of),
the scopes (:func:`scope_of`), the :class:`Memory` protocol, and the bounds, merging, notes and
moving aside of a damaged file that the stores (:mod:`._memory_file`, :mod:`._memory_sqlite`,
:mod:`._memory_redis`) share. :mod:`._memory` opens a store. Standard library only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, Protocol

from ._defaults import MemoryScope
from ._lazy import logger
from .config import Policy

__all__ = [
    "DEFERRED",
    "FORMAT_VERSION",
    "MAX_FILE_BYTES",
    "MAX_SCOPES",
    "MAX_SCOPE_CHARS",
    "MEMORY_FILE_NAME",
    "SQLITE_SUFFIXES",
    "DeadEnd",
    "Memory",
    "Notes",
    "Recalled",
    "bounded",
    "merge",
    "move_aside",
    "move_memory_aside",
    "recalled",
    "repository_root",
    "repository_scope",
    "scope_of",
]


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
RELOAD_SECONDS: Final = 1.0
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


def merge(old: DeadEnd | None, new: DeadEnd) -> DeadEnd:
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


def bounded(entries: Iterable[DeadEnd], policy: Policy, now: float) -> list[DeadEnd]:
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


class Notes:
    """One warning per kind of problem per store (a note, never an exception)."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def once(self, kind: str, message: str, *args: object) -> None:
        if kind not in self._said:
            self._said.add(kind)
            logger().warning("memory: " + message, *args)


def move_aside(path: Path) -> Path:
    """Move a damaged file and its SQLite ``-wal``/``-shm`` files aside, to
    ``<file>.corrupt-<UTC time>`` (and its own ``-wal``/``-shm``); return where it went. Raises
    ``OSError`` when the file itself cannot be moved. A memory file and the hooks' state file
    (:mod:`otel_loopguard.hooks._store`) are moved aside alike."""
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    os.replace(path, aside)
    for suffix in ("-wal", "-shm"):
        try:
            os.replace(f"{path}{suffix}", f"{aside}{suffix}")
        except FileNotFoundError:
            pass
    return aside


def move_memory_aside(path: Path, problem: str, notes: Notes) -> None:
    """Move a damaged memory file aside (:func:`move_aside`), with a note."""
    try:
        aside = move_aside(path)
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


#: Set by an entrance that holds the SQLite file while the guard decides (the command hooks'
#: transaction): a record then waits for :func:`flush_memories` instead of for the file.
DEFERRED: list[bool] = [False]
