"""Capture Semantic Kernel's own OTel diagnostics for the scripted loop sequence (offline).

Run: .venv/bin/python capture.py  -> for MODE in default, diag, sensitive:
  spans_<MODE>.jsonl, spans_<MODE>_blocked.jsonl, logs_<MODE>*.jsonl (SK's gen_ai log records)
(spans.jsonl / spans_blocked.jsonl = the sensitive mode copies). The settings are read at import,
so each mode runs in its own subprocess. Pre-tool hook: an AUTO_FUNCTION_INVOCATION filter.
"""
import asyncio, json, logging, os, shutil, subprocess, sys
from collections import Counter

ENV = {"default": {}, "diag": {"SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS": "true"},
       "sensitive": {"SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS_SENSITIVE": "true"}}
if len(sys.argv) == 1:  # driver
    for mode, extra in ENV.items():
        for blocked in ("", "_blocked"):
            env = {k: v for k, v in os.environ.items() if not k.startswith("SEMANTIC")} | extra
            subprocess.run([sys.executable, __file__, mode, blocked], env=env, check=True)
    shutil.copy("spans_sensitive.jsonl", "spans.jsonl")
    shutil.copy("spans_sensitive_blocked.jsonl", "spans_blocked.jsonl")
    sys.exit(0)
MODE, BLOCKED = sys.argv[1], sys.argv[2] == "_blocked"

assert "OTEL_SDK_DISABLED" not in os.environ
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider


class Recorder(SpanProcessor):
    def __init__(self):
        self.rows, self.starts = [], {}

    def on_start(self, span, parent_context=None):
        self.starts[span.context.span_id] = (span.name, json.loads(json.dumps(dict(span.attributes or {}), default=str)))

    def on_end(self, span):
        name0, attrs0 = self.starts.pop(span.context.span_id, (None, None))
        c, p = span.context, span.parent
        self.rows.append({
            "name": span.name, "kind": span.kind.name, "trace_id": f"{c.trace_id:032x}", "span_id": f"{c.span_id:016x}",
            "parent_span_id": f"{p.span_id:016x}" if p else None, "scope": span.instrumentation_scope.name,
            "start_time_ns": span.start_time, "end_time_ns": span.end_time, "attributes": dict(span.attributes or {}),
            "events": [{"name": e.name, "timestamp_ns": e.timestamp, "attributes": dict(e.attributes or {})} for e in span.events],
            "status": {"code": span.status.status_code.name, "description": span.status.description},
            "name_at_start": name0, "attributes_at_start": attrs0})


class LogRec(logging.Handler):  # SK writes chat content as log records (gen_ai.event.name), not span events
    rows = []

    def emit(self, r):
        sc = trace.get_current_span().get_span_context()
        self.rows.append({"logger": r.name, "event_name": getattr(r, "event.name", None), "msg": r.getMessage(),
                          "current_span_id": f"{sc.span_id:016x}" if sc.is_valid else None})


REC = Recorder()
provider = TracerProvider()
provider.add_span_processor(REC)
trace.set_tracer_provider(provider)
logging.getLogger("semantic_kernel.utils.telemetry").addHandler(LogRec())
logging.getLogger("semantic_kernel.utils.telemetry").setLevel(logging.INFO)

from semantic_kernel.agents import ChatCompletionAgent
from semantic_kernel.connectors.ai import FunctionChoiceBehavior, PromptExecutionSettings
from semantic_kernel.connectors.ai.chat_completion_client_base import ChatCompletionClientBase
from semantic_kernel.contents import AuthorRole, ChatMessageContent, FunctionCallContent, TextContent
from semantic_kernel.filters import AutoFunctionInvocationContext, FilterTypes
from semantic_kernel.functions import FunctionResult, KernelArguments, kernel_function
from semantic_kernel.utils.telemetry.model_diagnostics.decorators import trace_chat_completion

SEQ = [("search", {"query": "weather in Paris"})] * 6 + [("get_weather", {"city": "Paris", "unit": "C"}),
                                                        ("search", {"query": "weather in Paris"})]


class ScriptedChat(ChatCompletionClientBase):
    """Fake model: returns the next scripted turn; decorated like SK's own OpenAI connector."""
    SUPPORTS_FUNCTION_CALLING = True
    turn: int = 0

    @trace_chat_completion("scripted")
    async def _inner_get_chat_message_contents(self, chat_history, settings):
        i = self.turn
        self.turn += 1
        if i < len(SEQ):
            name, args = SEQ[i]
            items = [FunctionCallContent(id=f"call_{i}", name=f"tools-{name}", arguments=json.dumps(args))]
            return [ChatMessageContent(role=AuthorRole.ASSISTANT, items=items, finish_reason="tool_calls")]
        return [ChatMessageContent(role=AuthorRole.ASSISTANT, content="It is 18 C and cloudy in Paris.", finish_reason="stop")]


class Tools:
    @kernel_function(description="Search the web.")
    def search(self, query: str) -> str:
        return f"results for '{query}': nothing useful"

    @kernel_function(description="Get the weather for a city.")
    def get_weather(self, city: str, unit: str = "C") -> str:
        return f"{city}: 18 {unit}, cloudy"


SEEN = Counter()


async def loop_guard(context: AutoFunctionInvocationContext, next):
    """Pre-tool hook: sees the model's FunctionCallContent (incl. its id) before the function runs."""
    fc = context.function_call_content
    key = (context.function.fully_qualified_name, json.dumps(dict(context.arguments or {}), sort_keys=True, default=str))
    SEEN[key] += 1
    if SEEN[key] >= 3:
        context.function_result = FunctionResult(
            function=context.function.metadata,
            value=f"BLOCKED by loop guard: {fc.name} called {SEEN[key]} times with the same arguments (call id {fc.id})")
        return  # not calling next(context) => the function never runs
    await next(context)


async def main():
    settings = PromptExecutionSettings(function_choice_behavior=FunctionChoiceBehavior.Auto(maximum_auto_invoke_attempts=20))
    agent = ChatCompletionAgent(service=ScriptedChat(ai_model_id="scripted-loop"), name="weather_agent",
                                description="Answers weather questions.",
                                arguments=KernelArguments(settings=settings))
    agent.kernel.add_plugin(Tools(), plugin_name="tools")
    if BLOCKED:
        agent.kernel.add_filter(FilterTypes.AUTO_FUNCTION_INVOCATION, loop_guard)
    resp = await agent.get_response(messages="What's the weather in Paris?")
    print(MODE, BLOCKED, "->", resp.message.content)
    for m in resp.thread._chat_history.messages:
        print("  ", m.role.value, [str(getattr(i, "result", getattr(i, "text", i)))[:90] for i in m.items])


asyncio.run(main())
provider.force_flush()
suffix = f"{MODE}{'_blocked' if BLOCKED else ''}"
with open(f"spans_{suffix}.jsonl", "w") as f:
    f.writelines(json.dumps(r, default=str) + "\n" for r in REC.rows)
with open(f"logs_{suffix}.jsonl", "w") as f:
    f.writelines(json.dumps(r, default=str) + "\n" for r in LogRec.rows)
