"""LoopGuardSpanExporter: the span processor's and replay's decisions, judged on the SDK's worker
from finished spans, shown as ``loopguard.decision`` spans; never raising, bounded."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from opentelemetry.sdk.trace import ReadableSpan, Tracer, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_loopguard import LoopGuardSpanExporter
from otel_loopguard._conventions import tool_call_from_span
from otel_loopguard._guard import LoopGuard
from otel_loopguard._policy import Decision
from otel_loopguard.config import PRESETS
from otel_loopguard.exporter import DEFAULT_HOLD_SECONDS, SCOPE_NAME
from otel_loopguard.metrics import PrometheusRecorder
from otel_loopguard.processor import DECISION_EVENT, LoopGuardSpanProcessor

from .conftest import FakeClock
from .span_dumps import REFERENCE_DUMP, dump_paths, load, loop_actions, rebuild
from .test_replay_traces import (
    Row,
    Sessions,
    agent_attributes,
    dump_id,
    genai_tool,
    replay_sessions,
    same_chains,
    same_sessions,
    synthetic_traces,
)

DEFAULT = PRESETS["default"]


def _row(tool: str, decision: Decision) -> Row:
    action = decision.action.value
    rule = decision.rule.value if action != "allow" and decision.rule is not None else None
    return (tool, action, rule, decision.count)


def recording_guard(recorder: PrometheusRecorder | None = None) -> tuple[LoopGuard, Sessions]:
    """A guard with the default preset that records each decision it gives, by session label
    as replay names it (``session`` or ``session/agent``)."""
    guard = LoopGuard(DEFAULT, recorder=recorder)
    sessions: Sessions = defaultdict(list)
    after, decide = guard.after_tool, guard.decide_at_span_start

    def label(session: str, agent: str | None) -> str:
        return session if agent is None else f"{session}/{agent}"

    def after_tool(tool: str, arguments: object, **kwargs: Any) -> Decision | None:
        decision = after(tool, arguments, **kwargs)
        if decision is not None:
            sessions[label(kwargs["session"], kwargs.get("agent"))].append(_row(tool, decision))
        return decision

    def decide_for_span(
        tool: object, arguments: object, session: str, agent: str | None, call_id: str | None
    ) -> Decision:
        decision = decide(tool, arguments, session, agent, call_id)
        sessions[label(session, agent)].append(_row(str(tool), decision))
        return decision

    guard.after_tool = after_tool  # type: ignore[method-assign]
    guard.decide_at_span_start = decide_for_span  # type: ignore[method-assign]
    return guard, sessions


class Run:
    """One rebuild of span-dump records through a real TracerProvider, watched one way."""

    def __init__(self, guard: LoopGuard, sessions: Sessions, spans: Sequence[ReadableSpan]):
        self.guard = guard
        self.sessions = dict(sessions)
        self.spans = list(spans)

    def decision_attributes(self) -> list[list[tuple[str, Any]]]:
        """The attributes of every ``loopguard.decision`` event in the exported spans."""
        return sorted(
            sorted(dict(event.attributes or {}).items())
            for span in self.spans
            for event in span.events
            if event.name == DECISION_EVENT
        )


def processor_run(records: list[dict[str, Any]], recorder: PrometheusRecorder | None = None) -> Run:
    guard, sessions = recording_guard(recorder)
    provider = TracerProvider()
    provider.add_span_processor(LoopGuardSpanProcessor(guard, tracer_provider=provider))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    rebuild(records, cast(Tracer, provider.get_tracer("fixture")))
    assert guard.internal_errors == {}
    return Run(guard, sessions, memory.get_finished_spans())


def exporter_run(
    records: list[dict[str, Any]],
    *,
    batch: bool = True,
    recorder: PrometheusRecorder | None = None,
    **options: Any,
) -> Run:
    """Through ``BatchSpanProcessor(LoopGuardSpanExporter(next=memory))`` (or a
    ``SimpleSpanProcessor``: one span per export), flushed as an application would at exit."""
    guard, sessions = recording_guard(recorder)
    memory = InMemorySpanExporter()
    exporter = LoopGuardSpanExporter(guard, next=memory, **options)
    provider = TracerProvider()
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    rebuild(records, cast(Tracer, provider.get_tracer("fixture")))
    provider.shutdown()  # the worker exports what is queued, then the exporter judges the rest
    spans = memory.get_finished_spans()
    assert guard.internal_errors == {}
    return Run(guard, sessions, spans)


class Recording(SpanExporter):
    """An in-memory exporter that survives shutdown and answers as told."""

    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS) -> None:
        self.batches: list[Sequence[ReadableSpan]] = []
        self.result = result
        self.flushed = 0
        self.shut = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches.append(spans)
        return self.result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.flushed += 1
        return True

    def shutdown(self) -> None:
        self.shut += 1

    @property
    def spans(self) -> list[ReadableSpan]:
        return [span for batch in self.batches for span in batch]


def finished(records: list[dict[str, Any]]) -> list[ReadableSpan]:
    """The records as finished SDK spans, in the order they ended."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    rebuild(records, cast(Tracer, provider.get_tracer("fixture")))
    return list(memory.get_finished_spans())


