"""Recorded-trace input formats: OTLP JSON lines and span dumps (the decoding of spans and the
trace buffer that puts them back in time order live in :mod:`otel_loopguard._traces`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .._otlp_json import (
    MAX_SPAN_PROBLEMS,
    OTLP_SIGNALS,
    STATUS_CODE_ERROR,
    RecordedSpan,
    otlp_json_spans,
    read_id,
    read_nanos,
    read_parent_id,
)
from .._otlp_json import short_value as _short
from .._spans import KeyBy
from .._traces import MAX_BUFFERED_SPANS, TraceBuffer
from ._events import BadRecord, Event, _get


def _buffered(
    buffer: TraceBuffer, spans: Iterable[RecordedSpan], problems: list[str], bad_spans: int = 0
) -> list[Event]:
    """Buffer the good spans of one record; return the events now ready, or raise
    :class:`BadRecord` carrying them when the record had bad spans or overflowed the buffer."""
    for span in spans:
        buffer.add(span)
    early = buffer.flushed_early_capacity
    events: list[Event] = list(buffer.take_ready())
    early = buffer.flushed_early_capacity - early
    reasons = list(problems[:MAX_SPAN_PROBLEMS])
    hidden = bad_spans - len(reasons)
    if hidden > 0:
        reasons.append(f"and {hidden} more bad span{'s' if hidden != 1 else ''}")
    if early:
        reasons.append(
            f"more than {buffer.max_spans:,} spans of unfinished traces buffered: {early} trace"
            f"{'s' if early != 1 else ''} replayed before the root span arrived (decisions"
            " may differ)"
        )
    if reasons:
        raise BadRecord("; ".join(reasons), events)
    return events


# -- span dumps -------------------------------------------------------------------------------


def _sdk_attributes(value: object, name: str) -> dict[str, object]:
    """A dump's attribute object as the SDK holds it: lists as tuples, nulls dropped."""
    if not isinstance(value, dict):
        raise BadRecord(f"{name!r} must be an object of attributes, got {_short(value)}")
    attributes: dict[str, object] = {}
    for key, item in value.items():
        if item is None:
            continue
        attributes[key] = tuple(item) if isinstance(item, list) else item
    return attributes


