"""Capture dspy (ReAct, DummyLM) + openinference-instrumentation-dspy spans, offline.

python capture.py            -> spans.jsonl and spans_blocked.jsonl beside this file
"""
import json
from pathlib import Path

import dspy
from dspy.utils import DummyLM
from openinference.instrumentation import using_session, using_user
from openinference.instrumentation.dspy import DSPyInstrumentor
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

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
# ReAct's steps (DummyLM answers them in order), its own finish tool, then the extract step.
ANSWERS = [{"next_thought": "Call it.", "next_tool_name": name, "next_tool_args": args}
           for name, args in SCRIPT] + [
    {"next_thought": "Done.", "next_tool_name": "finish", "next_tool_args": {}},
    {"reasoning": "The weather tool answered.", "answer": "It is sunny in Paris."}]


def search(query: str) -> str:
    """Search the web."""
    return f"results for '{query}': nothing useful"


def get_weather(city: str, unit: str) -> str:
    """Get weather for a city."""
    return f"{city}: sunny, 21{unit}"


SEEN = {}


class Blocking(dspy.Tool):
    """A pre-tool hook of our own around dspy.Tool.__call__ (DSPy has none that can refuse): the
    3rd and later identical call returns the block text without calling the tool, so NO tool
    span is emitted for a blocked call (OpenInference wraps dspy.Tool.__call__)."""

    def __call__(self, **kwargs):
        key = (self.name, json.dumps(kwargs, sort_keys=True))
        SEEN[key] = SEEN.get(key, 0) + 1
        if SEEN[key] >= 3:
            return (f"BLOCKED by loop guard: {self.name} called {SEEN[key]}x with "
                    "identical args; try something else.")
        return super().__call__(**kwargs)


def run(tools, recorder, path):
    react = dspy.ReAct("question -> answer", tools=tools, max_iters=20)
    with dspy.context(lm=DummyLM(list(ANSWERS))), using_session("conv-123"), using_user("u1"):
        print(react(question="What's the weather in Paris?").answer)
    recorder.dump(path)


recorder = Recorder()
provider = TracerProvider()
provider.add_span_processor(recorder)
DSPyInstrumentor().instrument(tracer_provider=provider)
run([search, get_weather], recorder, HERE / "spans.jsonl")
run([Blocking(search), Blocking(get_weather)], recorder, HERE / "spans_blocked.jsonl")
