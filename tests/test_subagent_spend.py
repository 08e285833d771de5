"""A sub-agent's spend in its ancestors' totals (issue 24, item 3): the hook API's
``ancestors``, the span processor on a real TracerProvider, the trace buffer (exporter, serve,
replay), the state's plain data, run budgets across sessions, and a shared Redis."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_loopguard import PRESETS, Action, LoopGuard, Rule
from otel_loopguard._engine import SessionState
from otel_loopguard._spend import MAX_ANCESTORS, Spend
from otel_loopguard.exporter import LoopGuardSpanExporter
from otel_loopguard.processor import LoopGuardSpanProcessor

from .redis_tools import RedisServer, require_redis_server

DEFAULT = PRESETS["default"]
TURN = {"model": "scripted", "input_tokens": 1000, "output_tokens": 100}
TOKENS = 1100
PRICED = {"model": "scripted", "input_tokens": 1000, "output_tokens": 100, "reported_cost_usd": 0.5}


def _coder_loops(
    guard: LoopGuard, *, session: str, agent: str, above: list[tuple[str, str]]
) -> None:
    """Four turns of a sub-agent, each asking for the same call: three turns spent in a loop."""
    for _ in range(4):
        guard.model_call(PRICED, session=session, agent=agent, ancestors=above)
        guard.before_tool("grep", {"pattern": "x"}, session=session, agent=agent)


# -- the hook API ------------------------------------------------------------------------------


def test_a_sub_agents_turns_and_loop_show_in_each_ancestors_tree_total() -> None:
    guard = LoopGuard(DEFAULT)
    guard.model_call(PRICED, session="s", agent="planner")
    guard.before_tool("delegate", {"to": "coder"}, session="s", agent="planner")
    guard.model_call(PRICED, session="s/coder", agent="coder", ancestors=[("s", "planner")])
    _coder_loops(
        guard,
        session="s/coder/tester",
        agent="tester",
        above=[("s/coder", "coder"), ("s", "planner")],
    )
    tester = guard.spend("s/coder/tester", agent="tester")
    coder = guard.spend("s/coder", agent="coder")
    planner = guard.spend("s", agent="planner")
    assert tester is not None and coder is not None and planner is not None
    # Own figures are unchanged: each agent's own turns only.
    assert (planner.calls, coder.calls, tester.calls) == (1, 1, 4)
    assert tester.loop_turns == 3 and tester.loop_tokens == 3 * TOKENS
    # The tree: own plus every agent under it.
    assert planner.tree().turns == 6 and planner.tree().tokens == 6 * TOKENS
    assert planner.tree().usd == pytest.approx(3.0)
    assert coder.tree().turns == 5 and coder.tree().usd == pytest.approx(2.5)
    assert tester.tree() == tester.run()  # nothing under it
    # The sub-agent's loop cost shows in its parent's and grandparent's totals.
    assert coder.loop_turns == 0 and coder.tree_loop()[0] == 3 * TOKENS
    assert coder.tree_loop()[1] == pytest.approx(1.5)
    assert planner.tree_loop()[0] == 3 * TOKENS and planner.tree_loop()[1] == pytest.approx(1.5)
    assert guard.internal_errors == {}


def test_an_unpriced_sub_agent_turn_is_counted_unpriced_in_the_tree_not_as_zero() -> None:
    guard = LoopGuard(DEFAULT)
    guard.model_call(PRICED, session="s", agent="planner")
    guard.model_call(TURN, session="t", agent="coder", ancestors=[("s", "planner")])
    planner = guard.spend("s", agent="planner")
    assert planner is not None
    tree = planner.tree()
    assert (tree.turns, tree.unpriced, tree.tokens) == (2, 1, 2 * TOKENS)
    assert tree.usd == pytest.approx(0.5)


def test_ancestors_in_the_same_session_are_not_counted_twice_by_a_run_budget() -> None:
    # Keyed by conversation, a sub-agent is another agent of the same session: the run
    # budget already adds it up; its turns are in the parent's tree, not twice in the run.
    guard = LoopGuard(DEFAULT.replace(max_run_tokens=3 * TOKENS))
    guard.model_call(TURN, session="c", agent="planner")
    guard.before_tool("delegate", {"n": 0}, session="c", agent="planner")
    guard.model_call(TURN, session="c", agent="coder", ancestors=[("c", "planner")])
    guard.before_tool("edit", {"n": 0}, session="c", agent="coder")
    guard.model_call(TURN, session="c", agent="coder", ancestors=[("c", "planner")])
    # 3,300 tokens in the run: at the budget, not past it.
    assert guard.before_tool("edit", {"n": 1}, session="c", agent="coder").action is Action.ALLOW
    planner = guard.spend("c", agent="planner")
    assert planner is not None and planner.tree().tokens == 3 * TOKENS


def test_a_run_budget_counts_sub_agents_kept_under_other_sessions() -> None:
    # Keyed by trace, each agent span is its own session: the parent's run adds them up.
    guard = LoopGuard(DEFAULT.replace(max_run_tokens=3 * TOKENS))
    guard.model_call(TURN, session="t/1", agent="planner")
    assert guard.before_tool("delegate", {"n": 0}, session="t/1", agent="planner").action is (
        Action.ALLOW
    )
    for n in range(3):
        guard.model_call(TURN, session="t/2", agent="coder", ancestors=[("t/1", "planner")])
        guard.before_tool("edit", {"n": n}, session="t/2", agent="coder")
    # The sub-agent returns; the planner's next call is over the run's budget (4,400 tokens).
    stop = guard.before_tool("delegate", {"n": 1}, session="t/1", agent="planner")
    assert stop.action is Action.STOP and stop.rule is Rule.BUDGET
    assert "4,400 tokens" in stop.message


def test_bad_ancestors_are_a_counted_skip_never_raised() -> None:
    guard = LoopGuard(DEFAULT)
    assert guard.model_call(TURN, session="s", ancestors=["planner"]) is None  # type: ignore[list-item]
    assert guard.skipped_model_calls == {"ancestors": 1}
    assert guard.spend("s") is None
    assert guard.internal_errors == {}


def test_the_tree_travels_with_the_state_and_older_states_load() -> None:
    guard = LoopGuard(DEFAULT)
    _coder_loops(guard, session="child", agent="coder", above=[("parent", "planner")])
    parent = guard.export_session("parent", agent="planner")
    child = guard.export_session("child", agent="coder")
    assert parent is not None and child is not None
    back = SessionState.from_bytes(parent.to_bytes(), DEFAULT).spend
    assert back is not None and back.tree().turns == 4 and back.tree_loop()[0] == 3 * TOKENS
    kept = SessionState.from_bytes(child.to_bytes(), DEFAULT).spend
    assert kept is not None and kept.ancestors == (("parent", "planner"),)
    # The 19 items the release before sub-agents' spend wrote still load, with none.
    assert child.spend is not None
    old = Spend.from_plain(child.spend.to_plain()[:19])
    assert old.ancestors == () and old.tree() == old.run()
    with pytest.raises(ValueError, match="ancestor"):
        Spend.from_plain([*child.spend.to_plain()[:19], [["a"]], *child.spend.to_plain()[20:]])
    with pytest.raises(ValueError, match="ancestors"):
        too_many = [["s", None]] * (MAX_ANCESTORS + 1)
        Spend.from_plain([*child.spend.to_plain()[:19], too_many, *child.spend.to_plain()[20:]])


# -- spans: the processor and the trace buffer -------------------------------------------------


@contextmanager
def _agent(tracer: trace.Tracer, name: str) -> Iterator[None]:
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
    with tracer.start_as_current_span(f"invoke_agent {name}", attributes=attributes):
        yield


def _model(tracer: trace.Tracer) -> None:
    attributes: dict[str, str | int] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "scripted",
        "gen_ai.usage.input_tokens": 1000,
        "gen_ai.usage.output_tokens": 100,
    }
    with tracer.start_as_current_span("chat scripted", attributes=attributes):
        pass


def _tool(tracer: trace.Tracer, name: str, arguments: str) -> None:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.arguments": arguments,
    }
    with tracer.start_as_current_span(f"execute_tool {name}", attributes=attributes):
        pass


def _planner_with_a_looping_coder(tracer: trace.Tracer) -> None:
    """A planner agent whose tool runs a coder agent; the coder asks for one grep 4 times."""
    with _agent(tracer, "planner"):
        _model(tracer)
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "delegate",
            "gen_ai.tool.call.arguments": '{"to": "coder"}',
        }
        with (
            tracer.start_as_current_span("execute_tool delegate", attributes=attributes),
            _agent(tracer, "coder"),
        ):
            for _ in range(4):
                _model(tracer)
                _tool(tracer, "grep", '{"pattern": "x"}')
        _model(tracer)


def _trees(guard: LoopGuard) -> dict[str, tuple[int, int, int]]:
    """Agent label -> (own turns, tree turns, tree loop tokens), for each kept agent."""
    found = {}
    for entry in guard.snapshot()["sessions"]["sessions"]:
        spend = guard.spend(entry["session"], agent=entry["agent"])
        if spend is not None:
            found[entry["agent"]] = (spend.calls, spend.tree().turns, spend.tree_loop()[0])
    return found


EXPECTED = {"planner": (2, 6, 3 * TOKENS), "coder": (4, 4, 3 * TOKENS)}


def test_the_processor_charges_a_sub_agents_turns_and_loop_to_its_parent() -> None:
    guard = LoopGuard(DEFAULT)
    provider = TracerProvider()
    provider.add_span_processor(LoopGuardSpanProcessor(guard))
    _planner_with_a_looping_coder(provider.get_tracer("test"))
    provider.shutdown()
    assert _trees(guard) == EXPECTED
    assert guard.internal_errors == {}


def test_the_exporter_charges_what_the_processor_charges() -> None:
    guard = LoopGuard(DEFAULT)
    provider = TracerProvider()
    exporter = LoopGuardSpanExporter(guard, next=InMemorySpanExporter(), hold_seconds=None)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _planner_with_a_looping_coder(provider.get_tracer("test"))
    provider.shutdown()
    assert _trees(guard) == EXPECTED
    assert guard.internal_errors == {}


# -- a shared Redis: ancestors in other sessions, each in its own transaction --------------------


def test_ancestors_are_charged_through_a_shared_redis(tmp_path: Path) -> None:
    require_redis_server()
    server = RedisServer(tmp_path).start()
    try:
        writer = LoopGuard(DEFAULT, store=server.url)
        _coder_loops(writer, session="t/2", agent="coder", above=[("t/1", "planner")])
        writer.model_call(PRICED, session="t/1", agent="planner")
        reader = LoopGuard(DEFAULT, store=server.url)  # another process's guard
        planner = reader.spend("t/1", agent="planner")
        assert planner is not None
        assert (planner.calls, planner.tree().turns) == (1, 5)
        assert planner.tree_loop()[0] == 3 * TOKENS
        assert planner.tree_loop()[1] == pytest.approx(1.5)
        assert writer.store_errors == {} and writer.internal_errors == {}
    finally:
        server.stop()
