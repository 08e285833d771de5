"""The tool calls a model span's response requests (issue 27), read from the recorded spans of
the real instrumentations (tests/data/spans) and from hand-made spans of the other shapes."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard._conventions import (
    MISSING,
    REQUEST_GATE_KEYS,
    may_request_calls,
    requested_from_span,
)

from .conftest import SPAN_DUMPS as DUMPS_DIR
from .span_dumps import dump_id, dump_paths, load

SEARCH = ("search", {"query": "weather in Paris"})
WEATHER = ("get_weather", {"city": "Paris", "unit": "C"})
#: The scripted run's requests (tests/data/spans/README.md): six searches, the weather, a search.
SCRIPT = [SEARCH] * 6 + [WEATHER, SEARCH]

#: Dumps whose model spans carry the requested calls, with the convention that reads them.
REQUESTING = {
    "agno": "openinference",
    "haystack": "haystack",
    "langgraph": "openinference",
    "langgraph_openllmetry": "genai",
    "llamaindex": "openinference",
    "pydantic_ai": "genai",
    "smolagents": "openinference",
    "strands": "strands",
    "vercel_ai": "vercel_ai",
}
#: Dumps whose spans carry no requested call, and why (the closing note of issue 27).
NOT_REQUESTING = {
    "autogen": "autogen-core traces no model call; the requests are only in its log records",
    "crewai": "OpenInference's CrewAI instrumentation traces no LLM span with output messages",
    "dspy": "DummyLM's output is ReAct text (next_tool_name in prose), not tool calls",
    "mcp": "MCP spans are a server's, below the model",
    "mcp_openllmetry": "MCP spans are a server's, below the model",
    "semantic_kernel": "its chat span carries only the finish reason; the messages are on the"
    " agent span, and only the final text",
}


def requests_in(path: Path) -> list[tuple[str, object, str | None, str]]:
    found = []
    for record in load(path):
        events = [(event["name"], event["attributes"]) for event in record["events"]]
        requested = requested_from_span(record["name"], record["attributes"], lambda: events)
        if requested is not None:
            found += [
                (call.tool, call.arguments, call.call_id, requested.convention)
                for call in requested.calls
            ]
    return found


@pytest.mark.parametrize("path", dump_paths(), ids=dump_id)
def test_each_dump_requests_the_scripted_calls_or_none(path: Path) -> None:
    framework = path.parent.name
    found = requests_in(path)
    assert framework in REQUESTING or framework in NOT_REQUESTING, framework
    if framework in NOT_REQUESTING:
        assert found == []
        return
    if framework == "smolagents":  # its final answer is a tool call too (never tracked)
        assert found[-1][:2] == ("final_answer", {"answer": "It is sunny in Paris."})
        found = found[:-1]
    assert [(tool, arguments) for tool, arguments, _, _ in found] == SCRIPT
    # Each request has its own call id, as the tool span (or the hook) will report it.
    ids = [call_id for _, _, call_id, _ in found]
    assert ids == [f"call_{n}" for n in range(8)]
    assert {convention for *_, convention in found} == {REQUESTING[framework]}


def test_every_requesting_framework_has_a_dump() -> None:
    assert {path.parent.name for path in dump_paths()} == set(REQUESTING) | set(NOT_REQUESTING)


def test_strands_agent_and_cycle_spans_are_not_read_twice() -> None:
    # Strands repeats gen_ai.choice on execute_event_loop_cycle and invoke_agent spans: only the
    # chat span is the model's response.
    names = set()
    for record in load(DUMPS_DIR / "strands" / "spans.jsonl"):
        events = [(event["name"], event["attributes"]) for event in record["events"]]
        requested = requested_from_span(record["name"], record["attributes"], lambda: events)
        if requested is not None and requested.calls:
            names.add(record["name"])
    assert names == {"chat"}


def test_several_calls_in_one_genai_response_with_text_and_arguments_as_strings() -> None:
    messages = [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "Let me try a different approach."},
                {"type": "tool_call", "id": "a", "name": "search", "arguments": {"q": "x"}},
                {"type": "tool_call", "id": "b", "name": "fetch", "arguments": '{"url": "u"}'},
            ],
        }
    ]
    requested = requested_from_span(
        "chat m", {"gen_ai.output.messages": json.dumps(messages), "gen_ai.operation.name": "chat"}
    )
    assert requested is not None
    assert [(c.tool, c.arguments, c.call_id) for c in requested.calls] == [
        ("search", {"q": "x"}, "a"),
        ("fetch", {"url": "u"}, "b"),
    ]
    assert requested.text == "Let me try a different approach."


def test_openai_style_output_messages() -> None:
    message = {
        "role": "assistant",
        "content": "Instead, I will search.",
        "tool_calls": [{"id": "c1", "function": {"name": "search", "arguments": '{"q": 1}'}}],
    }
    requested = requested_from_span("chat", {"gen_ai.output.messages": json.dumps([message])})
    assert requested is not None
    assert [(c.tool, c.arguments, c.call_id) for c in requested.calls] == [
        ("search", {"q": 1}, "c1")
    ]
    assert requested.text == "Instead, I will search."


def test_openllmetry_completion_attributes() -> None:
    attributes: dict[str, Any] = {
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": "Another approach:",
        "gen_ai.completion.0.tool_calls.0.name": "search",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"query": "a"}',
        "gen_ai.completion.0.tool_calls.0.id": "t0",
        "gen_ai.completion.0.tool_calls.1.name": "search",
        "gen_ai.completion.0.tool_calls.1.arguments": '{"query": "b"}',
        "gen_ai.completion.0.tool_calls.1.id": "t1",
        "llm.request.type": "chat",
    }
    requested = requested_from_span("openai.chat", attributes)
    assert requested is not None and requested.convention == "openllmetry"
    assert [(c.tool, c.arguments, c.call_id) for c in requested.calls] == [
        ("search", {"query": "a"}, "t0"),
        ("search", {"query": "b"}, "t1"),
    ]
    assert requested.text == "Another approach:"


def test_openinference_several_calls_and_missing_arguments() -> None:
    prefix = "llm.output_messages.0.message."
    attributes = {
        "openinference.span.kind": "LLM",
        prefix + "role": "assistant",
        prefix + "content": "ok",
        prefix + "tool_calls.0.tool_call.function.name": "a",
        prefix + "tool_calls.0.tool_call.function.arguments": "{}",
        prefix + "tool_calls.1.tool_call.function.name": "b",
    }
    requested = requested_from_span("llm", attributes)
    assert requested is not None
    assert [(c.tool, c.arguments, c.call_id) for c in requested.calls] == [
        ("a", {}, None),
        ("b", MISSING, None),
    ]


def test_sums_of_a_run_are_not_read() -> None:
    messages = json.dumps([{"role": "assistant", "parts": [{"type": "tool_call", "name": "x"}]}])
    for attributes in (
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.output.messages": messages},
        {"openinference.span.kind": "AGENT", "gen_ai.output.messages": messages},
    ):
        assert requested_from_span("agent", attributes) is None
    # CrewAI's own tracing makes its spans from events, maybe after the tool's hook ran
    crewai = {"crewai.event_name": "llm_call_completed", "gen_ai.output.messages": messages}
    assert requested_from_span("call llm", crewai) is None
    vercel = {
        "ai.operationId": "ai.generateText",
        "ai.response.toolCalls": '[{"toolCallId": "1", "toolName": "x", "input": "{}"}]',
    }
    assert requested_from_span("ai.generateText", vercel) is None


BAD_VALUES = ["", "not json", "[1, 2]", '{"parts": 3}', b"\xff", 7, None, "[" * 10_000]


@pytest.mark.parametrize("value", [*BAD_VALUES, '[{"parts": [{}]}]'], ids=range(9))
def test_never_raises_on_bad_values(value: object) -> None:
    for key in REQUEST_GATE_KEYS:
        requested = requested_from_span("chat", {key: value})
        if key.endswith(".name"):  # the first tool's name: any text is a name
            continue
        assert requested is None or requested.calls == ()


def test_the_gate_is_the_keys() -> None:
    assert not may_request_calls({"gen_ai.operation.name": "chat", "http.method": "GET"})
    for key in REQUEST_GATE_KEYS:
        assert may_request_calls({key: "[]"})
    # the hand-written lookups name exactly the keys (a key added to one is added to both)
    source = inspect.getsource(may_request_calls)
    assert source.count(" in attributes") == len(REQUEST_GATE_KEYS)
    # a model span's chat operation (Strands' requests are in its events) only with usage
    chat = {"gen_ai.operation.name": "chat"}
    assert may_request_calls(chat, usage=True) and not may_request_calls(chat)
