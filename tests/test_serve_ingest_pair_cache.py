"""Issue 29 item 5: a candidate span's attributes that repeat from span to span are read once.

``_fast_attributes`` keeps each ``KeyValue`` encoding it read (when short and its value
immutable) with the key and value it gave, and takes them from there the next time the same
bytes come: the values are the same as the protobuf runtime reads, a mutable value (a key-value
list) is never shared between spans, and the cache stays bounded.
"""

from __future__ import annotations

from typing import Any

from .service_tools import require_serve_prerequisites

require_serve_prerequisites()

from opentelemetry.proto.common.v1.common_pb2 import (  # noqa: E402
    AnyValue,
    ArrayValue,
    KeyValue,
    KeyValueList,
)

from otel_loopguard.service import _proto  # noqa: E402
from otel_loopguard.service._proto import (  # noqa: E402
    _attributes,
    _fast_attributes,
    proto_spans,
)

from .test_service_proto import _request_with  # noqa: E402


def _pair(key: str, value: AnyValue) -> bytes:
    return bytes(KeyValue(key=key, value=value).SerializeToString())


def _general(pairs: list[bytes]) -> dict[str, Any]:
    """What the protobuf runtime reads of the ``KeyValue`` encodings (the general path)."""
    return _attributes([KeyValue.FromString(pair) for pair in pairs])


def _tool_pair() -> bytes:
    return _pair("gen_ai.operation.name", AnyValue(string_value="execute_tool"))


PAIRS = [
    _tool_pair(),
    _pair("gen_ai.tool.name", AnyValue(string_value="search")),
    _pair("gen_ai.usage.input_tokens", AnyValue(int_value=1200)),
    _pair("gen_ai.usage.cost", AnyValue(double_value=0.25)),
    _pair("stream", AnyValue(bool_value=False)),
    _pair("negative", AnyValue(int_value=-3)),
    _pair(
        "gen_ai.response.finish_reasons",
        AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="tool_calls")])),
    ),
    _pair("empty", AnyValue()),  # no value: dropped
]


def test_repeated_pairs_read_the_same_from_the_cache_as_protobuf_reads_them() -> None:
    _proto._PAIRS.clear()
    first = _fast_attributes(PAIRS)
    cached = [pair for pair in PAIRS if pair in _proto._PAIRS]
    assert len(cached) == len(PAIRS) - 1  # all but the empty value
    second = _fast_attributes(PAIRS)
    assert first == second == _general(PAIRS)
    assert list(second) == list(_general(PAIRS))  # the same key order
    # through the whole request path too: two spans with the same bytes
    spans = proto_spans(_request_with(PAIRS)).spans + proto_spans(_request_with(PAIRS)).spans
    assert [span.attributes for span in spans] == [_general(PAIRS)] * 2


def test_a_repeated_key_keeps_the_last_value_with_cached_pairs() -> None:
    _proto._PAIRS.clear()
    pairs = [
        _pair("k", AnyValue(string_value="one")),
        _pair("k", AnyValue(string_value="two")),
    ]
    _fast_attributes(pairs)
    assert _fast_attributes(pairs) == _general(pairs) == {"k": "two"}
    assert _fast_attributes(pairs[::-1]) == {"k": "one"}


def test_a_key_value_list_is_never_shared_between_spans() -> None:
    _proto._PAIRS.clear()
    nested = KeyValueList(values=[KeyValue(key="a", value=AnyValue(string_value="b"))])
    pair = _pair("map", AnyValue(kvlist_value=nested))
    first = _fast_attributes([pair])
    assert pair not in _proto._PAIRS
    second = _fast_attributes([pair])
    assert first == second == _general([pair]) == {"map": {"a": "b"}}
    assert first["map"] is not second["map"]


def test_long_pairs_are_not_kept() -> None:
    _proto._PAIRS.clear()
    pair = _pair("gen_ai.tool.call.arguments", AnyValue(string_value="x" * 300))
    assert len(pair) > _proto._CACHED_PAIR_BYTES
    assert _fast_attributes([pair]) == _general([pair])
    assert pair not in _proto._PAIRS


def test_the_cache_is_bounded() -> None:
    _proto._PAIRS.clear()
    for start in range(0, _proto._CACHED_PAIRS * 2 + 10, 500):
        pairs = [_pair(f"k{n}", AnyValue(int_value=n)) for n in range(start, start + 500)]
        assert _fast_attributes(pairs) == _general(pairs)
        assert len(_proto._PAIRS) <= _proto._CACHED_PAIRS
    assert _proto._PAIRS  # it started over, and kept going
