"""The trace buffer shared by replay and serve: live flushing by time, parents after children."""

from __future__ import annotations

import pytest

from otel_loopguard.guard import LoopGuard
from otel_loopguard.config import PRESETS
from otel_loopguard.policy import Action
from otel_loopguard.traces import (
    CallObserved,
    RecordedSpan,
    TraceBuffer,
    TraceEvent,
    feed,
)

from .conftest import FakeClock

TRACE = 0xABC
AGENT = 0xA1
HOLD = 2.0


def agent_span(span_id: int = AGENT, parent: int | None = 0xF00, name: str = "planner",
               start: int = 0, end: int = 10_000) -> RecordedSpan:
    return RecordedSpan(TRACE, span_id, parent, f"invoke_agent {name}",
                        {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name},
                        (), False, start, end)


def tool_span(span_id: int, parent: int | None = AGENT, start: int = 0,
              query: str = "x") -> RecordedSpan:
    return RecordedSpan(TRACE, span_id, parent, "execute_tool search",
                        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                         "gen_ai.tool.call.arguments": f'{{"q": "{query}"}}',
                         "gen_ai.tool.call.result": "same"},
                        (), False, start + 1, start + 2)


def sessions(events: list[TraceEvent]) -> list[tuple[str, str | None]]:
    return [(event.session, event.agent) for event in events]


WITH_AGENT = (f"{TRACE:032x}/{AGENT:016x}", "planner")
BARE = (f"{TRACE:032x}", None)


def test_without_hold_nothing_is_due() -> None:
    buffer = TraceBuffer()
    buffer.add(tool_span(1))
    assert buffer.take_ready() == [] and buffer.take_due() == []
    assert sessions(buffer.finish()) == [BARE]


def test_children_before_parents_find_their_agent_within_the_hold() -> None:
    clock = FakeClock()
    buffer = TraceBuffer(hold_seconds=HOLD, clock=clock)
    for n in range(3):  # three requests, each with one tool span; the agent comes later
        buffer.add(tool_span(10 + n, start=n * 10))
        assert buffer.take_ready() == [] and buffer.take_due() == []
        clock.advance(HOLD / 4)
    buffer.add(agent_span())  # a child of the root, not the root: still held
    assert buffer.take_ready() == []
    clock.advance(HOLD / 4)  # the first tool span has now waited exactly HOLD
    events = buffer.take_due()
    assert sessions(events) == [WITH_AGENT] * 3
    assert [e.timestamp for e in events] == sorted(e.timestamp or 0 for e in events)
    assert buffer.flushed_early == 1


def test_a_root_flushes_at_once() -> None:
    clock = FakeClock()
    buffer = TraceBuffer(hold_seconds=HOLD, clock=clock)
    buffer.add(tool_span(11, parent=AGENT))
    buffer.add(RecordedSpan(TRACE, AGENT, None, "invoke_agent planner",
                            {"gen_ai.operation.name": "invoke_agent",
                             "gen_ai.agent.name": "planner"}, (), False, 0, 100))
    assert sessions(buffer.take_ready()) == [WITH_AGENT]
    assert buffer.buffered_traces == 0 and buffer.flushed_early == 0


def test_after_the_hold_a_run_stays_in_one_chain() -> None:
    """Tool spans flushed before their agent arrived keep the trace's chain for the whole run,
    so a loop spread over several exports is still one loop."""
    clock = FakeClock()
    buffer = TraceBuffer(hold_seconds=HOLD, clock=clock)
    got: list[TraceEvent] = []
    for n in range(4):
        buffer.add(tool_span(20 + n, start=n * 10))
        clock.advance(HOLD)
        got += buffer.take_due()
    buffer.add(agent_span())  # the run's agent span ends last
    buffer.add(tool_span(30, start=50))  # a tool span in the same batch as its agent
    clock.advance(HOLD)
    got += buffer.take_due()
    assert sessions(got) == [BARE] * 5
    assert buffer.flushed_early == 5
    guard = LoopGuard(PRESETS["default"])
    decisions = [feed(guard, event) for event in got]
    assert [d.detected for d in decisions if d is not None][3] is Action.DENY


def test_idle_traces_are_forgotten_and_memory_is_bounded() -> None:
    clock = FakeClock()
    buffer = TraceBuffer(max_spans=3, hold_seconds=HOLD, trace_ttl_seconds=10, clock=clock)
    buffer.add(tool_span(1))
    clock.advance(HOLD)
    assert len(buffer.take_due()) == 1
    assert buffer.buffered_spans == 1  # its parent link is kept for later spans
    clock.advance(10)
    assert buffer.take_due() == [] and buffer.buffered_traces == 0
    for n in range(4):
        buffer.add(RecordedSpan(n + 1, 5, 4, "other", {}, (), False, 0, 1))
    assert buffer.take_ready() == [] and buffer.replayed_early == 1
    assert buffer.buffered_spans == 3


def test_a_retried_span_counts_once_after_a_partial_flush() -> None:
    clock = FakeClock()
    buffer = TraceBuffer(hold_seconds=HOLD, clock=clock)
    buffer.add(tool_span(1))
    clock.advance(HOLD)
    assert len(buffer.take_due()) == 1
    buffer.add(tool_span(1))  # the exporter sent the same batch again
    clock.advance(HOLD)
    assert buffer.take_due() == []


@pytest.mark.parametrize("bad", [-1.0, float("inf"), True, "2"])
def test_bad_hold_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="hold_seconds"):
        TraceBuffer(hold_seconds=bad)  # type: ignore[arg-type]


def test_feed_is_what_the_processor_calls() -> None:
    guard = LoopGuard(PRESETS["default"])
    event = CallObserved("s", None, "search", {"q": 1}, result="same")
    decisions = [feed(guard, event) for _ in range(4)]
    assert [d.action if d else None for d in decisions][-1] is Action.DENY
