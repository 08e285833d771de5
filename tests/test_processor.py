"""LoopGuardSpanProcessor on real span dumps, through a real TracerProvider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from otel_loopguard import PRESETS, Action, Decision, LoopGuard, Phase
from otel_loopguard.processor import DECISION_EVENT, LoopGuardSpanProcessor, current_decision

from .span_dumps import (
    BLOCKED_CALLS_TRACED,
    CHANGING_RESULTS,
    WITHOUT_ARGUMENTS,
    bare_tool,
    dump_id,
    dump_paths,
    load,
    rebuild,
)

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
        # passes whatever the entrances give through: typed loosely on purpose
        guard.decide_at_span_start = decide  # type: ignore[method-assign, assignment]


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


@pytest.mark.parametrize("path", dump_paths(), ids=dump_id)
def test_every_dump_finds_the_loop(path: Path) -> None:
    recording, exporter, processor = run_dump(path)
    if dump_id(path) in WITHOUT_ARGUMENTS:
        # Recognised tool spans without arguments are skipped (count_calls_without_arguments
        # is off by default).
        assert recording.decisions == [] and decision_events(exporter) == []
        assert processor.guard.internal_errors == {}
        return
    calls = [(bare_tool(path, tool), d) for tool, d in recording.decisions]
    searches = [d for tool, d in calls if tool == "search"]
    weather = [d for tool, d in calls if tool == "get_weather"]
    assert len(weather) == 1
    # smolagents' final_answer is a tool span too, never tracked: the guard returns nothing
    assert len(calls) == len(searches) + 1
    blocked_run = "blocked" in path.name
    # Most frameworks emit no tool span for a call their own hook blocked (the 3rd and later
    # identical searches): only two searches are left to see.
    no_spans_for_blocked = blocked_run and dump_id(path) not in BLOCKED_CALLS_TRACED
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
    if blocked_run or dump_id(path) in CHANGING_RESULTS:
        # Pydantic AI (and Agno, CrewAI's event listener, MCP) still emit a span for each call
        # their hook blocked: they count as repeats (the count climbs through get_weather), but
        # the block message, which numbers each block, differs every time, so the outcome looks
        # like polling: reminded, not denied. So do CrewAI's numbered search results.
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
    assert {
        e["loopguard.signature"]
        for e in events
        if bare_tool(path, e["gen_ai.tool.name"]) == "search"
    } == {searches[1].signature}
    assert [e["loopguard.action"] for e in events] == [d.detected.value for d in non_allow]
    assert all("loopguard.arguments" not in e for e in events)
    assert processor.guard.internal_errors == {}


@pytest.mark.parametrize(
    "path", [p for p in dump_paths() if dump_id(p) in WITHOUT_ARGUMENTS], ids=dump_id
)
def test_spans_without_arguments_count_by_tool_name_when_the_policy_says_so(path: Path) -> None:
    policy = DEFAULT.replace(count_calls_without_arguments=True)
    recording, exporter, processor = run_dump(path, LoopGuard(policy), capture_arguments=True)
    calls = [(bare_tool(path, tool), d) for tool, d in recording.decisions]
    blocked_spans = "blocked" in path.name and dump_id(path) not in BLOCKED_CALLS_TRACED
    expected = ["search", "search", "get_weather"] if blocked_spans else ["search"] * 6
    assert [tool for tool, _ in calls][: len(expected)] == expected
    searches = [d for tool, d in calls if tool == "search"]
    # one signature: the tool without arguments
    assert len({d.signature for d in searches[1:]}) == 1 and searches[1].repeated
    events = decision_events(exporter)
    assert all(e["loopguard.arguments"] == "{}" for e in events)
    assert bool(events) is not blocked_spans  # two searches alone are not reminded
    if "blocked" not in path.name:
        deny = DEFAULT.deny_threshold  # no result on the span either: an unknown outcome
        assert deny is not None
        assert [d.detected for d in searches[: deny - 1]].count(Action.DENY) == 0
        assert searches[deny - 1].detected is Action.DENY
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


# -- conclusions after a call (phase post) --------------------------------------------------------


def _failing_call(tracer: Any, n: int, *, at_start: bool, seen: list[Decision | None]) -> None:
    """One call of ``bash`` that fails the same way, as a GenAI tool span: the arguments given at
    start (Pydantic AI's way, decided then) or set later (decided at the span's end). ``seen``
    gets what :func:`current_decision` says inside the span."""
    arguments = '{"command": "make"}'
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "bash",
        "gen_ai.tool.call.id": f"c{n}",
    }
    if at_start:
        attributes["logfire.msg"] = "running tool: bash"
        attributes["gen_ai.tool.call.arguments"] = arguments
    with tracer.start_as_current_span("execute_tool bash", attributes=attributes) as span:
        seen.append(current_decision())
        span.set_attribute("gen_ai.tool.call.arguments", arguments)
        span.set_attribute("gen_ai.tool.call.result", "error: make: *** [all] Error 2")
        span.set_status(Status(StatusCode.ERROR, "exit status 2"))


@pytest.mark.parametrize("at_start", [False, True], ids=["decided-at-end", "decided-at-start"])
def test_a_stop_concluded_at_a_spans_end_is_recorded_with_phase_post(at_start: bool) -> None:
    limit = DEFAULT.failure_stop_threshold
    assert limit is not None
    guard = LoopGuard(DEFAULT)
    recording = Recording(guard)
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(guard, tracer_provider=provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(processor)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    seen: list[Decision | None] = []
    with tracer.start_as_current_span(
        "invoke_agent builder",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "builder"},
    ):
        keys = processor.current_session()
        for n in range(1, limit + 1):
            _failing_call(tracer, n, at_start=at_start, seen=seen)
        stop: Decision = recording.decisions[-1][1]
        assert (stop.action, stop.phase, stop.count) == (Action.STOP, Phase.POST, limit)
        # kept for a framework adapter whose report of the call comes after the span's, once
        assert keys is not None
        assert processor.take_concluded(*keys, stop.signature) is stop
        assert processor.take_concluded(*keys, stop.signature) is None
        _failing_call(tracer, limit + 1, at_start=at_start, seen=seen)  # stopped: refused
    agent_span = next(s for s in exporter.get_finished_spans() if s.name.startswith("invoke"))
    decision_spans = [s for s in exporter.get_finished_spans() if s.name == DECISION_EVENT]
    # decisions made at a span's end are short decision spans, children of the agent span (the
    # tool span's parent): nothing rides on the agent span, which might never end
    assert not [e for e in agent_span.events if e.name == DECISION_EVENT]
    assert all(
        s.parent is not None and s.parent.span_id == agent_span.context.span_id
        for s in decision_spans
    )
    assert all(
        dict(s.attributes or {}) == dict(s.events[0].attributes or {}) for s in decision_spans
    )
    events = [dict(e.attributes or {}) for s in decision_spans for e in s.events]
    post = [e for e in events if e["loopguard.phase"] == "post"]
    # the third identical failure: a stop after the call ran
    assert [
        (e["loopguard.action"], e["loopguard.count"], e["loopguard.threshold"]) for e in post
    ] == [("stop", limit, limit)]
    assert post[0]["loopguard.rule"] == "no_progress"
    assert post[0]["gen_ai.tool.call.id"] == f"c{limit}"
    assert post[0]["loopguard.signature"] == stop.signature
    tool_events = [
        dict(e.attributes or {})
        for s in exporter.get_finished_spans()
        if s.name == "execute_tool bash"
        for e in s.events
        if e.name == DECISION_EVENT
    ]
    # every other event is a decision before a call (or, for a call counted at its end, what it
    # would have been): the call after the stop is refused
    assert {e["loopguard.phase"] for e in events + tool_events if e not in post} == {"pre"}
    if at_start:
        # current_decision() in each tool span is the decision made at its start, never one made
        # after a call: the third call was reminded before it ran
        assert [d.action if d else None for d in seen] == [
            Action.ALLOW,
            Action.ALLOW,
            Action.REMIND,
            Action.STOP,
        ]
        assert all(d is not None and d.phase is Phase.PRE for d in seen)
        assert [e["loopguard.action"] for e in tool_events] == ["remind", "stop"]
    else:
        assert seen == [None] * (limit + 1)
        assert [e["loopguard.action"] for e in events] == ["stop", "stop"]
    assert current_decision() is None
    assert guard.internal_errors == {}


def test_decision_spans_under_a_concurrent_multi_span_processor_do_not_deadlock() -> None:
    from opentelemetry.sdk.trace import ConcurrentMultiSpanProcessor

    guard = LoopGuard(DEFAULT)
    multi = ConcurrentMultiSpanProcessor(num_threads=2)
    provider = TracerProvider(active_span_processor=multi)
    processor = LoopGuardSpanProcessor(guard, tracer_provider=provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(processor)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("invoke_agent a"):  # one trace: one session
        for n in range(6):
            with tracer.start_as_current_span(
                "execute_tool search",
                attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"},
            ) as span:
                span.set_attribute("gen_ai.tool.call.arguments", '{"query": "weather"}')
                span.set_attribute("gen_ai.tool.call.id", f"c{n}")
                span.set_attribute("gen_ai.tool.call.result", "nothing useful")
    processor.shutdown()  # waits for the decision spans emitted from the processor's thread
    decisions = [s for s in exporter.get_finished_spans() if s.name == DECISION_EVENT]
    provider.shutdown()
    assert [dict(s.attributes or {})["loopguard.action"] for s in decisions][:2] == [
        "remind",
        "deny",
    ]
