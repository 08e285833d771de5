"""The end gate (issue 29 item 3): one cheap check that a span ending cannot matter, derived from
the tables; it never says "cannot matter" of a span any reader at the end answers for."""

from __future__ import annotations

from typing import Any

import pytest

from otel_loopguard._conventions import (
    END_GATE_KEYS,
    MODEL_SPAN_KEYS,
    REQUEST_GATE_KEYS,
    may_be_model_span,
    may_be_tool_span,
    may_matter_at_end,
    may_request_calls,
)

from .span_dumps import dump_paths, load


def _readers_answer(name: str, attributes: dict[str, Any]) -> bool:
    # As the processor asks them: the requested-calls gate with whether the usage gate passed.
    usage = may_be_model_span(attributes)
    return may_be_tool_span(name, attributes) or usage or may_request_calls(attributes, usage)


def test_every_dump_span_a_reader_answers_for_passes_the_end_gate() -> None:
    spans = [record for path in dump_paths() for record in load(path)]
    assert len(spans) > 100
    passed = stopped = 0
    for record in spans:
        name, attributes = record["name"], record.get("attributes") or {}
        if _readers_answer(name, attributes):
            assert may_matter_at_end(name, attributes), (name, sorted(attributes))
        if may_matter_at_end(name, attributes):
            passed += 1
        else:
            stopped += 1
    # The gate does stop spans of the dumps (plain chains, HTTP, agent spans), and lets some by.
    assert passed and stopped


def test_the_gate_keys_come_from_the_tables() -> None:
    assert set(MODEL_SPAN_KEYS) <= END_GATE_KEYS
    assert REQUEST_GATE_KEYS <= END_GATE_KEYS
    assert {"traceloop.span.kind", "openinference.span.kind"} <= END_GATE_KEYS
    # Present on every GenAI span: tested by value, not by presence.
    assert "gen_ai.operation.name" not in END_GATE_KEYS


CHAT = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "openai",
    "gen_ai.request.model": "gpt-4o",
    "server.address": "api.openai.com",
}


@pytest.mark.parametrize(
    ("name", "attributes", "expected"),
    [
        ("chat gpt-4o", CHAT, False),
        ("GET /users", {"http.request.method": "GET"}, False),
        ("chat gpt-4o", {**CHAT, "gen_ai.usage.input_tokens": 3}, True),
        ("execute_tool search", {}, True),
        ("running tool", {}, True),
        ("x", {"gen_ai.operation.name": "execute_tool"}, True),
        ("x", {"openinference.span.kind": "LLM"}, True),  # presence: the exact gates decide
        ("x", {"gen_ai.output.messages": "[]"}, True),
        ("x", {"gen_ai.operation.name": ["execute_tool"]}, True),  # not a str: exact gates
        (None, {}, True),  # not a str name
    ],
)
def test_gate_answers(name: Any, attributes: dict[str, Any], expected: bool) -> None:
    assert may_matter_at_end(name, attributes) is expected
    if not expected:
        assert not _readers_answer(name, attributes)
