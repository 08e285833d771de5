"""The dead-end stores of issue 28 (:mod:`otel_loopguard._memory`): a JSON file, a SQLite table,
Redis; their bounds, and what they do with a damaged, foreign, huge or unwritable file."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from pathlib import Path

import pytest

from otel_loopguard._memory import (
    FORMAT_VERSION,
    MAX_FILE_BYTES,
    DeadEnd,
    FileMemory,
    Memory,
    RedisMemory,
    SqliteMemory,
    open_memory,
    recalled,
    repository_root,
    scope_of,
)
from otel_loopguard.config import MemoryScope, Policy

from .redis_tools import RedisServer, redis_server

__all__ = ["redis_server"]  # the fixture, used by name

POLICY = Policy(memory_max_entries=3, memory_max_age_seconds=1000.0)


def _entry(key: str = "k1", *, run: str = "r1", last: float | None = None, **kw: object) -> DeadEnd:
    now = time.time() if last is None else last
    fields: dict[str, object] = {
        "scope": "global",
        "key": key,
        "outcome": "o1",
        "tool": "bash",
        "rule": "no_progress",
        "count": 4,
        "runs": 1,
        "first": now,
        "last": now,
        "run": run,
    }
    fields.update(kw)
    return DeadEnd(**fields)  # type: ignore[arg-type]


def _stores(tmp_path: Path) -> list[Memory]:
    return [FileMemory(tmp_path / "m.json", POLICY), SqliteMemory(tmp_path / "m.sqlite3", POLICY)]


def test_a_second_run_counts_once_more_and_the_same_run_does_not(tmp_path: Path) -> None:
    for memory in _stores(tmp_path):
        memory.record(_entry(run="r1", count=4))
        memory.record(_entry(run="r1", count=6))  # the same run, denied again
        memory.record(_entry(run="r2", count=5, last=time.time() + 1))
        (entry,) = memory.recall("global", "k1")
        assert (entry.runs, entry.count, entry.run) == (2, 5, "r2"), memory.where
        assert memory.recall("global", "other") == []
        assert memory.recall("agent:x", "k1") == []
        history = recalled(memory.recall("global", "k1"), "o1")
        assert history is not None and history.runs == 2 and history.attempts == 5
        assert recalled(memory.recall("global", "k1"), "another outcome") is None


def test_entries_are_bounded_per_scope_and_by_age(tmp_path: Path) -> None:
    now = time.time()
    for memory in _stores(tmp_path):
        for index in range(5):
            memory.record(_entry(f"k{index}", last=now - 10 + index))
        memory.record(_entry("old", scope="agent:a", last=now - 5000))
        kept = memory.entries("global")
        assert [e.key for e in kept] == ["k4", "k3", "k2"], memory.where  # most recent first
        assert memory.entries("agent:a") == []  # older than memory_max_age_seconds
        assert memory.count() == 3


def test_forget_and_clear(tmp_path: Path) -> None:
    for memory in _stores(tmp_path):
        memory.record(_entry("abc1"))
        memory.record(_entry("abd2"))
        memory.record(_entry("abc3", scope="agent:a"))
        assert memory.forget("global", "abc") == 1
        assert {e.key for e in memory.entries()} == {"abd2", "abc3"}
        assert memory.clear("agent:a") == 1
        assert memory.clear() == 1
        assert memory.entries() == []


def test_the_file_is_private_plain_json_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "m.json"
    memory = FileMemory(path, POLICY)
    memory.record(_entry())
    assert path.stat().st_mode & 0o777 == 0o600
    raw = json.loads(path.read_text())
    assert raw["v"] == FORMAT_VERSION and raw["entries"][0]["key"] == "k1"
    assert "arguments" not in raw["entries"][0]
    assert [p.name for p in path.parent.iterdir()] == ["m.json"]  # no temporary file left
    # Another process's write is seen (the file changed).
    other = FileMemory(path, POLICY)
    other.record(_entry("k2"))
    assert {e.key for e in memory.entries()} == {"k1", "k2"}


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b'{"v": 1, "entries": [3]}'])
def test_a_damaged_file_is_moved_aside_and_rebuilt(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "m.json"
    path.write_bytes(content)
    memory = FileMemory(path, POLICY)
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        assert memory.recall("global", "k1") == []
        memory.record(_entry())
    aside = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes() == content
    assert "moved it to" in caplog.text and caplog.text.count("memory:") == 1
    assert [e.key for e in FileMemory(path, POLICY).entries()] == ["k1"]


def test_a_huge_file_is_not_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "m.json"
    with path.open("wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        assert FileMemory(path, POLICY).recall("global", "k1") == []
    assert f"over {MAX_FILE_BYTES}" in caplog.text
    assert not path.exists()  # moved aside


def test_another_versions_file_is_left_alone_and_memory_is_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "m.json"
    text = json.dumps({"v": FORMAT_VERSION + 1, "entries": [{"new": "layout"}]})
    path.write_text(text)
    memory = FileMemory(path, POLICY)
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        memory.record(_entry())
        assert memory.recall("global", "k1")  # kept in this process
    assert path.read_text() == text
    assert "written by another version" in caplog.text


def test_an_unwritable_place_keeps_memory_in_the_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    memory = FileMemory(blocked / "m.json", POLICY)  # its directory is a file
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        memory.record(_entry())
        memory.record(_entry("k2"))
    assert {e.key for e in memory.entries()} == {"k1", "k2"}
    assert caplog.text.count("cannot write it") == 1


def test_a_corrupt_sqlite_file_is_moved_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "m.sqlite3"
    path.write_bytes(b"this is not a database, not at all" * 100)
    memory = SqliteMemory(path, POLICY)
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        assert memory.recall("global", "k1") == []
    assert any(".corrupt-" in p.name for p in tmp_path.iterdir())
    memory.record(_entry())
    memory.flush()
    assert [e.key for e in SqliteMemory(path, POLICY).entries()] == ["k1"]


def test_a_busy_sqlite_file_keeps_the_record_until_flushed(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite3"
    memory = SqliteMemory(path, POLICY)
    memory.record(_entry("k0"))
    memory.flush()  # (an in-process hook run earlier in this process defers every write)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # as the hook's own transaction holds the file
    memory.record(_entry("k1"))
    assert [e.key for e in memory.recall("global", "k1")] == ["k1"]  # waiting, still recalled
    assert [e.key for e in SqliteMemory(path, POLICY).entries()] == ["k0"]
    holder.execute("COMMIT")
    holder.close()
    memory.flush()
    assert {e.key for e in SqliteMemory(path, POLICY).entries()} == {"k0", "k1"}


def test_open_memory_follows_the_policy(tmp_path: Path) -> None:
    assert open_memory(Policy()) is None  # true: the entrance's store; in-process: none
    assert open_memory(Policy(memory=False), default=str(tmp_path / "x.json")) is None
    assert isinstance(open_memory(Policy(memory=str(tmp_path / "a.json"))), FileMemory)
    assert isinstance(open_memory(Policy(memory=str(tmp_path / "a.db"))), SqliteMemory)
    chosen = open_memory(Policy(), default=str(tmp_path / "h.sqlite3"))
    assert isinstance(chosen, SqliteMemory)
    assert open_memory(Policy(), default=str(tmp_path / "h.sqlite3")) is chosen  # shared


def test_scopes(tmp_path: Path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "src" / "pkg").mkdir(parents=True)
    inside = str(tmp_path / "repo" / "src" / "pkg")
    assert repository_root(inside) == str(tmp_path / "repo")
    assert repository_root(str(tmp_path)) == str(tmp_path)
    policy = Policy()
    assert scope_of(policy, directory=inside) == f"repository:{tmp_path / 'repo'}"
    agent = Policy(memory_scope=MemoryScope.AGENT)
    assert scope_of(agent, agent="coder") == "agent:coder"
    assert scope_of(Policy(memory_scope=MemoryScope.GLOBAL), agent="coder") == "global"
    assert scope_of(policy) == f"repository:{repository_root(os.getcwd())}"


def test_redis_memory(redis_server: RedisServer) -> None:
    memory = RedisMemory(redis_server.url, POLICY)
    memory.record(_entry("k1", run="r1"))
    memory.record(_entry("k1", run="r2"))
    for index in range(4):
        memory.record(_entry(f"x{index}", last=time.time() + index))
    assert memory.recall("global", "k1") == []  # the oldest, dropped beyond memory_max_entries=3
    assert len(memory.entries("global")) == 3
    memory.record(_entry("k1", scope="agent:a"))
    memory.record(_entry("k1", scope="agent:a", run="r2"))
    assert memory.recall("agent:a", "k1")[0].runs == 2
    assert memory.forget("agent:a", "k1") == 1
    assert memory.clear() == 3 and memory.count() == 0


def test_a_redis_that_is_down_is_nothing_remembered(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("redis")
    policy = Policy(store_timeout_seconds=0.05)
    memory = RedisMemory("redis://127.0.0.1:1/0", policy)
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        memory.record(_entry())
        assert memory.recall("global", "k1") == []
    assert caplog.text.count("going on without memory") == 1


def test_a_run_is_not_reminded_of_its_own_dead_end() -> None:
    own = _entry(run="r2")
    assert recalled([own], "o1", run="r2") is None
    both = _entry(run="r2", runs=2)  # r1's, then r2's
    history = recalled([both], "o1", run="r2")
    assert history is not None and history.runs == 1
    assert recalled([own], "o1", run="r3") is not None


def test_a_memory_table_of_another_layout_is_never_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "m.sqlite3"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE memory (id INTEGER PRIMARY KEY, blob TEXT)")
    memory = SqliteMemory(path, POLICY)
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        assert memory.recall("global", "k1") == []
        memory.record(_entry())
        memory.flush()
        assert memory.entries() == []
    assert "going on without memory" in caplog.text
    assert "what this process learns is not kept" in caplog.text


def test_count_reads_the_file_before_any_recall(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    FileMemory(path, POLICY).record(_entry())
    assert FileMemory(path, POLICY).count() == 1  # a fresh guard's gauge, before any repeat
