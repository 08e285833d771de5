"""Decision spans reach the exporters of the provider the span processor is on, not the global
provider's (issue 21): ``provider.add_span_processor(LoopGuardSpanProcessor())`` as the README
shows, on real providers with in-memory exporters."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    ConcurrentMultiSpanProcessor,
    ReadableSpan,
    Span,
    SpanLimits,
    SpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard.processor import DECISION_EVENT, SCOPE_NAME, LoopGuardSpanProcessor

CALLS = 6
AGENT = "invoke_agent researcher"
TOOL = "execute_tool search"


def expected_actions() -> list[str]:
    """What the default preset says to six identical searches that learn nothing, from the
    third on: reminded at the third, denied from the fourth."""
    policy = PRESETS["default"]
    remind, deny = policy.remind_thresholds[0], policy.no_progress_threshold
    assert deny is not None and remind == 3 and deny == 4  # the test's arithmetic below
    return ["remind", "deny", "deny", "deny"]


@pytest.fixture
def global_spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A real global provider with its own in-memory exporter, for one test. The API sets the
    global provider once per process (the integration tests set a forwarding one), so the
    module's variable is swapped and restored, not set through ``set_tracer_provider``."""
    provider = TracerProvider(resource=Resource({"service.name": "the-global-provider"}))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    assert trace.get_tracer_provider() is provider
    yield exporter
    provider.shutdown()


def provider_with_exporter(
    name: str, **options: Any
) -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider(resource=Resource({"service.name": name}), **options)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def search(tracer: trace.Tracer, n: int) -> None:
    """One tool call traced with the GenAI conventions, arguments set after the span started
    (as most instrumentations do): the processor decides at its end."""
    with tracer.start_as_current_span(
        TOOL, attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"}
    ) as span:
        span.set_attribute("gen_ai.tool.call.arguments", json.dumps({"query": "TODO"}))
        span.set_attribute("gen_ai.tool.call.id", f"c{n}")
        span.set_attribute("gen_ai.tool.call.result", "no match")


def looping_agent(tracer: trace.Tracer) -> None:
    with tracer.start_as_current_span(
        AGENT,
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "researcher"},
    ):
        for n in range(CALLS):
            search(tracer, n)


def decision_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == DECISION_EVENT]


def actions(spans: Sequence[ReadableSpan]) -> list[Any]:
    return [dict(s.attributes or {})["loopguard.action"] for s in spans]


