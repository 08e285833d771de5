"""The tables: how each instrumentation marks a tool span or an agent span, as data.

A :class:`ToolConvention` (or :class:`AgentConvention`) says how to recognise one
instrumentation's span (its :class:`Condition` list, whose first condition is the entry's cheap
*gate*) and which attributes or events carry the tool name, arguments, result and call id, plus
the shape (:mod:`._decoders`) that unwraps that instrumentation's encoding. Adding an
instrumentation is one table entry and one test. The first entry whose conditions all hold
wins, so specific entries come before the generic GenAI semantic-conventions ones.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from ._decoders import (
    ArgumentsShape,
    ResultShape,
    _event_name,
    _Events,
    adk_result,
    json_arguments,
    langchain_message_result,
    openinference_arguments,
    openinference_result,
    openllmetry_envelope_arguments,
    openllmetry_tool_result,
    text_result,
)
from ._keys import (
    ADK_EVENT_ID,
    ADK_MERGED_TOOLS,
    ADK_TOOL_CALL_ARGS,
    ADK_TOOL_RESPONSE,
    AUTOGEN_SYSTEM,
    CREWAI_AGENT_MARKERS,
    CREWAI_AGENT_ROLE,
    CREWAI_TOOL_AGENT_ROLE,
    DSPY_FINISH_TOOL,
    DSPY_TOOL_SUFFIXES,
    EXECUTE_TOOL_SPAN_PREFIX,
    GEN_AI_AGENT_ID,
    GEN_AI_AGENT_NAME,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_SYSTEM,
    GEN_AI_TOOL_CALL_ARGUMENTS,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_CALL_RESULT,
    GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE,
    HAYSTACK_AGENT_SPAN,
    HAYSTACK_TOOL_ERROR,
    HAYSTACK_TOOL_INPUT,
    HAYSTACK_TOOL_NAME,
    HAYSTACK_TOOL_OUTPUT,
    HAYSTACK_TOOL_SPAN,
    INVOKE_AGENT_SPAN_PREFIX,
    LOGFIRE_MSG,
    MCP_METHOD_NAME,
    OPENINFERENCE_AGENT_NAME,
    OPENINFERENCE_GRAPH_NODE_ID,
    OPENINFERENCE_INPUT_VALUE,
    OPENINFERENCE_OUTPUT_VALUE,
    OPENINFERENCE_SPAN_KIND,
    OPENINFERENCE_TOOL_CALL_ID,
    OPENINFERENCE_TOOL_NAME,
    OPENLIT_TOOL_ARGS,
    OPERATION_EXECUTE_TOOL,
    OPERATION_INVOKE_AGENT,
    PYDANTIC_AI_LEGACY_AGENT_NAME,
    PYDANTIC_AI_LEGACY_AGENT_SPAN,
    PYDANTIC_AI_LEGACY_ARGUMENTS,
    PYDANTIC_AI_LEGACY_RESULT,
    PYDANTIC_AI_LEGACY_TOOL_SPAN,
    SMOLAGENTS_AGENT_MARKERS,
    SMOLAGENTS_RUN_SUFFIX,
    STRANDS_CHOICE_EVENT,
    STRANDS_PROVIDER,
    STRANDS_TOOL_MESSAGE_EVENT,
    TRACELOOP_ENTITY_INPUT,
    TRACELOOP_ENTITY_NAME,
    TRACELOOP_ENTITY_OUTPUT,
    TRACELOOP_SPAN_KIND,
    TRACELOOP_WORKFLOW_NAME,
    VERCEL_AI_FUNCTION_ID,
    VERCEL_AI_OPERATION_ID,
    VERCEL_AI_RUNS,
    VERCEL_AI_TOOL_ARGS,
    VERCEL_AI_TOOL_CALL,
    VERCEL_AI_TOOL_CALL_ID,
    VERCEL_AI_TOOL_NAME,
    VERCEL_AI_TOOL_RESULT,
)

# --------------------------------------------------------------------------------------------
# The vocabulary: conditions and entries
# --------------------------------------------------------------------------------------------


class On(enum.Enum):
    """What a :class:`Condition` looks at."""

    ATTRIBUTE = "attribute"
    SPAN_NAME = "span_name"
    SPAN_NAME_PREFIX = "span_name_prefix"
    EVENT = "event"


# Module-level aliases: reading an enum member through its class costs ~0.07 us in 3.11.
_ON_ATTRIBUTE: Final = On.ATTRIBUTE
_ON_SPAN_NAME: Final = On.SPAN_NAME
_ON_SPAN_NAME_PREFIX: Final = On.SPAN_NAME_PREFIX


@dataclass(frozen=True, slots=True)
class Condition:
    """One test a span must pass for a convention to apply.

    * ``On.ATTRIBUTE``: one of ``keys`` is present; with ``values``, its value is one of them.
    * ``On.SPAN_NAME``: the span name is one of ``keys``.
    * ``On.SPAN_NAME_PREFIX``: the span name starts with one of ``keys``.
    * ``On.EVENT``: the span has an event named one of ``keys`` (only known at span end).

    The first condition of every entry is its *gate* and must be cheap (an attribute with
    ``values``, a span name or a span-name prefix): gates are indexed when the tables are
    compiled, so a span that passes no gate costs a few lookups.
    """

    on: On
    keys: tuple[str, ...]
    values: frozenset[str] | None = None

    def holds(self, name: str, attributes: Mapping[str, object], events: _Events) -> bool:
        """Whether the span passes this condition; never raises."""
        on = self.on
        if on is _ON_ATTRIBUTE:
            values = self.values
            for key in self.keys:
                value = attributes.get(key)
                if value is None:
                    continue
                if values is None or (isinstance(value, str) and value in values):
                    return True
            return False
        if on is _ON_SPAN_NAME:
            return name in self.keys
        if on is _ON_SPAN_NAME_PREFIX:
            return name.startswith(self.keys)
        keys = self.keys
        for event in events:
            if _event_name(event) in keys:
                return True
        return False


def attribute_is(key: str, *values: str) -> Condition:
    """The attribute ``key`` equals one of ``values``."""
    return Condition(On.ATTRIBUTE, (key,), frozenset(values))


def attribute_present(*keys: str) -> Condition:
    """At least one of ``keys`` is present."""
    return Condition(On.ATTRIBUTE, keys)


def span_name_is(*names: str) -> Condition:
    """The span name is one of ``names``."""
    return Condition(On.SPAN_NAME, names)


def span_name_starts(*prefixes: str) -> Condition:
    """The span name starts with one of ``prefixes``."""
    return Condition(On.SPAN_NAME_PREFIX, prefixes)


def has_event(*names: str) -> Condition:
    """The span has an event with one of ``names``."""
    return Condition(On.EVENT, names)


def _after_prefix(prefix: str) -> Callable[[str], str | None]:
    def tool_from_name(name: str) -> str | None:
        return (name[len(prefix) :] or None) if name.startswith(prefix) else None

    return tool_from_name


def _before_suffix(suffix: str) -> Callable[[str], str | None]:
    def tool_from_name(name: str) -> str | None:
        return (name[: -len(suffix)] or None) if name.endswith(suffix) else None

    return tool_from_name


def _whole_name(name: str) -> str | None:
    return name or None


def _without_suffix(suffix: str) -> Callable[[str], str | None]:
    def name_from_span_name(name: str) -> str | None:
        return (name[: -len(suffix)] if name.endswith(suffix) else name) or None

    return name_from_span_name


def _no_name(name: str) -> str | None:
    return None


_execute_tool_suffix: Final = _after_prefix(EXECUTE_TOOL_SPAN_PREFIX)


def _openinference_tool_name(name: str) -> str | None:
    """The tool of an OpenInference tool span without ``tool.name``: its name, less DSPy's
    method suffix; ``None`` for DSPy's ``finish`` (read only where ``tool.name`` is absent, so
    another framework's tool named ``finish`` is tracked)."""
    for suffix in DSPY_TOOL_SUFFIXES:
        if name.endswith(suffix):
            tool = name[: -len(suffix)]
            return None if tool == DSPY_FINISH_TOOL else (tool or None)
    return name or None