def _dump_events(value: object) -> tuple[tuple[str, Mapping[str, object]], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRecord(f"'events' must be a list, got {_short(value)}")
    events: list[tuple[str, Mapping[str, object]]] = []
    for index, event in enumerate(value):
        if not isinstance(event, dict):
            raise BadRecord(f"events[{index}] must be an object, got {_short(event)}")
        event_name = _get(event, "name")
        if not isinstance(event_name, str):
            raise BadRecord(f"events[{index}].name must be a string, got {_short(event_name)}")
        raw = event.get("attributes")
        events.append(
            (
                event_name,
                _sdk_attributes(raw, f"events[{index}].attributes") if raw is not None else {},
            )
        )
    return tuple(events)


def _dump_status_error(value: object) -> bool:
    if value is None:
        return False
    if not isinstance(value, dict):
        raise BadRecord(f"'status' must be an object, got {_short(value)}")
    return value.get("code") in ("ERROR", "STATUS_CODE_ERROR", STATUS_CODE_ERROR)


def _dump_span(record: Mapping[str, Any]) -> RecordedSpan:
    name = _get(record, "name")
    if not isinstance(name, str):
        raise BadRecord(f"'name' must be a string, got {_short(name)}")
    trace_id = read_id(_get(record, "trace_id"), 16, "trace_id", False)
    span_id = read_id(_get(record, "span_id"), 8, "span_id", False)
    parent_id = read_parent_id(record.get("parent_span_id"), "parent_span_id", False)
    start = read_nanos(_get(record, "start_time_ns"), "start_time_ns", False)
    end = read_nanos(_get(record, "end_time_ns"), "end_time_ns", False)
    attributes = _sdk_attributes(_get(record, "attributes"), "attributes")
    start_name = record.get("name_at_start")
    if start_name is not None and not isinstance(start_name, str):
        raise BadRecord(f"'name_at_start' must be a string, got {_short(start_name)}")
    raw_start = record.get("attributes_at_start")
    start_attributes = (
        None if raw_start is None else _sdk_attributes(raw_start, "attributes_at_start")
    )
    return RecordedSpan(
        trace_id,
        span_id,
        parent_id,
        name,
        attributes,
        _dump_events(record.get("events")),
        _dump_status_error(record.get("status")),
        start,
        end,
        start_name,
        start_attributes,
    )


class _TraceDecoder:
    """What the recorded-trace decoders share: one :class:`TraceBuffer` per file, which puts the
    spans back in time order and gives the rest of its events when the input ends."""

    __slots__ = ("_buffer",)

    def __init__(
        self, max_buffered_spans: int | None = None, key_by: KeyBy | str = KeyBy.TRACE
    ) -> None:
        self._buffer = TraceBuffer(
            MAX_BUFFERED_SPANS if max_buffered_spans is None else max_buffered_spans, key_by=key_by
        )

    def finish(self) -> Iterable[Event]:
        return self._buffer.finish()


class SpanDumpDecoder(_TraceDecoder):
    """Span dumps: one finished span per line, in the order spans ended (the fixtures' format)::

        {"name": "execute_tool search", "kind": "INTERNAL", "trace_id": "<32 hex>",
         "span_id": "<16 hex>", "parent_span_id": "<16 hex>" | null, "scope": "pydantic-ai",
         "start_time_ns": 1796049783492744705, "end_time_ns": ..., "attributes": {...},
         "events": [{"name", "timestamp_ns", "attributes"}], "status": {"code": "ERROR", ...},
         "name_at_start": "...", "attributes_at_start": {...}}

    ``name``, ``trace_id``, ``span_id``, the two times and ``attributes`` are required.
    ``name_at_start``/``attributes_at_start`` are what ``SpanProcessor.on_start`` saw; without
    ``attributes_at_start`` the span is judged as an OTLP span is. Traces are put back in time order
    by a :class:`TraceBuffer`.
    """

    __slots__ = ()

    def decode(self, record: object) -> Iterable[Event]:
        if not isinstance(record, dict):
            raise BadRecord(f"expected a JSON object (one span), got {type(record).__name__}")
        return _buffered(self._buffer, (_dump_span(record),), [])


def _claims_span_dump(record: object) -> bool:
    return (
        isinstance(record, dict)
        and "span_id" in record
        and "trace_id" in record
        and "name" in record
        and "resourceSpans" not in record
    )


class OtlpJsonDecoder(_TraceDecoder):
    """OTLP JSON lines: one ``ExportTraceServiceRequest`` per line, as the Collector's ``file``
    exporter writes them::

        {"resourceSpans": [{"resource": {...}, "scopeSpans": [{"scope": {...}, "spans": [
          {"traceId": "<32 hex>", "spanId": "<16 hex>", "parentSpanId": "<16 hex>" | "",
           "name": "execute_tool search", "kind": 1, "startTimeUnixNano": "1796...",
           "endTimeUnixNano": "...", "attributes": [{"key": "gen_ai.tool.name",
           "value": {"stringValue": "search"}}], "events": [{"timeUnixNano", "name",
           "attributes"}], "status": {"code": 2}}]}]}]}

    Ids are hex; base64 of the right length (protobuf's own JSON) is read too. 64-bit integers
    may be decimal strings or numbers; enums integers (or their names); unknown fields are
    ignored; fields proto3 leaves out when empty (name, attributes, events, status, parent) may
    be absent. ``traceId``, ``spanId`` and the two times are required. Lines of other signals
    (``resourceMetrics``, ``resourceLogs``) carry no calls. A bad span makes its line bad, named
    by its path in the line, but the line's other spans still count. OTLP does not record what a
    span carried when it started: the final name and attributes stand in, and a tool span is
    decided at its start only for the instrumentations known to start tool spans with their
    arguments (Pydantic AI), as the span processor would have; every other one at its end.
    """

    __slots__ = ()

    def decode(self, record: object) -> Iterable[Event]:
        if not isinstance(record, dict):
            raise BadRecord(
                f"expected a JSON object (an ExportTraceServiceRequest), got"
                f" {type(record).__name__}"
            )
        if "resourceSpans" not in record:
            if any(signal in record for signal in OTLP_SIGNALS):
                return ()
            raise BadRecord("missing field 'resourceSpans'")
        read = otlp_json_spans(record)
        return _buffered(self._buffer, read.spans, read.problems, read.bad_spans)


def _claims_otlp_json(record: object) -> bool:
    return isinstance(record, dict) and any(
        isinstance(record.get(signal), list) for signal in OTLP_SIGNALS
    )
