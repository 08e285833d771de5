"""Capture AutoGen AgentChat's own OTel spans for the scripted loop sequence (offline).

Run: .venv/bin/python capture.py   -> spans.jsonl, spans_blocked.jsonl, events*.jsonl
Pre-tool hook used for the blocked run: a StaticWorkbench subclass overriding call_tool
(AgentChat has no dedicated before-tool callback; the workbench is the seam that sees
name, arguments and call_id before the tool runs).
"""
import asyncio, json, logging, os, sys
from collections import Counter

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

    def dump(self, path):
        with open(path, "w") as f:
            for r in self.rows:
                f.write(json.dumps(r, default=str) + "\n")
        self.rows = []


REC = Recorder()
provider = TracerProvider()
provider.add_span_processor(REC)
trace.set_tracer_provider(provider)


class EventLog(logging.Handler):
    """autogen_core.events records (ToolCallEvent carries the arguments), with the span current at emit time."""
    rows = []

    def emit(self, record):
        sc = trace.get_current_span().get_span_context()
        msg = record.msg
        if isinstance(msg, str):  # skip plain-text chatter ("Token count has been done ...")
            return
        self.rows.append({"logger": record.name, "type": type(msg).__name__,
                          "kwargs": getattr(msg, "kwargs", None) or str(msg),
                          "current_span_id": f"{sc.span_id:016x}" if sc.is_valid else None,
                          "time_ns": int(record.created * 1e9)})


from autogen_core import EVENT_LOGGER_NAME, CancellationToken, FunctionCall
from autogen_core.models import CreateResult, RequestUsage
from autogen_core.tools import FunctionTool, StaticWorkbench, ToolResult, TextResultContent
from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.replay import ReplayChatCompletionClient

ev = EventLog()
logging.getLogger(EVENT_LOGGER_NAME).addHandler(ev)
logging.getLogger(EVENT_LOGGER_NAME).setLevel(logging.INFO)


async def search(query: str) -> str:
    """Search the web."""
    return f"results for '{query}': nothing useful"


async def get_weather(city: str, unit: str = "C") -> str:
    """Get the weather for a city."""
    return f"{city}: 18 {unit}, cloudy"


SEQ = [("search", {"query": "weather in Paris"})] * 6 + [("get_weather", {"city": "Paris", "unit": "C"}),
                                                        ("search", {"query": "weather in Paris"})]


def script():
    u = RequestUsage(prompt_tokens=10, completion_tokens=5)
    out = [CreateResult(finish_reason="function_calls", usage=u, cached=False,
                        content=[FunctionCall(id=f"call_{i}", name=n, arguments=json.dumps(a))]) for i, (n, a) in enumerate(SEQ)]
    out.append(CreateResult(finish_reason="stop", usage=u, cached=False, content="It is 18 C and cloudy in Paris."))
    return out


class LoopGuardWorkbench(StaticWorkbench):
    """Pre-tool hook: blocks the 3rd and later identical (name, args) call before the tool runs."""

    def __init__(self, tools):
        super().__init__(tools)
        self.seen = Counter()

    async def call_tool(self, name, arguments=None, cancellation_token=None, call_id=None):
        key = (name, json.dumps(arguments or {}, sort_keys=True))
        self.seen[key] += 1
        if self.seen[key] >= 3:
            msg = f"BLOCKED by loop guard: {name} called {self.seen[key]} times with the same arguments (call_id={call_id})"
            return ToolResult(name=name, result=[TextResultContent(content=msg)], is_error=True)
        return await super().call_tool(name, arguments, cancellation_token, call_id)


async def run(blocked: bool):
    tools = [FunctionTool(search, description="Search the web."),
             FunctionTool(get_weather, description="Get the weather for a city.")]
    kw = {"workbench": LoopGuardWorkbench(tools)} if blocked else {"tools": tools}
    model = ReplayChatCompletionClient(script(), model_info={"vision": False, "function_calling": True, "json_output": False,
                                                             "family": "unknown", "structured_output": False})
    agent = AssistantAgent("weather_agent", model_client=model, description="Answers weather questions.",
                           max_tool_iterations=20, **kw)
    res = await agent.run(task="What's the weather in Paris?")
    for m in res.messages:
        print(type(m).__name__, str(getattr(m, "content", ""))[:150])


for blocked, out in ((False, "spans.jsonl"), (True, "spans_blocked.jsonl")):
    asyncio.run(run(blocked))
    provider.force_flush()
    REC.dump(out)
    with open(out.replace("spans", "events"), "w") as f:
        for r in EventLog.rows:
            f.write(json.dumps(r, default=str) + "\n")
    EventLog.rows.clear()
    print("wrote", out)
