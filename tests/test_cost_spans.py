"""Model calls' usage read from spans (issue 24, item 1): the conventions reader on the real
span dumps, the span processor through a real TracerProvider, the hook API's model_call, and
the session state that carries the spend."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard._conventions import SpanModelCall, model_call_from_span
from otel_loopguard._engine import SessionState
from otel_loopguard._prices import COMPUTED, PROVIDER, UNPRICED, ModelUsage
from otel_loopguard._span_calls import model_usage
from otel_loopguard._trace_events import ModelUsed, feed
from otel_loopguard._traces import TraceBuffer
from otel_loopguard.exporter import LoopGuardSpanExporter
from otel_loopguard.processor import LoopGuardSpanProcessor
from otel_loopguard.replay import SpanDumpDecoder, run_replay
from otel_loopguard.replay._trace_formats import _dump_span

from .span_dumps import dump_id, dump_paths, load, rebuild

DEFAULT = PRESETS["default"]

#: The dumps whose model spans report usage, with the attribute keys of the run-level span that
#: sums it (the agent span of each): (input key, output key).
WITH_USAGE = {
    "pydantic_ai/spans.jsonl": (
        "gen_ai.aggregated_usage.input_tokens",
        "gen_ai.aggregated_usage.output_tokens",
    ),
    "pydantic_ai/spans_blocked.jsonl": (
        "gen_ai.aggregated_usage.input_tokens",
        "gen_ai.aggregated_usage.output_tokens",
    ),
    "pydantic_ai/spans_v2_legacy.jsonl": (
        "gen_ai.aggregated_usage.input_tokens",
        "gen_ai.aggregated_usage.output_tokens",
    ),
    "smolagents/spans.jsonl": ("llm.token_count.prompt", "llm.token_count.completion"),
    "smolagents/spans_blocked.jsonl": ("llm.token_count.prompt", "llm.token_count.completion"),
    "strands/spans.jsonl": ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"),
    "strands/spans_blocked.jsonl": ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"),
    "strands/spans_latest_semconv.jsonl": (
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
    ),
    "strands/spans_latest_semconv_blocked.jsonl": (
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
    ),
    "vercel_ai/spans.jsonl": ("ai.usage.inputTokens", "ai.usage.outputTokens"),
}
#: Model spans per run: the scripted model answers 9 times (8 tool calls and the final text).
MODEL_TURNS = 9


def _model_calls(path: Path) -> list[tuple[dict[str, Any], SpanModelCall]]:
    found = []
    for record in load(path):
        call = model_call_from_span(record["name"], record["attributes"])
        if call is not None:
            found.append((record, call))
    return found


def _aggregate(path: Path, keys: tuple[str, str]) -> tuple[int, int]:
    """The run's own total, from the span that sums its model calls (the root-most one)."""
    totals = [
        (int(record["attributes"][keys[0]]), int(record["attributes"][keys[1]]))
        for record in load(path)
        if keys[0] in record["attributes"] and keys[1] in record["attributes"]
    ]
    return max(totals)


@pytest.mark.parametrize("path", dump_paths(), ids=dump_id)
def test_model_spans_of_the_dumps_give_the_runs_usage_once(path: Path) -> None:
    calls = _model_calls(path)
    keys = WITH_USAGE.get(dump_id(path))
    if keys is None:
        assert calls == [], "a dump without model usage gave a model call"
        return
    assert len(calls) == MODEL_TURNS
    usages = [model_usage(call) for _, call in calls]
    # The agent-level spans that sum the usage (Strands' invoke_agent, smolagents' AGENT span,
    # the Vercel AI SDK's ai.generateText) are not read as calls: the sum is the run's total.
    assert (
        sum(u.input_tokens for u in usages),
        sum(u.output_tokens for u in usages),
    ) == _aggregate(path, keys)
    assert {u.model for u in usages} <= {"scripted-loop", "mock-model-id"}
    assert all(u.model for u in usages)