@dataclass(frozen=True, slots=True)
class ToolConvention:
    """How one instrumentation marks a tool call.

    Keys are tried in order; the first present one wins. ``argument_event`` and
    ``result_event`` are ``(event name, attribute key)`` pairs read when no attribute key is
    present (Strands' default semconv). ``tool_from_span_name`` derives the tool name from the
    span name when no ``tool_keys`` attribute is present. ``error_keys``: boolean attributes
    that say whether the call failed (Haystack's ``haystack.tool.error``), beside the span
    status and the generic error attributes every entry reads.

    An entry whose instrumentation publishes no arguments (or only behind a setting) still
    recognises the span: its call then has :data:`MISSING` arguments, and the caller decides
    (``Policy.count_calls_without_arguments``).
    """

    name: str
    when: tuple[Condition, ...]
    tool_keys: tuple[str, ...] = (GEN_AI_TOOL_NAME,)
    tool_from_span_name: Callable[[str], str | None] = _execute_tool_suffix
    argument_keys: tuple[str, ...] = (GEN_AI_TOOL_CALL_ARGUMENTS,)
    argument_event: tuple[str, str] | None = None
    arguments_shape: ArgumentsShape = json_arguments
    result_keys: tuple[str, ...] = (GEN_AI_TOOL_CALL_RESULT,)
    result_event: tuple[str, str] | None = None
    result_shape: ResultShape = text_result
    call_id_keys: tuple[str, ...] = (GEN_AI_TOOL_CALL_ID,)
    agent_id_keys: tuple[str, ...] = (GEN_AI_AGENT_ID,)
    agent_name_keys: tuple[str, ...] = (GEN_AI_AGENT_NAME,)
    error_keys: tuple[str, ...] = ()
    skip_tools: frozenset[str] = field(default_factory=frozenset)
    """Tool names that mark an aggregate span rather than one call (ADK "(merged tools)")."""
    start_names: tuple[str, ...] = ()
    """Span names, or name prefixes, under which the instrumentation *starts* this entry's tool
    spans with the arguments already set, so that they are decided at start. Empty: decided at
    their end. :data:`ARGUMENTS_AT_START_CONVENTIONS` and the span processor's start gate
    (:data:`otel_loopguard._spans.START_NAME_PREFIXES`) are derived from these."""


