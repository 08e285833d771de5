"""Budgets in money and tokens (issue 24, item 5): the budget rule at its thresholds, on partial
data, across a progress epoch and over a run's agents; the texts and decision fields in money;
the token-only switch; the policy's price table; through the hook API, a real TracerProvider
with the span processor, and two guards on one Redis."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_loopguard import PRESETS, Action, Decision, LoopDetected, LoopGuard, Rule
from otel_loopguard._attributes import (
    ATTR_LOOP_COST_USD,
    ATTR_LOOP_TOKENS,
    ATTR_RULE,
    Shape,
    decision_attributes,
)
from otel_loopguard.config import CostUnit, Policy, load_policy, policy_from_env
from otel_loopguard.processor import LoopGuardSpanProcessor

from .redis_tools import RedisServer, redis_server
from .span_dumps import dump_id, dump_paths, load, rebuild

__all__ = ["redis_server"]  # the fixture, used by name

DEFAULT = PRESETS["default"]
#: One model turn: 1,100 tokens; its cost as the provider reported it (exact in binary).
TOKENS = 1100
TURN = {"model": "gpt-4o", "input_tokens": 1000, "output_tokens": 100, "reported_cost_usd": 0.25}
#: A model no price table knows: its tokens are counted, its cost is not.
UNPRICED_TURN = {"model": "scripted-loop", "input_tokens": 1000, "output_tokens": 100}


def _loop(
    guard: LoopGuard, calls: int, turn: dict[str, object] = TURN, **ids: str | None
) -> list[Decision]:
    """``calls`` model turns, each asking for the same search (outcome never reported: the
    default policy only reminds at 3 and 5 and denies from 6)."""
    session = ids.pop("session", None) or "s"
    agent = ids.pop("agent", None)
    assert not ids, ids
    decisions = []
    for _ in range(calls):
        guard.model_call(turn, session=session, agent=agent)
        decisions.append(guard.before_tool("search", {"q": "x"}, session=session, agent=agent))
    return decisions


# -- the thresholds: at the budget, just past it ----------------------------------------------


@pytest.mark.parametrize(
    ("budget", "stopped_at"),
    [
        # The first turn asked for a new call; turns 2, 3, ... for repeats: the loop has used
        # 1,100 x (n - 1) tokens once call n is counted.
        (2 * TOKENS, 4),  # exactly at the budget after call 3: not passed; call 4 passes it
        (2 * TOKENS - 1, 3),  # just past it at call 3
    ],
)
def test_a_token_budget_stops_the_first_call_after_it_is_passed(
    budget: int, stopped_at: int
) -> None:
    guard = LoopGuard(DEFAULT.replace(max_loop_tokens=budget))
    decisions = _loop(guard, 6)
    first = next(i for i, d in enumerate(decisions, 1) if d.action is Action.STOP)
    assert first == stopped_at
    stop = decisions[first - 1]
    assert stop.rule is Rule.BUDGET and stop.blocks
    assert stop.loop_tokens == (first - 1) * TOKENS
    # Whatever its count: the rules alone would only have reminded here.
    without = _loop(LoopGuard(DEFAULT), 6)
    assert all(d.action in (Action.ALLOW, Action.REMIND) for d in without[:stopped_at])
    # Every later call is stopped too, for the same reason.
    assert all(d.action is Action.STOP and d.rule is Rule.BUDGET for d in decisions[first:])


@pytest.mark.parametrize(("budget", "stopped_at"), [(0.5, 4), (0.49, 3)])
def test_a_dollar_budget_at_it_and_just_past_it(budget: float, stopped_at: int) -> None:
    guard = LoopGuard(DEFAULT.replace(max_loop_cost_usd=budget))
    decisions = _loop(guard, 5)
    first = next(i for i, d in enumerate(decisions, 1) if d.action is Action.STOP)
    assert first == stopped_at
    stop = decisions[first - 1]
    assert stop.rule is Rule.BUDGET
    assert stop.loop_cost_usd == pytest.approx(0.25 * (first - 1))
    assert stop.message.startswith("[loopguard] Stopping: this loop has used")
    # Every figure came from the provider: no "at API prices", no "about".
    assert f"${0.25 * (first - 1):.2f}, more than its budget of ${budget:.2f}" in stop.message
    assert "API prices" not in stop.message


def test_a_budget_stop_is_the_hosts_stop() -> None:
    """The same Action.STOP every hook and adapter handles; the guard's wrap raises it as a
    LoopDetected, never another error."""
    guard = LoopGuard(DEFAULT.replace(max_loop_tokens=TOKENS))

    def run_search(q: str) -> str:
        return "result"

    search = guard.wrap(run_search, session="s")

    outcomes = []
    for _ in range(3):
        guard.model_call(TURN, session="s")
        try:
            outcomes.append(search(q="x"))
        except LoopDetected as exc:
            outcomes.append(exc.code)
    assert outcomes == ["result", "result", "stop"]


def test_a_budget_stop_stops_the_session() -> None:
    guard = LoopGuard(DEFAULT.replace(max_loop_tokens=TOKENS))
    _loop(guard, 3)
    state = guard.export_session("s")
    assert state is not None and state.stopped
    # A new call, never seen: the session is stopped, for the budget's reason.
    other = guard.before_tool("read_file", {"path": "b"}, session="s")
    assert other.action is Action.STOP and other.rule is Rule.BUDGET


def test_a_budget_in_advise_and_observe_mode() -> None:
    """Advise: the stop becomes a reminder that says what was passed; observe: every call is
    allowed. Either way the run goes on, and so does what its loop costs."""
    advise = _loop(LoopGuard(DEFAULT.replace(mode="advise", max_loop_tokens=TOKENS)), 4)
    over = advise[2]
    assert (over.action, over.detected, over.rule) == (Action.REMIND, Action.STOP, Rule.BUDGET)
    assert over.message == (
        "[loopguard] Over budget: this loop has used 2,200 tokens, $0.50, more than its budget"
        " of 1,100 tokens. Stop repeating calls: use what you already have, or tell the user"
        " what is blocking you."
    )
    assert advise[3].loop_tokens == 3 * TOKENS
    observe = _loop(LoopGuard(DEFAULT.replace(mode="observe", max_loop_tokens=TOKENS)), 4)
    assert [d.action for d in observe] == [Action.ALLOW] * 4
    assert [d.detected for d in observe[2:]] == [Action.STOP] * 2
    assert [d.loop_tokens for d in observe[1:]] == [TOKENS, 2 * TOKENS, 3 * TOKENS]


# -- partial data ------------------------------------------------------------------------------


def test_a_dollar_budget_on_partial_data_says_so_and_counts_only_the_priced_turns() -> None:
    guard = LoopGuard(DEFAULT.replace(max_loop_cost_usd=0.3))
    decisions = []
    for i in range(5):
        guard.model_call(TURN if i % 2 else UNPRICED_TURN, session="s")
        decisions.append(guard.before_tool("search", {"q": "x"}, session="s"))
    # Loop turns 2..5: priced (0.25), unpriced, priced (0.50 > 0.30).
    remind = decisions[2]
    assert remind.action is Action.REMIND
    assert (
        "This loop has used 2,200 tokens, at least $0.25 (1 of its 2 model turns has no price,"
        " so its dollar budget counts only the others)." in remind.message
    )
    assert remind.loop_cost_usd == 0.25  # the known part
    stop = decisions[3]
    assert stop.action is Action.STOP and stop.rule is Rule.BUDGET
    assert "at least $0.50 (1 of its 3 model turns has no price" in stop.message


def test_a_dollar_budget_never_passes_silently_when_no_turn_has_a_price() -> None:
    guard = LoopGuard(DEFAULT.replace(max_loop_cost_usd=0.01))
    decisions = _loop(guard, 5, UNPRICED_TURN)
    assert not any(d.action is Action.STOP for d in decisions)
    remind = decisions[2]
    assert remind.action is Action.REMIND
    assert remind.loop_tokens == 2 * TOKENS and remind.loop_cost_usd is None
    assert (
        "This loop has used 2,200 tokens (none of its model turns has a price: its dollar"
        " budget cannot count it)." in remind.message
    )


def test_a_token_budget_applies_with_no_prices_at_all() -> None:
    guard = LoopGuard(DEFAULT.replace(max_loop_tokens=2 * TOKENS, max_loop_cost_usd=100.0))
    decisions = _loop(guard, 5, UNPRICED_TURN)
    stop = decisions[3]
    assert stop.action is Action.STOP and stop.rule is Rule.BUDGET
    assert stop.loop_tokens == 3 * TOKENS and stop.loop_cost_usd is None
    assert "3,300 tokens (none of its model turns has a price" in stop.message
    assert "more than its budget of 2,200 tokens" in stop.message


# -- the loop now running ----------------------------------------------------------------------


def test_progress_starts_a_new_loop_with_nothing_spent() -> None:
    guard = LoopGuard(DEFAULT.replace(max_loop_tokens=3 * TOKENS))
    decisions = _loop(guard, 4)  # loop: 3 turns, 3,300 tokens, at the budget
    assert not any(d.blocks for d in decisions)
    guard.model_call(TURN, session="s")
    guard.before_tool("write_file", {"path": "a", "text": "x"}, session="s")
    guard.after_tool("write_file", {"path": "a", "text": "x"}, session="s", result="ok")
    spend = guard.spend("s")
    assert spend is not None
    assert spend.current_loop().turns == 0 and spend.loop_turns == 3  # in all: kept
    # A new loop: its budget starts again (four more repeats would pass 3,300 in all).
    again = _loop(guard, 4)
    assert not any(d.blocks for d in again)
    assert again[-1].loop_tokens == 3 * TOKENS
    assert _loop(guard, 1)[0].rule is Rule.BUDGET


def test_a_user_message_lifts_a_loop_budget_stop() -> None:
    guard = LoopGuard(DEFAULT.replace(max_loop_tokens=TOKENS))
    assert _loop(guard, 3)[-1].rule is Rule.BUDGET
    guard.user_message("s", text="try another way")
    assert _loop(guard, 1)[0].action is Action.ALLOW


def test_turns_after_the_stop_are_not_the_stopped_loops() -> None:
    guard = LoopGuard(DEFAULT.replace(max_loop_tokens=TOKENS))
    decisions = _loop(guard, 6)
    assert [d.loop_tokens for d in decisions[2:]] == [2 * TOKENS] * 4
    spend = guard.spend("s")
    assert spend is not None
    assert spend.loop_turns == 5  # every repeat's turn is loop spend in all
    assert spend.current_loop().turns == 2


# -- the run: the session and its agents -------------------------------------------------------


def test_a_run_budget_adds_up_every_agent_of_the_session() -> None:
    guard = LoopGuard(DEFAULT.replace(max_run_tokens=3 * TOKENS))
    # No loop anywhere: each agent calls something new each time.
    for i in range(2):
        guard.model_call(TURN, session="s", agent="planner")
        planner = guard.before_tool("plan", {"step": i}, session="s", agent="planner")
        assert planner.action is Action.ALLOW
    guard.model_call(TURN, session="s", agent="coder")
    assert guard.before_tool("edit", {"n": 0}, session="s", agent="coder").action is Action.ALLOW
    # 3,300 tokens in all: at the budget. One more turn of the coder passes it.
    guard.model_call(TURN, session="s", agent="coder")
    stop = guard.before_tool("edit", {"n": 1}, session="s", agent="coder")
    assert stop.action is Action.STOP and stop.rule is Rule.BUDGET
    assert stop.loop_tokens is None  # no loop: the run's budget
    assert "this run (every model call of the session, its agents' included) has used" in (
        stop.message
    )
    assert "4,400 tokens" in stop.message and "more than its budget of 3,300 tokens" in stop.message
    # The other agent of the same run is stopped at its next call, whatever it calls.
    planner = guard.before_tool("plan", {"step": 9}, session="s", agent="planner")
    assert planner.action is Action.STOP and planner.rule is Rule.BUDGET
    # A user message starts a new epoch, but the run's budget stays spent.
    guard.user_message("s")
    again = guard.before_tool("plan", {"step": 10}, session="s", agent="planner")
    assert again.action is Action.STOP and again.rule is Rule.BUDGET
    # Another session is another run.
    assert guard.before_tool("plan", {"step": 0}, session="t", agent="planner").action is (
        Action.ALLOW
    )


def test_a_run_budget_in_dollars_says_what_the_run_has_cost() -> None:
    guard = LoopGuard(DEFAULT.replace(max_run_cost_usd=1.0))
    decisions = _loop(guard, 5, agent="a")
    remind = decisions[2]
    assert remind.action is Action.REMIND
    assert remind.message.endswith(
        "This loop has used 2,200 tokens, $0.50. This run has used 3,300 tokens, $0.75."
    )
    stop = decisions[4]
    assert stop.rule is Rule.BUDGET and "$1.25, more than its budget of $1.00" in stop.message


# -- texts in money, and unchanged without usage -----------------------------------------------


def test_texts_are_unchanged_when_no_model_usage_was_reported() -> None:
    with_usage = _loop(LoopGuard(DEFAULT), 8)
    plain = LoopGuard(DEFAULT)
    without = [plain.before_tool("search", {"q": "x"}, session="s") for _ in range(8)]
    assert [d.action for d in with_usage] == [d.action for d in without]
    for spent, bare in zip(with_usage, without):
        assert bare.loop_tokens is None and bare.loop_cost_usd is None
        if not bare.message:
            assert not spent.message
            continue
        sentence = f" This loop has used {spent.loop_tokens:,} tokens, ${spent.loop_cost_usd:.2f}."
        head, _, tail = bare.message.partition("\nArguments: ")
        # The same text, with one sentence before the arguments line.
        assert spent.message == head + sentence + (f"\nArguments: {tail}" if tail else ""), (
            spent.message
        )


def test_a_computed_cost_is_about_at_api_prices() -> None:
    """The policy's price table prices the turns: computed, so "about ... at API prices"."""
    policy = DEFAULT.replace(prices={"gpt-4o": {"input": 2.5, "output": 10.0}})
    guard = LoopGuard(policy)
    computed = {"model": "gpt-4o", "input_tokens": 1_000_000, "output_tokens": 200_000}
    remind = _loop(guard, 3, computed)[2]
    # Two loop turns of $2.50 + $2.00.
    assert remind.loop_cost_usd == pytest.approx(9.0)
    assert "This loop has used 2.4M tokens, about $9.00 at API prices." in remind.message


