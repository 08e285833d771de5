"""Finished spans as trace readers decode them (:class:`RecordedSpan`), and OTLP JSON's own
decoding (:func:`otlp_json_spans`: hex or base64 ids, nanoseconds as numbers or text,
``AnyValue`` attributes bounded in depth). Problems raise :class:`BadSpan`, whose message names
the field and is shown to the user. Pure Python: no OpenTelemetry SDK, no protobuf."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "BadSpan",
    "MAX_SPAN_PROBLEMS",
    "MAX_VALUE_DEPTH",
    "OTLP_SIGNALS",
    "OtlpSpans",
    "RecordedSpan",
    "STATUS_CODE_ERROR",
    "SpanLink",
    "otlp_json_spans",
    "read_id",
    "read_nanos",
    "read_parent_id",
    "short_value",
]

#: Nesting of OTLP attribute values (arrays, key-value lists) read before a span is refused.
MAX_VALUE_DEPTH: Final = 32
#: Bad spans named per OTLP request (or line); the rest are only counted.
MAX_SPAN_PROBLEMS: Final = 3
_HEX: Final = re.compile(r"[0-9a-fA-F]+")
_DECIMAL: Final = re.compile(r"-?[0-9]{1,20}")
#: The top-level keys of OTLP JSON requests, one per signal.
OTLP_SIGNALS: Final = ("resourceSpans", "resourceMetrics", "resourceLogs", "resourceProfiles")
#: ``Status.code`` of a failed span (``STATUS_CODE_ERROR``).
STATUS_CODE_ERROR: Final = 2


class BadSpan(ValueError):
    """A span (or a request or record holding spans) that cannot be used; the message says why,
    naming the field."""


def short_value(value: object, limit: int = 60) -> str:
    """``value`` as JSON (a string as its repr), cut to ``limit`` characters for a message."""
    text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _required(record: Mapping[str, Any], name: str) -> Any:
    if name not in record:
        raise BadSpan(f"missing field {name!r}")
    return record[name]


# --------------------------------------------------------------------------------------------
# Events: what a buffered trace gives, in the span processor's order


@dataclass(slots=True, unsafe_hash=True)  # built per span: not frozen (4x the __init__), never set
class RecordedSpan:
    """One finished span as a trace reader decoded it.

    ``attributes`` and event attributes are as the SDK would hold them (arrays as tuples).
    ``start_name``/``start_attributes`` are what ``on_start`` saw; ``None`` when the recording
    does not say (OTLP), and then the final name and attributes stand in for them.
    ``parent_remote``: the parent is in another process (the processor never sees it).
    """

    trace_id: int
    span_id: int
    parent_id: int | None
    name: str
    attributes: Mapping[str, object]
    events: tuple[tuple[str, Mapping[str, object]], ...]
    status_error: bool
    start_ns: int
    end_ns: int
    start_name: str | None = None
    start_attributes: Mapping[str, object] | None = None
    parent_remote: bool = False


def read_id(value: object, size: int, name: str, base64_too: bool) -> int:
    """A trace (16 bytes) or span (8 bytes) id from hex, or base64 of the right length."""
    digits = 2 * size
    if isinstance(value, str) and len(value) == digits and _HEX.fullmatch(value):
        number = int(value, 16)
    else:
        raw: bytes | None = None
        if base64_too and isinstance(value, str) and value:
            try:
                raw = base64.b64decode(value, validate=True)
            except ValueError:  # binascii.Error
                raw = None
        if raw is None or len(raw) != size:
            also = " (or base64)" if base64_too else ""
            raise BadSpan(
                f"{name!r} must be {size} bytes: {digits} hex digits{also},"
                f" got {short_value(value)}"
            )
        number = int.from_bytes(raw, "big")
    if number == 0:
        raise BadSpan(f"{name!r} is all zeros (an invalid id)")
    return number


def read_parent_id(value: object, name: str, base64_too: bool) -> int | None:
    if value is None or value == "":
        return None
    return read_id(value, 8, name, base64_too)


def read_nanos(value: object, name: str, text_too: bool) -> int:
    """Nanoseconds since the epoch, an unsigned 64-bit integer (OTLP JSON: also its decimal
    string)."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif text_too and isinstance(value, str) and _DECIMAL.fullmatch(value):
        number = int(value)
    if number is None or not 0 <= number < 1 << 64:
        kind = "an integer (or its decimal string)" if text_too else "an integer"
        raise BadSpan(
            f"{name!r} must be {kind} of nanoseconds >= 0 (64 bits), got {short_value(value)}"
        )
    return number


# -- OTLP JSON ---------------------------------------------------------------------------------