@dataclass(frozen=True, slots=True)
class AgentConvention:
    """How one instrumentation marks an agent-run span."""

    name: str
    when: tuple[Condition, ...]
    id_keys: tuple[str, ...] = (GEN_AI_AGENT_ID,)
    name_keys: tuple[str, ...] = (GEN_AI_AGENT_NAME,)
    name_from_span_name: Callable[[str], str | None] = _after_prefix(INVOKE_AGENT_SPAN_PREFIX)
    start_names: tuple[str, ...] = ()
    """Span names, or name prefixes, under which this entry's agent runs start with what marks
    them (so that, keyed by conversation, the span processor starts a new run there). Empty: a
    run is only seen when a tool span below it ends (a span named after the agent). The start
    gate (:data:`otel_loopguard._spans.START_NAME_PREFIXES`) is derived from these."""


# --------------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------------

_ADK_TOOL_CLASSES: Final = frozenset(
    {
        # gen_ai.tool.type is the Python class name in Google ADK, not function/extension/...
        "AgentTool",
        "APIHubTool",
        "AuthenticatedFunctionTool",
        "BaseTool",
        "CrewaiTool",
        "FunctionTool",
        "LangchainTool",
        "LongRunningFunctionTool",
        "MCPTool",
        "McpTool",
        "RestApiTool",
        "TransferToAgentTool",
    }
)

_EXECUTE_TOOL: Final = attribute_is(GEN_AI_OPERATION_NAME, OPERATION_EXECUTE_TOOL)

