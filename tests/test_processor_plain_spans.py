"""Plain spans through the span processor (issue 29 item 3): one cheap check at the end.

The processor reads the SDK span's own fields (the properties cost more than the rest of a plain
span), asks ``may_matter_at_end`` inline with its name's part remembered per name
(``_PLAIN_NAMES``), and tracks every open span by a weak reference. These tests pin that the
inline check lets through exactly what ``may_matter_at_end`` lets through, on every dump and on
shapes made for it; that the SDK fields read are the public ones; that spans not made by the SDK
still work through the public API; and that a plain span dropped unended is freed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import SpanContext, TraceFlags

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard import processor as processor_module
from otel_loopguard._conventions import may_matter_at_end
from otel_loopguard.processor import LoopGuardSpanProcessor

from .span_dumps import dump_paths, load, rebuild
from .test_processor import Recording

OP = "gen_ai.operation.name"


class GateWitness(LoopGuardSpanProcessor):
    """The real processor, noting every span its end gate lets through (``_ended`` is where a
    span goes past the gate) with whether it was decided at its start."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.passed: dict[int, bool] = {}

    def _ended(
        self, span: ReadableSpan, name: str, attributes: Any, span_id: int, *rest: Any
    ) -> None:
        self.passed[span_id] = span_id in self._started
        super()._ended(span, name, attributes, span_id, *rest)


def witnessed() -> tuple[trace.Tracer, GateWitness]:
    provider = TracerProvider()
    processor = GateWitness(LoopGuard(PRESETS["default"]), tracer_provider=provider)
    provider.add_span_processor(processor)
    return provider.get_tracer("t"), processor


def check_gate(processor: GateWitness, spans: Sequence[ReadableSpan]) -> tuple[int, int]:
    """Every ended span passed the gate exactly when may_matter_at_end says it may matter, or
    when it was decided at its start. Returns (passed, stopped)."""
    passed = stopped = 0
    for span in spans:
        context = span.get_span_context()
        assert context is not None
        name, attributes = span.name, dict(span.attributes or {})
        expected = may_matter_at_end(name, attributes)
        went_by = context.span_id in processor.passed
        if expected:
            assert went_by, (name, sorted(attributes))
        elif went_by:
            assert processor.passed[context.span_id], (name, sorted(attributes))
        passed += went_by
        stopped += not went_by
    return passed, stopped


def test_the_end_gate_stops_what_may_matter_at_end_stops_on_every_dump() -> None:
    total_passed = total_stopped = 0
    for path in dump_paths():
        tracer, processor = witnessed()
        live = rebuild(load(path), tracer)
        passed, stopped = check_gate(processor, list(live.values()))
        total_passed += passed
        total_stopped += stopped
        assert processor.guard.internal_errors == {}, path
    assert total_passed > 50 and total_stopped > 50


CHAT = {
    OP: "chat",
    "gen_ai.provider.name": "openai",
    "gen_ai.request.model": "gpt-4o",
    "server.address": "api.openai.com",
}


@pytest.mark.parametrize(
    ("name", "start", "end", "rename"),
    [
        ("chat gpt-4o", CHAT, {}, None),
        ("chat gpt-4o", CHAT, {"gen_ai.usage.input_tokens": 3}, None),
        ("GET /users", {"http.request.method": "GET"}, {"http.response.status_code": 200}, None),
        ("step", {}, {}, "execute_tool search"),  # the name at the end is the one read
        ("execute_tool search", {}, {}, "step"),
        ("step", {}, {OP: "execute_tool"}, None),
        ("running tool", {}, {}, None),
        ("call tool", {}, {}, None),
        ("x", {"openinference.span.kind": "LLM"}, {}, None),
        ("x", {}, {"gen_ai.output.messages": "[]"}, None),
        ("x", {OP: "invoke_agent"}, {}, None),
        ("x", {OP: ["execute_tool"]}, {}, None),  # not a str: the exact gates decide
        ("invoke_agent a", {OP: "invoke_agent", "gen_ai.agent.name": "a"}, {}, None),
        ("", {}, {}, None),
    ],
)
def test_the_end_gate_on_shapes_made_for_it(
    name: str, start: dict[str, Any], end: dict[str, Any], rename: str | None
) -> None:
    tracer, processor = witnessed()
    spans = []
    for _ in range(3):  # the second and third find the name remembered
        span = tracer.start_span(name, attributes=start)
        span.set_attributes(end)
        if rename is not None:
            span.update_name(rename)
        span.end()
        assert isinstance(span, ReadableSpan)
        spans.append(span)
    check_gate(processor, spans)
    assert processor.guard.internal_errors == {}
    assert processor._open == {}


