"""Attribute keys, event names and marker values the conventions read, each declared once.

The opentelemetry-semantic-conventions package marks its gen_ai constants as moved, so the keys
this project reads are declared here. Nothing here imports from the rest of the package.
"""

from __future__ import annotations

from typing import Final

GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
GEN_AI_TOOL_STATUS: Final = "gen_ai.tool.status"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_SYSTEM: Final = "gen_ai.system"
ERROR_TYPE: Final = "error.type"
SESSION_ID: Final = "session.id"

OPERATION_EXECUTE_TOOL: Final = "execute_tool"
OPERATION_INVOKE_AGENT: Final = "invoke_agent"
EXECUTE_TOOL_SPAN_PREFIX: Final = "execute_tool "
INVOKE_AGENT_SPAN_PREFIX: Final = "invoke_agent "

# Pydantic AI instrumentation version 2 ("running tool" spans).
PYDANTIC_AI_LEGACY_TOOL_SPAN: Final = "running tool"
PYDANTIC_AI_LEGACY_AGENT_SPAN: Final = "agent run"
PYDANTIC_AI_LEGACY_ARGUMENTS: Final = "tool_arguments"
PYDANTIC_AI_LEGACY_RESULT: Final = "tool_response"
PYDANTIC_AI_LEGACY_AGENT_NAME: Final = "agent_name"
LOGFIRE_MSG: Final = "logfire.msg"

# OpenInference.
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OPENINFERENCE_TOOL_NAME: Final = "tool.name"
OPENINFERENCE_TOOL_PARAMETERS: Final = "tool.parameters"
OPENINFERENCE_TOOL_JSON_SCHEMA: Final = "tool.json_schema"
OPENINFERENCE_TOOL_CALL_ID: Final = "tool_call.id"
OPENINFERENCE_INPUT_VALUE: Final = "input.value"
OPENINFERENCE_OUTPUT_VALUE: Final = "output.value"
OPENINFERENCE_METADATA: Final = "metadata"
OPENINFERENCE_AGENT_NAME: Final = "agent.name"
OPENINFERENCE_GRAPH_NODE_ID: Final = "graph.node.id"

# CrewAI under OpenInference (openinference-instrumentation-crewai): the agent span's
# graph.node.id is the agent's role; the event-listener mode puts the role on the tool span too.
CREWAI_TOOL_AGENT_ROLE: Final = "tool.agent_role"
CREWAI_AGENT_MARKERS: Final = ("crew_key", "agent_key")

# smolagents under OpenInference: its agent span ("<name>.run") carries the agent's tool names.
SMOLAGENTS_AGENT_MARKERS: Final = ("smolagents.tools_names", "smolagents.max_steps")
SMOLAGENTS_RUN_SUFFIX: Final = ".run"

# OpenLLMetry (traceloop).
TRACELOOP_SPAN_KIND: Final = "traceloop.span.kind"
TRACELOOP_ENTITY_NAME: Final = "traceloop.entity.name"
TRACELOOP_ENTITY_INPUT: Final = "traceloop.entity.input"
TRACELOOP_ENTITY_OUTPUT: Final = "traceloop.entity.output"
TRACELOOP_WORKFLOW_NAME: Final = "traceloop.workflow.name"
TRACELOOP_TASK_STATUS: Final = "gen_ai.task.status"
TRACELOOP_THREAD_ID: Final = "traceloop.association.properties.thread_id"
TRACELOOP_SESSION_ID: Final = "traceloop.association.properties.session_id"
TRACELOOP_CONVERSATION_ID: Final = "traceloop.association.properties.conversation_id"

# Strands Agents (default semconv: arguments and result travel in span events).
STRANDS_PROVIDER: Final = "strands-agents"
STRANDS_TOOL_MESSAGE_EVENT: Final = "gen_ai.tool.message"
STRANDS_CHOICE_EVENT: Final = "gen_ai.choice"

# Google ADK legacy schema.
ADK_TOOL_CALL_ARGS: Final = "gcp.vertex.agent.tool_call_args"
ADK_TOOL_RESPONSE: Final = "gcp.vertex.agent.tool_response"
ADK_EVENT_ID: Final = "gcp.vertex.agent.event_id"
ADK_SESSION_ID: Final = "gcp.vertex.agent.session_id"
ADK_MERGED_TOOLS: Final = "(merged tools)"

# Haystack's own tracing (haystack-ai 3.x with opentelemetry-haystack): constant span names;
# arguments and output only with HAYSTACK_CONTENT_TRACING_ENABLED=true.
HAYSTACK_TOOL_SPAN: Final = "haystack.agent.step.tool"
HAYSTACK_AGENT_SPAN: Final = "haystack.agent.run"
HAYSTACK_TOOL_NAME: Final = "haystack.tool.name"
HAYSTACK_TOOL_INPUT: Final = "haystack.agent.step.tool.input"
HAYSTACK_TOOL_OUTPUT: Final = "haystack.agent.step.tool.output"
HAYSTACK_TOOL_ERROR: Final = "haystack.tool.error"

# CrewAI's own tracing (crewai.telemetry.tracing): every span of a run carries the run's
# kickoff id (a run's session when no conversation id is set; see _CONVERSATION_ID_KEYS).
CREWAI_EXECUTION_UUID: Final = "crewai.execution_uuid"
#: On its agent spans ("execute agent", gen_ai.operation.name invoke_agent, whose
#: gen_ai.agent.name is the agent's key, a hash): the agent's role.
CREWAI_AGENT_ROLE: Final = "crewai.agent.role"

