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
   order (a ``KeyValue``'s key before its value). They are searched as one regular expression
   factored as a trie (:func:`_trie`): ``re`` then rejects most positions on one byte.
3. A candidate becomes a :class:`~otel_loopguard._otlp_json.RecordedSpan` with every attribute
   and event: its attributes read from their ``KeyValue`` bytes when each is written key then
   value, once (:func:`_fast_attributes`: no message built per attribute; the same bytes seen
   before give the same key and value from a bounded cache, :data:`_PAIRS`), its events and
   status by the runtime. A span in any other shape (or a bad one) is parsed again as a real
   ``opentelemetry.proto.trace.v1.Span``, as every candidate was before, and gives the same
   attributes (or names the same problem).

Ids of the wrong length (or all zeros) reject the span, named by its path in the request; the
other spans still count. Bytes that are not an ``ExportTraceServiceRequest`` raise ``BadSpan``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

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
        ("status", 15, Field.TYPE_BYTES, False, None),
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
_AnyValue: Final = AnyValue
_Event: Final = Span.Event
_Status: Final = Status
_DOUBLE: Final = struct.Struct("<d").unpack_from


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


def _trie(patterns: Iterable[bytes]) -> bytes:
    """A regular expression matching any of ``patterns``, factored by common prefixes (a trie):
    ``re`` tries the branches of a plain alternation at every position where one of their first
    bytes occurs (``\\n`` starts every pattern, and every ``KeyValue``), a trie rejects most of
    those positions on the next byte."""
    root: dict[int, Any] = {}
    for pattern in patterns:
        node = root
        for byte in pattern:
            node = node.setdefault(byte, {})
        node[-1] = {}  # a pattern ends here

    def build(node: dict[int, Any]) -> bytes:
        if -1 in node:
            return b""  # a shorter pattern matches already: what follows adds nothing
        branches = [re.escape(bytes([byte])) + build(child) for byte, child in sorted(node.items())]
        return branches[0] if len(branches) == 1 else b"(?:" + b"|".join(branches) + b")"

    return build(root)


_GATES: Final = candidate_patterns()
if _GATES is not None:
    _GATE_NAMES: frozenset[str] = _GATES[0]
    _GATE_PREFIXES: tuple[str, ...] = _GATES[1]
    # One literal first byte (0x0A, a KeyValue's key tag) for every branch keeps re's fast scan for
    # it; a name pattern (tag 0x2A) beside them would cost five times as much: names are
    # compared as text.
    _GATE_SEARCH = re.compile(_trie(_GATES[2]), re.DOTALL).search


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


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``data[at]`` and the index after it; ``IndexError`` past the end,
    ``ValueError`` past ten bytes."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift >= 70:
            raise ValueError("varint too long")


def _any_value(data: bytes, at: int, end: int) -> object:
    """``data[at:end]``, one ``AnyValue`` encoding, as :func:`_value` reads it: a string, bool,
    int or double written as one field read here; anything else by the protobuf runtime.
    ``ValueError`` (or ``IndexError``) when the bytes are not the one field they start with:
    the caller then reads the whole span the general way."""
    tag = data[at]
    if tag == 0x0A:  # string_value
        size, start = _read_varint(data, at + 1)
        if start + size != end:
            raise ValueError("not one string_value")
        return data[start:end].decode()  # UnicodeDecodeError: a ValueError
    if tag == 0x18 or tag == 0x10:  # int_value, bool_value
        number, after = _read_varint(data, at + 1)
        if after != end or number >> 64:
            raise ValueError("not one varint field")
        if tag == 0x10:
            return number != 0
        return number - (1 << 64) if number >= 1 << 63 else number
    if tag == 0x21 and end - at == 9:  # double_value
        return _DOUBLE(data, at + 1)[0]
    if tag == 0x2A:  # array_value: of strings (finish reasons, tags, ...) read here
        strings = _string_array(data, at, end)
        if strings is not None:
            return strings
    value = _AnyValue.FromString(data[at:end])  # arrays, key-value lists, bytes, the rest
    return _value(value, 0)


def _string_array(data: bytes, at: int, end: int) -> tuple[str, ...] | None:
    """``data[at:end]``, one ``AnyValue{array_value}`` whose values are each one
    ``string_value``, as :func:`_value` reads it (a tuple of str); None for any other shape
    (read by the protobuf runtime then). ``UnicodeDecodeError`` for text that is not UTF-8."""
    size, start = _read_varint(data, at + 1)
    if start + size != end:
        return None
    items: list[str] = []
    while start < end:
        if data[start] != 0x0A:  # ArrayValue.values
            return None
        size, start = _read_varint(data, start + 1)
        after = start + size
        if after > end or not size or data[start] != 0x0A:  # AnyValue.string_value
            return None
        size, start = _read_varint(data, start + 1)
        if start + size != after:
            return None
        items.append(data[start:after].decode())
        start = after
    return tuple(items)


#: ``KeyValue`` encodings already read, and what they gave: most attributes of the spans that
#: can matter repeat exactly from span to span (operation, provider, model, server, tool name
#: and type, token counts), so one dict lookup replaces reading them again. Only pairs of at
#: most :data:`_CACHED_PAIR_BYTES` whose value is immutable (text, a number, a bool, a tuple of
#: text) are kept, at most :data:`_CACHED_PAIRS` of them (then the cache starts over). Shared
#: by the decoding threads: a lost race only reads a pair once more.
_PAIRS: Final[dict[bytes, tuple[str, object]]] = {}
_CACHED_PAIRS: Final = 4096
_CACHED_PAIR_BYTES: Final = 256
_IMMUTABLE: Final = frozenset((str, int, float, bool))


def _fast_attributes(pairs: Iterable[bytes]) -> dict[str, object]:
    """``KeyValue`` encodings as :func:`_attributes` reads the messages: each ``key`` then
    ``value``, once, in field order (what every encoder writes) is read here without building
    a message per attribute (or taken from :data:`_PAIRS`). ``ValueError``/``IndexError`` on
    any other shape, for the caller to read the span the general way (which also names the
    problem of a span that is bad)."""
    attributes: dict[str, object] = {}
    known = _PAIRS.get
    for pair in pairs:
        end = len(pair)
        if end <= _CACHED_PAIR_BYTES:  # a longer pair is never kept: not hashed for nothing
            hit = known(pair)
            if hit is not None:
                attributes[hit[0]] = hit[1]
                continue
        if pair[0] != 0x0A:
            raise ValueError("KeyValue.key first")
        size = pair[1]
        at = 2
        if size >= 0x80:
            size, at = _read_varint(pair, 1)
        after = at + size
        key = pair[at:after].decode()
        if after == end:
            continue  # no value: empty, dropped as _attributes does
        size = pair[after + 1]
        at = after + 2
        if pair[after] != 0x12 or size >= 0x80:
            size, at = _value_field(pair, after)
        if at + size != end:
            raise ValueError("KeyValue.value last")
        if not size:
            continue
        if pair[at] == 0x0A:  # string_value, inline: most attributes
            size = pair[at + 1]
            start = at + 2
            if size >= 0x80:
                size, start = _read_varint(pair, at + 1)
            if start + size != end:
                raise ValueError("not one string_value")
            decoded: object = pair[start:end].decode()  # UnicodeDecodeError: a ValueError
        else:
            decoded = _any_value(pair, at, end)
            if decoded is None:
                continue
        attributes[key] = decoded
        if end <= _CACHED_PAIR_BYTES:
            _keep(pair, key, decoded)
    return attributes


def _keep(pair: bytes, key: str, value: object) -> None:
    """Put a short pair read in full into :data:`_PAIRS` when its value is immutable."""
    if type(value) in _IMMUTABLE or (
        type(value) is tuple and all(type(item) is str for item in value)
    ):
        if len(_PAIRS) >= _CACHED_PAIRS:
            _PAIRS.clear()
        _PAIRS[pair] = (key, value)


def _value_field(pair: bytes, at: int) -> tuple[int, int]:
    """The length of ``KeyValue.value`` at ``pair[at]`` and where its bytes start."""
    if pair[at] != 0x12:
        raise ValueError("KeyValue.value next")
    return _read_varint(pair, at + 1)


def _recorded(
    span: Any, encoding: bytes, ids: tuple[int, int, int | None], remote: bool
) -> RecordedSpan:
    """A candidate span in full, from its lean message (attributes read from their bytes),
    or from ``encoding`` parsed as a real ``Span`` when they are not in the usual shape."""
    try:
        attributes = _fast_attributes(span.attributes)
        events = span.events
        status = span.status
        return RecordedSpan(
            *ids,
            span.name,
            attributes,
            _events(_Event.FromString(event) for event in events) if events else (),
            bool(status) and _Status.FromString(status).code == STATUS_CODE_ERROR,
            span.start_time_unix_nano,
            span.end_time_unix_nano,
            parent_remote=remote,
        )
    except (ValueError, IndexError, DecodeError, RuntimeError):
        pass  # BadSpan (a ValueError) too: the general path raises it again, as before
    full = Span.FromString(encoding)
    return RecordedSpan(
        *ids,
        full.name,
        _attributes(full.attributes),
        _events(full.events),
        full.status.code == STATUS_CODE_ERROR,
        full.start_time_unix_nano,
        full.end_time_unix_nano,
        parent_remote=remote,
    )


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
    search: Callable[[bytes], object] | None = None
    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    if _GATES is not None:
        search, names, prefixes = _GATE_SEARCH, _GATE_NAMES, _GATE_PREFIXES
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
                    encoding = encodings[k]
                    # A span that passes no gate (by its name, or by an attribute's bytes in
                    # its encoding) cannot be a tool, agent or model span: a parent link.
                    name = span.name
                    if (
                        search is not None
                        and name not in names
                        and not (prefixes and name.startswith(prefixes))
                        and search(encoding) is None
                    ):
                        links.append((trace_id, span_id, parent_id, remote))
                        continue
                    spans.append(_recorded(span, encoding, (trace_id, span_id, parent_id), remote))
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