def test_model_and_provider_come_from_the_conventions_own_keys() -> None:
    def read(attributes: dict[str, object]) -> SpanModelCall:
        call = model_call_from_span("chat", attributes)
        assert call is not None
        return call

    genai = read(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.response.model": "gpt-4o-2024-08-06",
            "gen_ai.provider.name": "openai",
            "gen_ai.system": "old",
            "gen_ai.usage.input_tokens": 100,
            "gen_ai.usage.output_tokens": 10,
            "gen_ai.usage.cache_read.input_tokens": 40,
            "gen_ai.usage.cache_creation.input_tokens": 20,
        }
    )
    assert (genai.model, genai.provider, genai.convention) == (
        "gpt-4o-2024-08-06",
        "openai",
        "genai",
    )
    assert (genai.cache_read_tokens, genai.cache_write_tokens) == (40, 20)
    # OpenLLMetry's older names, with integers sent as text (OTLP JSON).
    older = read(
        {
            "llm.request.type": "chat",
            "gen_ai.system": "Anthropic",
            "gen_ai.request.model": "claude-sonnet-4-5",
            "gen_ai.usage.prompt_tokens": "1200",
            "gen_ai.usage.completion_tokens": "30",
            "gen_ai.usage.cache_read_input_tokens": "1000",
            "gen_ai.usage.cache_creation_input_tokens": "100",
        }
    )
    assert (older.model, older.provider) == ("claude-sonnet-4-5", "Anthropic")
    assert (older.input_tokens, older.output_tokens) == (1200, 30)
    assert (older.cache_read_tokens, older.cache_write_tokens) == (1000, 100)
    openinference = read(
        {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gemini-2.5-flash",
            "llm.provider": "google",
            "llm.token_count.prompt": 500,
            "llm.token_count.completion": 50,
            "llm.token_count.prompt_details.cache_read": 300,
            "llm.token_count.prompt_details.cache_write": 0,
            "agent.name": "researcher",
        }
    )
    assert (openinference.model, openinference.provider) == ("gemini-2.5-flash", "google")
    assert openinference.agent_name == "researcher"
    assert openinference.convention == "openinference"
    assert (openinference.input_tokens, openinference.cache_read_tokens) == (500, 300)


@pytest.mark.parametrize(
    "attributes",
    [
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.usage.input_tokens": 9},
        {"gen_ai.operation.name": "execute_tool", "gen_ai.usage.input_tokens": 9},
        {"openinference.span.kind": "AGENT", "llm.token_count.prompt": 9},
        {"openinference.span.kind": "CHAIN", "llm.token_count.prompt": 9},
        {"traceloop.span.kind": "workflow", "gen_ai.usage.prompt_tokens": 9},
        {"gen_ai.operation.name": "chat"},
        {"ai.usage.inputTokens": 9, "ai.usage.outputTokens": 9},
    ],
)
def test_spans_that_sum_usage_or_carry_none_are_no_model_call(
    attributes: dict[str, object],
) -> None:
    assert model_call_from_span("any", attributes) is None


def test_the_provider_cost_is_read_in_dollars_only() -> None:
    base = {"gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 1}
    usd = model_call_from_span("chat", {**base, "gen_ai.usage.cost.amount": "0.25"})
    assert usd is not None and usd.reported_cost_usd == 0.25
    plain = model_call_from_span(
        "chat", {**base, "gen_ai.usage.cost.amount": 0.5, "gen_ai.usage.cost.currency": "USD"}
    )
    assert plain is not None and plain.reported_cost_usd == 0.5
    euros = model_call_from_span(
        "chat", {**base, "gen_ai.usage.cost.amount": 0.5, "gen_ai.usage.cost.currency": "EUR"}
    )
    assert euros is not None and euros.reported_cost_usd is None


def test_cache_counted_apart_from_the_input_is_added_to_it() -> None:
    call = model_call_from_span(
        "chat",
        {
            "gen_ai.usage.input_tokens": 5,
            "gen_ai.usage.output_tokens": 7,
            "gen_ai.usage.cache_read.input_tokens": 1000,
            "gen_ai.usage.cache_creation.input_tokens": 200,
        },
    )
    assert call is not None
    usage = model_usage(call)
    assert (usage.input_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (
        1205,
        1000,
        200,
    )


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (-5, "input_tokens"),
        ("lots", "input_tokens"),
        (10**10, "input_tokens"),
        (float("nan"), "input_tokens"),
        (True, "input_tokens"),
    ],
)
def test_bad_token_counts_are_a_counted_skip(value: object, field: str) -> None:
    call = model_call_from_span("chat", {"gen_ai.usage.input_tokens": value})
    assert call is not None
    with pytest.raises(ValueError, match=field):
        model_usage(call)


def _sessions(guard: LoopGuard) -> list[dict[str, Any]]:
    """The guard's kept sessions as its snapshot writes them."""
    sessions: list[dict[str, Any]] = guard.snapshot()["sessions"]["sessions"]
    return sessions


