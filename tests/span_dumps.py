"""Rebuild the fixture span dumps through a real TracerProvider, in the order they happened."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from .conftest import SPAN_DUMPS as DUMPS_DIR


def dump_paths() -> list[Path]:
    """Every span dump in tests/data/spans (sorted)."""
    return sorted(DUMPS_DIR.glob("*/*.jsonl"))


#: A dump with the whole loop and call ids (LangGraph + OpenInference), for tests that need one.
REFERENCE_DUMP = DUMPS_DIR / "langgraph" / "spans.jsonl"


def dump_id(path: Path) -> str:
    """``<framework>/<file>``, as tests/data/spans/README.md names a dump."""
    return f"{path.parent.name}/{path.name}"


# What the dumps are, beside the scripted sequence of tests/data/spans/README.md (by dump_id).

#: Tool spans without arguments (nor results): counted only with count_calls_without_arguments.
WITHOUT_ARGUMENTS = frozenset(
    {
        "autogen/spans.jsonl",
        "autogen/spans_blocked.jsonl",
        "mcp/spans.jsonl",
        "mcp/spans_blocked.jsonl",
        "semantic_kernel/spans_default.jsonl",
    }
)
#: Blocked runs whose blocked calls still have their tool span (the framework's hook runs
#: inside it; the result is the block message, which numbers each block). In the other blocked
#: runs only calls 1, 2 and 7 (get_weather) have one.
BLOCKED_CALLS_TRACED = frozenset(
    {
        "pydantic_ai/spans_blocked.jsonl",
        "agno/spans_blocked.jsonl",
        "crewai/spans_events_blocked.jsonl",
        "mcp/spans_blocked.jsonl",
        "mcp_openllmetry/spans_blocked.jsonl",
    }
)
#: Runs whose search result changes at every call: CrewAI stops a run itself at the fifth call
#: with an identical result, so its capture's search numbers them ("(#3)").
CHANGING_RESULTS = frozenset(
    {
        "crewai/spans.jsonl",
        "crewai/spans_blocked.jsonl",
        "crewai/spans_events.jsonl",
        "crewai/spans_events_blocked.jsonl",
    }
)
#: Semantic Kernel names a tool "<plugin>-<function>" on its spans (and to the model).
TOOL_PREFIXES = {"semantic_kernel": "tools-"}


def bare_tool(path: Path, tool: str) -> str:
    """The scripted tool's name, without the plugin prefix of the dump's framework."""
    return tool.removeprefix(TOOL_PREFIXES.get(path.parent.name, ""))


def loop_actions(path: Path) -> set[str]:
    """Actions the ``default`` preset takes somewhere in the dump's run, so that comparing two
    entrances' decisions is not comparing two empty reports: remind, deny and stop on the
    identical searches; only reminders when each result differs (polling); nothing in a blocked
    run (the framework's own hook kept the loop short) or without arguments (skipped)."""
    if "blocked" in path.name or dump_id(path) in WITHOUT_ARGUMENTS:
        return set()
    if dump_id(path) in CHANGING_RESULTS:
        return {"remind"}
    return {"remind", "deny", "stop"}


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def timeline(records: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """("start"|"end", record) in time order; at equal times a start before an end, parents
    starting before children and children ending before parents (the dump's end order)."""
    order = {id(record): index for index, record in enumerate(records)}
    depth: dict[str, int] = {}
    by_id = {record["span_id"]: record for record in records}

    def level(record: dict[str, Any]) -> int:
        span_id = record["span_id"]
        if span_id not in depth:
            parent = by_id.get(record["parent_span_id"] or "")
            depth[span_id] = 0 if parent is None else level(parent) + 1
        return depth[span_id]

    steps = [(r["start_time_ns"], 0, level(r), order[id(r)], "start", r) for r in records]
    steps += [(r["end_time_ns"], 1, -level(r), order[id(r)], "end", r) for r in records]
    for _, _, _, _, what, record in sorted(steps, key=lambda s: s[:4]):
        yield what, record


def rebuild(records: list[dict[str, Any]], tracer: Tracer) -> dict[str, Any]:
    """Start and end every span as the dump says: ``attributes_at_start`` at start, the rest
    (and events, status, a final name) before the end. Returns live spans by dump span id."""
    live: dict[str, Any] = {}
    for what, record in timeline(records):
        if what == "start":
            parent = live.get(record["parent_span_id"] or "")
            context = trace.set_span_in_context(parent) if parent is not None else None
            live[record["span_id"]] = tracer.start_span(
                record["name_at_start"],
                context=context,
                kind=SpanKind[record["kind"]],
                attributes=record["attributes_at_start"],
                start_time=record["start_time_ns"],
            )
            continue
        span = live[record["span_id"]]
        if record["name"] != record["name_at_start"]:
            span.update_name(record["name"])
        span.set_attributes(record["attributes"])
        for event in record["events"]:
            span.add_event(event["name"], event["attributes"], timestamp=event["timestamp_ns"])
        status = record["status"]
        if status["code"] == "ERROR":
            span.set_status(Status(StatusCode.ERROR, status.get("description")))
        span.end(end_time=record["end_time_ns"])
    return live
