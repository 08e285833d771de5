"""TraceBuffer.snapshot()/restore(): a buffer's contents as plain data, taken back in another
buffer (another process, another clock origin) that then gives the same events."""

from __future__ import annotations

import pickle
from collections.abc import Mapping

import pytest

from otel_loopguard._otlp_json import RecordedSpan
from otel_loopguard._trace_events import TraceEvent
from otel_loopguard._traces import SNAPSHOT_VERSION, TraceBuffer

from .conftest import FakeClock

HOLD = 2.0
SEARCH = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "search",
    "gen_ai.tool.call.arguments": '{"q": "x"}',
    "gen_ai.tool.call.result": "same",
    "tags": ("a", "b"),  # an array attribute: a tuple, as the SDK holds it
    "blob": b"\x00\x01",
}


def agent(trace: int, span: int, parent: int | None, conversation: str = "c1") -> RecordedSpan:
    return RecordedSpan(
        trace,
        span,
        parent,
        "invoke_agent planner",
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "planner",
            "gen_ai.conversation.id": conversation,
        },
        (),
        False,
        0,
        10_000,
    )


def tool(trace: int, span: int, parent: int | None, start: int, **extra: object) -> RecordedSpan:
    return RecordedSpan(
        trace, span, parent, "execute_tool search", {**SEARCH, **extra}, (), False, start, start + 1
    )


def at_start(trace: int, span: int, parent: int, start: int) -> RecordedSpan:
    """A Pydantic AI tool span that carried its arguments at start: decided then."""
    attributes = {**SEARCH, "logfire.msg": "running tool: search"}
    return RecordedSpan(
        trace,
        span,
        parent,
        "execute_tool search",
        attributes,
        (),
        False,
        start,
        start + 1,
        start_name="execute_tool search",
        start_attributes={k: v for k, v in attributes.items() if k != "gen_ai.tool.call.result"},
    )


def without_arguments(trace: int, span: int, parent: int, start: int) -> RecordedSpan:
    attributes = {k: v for k, v in SEARCH.items() if k != "gen_ai.tool.call.arguments"}
    return RecordedSpan(
        trace, span, parent, "execute_tool search", attributes, (), False, start, start + 1
    )


def busy_buffer(clock: FakeClock, key_by: str) -> TraceBuffer:
    """A buffer holding every kind of state: a trace flushed early (its resolved parents, a
    tool span flushed without its agent, given times), traces waiting (tool spans decided at
    start and at end, without arguments, agent spans and runs), remote parents, remembered span
    ids of forgotten traces, a trace complete but not yet taken, and every counter."""
    buffer = TraceBuffer(hold_seconds=HOLD, clock=clock, key_by=key_by, max_seen_spans=64)
    # Trace 1: tools flushed early without their agent, then the agent (a lost run).
    buffer.add(tool(1, 0x11, 0xA1, 10))
    clock.advance(HOLD)
    assert len(buffer.take_due()) == 1
    buffer.add(agent(1, 0xA1, 0xF0))
    buffer.add(tool(1, 0x12, 0xA1, 20))
    # Trace 2: flushed and forgotten (its span ids remembered); then a retry counts once.
    buffer.add(agent(2, 0xA2, None))
    buffer.add(tool(2, 0x21, 0xA2, 30))
    assert len(buffer.take_ready()) >= 1
    buffer.add(tool(2, 0x21, 0xA2, 30))
    # Trace 3: waiting, decided at start, without arguments, a remote parent, a link.
    clock.advance(HOLD / 4)
    buffer.add(agent(3, 0xA3, 0xF3, "c2"))
    buffer.add(at_start(3, 0x31, 0xA3, 40))
    buffer.add(without_arguments(3, 0x32, 0xA3, 50))
    buffer.add(
        RecordedSpan(3, 0x33, 0xBEEF, "remote child", {}, (), False, 5, 6, parent_remote=True)
    )
    buffer.add_link(3, 0x34, 0xA3)
    # Trace 4: its root arrived, not yet taken.
    buffer.add(tool(4, 0x41, 0xA4, 60))
    buffer.add(agent(4, 0xA4, None))
    assert buffer.duplicate_spans == 1 and buffer.flushed_early_time == 1
    return buffer


def rest_of_the_run(buffer: TraceBuffer, clock: FakeClock) -> list[list[TraceEvent]]:
    """Drive a buffer on: the same spans and times give the same events."""
    out = [buffer.take_ready()]
    buffer.add(tool(2, 0x21, 0xA2, 30))  # a retry of a forgotten trace
    buffer.add(tool(1, 0x13, 0xA1, 70))
    clock.advance(HOLD / 2)
    out.append(buffer.take_due())
    clock.advance(HOLD)
    out.append(buffer.take_due())
    buffer.add(RecordedSpan(1, 0xF0, None, "root", {}, (), False, 0, 20_000))
    out.append(buffer.take_ready())
    out.append(buffer.finish())
    return out


def counters(buffer: TraceBuffer) -> tuple[int, ...]:
    return (
        buffer.buffered_spans,
        buffer.buffered_traces,
        buffer.duplicate_spans,
        buffer.flushed_early_capacity,
        buffer.flushed_early_time,
        buffer.agents_lost,
    )


def plain(value: object) -> bool:
    """Whether ``value`` is plain data: no object of the package's own classes."""
    if value is None or isinstance(value, (str, bytes, bool, int, float)):
        return True
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(plain(item) for item in value)
    return False


@pytest.mark.parametrize("key_by", ["trace", "conversation"])
def test_a_restored_buffer_gives_the_same_events(key_by: str) -> None:
    clock = FakeClock()
    original = busy_buffer(clock, key_by)
    data = original.snapshot()
    assert data["version"] == SNAPSHOT_VERSION and plain(data)
    # Another process: another clock origin, the data through pickle.
    other_clock = FakeClock(now=5.0)
    restored = TraceBuffer(hold_seconds=HOLD, clock=other_clock, key_by=key_by, max_seen_spans=64)
    restored.restore(pickle.loads(pickle.dumps(data)))
    assert counters(restored) == counters(original)
    assert restored.snapshot() == data
    expected = rest_of_the_run(original, clock)
    got = rest_of_the_run(restored, other_clock)
    assert got == expected
    kinds = {type(event).__name__ for events in expected for event in events}
    assert {"CallDecidedAtStart", "CallObserved"} <= kinds
    assert any(getattr(e, "without_arguments", False) for events in expected for e in events)
    assert counters(restored) == counters(original)


def test_an_empty_buffer_round_trips() -> None:
    buffer = TraceBuffer()
    data = buffer.snapshot()
    other = TraceBuffer()
    other.restore(data)
    assert other.snapshot() == data and counters(other) == (0, 0, 0, 0, 0, 0)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ([], "expected a mapping"),
        ({"version": 0}, "version: expected 1, got 0"),
        ({"version": SNAPSHOT_VERSION}, "malformed"),
        ({"version": SNAPSHOT_VERSION, "traces": [{"id": 1}]}, "malformed"),
    ],
)
def test_a_bad_snapshot_is_refused_and_the_buffer_kept(bad: object, says: str) -> None:
    clock = FakeClock()
    buffer = busy_buffer(clock, "trace")
    before = buffer.snapshot()
    with pytest.raises(ValueError, match=says):
        buffer.restore(bad)  # type: ignore[arg-type]
    assert buffer.snapshot() == before