def test_plain_names_are_remembered_and_bounded() -> None:
    tracer, processor = witnessed()
    plain = processor_module._PLAIN_NAMES
    plain.clear()
    tracer.start_span("GET /users", attributes={"http.request.method": "GET"}).end()
    tracer.start_span("execute_tool search").end()  # a tool name gate: never plain
    tracer.start_span("invoke_agent a").end()  # an agent run may start so: never plain
    assert plain == {"GET /users"}
    for n in range(processor_module._MAX_PLAIN_NAMES + 10):
        tracer.start_span(f"GET /users/{n}").end()
    assert 0 < len(plain) <= processor_module._MAX_PLAIN_NAMES
    assert processor.guard.internal_errors == {}

    class Name(str):
        pass

    assert processor_module._plain_name(Name("other")) is False  # only a plain str is kept
    assert processor_module._plain_name(None) is False
    assert "other" not in plain


def test_the_sdk_fields_read_are_the_public_ones() -> None:
    """on_start and on_end read span._context[1], span._name and span._attributes._dict; if
    the SDK changed them, this fails rather than the processor reading something else."""
    provider = TracerProvider()
    tracer = provider.get_tracer("t")
    span = tracer.start_span("a", attributes={"k": 1})
    assert isinstance(span, ReadableSpan)
    span.update_name("b")
    span.set_attribute("j", "v")
    for state in ("open", "ended"):
        context = span.get_span_context()
        assert span._context[1] == context.span_id, state  # type: ignore[index]
        assert span._context[0] == context.trace_id, state  # type: ignore[index]
        assert span._name == span.name == "b", state
        inner = span._attributes._dict  # type: ignore[union-attr]
        assert type(inner) is dict and inner == dict(span.attributes or {}), state
        span.end()


def test_spans_not_made_by_the_sdk_go_through_the_public_api() -> None:
    guard = LoopGuard(PRESETS["default"])
    recording = Recording(guard)
    processor = LoopGuardSpanProcessor(guard)
    context = SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    bare = ReadableSpan(name="x", context=None)
    processor.on_start(bare, None)  # type: ignore[arg-type]
    processor.on_end(bare)
    tool = ReadableSpan(
        name="execute_tool search",
        context=context,
        attributes={
            OP: "execute_tool",
            "gen_ai.tool.name": "search",
            "gen_ai.tool.call.id": "c1",
            "gen_ai.tool.call.arguments": '{"q": 1}',
            "gen_ai.tool.call.result": "r",
        },
    )
    processor.on_start(tool, None)  # type: ignore[arg-type]
    processor.on_end(tool)
    assert [tool for tool, _ in recording.decisions] == ["search"]
    plain = ReadableSpan(name="GET", context=SpanContext(1, 3, is_remote=False), attributes=None)
    processor.on_start(plain, None)  # type: ignore[arg-type]
    processor.on_end(plain)
    assert guard.internal_errors == {}
    assert processor._open == {} and processor._started == {}


def test_a_plain_span_dropped_unended_is_freed() -> None:
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(LoopGuard(PRESETS["default"]), tracer_provider=provider)
    provider.add_span_processor(processor)
    span = provider.get_tracer("t").start_span(
        "chat gpt-4o", attributes={**CHAT, "gen_ai.prompt": "x" * 100_000}
    )
    span_id = span.get_span_context().span_id
    assert processor._view(span_id) is not None
    alive = weakref.ref(span)
    del span
    gc.collect()
    assert alive() is None  # the processor's reference did not keep it
    assert processor._view(span_id) is None
    assert span_id in processor._open  # a dead reference, until its pruning
