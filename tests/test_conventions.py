"""Tests for otel_loopguard._conventions: real framework dumps, hand-written spans, fuzzing."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_loopguard import _conventions as conventions
from otel_loopguard._conventions import (
    AGENT_CONVENTIONS,
    ARGUMENTS_AT_START_CONVENTIONS,
    MAX_DECODE_CHARS,
    MISSING,
    TOOL_CONVENTIONS,
    AgentConvention,
    SpanAgent,
    SpanToolCall,
    ToolConvention,
    _dispatch,
    agent_from_span,
    arguments_available_at_start,
    conversation_id,
    decode_json,
    may_be_tool_span,
    tool_call_from_span,
)
from otel_loopguard._spans import START_NAME_PREFIXES, _start_name_prefixes

from .conftest import SPAN_DUMPS

SEARCH_ARGS = {"query": "weather in Paris"}
WEATHER_ARGS = {"city": "Paris", "unit": "C"}
SEARCH_RESULT = "results for 'weather in Paris': nothing useful"
WEATHER_RESULT = "Paris: sunny, 21C"
# Agno, CrewAI and Semantic Kernel were captured with another get_weather text.
CLOUDY = "Paris: 18 C, cloudy"
BLOCKED_PREFIX = "BLOCKED by loop guard:"
CONVERSATION = "conv-123"
AGENT = "weather_agent"
ROLE = "Weather researcher"  # CrewAI's agent is its role
ANSWER = "It is sunny in Paris."

# The scripted run (tests/data/spans/README.md): search x6, get_weather, search.
FULL_RUN = ["search"] * 6 + ["get_weather", "search"]
FULL_IDS: list[str | None] = [f"call_{i}" for i in range(8)]
NO_IDS: list[str | None] = [None] * 8
# Most frameworks emit no tool span for a call their pre-tool hook blocked (3rd and later
# identical search), so only calls 0, 1 and 6 leave a span.
BLOCKED_RUN = ["search", "search", "get_weather"]
BLOCKED_IDS: list[str | None] = ["call_0", "call_1", "call_6"]
# smolagents' ToolCallingAgent answers through its final_answer tool, traced as a tool call.
FINAL_ANSWER = "final_answer"


@dataclass(frozen=True)
class Dump:
    """What one fixture file must yield."""

    path: str
    convention: str
    tools: list[str]
    call_ids: list[str | None]
    search_args: object = None  # None: SEARCH_ARGS
    tool_span_agent: str | None = None  # agent name carried on the tool span itself
    agent_spans: tuple[str, ...] = ()  # span names that must be recognised as agent spans
    agent_name: str | None = AGENT  # the name those agent spans give
    agent_conversation: str | None = CONVERSATION  # the conversation those agent spans give
    conversation: str | None = CONVERSATION  # the conversation the tool spans give
    at_start: bool = False
    blocked_results: bool = False  # blocked calls still emit a span, result = block message
    blocked_errors: bool = False  # ... and that span reports a failure
    arguments: bool = True  # False: the spans carry no arguments (nor results)
    weather_result: str = WEATHER_RESULT
    counted_results: bool = False  # CrewAI: the nth search returns "... (#n): ..."
    tool_prefix: str = ""  # Semantic Kernel names tools "<plugin>-<function>"

    def tool(self, call: SpanToolCall) -> str:
        """The tool's name without the dump's prefix."""
        return call.tool.removeprefix(self.tool_prefix)


def _named(prefix: str, tools: list[str]) -> list[str]:
    return [prefix + tool for tool in tools]


DUMPS = [
    Dump(
        "pydantic_ai/spans.jsonl",
        "pydantic_ai",
        FULL_RUN,
        FULL_IDS,
        tool_span_agent=AGENT,
        agent_spans=("invoke_agent weather_agent",),
        at_start=True,
    ),
    Dump(
        "pydantic_ai/spans_blocked.jsonl",
        "pydantic_ai",
        FULL_RUN,
        FULL_IDS,
        tool_span_agent=AGENT,
        agent_spans=("invoke_agent weather_agent",),
        at_start=True,
        blocked_results=True,
    ),
    Dump(
        "pydantic_ai/spans_v2_legacy.jsonl",
        "pydantic_ai_legacy",
        FULL_RUN,
        FULL_IDS,
        tool_span_agent=AGENT,
        agent_spans=("agent run",),
        at_start=True,
    ),
    # LangGraph + OpenInference gives a one-argument tool's input as the bare value and puts
    # no schema (tool.parameters) on the span: the parameter name "query" is not in the span.
    Dump(
        "langgraph/spans.jsonl",
        "openinference",
        FULL_RUN,
        FULL_IDS,
        search_args="weather in Paris",
        agent_spans=("weather_agent",),
    ),
    Dump(
        "langgraph/spans_blocked.jsonl",
        "openinference",
        BLOCKED_RUN,
        BLOCKED_IDS,
        search_args="weather in Paris",
        agent_spans=("weather_agent",),
    ),
    Dump(
        "langgraph_openllmetry/spans.jsonl",
        "openllmetry_langchain",
        FULL_RUN,
        FULL_IDS,
        agent_spans=("weather_agent.workflow", "invoke_agent weather_agent"),
    ),
    Dump(
        "langgraph_openllmetry/spans_blocked.jsonl",
        "openllmetry_langchain",
        BLOCKED_RUN,
        BLOCKED_IDS,
        agent_spans=("weather_agent.workflow", "invoke_agent weather_agent"),
    ),
    Dump(
        "strands/spans.jsonl",
        "strands_event",
        FULL_RUN,
        FULL_IDS,
        agent_spans=("invoke_agent weather_agent",),
    ),
    Dump(
        "strands/spans_blocked.jsonl",
        "strands_event",
        BLOCKED_RUN,
        BLOCKED_IDS,
        agent_spans=("invoke_agent weather_agent",),
    ),
    Dump(
        "strands/spans_latest_semconv.jsonl",
        "strands",
        FULL_RUN,
        FULL_IDS,
        agent_spans=("invoke_agent weather_agent",),
    ),
    Dump(
        "strands/spans_latest_semconv_blocked.jsonl",
        "strands",
        BLOCKED_RUN,
        BLOCKED_IDS,
        agent_spans=("invoke_agent weather_agent",),
    ),
    # smolagents + OpenInference: {"args", "sanitize_inputs_outputs", "kwargs"} unwrapped; the
    # agent span "weather_agent.run" names the agent; the final answer is a tool span too.
    Dump(
        "smolagents/spans.jsonl",
        "openinference",
        [*FULL_RUN, FINAL_ANSWER],
        [*NO_IDS, None],
        agent_spans=("weather_agent.run",),
    ),
    Dump(
        "smolagents/spans_blocked.jsonl",
        "openinference",
        [*BLOCKED_RUN, FINAL_ANSWER],
        [None] * 4,
        agent_spans=("weather_agent.run",),
    ),
    # LlamaIndex + OpenInference: {"kwargs": ...} unwrapped, the ToolOutput's raw_output read;
    # no AGENT span (the workflow's root is a CHAIN).
    Dump("llamaindex/spans.jsonl", "openinference", FULL_RUN, NO_IDS),
    # DSPy's ReAct (DummyLM) with OpenInference: "<tool>.__call__" spans without tool.name, no
    # agent span (ReAct.forward is a CHAIN); its own finish tool's span is not a call.
    Dump("dspy/spans.jsonl", "openinference", FULL_RUN, NO_IDS),
    # The Vercel AI SDK (TypeScript, ai 6): ai.toolCall spans under the ai.generateText span,
    # the agent, named by its telemetry functionId; no conversation.
    Dump(
        "vercel_ai/spans.jsonl",
        "vercel_ai",
        FULL_RUN,
        FULL_IDS,
        agent_spans=("ai.generateText",),
        agent_conversation=None,
        conversation=None,
    ),
    Dump("dspy/spans_blocked.jsonl", "openinference", BLOCKED_RUN, [None] * 3),
    Dump("llamaindex/spans_blocked.jsonl", "openinference", BLOCKED_RUN, [None] * 3),
    # Haystack's own tracing (content tracing on): its Agent has no name.
    Dump(
        "haystack/spans.jsonl",
        "haystack",
        FULL_RUN,
        NO_IDS,
        agent_spans=("haystack.agent.run",),
        agent_name=None,
        agent_conversation=None,
        conversation=None,
    ),
    Dump(
        "haystack/spans_blocked.jsonl",
        "haystack",
        BLOCKED_RUN,
        [None] * 3,
        agent_spans=("haystack.agent.run",),
        agent_name=None,
        agent_conversation=None,
        conversation=None,
    ),
    # The MCP SDK's own server spans: tool name and failure only. Its middleware blocks inside
    # the span: a blocked call's span is there, as a failure.
    Dump("mcp/spans.jsonl", "mcp", FULL_RUN, NO_IDS, conversation=None, arguments=False),
    Dump(
        "mcp/spans_blocked.jsonl",
        "mcp",
        FULL_RUN,
        NO_IDS,
        conversation=None,
        arguments=False,
        blocked_results=True,
        blocked_errors=True,
    ),
    # OpenLLMetry's MCP instrumentation (mcp 1.x, client spans): {"tool_name", "arguments"} and
    # {"result", "is_error"}; the server's blocks come back as error results.
    Dump("mcp_openllmetry/spans.jsonl", "openllmetry_tool", FULL_RUN, NO_IDS, conversation=None),
    Dump(
        "mcp_openllmetry/spans_blocked.jsonl",
        "openllmetry_tool",
        FULL_RUN,
        NO_IDS,
        conversation=None,
        blocked_results=True,
        blocked_errors=True,
    ),
    # AutoGen's own tracing: arguments only in its log records.
    Dump(
        "autogen/spans.jsonl",
        "autogen",
        FULL_RUN,
        FULL_IDS,
        agent_spans=("invoke_agent weather_agent",),
        agent_conversation=None,
        conversation=None,
        arguments=False,
    ),
    Dump(
        "autogen/spans_blocked.jsonl",
        "autogen",
        BLOCKED_RUN,
        BLOCKED_IDS,
        agent_spans=("invoke_agent weather_agent",),
        agent_conversation=None,
        conversation=None,
        arguments=False,
    ),
    # Agno + OpenInference: everything at start (decided at end all the same: the span is named
    # after the tool); its hook blocks inside the tool span, whose result is the block message.
    Dump(
        "agno/spans.jsonl",
        "openinference",
        FULL_RUN,
        NO_IDS,
        agent_spans=("weather_agent.run",),
        conversation=None,
        weather_result=CLOUDY,
    ),
    Dump(
        "agno/spans_blocked.jsonl",
        "openinference",
        FULL_RUN,
        NO_IDS,
        agent_spans=("weather_agent.run",),
        conversation=None,
        weather_result=CLOUDY,
        blocked_results=True,
    ),
    # CrewAI + OpenInference, wrapper mode: the role is the agent span's graph.node.id.
    Dump(
        "crewai/spans.jsonl",
        "openinference",
        FULL_RUN,
        NO_IDS,
        agent_spans=("Weather researcher._execute_core",),
        agent_name=ROLE,
        agent_conversation=None,
        conversation=None,
        weather_result=CLOUDY,
        counted_results=True,
    ),
    Dump(
        "crewai/spans_blocked.jsonl",
        "openinference",
        BLOCKED_RUN,
        [None] * 3,
        agent_spans=("Weather researcher._execute_core",),
        agent_name=ROLE,
        agent_conversation=None,
        conversation=None,
        weather_result=CLOUDY,
        counted_results=True,
    ),
    # CrewAI + OpenInference, event-listener mode: the role on the tool span too; a blocked
    # call still has its tool span.
    Dump(
        "crewai/spans_events.jsonl",
        "openinference",
        FULL_RUN,
        NO_IDS,
        tool_span_agent=ROLE,
        agent_spans=("Weather researcher.What's the weather in Paris?.execute",),
        agent_name=ROLE,
        agent_conversation=None,
        conversation=None,
        weather_result=CLOUDY,
        counted_results=True,
    ),
    Dump(
        "crewai/spans_events_blocked.jsonl",
        "openinference",
        FULL_RUN,
        NO_IDS,
        tool_span_agent=ROLE,
        agent_spans=("Weather researcher.What's the weather in Paris?.execute",),
        agent_name=ROLE,
        agent_conversation=None,
        conversation=None,
        weather_result=CLOUDY,
        counted_results=True,
        blocked_results=True,
    ),
    # Semantic Kernel with its sensitive-data setting (spans.jsonl, spans_blocked.jsonl) and
    # without any setting (spans_default.jsonl: no arguments, no agent span).
    Dump(
        "semantic_kernel/spans.jsonl",
        "genai",
        _named("tools-", FULL_RUN),
        FULL_IDS,
        agent_spans=("invoke_agent weather_agent",),
        agent_conversation=None,
        conversation=None,
        weather_result=CLOUDY,
        tool_prefix="tools-",
    ),
    Dump(
        "semantic_kernel/spans_blocked.jsonl",
        "genai",
        _named("tools-", BLOCKED_RUN),
        BLOCKED_IDS,
        agent_spans=("invoke_agent weather_agent",),
        agent_conversation=None,
        conversation=None,
        weather_result=CLOUDY,
        tool_prefix="tools-",
    ),
    Dump(
        "semantic_kernel/spans_default.jsonl",
        "genai",
        _named("tools-", FULL_RUN),
        FULL_IDS,
        conversation=None,
        arguments=False,
        tool_prefix="tools-",
    ),
]


@dataclass(frozen=True)
class Span:
    name: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_error: bool
    name_at_start: str
    attributes_at_start: dict[str, Any]

    def tool_call(self) -> SpanToolCall | None:
        return tool_call_from_span(self.name, self.attributes, self.events, self.status_error)


def _load(dump: Dump) -> list[Span]:
    spans = []
    for line in (SPAN_DUMPS / dump.path).read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        spans.append(
            Span(
                name=row["name"],
                attributes=row["attributes"],
                events=[(e["name"], e["attributes"]) for e in row["events"]],
                status_error=row["status"]["code"] == "ERROR",
                name_at_start=row["name_at_start"],
                attributes_at_start=row["attributes_at_start"],
            )
        )
    return spans


def _tool_spans(dump: Dump) -> list[tuple[Span, SpanToolCall]]:
    found = []
    for span in _load(dump):
        call = span.tool_call()
        if call is not None:
            found.append((span, call))
    return found


dump_cases = pytest.mark.parametrize("dump", DUMPS, ids=[d.path for d in DUMPS])


def test_every_dump_in_the_fixture_folder_is_covered() -> None:
    on_disk = {p.relative_to(SPAN_DUMPS).as_posix() for p in SPAN_DUMPS.glob("*/*.jsonl")}
    assert on_disk == {d.path for d in DUMPS}


@dump_cases
def test_tool_spans_are_found_in_order_with_their_convention(dump: Dump) -> None:
    calls = [call for _, call in _tool_spans(dump)]
    assert [c.tool for c in calls] == dump.tools
    assert {c.convention for c in calls} == {dump.convention}


def _searches_before(dump: Dump, calls: list[SpanToolCall], index: int) -> int:
    return sum(1 for call in calls[:index] if dump.tool(call) == "search")


@dump_cases
def test_arguments_decode_to_the_same_values(dump: Dump) -> None:
    expected_search = SEARCH_ARGS if dump.search_args is None else dump.search_args
    for _, call in _tool_spans(dump):
        tool = dump.tool(call)
        if not dump.arguments:
            expected: object = MISSING
        elif tool == FINAL_ANSWER:
            expected = {"answer": ANSWER}
        else:
            expected = WEATHER_ARGS if tool == "get_weather" else expected_search
        assert call.arguments == expected, call


@dump_cases
def test_results_decode_to_the_plain_tool_output(dump: Dump) -> None:
    calls = [call for _, call in _tool_spans(dump)]
    for index, call in enumerate(calls):
        tool = dump.tool(call)
        searches = _searches_before(dump, calls, index)  # searches before this call
        if not dump.arguments:
            assert call.result is None  # nothing of the call's content is published
            continue
        assert isinstance(call.result, str)
        if tool == FINAL_ANSWER:
            assert call.result == ANSWER
        elif tool == "get_weather":
            assert call.result == dump.weather_result
        elif dump.blocked_results and searches >= 2:
            assert call.result.startswith(BLOCKED_PREFIX)
        elif dump.counted_results:
            assert call.result == SEARCH_RESULT.replace(":", f" (#{searches + 1}):", 1)
        else:
            assert call.result == SEARCH_RESULT


@dump_cases
def test_call_ids_status_and_conversation_are_found(dump: Dump) -> None:
    calls = [call for _, call in _tool_spans(dump)]
    assert [c.call_id for c in calls] == dump.call_ids
    # No dump has a failing tool; every instrumentation gives success evidence or an end status.
    # Where a blocked call still has its span, the block may come back as a failure.
    errors = [
        dump.blocked_errors and dump.tool(c) == "search" and _searches_before(dump, calls, i) >= 2
        for i, c in enumerate(calls)
    ]
    assert [c.is_error for c in calls] == errors
    assert all(c.conversation_id == dump.conversation for c in calls)
    assert all(c.agent_name == dump.tool_span_agent for c in calls)


@dump_cases
def test_agent_spans_are_recognised_with_the_agent_name(dump: Dump) -> None:
    spans = _load(dump)
    agents = {s.name: agent_from_span(s.name, s.attributes) for s in spans}
    for span_name in dump.agent_spans:
        agent = agents[span_name]
        assert agent is not None, span_name
        assert agent.agent_name == dump.agent_name
        assert agent.conversation_id == dump.agent_conversation
    # Tool spans are not agent spans, and agent spans are not tool calls.
    for span in spans:
        if span.tool_call() is not None:
            assert agent_from_span(span.name, span.attributes) is None
        if span.name in dump.agent_spans:
            assert span.tool_call() is None


@dump_cases
def test_arguments_available_at_start_only_for_pydantic_ai(dump: Dump) -> None:
    for span, call in _tool_spans(dump):
        available = arguments_available_at_start(span.name_at_start, span.attributes_at_start)
        assert available is dump.at_start
        if available:
            at_start = tool_call_from_span(span.name_at_start, span.attributes_at_start)
            assert at_start is not None
            assert (at_start.tool, at_start.arguments, at_start.call_id) == (
                call.tool,
                call.arguments,
                call.call_id,
            )
            assert at_start.result is None and at_start.is_error is None


@dump_cases
def test_non_tool_spans_are_not_tool_calls_at_start_either(dump: Dump) -> None:
    for span in _load(dump):
        if span.tool_call() is None:
            assert tool_call_from_span(span.name_at_start, span.attributes_at_start) is None
            assert not arguments_available_at_start(span.name_at_start, span.attributes_at_start)


@pytest.mark.parametrize(
    ("path", "agent_spans"),
    [
        ("autogen/spans.jsonl", {"invoke_agent weather_agent"}),  # not its create_agent span
        ("llamaindex/spans.jsonl", set()),  # the workflow's root is a CHAIN
        ("dspy/spans.jsonl", set()),  # ReAct.forward is a CHAIN
        ("mcp/spans.jsonl", set()),  # MCP has no agent; the host's span is no agent either
        ("semantic_kernel/spans_default.jsonl", set()),  # its agent span needs diagnostics on
    ],
)
def test_only_agent_runs_are_agent_spans(path: str, agent_spans: set[str]) -> None:
    dump = next(d for d in DUMPS if d.path == path)
    found = {s.name for s in _load(dump) if agent_from_span(s.name, s.attributes) is not None}
    assert found == agent_spans


def test_the_same_call_decodes_identically_across_instrumentations() -> None:
    """One signature per (tool, arguments) across every dump with parameter names, and per
    (tool, arguments, result) across those whose tools returned the scripted texts."""
    arguments: dict[str, set[str]] = {}
    outcomes: dict[str, set[str]] = {}
    for dump in DUMPS:
        if dump.search_args is not None or not dump.arguments:
            continue
        same_results = not (
            dump.blocked_results or dump.counted_results or dump.weather_result != WEATHER_RESULT
        )
        for _, call in _tool_spans(dump):
            tool = dump.tool(call)
            key = orjson.dumps(call.arguments, option=orjson.OPT_SORT_KEYS).decode()
            arguments.setdefault(tool, set()).add(key)
            if same_results:
                outcome = orjson.dumps([call.arguments, call.result], option=orjson.OPT_SORT_KEYS)
                outcomes.setdefault(tool, set()).add(outcome.decode())
    for found in (arguments, outcomes):
        assert {tool: len(keys) for tool, keys in found.items()} == {
            "search": 1,
            "get_weather": 1,
            FINAL_ANSWER: 1,
        }
    assert arguments["search"] == {'{"query":"weather in Paris"}'}


# --- Hand-written spans for instrumentations without a dump ------------------------------------


def test_openai_agents_sdk_raw_json_string() -> None:
    call = tool_call_from_span(
        "search",
        {
            "openinference.span.kind": "TOOL",
            "llm.system": "openai",
            "tool.name": "search",
            "input.value": '{"query":"weather in Paris"}',
            "input.mime_type": "application/json",
            "output.value": SEARCH_RESULT,
        },
        status_error=False,
    )
    assert call is not None
    assert (call.convention, call.tool, call.arguments, call.result) == (
        "openinference",
        "search",
        SEARCH_ARGS,
        SEARCH_RESULT,
    )
    assert call.is_error is False and call.call_id is None


def test_openai_agents_sdk_handoff_is_named_after_the_span() -> None:
    call = tool_call_from_span("handoff to Billing", {"openinference.span.kind": "TOOL"})
    assert call is not None
    assert (call.tool, call.arguments) == ("handoff to Billing", MISSING)


@pytest.mark.parametrize(
    "schema",
    [
        '{"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}',
        '{"type": "function", "function": {"name": "search", "parameters":'
        ' {"properties": {"query": {"type": "string"}}}}}',
    ],
)
def test_openinference_bare_scalar_maps_to_the_single_schema_property(schema: str) -> None:
    attributes = {
        "openinference.span.kind": "TOOL",
        "tool.name": "search",
        "tool.parameters": schema,
        "input.value": "weather in Paris",
    }
    call = tool_call_from_span("search", attributes)
    assert call is not None and call.arguments == SEARCH_ARGS


def test_openinference_bare_scalar_is_coerced_to_the_schema_type() -> None:
    attributes = {
        "openinference.span.kind": "TOOL",
        "tool.name": "add_one",
        "tool.parameters": '{"properties": {"n": {"type": "integer"}}}',
        "input.value": "5",
    }
    call = tool_call_from_span("add_one", attributes)
    assert call is not None and call.arguments == {"n": 5}
    call = tool_call_from_span("add_one", {**attributes, "input.value": "five"})
    assert call is not None and call.arguments == {"n": "five"}


def test_openinference_bare_scalar_stays_raw_when_the_schema_is_ambiguous() -> None:
    attributes = {
        "openinference.span.kind": "TOOL",
        "tool.name": "get_weather",
        "tool.parameters": '{"properties": {"city": {}, "unit": {}}}',
        "input.value": "Paris",
    }
    call = tool_call_from_span("get_weather", attributes)
    assert call is not None and call.arguments == "Paris"


def test_openinference_python_repr_and_tool_call_envelopes() -> None:
    base = {"openinference.span.kind": "TOOL", "tool.name": "get_weather"}
    repr_call = tool_call_from_span(
        "get_weather", {**base, "input.value": "{'city': 'Paris', 'unit': 'C'}"}
    )
    assert repr_call is not None and repr_call.arguments == WEATHER_ARGS
    envelope = json.dumps(
        {"name": "get_weather", "args": WEATHER_ARGS, "id": "call_9", "type": "tool_call"}
    )
    envelope_call = tool_call_from_span("get_weather", {**base, "input.value": envelope})
    assert envelope_call is not None
    assert (envelope_call.arguments, envelope_call.call_id) == (WEATHER_ARGS, "call_9")


def test_openinference_error_tool_message_and_metadata_thread_id() -> None:
    output = {
        "type": "tool",
        "data": {"content": "boom", "tool_call_id": "call_3", "status": "error"},
    }
    call = tool_call_from_span(
        "search",
        {
            "openinference.span.kind": "TOOL",
            "tool.name": "search",
            "input.value": '{"query": "weather in Paris"}',
            "output.value": json.dumps(output),
            "metadata": '{"thread_id": "thread-7", "langgraph_node": "tools"}',
        },
    )
    assert call is not None
    assert (call.result, call.call_id, call.is_error, call.conversation_id) == (
        "boom",
        "call_3",
        True,
        "thread-7",
    )


OPENINFERENCE_TOOL = {"openinference.span.kind": "TOOL", "tool.name": "search"}


@pytest.mark.parametrize(
    ("bound", "expected"),
    [
        # smolagents' ToolCallingAgent, CodeAgent; LlamaIndex
        ({"args": [], "sanitize_inputs_outputs": True, "kwargs": SEARCH_ARGS}, SEARCH_ARGS),
        ({"args": [], "kwargs": SEARCH_ARGS}, SEARCH_ARGS),
        ({"kwargs": SEARCH_ARGS}, SEARCH_ARGS),
        # smolagents accepts the arguments as one positional dict
        ({"args": [SEARCH_ARGS], "sanitize_inputs_outputs": True, "kwargs": {}}, SEARCH_ARGS),
        ({"args": ["weather in Paris"], "kwargs": {}}, ["weather in Paris"]),
        ({"args": [], "kwargs": {}}, {}),
        # not a bound call: kept as the arguments
        ({"kwargs": SEARCH_ARGS, "query": "x"}, {"kwargs": SEARCH_ARGS, "query": "x"}),
        ({"args": "x", "kwargs": SEARCH_ARGS}, {"args": "x", "kwargs": SEARCH_ARGS}),
        ({"kwargs": "weather in Paris"}, {"kwargs": "weather in Paris"}),
    ],
)
def test_openinference_bound_call_envelopes(bound: dict[str, Any], expected: object) -> None:
    call = tool_call_from_span(
        "SimpleTool", {**OPENINFERENCE_TOOL, "input.value": json.dumps(bound)}
    )
    assert call is not None and call.arguments == expected


def test_llamaindex_tool_output_gives_the_raw_output_and_is_error() -> None:
    def output(raw: object, is_error: bool, blocks: object = None) -> str:
        return json.dumps(
            {
                "blocks": blocks if blocks is not None else [{"text": str(raw)}],
                "tool_name": "search",
                "raw_input": {"args": [], "kwargs": SEARCH_ARGS},
                "raw_output": raw,
                "is_error": is_error,
            },
            separators=(",", ":"),
        )

    attributes = {**OPENINFERENCE_TOOL, "input.value": json.dumps({"kwargs": SEARCH_ARGS})}
    failed = tool_call_from_span(
        "FunctionTool.acall", {**attributes, "output.value": output("backend down", True)}
    )
    assert failed is not None
    assert (failed.arguments, failed.result, failed.is_error) == (
        SEARCH_ARGS,
        "backend down",
        True,
    )
    structured = tool_call_from_span(
        "FunctionTool.call", {**attributes, "output.value": output({"temp": 21}, False)}
    )
    assert structured is not None and (structured.result, structured.is_error) == (
        {"temp": 21},
        False,
    )
    no_raw = tool_call_from_span(
        "FunctionTool.call",
        {**attributes, "output.value": output(None, False, [{"text": "a"}, {"text": "b"}])},
    )
    assert no_raw is not None and no_raw.result == "a\nb"
    # A tool that raised: status ERROR, an exception event, no output at all.
    raised = tool_call_from_span(
        "FunctionTool.acall", attributes, [("exception", {"exception.type": "ValueError"})], True
    )
    assert raised is not None and (raised.result, raised.is_error) == (None, True)


HAYSTACK_TOOL = {"haystack.tool.name": "boom", "haystack.tool.description": "Always fails."}


@pytest.mark.parametrize("flag", [True, "True", "true"])
def test_haystack_tool_error_flag_marks_a_failure(flag: object) -> None:
    # Haystack never sets an error status: the flag is the only failure signal. Without
    # HAYSTACK_CONTENT_TRACING_ENABLED the span has neither arguments nor output.
    call = tool_call_from_span(
        "haystack.agent.step.tool", {**HAYSTACK_TOOL, "haystack.tool.error": flag}, (), False
    )
    assert call is not None
    assert (call.convention, call.tool, call.arguments, call.result, call.is_error) == (
        "haystack",
        "boom",
        MISSING,
        None,
        True,
    )
    with_content = tool_call_from_span(
        "haystack.agent.step.tool",
        {
            **HAYSTACK_TOOL,
            "haystack.tool.error": flag,
            "haystack.agent.step.tool.input": '{"query": "x"}',
            "haystack.agent.step.tool.output": '{"error": "Failed to invoke Tool `boom`"}',
        },
        (),
        False,
    )
    assert with_content is not None
    assert (with_content.arguments, with_content.result, with_content.is_error) == (
        {"query": "x"},
        {"error": "Failed to invoke Tool `boom`"},
        True,
    )


def test_haystack_tool_error_false_is_success_and_absent_is_the_status() -> None:
    base = {**HAYSTACK_TOOL, "haystack.agent.step.tool.input": "{}"}
    call = tool_call_from_span("haystack.agent.step.tool", {**base, "haystack.tool.error": False})
    assert call is not None and call.is_error is False
    call = tool_call_from_span("haystack.agent.step.tool", base)
    assert call is not None and call.is_error is None
    assert tool_call_from_span("haystack.agent.step.llm", base) is None
    agent = agent_from_span("haystack.agent.run", {})
    assert agent == SpanAgent(None, None, None)


def test_mcp_sdk_server_span_failure_without_arguments() -> None:
    attributes = {
        "mcp.method.name": "tools/call",
        "jsonrpc.request.id": "2",
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "boom",
        "error.type": "tool_error",
    }
    call = tool_call_from_span("tools/call boom", attributes, (), True)
    assert call is not None
    # The JSON-RPC id is the wire's, reused by every client session: no call id.
    assert (call.convention, call.arguments, call.result, call.is_error, call.call_id) == (
        "mcp",
        MISSING,
        None,
        True,
        None,
    )
    # A server middleware may put the call's content on the span (GenAI opt-in keys).
    content = {
        **attributes,
        "gen_ai.tool.call.arguments": json.dumps(SEARCH_ARGS),
        "gen_ai.tool.call.result": "no such city",
    }
    call = tool_call_from_span("tools/call boom", content, (), True)
    assert call is not None and (call.arguments, call.result) == (SEARCH_ARGS, "no such city")
    # Its client span names the tool only in the span name: not a tool span.
    client = {"mcp.method.name": "tools/call", "jsonrpc.request.id": "2"}
    assert tool_call_from_span("MCP send tools/call boom", client) is None


def test_openllmetry_mcp_envelopes() -> None:
    base = {"traceloop.span.kind": "tool", "traceloop.entity.name": "search"}
    call = tool_call_from_span(
        "search.tool",
        {
            **base,
            "traceloop.entity.input": json.dumps({"tool_name": "search", "arguments": None}),
            "traceloop.entity.output": json.dumps({"result": "no such city", "is_error": True}),
        },
        (),
        None,
    )
    assert call is not None
    assert (call.arguments, call.result, call.is_error) == ({}, "no such city", True)
    # A @tool function whose parameters have those names is recorded in its own envelope.
    decorated = {"args": [], "kwargs": {"tool_name": "search", "arguments": {"q": 1}}}
    call = tool_call_from_span(
        "search.tool", {**base, "traceloop.entity.input": json.dumps(decorated)}
    )
    assert call is not None and call.arguments == decorated["kwargs"]


def test_autogen_tool_span_has_the_call_id_and_no_arguments() -> None:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.system": "autogen",
        "gen_ai.tool.name": "search",
        "gen_ai.tool.call.id": "call_0",
    }
    call = tool_call_from_span("execute_tool search", attributes, (), False)
    assert call is not None
    assert (call.convention, call.arguments, call.call_id, call.is_error) == (
        "autogen",
        MISSING,
        "call_0",
        False,
    )
    assert not arguments_available_at_start("execute_tool search", attributes)


def test_openinference_tool_spans_started_with_arguments_are_decided_at_end() -> None:
    # Agno starts its tool spans with everything set, but a span named after its tool may be
    # named anything ("execute_sql"): every entrance decides it at its end.
    attributes = {**OPENINFERENCE_TOOL, "tool.name": "execute_sql", "input.value": '{"q": 1}'}
    assert tool_call_from_span("execute_sql", attributes) is not None
    assert not arguments_available_at_start("execute_sql", attributes)


ADK_BASE = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "search",
    "gen_ai.tool.description": "Search the web.",
    "gen_ai.tool.type": "FunctionTool",
    "gen_ai.agent.name": AGENT,
    "gcp.vertex.agent.llm_request": "{}",
    "gcp.vertex.agent.llm_response": "{}",
}


def test_google_adk_legacy_keys() -> None:
    attributes = {
        **ADK_BASE,
        "gen_ai.tool.call.id": "adk-1",
        "gcp.vertex.agent.event_id": "ev-1",
        "gcp.vertex.agent.tool_call_args": json.dumps(SEARCH_ARGS),
        "gcp.vertex.agent.tool_response": json.dumps({"result": SEARCH_RESULT}),
    }
    call = tool_call_from_span("execute_tool search", attributes, status_error=False)
    assert call is not None
    assert (call.convention, call.arguments, call.result, call.call_id, call.agent_name) == (
        "google_adk",
        SEARCH_ARGS,
        SEARCH_RESULT,
        "adk-1",
        AGENT,
    )
    # No conversation id on ADK tool spans: it lives on the agent span.
    assert call.conversation_id is None


def test_google_adk_dict_result_is_kept_and_placeholder_call_id_dropped() -> None:
    attributes = {
        **ADK_BASE,
        "gen_ai.tool.call.id": "<not specified>",
        "gcp.vertex.agent.tool_call_args": json.dumps(SEARCH_ARGS),
        "gcp.vertex.agent.tool_response": '{"error": "BLOCKED by loop guard"}',
    }
    call = tool_call_from_span("execute_tool search", attributes)
    assert call is not None
    assert (call.call_id, call.result) == (None, {"error": "BLOCKED by loop guard"})


def test_google_adk_2_semconv_keys() -> None:
    attributes = {
        **ADK_BASE,
        "gen_ai.tool.call.id": "adk-2",
        "gen_ai.tool.call.arguments": json.dumps(SEARCH_ARGS),
        "gen_ai.tool.call.result": json.dumps({"result": SEARCH_RESULT}),
    }
    attributes.pop("gcp.vertex.agent.llm_request")
    call = tool_call_from_span("execute_tool search", attributes)
    assert call is not None
    assert (call.convention, call.arguments, call.result) == (
        "google_adk",
        SEARCH_ARGS,
        SEARCH_RESULT,
    )


def test_google_adk_merged_tools_span_is_not_a_call() -> None:
    attributes = {
        **ADK_BASE,
        "gen_ai.tool.name": "(merged tools)",
        "gcp.vertex.agent.tool_call_args": "N/A",
    }
    assert tool_call_from_span("execute_tool (merged tools)", attributes) is None


def test_google_adk_agent_span_carries_the_session() -> None:
    agent = agent_from_span(
        "invoke_agent weather_agent",
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": AGENT,
            "gen_ai.conversation.id": "s-1",
        },
    )
    assert agent == SpanAgent(agent_id=None, agent_name=AGENT, conversation_id="s-1")


def test_util_genai_start_then_end() -> None:
    start = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
        "gen_ai.tool.type": "function",
    }
    assert not arguments_available_at_start("execute_tool search", start)
    early = tool_call_from_span("execute_tool search", start)
    assert early is not None
    assert (early.convention, early.arguments, early.result, early.is_error) == (
        "genai",
        MISSING,
        None,
        None,
    )
    end = {
        **start,
        "gen_ai.tool.call.id": "u-1",
        "gen_ai.tool.call.arguments": '{"query": "weather in Paris"}',
        "gen_ai.tool.call.result": json.dumps(SEARCH_RESULT),
    }
    call = tool_call_from_span("execute_tool search", end, status_error=False)
    assert call is not None
    assert (call.arguments, call.result, call.call_id, call.is_error) == (
        SEARCH_ARGS,
        SEARCH_RESULT,
        "u-1",
        False,
    )


def test_util_genai_error_type_marks_an_error() -> None:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
        "error.type": "TimeoutError",
    }
    call = tool_call_from_span("execute_tool search", attributes)
    assert call is not None and call.is_error is True


def test_span_name_alone_recognises_a_semconv_tool_span_before_its_attributes() -> None:
    call = tool_call_from_span("execute_tool search", {})
    assert call is not None
    assert (call.convention, call.tool, call.arguments) == ("genai", "search", MISSING)


def test_crewai_call_tool() -> None:
    attributes = {
        "gen_ai.tool.name": "search",
        "gen_ai.tool.call.arguments": json.dumps(SEARCH_ARGS),
        "gen_ai.agent.name": "Researcher",
    }
    call = tool_call_from_span("call tool", attributes)
    assert call is not None
    assert (call.convention, call.tool, call.arguments, call.agent_name) == (
        "crewai",
        "search",
        SEARCH_ARGS,
        "Researcher",
    )


def test_openlit_current_and_legacy_keys() -> None:
    base = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
        "gen_ai.system": "langchain",
    }
    current = tool_call_from_span(
        "execute_tool search", {**base, "gen_ai.tool.call.arguments": json.dumps(SEARCH_ARGS)}
    )
    legacy = tool_call_from_span(
        "execute_tool search", {**base, "gen_ai.tool.args": json.dumps(SEARCH_ARGS)}
    )
    assert current is not None and legacy is not None
    assert (current.convention, current.arguments) == ("genai", SEARCH_ARGS)
    assert (legacy.convention, legacy.arguments) == ("openlit", SEARCH_ARGS)


@pytest.mark.parametrize(
    ("entity_input", "expected"),
    [
        ('{"args": [], "kwargs": {"query": "weather in Paris"}}', SEARCH_ARGS),
        ('{"args": ["weather in Paris"], "kwargs": {}}', ["weather in Paris"]),
        ('{"args": [], "kwargs": {}}', {}),
    ],
)
def test_openllmetry_tool_decorator(entity_input: str, expected: object) -> None:
    attributes = {
        "traceloop.span.kind": "tool",
        "traceloop.entity.name": "search",
        "traceloop.entity.input": entity_input,
        "traceloop.entity.output": json.dumps(SEARCH_RESULT),
        "traceloop.association.properties.session_id": "sess-1",
    }
    call = tool_call_from_span("search.tool", attributes)
    assert call is not None
    assert (call.convention, call.tool, call.arguments, call.result, call.conversation_id) == (
        "openllmetry_tool",
        "search",
        expected,
        SEARCH_RESULT,
        "sess-1",
    )


def test_openllmetry_tool_name_falls_back_to_the_span_name() -> None:
    call = tool_call_from_span("search.tool", {"traceloop.span.kind": "tool"})
    assert call is not None and call.tool == "search"


def test_openllmetry_langchain_input_str_only() -> None:
    envelope = {"input_str": "{'city': 'Paris', 'unit': 'C'}", "kwargs": {"tool_call_id": "call_6"}}
    attributes = {
        "traceloop.span.kind": "tool",
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_weather",
        "gen_ai.tool.call.arguments": json.dumps(envelope),
    }
    call = tool_call_from_span("execute_tool get_weather", attributes)
    assert call is not None
    assert (call.convention, call.arguments, call.call_id) == (
        "openllmetry_langchain",
        WEATHER_ARGS,
        "call_6",
    )


def test_openllmetry_agent_decorator_span() -> None:
    agent = agent_from_span(
        "planner.agent", {"traceloop.span.kind": "agent", "traceloop.entity.name": "planner"}
    )
    assert agent == SpanAgent(agent_id=None, agent_name="planner", conversation_id=None)


def test_openinference_agent_name_attribute_wins_over_span_name() -> None:
    agent = agent_from_span(
        "Agent workflow", {"openinference.span.kind": "AGENT", "agent.name": "Triage"}
    )
    assert agent is not None and agent.agent_name == "Triage"


@pytest.mark.parametrize(
    ("name", "attributes", "expected"),
    [
        # CrewAI: the role (graph.node.id), not the span name nor the agent's uuid
        (
            "Weather researcher._execute_core",
            {"graph.node.id": ROLE, "crew_key": "9fcc", "crew_id": "68f2-uuid"},
            ROLE,
        ),
        (
            "Weather researcher.Find it.execute",
            {"graph.node.id": ROLE, "agent_key": "ad85", "agent_id": "44a1-uuid"},
            ROLE,
        ),
        # CrewAI's agent span before its attributes (wrapper mode): the span name
        ("Weather researcher._execute_core", {}, "Weather researcher._execute_core"),
        # smolagents: "<name>.run", the class name for an unnamed agent
        ("weather_agent.run", {"smolagents.tools_names": "['search']"}, AGENT),
        ("ToolCallingAgent.run", {"smolagents.max_steps": "20"}, "ToolCallingAgent"),
        # Agno: agent.name (its graph.node.id is a hash)
        ("weather_agent.run", {"agent.name": AGENT, "graph.node.id": "2765"}, AGENT),
    ],
)
def test_openinference_agent_labels_are_the_role_or_name(
    name: str, attributes: dict[str, object], expected: str
) -> None:
    agent = agent_from_span(name, {"openinference.span.kind": "AGENT", **attributes})
    assert agent is not None and agent.agent_name == expected
    assert agent.agent_id is None


STRANDS_BASE = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.system": "strands-agents",
    "gen_ai.tool.name": "search",
    "gen_ai.tool.call.id": "call_0",
}
STRANDS_EVENTS = [
    ("gen_ai.tool.message", {"role": "tool", "content": json.dumps(SEARCH_ARGS), "id": "call_0"}),
    ("gen_ai.choice", {"message": '[{"text": "boom"}]', "id": "call_0"}),
]


def test_strands_error_status() -> None:
    call = tool_call_from_span(
        "execute_tool search", {**STRANDS_BASE, "gen_ai.tool.status": "error"}, STRANDS_EVENTS
    )
    assert call is not None
    assert (call.convention, call.arguments, call.result, call.is_error) == (
        "strands_event",
        SEARCH_ARGS,
        "boom",
        True,
    )


def test_span_status_error_and_exception_event_mark_errors() -> None:
    by_status = tool_call_from_span(
        "execute_tool search", STRANDS_BASE, STRANDS_EVENTS, status_error=True
    )
    by_event = tool_call_from_span(
        "execute_tool search",
        STRANDS_BASE,
        [*STRANDS_EVENTS, ("exception", {"exception.type": "ValueError"})],
    )
    no_evidence = tool_call_from_span("execute_tool search", STRANDS_BASE, STRANDS_EVENTS)
    assert by_status is not None and by_event is not None and no_evidence is not None
    assert (by_status.is_error, by_event.is_error, no_evidence.is_error) == (True, True, None)


def test_events_given_as_lists_are_read() -> None:
    events: Any = [list(event) for event in STRANDS_EVENTS]
    call = tool_call_from_span("execute_tool search", STRANDS_BASE, events)
    assert call is not None and call.arguments == SEARCH_ARGS


# --- Decoding limits ---------------------------------------------------------------------------


def test_decode_json_contract() -> None:
    assert decode_json('{"a": [1, 2]}') == {"a": [1, 2]}
    assert decode_json(" \n[1]") == [1]
    assert decode_json('"plain"') == "plain"
    assert decode_json(json.dumps(json.dumps({"a": 1}))) == {"a": 1}  # double-encoded
    assert decode_json(b'{"a": 1}') == {"a": 1}
    # Bare scalars stay strings so '"42"' (JSON) and '42' (raw text) agree.
    assert decode_json("42") == "42"
    assert decode_json(json.dumps("42")) == "42"
    for raw in ("weather in Paris", '{"a": NaN}', "{not json", "[" * 5000 + "]" * 5000):
        assert decode_json(raw) == raw
    for value in (None, 3, 2.5, True, ("a",)):
        assert decode_json(value) == value


def test_strings_over_the_cap_are_kept_raw() -> None:
    huge = json.dumps({"query": "x" * MAX_DECODE_CHARS})
    assert len(huge) > MAX_DECODE_CHARS
    assert decode_json(huge) is huge
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
        "gen_ai.tool.call.arguments": huge,
    }
    call = tool_call_from_span("execute_tool search", attributes)
    assert call is not None and call.arguments is huge
    just_under = json.dumps({"q": "x" * (MAX_DECODE_CHARS - 20)})
    assert len(just_under) <= MAX_DECODE_CHARS and decode_json(just_under) == {
        "q": "x" * (MAX_DECODE_CHARS - 20)
    }


def test_non_string_attribute_values_are_treated_as_absent() -> None:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": 7,
        "gen_ai.tool.call.id": ["x"],
        "gen_ai.conversation.id": {"a": 1},
    }
    call = tool_call_from_span("execute_tool search", attributes)
    assert call is not None
    # An int name is rendered; a list id and a dict conversation id are not identifiers.
    assert (call.tool, call.call_id, call.conversation_id) == ("7", None, None)
    assert tool_call_from_span("chat", {"gen_ai.operation.name": ["execute_tool"]}) is None


def test_conversation_id_order() -> None:
    assert conversation_id({"session.id": "s", "gen_ai.conversation.id": "c"}) == "c"
    assert conversation_id({"traceloop.association.properties.thread_id": "t"}) == "t"
    assert conversation_id({"metadata": '{"thread_id": "m"}'}) == "m"
    assert conversation_id({"metadata": "not json _id"}) is None
    assert conversation_id({}) is None


# --- The table and the hot path ----------------------------------------------------------------

ALL_CONVENTIONS: list[ToolConvention | AgentConvention] = [*TOOL_CONVENTIONS, *AGENT_CONVENTIONS]


def test_table_entries_start_with_a_cheap_gate() -> None:
    cheap = {conventions.On.SPAN_NAME, conventions.On.SPAN_NAME_PREFIX}
    for entry in ALL_CONVENTIONS:
        gate = entry.when[0]
        assert gate.on in cheap or (gate.on is conventions.On.ATTRIBUTE and gate.values), entry.name
    names = {entry.name for entry in TOOL_CONVENTIONS}
    assert names >= {
        "genai",
        "pydantic_ai",
        "pydantic_ai_legacy",
        "openinference",
        "openllmetry_tool",
        "openllmetry_langchain",
        "strands_event",
        "strands",
        "google_adk",
        "crewai",
        "openlit",
    }


class CountingMapping(Mapping[str, object]):
    """A mapping that counts every lookup, to pin the cost of rejecting a span."""

    def __init__(self, data: dict[str, object]) -> None:
        self._data = data
        self.lookups = 0

    def __getitem__(self, key: str) -> object:
        self.lookups += 1
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        self.lookups += 1
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the hot path must not iterate attributes")

    def __len__(self) -> int:
        raise AssertionError("the hot path must not size attributes")


@pytest.mark.parametrize(
    ("name", "attributes"),
    [
        ("chat scripted-loop", {"gen_ai.operation.name": "chat", "gen_ai.agent.name": AGENT}),
        (
            "execute_task tools",
            {"traceloop.span.kind": "task", "gen_ai.operation.name": "execute_task"},
        ),
        ("RunnableSequence", {"openinference.span.kind": "CHAIN"}),
        ("GET /", {"http.method": "GET"}),
    ],
)
def test_rejecting_a_non_tool_span_costs_a_few_lookups(
    name: str, attributes: dict[str, object]
) -> None:
    counting = CountingMapping(attributes)
    assert tool_call_from_span(name, counting) is None
    assert counting.lookups <= 4
    counting.lookups = 0
    assert agent_from_span(name, counting) is None
    assert counting.lookups <= 4
    counting.lookups = 0
    assert may_be_tool_span(name, counting) is False
    assert counting.lookups <= 4


# --- Nothing raises ----------------------------------------------------------------------------

KNOWN_KEYS = sorted(
    {
        key
        for entry in TOOL_CONVENTIONS
        for key in (
            *entry.tool_keys,
            *entry.argument_keys,
            *entry.result_keys,
            *entry.call_id_keys,
            *entry.error_keys,
        )
    }
    | {
        key
        for entry in ALL_CONVENTIONS
        for c in entry.when
        if c.on is conventions.On.ATTRIBUTE
        for key in c.keys
    }
    | {
        "metadata",
        "tool.parameters",
        "error.type",
        "gen_ai.tool.status",
        "session.id",
        "gen_ai.conversation.id",
    }
)
MARKER_VALUES = [
    "execute_tool",
    "invoke_agent",
    "TOOL",
    "AGENT",
    "tool",
    "agent",
    "workflow",
    "strands-agents",
    "FunctionTool",
    "error",
    "success",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
odd_values = (
    json_values
    | json_values.map(lambda v: json.dumps(v, allow_nan=True))
    | st.sampled_from(MARKER_VALUES)
    | st.binary(max_size=40)
    | st.tuples(st.text(max_size=5), st.integers())
    | st.sampled_from(
        [
            '{"a": NaN}',
            "[" * 3000,
            "{'a': (1,",
            '"\\ud800"',
            '{"args": 1, "kwargs": [2]}',
            '{"inputs": 3, "kwargs": "x"}',
            '{"type": "tool", "data": {"content": []}}',
            '[{"text": 1}]',
            '{"output": {"lc": 1, "kwargs": 5}}',
            '{"properties": {"x": 1}}',
            '{"args": [{"a": 1}], "kwargs": {}, "sanitize_inputs_outputs": true}',
            '{"kwargs": {"a": 1}, "args": 3}',
            '{"tool_name": "t", "arguments": 5}',
            '{"result": [{"text": "a"}], "is_error": "yes"}',
            '{"tool_name": "t", "raw_input": 1, "raw_output": null, "is_error": 1}',
            '{"tool_name": "t", "raw_input": 1, "raw_output": null, "content": [{"text": 2}]}',
        ]
    )
)
attribute_maps = st.dictionaries(
    st.sampled_from(KNOWN_KEYS) | st.text(max_size=12), odd_values, max_size=10
)
span_names = st.sampled_from(
    [
        "execute_tool search",
        "running tool",
        "call tool",
        "search.tool",
        "invoke_agent x",
        "execute_tool ",
        "haystack.agent.step.tool",
        "haystack.agent.run",
        "",
    ]
) | st.text(max_size=20)
events = st.lists(
    st.tuples(
        st.sampled_from(["gen_ai.tool.message", "gen_ai.choice", "exception"])
        | st.text(max_size=8),
        st.dictionaries(st.sampled_from(["content", "message", "id"]), odd_values, max_size=3),
    ),
    max_size=3,
)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(
    name=span_names,
    attributes=attribute_maps,
    span_events=events,
    status_error=st.none() | st.booleans(),
)
def test_nothing_raises_on_odd_input(
    name: str,
    attributes: dict[str, object],
    span_events: list[tuple[str, dict[str, object]]],
    status_error: bool | None,
) -> None:
    call = tool_call_from_span(name, attributes, span_events, status_error)
    if call is not None:
        assert isinstance(call.tool, str) and call.tool
        assert call.call_id is None or isinstance(call.call_id, str)
        assert call.conversation_id is None or isinstance(call.conversation_id, str)
        assert call.is_error in (None, True, False)
        if status_error:
            assert call.is_error is True
    agent = agent_from_span(name, attributes)
    assert agent is None or isinstance(agent, SpanAgent)
    assert arguments_available_at_start(name, attributes) in (True, False)
    found = conversation_id(attributes)
    assert found is None or isinstance(found, str)


@settings(max_examples=100, deadline=None)
@given(
    name=st.one_of(st.none(), st.integers(), st.binary()),
    attributes=st.one_of(st.none(), st.lists(st.integers())),
)
def test_nothing_raises_on_wrong_argument_types(name: Any, attributes: Any) -> None:
    assert tool_call_from_span(name, attributes) is None
    assert agent_from_span(name, attributes) is None
    assert arguments_available_at_start(name, attributes) is False
    assert may_be_tool_span(name, attributes) is False
    assert conversation_id(attributes) is None


# --- The compiled tables answer as the tables read in order ------------------------------------


class Marker(str, enum.Enum):
    """Marker values as a str subclass, the way an instrumentation's own enum may set them."""

    EXECUTE_TOOL = "execute_tool"
    INVOKE_AGENT = "invoke_agent"
    TOOL = "TOOL"
    AGENT = "AGENT"
    TRACELOOP_TOOL = "tool"