def _run(path: Path, guard: LoopGuard) -> None:
    provider = TracerProvider()
    provider.add_span_processor(LoopGuardSpanProcessor(guard, tracer_provider=provider))
    rebuild(load(path), provider.get_tracer("fixture"))


@pytest.mark.parametrize("name", sorted(WITH_USAGE))
def test_the_processor_charges_usage_to_the_session_of_the_turns_tool_calls(name: str) -> None:
    path = next(p for p in dump_paths() if dump_id(p) == name)
    guard = LoopGuard(DEFAULT)
    _run(path, guard)
    sessions = _sessions(guard)
    with_spend = [s for s in sessions if "spend" in s["state"]]
    assert len(with_spend) == 1, sessions
    state = with_spend[0]["state"]
    # The same session and agent the tool calls were counted under.
    assert state["sigs"], "the model calls were charged to a session without the tool calls"
    spend = guard.spend(with_spend[0]["session"], agent=with_spend[0]["agent"])
    assert spend is not None
    assert spend.calls == MODEL_TURNS
    assert (spend.input_tokens, spend.output_tokens) == _aggregate(path, WITH_USAGE[name])
    # A scripted model has no price: tokens counted, cost not made up.
    assert spend.unpriced_calls == MODEL_TURNS
    assert spend.cost_usd == 0.0
    assert guard.skipped_model_calls == {}


def test_a_bad_usage_value_on_a_live_span_is_skipped_and_counted_never_raised() -> None:
    guard = LoopGuard(DEFAULT)
    provider = TracerProvider()
    provider.add_span_processor(LoopGuardSpanProcessor(guard, tracer_provider=provider))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span(
        "invoke_agent a",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"},
    ):
        for value in (-1, "many", 10**12):
            with tracer.start_as_current_span(
                "chat m",
                attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"},
            ) as span:
                span.set_attribute("gen_ai.usage.input_tokens", value)
        with tracer.start_as_current_span(
            "chat m",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "m",
                "gen_ai.usage.input_tokens": 7,
                "gen_ai.usage.output_tokens": 3,
                "gen_ai.usage.cost.amount": 0.125,
            },
        ):
            pass
    assert guard.skipped_model_calls == {"input_tokens": 3}
    assert guard.internal_errors == {}
    (entry,) = [s for s in _sessions(guard) if "spend" in s["state"]]
    assert entry["agent"] == "a"
    spend = guard.spend(entry["session"], agent="a")
    assert spend is not None
    assert (spend.calls, spend.tokens, spend.provider_usd) == (1, 10, 0.125)


def test_model_call_prices_with_the_database_and_the_providers_figure_wins() -> None:
    pytest.importorskip("genai_prices")
    guard = LoopGuard(DEFAULT)
    # The corpus's turn (issue 24): 2,704 input and 314 output tokens of Gemini 3 Pro Preview
    # through OpenRouter cost $0.009176, as OpenRouter reported.
    cost = guard.model_call(
        {"model": "google/gemini-3-pro-preview", "input_tokens": 2704, "output_tokens": 314},
        session="s",
    )
    assert cost is not None and cost.source == COMPUTED
    assert cost.usd == pytest.approx(0.009176, abs=1e-9)
    reported = guard.model_call(
        ModelUsage.checked("google/gemini-3-pro-preview", input_tokens=10, reported_cost_usd=1.5),
        session="s",
    )
    assert reported is not None and (reported.usd, reported.source) == (1.5, PROVIDER)
    unknown = guard.model_call({"model": "no-such-model-xyz", "output_tokens": 5}, session="s")
    assert unknown is not None and (unknown.usd, unknown.source) == (None, UNPRICED)
    spend = guard.spend("s")
    assert spend is not None
    assert (spend.calls, spend.unpriced_calls) == (3, 1)
    assert spend.computed_usd == pytest.approx(0.009176, abs=1e-9)
    assert spend.provider_usd == 1.5


@pytest.mark.parametrize(
    ("usage", "reason"),
    [
        ({"input_tokens": -1}, "input_tokens"),
        ({"output_tokens": "ten"}, "output_tokens"),
        ({"input_tokens": 1, "cache_read_tokens": 5}, "cache_read_tokens + cache_write_tokens"),
        ({"reported_cost_usd": float("inf")}, "reported_cost_usd"),
        ({"tokens": 5}, "usage"),
        (["not", "a", "mapping"], "usage"),
    ],
)
def test_model_call_with_bad_usage_is_a_counted_skip(usage: Any, reason: str) -> None:
    guard = LoopGuard(DEFAULT)
    assert guard.model_call(usage, session="s") is None
    assert guard.skipped_model_calls == {reason: 1}
    assert guard.spend("s") is None
    assert guard.internal_errors == {}


