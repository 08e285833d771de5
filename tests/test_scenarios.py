"""The acceptance scenarios of the core issue, (a) to (j), through the public hook API."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

from otel_loopguard import (
    PRESETS,
    Action,
    CommandAdvisor,
    Decision,
    LoopGuard,
    Policy,
    Rule,
)

from .conftest import Call, FakeClock, run, threshold

DEFAULT = PRESETS["default"]
DENY = threshold(DEFAULT.deny_threshold)  # blocks when outcomes are unknown
# blocks earlier when the same outcome keeps coming back
STUCK = threshold(DEFAULT.no_progress_threshold)
POLL_LIMIT = threshold(DEFAULT.poll_limit)
assert STUCK < DENY


def grep_read_period(periods: int, *, results: bool) -> list[Call]:
    calls: list[Call] = []
    for _ in range(periods):
        for _ in range(5):
            calls.append(
                Call(
                    "grep",
                    {"pattern": "X", "path": "src"},
                    result="src/a.py:1: X" if results else None,
                )
            )
        calls.append(Call("read", {"path": "Y"}, result="contents of Y" if results else None))
    return calls


# (a) grep X five times, read Y, repeated (period 6)


def test_a_consecutive_rule_alone_never_gets_past_remind() -> None:
    guard = LoopGuard(DEFAULT.replace(rules=frozenset({Rule.CONSECUTIVE})))
    transcript = run(guard, grep_read_period(6, results=True))
    assert Action.REMIND in transcript.actions
    assert set(transcript.actions) <= {Action.ALLOW, Action.REMIND}


def test_a_window_rule_denies_within_three_wasted_repeats_of_the_loops_start() -> None:
    guard = LoopGuard(DEFAULT)
    transcript = run(guard, grep_read_period(6, results=False))
    first_deny = transcript.first(Action.DENY)
    assert first_deny is not None
    decision = transcript.decisions[first_deny - 1]
    assert decision.rule is Rule.WINDOW
    assert decision.tool == "grep"
    loop_start = 7  # the first call of the second period: where the sequence starts repeating
    assert first_deny - loop_start <= 3
    # every denial is of the grep: the read in between is never denied (only stopped, once
    # the agent has retried denied greps often enough to be told to end the run)
    denied = [d for d in transcript.decisions if d.action is Action.DENY]
    assert denied and {d.tool for d in denied} == {"grep"}


def test_a_with_known_results_denies_no_later() -> None:
    unknown = run(LoopGuard(DEFAULT), grep_read_period(3, results=False)).first(Action.DENY)
    known = run(LoopGuard(DEFAULT), grep_read_period(3, results=True)).first(Action.DENY)
    assert known is not None and unknown is not None and known <= unknown


# (b) the same `cargo clippy` four times with an edit between each


def test_b_clippy_between_edits_is_never_denied() -> None:
    calls: list[Call] = []
    for n in range(4):
        calls.append(Call("bash", {"command": "cargo clippy"}, result=f"warning: {4 - n} left"))
        calls.append(
            Call("edit", {"path": "src/lib.rs", "old": f"a{n}", "new": f"b{n}"}, result="ok")
        )
    transcript = run(LoopGuard(DEFAULT), calls)
    assert transcript.actions == [Action.ALLOW] * len(calls)


def test_b_clippy_without_edits_is_denied() -> None:
    calls = [Call("bash", {"command": "cargo clippy"}, result="warning: 4 left")] * (DENY + 1)
    transcript = run(LoopGuard(DEFAULT), calls)
    assert transcript.first(Action.DENY) == STUCK
    assert transcript.decisions[STUCK - 1].rule is Rule.NO_PROGRESS


# (c) six identical bash commands whose description numbers each run


def test_c_description_is_cosmetic() -> None:
    guard = LoopGuard(DEFAULT)
    calls = [
        Call("bash", {"command": "ls -la", "description": f"List files (attempt {n})"})
        for n in range(1, 7)
    ]
    transcript = run(guard, calls)
    assert len({d.signature for d in transcript.decisions if d.signature}) == 1
    assert transcript.first(Action.REMIND) == DEFAULT.remind_thresholds[0]
    assert transcript.decisions[-1].blocks


# (d) polling commands


def test_d_excluded_polling_is_untracked_and_transparent() -> None:
    policy = DEFAULT.replace(exclude_commands=(r"^docker ps\b",))
    guard = LoopGuard(policy)
    calls = [Call("bash", {"command": "grep -r TODO ."}, result="x")] * 2
    calls += [Call("bash", {"command": "docker ps"}, result="up")] * 20
    calls += [Call("bash", {"command": "grep -r TODO ."}, result="x")]
    transcript = run(guard, calls)
    assert transcript.actions[2:22] == [Action.ALLOW] * 20
    assert all(not d.repeated and d.count == 0 for d in transcript.decisions[2:22])
    # the excluded polls neither counted nor broke the grep's run: it is the 3rd in a row
    last = transcript.decisions[-1]
    assert (last.action, last.rule, last.count) == (Action.REMIND, Rule.CONSECUTIVE, 3)


def test_d_denied_docker_ps_does_not_block_a_different_command() -> None:
    guard = LoopGuard(DEFAULT)
    transcript = run(guard, [Call("bash", {"command": "docker ps"}, result="none")] * DENY)
    assert transcript.decisions[-1].action is Action.DENY
    other = guard.before_tool("bash", {"command": "sleep 10 && docker ps"}, session="s")
    assert other.action is Action.ALLOW


# (e) a denied call hammered 20 times


def test_e_hammering_a_denied_call_stops_the_agent() -> None:
    guard = LoopGuard(DEFAULT)
    transcript = run(guard, [Call("search", {"q": "weather"}, result="sunny")] * 20)
    stop_at = transcript.first(Action.STOP)
    stop_after = DEFAULT.stop_after_denials
    assert stop_after is not None
    assert transcript.first(Action.DENY) == STUCK
    assert stop_at == STUCK + stop_after
    assert transcript.actions[stop_at - 1 :] == [Action.STOP] * (20 - stop_at + 1)
    assert "End this run" in transcript.decisions[stop_at - 1].message
    # a new user message lifts the stop and starts a new epoch
    guard.user_message("s")
    assert guard.before_tool("search", {"q": "weather"}, session="s").action is Action.ALLOW


# (f) polling whose result changes every time


def test_f_changing_results_are_reminded_until_the_poll_limit() -> None:
    guard = LoopGuard(DEFAULT)
    calls = [Call("job_status", {"id": 7}, result=f"{n}% done") for n in range(POLL_LIMIT + 2)]
    transcript = run(guard, calls)
    before_limit = transcript.actions[: POLL_LIMIT - 1]
    assert Action.DENY not in before_limit and Action.STOP not in before_limit
    assert all(a is Action.REMIND for a in transcript.actions[DENY - 1 : POLL_LIMIT - 1])
    assert "polling" in transcript.decisions[DENY - 1].message
    assert transcript.decisions[POLL_LIMIT - 1].blocks


def test_f_poll_that_stops_changing_is_denied() -> None:
    calls = [Call("job_status", {"id": 7}, result=f"{n}%") for n in range(DENY - 1)]
    calls += [Call("job_status", {"id": 7}, result="stuck")] * 3
    transcript = run(LoopGuard(DEFAULT), calls)
    first_block = next(i for i, d in enumerate(transcript.decisions, 1) if d.blocks)
    assert DENY < first_block < POLL_LIMIT


# (g) two sessions interleaved


def test_g_sessions_do_not_cross_talk() -> None:
    alone = run(LoopGuard(DEFAULT), [Call("search", {"q": "a"}, result="r")] * 10).actions
    guard = LoopGuard(DEFAULT)
    mixed = [Call("search", {"q": "a"}, result="r", session=s) for _ in range(10) for s in "AB"]
    transcript = run(guard, mixed)
    assert transcript.actions[0::2] == alone
    assert transcript.actions[1::2] == alone


# (h) thresholds given out of order


def test_h_thresholds_are_sorted_gentle_first_then_detailed() -> None:
    policy = Policy(
        remind_thresholds=[4, 2],  # type: ignore[arg-type]  # a list, normalized to a sorted tuple
        deny_threshold=None,
        rescue_threshold=None,
        poll_limit=None,
        no_progress_threshold=None,
    )
    assert policy.remind_thresholds == (2, 4)
    transcript = run(LoopGuard(policy), [Call("read", {"path": "a.txt"}, result="A")] * 4)
    assert transcript.actions == [Action.ALLOW, Action.REMIND, Action.ALLOW, Action.REMIND]
    gentle, detailed = transcript.decisions[1].message, transcript.decisions[3].message
    assert "Arguments:" not in gentle and "Read the last result" in gentle
    assert 'Arguments: {"path":"a.txt"}' in detailed


# (i) the advisor


def _stub(tmp_path: Path, body: str) -> str:
    script = tmp_path / "advisor.py"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


RESCUE_POLICY = DEFAULT.replace(
    stop_after_denials=None, cooldown_seconds=0.0, advisor_timeout_seconds=2.0
)
RESCUE_AT = threshold(RESCUE_POLICY.rescue_threshold)


def _hammer(guard: LoopGuard, times: int, q: str = "x") -> list[Decision]:
    return run(guard, [Call("search", {"q": q}, result="same")] * times).decisions


def test_i_advice_reaches_the_rescue_message_and_is_cached(tmp_path: Path) -> None:
    calls_file = tmp_path / "calls"
    command = _stub(
        tmp_path,
        f"""
        import json, sys
        request = json.load(sys.stdin)
        with open({str(calls_file)!r}, "a") as f:
            f.write(request["tool"] + "\\n")
        print("Try searching the forecast API instead of the web.")
    """,
    )
    guard = LoopGuard(
        RESCUE_POLICY, advisor=CommandAdvisor(command, timeout_seconds=5, input_mode="stdin_json")
    )
    decisions = _hammer(guard, RESCUE_AT + 1)
    rescue, again = decisions[RESCUE_AT - 1], decisions[RESCUE_AT]
    assert rescue.action is Action.RESCUE and rescue.blocks
    assert "Try searching the forecast API" in rescue.message
    assert again.action is Action.RESCUE and "forecast API" in again.message
    assert calls_file.read_text().splitlines() == ["search"]  # the second trip used the cache


def test_i_failed_advisor_gives_local_denial_and_refunds_budget(tmp_path: Path) -> None:
    flag = tmp_path / "failed-once"
    command = _stub(
        tmp_path,
        f"""
        import os, sys
        if not os.path.exists({str(flag)!r}):
            open({str(flag)!r}, "w").close()
            sys.exit(1)
        print("advice after a failure")
    """,
    )
    guard = LoopGuard(
        RESCUE_POLICY.replace(max_rescues=1), advisor=CommandAdvisor(command, timeout_seconds=5)
    )
    decisions = _hammer(guard, RESCUE_AT + 1)
    failed, retried = decisions[RESCUE_AT - 1], decisions[RESCUE_AT]
    assert failed.action is Action.DENY and "Not run" in failed.message
    assert "Advice" not in failed.message
    # the budget of one was refunded, so the next trip may ask again
    assert retried.action is Action.RESCUE and "advice after a failure" in retried.message


def test_i_slow_advisor_is_killed_and_gives_local_denial(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    command = _stub(
        tmp_path,
        f"""
        import os, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
        print("too late")
    """,
    )
    guard = LoopGuard(RESCUE_POLICY, advisor=CommandAdvisor(command, timeout_seconds=0.5))
    started = time.monotonic()
    decisions = _hammer(guard, RESCUE_AT)
    assert time.monotonic() - started < 10
    assert decisions[-1].action is Action.DENY
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_i_budget_and_cooldown_bound_the_asks(clock: FakeClock) -> None:
    asked: list[str] = []

    def advisor(request: object) -> str:
        asked.append("x")
        return "advice"

    policy = RESCUE_POLICY.replace(max_rescues=2, cooldown_seconds=30.0)
    guard = LoopGuard(policy, advisor=advisor, clock=clock)
    assert _hammer(guard, RESCUE_AT, q="a")[-1].action is Action.RESCUE
    # another signature within the cooldown: local denial
    assert _hammer(guard, RESCUE_AT, q="b")[-1].action is Action.DENY
    clock.advance(31)
    assert _hammer(guard, 1, q="b")[-1].action is Action.RESCUE
    clock.advance(31)
    # budget of two spent: local denial
    assert _hammer(guard, RESCUE_AT, q="c")[-1].action is Action.DENY
    assert len(asked) == 2


# (j) a bash-only agent


def test_j_bash_only_agent_editing_with_sed_is_not_denied() -> None:
    calls: list[Call] = []
    for n in range(8):
        calls.append(Call("bash", {"command": "python -m pytest -q"}, result=f"{8 - n} failed"))
        calls.append(Call("bash", {"command": f"sed -i 's/bug{n}/fix{n}/' app.py"}, result=""))
    transcript = run(LoopGuard(DEFAULT), calls)
    assert not any(d.blocks for d in transcript.decisions)


def test_j_bash_only_agent_rereading_an_unchanged_file_is_denied() -> None:
    calls = [Call("bash", {"command": "cat app.py"}, result="print('hi')")] * (DENY + 2)
    transcript = run(LoopGuard(DEFAULT), calls)
    assert transcript.first(Action.DENY) == STUCK
    unknown = [Call("bash", {"command": "cat app.py"}, report=False)] * (DENY + 2)
    assert run(LoopGuard(DEFAULT), unknown).first(Action.DENY) == DENY