# OpenInference's DSPy instrumentation: tool spans named "<tool>.__call__" or "<tool>.acall",
# without tool.name; DSPy's ReAct adds a tool of its own to end a trajectory (a final answer).
DSPY_TOOL_SUFFIXES: Final = (".__call__", ".acall")
DSPY_FINISH_TOOL: Final = "finish"

# The Vercel AI SDK (ai 6.x, experimental_telemetry; ai 7 with @ai-sdk/otel's
# LegacyOpenTelemetry): an "ai.toolCall" span per tool call (src/generate-text/
# execute-tool-call.ts: ai.toolCall.name, .id, .args = JSON.stringify(input), .result =
# JSON.stringify(output) on success; a thrown error sets status ERROR and an exception event),
# a child of the "ai.generateText" / "ai.streamText" span of the whole call, whose
# ai.telemetry.functionId names the function (telemetry/assemble-operation-name.ts).
VERCEL_AI_OPERATION_ID: Final = "ai.operationId"
VERCEL_AI_TOOL_CALL: Final = "ai.toolCall"
VERCEL_AI_TOOL_NAME: Final = "ai.toolCall.name"
VERCEL_AI_TOOL_CALL_ID: Final = "ai.toolCall.id"
VERCEL_AI_TOOL_ARGS: Final = "ai.toolCall.args"
VERCEL_AI_TOOL_RESULT: Final = "ai.toolCall.result"
VERCEL_AI_RUNS: Final = ("ai.generateText", "ai.streamText")
VERCEL_AI_FUNCTION_ID: Final = "ai.telemetry.functionId"

# The MCP Python SDK's own server spans ("tools/call <tool>"); they publish no arguments.
MCP_METHOD_NAME: Final = "mcp.method.name"

# AutoGen (autogen-core): execute_tool spans without arguments (they are only in the
# autogen_core.events log records).
AUTOGEN_SYSTEM: Final = "autogen"

# OpenLIT before it adopted gen_ai.tool.call.arguments.
OPENLIT_TOOL_ARGS: Final = "gen_ai.tool.args"

EXCEPTION_EVENT: Final = "exception"

_CALL_ID_PLACEHOLDERS: Final = frozenset({"<not specified>", "N/A"})
"""Values instrumentations write when they have no call id (Google ADK)."""

_ERROR_STATUS_KEYS: Final = (GEN_AI_TOOL_STATUS, TRACELOOP_TASK_STATUS)
_ERROR_STATUS_VALUES: Final = frozenset({"error", "failure", "failed"})
_FLAG_VALUES: Final = {"true": True, "1": True, "false": False, "0": False}
"""Text forms of a boolean flag, lower case (a bool attribute may arrive as text)."""
_SUCCESS_STATUS_VALUES: Final = frozenset({"success", "ok"})

_CONVERSATION_ID_KEYS: Final = (
    GEN_AI_CONVERSATION_ID,
    SESSION_ID,
    TRACELOOP_THREAD_ID,
    TRACELOOP_SESSION_ID,
    TRACELOOP_CONVERSATION_ID,
    ADK_SESSION_ID,
    CREWAI_EXECUTION_UUID,
)
_METADATA_CONVERSATION_KEYS: Final = ("thread_id", "session_id", "conversation_id")

# Model calls' usage (otel_loopguard._conventions._usage). GenAI semantic conventions first, then
# the older names still emitted (OpenLLMetry, Strands before its latest semconv), then
# OpenInference's.
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_USAGE_INPUT_TOKENS: Final = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
GEN_AI_USAGE_OUTPUT_TOKENS: Final = (
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
)
GEN_AI_USAGE_CACHE_READ_TOKENS: Final = (
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_read_input_tokens",
)
GEN_AI_USAGE_CACHE_WRITE_TOKENS: Final = (
    "gen_ai.usage.cache_creation.input_tokens",
    "gen_ai.usage.cache_creation_input_tokens",
    "gen_ai.usage.cache_write_input_tokens",
)
#: The proposed provider-reported cost (open semantic-conventions proposal).
GEN_AI_USAGE_COST_AMOUNT: Final = "gen_ai.usage.cost.amount"
GEN_AI_USAGE_COST_CURRENCY: Final = "gen_ai.usage.cost.currency"
OPENINFERENCE_LLM_KIND: Final = "LLM"
OPENINFERENCE_TOKENS_PROMPT: Final = "llm.token_count.prompt"
OPENINFERENCE_TOKENS_COMPLETION: Final = "llm.token_count.completion"
OPENINFERENCE_TOKENS_CACHE_READ: Final = "llm.token_count.prompt_details.cache_read"
OPENINFERENCE_TOKENS_CACHE_WRITE: Final = "llm.token_count.prompt_details.cache_write"
OPENINFERENCE_MODEL_NAME: Final = "llm.model_name"
OPENINFERENCE_PROVIDER: Final = "llm.provider"
OPENINFERENCE_SYSTEM: Final = "llm.system"
#: Operations whose spans sum their model calls' usage (Strands' invoke_agent span): never read
#: as a model call of their own, or every token would count twice.
USAGE_AGGREGATE_OPERATIONS: Final = frozenset(
    {"invoke_agent", "create_agent", "execute_tool", "invoke_workflow"}
)
#: OpenInference and OpenLLMetry span kinds that sum their children's usage.
USAGE_AGGREGATE_KINDS: Final = frozenset(
    {"AGENT", "CHAIN", "TOOL", "workflow", "task", "agent", "tool"}
)
