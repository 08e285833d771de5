"""Protobuf decoding in serve: the candidate gate never hides a tool, agent or model span (a
model call's usage), and a candidate decodes to what the SDK recorded."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from .service_tools import require_serve_prerequisites

require_serve_prerequisites()

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode  # noqa: E402

from otel_loopguard._conventions import (  # noqa: E402
    agent_from_span,
    model_call_from_span,
    tool_call_from_span,
)
from otel_loopguard._otlp_json import BadSpan  # noqa: E402
from otel_loopguard.service._proto import (  # noqa: E402
    _fast_attributes,
    candidate_patterns,
    proto_spans,
)

from .service_tools import workload  # noqa: E402
from .span_dumps import dump_paths, load, rebuild  # noqa: E402


def recorded(build: Any) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build(provider.get_tracer("test"))
    return list(exporter.get_finished_spans())


def sdk_view(span: ReadableSpan) -> tuple[dict[str, Any], tuple[tuple[str, dict[str, Any]], ...]]:
    def plain(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
        return {
            k: tuple(v) if isinstance(v, (list, tuple)) else v
            for k, v in (attributes or {}).items()
        }

    return plain(span.attributes), tuple((e.name, plain(e.attributes)) for e in span.events)


def check(spans: list[ReadableSpan]) -> int:
    """Every span the conventions recognise (tool, agent, model call with usage) is decoded in
    full, and as the SDK held it; how many."""
    read = proto_spans(encode_spans(spans).SerializeToString())
    assert read.bad_spans == 0 and read.accepted == len(spans)
    decoded = {span.span_id: span for span in read.spans}
    linked = {link[1] for link in read.links}
    recognised = 0
    for span in spans:
        context = span.get_span_context()
        assert context is not None
        attributes, events = sdk_view(span)
        error = span.status.status_code is StatusCode.ERROR
        is_tool = tool_call_from_span(span.name, attributes, events, error) is not None
        is_agent = agent_from_span(span.name, attributes) is not None
        is_model = model_call_from_span(span.name, attributes) is not None
        if not (is_tool or is_agent or is_model):
            assert context.span_id in decoded or context.span_id in linked
            continue
        recognised += 1
        got = decoded[context.span_id]  # a KeyError here: the gate hid a span it must keep
        assert (got.name, dict(got.attributes), got.events, got.status_error) == (
            span.name,
            attributes,
            events,
            error,
        )
        assert (got.start_ns, got.end_ns) == (span.start_time, span.end_time)
        parent = span.parent.span_id if span.parent is not None else None
        assert (got.trace_id, got.parent_id) == (context.trace_id, parent)
    return recognised


def test_gate_is_read_from_the_conventions_tables() -> None:
    gates = candidate_patterns()
    assert gates is not None
    names, prefixes, patterns = gates
    assert "execute_tool " in prefixes and "running tool" in names
    assert b"\n\x15gen_ai.operation.name\x12\x0e\n\x0cexecute_tool" in patterns


@pytest.mark.parametrize("path", dump_paths(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_spans_decode_as_recorded(path: Path) -> None:
    spans = recorded(lambda tracer: rebuild(load(path), tracer))
    assert check(spans) > 0


def test_scripted_workload_decodes_as_recorded() -> None:
    spans = recorded(lambda tracer: workload(tracer, traces=1))
    assert check(spans) == sum(
        1 for s in spans if s.name.startswith(("execute_tool", "invoke_agent"))
    )
    read = proto_spans(encode_spans(spans).SerializeToString())
    assert read.links and all(not s.name.startswith("chat") for s in read.spans)


def test_model_spans_with_usage_pass_the_gate() -> None:
    """A model call's span is decoded in full (its usage is charged to its turn's calls); before
    the gate knew model spans, serve kept it as a parent link only and charged nothing."""

    def build(tracer: Any) -> None:
        with tracer.start_as_current_span("invoke_agent coder"):
            with tracer.start_as_current_span("chat gpt-4o") as chat:
                chat.set_attribute("gen_ai.operation.name", "chat")
                chat.set_attribute("gen_ai.request.model", "gpt-4o")
                chat.set_attribute("gen_ai.usage.input_tokens", 1200)
                chat.set_attribute("gen_ai.usage.output_tokens", 80)
            with tracer.start_as_current_span("llm") as llm:
                llm.set_attribute("openinference.span.kind", "LLM")
                llm.set_attribute("llm.token_count.prompt", 900)
            with tracer.start_as_current_span("chat without usage") as plain:
                plain.set_attribute("gen_ai.operation.name", "chat")

    spans = recorded(build)
    read = proto_spans(encode_spans(spans).SerializeToString())
    kept = {span.name for span in read.spans}
    assert {"chat gpt-4o", "llm"} <= kept and "chat without usage" not in kept
    assert check(spans) == 2  # the two model calls; the agent span has no agent attributes


def test_garbage_is_a_bad_request() -> None:
    for body in (b"\xff\xff\xff", b"\x0a\x05abc"):
        with pytest.raises(BadSpan, match="not a valid protobuf"):
            proto_spans(body)
    empty = proto_spans(b"")
    assert (empty.accepted, empty.bad_spans) == (0, 0)


# -- attributes read from their bytes (the usual shape) or by the protobuf runtime (any other) --


def _request_with(attributes: list[bytes], name: str = "execute_tool search") -> bytes:
    """One span's ``ExportTraceServiceRequest`` whose attributes are these ``KeyValue``
    encodings, spliced in as they are (field 9 of ``Span``), written byte by byte."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    span = bytes(Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name=name).SerializeToString())
    for pair in attributes:
        span += b"\x4a" + _length(len(pair)) + pair  # Span.attributes
    scope = b"\x12" + _length(len(span)) + span  # ScopeSpans.spans
    resource = b"\x12" + _length(len(scope)) + scope  # ResourceSpans.scope_spans
    return b"\x0a" + _length(len(resource)) + resource  # resource_spans


