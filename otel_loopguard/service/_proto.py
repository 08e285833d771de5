"""OTLP protobuf ``ExportTraceServiceRequest`` bytes to the spans the trace buffer needs.

Most spans an agent exports are not tool or agent spans (model calls, chains, HTTP): the buffer
needs only their ids and parent link. Decoding every attribute of every span into Python values
costs ten times the protobuf parse itself, so a request is read in three steps:

1. The body is parsed twice by the C protobuf runtime with two lean schemas of the same wire
   format (built here, never registered globally): one reads each span's ids, name, times and
   flags and leaves attributes and events as undecoded bytes; the other gives each span's whole
   encoding as bytes. Fields these schemas do not name are skipped as protobuf skips unknown
   fields, so both accept exactly what ``ExportTraceServiceRequest`` accepts.
2. A span is a *candidate* when its name passes a name gate of the conventions tables, or when
   its encoding contains the exact bytes of an attribute gate (``gen_ai.operation.name`` =
   ``execute_tool``, ``openinference.span.kind`` = ``TOOL``, ...: the first condition of every
   entry of ``TOOL_CONVENTIONS`` and ``AGENT_CONVENTIONS``), or the key of one of
   ``MODEL_SPAN_KEYS`` (a model call's usage). A span passing no gate cannot be a tool, agent
   or model span (:mod:`otel_loopguard._conventions` tests its gates first), so it is kept as
   a parent link only. The byte patterns assume what the protobuf encoding guide asks of
   encoders and every OTLP exporter and the Collector do: known fields written in field-number
   order (a ``KeyValue``'s key before its value).
3. A candidate is parsed again as a real ``opentelemetry.proto.trace.v1.Span`` and converted to
   a :class:`~otel_loopguard._otlp_json.RecordedSpan` with every attribute and event.

Ids of the wrong length (or all zeros) reject the span, named by its path in the request; the
other spans still count. Bytes that are not an ``ExportTraceServiceRequest`` raise ``BadSpan``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_loopguard import _conventions as conventions
from otel_loopguard._otlp_json import (
    MAX_SPAN_PROBLEMS,
    MAX_VALUE_DEPTH,
    STATUS_CODE_ERROR,
    BadSpan,
    OtlpSpans,
    RecordedSpan,
    SpanLink,
)

__all__ = [
    "ExportTraceServiceRequest",
    "ExportTraceServiceResponse",
    "RPC_INVALID_ARGUMENT",
    "RPC_RESOURCE_EXHAUSTED",
    "RPC_UNAUTHENTICATED",
    "RPC_UNAVAILABLE",
    "candidate_patterns",
    "proto_spans",
    "response_bytes",
]

# google.rpc.Code values used in the Status of an answer that is not a success.
RPC_INVALID_ARGUMENT: Final = 3
RPC_RESOURCE_EXHAUSTED: Final = 8
RPC_UNAVAILABLE: Final = 14
RPC_UNAUTHENTICATED: Final = 16

#: ``Span.flags``: SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE | SPAN_FLAGS_CONTEXT_IS_REMOTE.
_REMOTE_PARENT: Final = 0x300
_ZERO_TRACE: Final = bytes(16)
_ZERO_SPAN: Final = bytes(8)


# -- lean schemas ----------------------------------------------------------------------------


def _lean_classes() -> tuple[Any, Any]:
    """Message classes reading an ``ExportTraceServiceRequest``'s spans shallowly (see the
    module docstring); field numbers are those of ``opentelemetry/proto/trace/v1/trace.proto``."""
    Field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="otel_loopguard/lean_trace.proto", package="otel_loopguard.lean", syntax="proto3"
    )

    def message(name: str, *fields: tuple[str, int, int, bool, str | None]) -> None:
        proto = file.message_type.add(name=name)
        for field_name, number, kind, repeated, type_name in fields:
            added = proto.field.add(
                name=field_name,
                number=number,
                type=kind,
                label=Field.LABEL_REPEATED if repeated else Field.LABEL_OPTIONAL,
            )
            if type_name is not None:
                added.type_name = f".otel_loopguard.lean.{type_name}"

    message("Request", ("resource_spans", 1, Field.TYPE_MESSAGE, True, "ResourceSpans"))
    message("ResourceSpans", ("scope_spans", 2, Field.TYPE_MESSAGE, True, "ScopeSpans"))
    message("ScopeSpans", ("spans", 2, Field.TYPE_MESSAGE, True, "Span"))
    message(
        "Span",
        ("trace_id", 1, Field.TYPE_BYTES, False, None),
        ("span_id", 2, Field.TYPE_BYTES, False, None),
        ("parent_span_id", 4, Field.TYPE_BYTES, False, None),
        ("name", 5, Field.TYPE_STRING, False, None),
        ("start_time_unix_nano", 7, Field.TYPE_FIXED64, False, None),
        ("end_time_unix_nano", 8, Field.TYPE_FIXED64, False, None),
        # Named so they are kept as bytes (cheaper than as unknown fields), never decoded here.
        ("attributes", 9, Field.TYPE_BYTES, True, None),
        ("events", 11, Field.TYPE_BYTES, True, None),
        ("links", 13, Field.TYPE_BYTES, True, None),
        ("flags", 16, Field.TYPE_FIXED32, False, None),
    )
    message("RawRequest", ("resource_spans", 1, Field.TYPE_MESSAGE, True, "RawResourceSpans"))
    message("RawResourceSpans", ("scope_spans", 2, Field.TYPE_MESSAGE, True, "RawScopeSpans"))
    message("RawScopeSpans", ("spans", 2, Field.TYPE_BYTES, True, None))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("otel_loopguard.lean.Request")),
        message_factory.GetMessageClass(
            pool.FindMessageTypeByName("otel_loopguard.lean.RawRequest")
        ),
    )


_LeanRequest, _RawRequest = _lean_classes()


# -- the candidate gate ----------------------------------------------------------------------


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        low = number & 0x7F
        number >>= 7
        if number:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _text_field(tag: int, text: str) -> bytes:
    raw = text.encode()
    return bytes([tag]) + _varint(len(raw)) + raw


def candidate_patterns() -> tuple[frozenset[str], tuple[str, ...], tuple[bytes, ...]] | None:
    """The gates of the conventions tables: exact span names, span-name prefixes, and byte
    patterns of attribute gates as encoded in a span (``KeyValue`` key, then for a gate with
    values ``AnyValue{string_value}``), plus event names. ``None`` when the tables cannot be
    read (then every span is a candidate)."""
    names: set[str] = set()
    prefixes: list[str] = []
    patterns: list[bytes] = []
    try:
        on = conventions.On
        tables: tuple[Any, ...] = (*conventions.TOOL_CONVENTIONS, *conventions.AGENT_CONVENTIONS)
        for convention in tables:
            gate = convention.when[0]
            if gate.on is on.SPAN_NAME:
                names.update(gate.keys)
            elif gate.on is on.SPAN_NAME_PREFIX:
                prefixes.extend(gate.keys)
            elif gate.on is on.EVENT:
                patterns.extend(_text_field(0x12, key) for key in gate.keys)  # Event.name
            elif gate.on is on.ATTRIBUTE:
                for key in gate.keys:
                    head = _text_field(0x0A, key)  # KeyValue.key
                    if gate.values is None:
                        patterns.append(head)
                        continue
                    for value in sorted(gate.values):
                        any_value = _text_field(0x0A, value)  # AnyValue.string_value
                        patterns.append(head + b"\x12" + _varint(len(any_value)) + any_value)
            else:
                return None
        # A model call's span: its usage is charged to the calls of its turn.
        patterns.extend(_text_field(0x0A, key) for key in conventions.MODEL_SPAN_KEYS)
    except (AttributeError, IndexError, TypeError):
        return None
    return frozenset(names), tuple(sorted(set(prefixes))), tuple(sorted(set(patterns)))


def _gate_regex(patterns: Iterable[bytes]) -> re.Pattern[bytes]:
    return re.compile(b"|".join(re.escape(pattern) for pattern in patterns))


_GATES: Final = candidate_patterns()
if _GATES is not None:
    _GATE_NAMES: frozenset[str] = _GATES[0]
    _GATE_PREFIXES: tuple[str, ...] = _GATES[1]
    _GATE_SEARCH = _gate_regex(_GATES[2]).search


def _is_candidate(name: str, raw: bytes) -> bool:
    if _GATES is None:
        return True
    if name in _GATE_NAMES or (_GATE_PREFIXES and name.startswith(_GATE_PREFIXES)):
        return True
    return _GATE_SEARCH(raw) is not None


# -- decoding --------------------------------------------------------------------------------


def _value(value: Any, depth: int) -> object:
    """One ``AnyValue`` as the SDK would hold it; ``None`` when empty."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        if depth >= MAX_VALUE_DEPTH:
            raise BadSpan(f"an attribute value is nested more than {MAX_VALUE_DEPTH} levels deep")
        return tuple(_value(item, depth + 1) for item in value.array_value.values)
    if kind == "kvlist_value":
        if depth >= MAX_VALUE_DEPTH:
            raise BadSpan(f"an attribute value is nested more than {MAX_VALUE_DEPTH} levels deep")
        return _attributes(value.kvlist_value.values, depth + 1)
    return getattr(value, kind)


