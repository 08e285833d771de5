"""Capture the MCP Python SDK's own OpenTelemetry spans (mcp 2.x: client `MCP send tools/call <tool>`
and server `tools/call <tool>` from the default OpenTelemetryMiddleware), client and server in one
process over the in-memory transport. The client plays the scripted model's tool calls.

python capture.py            -> spans.jsonl and spans_blocked.jsonl beside this file
"""
import asyncio, json, sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from mcp import Client
from mcp.client._memory import InMemoryTransport  # JSON-RPC over memory streams, like stdio/HTTP
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent

HERE = Path(__file__).resolve().parent


class Recorder(SpanProcessor):
    """Every finished span as one dict, in end order; what on_start saw is kept too."""

    def __init__(self):
        self.records, self._starts = [], {}

    def on_start(self, span, parent_context=None):
        self._starts[span.context.span_id] = (span.name, dict(span.attributes or {}))

    def on_end(self, span):
        name0, attrs0 = self._starts.pop(span.context.span_id, (None, {}))
        self.records.append({
            "name": span.name, "kind": span.kind.name,
            "trace_id": format(span.context.trace_id, "032x"), "span_id": format(span.context.span_id, "016x"),
            "parent_span_id": format(span.parent.span_id, "016x") if span.parent else None,
            "scope": span.instrumentation_scope.name if span.instrumentation_scope else None,
            "start_time_ns": span.start_time, "end_time_ns": span.end_time,
            "attributes": dict(span.attributes or {}),
            "events": [{"name": e.name, "timestamp_ns": e.timestamp, "attributes": dict(e.attributes or {})}
                       for e in span.events],
            "status": {"code": span.status.status_code.name, "description": span.status.description},
            "name_at_start": name0, "attributes_at_start": attrs0,
        })

    def dump(self, path):
        with open(path, "w") as f:
            for r in self.records:
                f.write(json.dumps(r, default=list) + "\n")
        self.records = []


SCRIPT = [("search", {"query": "weather in Paris"})] * 6 + [
    ("get_weather", {"city": "Paris", "unit": "C"}), ("search", {"query": "weather in Paris"})]


class LoopGuardMiddleware:
    """A ServerMiddleware (the SDK's pre-handler seam): sees method, raw params (tool name + arguments)
    and the JSON-RPC request id -- not the model's tool-call id. A blocked tools/call returns an
    error CallToolResult with the message without calling the tool. It runs INSIDE the built-in
    OpenTelemetryMiddleware, so the blocked call still has a `tools/call <tool>` server span (ERROR,
    error.type=tool_error)."""

    def __init__(self):
        self.seen = {}

    async def __call__(self, ctx, call_next):
        if ctx.method == "tools/call" and ctx.params:
            name, args = ctx.params.get("name"), ctx.params.get("arguments") or {}
            key = f"{name}{json.dumps(args, sort_keys=True)}"
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] >= 3:
                msg = f"BLOCKED by loop guard: {name} called {self.seen[key]}x with identical args; try something else."
                return CallToolResult(content=[TextContent(type="text", text=msg)], is_error=True)
        return await call_next(ctx)


def make_server(middleware):
    server = MCPServer("weather", middleware=middleware)

    @server.tool()
    def search(query: str) -> str:
        """Search the web."""
        return f"results for '{query}': nothing useful"

    @server.tool()
    def get_weather(city: str, unit: str) -> str:
        """Get weather for a city."""
        return f"{city}: sunny, 21{unit}"

    return server


async def run(middleware, recorder, path):
    # Stand-in for the host agent's own span, so the run is one trace (MCP itself has no agent span).
    host = trace.get_tracer("capture-host")
    with host.start_as_current_span("host agent run"):
        async with Client(InMemoryTransport(make_server(middleware))) as client:
            for name, args in SCRIPT:
                result = await client.call_tool(name, args)
                print(name, result.is_error, result.content[0].text, file=sys.stderr)
    recorder.dump(path)


if __name__ == "__main__":
    recorder = Recorder()
    provider = TracerProvider()
    provider.add_span_processor(recorder)
    trace.set_tracer_provider(provider)  # the SDK uses the global provider (tracer "mcp-python-sdk")
    asyncio.run(run([], recorder, HERE / "spans.jsonl"))
    asyncio.run(run([LoopGuardMiddleware()], recorder, HERE / "spans_blocked.jsonl"))
