"""Issue 23, item 11: the dedupe window is the documented size.

An exporter's retry of spans whose trace was already judged and forgotten must count once while
fewer than ``max_seen_spans`` spans of later forgotten traces came after them (the README's
262,144 by default), wherever the span fell in the buffer's two generations; and once
``2 * max_seen_spans - 1`` came after it, it is forgotten (counted again).
"""

from __future__ import annotations

import pytest

from otel_loopguard._otlp_json import RecordedSpan
from otel_loopguard._traces import MAX_SEEN_SPANS, TraceBuffer

RETRIED_TRACE = 1 << 120


def _tool(trace_id: int) -> RecordedSpan:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
        "gen_ai.tool.call.arguments": '{"q": "x"}',
    }
    return RecordedSpan(trace_id, 7, None, "execute_tool search", attributes, (), False, 1, 2)


def _forget(buffer: TraceBuffer, count: int, first: int) -> int:
    """``count`` one-span traces, each judged and forgotten; the next trace id."""
    for index in range(count):
        buffer.add_link(first + index, 1, None)
        if index % 4096 == 4095:
            buffer.take_ready()
    buffer.take_ready()
    assert buffer.buffered_spans == 0
    return first + count


def _retry_counts(buffer: TraceBuffer) -> bool:
    """Send the retried span again: whether it was counted (judged again) or dropped."""
    dropped = buffer.duplicate_spans
    buffer.add(_tool(RETRIED_TRACE))
    events = buffer.take_ready()
    if buffer.duplicate_spans == dropped + 1:
        assert events == []
        return False
    assert len(events) == 1
    return True


def _judged_once(buffer: TraceBuffer) -> None:
    buffer.add(_tool(RETRIED_TRACE))
    assert len(buffer.take_ready()) == 1


@pytest.mark.parametrize("size", [2, 3, 8])
def test_a_retry_within_the_window_is_dropped_wherever_it_fell(size: int) -> None:
    for before in range(2 * size):  # every place in a generation, in either generation
        buffer = TraceBuffer(max_seen_spans=size)
        next_id = _forget(buffer, before, 1)
        _judged_once(buffer)
        _forget(buffer, size - 1, next_id)
        assert not _retry_counts(buffer), (size, before)


@pytest.mark.parametrize("size", [2, 3, 8])
def test_a_retry_after_twice_the_window_less_one_is_counted_again(size: int) -> None:
    for before in range(2 * size):
        buffer = TraceBuffer(max_seen_spans=size)
        next_id = _forget(buffer, before, 1)
        _judged_once(buffer)
        _forget(buffer, 2 * size - 1, next_id)
        assert _retry_counts(buffer), (size, before)


@pytest.mark.slow
def test_the_default_window_holds_at_its_boundary() -> None:
    """The default size, at the worst place (the span that fills a generation): a retry after
    262,143 later spans is dropped; after 262,144 it is counted again (round two: forgotten
    after about 131k)."""
    buffer = TraceBuffer()
    next_id = _forget(buffer, MAX_SEEN_SPANS - 1, 1)
    _judged_once(buffer)  # the last of its generation
    next_id = _forget(buffer, MAX_SEEN_SPANS - 1, next_id)
    assert not _retry_counts(buffer)
    _forget(buffer, 1, next_id)
    assert _retry_counts(buffer)