TOOL_CONVENTIONS: Final[tuple[ToolConvention, ...]] = (
    # Pydantic AI instrumentation version 2: arguments already at span start.
    ToolConvention(
        name="pydantic_ai_legacy",
        when=(span_name_is(PYDANTIC_AI_LEGACY_TOOL_SPAN),),
        tool_from_span_name=_no_name,
        start_names=(PYDANTIC_AI_LEGACY_TOOL_SPAN,),
        argument_keys=(PYDANTIC_AI_LEGACY_ARGUMENTS,),
        result_keys=(PYDANTIC_AI_LEGACY_RESULT,),
    ),
    # CrewAI's own tracing (a private TracerProvider) with gen_ai.* keys.
    ToolConvention(
        name="crewai",
        when=(span_name_is("call tool"),),
        tool_from_span_name=_no_name,
    ),
    # OpenLLMetry's LangChain instrumentation: gen_ai.tool.call.arguments is an envelope.
    ToolConvention(
        name="openllmetry_langchain",
        when=(attribute_is(TRACELOOP_SPAN_KIND, "tool"), _EXECUTE_TOOL),
        tool_keys=(GEN_AI_TOOL_NAME, TRACELOOP_ENTITY_NAME),
        argument_keys=(GEN_AI_TOOL_CALL_ARGUMENTS, TRACELOOP_ENTITY_INPUT),
        arguments_shape=openllmetry_envelope_arguments,
        result_keys=(GEN_AI_TOOL_CALL_RESULT, TRACELOOP_ENTITY_OUTPUT),
        result_shape=langchain_message_result,
    ),
    # OpenLLMetry's @tool decorator: span "<name>.tool", {"args": [...], "kwargs": {...}}; its
    # MCP instrumentation's client spans: "<tool>.tool", {"tool_name", "arguments"} and
    # {"result", "is_error"}.
    ToolConvention(
        name="openllmetry_tool",
        when=(attribute_is(TRACELOOP_SPAN_KIND, "tool"),),
        tool_keys=(GEN_AI_TOOL_NAME, TRACELOOP_ENTITY_NAME),
        tool_from_span_name=_before_suffix(".tool"),
        argument_keys=(TRACELOOP_ENTITY_INPUT, GEN_AI_TOOL_CALL_ARGUMENTS),
        arguments_shape=openllmetry_envelope_arguments,
        result_keys=(TRACELOOP_ENTITY_OUTPUT, GEN_AI_TOOL_CALL_RESULT),
        result_shape=openllmetry_tool_result,
    ),
    # OpenInference (LangChain/LangGraph, OpenAI Agents SDK, smolagents, LlamaIndex, Agno,
    # CrewAI, DSPy): span named after the tool (LlamaIndex: "FunctionTool.acall"; smolagents:
    # the tool's class), tool.name on it, except DSPy's ("<tool>.__call__", no tool.name; its
    # ReAct's own "finish" is not a call). smolagents, LlamaIndex and DSPy wrap the arguments in
    # the bound call ({"args", "kwargs"}), LlamaIndex the result in a ToolOutput (with is_error).
    ToolConvention(
        name="openinference",
        when=(attribute_is(OPENINFERENCE_SPAN_KIND, "TOOL"),),
        tool_keys=(OPENINFERENCE_TOOL_NAME, GEN_AI_TOOL_NAME),
        tool_from_span_name=_openinference_tool_name,
        argument_keys=(OPENINFERENCE_INPUT_VALUE,),
        arguments_shape=openinference_arguments,
        result_keys=(OPENINFERENCE_OUTPUT_VALUE,),
        result_shape=openinference_result,
        call_id_keys=(OPENINFERENCE_TOOL_CALL_ID, GEN_AI_TOOL_CALL_ID),
        agent_name_keys=(GEN_AI_AGENT_NAME, CREWAI_TOOL_AGENT_ROLE),
    ),
    # The Vercel AI SDK (TypeScript): "ai.toolCall" spans, arguments and result as JSON text;
    # the call id is the model's. No agent on the span: the enclosing ai.generateText or
    # ai.streamText span is the agent (see AGENT_CONVENTIONS).
    ToolConvention(
        name="vercel_ai",
        when=(attribute_is(VERCEL_AI_OPERATION_ID, VERCEL_AI_TOOL_CALL),),
        tool_keys=(VERCEL_AI_TOOL_NAME,),
        tool_from_span_name=_no_name,
        argument_keys=(VERCEL_AI_TOOL_ARGS,),
        result_keys=(VERCEL_AI_TOOL_RESULT,),
        call_id_keys=(VERCEL_AI_TOOL_CALL_ID,),
        agent_id_keys=(),
        agent_name_keys=(),
    ),
    # Haystack's own tracing: one constant span name; arguments and output only with
    # HAYSTACK_CONTENT_TRACING_ENABLED=true; a failure is haystack.tool.error (status unset).
    ToolConvention(
        name="haystack",
        when=(span_name_is(HAYSTACK_TOOL_SPAN),),
        tool_keys=(HAYSTACK_TOOL_NAME,),
        tool_from_span_name=_no_name,
        argument_keys=(HAYSTACK_TOOL_INPUT,),
        result_keys=(HAYSTACK_TOOL_OUTPUT,),
        call_id_keys=(),
        agent_id_keys=(),
        agent_name_keys=(),
        error_keys=(HAYSTACK_TOOL_ERROR,),
    ),
    # Strands default: arguments and result in span events.
    ToolConvention(
        name="strands_event",
        when=(_EXECUTE_TOOL, has_event(STRANDS_TOOL_MESSAGE_EVENT)),
        argument_event=(STRANDS_TOOL_MESSAGE_EVENT, "content"),
        result_event=(STRANDS_CHOICE_EVENT, "message"),
    ),
    # Strands with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental.
    ToolConvention(
        name="strands",
        when=(
            _EXECUTE_TOOL,
            Condition(
                On.ATTRIBUTE, (GEN_AI_PROVIDER_NAME, GEN_AI_SYSTEM), frozenset({STRANDS_PROVIDER})
            ),
        ),
    ),
    # Google ADK, legacy gcp.vertex.agent.* schema (also still set next to gen_ai.* keys).
    ToolConvention(
        name="google_adk",
        when=(
            _EXECUTE_TOOL,
            attribute_present(ADK_TOOL_CALL_ARGS, ADK_TOOL_RESPONSE, ADK_EVENT_ID),
        ),
        argument_keys=(GEN_AI_TOOL_CALL_ARGUMENTS, ADK_TOOL_CALL_ARGS),
        result_keys=(GEN_AI_TOOL_CALL_RESULT, ADK_TOOL_RESPONSE),
        result_shape=adk_result,
        skip_tools=frozenset({ADK_MERGED_TOOLS}),
    ),
    # Google ADK 2.x with only gen_ai.* keys: recognised by its class-name tool type.
    ToolConvention(
        name="google_adk",
        when=(_EXECUTE_TOOL, Condition(On.ATTRIBUTE, (GEN_AI_TOOL_TYPE,), _ADK_TOOL_CLASSES)),
        argument_keys=(GEN_AI_TOOL_CALL_ARGUMENTS, ADK_TOOL_CALL_ARGS),
        result_keys=(GEN_AI_TOOL_CALL_RESULT, ADK_TOOL_RESPONSE),
        result_shape=adk_result,
        skip_tools=frozenset({ADK_MERGED_TOOLS}),
    ),
    # Pydantic AI (instrumentation version 3+): plain GenAI semconv, arguments at start.
    ToolConvention(
        name="pydantic_ai",
        when=(_EXECUTE_TOOL, attribute_present(LOGFIRE_MSG)),
        start_names=(EXECUTE_TOOL_SPAN_PREFIX,),
    ),
    # Older OpenLIT releases wrote gen_ai.tool.args; current ones are plain "genai".
    ToolConvention(
        name="openlit",
        when=(_EXECUTE_TOOL, attribute_present(OPENLIT_TOOL_ARGS)),
        argument_keys=(GEN_AI_TOOL_CALL_ARGUMENTS, OPENLIT_TOOL_ARGS),
    ),
    # The MCP Python SDK's own server spans ("tools/call <tool>", 2.x): tool name and error
    # (error.type) only; no arguments, no result, no call id (jsonrpc.request.id is the wire id,
    # reused by every client session: no tool-call id).
    ToolConvention(name="mcp", when=(_EXECUTE_TOOL, attribute_present(MCP_METHOD_NAME))),
    # AutoGen (autogen-core's trace_tool_span): tool name and call id; the arguments and the
    # result are only in its autogen_core.events log records, never on a span.
    ToolConvention(
        name="autogen",
        when=(
            _EXECUTE_TOOL,
            Condition(
                On.ATTRIBUTE, (GEN_AI_PROVIDER_NAME, GEN_AI_SYSTEM), frozenset({AUTOGEN_SYSTEM})
            ),
        ),
    ),
    # GenAI semantic conventions: util-genai, OpenLIT, ADK 2.x, Semantic Kernel (arguments and
    # result only with its sensitive-data setting; tools named "<plugin>-<function>"), anything
    # conformant.
    ToolConvention(name="genai", when=(_EXECUTE_TOOL,)),
    # A conformant span name before its attributes arrive (ADK sets them at the end).
    ToolConvention(name="genai", when=(span_name_starts(EXECUTE_TOOL_SPAN_PREFIX),)),
)
"""Tool-span conventions, most specific first; the first entry whose conditions hold wins."""