def _attributes(pairs: Iterable[Any], depth: int = 0) -> dict[str, object]:
    """``KeyValue`` pairs as a dict (the last of a repeated key wins; empty values dropped)."""
    attributes: dict[str, object] = {}
    for pair in pairs:
        value = pair.value
        kind = value.WhichOneof("value")
        if kind == "string_value":  # most attributes: no call
            attributes[pair.key] = value.string_value
        elif kind is not None:
            decoded = _value(value, depth)
            if decoded is not None:
                attributes[pair.key] = decoded
    return attributes


def _events(events: Iterable[Any]) -> tuple[tuple[str, Mapping[str, object]], ...]:
    return tuple((event.name, _attributes(event.attributes)) for event in events)


def _ids(trace_id: bytes, span_id: bytes, parent: bytes) -> tuple[int, int, int | None]:
    if len(trace_id) != 16:
        raise BadSpan(f"'trace_id' must be 16 bytes, got {len(trace_id)}")
    if len(span_id) != 8:
        raise BadSpan(f"'span_id' must be 8 bytes, got {len(span_id)}")
    if parent and len(parent) != 8:
        raise BadSpan(f"'parent_span_id' must be 8 bytes or empty, got {len(parent)}")
    trace = int.from_bytes(trace_id, "big")
    span = int.from_bytes(span_id, "big")
    if not trace:
        raise BadSpan("'trace_id' is all zeros (an invalid id)")
    if not span:
        raise BadSpan("'span_id' is all zeros (an invalid id)")
    parent_id = int.from_bytes(parent, "big") if parent else None
    return trace, span, parent_id or None