def decision_spans(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    return [span for span in spans if span.name == DECISION_EVENT]


# -- parity: every fixture dump ----------------------------------------------------------------


@pytest.mark.parametrize("path", dump_paths(), ids=dump_id)
def test_every_dump_gives_the_processors_and_replays_decisions(path: Path) -> None:
    records = load(path)
    expected = processor_run(records)
    got = exporter_run(records)
    same_chains(expected.sessions, got.sessions)
    same_chains(replay_sessions(path), got.sessions)
    calls = [row for rows in got.sessions.values() for row in rows]
    # the comparison is not between two empty reports
    assert loop_actions(path) <= {action for _, action, _, _ in calls}
    if path.parent.name == "pydantic_ai":  # agent frames too (see test_replay_traces)
        same_sessions(expected.sessions, got.sessions)
    # The same decisions shown, attribute for attribute, one decision span each.
    assert got.decision_attributes() == expected.decision_attributes()
    assert len(decision_spans(got.spans)) == len(got.decision_attributes())


@pytest.mark.parametrize("path", dump_paths(), ids=dump_id)
def test_one_span_per_export_waiting_for_the_root_gives_the_same(path: Path) -> None:
    records = load(path)
    expected = processor_run(records)
    got = exporter_run(records, batch=False, hold_seconds=None)
    same_chains(expected.sessions, got.sessions)


@pytest.mark.parametrize("path", dump_paths(), ids=dump_id)
def test_judged_at_once_without_ancestors_the_calls_are_the_same(path: Path) -> None:
    # hold 0: each tool span is judged in the export that brings it, before its agent span
    # ended; one agent run per trace, so the chains' calls are the same, keyed by trace alone.
    records = load(path)
    expected = processor_run(records)
    got = exporter_run(records, batch=False, hold_seconds=0, clock=FakeClock())
    same_chains(expected.sessions, got.sessions)
    assert all(len(label) == 32 or label[32] == "/" for label in got.sessions)


def test_sub_agents_and_several_traces_match_the_processor() -> None:
    records = synthetic_traces()
    expected = processor_run(records)
    same_sessions(expected.sessions, exporter_run(records).sessions)
    same_sessions(expected.sessions, exporter_run(records, batch=False).sessions)


@pytest.mark.slow
def test_the_guards_metrics_are_the_processors() -> None:
    def samples(
        recorder: PrometheusRecorder,
    ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        # The agent label aside: the processor sees no agent frame where the instrumentation
        # names the agent span only at its end (see test_replay_traces); the exporter does.
        totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
        for family in recorder.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "agent"))
                totals[(sample.name, labels)] += sample.value
        return dict(totals)

    for path in dump_paths():
        records = load(path)
        theirs, ours = PrometheusRecorder(), PrometheusRecorder()
        # Both runs kept alive while their recorders are read: loopguard_sessions reads the guard
        # through a weak reference, so a guard already collected reads 0 (a flaky difference).
        # No hold timer: a loaded machine cannot make the exporter judge a trace early.
        kept = (
            processor_run(records, theirs),
            exporter_run(records, recorder=ours, hold_seconds=None),
        )
        assert samples(ours) == samples(theirs), dump_id(path)
        del kept
        decided = sum(
            sample.value
            for family in ours.registry.collect()
            for sample in family.samples
            if sample.name == "loopguard_decisions_total"
        )
        if loop_actions(path):
            assert decided > 0, dump_id(path)


