"""Capture haystack-ai Agent spans (Haystack's own tracing through opentelemetry-haystack's
OpenTelemetryTracer), offline, with MockChatGenerator playing the script.

python capture.py            -> spans.jsonl and spans_blocked.jsonl beside this file
"""
import json, os, sys
from pathlib import Path
from typing import Annotated

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"       # no posthog
os.environ["HAYSTACK_CONTENT_TRACING_ENABLED"] = "true"  # read at import: tool args/results as tags

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from haystack import Pipeline, tracing
from haystack.components.agents import Agent
from haystack.components.agents.state import State, replace_values
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks import hook
from haystack.tools import tool
from haystack_integrations.tracing.opentelemetry import OpenTelemetryTracer

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


def scripted_model():
    replies = [ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name=n, arguments=a, id=f"call_{i}")])
               for i, (n, a) in enumerate(SCRIPT)]
    return MockChatGenerator(responses=replies + ["It is sunny in Paris."], model="scripted-loop")


@tool
def search(query: Annotated[str, "what to search for"]) -> str:
    """Search the web."""
    return f"results for '{query}': nothing useful"


@tool
def get_weather(city: Annotated[str, "city name"], unit: Annotated[str, "C or F"]) -> str:
    """Get weather for a city."""
    return f"{city}: sunny, 21{unit}"


def make_guard():
    """A `before_tool` hook (haystack.hooks). It sees the pending tool calls (with their ids) in the last
    message of State; a blocked call is replaced by the assistant call + an error tool result carrying
    the message (what haystack's own ConfirmationHook does on a rejection). No tool span is emitted
    for a blocked call."""
    seen = {}

    @hook
    def loop_guard(state: State) -> None:
        messages = state.data.get("messages") or []
        if not messages or not messages[-1].tool_calls:
            return
        last, allowed, blocked = messages[-1], [], []
        for tc in last.tool_calls:
            key = tc.tool_name + json.dumps(tc.arguments, sort_keys=True)
            seen[key] = seen.get(key, 0) + 1
            if seen[key] < 3:
                allowed.append(tc)
                continue
            msg = f"BLOCKED by loop guard: {tc.tool_name} called {seen[key]}x with identical args; try something else."
            blocked += [ChatMessage.from_assistant(text=last.text, tool_calls=[tc]),
                        ChatMessage.from_tool(tool_result=msg, origin=tc, error=True)]
        if blocked:
            rest = [ChatMessage.from_assistant(text=last.text, tool_calls=allowed)] if allowed else []
            state.set("messages", messages[:-1] + blocked + rest, handler_override=replace_values)

    return loop_guard


def run(hooks, recorder, path):
    agent = Agent(chat_generator=scripted_model(), tools=[search, get_weather],
                  system_prompt="You are a weather agent.", max_agent_steps=20, hooks=hooks)
    pipe = Pipeline()
    pipe.add_component("weather_agent", agent)
    out = pipe.run({"weather_agent": {"messages": [ChatMessage.from_user("What's the weather in Paris?")]}})
    print(path.name, "->", out["weather_agent"]["last_message"].text, file=sys.stderr)
    recorder.dump(path)


if __name__ == "__main__":
    recorder = Recorder()
    provider = TracerProvider()
    provider.add_span_processor(recorder)
    tracing.enable_tracing(OpenTelemetryTracer(provider.get_tracer("haystack")))
    run(None, recorder, HERE / "spans.jsonl")
    run({"before_tool": [make_guard()]}, recorder, HERE / "spans_blocked.jsonl")
