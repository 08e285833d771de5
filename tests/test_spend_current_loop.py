"""The loop now running in a session's spend (issue 24): what it holds, what counting a call
moves into it and returns for the metrics, and its plain data, which still reads the 13-item
form the last release wrote."""

from __future__ import annotations

import pytest

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard._engine import SessionState
from otel_loopguard._prices import COMPUTED, PROVIDER, UNPRICED, Cost, ModelUsage
from otel_loopguard._spend import Spend, Spent

USAGE = ModelUsage.checked("m", input_tokens=1000, output_tokens=100)


def _spend(*costs: Cost, repeats: bool = True) -> Spend:
    spend = Spend()
    for cost in costs:
        spend.add(USAGE, cost)
        spend.call_counted(repeats, False)
    return spend


def test_the_current_loop_counts_priced_unpriced_and_computed_turns() -> None:
    spend = _spend(Cost(0.25, PROVIDER), Cost(None, UNPRICED), Cost(0.5, COMPUTED))
    assert spend.current_loop() == Spent(3300, 0.75, 3, 1, True)
    assert spend.current_loop().priced
    only_provider = _spend(Cost(0.25, PROVIDER))
    assert only_provider.current_loop() == Spent(1100, 0.25, 1, 0, False)
    assert not _spend(Cost(None, UNPRICED)).current_loop().priced


def test_what_the_held_turn_would_add_is_seen_before_the_call_is_counted() -> None:
    spend = _spend(Cost(0.25, PROVIDER))
    spend.add(USAGE, Cost(None, UNPRICED))
    assert spend.current_loop(repeated=True) == Spent(2200, 0.25, 2, 1, False)
    assert spend.current_loop(repeated=False) == Spent(1100, 0.25, 1, 0, False)
    assert spend.current_loop(repeated=True, stopped=True) == Spent(1100, 0.25, 1, 0, False)
    assert spend.current_loop().turns == 1  # looking moved nothing


def test_call_counted_returns_what_moved_and_what_a_refused_call_avoided() -> None:
    spend = Spend()
    spend.add(USAGE, Cost(0.25, PROVIDER))
    assert spend.call_counted(False, False) == (0, 0.0, 0, 0.0)  # a new call: no loop
    spend.add(USAGE, Cost(0.25, PROVIDER))
    assert spend.call_counted(True, False) == (1100, 0.25, 0, 0.0)
    spend.add(USAGE, Cost(0.75, PROVIDER))
    # The stopping call: its turn moves, and it avoided the loop's mean turn (an estimate).
    assert spend.call_counted(True, True) == (1100, 0.75, 1100, 0.5)
    # A refused call after the stop without a turn of its own: the mean again; the turns
    # after the stop are not the stopped loop's.
    assert spend.call_counted(True, True, stopped=True) == (0, 0.0, 1100, 0.5)
    spend.add(USAGE, Cost(0.5, PROVIDER))
    assert spend.call_counted(True, True, stopped=True) == (1100, 0.5, 1100, 0.5)
    assert spend.current_loop() == Spent(2200, 1.0, 2, 0, False)
    assert (spend.loop_turns, spend.refused_after_stop) == (3, 3)


def test_a_new_loop_starts_empty_and_keeps_the_totals() -> None:
    spend = _spend(Cost(0.25, PROVIDER), Cost(0.25, PROVIDER))
    spend.new_loop()
    assert spend.current_loop() == Spent()
    assert (spend.loop_turns, spend.loop_tokens, spend.loop_usd) == (2, 2200, 0.5)


def test_a_new_epoch_of_the_session_ends_its_loop() -> None:
    state = SessionState(0.0)
    state.spend = _spend(Cost(0.25, PROVIDER))
    state.new_epoch()
    assert state.spend.current_loop() == Spent()


def test_the_run_adds_up_every_turn() -> None:
    spend = _spend(Cost(0.25, PROVIDER), Cost(None, UNPRICED), repeats=False)
    assert spend.run() == Spent(2200, 0.25, 2, 1, False)
    assert spend.run().plus(_spend(Cost(1.0, COMPUTED)).run()) == Spent(3300, 1.25, 3, 1, True)


def test_the_plain_data_carries_the_current_loop() -> None:
    spend = _spend(Cost(0.25, PROVIDER), Cost(None, UNPRICED), Cost(0.5, COMPUTED))
    spend.add(USAGE, Cost(0.5, COMPUTED))
    spend.ancestors = (("t/1", "planner"), ("t", None))
    spend.add_below(1100, None, apart=True)
    spend.add_below_loop(1100, 0.25)
    plain = spend.to_plain()
    assert len(plain) == 30
    back = Spend.from_plain(plain)
    for name in Spend.__slots__:
        assert getattr(back, name) == getattr(spend, name), name


#: What the last release wrote (13 items): a held turn of 1,100 tokens at $0.08.
OLD_PLAIN = [4, 4000, 400, 0, 0, 0.15, 0.0, 0, [1100, 0.08], 1, 1100, 0.02, 0]


def test_the_last_releases_plain_data_still_loads() -> None:
    spend = Spend.from_plain(OLD_PLAIN)
    assert (spend.calls, spend.loop_turns, spend.held) == (4, 1, (1100, 0.08))
    assert spend.current_loop() == Spent()  # not kept then: no loop running
    assert spend.held_source == COMPUTED  # a cost was held: said to be at API prices
    # The held turn still moves into the loop.
    assert spend.call_counted(True, False) == (1100, 0.08, 0, 0.0)
    assert spend.current_loop() == Spent(1100, 0.08, 1, 0, True)
    unpriced = Spend.from_plain([*OLD_PLAIN[:8], [1100, 0.0], *OLD_PLAIN[9:]])
    assert unpriced.held_source == UNPRICED


def test_an_old_snapshot_with_spend_still_restores() -> None:
    """A guard snapshot written by the last release: a session state whose spend is the
    13-item list."""
    guard = LoopGuard(PRESETS["default"])
    for _ in range(3):
        guard.model_call({"model": "m", "input_tokens": 10}, session="s")
        guard.before_tool("search", {"q": "x"}, session="s")
    snapshot = guard.snapshot()
    entry = snapshot["sessions"]["sessions"][0]
    entry["state"]["spend"] = OLD_PLAIN
    restored = LoopGuard(PRESETS["default"])
    restored.restore(snapshot)
    spend = restored.spend("s")
    assert spend is not None and spend.calls == 4 and spend.current_loop() == Spent()


@pytest.mark.parametrize(
    ("plain", "message"),
    [
        ([*OLD_PLAIN, "free", 0, 0, 0.0, 0, 0], "spend held source 'free'"),
        ([*OLD_PLAIN, UNPRICED, -1, 0, 0.0, 0, 0], "spend current loop turns"),
        ([*OLD_PLAIN, UNPRICED, 0, 0, "x", 0, 0], "spend current loop usd"),
        (OLD_PLAIN[:12], "bad spend"),
    ],
)
def test_bad_plain_data_names_the_field(plain: list[object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Spend.from_plain(plain)