# -- decision spans ----------------------------------------------------------------------------


def test_decision_spans_are_siblings_of_the_tool_span_and_the_batch_goes_on_unchanged() -> None:
    records = load(REFERENCE_DUMP)
    spans = finished(records)
    following = Recording()
    exporter = LoopGuardSpanExporter(LoopGuard(DEFAULT), next=following)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    (batch,) = following.batches
    assert list(batch[: len(spans)]) == spans  # the same objects, in the same order
    shown = decision_spans(batch[len(spans) :])
    assert shown and len(shown) == len(batch) - len(spans)
    by_call = {}
    for span in spans:
        events = [(event.name, event.attributes or {}) for event in span.events]
        call = tool_call_from_span(span.name, span.attributes or {}, events, None)
        if call is not None:
            by_call[call.call_id] = span
    for span in shown:
        attributes = dict(span.attributes or {})
        assert [event.name for event in span.events] == [DECISION_EVENT]
        assert dict(span.events[0].attributes or {}) == attributes
        assert attributes["loopguard.action"] in {"remind", "deny", "rescue", "stop"}
        tool = by_call[str(attributes["gen_ai.tool.call.id"])]
        assert span.context is not None and tool.context is not None and tool.parent is not None
        assert span.context.trace_id == tool.context.trace_id
        assert span.parent is not None and span.parent.span_id == tool.parent.span_id
        assert span.context.span_id not in {s.context.span_id for s in spans if s.context}
        assert span.start_time == span.end_time
        assert tool.start_time is not None and tool.end_time is not None
        assert span.start_time is not None
        assert tool.start_time - 1000 <= span.start_time <= tool.end_time + 1000
        assert span.instrumentation_scope is not None
        assert span.instrumentation_scope.name == SCOPE_NAME
        assert span.resource == tool.resource


def test_unchained_decision_spans_go_through_the_provider_and_are_not_fed_back() -> None:
    records = load(REFERENCE_DUMP)
    expected = processor_run(records)
    guard, sessions = recording_guard()
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    # One span per export: each decision span comes straight back into this exporter.
    provider.add_span_processor(
        SimpleSpanProcessor(LoopGuardSpanExporter(guard, tracer_provider=provider))
    )
    rebuild(records, cast(Tracer, provider.get_tracer("fixture")))
    spans = memory.get_finished_spans()
    same_chains(expected.sessions, dict(sessions))
    assert Run(guard, sessions, spans).decision_attributes() == expected.decision_attributes()
    assert guard.internal_errors == {}
    provider.shutdown()


def test_capture_arguments_adds_them_to_decision_spans() -> None:
    spans = finished(load(REFERENCE_DUMP))
    following = Recording()
    LoopGuardSpanExporter(LoopGuard(DEFAULT), next=following, capture_arguments=True).export(spans)
    shown = decision_spans(following.spans)
    assert shown and all("loopguard.arguments" in (span.attributes or {}) for span in shown)
    plain = Recording()
    LoopGuardSpanExporter(LoopGuard(DEFAULT), next=plain).export(spans)
    assert not any("loopguard.arguments" in (s.attributes or {}) for s in plain.spans)


# -- holding, flushing, bounds -----------------------------------------------------------------


