"""Dead-end memory is read and written off the guard's lock (issue 29 item 2): a slow store
holds up only the call that asks it, never another session's calls; the answers are those of
the store as before (a reminder from memory at the first repeat, once per call and run)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from otel_loopguard import PRESETS, Action, LoopGuard, Policy
from otel_loopguard.config import MemoryScope, Rule

DEFAULT = PRESETS["default"]
CALL = ("bash", {"command": "pytest tests/test_io.py"})
FAILURE = "FAILED tests/test_io.py::test_read - OSError: [Errno 2] no such file"


def _policy(path: Path) -> Policy:
    return DEFAULT.replace(memory=str(path), memory_scope=MemoryScope.GLOBAL)


def _spy(guard: LoopGuard, method: str, seen: list[bool], before: Callable[[], None]) -> None:
    """Record, on each call of the guard's memory ``method``, whether the guard's lock is held
    (the real store's method then runs)."""
    core = guard._core
    memory: Any = core.memory
    real = getattr(memory, method)

    def spied(*args: Any, **kwargs: Any) -> Any:
        seen.append(core._lock.locked())
        before()
        return real(*args, **kwargs)

    setattr(memory, method, spied)


def _stop(guard: LoopGuard, session: str, error: bool = True) -> list[Action]:
    actions = []
    for _ in range(6):
        decision = guard.before_tool(*CALL, session=session)
        actions.append(decision.action)
        if not decision.blocks:
            guard.after_tool(*CALL, session=session, error=error, result=FAILURE)
    return actions


def test_record_and_recall_run_off_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    first = LoopGuard(_policy(path))
    recorded: list[bool] = []
    _spy(first, "record", recorded, lambda: None)
    # The same result each time (no failure): recorded at the first denial, before the call.
    assert Action.DENY in _stop(first, "run-1", error=False)
    assert recorded == [False]  # once per call and run, and off the lock
    first.close(wait=True)

    second = LoopGuard(_policy(path))
    recalled: list[bool] = []
    _spy(second, "recall", recalled, lambda: None)
    second.before_tool(*CALL, session="run-2")
    second.after_tool(*CALL, session="run-2", error=False, result=FAILURE)
    decision = second.before_tool(*CALL, session="run-2")
    assert (decision.action, decision.rule) == (Action.REMIND, Rule.MEMORY)
    second.after_tool(*CALL, session="run-2", error=False, result=FAILURE)
    second.before_tool(*CALL, session="run-2")
    assert recalled == [False]  # asked once for the call in this run, off the lock


def test_a_slow_store_holds_up_only_its_own_call(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    first = LoopGuard(_policy(path))
    _stop(first, "run-1")
    first.close(wait=True)

    guard = LoopGuard(_policy(path))
    asked, release = threading.Event(), threading.Event()

    def slow() -> None:
        asked.set()
        assert release.wait(10)

    _spy(guard, "recall", [], slow)
    guard.before_tool(*CALL, session="run-2")
    guard.after_tool(*CALL, session="run-2", error=True, result=FAILURE)
    answers: list[Any] = []
    waiting = threading.Thread(
        target=lambda: answers.append(guard.before_tool(*CALL, session="run-2"))
    )
    waiting.start()
    try:
        assert asked.wait(10)
        # While the store is slow, another session's calls are decided.
        other = [guard.before_tool("read", {"path": f"f{i}"}, session="other") for i in range(3)]
        assert [d.action for d in other] == [Action.ALLOW] * 3
        assert answers == []  # the asking call is still waiting for its store
    finally:
        release.set()
        waiting.join(10)
    (decision,) = answers
    assert (decision.action, decision.rule) == (Action.REMIND, Rule.MEMORY)