def _gate_opens(gate: conventions.Condition, name: str, attributes: Mapping[str, object]) -> bool:
    """A gate as the table defines it; an attribute gate opens on a plain str value only."""
    if gate.on is conventions.On.ATTRIBUTE:
        return any(
            type(attributes.get(key)) is str and attributes.get(key) in (gate.values or ())
            for key in gate.keys
        )
    return gate.holds(name, attributes, ())


def _read_in_order(
    table: tuple[ToolConvention, ...] | tuple[AgentConvention, ...],
    name: str,
    attributes: Mapping[str, object],
    span_events: list[tuple[str, dict[str, object]]],
) -> ToolConvention | AgentConvention | None:
    """The table's documented meaning: no open gate, no match; else the first entry whose
    conditions all hold."""
    if not any(_gate_opens(entry.when[0], name, attributes) for entry in table):
        return None
    for entry in table:
        if all(condition.holds(name, attributes, span_events) for condition in entry.when):
            return entry
    return None


marker_values = st.sampled_from(MARKER_VALUES) | st.sampled_from(list(Marker))
compiled_attribute_maps = st.dictionaries(
    st.sampled_from(KNOWN_KEYS), odd_values | marker_values | marker_values, max_size=8
)


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(
    name=span_names | st.sampled_from(list(Marker)),
    attributes=compiled_attribute_maps,
    span_events=events,
)
def test_compiled_tables_answer_as_the_tables_read_in_order(
    name: str, attributes: dict[str, object], span_events: list[tuple[str, dict[str, object]]]
) -> None:
    tool_entry = _read_in_order(TOOL_CONVENTIONS, name, attributes, span_events)
    bits = _dispatch._TOOLS.gate_bits(name, attributes)
    assert (
        _dispatch._TOOLS.match(bits, name, attributes, span_events) if bits else None
    ) is tool_entry
    assert may_be_tool_span(name, attributes) is (bits != 0)
    call = tool_call_from_span(name, attributes, span_events)
    if tool_entry is None:
        assert call is None
        assert not arguments_available_at_start(name, attributes)
    elif call is not None:
        assert call.convention == tool_entry.name

    agent_entry = _read_in_order(AGENT_CONVENTIONS, name, attributes, [])
    bits = _dispatch._AGENTS.gate_bits(name, attributes)
    assert (_dispatch._AGENTS.match(bits, name, attributes, ()) if bits else None) is agent_entry
    assert (agent_from_span(name, attributes) is None) is (agent_entry is None)