def only(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    (span,) = [s for s in spans if s.name == name]
    return span


def test_decision_spans_reach_the_exporter_of_the_provider_the_processor_is_on(
    global_spans: InMemorySpanExporter,
) -> None:
    provider, exporter = provider_with_exporter("the-agent")
    processor = LoopGuardSpanProcessor(LoopGuard(PRESETS["default"]))
    provider.add_span_processor(processor)
    looping_agent(provider.get_tracer("agent"))
    spans = exporter.get_finished_spans()
    agent = only(spans, AGENT)
    decisions = decision_spans(exporter)
    assert actions(decisions) == expected_actions()
    for span in decisions:
        # in the agent's trace, a sibling of the tool span (a child of the agent span), with
        # the provider's resource and the processor's scope
        assert span.context is not None and agent.context is not None
        assert span.context.trace_id == agent.context.trace_id
        assert span.parent is not None and span.parent.span_id == agent.context.span_id
        assert span.resource.attributes["service.name"] == "the-agent"
        assert span.instrumentation_scope is not None
        assert span.instrumentation_scope.name == SCOPE_NAME
        assert dict(span.attributes or {}) == dict(span.events[0].attributes or {})
    # the call ids are the tool spans', in order: a decision span is never counted as a call
    # (it would add calls and shift every count)
    assert [dict(s.attributes or {})["gen_ai.tool.call.id"] for s in decisions] == [
        f"c{n}" for n in range(2, CALLS)
    ]
    assert [dict(s.attributes or {})["loopguard.count"] for s in decisions] == list(
        range(3, CALLS + 1)
    )
    assert len([s for s in spans if s.name == TOOL]) == CALLS
    assert global_spans.get_finished_spans() == ()
    assert processor.decisions_to_global_provider == 0
    assert processor.guard.internal_errors == {}
    provider.shutdown()


def test_one_processor_on_two_providers_sends_each_its_own_decisions(
    global_spans: InMemorySpanExporter,
) -> None:
    first, first_exporter = provider_with_exporter("first")
    second, second_exporter = provider_with_exporter("second")
    processor = LoopGuardSpanProcessor(LoopGuard(PRESETS["default"]))
    first.add_span_processor(processor)
    second.add_span_processor(processor)
    for _ in range(2):  # alternating: each provider's tracer is kept, none is mixed up
        looping_agent(first.get_tracer("agent"))
        looping_agent(second.get_tracer("agent"))
    for exporter, name in ((first_exporter, "first"), (second_exporter, "second")):
        decisions = decision_spans(exporter)
        assert actions(decisions) == expected_actions() * 2
        assert {s.resource.attributes["service.name"] for s in decisions} == {name}
        agents = {s.context.trace_id for s in exporter.get_finished_spans() if s.name == AGENT}
        assert {s.context.trace_id for s in decisions} == agents
    assert global_spans.get_finished_spans() == ()
    assert processor.decisions_to_global_provider == 0
    first.shutdown()
    second.shutdown()


def test_the_pinned_sdk_span_carries_what_the_processor_reads() -> None:
    """The processor reaches the tool span's pipeline through the SDK span's private
    ``_span_processor``, ``_sampler`` and ``_limits``: an SDK release without them fails here
    (and the processor falls back to the global provider, counted and logged)."""
    provider, _ = provider_with_exporter("pinned")
    tracer = provider.get_tracer("pinned")
    with tracer.start_as_current_span("a span") as span:
        assert isinstance(span, Span)
        assert getattr(span, "_span_processor", None) is getattr(
            provider, "_active_span_processor", None
        )
        assert getattr(span, "_sampler", None) is provider.sampler
        assert isinstance(getattr(span, "_limits", None), SpanLimits)
        assert span.resource is provider.resource
    provider.shutdown()


def test_an_explicit_tracer_provider_still_wins(global_spans: InMemorySpanExporter) -> None:
    provider, exporter = provider_with_exporter("the-agent")
    chosen, chosen_exporter = provider_with_exporter("chosen")
    processor = LoopGuardSpanProcessor(LoopGuard(PRESETS["default"]), tracer_provider=chosen)
    provider.add_span_processor(processor)
    looping_agent(provider.get_tracer("agent"))
    assert actions(decision_spans(chosen_exporter)) == expected_actions()
    assert decision_spans(exporter) == []
    assert global_spans.get_finished_spans() == ()
    assert processor.decisions_to_global_provider == 0
    provider.shutdown()
    chosen.shutdown()


def test_decision_spans_go_through_the_providers_sampler(
    global_spans: InMemorySpanExporter,
) -> None:
    """The decision span is started with the tool span's provider's sampler, as any span of
    that provider is: a sampler that drops them drops them."""

    class DropDecisions(Sampler):
        def should_sample(
            self,
            parent_context: Context | None,
            trace_id: int,
            name: str,
            kind: SpanKind | None = None,
            attributes: Attributes = None,
            links: Sequence[Link] | None = None,
            trace_state: TraceState | None = None,
        ) -> SamplingResult:
            if name == DECISION_EVENT:
                return SamplingResult(Decision.DROP)
            return ALWAYS_ON.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return "DropDecisions"

    provider, exporter = provider_with_exporter("the-agent", sampler=DropDecisions())
    processor = LoopGuardSpanProcessor(LoopGuard(PRESETS["default"]))
    provider.add_span_processor(processor)
    looping_agent(provider.get_tracer("agent"))
    assert len([s for s in exporter.get_finished_spans() if s.name == TOOL]) == CALLS
    assert decision_spans(exporter) == []
    assert global_spans.get_finished_spans() == ()
    assert processor.decisions_to_global_provider == 0
    provider.shutdown()


def test_decision_spans_through_a_concurrent_pipeline_reach_its_exporter(
    global_spans: InMemorySpanExporter,
) -> None:
    provider, exporter = provider_with_exporter(
        "the-agent", active_span_processor=ConcurrentMultiSpanProcessor(num_threads=2)
    )
    processor = LoopGuardSpanProcessor(LoopGuard(PRESETS["default"]))
    provider.add_span_processor(processor)
    looping_agent(provider.get_tracer("agent"))
    processor.shutdown()  # waits for the decision spans emitted from the processor's thread
    assert actions(decision_spans(exporter)) == expected_actions()
    assert global_spans.get_finished_spans() == ()
    assert processor.decisions_to_global_provider == 0
    provider.shutdown()


def test_a_tool_span_not_seen_starting_falls_back_to_the_global_provider_logged_once(
    global_spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    """Added while the tool spans are open, the processor sees them end but never held them:
    their provider is unknown, so the decisions go to the global provider, each counted, the
    first logged."""
    provider, exporter = provider_with_exporter("the-agent")
    tracer = provider.get_tracer("agent")
    processor = LoopGuardSpanProcessor(LoopGuard(PRESETS["default"]))
    with tracer.start_as_current_span(AGENT):
        open_spans = []
        for n in range(CALLS):
            span = tracer.start_span(
                TOOL,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search",
                    "gen_ai.tool.call.arguments": json.dumps({"query": "TODO"}),
                    "gen_ai.tool.call.id": f"c{n}",
                    "gen_ai.tool.call.result": "no match",
                },
            )
            open_spans.append(span)
        provider.add_span_processor(processor)
        with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
            for span in open_spans:
                span.end()
    fallen_back = decision_spans(global_spans)
    assert actions(fallen_back) == expected_actions()
    assert processor.decisions_to_global_provider == len(expected_actions())
    warnings = [r for r in caplog.records if "global tracer provider" in r.getMessage()]
    assert len(warnings) == 1
    assert "tracer_provider=" in warnings[0].getMessage()
    assert decision_spans(exporter) == []
    provider.shutdown()


def test_a_pipeline_that_raises_on_a_decision_span_never_reaches_the_application(
    global_spans: InMemorySpanExporter,
) -> None:
    """A processor of the application's that raises on the decision span (the SDK does not
    catch processor errors): the tool spans still end normally, the error is counted."""

    class RaisesOnDecisions(SpanProcessor):
        def on_start(self, span: Span, parent_context: Context | None = None) -> None:
            if span.name == DECISION_EVENT:
                raise RuntimeError("this processor does not like decisions")

    provider, exporter = provider_with_exporter("the-agent")
    processor = LoopGuardSpanProcessor(LoopGuard(PRESETS["default"]))
    provider.add_span_processor(processor)
    provider.add_span_processor(RaisesOnDecisions())
    looping_agent(provider.get_tracer("agent"))
    assert len([s for s in exporter.get_finished_spans() if s.name == TOOL]) == CALLS
    assert processor.guard.internal_errors == {
        "span_processor.decision_span": len(expected_actions())
    }
    assert global_spans.get_finished_spans() == ()
    provider.shutdown()