def _any_value(value: object, where: str, depth: int) -> object:
    """One OTLP ``AnyValue`` as the SDK would hold it; ``None`` for an empty (or unknown) one."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadSpan(f"{where}: value must be an AnyValue object, got {short_value(value)}")
    if depth > MAX_VALUE_DEPTH:
        raise BadSpan(f"{where}: value nested more than {MAX_VALUE_DEPTH} levels deep")
    for kind, decode in _ANY_VALUE_KINDS:
        if kind in value:
            return decode(value[kind], where, depth)
    return None


def _string_value(text: object, where: str, depth: int) -> object:
    if not isinstance(text, str):
        raise BadSpan(f"{where}: stringValue must be a string, got {short_value(text)}")
    return text


def _bool_value(flag: object, where: str, depth: int) -> object:
    if not isinstance(flag, bool):
        raise BadSpan(f"{where}: boolValue must be true or false, got {short_value(flag)}")
    return flag


def _int_value(number: object, where: str, depth: int) -> object:
    if isinstance(number, int) and not isinstance(number, bool):
        return number
    if isinstance(number, str) and _DECIMAL.fullmatch(number):
        return int(number)
    raise BadSpan(
        f"{where}: intValue must be an integer or its decimal string, got {short_value(number)}"
    )


def _double_value(double: object, where: str, depth: int) -> object:
    if isinstance(double, (int, float)) and not isinstance(double, bool):
        return float(double)
    if isinstance(double, str):
        try:
            return float(double)  # "NaN", "Infinity", "-Infinity", or a number as text
        except ValueError:
            pass
    raise BadSpan(f"{where}: doubleValue must be a number, got {short_value(double)}")


def _array_value(array: object, where: str, depth: int) -> object:
    items = _values_list(array, where, "arrayValue")
    return tuple(_any_value(item, where, depth + 1) for item in items)


def _kvlist_value(pairs: object, where: str, depth: int) -> object:
    return _otlp_attributes(_values_list(pairs, where, "kvlistValue"), where, depth + 1)


def _bytes_value(encoded: object, where: str, depth: int) -> object:
    try:
        if not isinstance(encoded, str):
            raise ValueError
        return base64.b64decode(encoded, validate=True)
    except ValueError:
        raise BadSpan(
            f"{where}: bytesValue must be base64 text, got {short_value(encoded)}"
        ) from None


#: The fields of an ``AnyValue``, in the order they are looked for, with their decoders.
_ANY_VALUE_KINDS: Final[tuple[tuple[str, Callable[[object, str, int], object]], ...]] = (
    ("stringValue", _string_value),
    ("boolValue", _bool_value),
    ("intValue", _int_value),
    ("doubleValue", _double_value),
    ("arrayValue", _array_value),
    ("kvlistValue", _kvlist_value),
    ("bytesValue", _bytes_value),
)


def _values_list(container: object, where: str, kind: str) -> list[object]:
    if container is None:
        return []
    if not isinstance(container, dict):
        raise BadSpan(
            f"{where}: {kind} must be an object with 'values', got {short_value(container)}"
        )
    values = container.get("values")
    if values is None:
        return []
    if not isinstance(values, list):
        raise BadSpan(f"{where}: {kind}.values must be a list, got {short_value(values)}")
    return values


def _otlp_attributes(value: object, where: str, depth: int = 0) -> dict[str, object]:
    """OTLP ``[{"key", "value": AnyValue}]`` as a dict (the last of a repeated key wins, empty
    values are dropped, as the SDK does)."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise BadSpan(f"{where} must be a list of {{key, value}} objects, got {short_value(value)}")
    attributes: dict[str, object] = {}
    for item in value:
        if not isinstance(item, dict):
            raise BadSpan(
                f"{where}: an attribute must be a {{key, value}} object, got {short_value(item)}"
            )
        key = item.get("key")
        if not isinstance(key, str):
            raise BadSpan(f"{where}: attribute 'key' must be a string, got {short_value(key)}")
        decoded = _any_value(item.get("value"), f"{where} {key!r}", depth)
        if decoded is not None:
            attributes[key] = decoded
    return attributes