def looping_trace(
    calls: int, *, trace: str = "a" * 32, call_ids: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """An agent span and ``calls`` identical tool calls under it (call ids ``call_ids``, else
    ``c0``, ``c1``...), in the order they end (the agent span last)."""
    from .test_replay_traces import TraceBuilder

    b = TraceBuilder()
    root = b.span(trace, "invoke_agent looper", 0, 100 * calls + 10, at_start=agent_attributes("l"))
    for n in range(calls):
        b.span(
            trace,
            "execute_tool search",
            10 + 100 * n,
            60 + 100 * n,
            parent=root,
            attributes=genai_tool("search", {"q": "x"}, call_ids[n] if call_ids else f"c{n}"),
        )
    return b.ordered()


def test_tool_spans_wait_for_their_root_then_hold_seconds_on_the_injected_clock() -> None:
    spans = finished(looping_trace(6))
    tools, root = spans[:-1], spans[-1]
    clock = FakeClock()
    guard, sessions = recording_guard()
    exporter = LoopGuardSpanExporter(guard, next=Recording(), hold_seconds=5.0, clock=clock)
    exporter.export(tools)
    assert sessions == {} and exporter.buffered_spans == len(tools)
    clock.advance(4.9)
    exporter.export([])
    assert sessions == {}
    clock.advance(0.1)
    exporter.export([])
    assert [row[1] for rows in sessions.values() for row in rows][:1] == ["allow"]
    assert len([row for rows in sessions.values() for row in rows]) == len(tools)
    assert exporter.flushed_early_time == 1
    exporter.export([root])  # the root: nothing left to judge, the trace is forgotten
    assert exporter.buffered_spans == 0
    assert DEFAULT_HOLD_SECONDS > 0


def test_force_flush_and_shutdown_judge_what_is_held() -> None:
    spans = finished(looping_trace(6))
    tools = spans[:-1]
    following = Recording()
    guard, sessions = recording_guard()
    exporter = LoopGuardSpanExporter(guard, next=following, hold_seconds=None)
    exporter.export(tools[:3])
    assert exporter.force_flush() is True
    assert following.flushed == 1
    assert sum(len(rows) for rows in sessions.values()) == 3
    exporter.export(tools[3:])
    assert sum(len(rows) for rows in sessions.values()) == 3
    exporter.shutdown()
    assert sum(len(rows) for rows in sessions.values()) == 6
    assert decision_spans(following.spans)  # the calls decided at shutdown are shown
    assert following.shut == 1
    assert exporter.export(spans) is SpanExportResult.FAILURE
    assert exporter.force_flush() is False
    exporter.shutdown()  # twice is harmless
    assert following.shut == 1


def test_memory_is_bounded_by_max_buffered_spans() -> None:
    guard, sessions = recording_guard()
    exporter = LoopGuardSpanExporter(
        guard, next=Recording(), hold_seconds=None, max_buffered_spans=8
    )
    for n in range(20):  # traces whose roots never come
        spans = finished(looping_trace(3, trace=f"{n + 1:032x}"))
        exporter.export(spans[:-1])
        assert exporter.buffered_spans <= 8
    assert exporter.flushed_early_capacity > 0
    assert sum(len(rows) for rows in sessions.values()) > 0


def test_a_remote_parent_makes_the_local_root() -> None:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    guard, sessions = recording_guard()
    exporter = LoopGuardSpanExporter(guard, next=Recording(), hold_seconds=None)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("fixture")
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    with tracer.start_as_current_span(
        "invoke_agent looper",
        context=trace.set_span_in_context(NonRecordingSpan(remote)),
        attributes=agent_attributes("looper"),
    ):
        for n in range(4):
            tracer.start_span("execute_tool search", attributes=genai_tool("s", {}, f"c{n}")).end()
        assert sessions == {}
    assert sum(len(rows) for rows in sessions.values()) == 4
    assert exporter.buffered_spans == 0


# -- never raises ------------------------------------------------------------------------------


class Broken:
    """Not a span: every attribute access raises."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(name)


def test_export_never_raises_and_forwards_the_batch_anyway() -> None:
    following = Recording()
    guard = LoopGuard(DEFAULT)
    exporter = LoopGuardSpanExporter(guard, next=following)
    spans = finished(looping_trace(2))
    batch = cast(list[ReadableSpan], [Broken(), *spans])
    assert exporter.export(batch) is SpanExportResult.SUCCESS
    assert following.batches == [batch]
    assert guard.internal_errors == {"exporter.export": 1}


def test_the_next_exporters_result_is_returned_and_its_errors_caught() -> None:
    spans = finished(looping_trace(2))
    failing = Recording(SpanExportResult.FAILURE)
    assert LoopGuardSpanExporter(next=failing).export(spans) is SpanExportResult.FAILURE

    class Raising(Recording):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            raise ConnectionError("down")

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            raise ConnectionError("down")

        def shutdown(self) -> None:
            raise ConnectionError("down")

    guard = LoopGuard(DEFAULT)
    exporter = LoopGuardSpanExporter(guard, next=Raising())
    assert exporter.export(spans) is SpanExportResult.FAILURE
    assert exporter.force_flush() is False
    exporter.shutdown()
    assert guard.internal_errors == {"exporter.next": 3}
    assert LoopGuardSpanExporter().export(spans) is SpanExportResult.SUCCESS


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"guard": object()}, "guard"),
        ({"next": object()}, "next"),
        ({"next": Recording(), "tracer_provider": TracerProvider()}, "tracer_provider"),
        ({"key_by": "agent"}, "key_by"),
        ({"hold_seconds": -1}, "hold_seconds"),
        ({"max_buffered_spans": 0}, "max_buffered_spans"),
        ({"max_buffered_spans": True}, "max_buffered_spans"),
    ],
)
def test_bad_options_raise_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        LoopGuardSpanExporter(**options)


def test_keyed_by_conversation_the_runs_start_epochs() -> None:
    guard, sessions = recording_guard()
    exporter = LoopGuardSpanExporter(guard, next=Recording(), key_by="conversation")
    for n in range(2):  # two runs of one conversation, in two traces
        records = looping_trace(3, trace=f"{n + 1:032x}")
        for record in records:
            record["attributes"]["gen_ai.conversation.id"] = "conv-1"
        exporter.export(finished(records))
    (rows,) = sessions.values()
    assert list(sessions) == ["conv-1/l"]
    assert [count for *_, count in rows] == [0, 2, 3, 0, 2, 3]


# -- with the hook API -------------------------------------------------------------------------


def hook_calls(guard: LoopGuard, n: int) -> tuple[str, int]:
    """A framework adapter's before and after hooks for call ``n`` (the framework's conversation
    id and agent name as keys); the decision's action and count."""
    keys: dict[str, Any] = {"session": "conv-1", "agent": "l", "call_id": f"c{n}"}
    decision = guard.before_tool("search", {"q": "x"}, **keys)
    if not decision.blocks:
        guard.after_tool("search", {"q": "x"}, result="same result", **keys)
    return decision.action.value, decision.count