def _length(size: int) -> bytes:
    out = bytearray()
    while True:
        if size < 0x80:
            out.append(size)
            return bytes(out)
        out.append(size & 0x7F | 0x80)
        size >>= 7


def _expected(body: bytes) -> dict[str, Any]:
    """What the protobuf runtime reads (the general path, as before the fast one)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from otel_loopguard.service._proto import _attributes

    (span,) = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans
    return _attributes(span.attributes)


def _key_value(key: str, value: Any) -> bytes:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    any_value = value if isinstance(value, AnyValue) else None
    if any_value is None:
        kind = {str: "string_value", bool: "bool_value", int: "int_value", float: "double_value"}
        any_value = AnyValue(**{kind[type(value)]: value})
    return bytes(KeyValue(key=key, value=any_value).SerializeToString())


def test_attributes_read_from_their_bytes_as_protobuf_reads_them() -> None:
    """Every value kind, lengths of one and two varint bytes (and one padded to two),
    negative and 64-bit integers, zero and empty values, a key set twice, an empty
    ``AnyValue`` and a missing value."""
    from opentelemetry.proto.common.v1.common_pb2 import (
        AnyValue,
        ArrayValue,
        KeyValue,
        KeyValueList,
    )

    pairs = [
        _key_value("gen_ai.operation.name", "execute_tool"),
        _key_value("gen_ai.tool.call.arguments", '{"q": "' + "x" * 300 + '"}'),
        _key_value("k" * 200, "a long key"),
        _key_value("unicode", "héllo ✓"),
        _key_value("empty", ""),
        _key_value("tokens", 1200),
        _key_value("zero", 0),
        _key_value("negative", -5),
        _key_value("huge", 2**63 - 1),
        _key_value("smallest", -(2**63)),
        _key_value("flag", True),
        _key_value("off", False),
        _key_value("ratio", 0.25),
        _key_value("bytes", AnyValue(bytes_value=b"\x00\xff")),
        _key_value("array", AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a")]))),
        _key_value(
            "kvlist",
            AnyValue(
                kvlist_value=KeyValueList(
                    values=[KeyValue(key="inner", value=AnyValue(int_value=3))]
                )
            ),
        ),
        _key_value("no value", AnyValue()),
        bytes(KeyValue(key="missing").SerializeToString()),
        _key_value("tokens", 99),  # the last of a repeated key wins
        b"\x0a\x05loose\x12\x85\x00\x0a\x03abc",  # a length in two bytes where one would do
    ]
    body = _request_with(pairs)
    (span,) = proto_spans(body).spans
    assert dict(span.attributes) == _expected(body)
    assert _fast_attributes(pairs) == _expected(body)  # read from the bytes, not by protobuf
    assert span.attributes["tokens"] == 99 and span.attributes["k" * 200] == "a long key"
    assert "no value" not in span.attributes and "missing" not in span.attributes


@pytest.mark.parametrize(
    "odd",
    [
        # value before key (field order is a convention, not a rule of the format)
        b"\x12\x04\x0a\x02hi" + b"\x0a\x03odd",
        # the key twice: protobuf keeps the last
        b"\x0a\x03one\x0a\x03odd\x12\x04\x0a\x02hi",
        # two values in one AnyValue: the oneof keeps the last
        b"\x0a\x03odd\x12\x06\x0a\x02hi\x18\x07",
        # an unknown field in the KeyValue
        b"\x0a\x03odd\x12\x04\x0a\x02hi\x18\x01",
    ],
)
def test_attributes_in_another_shape_are_read_by_protobuf(odd: bytes) -> None:
    """A ``KeyValue`` not written key-then-value, once each, is read by the protobuf runtime:
    the same attributes as before the fast path."""
    body = _request_with([_key_value("gen_ai.operation.name", "execute_tool"), odd])
    with pytest.raises((ValueError, IndexError)):
        _fast_attributes([odd])
    (span,) = proto_spans(body).spans
    assert dict(span.attributes) == _expected(body)
    assert span.attributes["gen_ai.operation.name"] == "execute_tool"


def test_invalid_utf8_in_a_candidate_is_a_bad_span() -> None:
    """Invalid UTF-8 in a string the runtime checks rejects the span, named, as before."""
    bad = b"\x0a\x03odd\x12\x04\x0a\x02\xff\xfe"
    body = _request_with([_key_value("gen_ai.operation.name", "execute_tool"), bad])
    read = proto_spans(body)
    assert (read.accepted, read.bad_spans, read.spans) == (0, 1, [])
    assert read.problems[0].startswith("resource_spans[0].scope_spans[0].spans[0]: not a valid")