def proto_spans(body: bytes) -> OtlpSpans:
    """The spans of a serialized ``ExportTraceServiceRequest``: candidates as
    :class:`RecordedSpan` (:attr:`OtlpSpans.spans`), the rest as parent links
    (:attr:`OtlpSpans.links`). Raises ``BadSpan`` when ``body`` is not such a request."""
    try:
        lean = _LeanRequest.FromString(body)
        raw = _RawRequest.FromString(body)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise BadSpan(f"not a valid protobuf ExportTraceServiceRequest ({exc})") from None
    spans: list[RecordedSpan] = []
    links: list[SpanLink] = []
    problems: list[str] = []
    bad = 0
    from_bytes = int.from_bytes
    for i, (resource, raw_resource) in enumerate(zip(lean.resource_spans, raw.resource_spans)):
        for j, (scope, raw_scope) in enumerate(zip(resource.scope_spans, raw_resource.scope_spans)):
            encodings = raw_scope.spans
            for k, span in enumerate(scope.spans):
                try:
                    raw_trace, raw_span, raw_parent = (
                        span.trace_id,
                        span.span_id,
                        span.parent_span_id,
                    )
                    if (
                        len(raw_trace) == 16
                        and len(raw_span) == 8
                        and len(raw_parent) in (0, 8)
                        and raw_trace != _ZERO_TRACE
                        and raw_span != _ZERO_SPAN
                    ):
                        trace_id = from_bytes(raw_trace, "big")
                        span_id = from_bytes(raw_span, "big")
                        parent_id = from_bytes(raw_parent, "big") if raw_parent else None
                        parent_id = parent_id or None
                    else:  # the slow path names the problem
                        trace_id, span_id, parent_id = _ids(raw_trace, raw_span, raw_parent)
                    remote = parent_id is not None and span.flags & _REMOTE_PARENT == _REMOTE_PARENT
                    name = span.name
                    encoding = encodings[k]
                    if not _is_candidate(name, encoding):
                        links.append((trace_id, span_id, parent_id, remote))
                        continue
                    full = Span.FromString(encoding)
                    spans.append(
                        RecordedSpan(
                            trace_id,
                            span_id,
                            parent_id,
                            name,
                            _attributes(full.attributes),
                            _events(full.events),
                            full.status.code == STATUS_CODE_ERROR,
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            parent_remote=remote,
                        )
                    )
                except BadSpan as exc:
                    bad += 1
                    if len(problems) < MAX_SPAN_PROBLEMS:
                        problems.append(f"resource_spans[{i}].scope_spans[{j}].spans[{k}]: {exc}")
                except (DecodeError, RuntimeError, ValueError) as exc:
                    bad += 1
                    if len(problems) < MAX_SPAN_PROBLEMS:
                        problems.append(
                            f"resource_spans[{i}].scope_spans[{j}].spans[{k}]:"
                            f" not a valid Span ({exc})"
                        )
    return OtlpSpans(spans, problems, bad, links)


def response_bytes(rejected: int = 0, message: str = "") -> bytes:
    """A serialized ``ExportTraceServiceResponse``; ``partial_success`` only when spans were
    rejected (an empty response otherwise, as the specification asks)."""
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    return bytes(response.SerializeToString())
