"""Decisions before the tool runs, from the model span's requested calls (issue 27).

The recorded spans of each framework whose model spans carry the request are replayed through a
real TracerProvider with the span processor; inside each tool span a tool wrapped by
``@otel_loopguard.enforce`` runs, as the framework would run it. The repeated search is refused
there, before it runs, from spans alone; each call counts once, with a framework hook's reports
too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

import otel_loopguard
from otel_loopguard import Action, LoopDetected, LoopGuard, Mode, Phase, Policy
from otel_loopguard._conventions import tool_call_from_span
from otel_loopguard._early import EarlyDecisions
from otel_loopguard.integrations._hook import Ticket, ToolHook
from otel_loopguard.metrics import NoopRecorder
from otel_loopguard.processor import DECISION_EVENT, LoopGuardSpanProcessor, current_decision

from .conftest import SPAN_DUMPS as DUMPS_DIR
from .span_dumps import load, timeline
from .test_requested_calls import REQUESTING

SEARCH = {"query": "weather in Paris"}


class Counting(NoopRecorder):
    """Counts the tracked calls the guard counted (a real recorder of the metrics protocol)."""

    def __init__(self) -> None:
        self.calls = 0

    def tool_call(self, agent: str | None, tool: str, repeated: bool) -> None:
        self.calls += 1


def end_view(record: dict[str, Any]) -> Any:
    events = [(event["name"], event["attributes"]) for event in record["events"]]
    failed = record["status"]["code"] == "ERROR"
    return tool_call_from_span(record["name"], record["attributes"], events, failed)


def replay(
    path: Path, *, hooks: bool = False, policy: Policy | None = None, key_by: str = "trace"
) -> tuple[list[str], Counting, list[Any], LoopGuardSpanProcessor]:
    """The dump replayed with the processor; in each tool span a guarded tool runs. Returns what
    the tool did at each tool span ("ran", "refused", or a reminder), the counts, the finished
    spans and the processor."""
    recorder = Counting()
    guard = LoopGuard(policy or Policy(), recorder=recorder)
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(
        guard, tracer_provider=provider, decide_requests=True, key_by=key_by
    )
    exporter = InMemorySpanExporter()
    provider.add_span_processor(processor)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("fixture")

    @otel_loopguard.enforce
    def tool() -> str:
        return "ran"

    outcomes: list[str] = []
    live: dict[str, Any] = {}
    tickets: dict[str, Ticket] = {}
    hook = ToolHook(processor=processor)
    for what, record in timeline(load(path)):
        if what == "start":
            parent = live.get(record["parent_span_id"] or "")
            context = trace.set_span_in_context(parent) if parent is not None else None
            span = live[record["span_id"]] = tracer.start_span(
                record["name_at_start"],
                context=context,
                kind=SpanKind[record["kind"]],
                attributes=record["attributes_at_start"],
                start_time=record["start_time_ns"],
            )
            call = end_view(record)
            if call is not None and call.tool != "final_answer":
                with trace.use_span(span):
                    if hooks:  # a framework adapter's hook inside the tool span
                        keys = hook.keys()
                        ticket = hook.before(call.tool, call.arguments, call.call_id, keys)
                        tickets[record["span_id"]] = ticket
                    try:
                        outcomes.append(tool())
                    except LoopDetected:
                        outcomes.append("refused")
            continue
        span = live[record["span_id"]]
        if record["name"] != record["name_at_start"]:
            span.update_name(record["name"])
        span.set_attributes(record["attributes"])
        for event in record["events"]:
            span.add_event(event["name"], event["attributes"], timestamp=event["timestamp_ns"])
        if record["status"]["code"] == "ERROR":
            span.set_status(Status(StatusCode.ERROR, record["status"].get("description")))
        taken = tickets.pop(record["span_id"], None)
        if taken is not None:
            hook.after(taken, result="x")
        span.end(end_time=record["end_time_ns"])
    return outcomes, recorder, list(exporter.get_finished_spans()), processor


#: The Vercel AI SDK runs in Node: its spans reach the guard through serve or replay, never this
#: processor (and its millisecond timestamps put a tool span's start before the end of the
#: model span that requested it).
IN_PROCESS = sorted(set(REQUESTING) - {"vercel_ai"})


def requesting_dumps() -> list[Path]:
    return [DUMPS_DIR / framework / "spans.jsonl" for framework in IN_PROCESS]


@pytest.mark.parametrize("path", requesting_dumps(), ids=lambda p: p.parent.name)
def test_the_repeated_search_is_refused_before_it_runs_from_spans_alone(path: Path) -> None:
    outcomes, recorder, spans, _ = replay(path)
    # Eight tool spans (six searches, the weather, a search); from the fourth identical search
    # on, the call is refused inside its span, before it runs (enforce mode, default preset).
    assert len(outcomes) == 8, outcomes
    assert outcomes[:3] == ["ran"] * 2 + [outcomes[2]] and outcomes[2].startswith("ran")
    assert "[loopguard]" in outcomes[2]  # the third: a reminder appended to the result
    assert outcomes[3:6] == ["refused"] * 3
    # Each call counted once: the requests, not again at the tool spans' ends.
    assert recorder.calls == 8
    # The decisions were made at the model spans' ends: phase request, before the tool spans.
    decisions = [s for s in spans if s.name == DECISION_EVENT]
    phases = {(s.attributes or {}).get("loopguard.phase") for s in decisions}
    assert "request" in phases


@pytest.mark.parametrize("path", requesting_dumps(), ids=lambda p: p.parent.name)
@pytest.mark.parametrize("key_by", ["trace", "conversation"])
def test_with_an_adapters_hook_each_call_still_counts_once(path: Path, key_by: str) -> None:
    # The adapters' shared hook (given processor=), asking with the framework's call id as
    # adapters do: it gets the early decision, and its report of the call only adds the outcome.
    # Keyed by conversation, a tool span that names its conversation only after its start
    # (Strands, LangGraph) finds the calls its agent requested, and the hook asks with its keys.
    outcomes, recorder, _, _ = replay(path, hooks=True, key_by=key_by)
    assert recorder.calls == 8
    assert outcomes[3:6] == ["refused"] * 3


def test_observe_mode_decides_early_and_refuses_nothing() -> None:
    path = DUMPS_DIR / "langgraph" / "spans.jsonl"
    outcomes, recorder, spans, _ = replay(path, policy=Policy(mode=Mode.OBSERVE))
    assert "refused" not in outcomes and recorder.calls == 8
    assert any(s.name == DECISION_EVENT for s in spans)


def test_off_by_default_the_calls_are_decided_at_the_tool_spans() -> None:
    guard = LoopGuard(Policy())
    assert LoopGuardSpanProcessor(guard).decide_requests is False
    with pytest.raises(ValueError, match="decide_requests"):
        LoopGuardSpanProcessor(guard, decide_requests="yes")  # type: ignore[arg-type]


def test_the_ledger_is_empty_after_the_run() -> None:
    _, _, _, processor = replay(DUMPS_DIR / "strands" / "spans.jsonl")
    assert len(processor.guard.early) == 0 and processor.guard.early.tools == {}
    assert current_decision() is None


# -- the guard's seam, without spans ----------------------------------------------------------


def test_a_hook_reuses_the_early_decision_once() -> None:
    recorder = Counting()
    guard = LoopGuard(Policy(), recorder=recorder)
    for n in range(4):
        (early,) = guard.decide_requested([("search", SEARCH, f"c{n}")], session="s")
        assert guard.before_tool("search", SEARCH, session="s", call_id=f"c{n}") is early
        assert guard.after_tool("search", SEARCH, session="s", call_id=f"c{n}", result="r") is None
    assert recorder.calls == 4
    assert early.action is Action.DENY and early.phase is Phase.REQUEST
    # A second before_tool of the same call is a new attempt.
    again = guard.before_tool("search", SEARCH, session="s", call_id="c3")
    assert recorder.calls == 5 and again.phase is Phase.PRE


def test_a_hook_without_the_call_id_matches_by_arguments() -> None:
    recorder = Counting()
    guard = LoopGuard(Policy(), recorder=recorder)
    guard.decide_requested([("search", SEARCH, "c0")], session="s")
    guard.before_tool("search", {"query": "weather in Paris"}, session="s")
    assert recorder.calls == 1  # the same call: not counted again
    guard.before_tool("search", {"query": "elsewhere"}, session="s")
    assert recorder.calls == 2


def test_a_requested_call_that_never_runs_is_replaced_by_the_next_response() -> None:
    recorder = Counting()
    guard = LoopGuard(Policy(), recorder=recorder)
    guard.decide_requested([("search", SEARCH, "c0"), ("fetch", {"u": 1}, "c1")], session="s")
    assert set(guard.early.tools) == {"search", "fetch"}
    guard.decide_requested([("search", SEARCH, "c2")], session="s")  # fetch never ran
    assert guard.early.tools == {"search": 1}
    # Counted as attempts (three), never as run: no outcome was reported for c0 or c1.
    assert recorder.calls == 3


def test_several_calls_in_one_response_are_decided_in_order_as_hooks_would() -> None:
    early, hooked = LoopGuard(Policy()), LoopGuard(Policy())
    decisions = early.decide_requested(
        [("search", SEARCH, f"c{n}") for n in range(4)], session="s", agent="a"
    )
    before = [
        hooked.before_tool("search", SEARCH, session="s", agent="a", call_id=f"c{n}")
        for n in range(4)
    ]
    assert [(d.action, d.rule, d.count) for d in decisions] == [
        (d.action, d.rule, d.count) for d in before
    ]
    assert decisions[2].action is Action.REMIND and decisions[2].phase is Phase.REQUEST
    assert len(early.early) == 4


def test_untracked_and_argumentless_requests_are_allowed_and_kept_for_matching() -> None:
    recorder = Counting()
    guard = LoopGuard(Policy(exclude=("fetch",)), recorder=recorder)
    decisions = guard.decide_requested(
        [("fetch", {"u": 1}, "c0"), ("search", None, "c1")], session="s"
    )
    assert all(d.action is Action.ALLOW for d in decisions) and recorder.calls == 0
    assert len(guard.early) == 2


def test_the_ledger_is_bounded() -> None:
    ledger = EarlyDecisions(max_sessions=3)
    guard = LoopGuard(Policy())
    for n in range(10):
        guard.decide_requested([("search", SEARCH, "c")], session=f"s{n}")
    assert len(guard.early) <= 4096
    from otel_loopguard._early import Early
    from otel_loopguard._policy import ALLOW

    for n in range(10):
        ledger.put(f"s{n}", None, [Early("t", "k", None, ALLOW)])
    assert len(ledger) == 3 and ledger.tools == {"t": 3}


def test_a_bad_request_never_raises() -> None:
    guard = LoopGuard(Policy())
    assert guard.decide_requested([("search",)], session="s") == []  # type: ignore[list-item]
    assert guard.internal_errors.get("requested") == 1


# -- the decorator --------------------------------------------------------------------------


def test_enforce_outside_any_span_runs_the_tool() -> None:
    @otel_loopguard.enforce(on_block="return")
    def tool(x: int) -> int:
        return x + 1

    assert tool(1) == 2 and tool.__name__ == "tool"


def test_enforce_returns_the_refusal_or_appends_the_reminder_sync_and_async() -> None:
    import asyncio

    guard = LoopGuard(Policy())
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(guard, decide_requests=True)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")

    @otel_loopguard.enforce(on_block="return")
    def search(query: str) -> str:
        return f"results for {query}"

    @otel_loopguard.enforce
    async def asearch(query: str) -> str:
        return f"results for {query}"

    seen = []
    with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.agent.name": "a"}):
        for n in range(5):
            part = {
                "type": "tool_call",
                "id": f"c{n}",
                "name": "search",
                "arguments": {"query": "q"},
            }
            message = json.dumps([{"role": "assistant", "parts": [part]}])
            with tracer.start_as_current_span(
                "chat m", attributes={"gen_ai.operation.name": "chat"}
            ) as chat:
                chat.set_attribute("gen_ai.output.messages", message)
            with tracer.start_as_current_span(
                "execute_tool search",
                attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"},
            ) as span:
                seen.append(search("q") if n < 4 else "async")
                if n == 4:
                    with pytest.raises(LoopDetected):
                        asyncio.run(asearch("q"))
                span.set_attribute("gen_ai.tool.call.arguments", '{"query": "q"}')
                span.set_attribute("gen_ai.tool.call.id", f"c{n}")
                span.set_attribute("gen_ai.tool.call.result", "results for q")
    assert seen[:2] == ["results for q"] * 2
    assert seen[2].startswith("results for q\n\n[loopguard]")  # the reminder appended
    assert seen[3].startswith("[loopguard]")  # the refusal, as the tool's result
    assert guard.internal_errors == {}


def test_enforce_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="on_block"):
        otel_loopguard.enforce(on_block="skip")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="fn"):
        otel_loopguard.enforce(3)  # type: ignore[call-overload]