def test_the_price_table_wins_over_the_database_not_over_the_provider() -> None:
    policy = DEFAULT.replace(prices={"gpt-*": {"input": 1.0, "output": 1.0}})
    guard = LoopGuard(policy)
    turn = {"model": "gpt-4o", "input_tokens": 500_000, "output_tokens": 500_000}
    guard.model_call(turn, session="s")
    guard.model_call({**turn, "reported_cost_usd": 0.125}, session="t")
    s, t = guard.spend("s"), guard.spend("t")
    assert s is not None and t is not None
    assert (s.computed_usd, t.provider_usd, t.computed_usd) == (1.0, 0.125, 0.0)


def test_a_token_only_policy_gives_no_money_figure() -> None:
    policy = DEFAULT.replace(cost_in="tokens", max_loop_tokens=3 * TOKENS)
    assert policy.cost_in is CostUnit.TOKENS
    decisions = _loop(LoopGuard(policy), 5)
    remind, stop = decisions[2], decisions[4]
    assert remind.message.endswith("This loop has used 2,200 tokens.")
    assert (remind.loop_tokens, remind.loop_cost_usd) == (2 * TOKENS, None)
    assert stop.rule is Rule.BUDGET and "$" not in stop.message
    assert "4,400 tokens, more than its budget of 3,300 tokens" in stop.message
    attributes = decision_attributes(stop, Shape.SPAN)
    assert attributes[ATTR_LOOP_TOKENS] == 4 * TOKENS and ATTR_LOOP_COST_USD not in attributes


