"""Capture llama-index-core FunctionAgent + openinference-instrumentation-llama-index spans, offline.

python capture.py            -> spans.jsonl and spans_blocked.jsonl beside this file
"""
import asyncio, json, sys
from pathlib import Path

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from openinference.instrumentation import using_session, using_user
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
from llama_index.core.agent.workflow import FunctionAgent, ToolCall, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool, ToolOutput
from llama_index.core.workflow import Context, step

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
    """llama-index's own MockFunctionCallingLLM with a response generator that plays SCRIPT."""
    turn = [0]

    def respond(messages, **kwargs):
        i = turn[0]
        turn[0] += 1
        if i >= len(SCRIPT):
            return ChatMessage(role=MessageRole.ASSISTANT, content="It is sunny in Paris.")
        name, args = SCRIPT[i]
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[
            ToolCallBlock(tool_call_id=f"call_{i}", tool_name=name, tool_kwargs=args)])

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


def search(query: str) -> str:
    """Search the web."""
    return f"results for '{query}': nothing useful"


def get_weather(city: str, unit: str) -> str:
    """Get weather for a city."""
    return f"{city}: sunny, 21{unit}"


class GuardedAgent(FunctionAgent):
    """FunctionAgent has no pre-tool hook: override its `call_tool` workflow step (sees the call id,
    ev.tool_id). A blocked call returns a ToolCallResult without calling the tool: the model gets
    the message as the tool result; no FunctionTool.acall span is emitted for it."""

    @step
    async def call_tool(self, ctx: Context, ev: ToolCall) -> ToolCallResult:
        seen = await ctx.store.get("loopguard_seen", default={})
        key = ev.tool_name + json.dumps(ev.tool_kwargs, sort_keys=True)
        seen[key] = seen.get(key, 0) + 1
        await ctx.store.set("loopguard_seen", seen)
        if seen[key] < 3:
            return await super().call_tool(ctx, ev)
        msg = f"BLOCKED by loop guard: {ev.tool_name} called {seen[key]}x with identical args; try something else."
        out = ToolOutput(content=msg, tool_name=ev.tool_name, raw_input=ev.tool_kwargs, raw_output=msg,
                         is_error=True)
        result = ToolCallResult(tool_name=ev.tool_name, tool_kwargs=ev.tool_kwargs, tool_id=ev.tool_id,
                                tool_output=out, return_direct=False)
        ctx.write_event_to_stream(result)
        return result


async def run(agent_cls, recorder, path):
    agent = agent_cls(name="weather_agent", description="Answers weather questions.",
                      tools=[FunctionTool.from_defaults(fn=search), FunctionTool.from_defaults(fn=get_weather)],
                      llm=scripted_model(), system_prompt="You are a weather agent.")
    with using_session("conv-123"), using_user("u1"):
        out = await agent.run(user_msg="What's the weather in Paris?", max_iterations=20)
    print(path.name, "->", out, file=sys.stderr)
    recorder.dump(path)


if __name__ == "__main__":
    recorder = Recorder()
    provider = TracerProvider()
    provider.add_span_processor(recorder)
    LlamaIndexInstrumentor().instrument(tracer_provider=provider)
    asyncio.run(run(FunctionAgent, recorder, HERE / "spans.jsonl"))
    asyncio.run(run(GuardedAgent, recorder, HERE / "spans_blocked.jsonl"))
