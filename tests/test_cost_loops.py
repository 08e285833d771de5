"""Loop accounting (issue 24, item 3): what a session spent in loops, and the estimate of what
its stop avoided, through the hook API and the span processor on real dumps."""

from __future__ import annotations

import pytest

from otel_loopguard import PRESETS, Action, LoopGuard
from otel_loopguard._engine import SessionState
from otel_loopguard._prices import Cost, ModelUsage
from otel_loopguard._spend import Spend

from .redis_tools import RedisServer, redis_server
from .test_cost_spans import _path, _run, _sessions

__all__ = ["redis_server"]  # the fixture, used by name

DEFAULT = PRESETS["default"]
TURN = {"model": "gpt-4o", "input_tokens": 1000, "output_tokens": 100}


def test_a_turn_is_in_a_loop_when_the_call_it_requested_repeats() -> None:
    guard = LoopGuard(DEFAULT)
    guard.model_call({**TURN, "reported_cost_usd": 0.01}, session="s")
    guard.before_tool("search", {"q": "a"}, session="s")  # new: not a loop
    guard.model_call({**TURN, "reported_cost_usd": 0.02}, session="s")
    guard.before_tool("search", {"q": "a"}, session="s")  # a repeat: this turn looped
    guard.model_call({**TURN, "reported_cost_usd": 0.04}, session="s")
    guard.before_tool("search", {"q": "b"}, session="s")  # new again
    guard.model_call({**TURN, "reported_cost_usd": 0.08}, session="s")  # a final answer
    spend = guard.spend("s")
    assert spend is not None
    assert (spend.calls, spend.loop_turns, spend.loop_tokens) == (4, 1, 1100)
    assert spend.loop_usd == pytest.approx(0.02)
    assert spend.cost_usd == pytest.approx(0.15)
    assert spend.held == (1100, 0.08)  # the last turn waits for a call that never comes


def test_progress_ends_the_loop() -> None:
    guard = LoopGuard(DEFAULT)
    for _ in range(3):
        guard.model_call(TURN, session="s")
        guard.before_tool("read_file", {"path": "a"}, session="s")
    guard.model_call(TURN, session="s")
    guard.before_tool("write_file", {"path": "a", "text": "x"}, session="s")
    guard.after_tool("write_file", {"path": "a", "text": "x"}, session="s", result="ok")
    guard.model_call(TURN, session="s")
    guard.before_tool("read_file", {"path": "a"}, session="s")  # first of a new epoch
    spend = guard.spend("s")
    assert spend is not None
    assert spend.loop_turns == 2  # the 2nd and 3rd reads only


def test_a_stopped_loop_estimates_what_the_stop_avoided() -> None:
    guard = LoopGuard(DEFAULT)
    actions = []
    for _ in range(12):
        guard.model_call({**TURN, "reported_cost_usd": 0.01}, session="s")
        actions.append(guard.before_tool("search", {"q": "x"}, session="s").action)
    refused = sum(action is Action.STOP for action in actions)
    assert refused >= 1
    spend = guard.spend("s")
    assert spend is not None
    assert spend.loop_turns == 11  # every turn after the first asked for a repeat
    assert spend.refused_after_stop == refused
    tokens, usd = spend.avoided()
    # The method: the loop's mean per turn times the calls refused because of the stop.
    assert tokens == round(spend.loop_tokens / spend.loop_turns * refused) == 1100 * refused
    assert usd == pytest.approx(0.01 * refused)


def test_no_stop_no_avoided_estimate() -> None:
    spend = Spend()
    spend.add(ModelUsage.checked("m", input_tokens=10), Cost(0.5, "provider"))
    spend.call_counted(True, False)
    assert spend.avoided() == (0, 0.0)


def test_sub_agents_keep_their_own_loop_spend() -> None:
    guard = LoopGuard(DEFAULT)
    for _ in range(3):
        guard.model_call(TURN, session="s", agent="child")
        guard.before_tool("search", {"q": "x"}, session="s", agent="child")
        guard.model_call(TURN, session="s", agent="parent")
        guard.before_tool("delegate", {"n": _}, session="s", agent="parent")
    child, parent = guard.spend("s", agent="child"), guard.spend("s", agent="parent")
    assert child is not None and parent is not None
    assert (child.loop_turns, parent.loop_turns) == (2, 0)


def test_the_loop_state_travels_with_the_session() -> None:
    guard = LoopGuard(DEFAULT)
    for _ in range(9):
        guard.model_call(TURN, session="s")
        guard.before_tool("search", {"q": "x"}, session="s")
    guard.model_call(TURN, session="s")
    state = guard.export_session("s")
    assert state is not None and state.spend is not None
    back = SessionState.from_bytes(state.to_bytes(), DEFAULT).spend
    assert back is not None
    for name in Spend.__slots__:
        assert getattr(back, name) == getattr(state.spend, name), name


@pytest.mark.parametrize(
    ("name", "loop_tokens"),
    [
        # Turns 2-6 asked for the 2nd to 6th identical search, turn 8 for the search after
        # get_weather: 76 + 90 + 104 + 118 + 132 + 156 tokens.
        ("pydantic_ai/spans.jsonl", 676),
        ("strands/spans.jsonl", 6 * 15),
        ("smolagents/spans.jsonl", 6 * 15),
    ],
)
def test_the_loop_spend_of_real_runs(name: str, loop_tokens: int) -> None:
    guard = LoopGuard(DEFAULT)
    _run(_path(name), guard)
    (entry,) = [s for s in _sessions(guard) if "spend" in s["state"]]
    spend = guard.spend(entry["session"], agent=entry["agent"])
    assert spend is not None
    assert (spend.loop_turns, spend.loop_tokens) == (6, loop_tokens)


def test_two_guards_on_one_redis_share_the_spend_and_the_loop(redis_server: RedisServer) -> None:
    a = LoopGuard(DEFAULT, store=redis_server.url)
    b = LoopGuard(DEFAULT, store=redis_server.url)
    for i in range(4):
        turn, call = (a, b) if i % 2 else (b, a)
        turn.model_call({**TURN, "reported_cost_usd": 0.01}, session="s", agent="x")
        call.before_tool("search", {"q": "x"}, session="s", agent="x")
    spend = a.spend("s", agent="x")
    assert spend is not None
    assert (spend.calls, spend.loop_turns, spend.loop_tokens) == (4, 3, 3300)
    assert spend.provider_usd == pytest.approx(0.04)
    assert a.store_errors == {} and b.store_errors == {}