def test_a_str_subclass_value_alone_opens_no_gate_but_counts_once_one_is_open() -> None:
    attributes = {
        "gen_ai.operation.name": Marker.EXECUTE_TOOL,
        "gen_ai.tool.name": "search",
        "logfire.msg": "running tool: search",
    }
    assert tool_call_from_span("search", attributes) is None
    call = tool_call_from_span("execute_tool search", attributes)  # the name gate opens
    assert call is not None and call.convention == "pydantic_ai"
    assert agent_from_span("x", {"gen_ai.operation.name": Marker.INVOKE_AGENT}) is None


def test_every_condition_kind_compiles_to_its_holds() -> None:
    spans: list[tuple[str, dict[str, object], list[tuple[str, dict[str, object]]]]] = [
        ("execute_tool a", {"k": "v", "j": "w"}, [("ev", {})]),
        ("call tool", {"k": Marker.TOOL, "j": None}, [["ev", {}]]),  # type: ignore[list-item]
        ("", {"k": 1}, [("other", {}), ("x",)]),  # type: ignore[list-item]
    ]
    conditions = [
        conventions.attribute_present("k"),
        conventions.attribute_present("j", "k"),
        conventions.attribute_present("z"),
        conventions.attribute_is("k", "v", "TOOL"),
        conventions.Condition(conventions.On.ATTRIBUTE, ("z", "j"), frozenset({"w"})),
        conventions.span_name_is("call tool", ""),
        conventions.span_name_starts("exec", "x"),
        conventions.has_event("ev"),
        conventions.has_event("nope"),
    ]
    for condition in conditions:
        check = _dispatch._compile_check(condition)
        for name, attributes, span_events in spans:
            assert check(name, attributes, span_events) is condition.holds(
                name, attributes, span_events
            )


