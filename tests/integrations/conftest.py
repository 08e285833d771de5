"""Shared pieces of the framework adapter tests: which frameworks run here, the scripted loop,
what the guard should answer, and a real TracerProvider with two span processors.

Which test modules run: ``LOOPGUARD_FRAMEWORK_TESTS`` (comma-separated names, as ``.ci/frameworks``
sets it in each framework environment) selects them, and a selected framework that is missing
fails. Without it, outside CI every module runs whose framework is importable (the others skip);
in CI (``CI`` set) the main environment collects none of them: ``.ci/frameworks`` runs them.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, cast

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_loopguard import PRESETS, Action, Decision, LoopGuard
from otel_loopguard._advice import AdviceRequest
from otel_loopguard.metrics import PrometheusRecorder
from otel_loopguard.processor import LoopGuardSpanProcessor

#: test module -> (framework module to import, extra that installs it)
FRAMEWORKS = {
    "pydantic_ai": ("pydantic_ai", "pydantic-ai"),
    "openai_agents": ("agents", "openai-agents"),
    "langgraph": ("langgraph", "langgraph"),
    "strands": ("strands", "strands"),
    "google_adk": ("google.adk", "google-adk"),
    "smolagents": ("smolagents", "smolagents"),
    "llama_index": ("llama_index.core.agent.workflow", "llama-index"),
    "haystack": ("haystack.components.agents", "haystack"),
    "mcp": ("mcp.server.mcpserver", "mcp"),
    "crewai": ("crewai", "crewai"),
    "semantic_kernel": ("semantic_kernel", "semantic-kernel"),
    "agno": ("agno", "agno"),
    "autogen": ("autogen_agentchat", "autogen"),
    "dspy": ("dspy", "dspy"),
}
_SELECTED = os.environ.get("LOOPGUARD_FRAMEWORK_TESTS")
SELECTED = {name.strip() for name in _SELECTED.split(",") if name.strip()} if _SELECTED else None
if SELECTED is not None and not set(FRAMEWORKS) >= SELECTED:
    raise ValueError(
        f"LOOPGUARD_FRAMEWORK_TESTS: unknown names {sorted(SELECTED - set(FRAMEWORKS))}"
    )

collect_ignore = [
    f"test_{name}.py"
    for name in FRAMEWORKS
    if (name not in SELECTED if SELECTED is not None else bool(os.environ.get("CI")))
]


def require(name: str) -> ModuleType:
    """The framework for test module ``name``: a failure when it was selected or in CI, a skip
    elsewhere."""
    module, extra = FRAMEWORKS[name]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        reason = (
            f"{module} is not installed: pip install -e '.[{extra}]' in this checkout, or run"
            f" bash .ci/frameworks (the pinned versions): {exc}"
        )
        if SELECTED is not None or os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason, allow_module_level=True)


POLICY = PRESETS["default"]
TOOL = "search"
ARGUMENTS = {"query": "weather in Paris"}
RESULT = "results for 'weather in Paris': nothing useful"
FINAL = "I could not find more than the first result said."
#: A scripted model that keeps looping stops after this many calls even if nothing stops it, so a
#: broken adapter fails a test instead of hanging it.
SAFETY_CAP = 40


_SPENT = re.compile(r" This (?:loop|run) has used .*?\.(?=\s|$)")


def plain(text: str) -> str:
    """A text the model read, without what the loop has cost: the reference guard is told of no
    model turn, while a framework's instrumented run may report its scripted model's usage (Pydantic
    AI's FunctionModel does), and then the texts say what the loop has used."""
    return _SPENT.sub("", text)


def expected_decisions(attempts: int) -> list[Decision]:
    """What the guard answers a model that repeats the call ``attempts`` times (the same result
    every time it runs), through the plain hook API: the reference every adapter must match."""
    guard = LoopGuard(POLICY)
    decisions = []
    for n in range(attempts):
        decision = guard.before_tool(TOOL, ARGUMENTS, session="reference", call_id=str(n))
        decisions.append(decision)
        if not decision.blocks:
            guard.after_tool(TOOL, ARGUMENTS, session="reference", call_id=str(n), result=RESULT)
    return decisions


REFERENCE = expected_decisions(SAFETY_CAP)
FIRST_DENY = next(n for n, d in enumerate(REFERENCE, 1) if d.action is Action.DENY)
FIRST_STOP = next(n for n, d in enumerate(REFERENCE, 1) if d.action is Action.STOP)
assert POLICY.no_progress_threshold == FIRST_DENY  # the configured repeat, not a copied number


#: What the failing tool of the failure tests reports, the same way every time.
FAILURE = "search backend unavailable"


def expected_failure_stop() -> tuple[int, Decision]:
    """The call after which the guard stops a model that repeats a call failing the same way
    every time, and that stop (``phase`` post), through the plain hook API."""
    guard = LoopGuard(POLICY)
    for n in range(1, SAFETY_CAP + 1):
        decision = guard.before_tool(TOOL, ARGUMENTS, session="reference", call_id=str(n))
        assert not decision.blocks
        post = guard.after_tool(
            TOOL, ARGUMENTS, session="reference", call_id=str(n), error=True, result=FAILURE
        )
        if post is not None:
            return n, post
    raise AssertionError("the reference guard never stopped the failing call")


FAILURE_STOP, FAILURE_STOP_DECISION = expected_failure_stop()
assert POLICY.failure_stop_threshold == FAILURE_STOP < FIRST_DENY  # the configured threshold
assert FAILURE_STOP_DECISION.action is Action.STOP


def expected_tool_results(attempts: int) -> list[str]:
    """The tool results the model should read, call by call (a stop ends the run instead)."""
    texts = []
    for decision in REFERENCE[:attempts]:
        if decision.blocks:
            texts.append(decision.message)
        elif decision.action is Action.REMIND:
            texts.append(f"{RESULT}\n\n{decision.message}")
        else:
            texts.append(RESULT)
    return texts


@dataclass
class Script:
    """The scripted model's mind: call ``search`` again and again; with ``listen``, stop and
    answer once a tool result says the call was refused."""

    listen: bool = False
    seen: list[str] = field(default_factory=list)  # tool results the model read, in order
    calls: int = 0  # tool calls it made
    tool_runs: int = 0  # times the tool body ran

    def next_call(self, last_tool_result: str | None) -> bool:
        """Record what the model read; True to call the tool again, False to answer."""
        if last_tool_result is not None:
            self.seen.append(plain(last_tool_result))
        if self.listen and last_tool_result is not None and "Not run" in last_tool_result:
            return False
        if self.calls >= SAFETY_CAP:
            return False
        self.calls += 1
        return True

    def run_tool(self, query: str) -> str:
        self.tool_runs += 1
        return f"results for {query!r}: nothing useful"


# -- rescues: the advisor told the run's prompt -----------------------------------------------

#: What the advisor answers in the rescue tests; :class:`UntilAdvised` answers once it reads it.
ADVICE = "Answer from the first result: the search has nothing more."
#: Rescues from deny_threshold on (the default rescues only at the last denial before the stop),
#: with no cooldown, so each run of a test can ask.
RESCUE_POLICY = POLICY.replace(rescue_threshold=POLICY.deny_threshold, cooldown_seconds=0.0)
#: Two runs in one session, each with its own prompt.
PROMPTS = ("Find the weather in Paris for Sunday's picnic.", "And in Lyon, for Monday?")


@dataclass
class UntilAdvised(Script):
    """The scripted model, answering once a tool result carries the advice."""

    def next_call(self, last_tool_result: str | None) -> bool:
        if last_tool_result is not None and ADVICE in last_tool_result:
            self.seen.append(last_tool_result)
            return False
        return super().next_call(last_tool_result)


def advised_guard() -> tuple[LoopGuard, list[AdviceRequest]]:
    """A guard on :data:`RESCUE_POLICY` whose advisor answers :data:`ADVICE`; and the requests
    its advisor was given."""
    requests: list[AdviceRequest] = []

    def advisor(request: AdviceRequest) -> str:
        requests.append(request)
        return ADVICE

    return LoopGuard(RESCUE_POLICY, advisor=advisor), requests


@dataclass
class Tracing:
    """A real TracerProvider with the guard's processor (shared with the adapter) and a second
    processor on its own guard that sees the spans alone."""

    provider: TracerProvider
    exporter: InMemorySpanExporter
    guard: LoopGuard
    processor: LoopGuardSpanProcessor
    spans_only: LoopGuard


def make_tracing(key_by: str = "trace", spans_only: bool = True) -> Tracing:
    """``spans_only=False`` leaves the second processor out: where the processor decides at span
    start (Pydantic AI), ``current_decision()`` is per span, and two processors would race for it."""
    provider = TracerProvider()
    guard = LoopGuard(POLICY, recorder=PrometheusRecorder())
    processor = LoopGuardSpanProcessor(guard, key_by=key_by, tracer_provider=provider)
    observer = LoopGuard(POLICY, recorder=PrometheusRecorder())
    exporter = InMemorySpanExporter()
    provider.add_span_processor(processor)
    if spans_only:
        provider.add_span_processor(
            LoopGuardSpanProcessor(observer, key_by=key_by, tracer_provider=provider)
        )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider, exporter, guard, processor, observer)


