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
from otel_loopguard.service._proto import candidate_patterns, proto_spans  # noqa: E402

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