#: Conventions whose tool spans are decided at their start: those whose entries declare
#: ``start_names`` (the instrumentation starts them with the arguments already set, under a name
#: the span processor's start gate, :data:`otel_loopguard._spans.START_NAME_PREFIXES`, looks at):
#: Pydantic AI. Others that also start tool spans with the arguments (OpenInference for Agno,
#: smolagents, CrewAI's event listener) name them after the tool, so they are decided at their
#: end, wherever they are read. A recording that does not say what a span carried at start
#: (OTLP) can only have been decided at start for these. A test checks it against every fixture
#: dump with :func:`arguments_available_at_start`.
ARGUMENTS_AT_START_CONVENTIONS: Final = frozenset(
    entry.name for entry in TOOL_CONVENTIONS if entry.start_names
)


AGENT_CONVENTIONS: Final[tuple[AgentConvention, ...]] = (
    # GenAI semconv (Pydantic AI incl. legacy "agent run", Strands, ADK, OpenLLMetry LangGraph).
    # CrewAI's own tracing: a GenAI agent span whose gen_ai.agent.name is the agent's key (a
    # hash, which a metric label refuses); the role names the agent, as CrewAI's hooks do.
    AgentConvention(
        name="crewai",
        when=(
            attribute_is(GEN_AI_OPERATION_NAME, OPERATION_INVOKE_AGENT),
            attribute_present(CREWAI_AGENT_ROLE),
        ),
        name_keys=(CREWAI_AGENT_ROLE, GEN_AI_AGENT_NAME),
    ),
    AgentConvention(
        name="genai",
        when=(attribute_is(GEN_AI_OPERATION_NAME, OPERATION_INVOKE_AGENT),),
        name_keys=(GEN_AI_AGENT_NAME, PYDANTIC_AI_LEGACY_AGENT_NAME),
        start_names=(INVOKE_AGENT_SPAN_PREFIX, PYDANTIC_AI_LEGACY_AGENT_SPAN),
    ),
    # CrewAI under OpenInference: the agent span ("<role>._execute_core", or
    # "<role>.<task>.execute" with the event listener) has the role as graph.node.id.
    AgentConvention(
        name="openinference_crewai",
        when=(
            attribute_is(OPENINFERENCE_SPAN_KIND, "AGENT"),
            attribute_present(*CREWAI_AGENT_MARKERS),
        ),
        id_keys=(),
        name_keys=(OPENINFERENCE_GRAPH_NODE_ID, OPENINFERENCE_AGENT_NAME),
        name_from_span_name=_whole_name,
    ),
    # smolagents under OpenInference: the agent span is "<agent name>.run", no name attribute.
    AgentConvention(
        name="openinference_smolagents",
        when=(
            attribute_is(OPENINFERENCE_SPAN_KIND, "AGENT"),
            attribute_present(*SMOLAGENTS_AGENT_MARKERS),
        ),
        id_keys=(),
        name_keys=(OPENINFERENCE_AGENT_NAME,),
        name_from_span_name=_without_suffix(SMOLAGENTS_RUN_SUFFIX),
    ),
    # OpenInference AGENT spans are named after the agent (LangGraph graph, Agents SDK agent);
    # Agno's carry agent.name.
    AgentConvention(
        name="openinference",
        when=(attribute_is(OPENINFERENCE_SPAN_KIND, "AGENT"),),
        id_keys=("agent.id", GEN_AI_AGENT_ID),
        name_keys=(OPENINFERENCE_AGENT_NAME, GEN_AI_AGENT_NAME),
        name_from_span_name=_whole_name,
    ),
    # OpenLLMetry @agent and @workflow spans ("<name>.agent", "<name>.workflow").
    AgentConvention(
        name="openllmetry",
        when=(attribute_is(TRACELOOP_SPAN_KIND, "agent", "workflow"),),
        name_keys=(GEN_AI_AGENT_NAME, TRACELOOP_ENTITY_NAME, TRACELOOP_WORKFLOW_NAME),
        name_from_span_name=_no_name,
    ),
    # The Vercel AI SDK: a generateText / streamText call (its tool loop) is the agent run,
    # named by the call's telemetry functionId when it has one.
    AgentConvention(
        name="vercel_ai",
        when=(attribute_is(VERCEL_AI_OPERATION_ID, *VERCEL_AI_RUNS),),
        id_keys=(),
        name_keys=(VERCEL_AI_FUNCTION_ID,),
        name_from_span_name=_no_name,
    ),
    # Haystack's Agent run: the agent has no name of its own (its pipeline component's name is
    # on the parent span), so the run is keyed by its span alone.
    AgentConvention(
        name="haystack",
        when=(span_name_is(HAYSTACK_AGENT_SPAN),),
        id_keys=(),
        name_keys=(),
        name_from_span_name=_no_name,
    ),
)
"""Agent-span conventions; the first entry whose conditions hold wins."""