def _otlp_events(value: object) -> tuple[tuple[str, Mapping[str, object]], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadSpan(f"'events' must be a list, got {short_value(value)}")
    events: list[tuple[str, Mapping[str, object]]] = []
    for index, event in enumerate(value):
        if not isinstance(event, dict):
            raise BadSpan(f"events[{index}] must be an object, got {short_value(event)}")
        event_name = event.get("name", "")
        if not isinstance(event_name, str):
            raise BadSpan(f"events[{index}].name must be a string, got {short_value(event_name)}")
        events.append(
            (event_name, _otlp_attributes(event.get("attributes"), f"events[{index}].attributes"))
        )
    return tuple(events)


def _otlp_status_error(value: object) -> bool:
    if value is None:
        return False
    if not isinstance(value, dict):
        raise BadSpan(f"'status' must be an object, got {short_value(value)}")
    return value.get("code") in (STATUS_CODE_ERROR, "STATUS_CODE_ERROR")


def _otlp_span(raw: object) -> RecordedSpan:
    if not isinstance(raw, dict):
        raise BadSpan(f"a span must be an object, got {short_value(raw)}")
    trace_id = read_id(_required(raw, "traceId"), 16, "traceId", True)
    span_id = read_id(_required(raw, "spanId"), 8, "spanId", True)
    parent_id = read_parent_id(raw.get("parentSpanId"), "parentSpanId", True)
    flags = raw.get("flags")
    # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE (0x100) and SPAN_FLAGS_CONTEXT_IS_REMOTE (0x200).
    remote = (
        parent_id is not None
        and isinstance(flags, int)
        and not isinstance(flags, bool)
        and flags & 0x300 == 0x300
    )
    name = raw.get("name", "")
    if not isinstance(name, str):
        raise BadSpan(f"'name' must be a string, got {short_value(name)}")
    start = read_nanos(_required(raw, "startTimeUnixNano"), "startTimeUnixNano", True)
    end = read_nanos(_required(raw, "endTimeUnixNano"), "endTimeUnixNano", True)
    return RecordedSpan(
        trace_id,
        span_id,
        parent_id,
        name,
        _otlp_attributes(raw.get("attributes"), "attributes"),
        _otlp_events(raw.get("events")),
        _otlp_status_error(raw.get("status")),
        start,
        end,
        parent_remote=remote,
    )


def _list_field(record: Mapping[str, Any], name: str, where: str) -> list[object]:
    value = record.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadSpan(f"{where}{name} must be a list, got {short_value(value)}")
    return value


#: A span known to be neither a tool nor an agent span, as the buffer keeps it: (trace id, span
#: id, parent span id or None, whether the parent is remote).
SpanLink = tuple[int, int, int | None, bool]


@dataclass(frozen=True, slots=True)
class OtlpSpans:
    """The spans read from one OTLP request: the good ones, up to a few reasons for the bad ones
    (each naming the span's path in the request), and how many were bad. ``links``: spans a
    decoder already knows to be neither tool nor agent spans, kept as parent links only."""

    spans: list[RecordedSpan]
    problems: list[str]
    bad_spans: int
    links: list[SpanLink] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        """Spans read (recorded ones and links)."""
        return len(self.spans) + len(self.links)


def otlp_json_spans(record: Mapping[str, Any]) -> OtlpSpans:
    """The spans of an OTLP JSON ``ExportTraceServiceRequest`` (a parsed object).

    Ids are hex; base64 of the right length (protobuf's own JSON) is read too. 64-bit integers
    may be decimal strings or numbers; enums integers (or their names); unknown fields are
    ignored; fields proto3 leaves out when empty (name, attributes, events, status, parent) may
    be absent. ``traceId``, ``spanId`` and the two times are required. A bad span is left out
    and named in :attr:`OtlpSpans.problems`; the others still count. A request without
    ``resourceSpans`` has no spans (the caller decides whether that is an error).
    """
    spans: list[RecordedSpan] = []
    problems: list[str] = []
    bad_spans = 0
    for i, resource in enumerate(_list_field(record, "resourceSpans", "")):
        where = f"resourceSpans[{i}]"
        try:
            if not isinstance(resource, dict):
                raise BadSpan(f"must be an object, got {short_value(resource)}")
            scopes = _list_field(resource, "scopeSpans", "")
        except BadSpan as exc:
            bad_spans += 1
            problems.append(f"{where}: {exc}")
            continue
        for j, scope in enumerate(scopes):
            at = f"{where}.scopeSpans[{j}]"
            try:
                if not isinstance(scope, dict):
                    raise BadSpan(f"must be an object, got {short_value(scope)}")
                raw_spans = _list_field(scope, "spans", "")
            except BadSpan as exc:
                bad_spans += 1
                problems.append(f"{at}: {exc}")
                continue
            for k, raw in enumerate(raw_spans):
                try:
                    spans.append(_otlp_span(raw))
                except BadSpan as exc:
                    bad_spans += 1
                    if len(problems) < MAX_SPAN_PROBLEMS:
                        problems.append(f"{at}.spans[{k}]: {exc}")
    return OtlpSpans(spans, problems, bad_spans)
