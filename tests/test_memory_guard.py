"""Dead ends remembered across runs (issue 28), through the hook API: a loop stopped in one run
is reminded at its first repeat in the next run of the same scope; the ladder's later steps
come at their usual counts; a changed outcome clears it; scopes keep runs apart; bad memory
files never reach the application."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from otel_loopguard import PRESETS, Action, Decision, LoopGuard, Policy
from otel_loopguard._advice import AdviceRequest
from otel_loopguard._memory import FileMemory
from otel_loopguard.config import MemoryScope, Rule
from otel_loopguard.metrics import PrometheusRecorder

from .redis_tools import RedisServer, redis_server

__all__ = ["redis_server"]  # the fixture, used by name

DEFAULT = PRESETS["default"]
CALL = ("bash", {"command": "pytest tests/test_io.py"})
FAILURE = "FAILED tests/test_io.py::test_read - OSError: [Errno 2] /tmp/tmpab12cd/x.txt"


def _policy(path: Path, **changes: object) -> Policy:
    return DEFAULT.replace(memory=str(path), memory_scope=MemoryScope.GLOBAL, **changes)


def _run(
    guard: LoopGuard,
    session: str,
    times: int,
    result: str = FAILURE,
    agent: str | None = None,
    error: bool = True,
) -> list[Decision]:
    """``times`` attempts of CALL, each ending with ``result`` (a failure unless not
    ``error``) when it runs."""
    decisions = []
    for _ in range(times):
        decision = guard.before_tool(*CALL, session=session, agent=agent)
        decisions.append(decision)
        if not decision.blocks:
            after = guard.after_tool(
                *CALL, session=session, agent=agent, error=error, result=result
            )
            if after is not None:
                decisions.append(after)
    return decisions


def _stopped_run(path: Path, session: str = "run-1", error: bool = True, **changes: object) -> None:
    guard = LoopGuard(_policy(path, **changes))
    decisions = _run(guard, session, 6, error=error)
    assert any(d.blocks for d in decisions)
    guard.close(wait=True)


def test_a_stopped_loop_is_reminded_at_its_first_repeat_in_the_next_run(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    _stopped_run(path)
    (entry,) = FileMemory(path, DEFAULT).entries()
    assert entry.tool == "bash" and entry.scope == "global" and entry.runs == 1
    assert entry.arguments is None  # hashes only, by default

    without = _run(LoopGuard(DEFAULT.replace(memory=False)), "run-2", 6)
    guard = LoopGuard(_policy(path))
    first = guard.before_tool(*CALL, session="run-2")
    assert first.action is Action.ALLOW  # the first attempt may work this time
    guard.after_tool(*CALL, session="run-2", error=True, result=FAILURE)
    second = guard.before_tool(*CALL, session="run-2")
    assert (second.action, second.rule, second.count) == (Action.REMIND, Rule.MEMORY, 2)
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert "failed the same way in an earlier run, last on " + day in second.message
    guard.after_tool(*CALL, session="run-2", error=True, result=FAILURE)
    rest = _run(guard, "run-2", 4)
    # The ladder's later steps come at their usual counts: as without memory from the third on.
    assert [(d.action, d.rule, d.count) for d in rest] == [
        (d.action, d.rule, d.count) for d in without[len(without) - len(rest) :]
    ]
    guard.close(wait=True)
    (entry,) = FileMemory(path, DEFAULT).entries()
    assert entry.runs == 2  # this run ended in it too


def test_a_different_outcome_clears_the_reminder_for_the_run(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    _stopped_run(path)
    guard = LoopGuard(_policy(path))
    decisions = _run(guard, "run-2", 2, result="1 passed")
    assert all(d.rule is not Rule.MEMORY for d in decisions)
    decisions = _run(guard, "run-2", 1)  # the old failure again, after a success: not reminded
    assert all(d.rule is not Rule.MEMORY for d in decisions)


def test_the_same_run_is_not_reminded_of_its_own_dead_end(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    guard = LoopGuard(_policy(path))
    decisions = _run(guard, "run-1", 8)
    assert all(d.rule is not Rule.MEMORY for d in decisions)


def test_scopes_keep_agents_apart(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    policy = DEFAULT.replace(memory=str(path), memory_scope=MemoryScope.AGENT)
    _run(LoopGuard(policy), "run-1", 6, agent="coder")
    other = _run(LoopGuard(policy), "run-2", 2, agent="tester")
    assert all(d.rule is not Rule.MEMORY for d in other)
    same = _run(LoopGuard(policy), "run-3", 2, agent="coder")
    assert [d.rule for d in same if d.action is Action.REMIND] == [Rule.MEMORY]


def test_memory_off_and_the_in_process_default_remember_nothing(tmp_path: Path) -> None:
    for policy in (DEFAULT, DEFAULT.replace(memory=False)):
        guard = LoopGuard(policy)
        _run(guard, "run-1", 6)
        assert all(d.rule is not Rule.MEMORY for d in _run(LoopGuard(policy), "run-2", 3))
    assert list(tmp_path.iterdir()) == []


def test_metrics_count_hits_and_entries(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    _stopped_run(path)
    recorder = PrometheusRecorder()
    guard = LoopGuard(_policy(path), recorder=recorder)
    _run(guard, "run-2", 3)
    text = recorder.exposition().decode()
    assert 'loopguard_memory_hits_total{agent="none"} 1.0' in text
    assert "loopguard_memory_entries 1.0" in text


def test_the_rescue_question_names_the_dead_ends_of_the_scope(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    _stopped_run(path, error=False, memory_arguments=True)  # no failures: denials, then rescue
    asked: list[AdviceRequest] = []

    def advisor(request: AdviceRequest) -> str:
        asked.append(request)
        return "Read the traceback instead."

    guard = LoopGuard(_policy(path), advisor=advisor)
    _run(guard, "run-2", 8, error=False)
    assert asked, "the advisor was asked"
    (line,) = asked[0].dead_ends
    assert line.startswith("bash ") and "pytest tests/test_io.py" in line
    assert "1 earlier run" in line


def test_a_damaged_memory_file_never_reaches_the_application(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "memory.json"
    path.write_text('{"v": 1, "entries": "not a list"}')
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        guard = LoopGuard(_policy(path))
        decisions = _run(guard, "run-1", 6)
    assert any(d.blocks for d in decisions)  # the guard worked on without memory
    assert "moved it to" in caplog.text
    assert json.loads(path.read_text())["entries"]  # rebuilt, with this run's dead end
    assert guard.internal_errors == {}


def test_another_versions_memory_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    text = json.dumps({"v": 99, "entries": []})
    path.write_text(text)
    guard = LoopGuard(_policy(path))
    _run(guard, "run-1", 6)
    assert path.read_text() == text and guard.internal_errors == {}


def test_guards_sharing_redis_share_memory(redis_server: RedisServer) -> None:
    """Sessions in Redis and dead ends there too (``memory`` = the store's URL): a loop stopped
    by one guard is reminded by another, in another session."""
    policy = DEFAULT.replace(
        store=redis_server.url, memory=redis_server.url, memory_scope=MemoryScope.GLOBAL
    )
    first = LoopGuard(policy)
    assert any(d.blocks for d in _run(first, "run-1", 6))
    second = LoopGuard(policy)
    reminded = [d for d in _run(second, "run-2", 2) if d.action is Action.REMIND]
    assert [d.rule for d in reminded] == [Rule.MEMORY]
    assert second.store_errors == {} and second.internal_errors == {}


class _RecorderBeforeMemory:
    """A custom recorder written before memory (and before cost): no ``memory_hit``."""

    def __init__(self) -> None:
        self.decisions: list[tuple[str, str]] = []

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        pass

    def wasted(self, agent: str | None, tool: str, seconds: float) -> None:
        pass

    def decision(self, agent: str | None, tool: str, rule: str, action: str, count: int) -> None:
        self.decisions.append((rule, action))

    def stopped_run(self, agent: str | None, tool: str, rule: str) -> None:
        pass

    def rescue(self, outcome: str) -> None:
        pass

    def evicted(self, reason: str) -> None:
        pass

    def internal_error(self, where: str) -> None:
        pass


def test_a_recorder_written_before_memory_is_not_called_for_its_hits(tmp_path: Path) -> None:
    """Before, ``memory_hit`` raised AttributeError inside ``before_tool`` for such a recorder:
    the reminder from memory was lost and answered allow, as an internal error."""
    path = tmp_path / "memory.json"
    _stopped_run(path)
    recorder = _RecorderBeforeMemory()
    guard = LoopGuard(_policy(path), recorder=recorder)  # type: ignore[arg-type]
    _run(guard, "run-2", 1)
    second = guard.before_tool(*CALL, session="run-2")
    assert (second.action, second.rule) == (Action.REMIND, Rule.MEMORY)
    assert ("memory", "remind") in recorder.decisions
    assert guard.internal_errors == {}
    guard.close(wait=True)
