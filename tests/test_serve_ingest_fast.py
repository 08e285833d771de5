"""Issue 29 item 5: serve's ingest made cheaper without changing what it reads.

An array of strings in a candidate span's attributes is read from its bytes (not by the protobuf
runtime), with the same values; any other array shape goes to the runtime as before. The trace
buffer takes a request's parent links in one call (``add_links``) with the same result as one
``add_link`` each, and remembers a forgotten trace's span ids as it did.
"""

from __future__ import annotations

from typing import Any

import pytest

from .service_tools import require_serve_prerequisites

require_serve_prerequisites()

from opentelemetry.proto.common.v1.common_pb2 import (  # noqa: E402
    AnyValue,
    ArrayValue,
    KeyValue,
)

from otel_loopguard._traces import TraceBuffer  # noqa: E402
from otel_loopguard.service._proto import (  # noqa: E402
    _attributes,
    _fast_attributes,
    _string_array,
    proto_spans,
)

from .test_service_proto import _request_with  # noqa: E402


def _array(*values: AnyValue) -> bytes:
    any_value = AnyValue(array_value=ArrayValue(values=list(values)))
    return bytes(KeyValue(key="array", value=any_value).SerializeToString())


def _general(pair: bytes) -> dict[str, Any]:
    """What the protobuf runtime reads of one ``KeyValue`` (the path before the fast one)."""
    return _attributes([KeyValue.FromString(pair)])


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["stop"],
        ["tool_calls", "stop", ""],
        ["héllo ✓", "x" * 300],  # a length in two varint bytes
        [str(n) for n in range(200)],  # an array longer than 127 bytes
    ],
)
def test_string_arrays_are_read_from_their_bytes_as_protobuf_reads_them(
    values: list[str],
) -> None:
    pair = _array(*(AnyValue(string_value=value) for value in values))
    assert _fast_attributes([pair]) == _general(pair) == {"array": tuple(values)}
    body = _request_with([_key_value_tool(), pair])
    (span,) = proto_spans(body).spans
    assert span.attributes["array"] == tuple(values)


@pytest.mark.parametrize(
    "values",
    [
        [AnyValue(int_value=3)],
        [AnyValue(string_value="a"), AnyValue(bool_value=True)],
        [AnyValue()],  # an empty value: None in the tuple
        [AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="nested")]))],
    ],
)
def test_other_arrays_are_left_to_protobuf_with_the_same_values(values: list[AnyValue]) -> None:
    pair = _array(*values)
    value_at = pair.index(b"\x2a")  # the AnyValue's array_value tag
    assert _string_array(pair, value_at, len(pair)) is None
    assert _fast_attributes([pair]) == _general(pair)
    (span,) = proto_spans(_request_with([_key_value_tool(), pair])).spans
    assert dict(span.attributes) == _general(pair) | {"gen_ai.operation.name": "execute_tool"}


def test_invalid_utf8_in_a_string_array_is_still_a_bad_span() -> None:
    pair = b"\x0a\x05array\x12\x08\x2a\x06\x0a\x04\x0a\x02\xff\xfe"
    read = proto_spans(_request_with([_key_value_tool(), pair]))
    assert (read.accepted, read.bad_spans, read.spans) == (0, 1, [])


def _key_value_tool() -> bytes:
    value = AnyValue(string_value="execute_tool")
    return bytes(KeyValue(key="gen_ai.operation.name", value=value).SerializeToString())


def _links(traces: int) -> list[tuple[int, int, int | None, bool]]:
    """Parent links of ``traces`` traces, children first (the root last), one remote child."""
    links: list[tuple[int, int, int | None, bool]] = []
    for trace in range(1, traces + 1):
        for span in range(2, 6):
            links.append((trace, trace * 100 + span, trace * 100 + 1, span == 5 and trace == 2))
        links.append((trace, trace * 100 + 1, None, False))
    return links


def test_add_links_in_one_call_is_add_link_of_each() -> None:
    """The same parents, remote parents, roots, counts and duplicates (within the call, and of
    spans of traces already forgotten), and the same snapshot, as one ``add_link`` each."""
    clock = [100.0]
    one = TraceBuffer(hold_seconds=1.0, clock=lambda: clock[0], max_seen_spans=4)
    many = TraceBuffer(hold_seconds=1.0, clock=lambda: clock[0], max_seen_spans=4)
    first = _links(3)
    for link in first:
        one.add_link(*link)
    many.add_links(first)
    assert one.snapshot() == many.snapshot()
    assert one.take_ready() == many.take_ready() == []  # link-only traces: no events
    assert one.snapshot() == many.snapshot() and one.buffered_spans == 0
    # a retried export of spans already forgotten, and a new trace with a span twice
    again = [*first[:3], (9, 901, None, False), (9, 901, None, False)]
    for link in again:
        one.add_link(*link)
    many.add_links(again)
    assert one.duplicate_spans == many.duplicate_spans
    assert one.snapshot() == many.snapshot()


@pytest.mark.parametrize("max_seen", [2, 3, 7, 12, 1000])
def test_forgotten_span_ids_are_remembered_as_before(max_seen: int) -> None:
    """A forgotten trace's span ids are kept in two generations of ``max_seen`` hashes, one id
    at a time, whether the trace fits in the current generation or not (then the generation
    turns over inside it): the same sets as the rule, and a retry of the newest is dropped."""
    buffer = TraceBuffer(max_seen_spans=max_seen)
    seen: set[int] = set()
    before: set[int] = set()
    links = _links(5)
    for trace in range(1, 6):
        buffer.add_links(links[(trace - 1) * 5 : trace * 5])
        buffer.take_ready()
        for trace_id, span_id, _, _ in links[(trace - 1) * 5 : trace * 5]:
            seen.add(hash((trace_id, span_id)))
            if len(seen) >= max_seen:
                before, seen = seen, set()
        data = buffer.snapshot()
        assert (set(data["seen"]), set(data["seen_before"])) == (seen, before)
    buffer.add_links([links[-1]])
    assert buffer.duplicate_spans == 1 and buffer.buffered_spans == 0
