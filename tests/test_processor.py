"""LoopGuardSpanProcessor on real span dumps, through a real TracerProvider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_loopguard import PRESETS, Action, LoopGuard
from otel_loopguard.processor import DECISION_EVENT, LoopGuardSpanProcessor, current_decision

from .span_dumps import dump_paths, load, rebuild

DEFAULT = PRESETS["default"]


class Recording:
    """A guard wrapped to record every decision the processor gets, in order."""

    def __init__(self, guard: LoopGuard) -> None:
        self.decisions: list[tuple[str, Any]] = []
        original_after, original_start = guard.after_tool, guard.decide_at_span_start

        def after_tool(tool: str, arguments: object, **kwargs: Any) -> Any:
            decision = original_after(tool, arguments, **kwargs)
            if decision is not None:
                self.decisions.append((tool, decision))
            return decision

        def decide(tool: object, *args: Any) -> Any:
            decision = original_start(tool, *args)
            self.decisions.append((str(tool), decision))
            return decision

        guard.after_tool = after_tool  # type: ignore[method-assign]
        guard.decide_at_span_start = decide  # type: ignore[method-assign]


def run_dump(
    path: Path, guard: LoopGuard | None = None, **options: Any
) -> tuple[Recording, InMemorySpanExporter, LoopGuardSpanProcessor]:
    guard = guard or LoopGuard(DEFAULT)
    recording = Recording(guard)
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(guard, tracer_provider=provider, **options)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(processor)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rebuild(load(path), provider.get_tracer("fixture"))
    return recording, exporter, processor


def decision_events(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    return [
        dict(event.attributes or {})
        for span in exporter.get_finished_spans()
        for event in span.events
        if event.name == DECISION_EVENT
    ]


@pytest.mark.parametrize("path", dump_paths(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_dump_finds_the_loop(path: Path) -> None:
    recording, exporter, processor = run_dump(path)
    searches = [d for tool, d in recording.decisions if tool == "search"]
    weather = [d for tool, d in recording.decisions if tool == "get_weather"]
    assert len(weather) == 1
    blocked_run = "blocked" in path.name
    # Strands and LangGraph emit no tool span for a call their own hook blocked (the 3rd and
    # later identical searches): only two searches are left to see.
    no_spans_for_blocked = blocked_run and path.parent.name != "pydantic_ai"
    assert len(searches) == (2 if no_spans_for_blocked else 7)
    first_six = searches[:6]
    # every repeat of search carries the one signature (a first call is a plain allow)
    assert len({d.signature for d in searches[1:]}) == 1 and searches[1].repeated
    # get_weather is a different call: new, not a repeat, and the search after it counts on
    assert weather[0].detected is Action.ALLOW and not weather[0].repeated
    assert searches[-1].repeated
    if no_spans_for_blocked:
        assert [d.detected for d in searches] == [Action.ALLOW, Action.ALLOW]
        assert searches[1].count == 2
        return
    actions = [d.detected for d in first_six]
    remind_at = DEFAULT.remind_thresholds[0]
    assert actions[: remind_at - 1] == [Action.ALLOW] * (remind_at - 1)
    assert actions[remind_at - 1] is Action.REMIND
    if blocked_run:
        # Pydantic AI still emits a span for each call its hook blocked: they count as repeats
        # (the count climbs through get_weather), but the block message, which numbers each
        # block, differs every time, so the outcome looks like polling: reminded, not denied.
        assert [d.count for d in searches] == [0, 2, 3, 4, 5, 6, 7]
        assert all(a is Action.REMIND for a in actions[DEFAULT.remind_thresholds[-1] - 1 :])
    else:
        stuck = DEFAULT.no_progress_threshold
        assert stuck is not None
        assert actions[stuck - 1] is Action.DENY
        assert searches[-1].detected is Action.STOP  # three denials retried, then again
    events = decision_events(exporter)
    non_allow = [d for _, d in recording.decisions if d.detected is not Action.ALLOW]
    assert len(events) == len(non_allow)
    assert {e["loopguard.signature"] for e in events if e["gen_ai.tool.name"] == "search"} == {
        searches[1].signature
    }
    assert [e["loopguard.action"] for e in events] == [d.detected.value for d in non_allow]
    assert all("loopguard.arguments" not in e for e in events)
    assert processor.guard.internal_errors == {}


def test_pydantic_decides_at_start_on_the_tool_span() -> None:
    path = next(
        p for p in dump_paths() if p.parent.name == "pydantic_ai" and p.name == "spans.jsonl"
    )
    recording, exporter, _ = run_dump(path)
    tool_spans = [s for s in exporter.get_finished_spans() if s.name == "execute_tool search"]
    with_events = [s for s in tool_spans if any(e.name == DECISION_EVENT for e in s.events)]
    # at start the tool span is still open: the event is on the tool span itself
    assert len(with_events) == len(
        [d for t, d in recording.decisions if t == "search" and d.detected is not Action.ALLOW]
    )
    assert with_events


def test_end_decisions_go_on_the_nearest_open_ancestor() -> None:
    path = next(p for p in dump_paths() if p.parent.name == "strands" and p.name == "spans.jsonl")
    _, exporter, _ = run_dump(path)
    carriers = {
        s.name
        for s in exporter.get_finished_spans()
        if any(e.name == DECISION_EVENT for e in s.events)
    }
    assert carriers and not any(name.startswith("execute_tool") for name in carriers)


def test_capture_arguments_puts_the_preview_on_events() -> None:
    path = next(p for p in dump_paths() if p.parent.name == "strands" and p.name == "spans.jsonl")
    _, exporter, _ = run_dump(path, capture_arguments=True)
    events = decision_events(exporter)
    assert events and all(
        e["loopguard.arguments"] == '{"query":"weather in Paris"}'
        for e in events
        if e["gen_ai.tool.name"] == "search"
    )


def test_current_decision_is_visible_inside_the_tool_span() -> None:
    guard = LoopGuard(DEFAULT)
    provider = TracerProvider()
    provider.add_span_processor(LoopGuardSpanProcessor(guard))
    tracer = provider.get_tracer("t")
    seen = []
    with tracer.start_as_current_span(
        "invoke_agent a",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"},
    ):
        for n in range(DEFAULT.deny_threshold or 6):
            with tracer.start_as_current_span(
                "execute_tool search",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search",
                    "gen_ai.tool.call.id": f"c{n}",
                    "logfire.msg": "running tool: search",
                    "gen_ai.tool.call.arguments": '{"q": "x"}',
                },
            ):
                decision = current_decision()
                assert decision is not None
                seen.append(decision.action)
    assert current_decision() is None
    assert Action.DENY in seen and seen[0] is Action.ALLOW