def test_a_table_entry_must_start_with_a_cheap_gate() -> None:
    entry = ToolConvention(name="events_first", when=(conventions.has_event("x"),))
    with pytest.raises(ValueError, match="events_first"):
        _dispatch._Dispatch([entry])
    entry = ToolConvention(name="presence_first", when=(conventions.attribute_present("x"),))
    with pytest.raises(ValueError, match="presence_first"):
        _dispatch._Dispatch([entry])


# --- The gate: derived from the tool table once, used by the span processor ---------------------


def _span_meeting(
    conditions: tuple[conventions.Condition, ...],
) -> tuple[str, dict[str, object], list[tuple[str, dict[str, object]]]]:
    """A span (name, attributes, events) meeting every one of ``conditions``."""
    name = "some span"
    attributes: dict[str, object] = {}
    span_events: list[tuple[str, dict[str, object]]] = []
    for condition in conditions:
        first = condition.keys[0]
        if condition.on is conventions.On.ATTRIBUTE:
            attributes[first] = min(condition.values) if condition.values else "x"
        elif condition.on is conventions.On.SPAN_NAME:
            name = first
        elif condition.on is conventions.On.SPAN_NAME_PREFIX:
            name = f"{first}search"
        else:
            span_events.append((first, {}))
    return name, attributes, span_events


