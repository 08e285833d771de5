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
