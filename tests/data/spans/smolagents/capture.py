"""Capture smolagents + openinference-instrumentation-smolagents spans, offline, scripted model.

python capture.py            -> spans.jsonl and spans_blocked.jsonl beside this file
"""
import json, os, sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from openinference.instrumentation import using_session, using_user
from openinference.instrumentation.smolagents import SmolagentsInstrumentor
import smolagents
from smolagents import ToolCallingAgent, tool
from smolagents.models import (ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction,
                               MessageRole, Model, TokenUsage)

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
    ("get_weather", {"city": "Paris", "unit": "C"}), ("search", {"query": "weather in Paris"}),
    ("final_answer", {"answer": "It is sunny in Paris."})]


class ScriptedModel(Model):
    """Returns the next scripted tool call each time it is asked (ToolCallingAgent ends via final_answer)."""

    def __init__(self):
        super().__init__(model_id="scripted-loop")
        self.turn = 0

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kw):
        name, args = SCRIPT[self.turn]
        call = ChatMessageToolCall(id=f"call_{self.turn}", type="function",
                                   function=ChatMessageToolCallFunction(name=name, arguments=args))
        self.turn += 1
        return ChatMessage(role=MessageRole.ASSISTANT, content=None, tool_calls=[call],
                           token_usage=TokenUsage(input_tokens=10, output_tokens=5))


# The instrumentor wraps `generate` of every Model subclass exported by the smolagents package;
# exporting ours there lets the real _ModelWrapper produce the LLM spans.
smolagents.ScriptedModel = ScriptedModel


@tool
def search(query: str) -> str:
    """Search the web.

    Args:
        query: what to search for
    """
    return f"results for '{query}': nothing useful"


@tool
def get_weather(city: str, unit: str) -> str:
    """Get weather for a city.

    Args:
        city: city name
        unit: C or F
    """
    return f"{city}: sunny, 21{unit}"


class GuardedAgent(ToolCallingAgent):
    """smolagents has no pre-tool hook: override execute_tool_call (sees name + arguments, no call id).
    Returning a value instead of calling the tool makes it the observation; Tool.__call__ is not run,
    so NO tool span is emitted for a blocked call."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen = {}

    def execute_tool_call(self, tool_name, arguments):
        key = (tool_name, json.dumps(arguments, sort_keys=True))
        self.seen[key] = self.seen.get(key, 0) + 1
        if tool_name != "final_answer" and self.seen[key] >= 3:
            return f"BLOCKED by loop guard: {tool_name} called {self.seen[key]}x with identical args; try something else."
        return super().execute_tool_call(tool_name, arguments)


def run(agent_cls, recorder, path):
    agent = agent_cls(tools=[search, get_weather], model=ScriptedModel(), name="weather_agent",
                      max_steps=20, verbosity_level=0)
    with using_session("conv-123"), using_user("u1"):
        out = agent.run("What's the weather in Paris?")
    print(path.name, "->", out, file=sys.stderr)
    recorder.dump(path)


if __name__ == "__main__":
    recorder = Recorder()
    provider = TracerProvider()
    provider.add_span_processor(recorder)
    SmolagentsInstrumentor().instrument(tracer_provider=provider)
    run(ToolCallingAgent, recorder, HERE / "spans.jsonl")
    run(GuardedAgent, recorder, HERE / "spans_blocked.jsonl")