@pytest.mark.parametrize("hold_seconds", [None, 0.0])
def test_a_hooks_call_and_its_span_count_once_keyed_by_conversation(
    hold_seconds: float | None,
) -> None:
    # The exporter keyed by conversation names a span's call as the adapter does, whenever its
    # agent span arrives, so the span report of a call the hook counted adds nothing.
    alone = LoopGuard(DEFAULT)
    expected = [hook_calls(alone, n) for n in range(6)]
    assert {action for action, _ in expected} >= {"allow", "remind", "deny"}
    ran = [n for n, (action, _) in enumerate(expected) if action in ("allow", "remind")]
    # Tool spans of the calls that ran (a blocked call runs no tool, so none of its span).
    records = looping_trace(len(ran), call_ids=[f"c{n}" for n in ran])
    for record in records:
        record["attributes"]["gen_ai.conversation.id"] = "conv-1"
        if record["name"].startswith("execute_tool"):
            record["attributes"]["gen_ai.agent.name"] = "l"
    spans = finished(records)
    tool_spans, root = dict(zip(ran, spans)), spans[-1:]
    recorder = PrometheusRecorder()
    guard, span_decisions = recording_guard(recorder)
    exporter = LoopGuardSpanExporter(
        guard, next=Recording(), key_by="conversation", hold_seconds=hold_seconds, clock=FakeClock()
    )
    got = []
    for n in range(6):
        got.append(hook_calls(guard, n))
        if n in tool_spans:
            exporter.export([tool_spans[n]])  # the tool span ends after the hook's report
    exporter.export(root)
    exporter.force_flush()
    assert got == expected
    assert span_decisions == {}  # every span report only added the outcome of a counted call
    assert recorder.registry.get_sample_value(
        "loopguard_tool_calls_total", {"agent": "l", "tool": "search"}
    ) == len(expected)
