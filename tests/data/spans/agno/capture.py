"""Capture Agno + openinference-instrumentation-agno spans for the scripted loop sequence (offline).

Run: AGNO_TELEMETRY=false .venv/bin/python capture.py  -> spans.jsonl, spans_blocked.jsonl
Pre-tool hook for the blocked run: Agent(tool_hooks=[loop_guard]) (a middleware around each call).
"""
import json, os
from collections import Counter
from dataclasses import dataclass

os.environ["AGNO_TELEMETRY"] = "false"  # agno's own usage telemetry off
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
            f.writelines(json.dumps(r, default=str) + "\n" for r in self.rows)
        self.rows = []


REC = Recorder()
provider = TracerProvider()
provider.add_span_processor(REC)
trace.set_tracer_provider(provider)

from agno.agent import Agent
from agno.models.base import Model
from agno.models.response import ModelResponse

SEQ = [("search", {"query": "weather in Paris"})] * 6 + [("get_weather", {"city": "Paris", "unit": "C"}),
                                                        ("search", {"query": "weather in Paris"})]


@dataclass
class ScriptedModel(Model):
    """Fake model: each invoke returns the next scripted turn (no network)."""
    id: str = "scripted-loop"
    name: str = "ScriptedModel"
    provider: str = "scripted"
    turn: int = 0

    def invoke(self, *args, **kwargs) -> ModelResponse:
        i, self.turn = self.turn, self.turn + 1
        if i < len(SEQ):
            name, a = SEQ[i]
            return ModelResponse(role="assistant", tool_calls=[
                {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(a)}}])
        return ModelResponse(role="assistant", content="It is 18 C and cloudy in Paris.")

    async def ainvoke(self, *args, **kwargs):
        return self.invoke(*args, **kwargs)

    def invoke_stream(self, *args, **kwargs):
        yield self.invoke(*args, **kwargs)

    async def ainvoke_stream(self, *args, **kwargs):
        yield self.invoke(*args, **kwargs)

    def _parse_provider_response(self, response, **kwargs):
        return response

    def _parse_provider_response_delta(self, response):
        return response


# The instrumentor only wraps Model subclasses it finds in the modules of the agno.models package
# (find_model_subclasses); expose ScriptedModel there so its invoke gets the same LLM spans as a real provider.
import agno.models.base

agno.models.base.ScriptedModel = ScriptedModel
from openinference.instrumentation.agno import AgnoInstrumentor

AgnoInstrumentor().instrument(tracer_provider=provider)


def search(query: str) -> str:
    """Search the web."""
    return f"results for '{query}': nothing useful"


def get_weather(city: str, unit: str = "C") -> str:
    """Get the weather for a city."""
    return f"{city}: 18 {unit}, cloudy"


SEEN = Counter()


def loop_guard(function_name: str, function_call, arguments: dict):
    """Pre-tool hook (tool_hooks middleware): runs inside FunctionCall.execute, before the tool body."""
    key = (function_name, json.dumps(arguments, sort_keys=True))
    SEEN[key] += 1
    if SEEN[key] >= 3:
        return f"BLOCKED by loop guard: {function_name} called {SEEN[key]} times with the same arguments"
    return function_call(**arguments)


def run(blocked: bool):
    agent = Agent(name="weather_agent", role="Answers weather questions.", model=ScriptedModel(),
                  tools=[search, get_weather], tool_hooks=[loop_guard] if blocked else None, telemetry=False)
    out = agent.run("What's the weather in Paris?", session_id="conv-123", user_id="u1")
    for m in out.messages or []:
        print("  ", m.role, (m.tool_calls or m.content or "")[:1] if m.tool_calls else str(m.content)[:100])
    print("->", out.content)


for blocked, path in ((False, "spans.jsonl"), (True, "spans_blocked.jsonl")):
    run(blocked)
    provider.force_flush()
    REC.dump(path)
    print("wrote", path)
