"""Command hooks with a shared store (``LOOPGUARD_STORE=redis://...``): the real hook command in
a process per event, a real ``redis-server``. The session lives in Redis, so hook processes with
different SQLite files (two machines, two users' state files) decide one session's calls as one
process with one file does; the SQLite rows keep only the reminders waiting for a result."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .redis_tools import RedisServer, require_redis_server
from .test_hooks import BASH_RESULT, BASH_TESTS, claude, claude_post, claude_pre, clean_env, hook


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    require_redis_server()
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


def _session(stores: list[Path], env: dict[str, str]) -> list[tuple[dict[str, Any], ...]]:
    """A looping Claude Code session, each call (its pre and post events) on the next store
    in turn, a prompt in the middle: every answer."""
    answers: list[tuple[dict[str, Any], ...]] = []
    for n in range(9):
        store = stores[n % len(stores)]
        call_id = f"toolu_{n}"
        pre = hook("claude-code", claude_pre("Bash", BASH_TESTS, call_id), store, env=env)
        post = hook(
            "claude-code", claude_post("Bash", BASH_TESTS, call_id, BASH_RESULT), store, env=env
        )
        assert pre.code == post.code == 0
        answers.append((pre.out, post.out))
        if n == 6:
            prompt = hook("claude-code", claude("UserPromptSubmit", prompt="again"), store, env=env)
            answers.append((prompt.out,))
    return answers


def test_hooks_on_different_state_files_share_the_session_in_redis(
    tmp_path: Path, redis: RedisServer
) -> None:
    expected = _session([tmp_path / "one.sqlite3"], clean_env())
    stores = [tmp_path / "a.sqlite3", tmp_path / "b.sqlite3"]
    got = _session(stores, clean_env(LOOPGUARD_STORE=redis.url))
    assert got == expected
    texts = str(expected)
    assert "permissionDecision" in texts and "deny" in texts  # the session does loop
    assert "additionalContext" in texts  # a reminder held for the call's result was shown
    for store in stores:  # no session state in SQLite: Redis has it
        with sqlite3.connect(store) as db:
            states = [row[0] for row in db.execute("SELECT state FROM sessions")]
        assert all(state == b"" for state in states), states