@pytest.mark.parametrize("entry", TOOL_CONVENTIONS, ids=lambda entry: entry.name)
def test_a_span_meeting_a_tool_convention_passes_the_gate(entry: ToolConvention) -> None:
    name, attributes, span_events = _span_meeting(entry.when)
    assert may_be_tool_span(name, attributes)
    assert _read_in_order(TOOL_CONVENTIONS, name, attributes, span_events) is not None
    name, attributes, _ = _span_meeting(entry.when[:1])  # the entry's gate alone opens it
    assert may_be_tool_span(name, attributes)


def test_the_gate_reads_past_unhashable_and_str_subclass_values() -> None:
    attributes: dict[str, object] = {
        "traceloop.span.kind": ["tool"],
        "openinference.span.kind": Marker.TOOL,
        "gen_ai.operation.name": "execute_tool",
    }
    assert may_be_tool_span("search", attributes)
    del attributes["gen_ai.operation.name"]
    assert not may_be_tool_span("search", attributes)
    assert tool_call_from_span("search", attributes) is None


def _gate(table: tuple[ToolConvention, ...]) -> Callable[[str, Mapping[str, object]], object]:
    """The gate compiled from ``table``, answering its gate bits on an open gate."""
    dispatch = _dispatch._Dispatch(table)
    return dispatch.gate(dispatch.gate_bits)


