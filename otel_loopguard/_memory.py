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

The records and what the stores share are in :mod:`._memory_records`; each store is a module of
its own (:mod:`._memory_file`, :mod:`._memory_sqlite`, :mod:`._memory_redis`), imported when
:func:`open_memory` opens one (their names here are looked up on first use). Standard library
only (``redis`` imported when a Redis memory is built): the command hooks start a process per
tool call.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ._defaults import STORE_SCHEMES
from ._lazy import lazy_names
from ._memory_records import (
    DEFERRED,
    FORMAT_VERSION,
    MAX_FILE_BYTES,
    MAX_SCOPE_CHARS,
    MAX_SCOPES,
    MEMORY_FILE_NAME,
    SQLITE_SUFFIXES,
    DeadEnd,
    Memory,
    Recalled,
    recalled,
    repository_root,
    repository_scope,
    scope_of,
)
from .config import Policy

if TYPE_CHECKING:
    from ._memory_file import FileMemory
    from ._memory_redis import RedisMemory
    from ._memory_sqlite import MEMORY_TABLE, SqliteMemory

__all__ = [
    "FORMAT_VERSION",
    "MAX_FILE_BYTES",
    "MAX_SCOPES",
    "MAX_SCOPE_CHARS",
    "MEMORY_FILE_NAME",
    "MEMORY_TABLE",
    "SQLITE_SUFFIXES",
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

#: The stores' names, from their modules (imported on first use).
_STORES = {
    "FileMemory": "_memory_file",
    "MEMORY_TABLE": "_memory_sqlite",
    "SqliteMemory": "_memory_sqlite",
    "RedisMemory": "_memory_redis",
}
__getattr__, __dir__ = lazy_names(__name__, __package__ or "", _STORES, globals(), __all__)


def defer_writes() -> None:
    """From now on in this process, SQLite memories write only when flushed (an entrance that
    holds the SQLite file while the guard decides: the command hooks' transaction)."""
    DEFERRED[0] = True


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
            from ._memory_redis import RedisMemory

            memory = RedisMemory(where, policy)
        elif where.lower().endswith(SQLITE_SUFFIXES):
            from ._memory_sqlite import SqliteMemory

            memory = SqliteMemory(where, policy)
        else:
            from ._memory_file import FileMemory

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
