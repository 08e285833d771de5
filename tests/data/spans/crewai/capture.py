"""Capture CrewAI + openinference-instrumentation-crewai spans for the scripted loop sequence (offline).

Run: .venv/bin/python capture.py  (driver; one subprocess per dump, CrewAI's own telemetry off)
  spans.jsonl / spans_blocked.jsonl          OpenInference default (wrapper) mode
  spans_events.jsonl / spans_events_blocked.jsonl   OpenInference use_event_listener=True mode
  *_identical.jsonl  search returns the SAME text every time -> CrewAI's own repeat check aborts the run
Pre-tool hook: register_before_tool_call_hook (returns False to block) + an after hook that
replaces CrewAI's fixed "Tool execution blocked by hook" text with our message.
"""
import json, os, subprocess, sys
from collections import Counter

RUNS = {"spans": ("wrapper", 0, 1), "spans_blocked": ("wrapper", 1, 1), "spans_identical": ("wrapper", 0, 0),
        "spans_events": ("events", 0, 1), "spans_events_blocked": ("events", 1, 1), "spans_events_identical": ("events", 0, 0)}
if len(sys.argv) == 1:
    env = dict(os.environ, CREWAI_DISABLE_TELEMETRY="true", CREWAI_TRACING_ENABLED="false")
    for out in RUNS:
        subprocess.run([sys.executable, __file__, out], env=env, check=True)
    sys.exit(0)
OUT = sys.argv[1]
MODE, BLOCKED, VARY = RUNS[OUT]

assert "OTEL_SDK_DISABLED" not in os.environ and os.environ.get("CREWAI_DISABLE_TELEMETRY") == "true"
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


REC = Recorder()
provider = TracerProvider()
provider.add_span_processor(REC)
trace.set_tracer_provider(provider)

from crewai import Agent, Crew, Task
from crewai.events.types.llm_events import LLMCallType
from crewai.hooks.tool_hooks import register_after_tool_call_hook, register_before_tool_call_hook
from crewai.llms.base_llm import BaseLLM, llm_call_context
from crewai.tools import tool
from openinference.instrumentation.crewai import CrewAIInstrumentor

CrewAIInstrumentor().instrument(tracer_provider=provider, use_event_listener=(MODE == "events"))

SEQ = [("search", {"query": "weather in Paris"})] * 6 + [("get_weather", {"city": "Paris", "unit": "C"}),
                                                        ("search", {"query": "weather in Paris"})]


class ScriptedLLM(BaseLLM):
    """Fake model: returns the next scripted turn as OpenAI-style tool calls (no network)."""
    turn: int = 0

    def supports_function_calling(self) -> bool:
        return True

    def call(self, messages, tools=None, callbacks=None, available_functions=None, from_task=None,
             from_agent=None, response_model=None, **kw):
        with llm_call_context():  # as CrewAI's own providers do (gives the LLM events one call_id)
            return self._call(messages, tools, from_task, from_agent)

    def _call(self, messages, tools, from_task, from_agent):
        self._emit_call_started_event(messages=messages, tools=tools, from_task=from_task, from_agent=from_agent)
        i, self.turn = self.turn, self.turn + 1
        if i < len(SEQ):
            name, args = SEQ[i]
            out = [{"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]
            ctype = LLMCallType.TOOL_CALL
        else:
            out, ctype = "It is 18 C and cloudy in Paris.", LLMCallType.LLM_CALL
        self._emit_call_completed_event(response=out, call_type=ctype, from_task=from_task, from_agent=from_agent,
                                        messages=messages)
        return out


N = Counter()


@tool("search")
def search(query: str) -> str:
    """Search the web."""
    N[query] += 1
    return f"results for '{query}'" + (f" (#{N[query]})" if VARY else "") + ": nothing useful"


@tool("get_weather")
def get_weather(city: str, unit: str = "C") -> str:
    """Get the weather for a city."""
    return f"{city}: 18 {unit}, cloudy"


SEEN, BLOCK_MSG = Counter(), {}


def loop_guard_before(ctx):
    """Pre-tool hook: runs before the tool; sees tool_name, tool_input, agent, task (no call id)."""
    key = (ctx.tool_name, json.dumps(ctx.tool_input, sort_keys=True))
    SEEN[key] += 1
    if SEEN[key] >= 3:
        BLOCK_MSG[id(ctx.tool_input)] = (f"BLOCKED by loop guard: {ctx.tool_name} called {SEEN[key]} times "
                                         f"with the same arguments")
        return False  # block: CrewAI skips the tool
    return None


def loop_guard_after(ctx):
    """After hook runs even for blocked calls; its return value replaces the tool result."""
    return BLOCK_MSG.pop(id(ctx.tool_input), None)


if BLOCKED:
    register_before_tool_call_hook(loop_guard_before)
    register_after_tool_call_hook(loop_guard_after)

agent = Agent(role="Weather researcher", goal="Answer weather questions", backstory="You look things up.",
              llm=ScriptedLLM(model="scripted-loop"), tools=[search, get_weather], max_iter=20, verbose=False)
task = Task(description="What's the weather in Paris?", expected_output="A short answer.", agent=agent)
try:
    res = Crew(agents=[agent], tasks=[task], verbose=False).kickoff()
    print(OUT, "->", res.raw)
except Exception as e:
    print(OUT, "-> raised", type(e).__name__, str(e)[:200])
provider.force_flush()
with open(f"{OUT}.jsonl", "w") as f:
    f.writelines(json.dumps(r, default=str) + "\n" for r in REC.rows)
print("wrote", f"{OUT}.jsonl", len(REC.rows), "spans")