def test_the_gate_is_derived_from_the_table() -> None:
    name, attributes = "fetch_tool web", {"my.kind": "tool_call"}  # no gate of today's table
    assert not may_be_tool_span(name, attributes)
    assert not _gate(TOOL_CONVENTIONS)(name, attributes)
    for gate in (
        conventions.span_name_starts("fetch_tool "),
        conventions.attribute_is("my.kind", "tool_call"),
    ):
        table = (*TOOL_CONVENTIONS, ToolConvention(name="new", when=(gate,)))
        assert _gate(table)(name, attributes)
    # Removing an entry closes a gate only it had: "running tool" is Pydantic AI v2's alone.
    without = tuple(entry for entry in TOOL_CONVENTIONS if entry.name != "pydantic_ai_legacy")
    assert may_be_tool_span("running tool", {})
    assert not _gate(without)("running tool", {})


def test_the_span_processor_reads_exactly_the_spans_the_gate_opens_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from otel_loopguard.processor import LoopGuardSpanProcessor

    ended: list[str] = []
    monkeypatch.setattr(
        LoopGuardSpanProcessor, "_end", lambda self, span, name, *rest: ended.append(name)
    )
    processor = LoopGuardSpanProcessor()
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    spans = [_span_meeting(entry.when)[:2] for entry in TOOL_CONVENTIONS] + [
        ("chat gpt-4o", {"gen_ai.operation.name": "chat"}),
        ("invoke_agent weather", {"gen_ai.operation.name": "invoke_agent"}),
        ("GET /", {"http.request.method": "GET"}),
        ("search.tool", {}),  # an OpenLLMetry name without its span kind: no gate
        ("execute_tool", {}),  # no tool name after the prefix: no gate
        ("search", {"gen_ai.operation.name": Marker.EXECUTE_TOOL}),  # str subclass alone: no gate
    ]
    try:
        for name, attributes in spans:
            tracer.start_span(name, attributes=attributes).end()  # type: ignore[arg-type]
    finally:
        processor.shutdown()
    assert ended == [name for name, attributes in spans if may_be_tool_span(name, attributes)]
    assert len(ended) == len(TOOL_CONVENTIONS)


