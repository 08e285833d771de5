"""Capture OpenLLMetry's opentelemetry-instrumentation-mcp spans with the MCP Python SDK 1.x (the
instrumentation does not load on mcp 2.x), over a real stdio transport: this script is the client
(it plays the scripted model's tool calls) and, run as `capture.py server OUT [guard]`, the FastMCP
server subprocess. Both record spans; the client merges them by end time.

python capture.py            -> spans.jsonl and spans_blocked.jsonl beside this file
"""
import asyncio, json, os, sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.instrumentation.mcp import McpInstrumentor

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


def setup():
    recorder, provider = Recorder(), TracerProvider()
    provider.add_span_processor(recorder)
    trace.set_tracer_provider(provider)
    McpInstrumentor().instrument(tracer_provider=provider)  # before mcp is imported (post-import hooks)
    return recorder


def serve(out, guard):
    recorder = setup()
    from mcp.server.fastmcp import FastMCP
    from mcp.server.fastmcp.exceptions import ToolError

    class GuardedFastMCP(FastMCP):
        """mcp 1.x has no middleware: override FastMCP.call_tool (sees name + arguments, no call id).
        Raising ToolError makes the result `isError: true` with the message as text."""
        seen = {}

        async def call_tool(self, name, arguments):
            key = name + json.dumps(arguments, sort_keys=True)
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] >= 3:
                raise ToolError(f"BLOCKED by loop guard: {name} called {self.seen[key]}x with identical args; try something else.")
            return await super().call_tool(name, arguments)

    server = (GuardedFastMCP if guard else FastMCP)("weather")

    @server.tool()
    def search(query: str) -> str:
        """Search the web."""
        return f"results for '{query}': nothing useful"

    @server.tool()
    def get_weather(city: str, unit: str) -> str:
        """Get weather for a city."""
        return f"{city}: sunny, 21{unit}"

    server.run("stdio")
    recorder.dump(out + ".part")
    os.replace(out + ".part", out)  # atomic: the client polls for it


async def client(recorder, path, guard):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    server_dump = path.with_suffix(".server.tmp")
    params = StdioServerParameters(command=sys.executable, args=[__file__, "server", str(server_dump)] + (["guard"] if guard else []),
                                   env={**os.environ})
    # Stand-in for the host agent's own span, so the run is one trace (MCP itself has no agent span).
    with trace.get_tracer("capture-host").start_as_current_span("host agent run"):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            for name, args in SCRIPT:
                result = await session.call_tool(name, args)
                print(name, result.isError, result.content[0].text, file=sys.stderr)
    for _ in range(50):  # the server dumps after stdin closes
        if server_dump.exists():
            break
        await asyncio.sleep(0.1)
    recorder.records += [json.loads(line) for line in server_dump.read_text().splitlines()]
    server_dump.unlink()
    recorder.records.sort(key=lambda r: r["end_time_ns"])
    recorder.dump(path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["server"]:
        serve(sys.argv[2], "guard" in sys.argv[3:])
    else:
        rec = setup()
        asyncio.run(client(rec, HERE / "spans.jsonl", False))
        asyncio.run(client(rec, HERE / "spans_blocked.jsonl", True))
