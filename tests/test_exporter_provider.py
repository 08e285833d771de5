"""The exporter, unchained, starts its decision spans on the global provider (it sees finished
spans only, which do not lead back to their provider): when that demonstrably misses the tool
spans' provider, one warning says to pass ``tracer_provider=`` or ``next=`` (issue 21)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_loopguard import PRESETS, LoopGuard, LoopGuardSpanExporter
from otel_loopguard.processor import DECISION_EVENT

from .test_processor_provider import actions, decision_spans, expected_actions, looping_agent

WARNING = "pass tracer_provider="


def loopguard_on(
    provider: TracerProvider, tracer_provider: TracerProvider | None = None
) -> tuple[LoopGuardSpanExporter, InMemorySpanExporter]:
    """The exporter unchained in a span processor of its own, beside an in-memory exporter."""
    exporter = LoopGuardSpanExporter(
        LoopGuard(PRESETS["default"]), hold_seconds=None, tracer_provider=tracer_provider
    )
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, memory


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]


@pytest.fixture
def global_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[TracerProvider]:
    """A real global provider for one test (swapped in and restored: the API sets it once)."""
    provider = TracerProvider(resource=Resource({"service.name": "the-global-provider"}))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield provider
    provider.shutdown()


def test_on_the_global_provider_decision_spans_come_back_and_nothing_is_logged(
    global_provider: TracerProvider, caplog: pytest.LogCaptureFixture
) -> None:
    exporter, memory = loopguard_on(global_provider)
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        looping_agent(global_provider.get_tracer("agent"))
    assert actions(decision_spans(memory)) == expected_actions()
    assert warnings(caplog) == []
    assert exporter.guard.internal_errors == {}


def test_on_another_provider_one_warning_says_the_decisions_go_elsewhere(
    global_provider: TracerProvider, caplog: pytest.LogCaptureFixture
) -> None:
    global_memory = InMemorySpanExporter()
    global_provider.add_span_processor(SimpleSpanProcessor(global_memory))
    provider = TracerProvider(resource=Resource({"service.name": "the-agent"}))
    exporter, memory = loopguard_on(provider)
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        looping_agent(provider.get_tracer("agent"))
        looping_agent(provider.get_tracer("agent"))  # a second trace: no second warning
    assert decision_spans(memory) == []
    assert actions(decision_spans(global_memory)) == expected_actions() * 2
    (message,) = warnings(caplog)
    assert "resource" in message and "next=" in message
    provider.shutdown()


def test_an_explicit_tracer_provider_gets_them_without_a_warning(
    global_provider: TracerProvider, caplog: pytest.LogCaptureFixture
) -> None:
    provider = TracerProvider(resource=Resource({"service.name": "the-agent"}))
    exporter, memory = loopguard_on(provider, tracer_provider=provider)
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        looping_agent(provider.get_tracer("agent"))
    assert actions(decision_spans(memory)) == expected_actions()
    assert warnings(caplog) == []
    provider.shutdown()


def test_with_no_global_provider_the_warning_says_they_are_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    provider = TracerProvider()
    exporter, memory = loopguard_on(provider)
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        looping_agent(provider.get_tracer("agent"))
    assert [s for s in memory.get_finished_spans() if s.name == DECISION_EVENT] == []
    (message,) = warnings(caplog)
    assert "dropped" in message
    assert exporter.guard.internal_errors == {}
    provider.shutdown()