def test_any_mapping_reads_like_a_dict() -> None:
    for dump in DUMPS:
        for span, call in _tool_spans(dump)[:2]:
            for wrapped in (MappingProxyType(span.attributes), CountingMapping(span.attributes)):
                assert (
                    tool_call_from_span(span.name, wrapped, span.events, span.status_error) == call
                )
                assert agent_from_span(span.name, wrapped) is None


def test_wrong_types_are_rejected_after_the_gate_too() -> None:
    class GetOnly:
        """Has get() but is no Mapping."""

        def get(self, key: str, default: object = None) -> object:
            return "execute_tool" if key == "gen_ai.operation.name" else default

    assert tool_call_from_span("execute_tool x", GetOnly()) is None  # type: ignore[arg-type]
    assert agent_from_span("invoke_agent x", GetOnly()) is None  # type: ignore[arg-type]
    assert tool_call_from_span(b"execute_tool x", {}) is None  # type: ignore[arg-type]
    tuple_name: Any = ("execute_tool x",)
    assert tool_call_from_span(tuple_name, {"gen_ai.operation.name": "execute_tool"}) is None
    call = tool_call_from_span("execute_tool x", {}, events=42)  # type: ignore[arg-type]
    assert call is not None and call.tool == "x"


# -- The start gate (spans.START_NAME_PREFIXES), derived from the tables' start names ---------


