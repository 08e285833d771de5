"""The trace buffer shared by replay and serve: live flushing by time, parents after children."""

from __future__ import annotations

import pytest

from otel_loopguard._guard import LoopGuard
from otel_loopguard._otlp_json import RecordedSpan
from otel_loopguard._policy import Action
from otel_loopguard._trace_events import CallObserved, TraceEvent, feed
from otel_loopguard._traces import MAX_BUFFERED_SPANS, TraceBuffer
from otel_loopguard.config import PRESETS

from .conftest import FakeClock

TRACE = 0xABC
AGENT = 0xA1
HOLD = 2.0


def agent_span(
    span_id: int = AGENT,
    parent: int | None = 0xF00,
    name: str = "planner",
    start: int = 0,
    end: int = 10_000,
) -> RecordedSpan:
    return RecordedSpan(
        TRACE,
        span_id,
        parent,
        f"invoke_agent {name}",
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name},
        (),
        False,
        start,
        end,
    )


def tool_span(
    span_id: int, parent: int | None = AGENT, start: int = 0, query: str = "x"
) -> RecordedSpan:
    return RecordedSpan(
        TRACE,
        span_id,
        parent,
        "execute_tool search",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search",
            "gen_ai.tool.call.arguments": f'{{"q": "{query}"}}',
            "gen_ai.tool.call.result": "same",
        },
        (),
        False,
        start + 1,
        start + 2,
    )


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
    assert buffer.flushed_early_time == 1 and buffer.agents_lost == 0


def test_a_root_flushes_at_once() -> None:
    clock = FakeClock()
    buffer = TraceBuffer(hold_seconds=HOLD, clock=clock)
    buffer.add(tool_span(11, parent=AGENT))
    buffer.add(
        RecordedSpan(
            TRACE,
            AGENT,
            None,
            "invoke_agent planner",
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner"},
            (),
            False,
            0,
            100,
        )
    )
    assert sessions(buffer.take_ready()) == [WITH_AGENT]
    assert buffer.buffered_traces == 0 and buffer.flushed_early_time == 0


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
    assert buffer.flushed_early_time == 5
    assert buffer.agents_lost == 1  # the agent span came after its tools were judged: one run
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
    assert buffer.take_ready() == [] and buffer.flushed_early_capacity == 1
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


def test_a_retried_batch_counts_once_after_its_trace_was_flushed_and_forgotten() -> None:
    buffer = TraceBuffer()
    batch = [tool_span(1), tool_span(2), agent_span(parent=None)]
    for span in batch:
        buffer.add(span)
    assert len(buffer.take_ready()) == 2 and buffer.buffered_traces == 0
    for span in batch:  # the exporter lost the 200 and sent the batch again
        buffer.add(span)
    buffer.add_link(TRACE, 0xF00, None)  # a new span of the same trace still counts
    assert buffer.take_ready() == [] and buffer.finish() == []
    assert buffer.duplicate_spans == 3


def test_remembered_span_ids_are_bounded_to_the_most_recent() -> None:
    buffer = TraceBuffer(max_seen_spans=4)
    for trace_id in range(1, 11):
        buffer.add_link(trace_id, 1, None)
        buffer.take_ready()
    buffer.add_link(10, 1, None)  # recent: dropped
    buffer.add_link(1, 1, None)  # long forgotten: counted again
    assert buffer.duplicate_spans == 1 and buffer.buffered_spans == 1


@pytest.mark.parametrize("bad", [1, 0, True, "4"])
def test_bad_max_seen_spans_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="max_seen_spans"):
        TraceBuffer(max_seen_spans=bad)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_million_distinct_trace_ids_stay_within_the_bounds() -> None:
    clock = FakeClock()
    buffer = TraceBuffer(hold_seconds=HOLD, clock=clock)
    add_link = buffer.add_link
    most = 0
    for trace_id in range(1, 1_000_001):
        add_link(trace_id, 1, 2)  # no root: only the span cap flushes them
        if trace_id % 1000 == 0:
            buffer.take_ready()
            most = max(most, buffer.buffered_spans)
    assert most <= MAX_BUFFERED_SPANS and buffer.buffered_traces <= MAX_BUFFERED_SPANS
    assert buffer.flushed_early_capacity >= 1_000_000 - MAX_BUFFERED_SPANS
    assert len(buffer._seen) + len(buffer._seen_before) <= buffer._seen_max * 2
    clock.advance(301)
    buffer.take_due()
    assert buffer.buffered_traces == 0


@pytest.mark.parametrize("bad", [-1.0, float("inf"), True, "2"])
def test_bad_hold_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="hold_seconds"):
        TraceBuffer(hold_seconds=bad)  # type: ignore[arg-type]


def test_feed_is_what_the_processor_calls() -> None:
    guard = LoopGuard(PRESETS["default"])
    event = CallObserved("s", None, "search", {"q": 1}, result="same")
    decisions = [feed(guard, event) for _ in range(4)]
    assert [d.action if d else None for d in decisions][-1] is Action.DENY