def decision_events(tracing: Tracing) -> list[tuple[str, int]]:
    """(action, count) of every ``loopguard.decision`` span event, in the order spans ended."""
    from otel_loopguard.processor import DECISION_EVENT

    return [
        (
            str((event.attributes or {})["loopguard.action"]),
            int(cast(int, (event.attributes or {})["loopguard.count"])),
        )
        for span in tracing.exporter.get_finished_spans()
        for event in span.events
        if event.name == DECISION_EVENT
    ]


@pytest.fixture
def tracing() -> Iterator[Tracing]:
    tracing = make_tracing()
    yield tracing
    tracing.provider.shutdown()


def calls_seen(guard: LoopGuard, tool: str = TOOL) -> int:
    """``loopguard_tool_calls_total`` for ``tool``, summed over agents, from the registry."""
    recorder = guard.recorder
    assert isinstance(recorder, PrometheusRecorder)
    total = 0.0
    for metric in recorder.registry.collect():
        for sample in metric.samples:
            if sample.name == "loopguard_tool_calls_total" and sample.labels.get("tool") == tool:
                total += sample.value
    return int(total)


def tool_spans(tracing: Tracing) -> list[Any]:
    """Finished spans the processor takes for tool spans of ``search``."""
    from otel_loopguard._conventions import tool_call_from_span

    spans = []
    for span in tracing.exporter.get_finished_spans():
        events = [(event.name, event.attributes or {}) for event in span.events]
        call = tool_call_from_span(span.name, dict(span.attributes or {}), events, None)
        if call is not None and call.tool == TOOL:
            spans.append(span)
    return spans