def test_spend_travels_with_the_session_state_and_old_states_load() -> None:
    guard = LoopGuard(DEFAULT)
    guard.model_call({"model": "m", "input_tokens": 30, "output_tokens": 4}, session="s", agent="a")
    state = guard.export_session("s", agent="a")
    assert state is not None and state.spend is not None
    back = SessionState.from_bytes(state.to_bytes(), DEFAULT)
    assert back.spend is not None
    assert (back.spend.calls, back.spend.tokens, back.spend.unpriced_calls) == (1, 34, 1)
    other = LoopGuard(DEFAULT)
    other.restore(guard.snapshot())
    restored = other.spend("s", agent="a")
    assert restored is not None and restored.tokens == 34
    # A state written before spend was kept has no "spend" key.
    assert SessionState.from_bytes(SessionState(0.0).to_bytes(), DEFAULT).spend is None
    with pytest.raises(ValueError, match="spend"):
        SessionState.from_plain({**_plain(state), "spend": [1, -2]}, DEFAULT)


def _plain(state: SessionState) -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(state.to_bytes())
    return loaded


# -- the trace buffer: exporter, serve and replay ----------------------------------------------


def _path(name: str) -> Path:
    return next(p for p in dump_paths() if dump_id(p) == name)


Spends = list[tuple[bool, tuple[int, int, int, int]]]


def _spends(guard: LoopGuard) -> Spends:
    """Each kept session with a spend (ids differ from one run to the next, and the agent label
    may: the processor sees an agent span's attributes as of the call, the buffer its final
    ones, for tool calls and model calls alike): whether its tool calls were counted there
    too, and (model calls, input tokens, output tokens, unpriced calls)."""
    found = []
    for entry in _sessions(guard):
        if "spend" in entry["state"]:
            spend = guard.spend(entry["session"], agent=entry["agent"])
            assert spend is not None
            totals = (spend.calls, spend.input_tokens, spend.output_tokens, spend.unpriced_calls)
            found.append((bool(entry["state"]["sigs"]), totals))
    return sorted(found, key=repr)


def _processor_spends(path: Path) -> Spends:
    guard = LoopGuard(DEFAULT)
    _run(path, guard)
    return _spends(guard)


@pytest.mark.parametrize("name", sorted(WITH_USAGE))
def test_replayed_dumps_charge_what_the_processor_charges(name: str) -> None:
    path = _path(name)
    guard = LoopGuard(DEFAULT)
    decoder = SpanDumpDecoder()
    events = [event for record in load(path) for event in decoder.decode(record)]
    events += list(decoder.finish())
    models = [event for event in events if isinstance(event, ModelUsed)]
    assert len(models) == MODEL_TURNS
    for event in events:
        feed(guard, event)  # type: ignore[arg-type]
    assert _spends(guard) == _processor_spends(path)


@pytest.mark.parametrize("name", ["pydantic_ai/spans.jsonl", "strands/spans.jsonl"])
def test_the_exporter_charges_what_the_processor_charges(name: str) -> None:
    path = _path(name)
    guard = LoopGuard(DEFAULT)
    provider = TracerProvider()
    exporter = LoopGuardSpanExporter(guard, next=InMemorySpanExporter(), hold_seconds=None)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rebuild(load(path), provider.get_tracer("fixture"))
    provider.shutdown()
    assert _spends(guard) == _processor_spends(path)


def test_model_spans_waiting_in_a_buffer_survive_its_snapshot() -> None:
    path = _path("strands/spans.jsonl")
    records = load(path)
    half = len(records) // 2
    first = TraceBuffer()
    for record in records[:half]:
        first.add(_dump_span(record))
    assert first.take_ready() == []
    data = copy.deepcopy(first.snapshot())
    second = TraceBuffer()
    second.restore(data)
    for record in records[half:]:
        second.add(_dump_span(record))
    guard = LoopGuard(DEFAULT)
    for event in second.take_ready():
        feed(guard, event)
    assert _spends(guard) == _processor_spends(path)


def test_replay_of_a_dump_with_usage_runs_clean() -> None:
    out, err = io.StringIO(), io.StringIO()
    status = run_replay(
        [str(_path("pydantic_ai/spans.jsonl"))], DEFAULT, json_output=True, stdout=out, stderr=err
    )
    assert (status, err.getvalue()) == (0, "")
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert rows and all(row["tool"] in {"search", "get_weather"} for row in rows)