def test_a_tool_span_without_arguments_is_fed_only_when_the_policy_counts_it() -> None:
    # The MCP SDK's server span: the tool's name and nothing of the call.
    span = RecordedSpan(
        TRACE,
        0xB1,
        None,
        "tools/call search",
        {
            "mcp.method.name": "tools/call",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search",
        },
        (),
        False,
        1,
        2,
    )
    buffer = TraceBuffer()
    buffer.add(span)
    (event,) = buffer.take_ready()
    assert isinstance(event, CallObserved)
    assert (event.tool, event.arguments, event.without_arguments) == ("search", {}, True)
    skipping = LoopGuard(PRESETS["default"])
    assert [feed(skipping, event) for _ in range(8)] == [None] * 8
    counting = LoopGuard(PRESETS["default"].replace(count_calls_without_arguments=True))
    decisions = [feed(counting, event) for _ in range(PRESETS["default"].deny_threshold or 6)]
    assert all(d is not None for d in decisions)
    assert decisions[-1] is not None and decisions[-1].action is Action.DENY
    assert decisions[-1].tool == "search"


# -- keyed by conversation -----------------------------------------------------------------


def conversation_trace(trace_id: int, runs: int, calls: int) -> list[RecordedSpan]:
    """``runs`` agent runs of one conversation in one trace, each making ``calls`` searches."""
    spans: list[RecordedSpan] = []
    for run in range(runs):
        agent_id = 0x100 + run
        start = run * 1_000
        for n in range(calls):
            spans.append(
                RecordedSpan(
                    trace_id,
                    0x200 + run * 100 + n,
                    agent_id,
                    "execute_tool search",
                    {
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "search",
                        "gen_ai.tool.call.arguments": '{"q": "x"}',
                        "gen_ai.tool.call.result": "r",
                    },
                    (),
                    False,
                    start + 10 * n + 1,
                    start + 10 * n + 2,
                )
            )
        spans.append(
            RecordedSpan(
                trace_id,
                agent_id,
                None,
                "invoke_agent planner",
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": "planner",
                    "gen_ai.conversation.id": "conv-7",
                },
                (),
                False,
                start,
                start + 900,
            )
        )
    return spans


def counts_fed(buffer: TraceBuffer, spans: list[RecordedSpan]) -> list[int]:
    guard = LoopGuard(PRESETS["default"])
    out = []
    for span in spans:
        buffer.add(span)
        for event in buffer.take_ready():
            decision = feed(guard, event)
            if decision is not None:
                assert isinstance(event, CallObserved) and event.session == "conv-7"
                out.append(decision.count)
    return out


def test_conversation_keying_shares_a_chain_across_traces() -> None:
    # two traces of one conversation, one run each: the second run starts a new epoch
    buffer = TraceBuffer(key_by="conversation")
    spans = conversation_trace(0x1, 1, 3) + conversation_trace(0x2, 1, 3)
    assert counts_fed(buffer, spans) == [0, 2, 3, 0, 2, 3]


def test_conversation_keying_without_runs_keeps_counting() -> None:
    # tool spans whose only agent context is the conversation id on the tool span itself
    buffer = TraceBuffer(key_by="conversation")
    spans = []
    for n in range(4):
        spans.append(
            RecordedSpan(
                0x10 + n,
                0x20 + n,
                None,
                "execute_tool search",
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search",
                    "gen_ai.tool.call.arguments": '{"q": "x"}',
                    "gen_ai.conversation.id": "conv-7",
                },
                (),
                False,
                1,
                2,
            )
        )
    assert counts_fed(buffer, spans) == [0, 2, 3, 4]


def test_trace_keying_keeps_runs_apart_and_gives_no_run_events() -> None:
    buffer = TraceBuffer()
    spans = conversation_trace(0x1, 1, 3)
    for span in spans:
        buffer.add(span)
    events = buffer.take_ready()
    assert all(isinstance(event, CallObserved) for event in events)
    assert {event.session for event in events} == {f"{0x1:032x}/{0x100:016x}"}


def test_bad_key_by_is_refused() -> None:
    with pytest.raises(ValueError, match="key_by"):
        TraceBuffer(key_by="tenant")


def test_an_agent_lost_counts_once_per_run_and_only_above_flushed_tools() -> None:
    clock = FakeClock()
    buffer = TraceBuffer(hold_seconds=HOLD, clock=clock)
    # A tool span under a step span (not an agent) flushed early, without its agent...
    buffer.add(tool_span(40, parent=0xB1))
    clock.advance(HOLD)
    assert sessions(buffer.take_due()) == [BARE]
    # ... an agent span elsewhere in the trace (not its ancestor) lost nothing ...
    buffer.add(agent_span(span_id=0xA2, parent=0xF00, name="other"))
    assert buffer.agents_lost == 0
    # ... its step span then its agent span arrive: that run lost its agent, once.
    buffer.add(RecordedSpan(TRACE, 0xB1, AGENT, "step", {}, (), False, 0, 5))
    buffer.add(agent_span())
    buffer.add(agent_span(span_id=0xA3, parent=AGENT, name="sub"))  # below: not its agent
    assert buffer.agents_lost == 1
