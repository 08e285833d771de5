"""Shortcuts of the span processor's hot path (issue 29) answer as the long way did.

Behaviour only, never timing: the one-pass start reader (``tool_call_at_start``) against the two
questions it replaces, on every recorded dump's spans as they started and ended; the end of a
tool span decided at its start skips the gate (and forgets its decision even when the span no
longer looks like a tool span); the agents above a
model span's agent, kept per agent, still count every turn in the parent's spend.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard._conventions import (
    MISSING,
    arguments_available_at_start,
    tool_call_from_span,
)
from otel_loopguard._conventions._readers import tool_call_at_start, tool_outcome_from_span
from otel_loopguard._span_calls import call_at_start
from otel_loopguard._spans import START_NAME_PREFIXES
from otel_loopguard.processor import LoopGuardSpanProcessor, current_decision

from .conftest import SPAN_DUMPS


def _the_long_way(name: str, attributes: dict[str, Any]) -> object:
    """call_at_start as it was: the prefix, then two questions, each with its own gate."""
    if name[:4] not in START_NAME_PREFIXES or not arguments_available_at_start(name, attributes):
        return None
    call = tool_call_from_span(name, attributes, (), None)
    if call is None or call.arguments is MISSING:
        return None
    return call


def _ended_dump_spans() -> list[tuple[str, dict[str, Any], list[Any], bool]]:
    """(name, attributes, events, failed) of every span in the recorded dumps, as it ended."""
    found = []
    for path in sorted(SPAN_DUMPS.glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                events = [(e["name"], e["attributes"]) for e in row["events"]]
                failed = row["status"]["code"] == "ERROR"
                found.append((row["name"], row["attributes"], events, failed))
    return found


def test_the_outcome_at_end_is_what_the_whole_read_gives_on_every_dump() -> None:
    read = 0
    for name, attributes, events, failed in _ended_dump_spans():
        for status in (failed, None):
            call = tool_call_from_span(name, attributes, events, status)
            outcome = tool_outcome_from_span(name, attributes, events, status)
            expected = None if call is None else (call.tool, call.result, call.is_error)
            assert outcome == expected, (name, attributes)
            read += call is not None
    assert read > 50


def _dump_spans() -> list[tuple[str, dict[str, Any]]]:
    """(name, attributes) of every span in the recorded dumps, at its start and at its end."""
    found = []
    for path in sorted(SPAN_DUMPS.glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                found.append((row["name_at_start"], row["attributes_at_start"]))
                found.append((row["name"], row["attributes"]))
    return found


def test_call_at_start_answers_as_the_two_questions_did_on_every_dump() -> None:
    spans = _dump_spans()
    assert len(spans) > 100
    decided = 0
    for name, attributes in spans:
        expected = _the_long_way(name, attributes)
        assert call_at_start(name, attributes) == expected, (name, attributes)
        decided += expected is not None
    assert decided > 0  # some dump has tool spans decided at start (Pydantic AI)


@pytest.mark.parametrize(
    ("name", "attributes"),
    [
        ("chat gpt-4o", {"gen_ai.operation.name": "chat"}),
        ("execute_tool search", {}),  # Strands: started bare
        ("execute_tool search", {"gen_ai.operation.name": "execute_tool"}),
        ("invoke_agent a", {"gen_ai.operation.name": "invoke_agent"}),
        ("execute_tool", None),
        (None, {"gen_ai.operation.name": "execute_tool"}),
    ],
)
def test_tool_call_at_start_rejects_what_is_not_decided_at_start(
    name: Any, attributes: Any
) -> None:
    assert tool_call_at_start(name, attributes) is None


def _provider() -> tuple[TracerProvider, LoopGuardSpanProcessor, InMemorySpanExporter]:
    provider = TracerProvider()
    processor = LoopGuardSpanProcessor(LoopGuard(PRESETS["default"]))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(processor)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, processor, exporter


def _pydantic_tool(n: int) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
        "gen_ai.tool.call.id": f"call_{n}",
        "gen_ai.tool.call.arguments": json.dumps({"q": "same"}),
        "gen_ai.agent.name": "a",
        "logfire.msg": "running tool: search",
    }


def test_a_tool_span_decided_at_start_is_ended_as_one_whatever_it_looks_like_then() -> None:
    provider, processor, _ = _provider()
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span(
        "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}
    ):
        outcomes = []
        for n in range(6):
            with tracer.start_as_current_span("execute_tool search", attributes=_pydantic_tool(n)):
                decided = current_decision()
                assert decided is not None
                outcomes.append(decided.action.value)
                # The span stops looking like a tool span before its end (renamed, another
                # operation): it was decided at its start, so its end still ends its call and
                # forgets what was kept for it.
                span = trace.get_current_span()
                span.update_name("renamed")
                span.set_attribute("gen_ai.operation.name", "other")
            assert processor._started == {}
            assert current_decision() is None
    # Identical calls, each counted at its start: the ladder moved.
    assert outcomes[0] == "allow"
    assert outcomes[-1] != "allow"
    provider.shutdown()


def _chat(tracer: trace.Tracer, tokens: int) -> None:
    span = tracer.start_span(
        "chat m",
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.provider.name": "openai",
        },
    )
    span.set_attributes({"gen_ai.usage.input_tokens": tokens, "gen_ai.usage.output_tokens": 10})
    span.end()


def test_every_turn_of_a_sub_agent_counts_in_the_agent_above() -> None:
    provider, processor, _ = _provider()
    tracer = provider.get_tracer("t")
    with (
        tracer.start_as_current_span(
            "invoke_agent boss",
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "boss"},
        ) as boss,
        tracer.start_as_current_span(
            "invoke_agent helper",
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper"},
        ) as helper,
    ):
        for _ in range(3):  # the second and third turns reuse the agents found above
            _chat(tracer, 100)
    trace_hex = f"{boss.get_span_context().trace_id:032x}"
    boss_session = f"{trace_hex}/{boss.get_span_context().span_id:016x}"
    helper_session = f"{trace_hex}/{helper.get_span_context().span_id:016x}"
    helper_spend = processor.guard.spend(helper_session, agent="helper")
    boss_spend = processor.guard.spend(boss_session, agent="boss")
    assert helper_spend is not None and boss_spend is not None
    assert helper_spend.calls == 3
    assert boss_spend.tree().turns == 3
    assert boss_spend.tree().tokens == 3 * 110
    provider.shutdown()