@pytest.mark.parametrize("field", ["max_loop_cost_usd", "max_run_cost_usd"])
def test_a_dollar_budget_with_a_token_only_policy_is_a_config_error(field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: 2\.0 is a dollar budget, and cost_in="):
        DEFAULT.replace(cost_in="tokens", **{field: 2.0})


def test_big_figures_read_as_people_say_them() -> None:
    from otel_loopguard._policy import tokens_text, usd_text

    assert [tokens_text(n) for n in (812, 9_999, 35_240, 999_949, 999_950, 1_234_567)] == [
        "812",
        "9,999",
        "35.2k",
        "999.9k",
        "1M",
        "1.2M",
    ]
    assert [usd_text(x) for x in (3.4, 0.009176, 0.0, 1234.5, 0.00001)] == [
        "$3.40",
        "$0.0092",
        "$0.00",
        "$1,234.50",
        "under $0.0001",
    ]


# -- decision fields ---------------------------------------------------------------------------


def test_the_loop_fields_in_every_shape_only_when_known() -> None:
    decision = _loop(LoopGuard(DEFAULT), 3)[2]
    assert (decision.loop_tokens, decision.loop_cost_usd) == (2 * TOKENS, 0.5)
    span = decision_attributes(decision, Shape.SPAN)
    assert (span[ATTR_LOOP_TOKENS], span[ATTR_LOOP_COST_USD]) == (2 * TOKENS, 0.5)
    for shape in (Shape.LOG, Shape.API, Shape.TRIP):
        shown = decision_attributes(decision, shape)
        assert (shown["loop_tokens"], shown["loop_cost_usd"]) == (2 * TOKENS, 0.5), shape
    bare = dataclasses.replace(decision, loop_tokens=None, loop_cost_usd=None)
    for shape in Shape:
        shown = decision_attributes(bare, shape)
        assert not {"loop_tokens", "loop_cost_usd", ATTR_LOOP_TOKENS} & set(shown), shape


def test_the_trip_line_carries_the_loop_spend(tmp_path: Path) -> None:
    trips = tmp_path / "trips.jsonl"
    guard = LoopGuard(DEFAULT.replace(trip_log_path=str(trips), max_loop_cost_usd=0.5))
    _loop(guard, 4)
    lines = [json.loads(line) for line in trips.read_text().splitlines()]
    assert [(line["action"], line["rule"]) for line in lines] == [
        ("remind", "consecutive"),
        ("stop", "budget"),
    ]
    assert [(line["loop_tokens"], line["loop_cost_usd"]) for line in lines] == [
        (2200, 0.5),
        (3300, 0.75),
    ]


# -- the policy fields -------------------------------------------------------------------------


def test_the_plugin_presets_are_unchanged() -> None:
    for name, preset in PRESETS.items():
        assert (
            preset.max_loop_cost_usd,
            preset.max_loop_tokens,
            preset.max_run_cost_usd,
            preset.max_run_tokens,
            preset.prices,
            preset.cost_in,
        ) == (None, None, None, None, (), CostUnit.USD), name
        assert Rule.BUDGET not in preset.rules, name
    assert DEFAULT.rules == {Rule.CONSECUTIVE, Rule.WINDOW, Rule.NO_PROGRESS, Rule.STALL}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_loop_cost_usd": -1}, r"^max_loop_cost_usd: expected US dollars, a number > 0"),
        ({"max_run_cost_usd": "1"}, r"^max_run_cost_usd: expected a finite number, got '1'"),
        ({"max_loop_tokens": 0}, r"^max_loop_tokens: expected a positive integer, got 0"),
        ({"max_run_tokens": 1.5}, r"^max_run_tokens: expected a positive integer, got 1\.5"),
        ({"prices": {"m": {"input": -1, "output": 1}}}, r"^prices\['m'\]\.input: expected USD"),
        ({"prices": {"m": {"input": "x", "output": 1}}}, r"^prices\['m'\]\.input: .*'x'"),
        ({"prices": {"m": {"input": 1}}}, r"^prices\['m'\]\.output: expected USD"),
        ({"prices": {"m": {"input": 1, "output": 1, "extra": 2}}}, r"unknown field\(s\) extra"),
        ({"prices": {"m": 3}}, r"^prices\['m'\]: expected a table"),
        ({"prices": ["m"]}, r"^prices: expected a table of model name or pattern"),
        ({"cost_in": "eur"}, r"^cost_in: 'eur' is not one of usd, tokens"),
        ({"rules": ["consecutive", "budget"]}, r"^rules: budget is not a rule to list here"),
    ],
)
def test_bad_budget_and_price_config_names_the_field_and_value(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Policy(**changes)  # type: ignore[arg-type]


def test_budgets_and_prices_from_toml(tmp_path: Path) -> None:
    nested = tmp_path / "nested.toml"
    nested.write_text(
        "[loopguard]\nmax_loop_cost_usd = 1.5\nmax_run_tokens = 2_000_000\ncost_in = 'usd'\n"
        "[loopguard.prices]\n'my-model*' = { input = 0.5, output = 1.5, cache_read = 0.05 }\n"
    )
    top = tmp_path / "top.toml"
    top.write_text(
        "max_loop_tokens = 500_000\nmax_run_cost_usd = false\n"
        "[prices.'my-model']\ninput = 0.5\noutput = 1.5\n"
    )
    policy = load_policy(config_path=nested, environ={})
    assert (policy.max_loop_cost_usd, policy.max_run_tokens) == (1.5, 2_000_000)
    ((pattern, price),) = policy.prices
    assert (pattern, price.input, price.output, price.cache_read) == ("my-model*", 0.5, 1.5, 0.05)
    other = load_policy(config_path=top, environ={})
    assert (other.max_loop_tokens, other.max_run_cost_usd) == (500_000, None)
    assert other.prices[0][0] == "my-model"
    bad = tmp_path / "bad.toml"
    bad.write_text("[prices.'my-model']\ninput = -2\noutput = 1\n")
    with pytest.raises(ValueError, match=r"bad\.toml'.*prices\['my-model'\]\.input: .*-2"):
        load_policy(config_path=bad, environ={})


def test_budgets_and_prices_from_the_environment(caplog: pytest.LogCaptureFixture) -> None:
    policy = policy_from_env(
        environ={
            "LOOPGUARD_MAX_LOOP_COST_USD": "$2.50",
            "LOOPGUARD_MAX_RUN_TOKENS": "1000000",
            "LOOPGUARD_PRICES": '{"m*": {"input": 1, "output": 2}}',
            "LOOPGUARD_COST_IN": "usd",
        }
    )
    assert (policy.max_loop_cost_usd, policy.max_run_tokens) == (2.5, 1_000_000)
    assert policy.prices[0][0] == "m*" and policy.prices[0][1].output == 2
    caplog.set_level("WARNING", logger="otel_loopguard")
    kept = policy_from_env(
        environ={
            "LOOPGUARD_MAX_LOOP_TOKENS": "lots",
            "LOOPGUARD_MAX_RUN_COST_USD": "-3",
            "LOOPGUARD_PRICES": '{"m": {"input": -1, "output": 2}}',
        }
    )
    assert (kept.max_loop_tokens, kept.max_run_cost_usd, kept.prices) == (None, None, ())
    warned = caplog.text
    for variable in ("LOOPGUARD_MAX_LOOP_TOKENS", "LOOPGUARD_MAX_RUN_COST_USD", "LOOPGUARD_PRICES"):
        assert f"{variable}=" in warned, variable
    assert "prices['m'].input" in warned


# -- through a real TracerProvider, and through Redis ------------------------------------------


def test_the_processor_stops_a_loop_past_its_budget_on_a_real_dump() -> None:
    """The Strands dump through a real TracerProvider: its model spans report 15 tokens a
    turn; priced by the policy's table, a loop budget of 44 tokens stops the third looping
    turn's call, and its decision event carries the loop's tokens and cost."""
    path = next(p for p in dump_paths() if dump_id(p) == "strands/spans.jsonl")
    policy = DEFAULT.replace(
        max_loop_tokens=44, prices={"scripted-*": {"input": 1.0, "output": 2.0}}
    )
    guard = LoopGuard(policy)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(LoopGuardSpanProcessor(guard, tracer_provider=provider))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rebuild(load(path), provider.get_tracer("fixture"))
    provider.shutdown()
    shown = [
        dict(event.attributes or {})
        for span in exporter.get_finished_spans()
        for event in span.events
        if event.name == "loopguard.decision"
    ]
    budget = [a for a in shown if a.get(ATTR_RULE) == "budget"]
    assert budget, shown
    first = budget[0]
    assert first["loopguard.action"] == "stop"
    # Three looping turns of 10 input and 5 output tokens at $1 and $2 per million.
    assert first[ATTR_LOOP_TOKENS] == 45
    assert first[ATTR_LOOP_COST_USD] == pytest.approx(3 * (10 * 1.0 + 5 * 2.0) / 1e6)
    # Before it, the loop's decisions (a reminder) carry what it had used then.
    earlier = [a.get(ATTR_LOOP_TOKENS) for a in shown[: shown.index(first)]]
    assert earlier == [30], shown  # the reminder at the third search: two looping turns


def test_two_guards_on_one_redis_share_the_loop_budget(redis_server: RedisServer) -> None:
    policy = DEFAULT.replace(max_loop_cost_usd=0.5)
    a = LoopGuard(policy, store=redis_server.url)
    b = LoopGuard(policy, store=redis_server.url)
    decisions = []
    for i in range(4):
        turn, call = (a, b) if i % 2 else (b, a)
        turn.model_call(TURN, session="s", agent="x")
        decisions.append(call.before_tool("search", {"q": "x"}, session="s", agent="x"))
    # Loop: 0.25 after call 2, 0.50 after call 3 (at the budget), 0.75 at call 4 (past it).
    assert [d.action for d in decisions[:3]] == [Action.ALLOW, Action.ALLOW, Action.REMIND]
    stop = decisions[3]
    assert stop.action is Action.STOP and stop.rule is Rule.BUDGET
    assert stop.loop_cost_usd == pytest.approx(0.75)
    # The other guard sees the same stopped loop.
    again = b.before_tool("search", {"q": "x"}, session="s", agent="x")
    assert again.rule is Rule.BUDGET and again.loop_cost_usd == pytest.approx(0.75)
    assert a.store_errors == {} and b.store_errors == {}


def test_two_guards_on_one_redis_share_the_run_budget_over_agents(
    redis_server: RedisServer,
) -> None:
    """A run budget over two agents, each on its own guard (process), one Redis: the run's
    figure is every agent's state in the store, not what one guard has seen."""
    policy = DEFAULT.replace(max_run_tokens=3 * TOKENS)
    planner_guard = LoopGuard(policy, store=redis_server.url)
    coder_guard = LoopGuard(policy, store=redis_server.url)
    for i in range(2):
        planner_guard.model_call(TURN, session="r", agent="planner")
        step = planner_guard.before_tool("plan", {"step": i}, session="r", agent="planner")
        assert step.action is Action.ALLOW
    coder_guard.model_call(TURN, session="r", agent="coder")
    first = coder_guard.before_tool("edit", {"n": 0}, session="r", agent="coder")
    assert first.action is Action.ALLOW  # 3,300 tokens: at the budget
    coder_guard.model_call(TURN, session="r", agent="coder")
    stop = coder_guard.before_tool("edit", {"n": 1}, session="r", agent="coder")
    assert stop.action is Action.STOP and stop.rule is Rule.BUDGET
    assert "4,400 tokens" in stop.message
    # The planner's guard, which saw only its own two turns, stops the planner too.
    planner = planner_guard.before_tool("plan", {"step": 9}, session="r", agent="planner")
    assert planner.action is Action.STOP and planner.rule is Rule.BUDGET
    assert planner_guard.store_errors == {} and coder_guard.store_errors == {}


def test_turns_that_report_zero_usage_add_no_cost_sentence() -> None:
    """A scripted model's turns with zero tokens and no cost: the texts stay as without usage
    ("This loop has used 0 tokens" tells the model nothing)."""
    quiet, told = LoopGuard(DEFAULT), LoopGuard(DEFAULT)
    zero = {"model": "scripted", "input_tokens": 0, "output_tokens": 0}
    for _ in range(8):
        told.model_call(zero, session="z")
        with_usage = told.before_tool("search", {"q": "x"}, session="z")
        without = quiet.before_tool("search", {"q": "x"}, session="z")
        assert with_usage.message == without.message
    assert with_usage.action is Action.DENY and "has used" not in with_usage.message


def test_loop_spend_and_the_avoided_estimate_reach_the_metrics() -> None:
    """The real Prometheus recorder: what each counted call moved into loop spend, and what
    each call refused because the run was stopped avoided (the loop's mean turn, an estimate)."""
    from otel_loopguard.metrics import PrometheusRecorder

    recorder = PrometheusRecorder()
    guard = LoopGuard(DEFAULT.replace(max_loop_cost_usd=0.5), recorder=recorder)
    _loop(guard, 6, agent="coder")  # stopped at call 4 (loop $0.75): calls 4, 5, 6 refused

    def value(name: str) -> float:
        found = recorder.registry.get_sample_value(name, {"agent": "coder"})
        return 0.0 if found is None else found

    # Loop turns 2-4 before the stop, 5-6 after it: loop spend in all.
    assert value("loopguard_loop_tokens_total") == 5 * TOKENS
    assert value("loopguard_loop_cost_usd_total") == pytest.approx(1.25)
    # Each refused call avoided the loop's mean turn at that time: 1,100 tokens, $0.25.
    assert value("loopguard_avoided_tokens_total") == 3 * TOKENS
    assert value("loopguard_avoided_cost_usd_total") == pytest.approx(0.75)
    guard.close()