def test_every_start_name_of_the_tables_passes_the_start_gate() -> None:
    entries: list[ToolConvention | AgentConvention] = [*TOOL_CONVENTIONS, *AGENT_CONVENTIONS]
    declared = [(entry.name, name) for entry in entries for name in entry.start_names]
    assert declared  # Pydantic AI's tool spans and GenAI agent runs are looked at when they start
    for entry_name, start_name in declared:
        for span_name in (start_name, f"{start_name}search"):
            # As the processor and the recorded-trace reader test a starting span's name.
            assert span_name[:4] in START_NAME_PREFIXES, (entry_name, span_name)


def test_the_conventions_decided_at_start_are_those_with_start_names() -> None:
    with_start_names = {entry.name for entry in TOOL_CONVENTIONS if entry.start_names}
    assert (
        with_start_names == ARGUMENTS_AT_START_CONVENTIONS == {"pydantic_ai", "pydantic_ai_legacy"}
    )


def test_the_start_gate_is_derived_from_the_tables() -> None:
    assert _start_name_prefixes(TOOL_CONVENTIONS, AGENT_CONVENTIONS) == START_NAME_PREFIXES
    assert "laun" not in START_NAME_PREFIXES
    new = ToolConvention(
        name="new",
        when=(conventions.span_name_starts("launch_tool "),),
        start_names=("launch_tool ",),
    )
    assert "laun" in _start_name_prefixes((*TOOL_CONVENTIONS, new), AGENT_CONVENTIONS)
    # An entry without start names opens nothing at start: "call tool" (CrewAI) is decided at end.
    assert "call" not in START_NAME_PREFIXES
    short = ToolConvention(name="short", when=new.when, start_names=("go ",))
    with pytest.raises(ValueError, match=r"'short'.*'go '"):
        _start_name_prefixes((short,))


@dump_cases
def test_spans_decided_at_start_begin_with_their_entry_start_names(dump: Dump) -> None:
    for span, call in _tool_spans(dump):
        if not arguments_available_at_start(span.name_at_start, span.attributes_at_start):
            continue
        assert span.name_at_start[:4] in START_NAME_PREFIXES
        (entry,) = {entry for entry in TOOL_CONVENTIONS if entry.name == call.convention}
        assert span.name_at_start.startswith(entry.start_names), (entry.name, span.name_at_start)


# OpenInference's DSPy instrumentation (openinference-instrumentation-dspy 0.1.48): the span is
# "<tool>.__call__" (".acall" when awaited), without tool.name; input.value is the bound call of
# dspy.Tool.__call__(**kwargs), output.value the JSON of what the tool returned.
DSPY_TOOL = {"openinference.span.kind": "TOOL", "input.mime_type": "application/json"}


@pytest.mark.parametrize("method", ["__call__", "acall"])
def test_dspy_tool_spans_are_named_without_the_method(method: str) -> None:
    call = tool_call_from_span(
        f"search.{method}",
        {
            **DSPY_TOOL,
            "input.value": json.dumps({"kwargs": SEARCH_ARGS}),
            "output.value": json.dumps("results for 'weather in Paris': nothing useful"),
        },
    )
    assert call is not None and call.convention == "openinference"
    assert (call.tool, call.arguments, call.result) == (
        "search",
        SEARCH_ARGS,
        "results for 'weather in Paris': nothing useful",
    )


def test_dspy_react_finish_is_a_final_answer_not_a_call() -> None:
    # DSPy's ReAct adds a "finish" tool to end the trajectory: its span is not a call
    attributes = {**DSPY_TOOL, "input.value": '{"kwargs": {}}', "output.value": '"Completed."'}
    assert tool_call_from_span("finish.__call__", attributes) is None
    assert tool_call_from_span("finish.acall", attributes) is None
    # a tool named finish that says so (tool.name) is another framework's tool: tracked
    named = tool_call_from_span("finish", {**attributes, "tool.name": "finish"})
    assert named is not None and named.tool == "finish"
    # a span named after the tool without DSPy's suffix keeps its whole name
    plain = tool_call_from_span("lookup", {**DSPY_TOOL, "input.value": "{}"})
    assert plain is not None and plain.tool == "lookup"


def test_crewai_own_tracing_names_the_agent_by_role_and_the_run_by_its_kickoff_id() -> None:
    # crewai 1.15's own tracing (crewai.telemetry.tracing): the agent span's gen_ai.agent.name is
    # the agent's key (a hash); crewai.agent.role names it; every span has the run's kickoff id
    agent_span = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "ad85c5604c4bb6c39f5eb0f96f5e127a",
        "gen_ai.agent.id": "62c0bb25-d718-4e8f-9bb6-4e47d5dd2487",
        "crewai.agent.role": "Weather researcher",
        "crewai.execution_uuid": "kickoff-1",
    }
    assert agent_from_span("execute agent", agent_span) == SpanAgent(
        "62c0bb25-d718-4e8f-9bb6-4e47d5dd2487", "Weather researcher", "kickoff-1"
    )
    assert conversation_id(agent_span) == "kickoff-1"
    # a conversation id, when the session was given one, comes first
    assert conversation_id({**agent_span, "gen_ai.conversation.id": "conv-7"}) == "conv-7"


# The Vercel AI SDK (ai 6.0.333, experimental_telemetry; src/generate-text/execute-tool-call.ts),
# as its ai.toolCall spans arrive from tests/typescript/agent.mjs.
VERCEL_TOOL = {
    "operation.name": "ai.toolCall weather-agent",
    "resource.name": "weather-agent",
    "ai.operationId": "ai.toolCall",
    "ai.telemetry.functionId": "weather-agent",
    "ai.toolCall.name": "search",
    "ai.toolCall.id": "call-1",
    "ai.toolCall.args": '{"query":"weather in Paris"}',
}


def test_vercel_ai_tool_call_spans() -> None:
    done = tool_call_from_span(
        "ai.toolCall", {**VERCEL_TOOL, "ai.toolCall.result": '"results for it: nothing"'}
    )
    assert done is not None and done.convention == "vercel_ai"
    assert (done.tool, done.arguments, done.result, done.call_id, done.is_error) == (
        "search",
        SEARCH_ARGS,
        "results for it: nothing",
        "call-1",
        None,
    )
    # a tool that threw: no result, status ERROR and an exception event (recordErrorOnSpan)
    failed = tool_call_from_span(
        "ai.toolCall", VERCEL_TOOL, [("exception", {"exception.message": "down"})], True
    )
    assert failed is not None and (failed.result, failed.is_error) == (None, True)
    # the function id is the agent's, on the enclosing span; the tool span names no agent
    assert (done.agent_name, done.agent_id) == (None, None)


def test_vercel_ai_generate_and_stream_calls_are_the_agent_runs() -> None:
    for operation in ("ai.generateText", "ai.streamText"):
        run = {"ai.operationId": operation, "ai.telemetry.functionId": "weather-agent"}
        assert agent_from_span(operation, run) == SpanAgent(None, "weather-agent", None)
        # without a function id, the run is keyed by its span alone
        assert agent_from_span(operation, {"ai.operationId": operation}) == SpanAgent(
            None, None, None
        )
    # the model call steps inside it are not agents, nor tool calls
    step = {"ai.operationId": "ai.generateText.doGenerate", "ai.telemetry.functionId": "x"}
    assert agent_from_span("ai.generateText.doGenerate", step) is None
    assert tool_call_from_span("ai.generateText.doGenerate", step) is None


def test_may_be_model_span_tests_exactly_the_model_span_keys() -> None:
    """The hand-written lookups of ``may_be_model_span`` (the hot path) and the tuple serve's
    protobuf gate is built from say the same: a key added to one only would let serve drop, or
    the processor skip, a model span the other reads."""
    for key in conventions.MODEL_SPAN_KEYS:
        assert conventions.may_be_model_span({key: 1}), key
    assert not conventions.may_be_model_span({"gen_ai.request.model": "gpt-4o"})
    assert not conventions.may_be_model_span({"gen_ai.usage.cost.amount": 0.1})
    # The keys the usage reader takes a call's tokens from open the gate, but the older
    # gen_ai.usage.completion_tokens: instrumentations send it only beside prompt_tokens, and a
    # span with completion tokens alone is not read as a model call (by either path).
    readers = {"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"}
    readers |= {"gen_ai.usage.prompt_tokens"}
    readers |= {"llm.token_count.prompt", "llm.token_count.completion"}
    assert readers == set(conventions.MODEL_SPAN_KEYS)
    alone = {"gen_ai.usage.completion_tokens": 5}
    assert not conventions.may_be_model_span(alone)
    assert conventions.model_call_from_span("chat", alone) is None
