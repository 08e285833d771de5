"""Shared by the CrewAI, Semantic Kernel, Agno and AutoGen adapter tests: a scripted model that
loops, reads the denial, then works with another tool (which must never be blocked), and spans
from an instrumentation bound to one provider for the whole process, handed to each test's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from .conftest import ARGUMENTS, SAFETY_CAP, TOOL, plain

#: The other tool, called with new arguments each time after the denial.
OTHER_TOOL = "get_weather"
#: How many times the model calls it (each time for another city).
DETOUR_CALLS = 3


def other_arguments(n: int) -> dict[str, str]:
    """The arguments of the ``n``-th call of the other tool (from 1)."""
    return {"city": f"city {n}"}


def other_result(city: str) -> str:
    return f"{city}: 18 C, cloudy"


#: What the model reads from the other tool's calls, in order: never a reminder or a denial.
OTHER_RESULTS = [other_result(other_arguments(n)["city"]) for n in range(1, DETOUR_CALLS + 1)]


@dataclass
class Detour:
    """The model's mind: call ``search`` until a result says it was not run, then call
    ``get_weather`` :data:`DETOUR_CALLS` times, then answer. ``next_call`` returns the next
    (tool, arguments), or ``None`` to answer."""

    seen: list[str] = field(default_factory=list)  # tool results the model read, in order
    calls: int = 0  # calls of ``search`` it made
    other_calls: int = 0  # calls of the other tool it made
    tool_runs: int = 0  # times the ``search`` body ran
    other_runs: int = 0  # times the other tool's body ran

    def next_call(self, last_tool_result: str | None) -> tuple[str, dict[str, str]] | None:
        if last_tool_result is not None:
            self.seen.append(plain(last_tool_result))
        refused = any("Not run" in text for text in self.seen)
        if not refused:
            if self.calls >= SAFETY_CAP:
                return None
            self.calls += 1
            return TOOL, dict(ARGUMENTS)
        if self.other_calls < DETOUR_CALLS:
            self.other_calls += 1
            return OTHER_TOOL, other_arguments(self.other_calls)
        return None

    def run_tool(self, query: str) -> str:
        self.tool_runs += 1
        return f"results for {query!r}: nothing useful"

    def run_other(self, city: str) -> str:
        self.other_runs += 1
        return other_result(city)


class Forward(SpanProcessor):
    """A provider's only processor: hands its spans to the current test's provider."""

    def __init__(self) -> None:
        self.target: TracerProvider | None = None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.target is not None:
            self.target._active_span_processor.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if self.target is not None:
            self.target._active_span_processor.on_end(span)

    @contextmanager
    def to(self, provider: TracerProvider) -> Iterator[None]:
        """Spans go to ``provider`` inside the block."""
        self.target = provider
        try:
            yield
        finally:
            self.target = None


_GLOBAL = Forward()


def global_spans() -> Forward:
    """The forwarder behind the global tracer provider (Semantic Kernel and AutoGen trace
    through it, and it can be set once per process): set up on first use."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_GLOBAL)
        trace.set_tracer_provider(provider)
    return _GLOBAL
