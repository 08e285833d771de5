"""What a session keeps of dead-end memory (issue 28): its marks and scope survive the trip
through bytes (the command hooks keep a session between processes), bounded."""

from __future__ import annotations

import pytest

from otel_loopguard._advice import MAX_DEAD_ENDS, AdviceRequest
from otel_loopguard._engine import CLEARED, MAX_MEMORY_MARKS, RECORDED, REMINDED, SessionState
from otel_loopguard.config import Policy

POLICY = Policy()


def test_marks_and_scope_round_trip() -> None:
    state = SessionState(1.0)
    assert state.mark_memory("k1", RECORDED) == 0
    assert state.mark_memory("k1", REMINDED) == RECORDED
    state.mark_memory("k2", CLEARED)
    state.scope = "repository:/src/app"
    back = SessionState.from_bytes(state.to_bytes(), POLICY)
    assert back.memory == {"k1": RECORDED | REMINDED, "k2": CLEARED}
    assert back.scope == "repository:/src/app"
    plain = SessionState.from_bytes(SessionState(1.0).to_bytes(), POLICY)
    assert plain.memory is None and plain.scope is None
    assert b"mem" not in SessionState(1.0).to_bytes()  # nothing written without memory


def test_marks_are_bounded() -> None:
    state = SessionState(1.0)
    for index in range(MAX_MEMORY_MARKS + 10):
        state.mark_memory(f"k{index}", RECORDED)
    assert state.memory is not None and len(state.memory) == MAX_MEMORY_MARKS
    assert "k0" not in state.memory and f"k{MAX_MEMORY_MARKS + 9}" in state.memory


@pytest.mark.parametrize("bad", [b'"x"', b"[1, 2, 3]", b'[["k", -1]]', b"[[1, 2]]"])
def test_bad_marks_are_refused_naming_the_field(bad: bytes) -> None:
    data = SessionState(1.0).to_bytes()[:-1] + b',"mem":' + bad + b"}"
    with pytest.raises(ValueError, match="mem|memory"):
        SessionState.from_bytes(data, POLICY)


def test_the_rescue_question_lists_known_dead_ends() -> None:
    lines = tuple(f'bash {{"command": "pytest {n}"}}: failed in 2 runs' for n in range(20))
    request = AdviceRequest("s", "bash", "{}", 6, "no_progress", "denied", dead_ends=lines)
    question = request.question()
    assert "## Dead ends of earlier runs (refused or stopped there)" in question
    assert "pytest 0" in question and f"pytest {MAX_DEAD_ENDS}" not in question
    assert '"dead_ends": ["bash' in request.to_json()
    assert "Dead ends" not in AdviceRequest("s", "bash", "{}", 6, "x", "denied").question()


def test_the_reminder_from_memory_says_how_often_and_when() -> None:
    from otel_loopguard._memory import Recalled
    from otel_loopguard._policy import Action, decide, remember
    from otel_loopguard.config import Rule

    last = 1_796_000_000.0  # 2026-11-30 (UTC)
    step = remember(2, 0, Recalled(3, last, 6, failed=True))
    decision = decide(step, tool="bash", key="ab" * 16, session="s", policy=POLICY, canonical=b"{}")
    assert (decision.action, decision.rule, decision.count, decision.threshold) == (
        Action.REMIND,
        Rule.MEMORY,
        2,
        2,
    )
    assert decision.message.startswith(
        "[loopguard] `bash` with these arguments failed the same way again. This exact call"
        " failed the same way in 3 earlier runs, last on 2026-11-30, and those runs were refused"
        " or stopped for repeating it (6 attempts the last time)."
    )
    once = decide(
        remember(2, 0, Recalled(1, last, 4)), tool="t", key="ab" * 16, session="s", policy=POLICY
    )
    assert "gave the same result in an earlier run, last on 2026-11-30, and that run was" in (
        once.message
    )
