"""What a state directory's payloads are made of (``serve --state-dir``, :mod:`._durable`): the
data-only format (:func:`plain_dumps`, :func:`plain_loads`: tagged values, nothing else can be
written or read, nesting bounded, every length checked) and an accepted batch as plain data
(:func:`batch_payload`, :func:`batch_of`). Nothing here can run code: no ``pickle``, ``marshal``
or ``eval``."""

from __future__ import annotations

import base64
import dataclasses
import struct
from collections.abc import Callable
from typing import Any, Final

import orjson

from otel_loopguard._otlp_json import OtlpSpans, RecordedSpan
from otel_loopguard._trace_events import CallObserved

from ._otlp_logs import LogCalls

__all__ = [
    "MAX_PLAIN_DEPTH",
    "SPAN_FIELDS",
    "batch_of",
    "batch_payload",
    "plain_dumps",
    "plain_loads",
]

# -- the plain-data format ------------------------------------------------------------------

#: Nesting read or written at most (the snapshot's own structure plus span attribute values,
#: themselves at most :data:`~otel_loopguard._otlp_json.MAX_VALUE_DEPTH` deep).
MAX_PLAIN_DEPTH: Final = 100
_INT: Final = struct.Struct("<cq")
_FLOAT: Final = struct.Struct("<cd")
_SIZED: Final = struct.Struct("<cI")
_Q: Final = struct.Struct("<q")
_D: Final = struct.Struct("<d")
_I: Final = struct.Struct("<I")
_MIN64: Final = -(1 << 63)
_MAX64: Final = (1 << 63) - 1
_PLAIN: Final = (dict, list, tuple, str, bytes, int, float, bool, type(None))


class _NotPlain(Exception):
    pass


def plain_dumps(data: object) -> bytes:
    """``data``, plain data only (dicts, lists, tuples, strings, bytes, integers, floats,
    booleans, ``None``, nested at most :data:`MAX_PLAIN_DEPTH` deep), in the state directory's
    data-only format: one tag byte per value (``N T F`` None and booleans; ``i`` a 64-bit
    integer, ``I`` a longer one with its byte length; ``f`` a float; ``s`` UTF-8 text and
    ``b`` bytes with their length; ``r`` the same text as the n-th ``s`` before it; ``l`` a
    list, ``t`` a tuple, ``d`` a dict with their item count; ``j`` a dict as JSON with its
    length, for a dict JSON keeps exactly: text keys, and text, booleans, ``None``, 64-bit
    integers or finite floats as values), little-endian. ``ValueError`` naming the first value
    of another type (its path from the top)."""
    writer = _Writer()
    try:
        writer.walk(data, 0)
    except (_NotPlain, RecursionError):
        _check_plain(data, "snapshot", 0)
        raise ValueError(f"snapshot: nested more than {MAX_PLAIN_DEPTH} levels deep") from None
    return b"".join(writer.out)


def _flat_json(value: dict[Any, Any], tuples: bool = False) -> bool:
    """Whether JSON (orjson) writes ``value`` and reads it back equal, types and all: text keys,
    and values that are text, booleans, ``None``, 64-bit integers or finite floats (with
    ``tuples``, also tuples of those, which JSON reads back as lists)."""
    for key, item in value.items():
        if type(key) is not str:
            return False
        if type(item) is str or _json_scalar(item):
            continue
        if not tuples or type(item) is not tuple:
            return False
        for element in item:
            if not _json_scalar(element):
                return False
    return True


def _json_scalar(item: object) -> bool:
    kind = type(item)
    if kind is str or kind is bool or item is None:
        return True
    if kind is int:
        return _MIN64 <= item <= _MAX64  # type: ignore[operator]
    return kind is float and item - item == 0.0  # type: ignore[operator]  # not inf, nan


class _Writer:
    """Writes :func:`plain_dumps`'s format."""

    __slots__ = ("out", "put", "seen")

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.put = self.out.append
        self.seen: dict[str, int] = {}  # each text written once; later ones refer to it ("r")

    def walk(self, value: Any, depth: int) -> None:
        kind = type(value)
        put = self.put
        if kind is str:
            self.text(value)
        elif kind is int:
            if _MIN64 <= value <= _MAX64:
                put(_INT.pack(b"i", value))
            else:
                raw = value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
                put(_SIZED.pack(b"I", len(raw)))
                put(raw)
        elif value is None:
            put(b"N")
        elif kind is bool:
            put(b"T" if value else b"F")
        elif kind is float:
            put(_FLOAT.pack(b"f", value))
        elif kind is bytes:
            put(_SIZED.pack(b"b", len(value)))
            put(value)
        elif kind is list or kind is tuple or kind is dict:
            self.nested(value, kind, depth)
        else:
            raise _NotPlain

    def text(self, value: str) -> None:
        index = self.seen.get(value)
        if index is not None:
            self.put(_SIZED.pack(b"r", index))
            return
        self.seen[value] = len(self.seen)
        raw = value.encode("utf-8", "surrogatepass")
        self.put(_SIZED.pack(b"s", len(raw)))
        self.put(raw)

    def nested(self, value: Any, kind: type, depth: int) -> None:
        if depth >= MAX_PLAIN_DEPTH:
            raise _NotPlain
        walk = self.walk
        if kind is dict:
            if _flat_json(value):  # most span attributes: one C call each way
                try:
                    raw = orjson.dumps(value)
                except TypeError:  # orjson.JSONEncodeError: text with a lone surrogate
                    pass
                else:
                    self.put(_SIZED.pack(b"j", len(raw)))
                    self.put(raw)
                    return
            self.put(_SIZED.pack(b"d", len(value)))
            for key, item in value.items():
                walk(key, depth + 1)
                walk(item, depth + 1)
        else:
            self.put(_SIZED.pack(b"l" if kind is list else b"t", len(value)))
            for item in value:
                walk(item, depth + 1)


def _check_plain(value: object, path: str, depth: int) -> None:
    kind = type(value)
    if kind not in _PLAIN:
        raise ValueError(f"{path}: {kind.__name__} is not plain data")
    if depth >= MAX_PLAIN_DEPTH:
        return
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            _check_plain(key, f"{path} key", depth + 1)
            _check_plain(item, f"{path}[{key!r:.40}]", depth + 1)
    elif kind is list or kind is tuple:
        for index, item in enumerate(value):  # type: ignore[arg-type]
            _check_plain(item, f"{path}[{index}]", depth + 1)


def plain_loads(payload: bytes) -> Any:
    """A :func:`plain_dumps` value back; ``ValueError`` for anything else (a tag it does not
    know, a length past the end, nesting past :data:`MAX_PLAIN_DEPTH`, bytes left over, a key
    that cannot be one). Reads data only: there is nothing in the format that names code."""
    reader = _Reader(bytes(payload))
    try:
        value = reader.read(0)
    except ValueError:
        raise
    except (TypeError, struct.error, OverflowError) as exc:  # a list as a dict key, ...
        raise ValueError(f"not plain data ({type(exc).__name__}: {exc})") from None
    left = reader.size - reader.position
    if left:
        raise ValueError(f"{left:,} bytes after the value")
    return value


class _Reader:
    """Reads :func:`plain_dumps`'s format: one method per tag (:data:`_READERS`)."""

    __slots__ = ("data", "position", "size", "texts")

    def __init__(self, data: bytes) -> None:
        self.texts: list[str] = []
        self.data = data
        self.size = len(data)
        self.position = 0

    def read(self, depth: int) -> Any:
        position = self.position
        if position >= self.size:
            raise ValueError("truncated")
        self.position = position + 1
        method = _READERS.get(self.data[position])
        if method is None:
            raise ValueError(f"unknown tag {self.data[position]:#04x} at byte {position:,}")
        return method(self, depth)

    def _fixed(self, width: int) -> int:
        """Where the next ``width`` bytes start (they are there)."""
        start = self.position
        if self.size - start < width:
            raise ValueError("truncated")
        self.position = start + width
        return start

    def _count(self, least: int) -> int:
        """A length or item count, each item at least ``least`` bytes (all there)."""
        count = int(_I.unpack_from(self.data, self._fixed(4))[0])
        if count * least > self.size - self.position:
            raise ValueError(f"a length past the end ({count:,})")
        return count

    def _raw(self) -> bytes:
        count = self._count(1)
        start = self._fixed(count)
        return self.data[start : start + count]

    def _none(self, depth: int) -> None:
        return None

    def _true(self, depth: int) -> bool:
        return True

    def _false(self, depth: int) -> bool:
        return False

    def _int(self, depth: int) -> int:
        return int(_Q.unpack_from(self.data, self._fixed(8))[0])

    def _big(self, depth: int) -> int:
        return int.from_bytes(self._raw(), "little", signed=True)

    def _float(self, depth: int) -> float:
        return float(_D.unpack_from(self.data, self._fixed(8))[0])

    def _str(self, depth: int) -> str:
        text = self._raw().decode("utf-8", "surrogatepass")
        self.texts.append(text)
        return text

    def _ref(self, depth: int) -> str:
        index = int(_I.unpack_from(self.data, self._fixed(4))[0])
        if index >= len(self.texts):
            raise ValueError(f"a reference to text {index:,} of {len(self.texts):,}")
        return self.texts[index]

    def _bytes(self, depth: int) -> bytes:
        return self._raw()

    def _nested(self, depth: int) -> int:
        if depth >= MAX_PLAIN_DEPTH:
            raise ValueError(f"nested more than {MAX_PLAIN_DEPTH} levels deep")
        return depth + 1

    def _json(self, depth: int) -> dict[Any, Any]:
        try:
            value = orjson.loads(self._raw())
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise ValueError(f"JSON that is not an object: {type(value).__name__}")
        return value

    def _list(self, depth: int) -> list[Any]:
        inner = self._nested(depth)
        return [self.read(inner) for _ in range(self._count(1))]

    def _tuple(self, depth: int) -> tuple[Any, ...]:
        inner = self._nested(depth)
        return tuple([self.read(inner) for _ in range(self._count(1))])

    def _dict(self, depth: int) -> dict[Any, Any]:
        inner = self._nested(depth)
        out: dict[Any, Any] = {}
        for _ in range(self._count(2)):
            key = self.read(inner)
            out[key] = self.read(inner)
        return out


_READERS: Final[dict[int, Callable[[_Reader, int], Any]]] = {
    ord("N"): _Reader._none,
    ord("T"): _Reader._true,
    ord("F"): _Reader._false,
    ord("i"): _Reader._int,
    ord("I"): _Reader._big,
    ord("f"): _Reader._float,
    ord("s"): _Reader._str,
    ord("r"): _Reader._ref,
    ord("b"): _Reader._bytes,
    ord("l"): _Reader._list,
    ord("t"): _Reader._tuple,
    ord("d"): _Reader._dict,
    ord("j"): _Reader._json,
}


#: A recorded span's fields, in order: how a batch's spans are written in the log.
SPAN_FIELDS: Final = tuple(item.name for item in dataclasses.fields(RecordedSpan))
#: A logged tool call's fields (OTLP logs; its ``span`` is always ``None``).
_CALL_FIELDS: Final = tuple(item.name for item in dataclasses.fields(CallObserved))


def batch_payload(read: OtlpSpans) -> bytes:
    """An accepted batch for the log (``BATCH``): its spans' fields, problems, bad-span count
    and parent links, as plain data (:func:`batch_of` reads it). As JSON (``J``), each span a
    row of its fields with 128-bit ids in hex and each attribute map as itself when JSON keeps
    it exactly (:func:`_flat_json`), else as :func:`plain_dumps` in Base64; a batch JSON cannot
    hold (text that is not UTF-8) as :func:`plain_dumps` (``P``). A batch of coding agents'
    tool calls (OTLP logs, :class:`~._otlp_logs.LogCalls`) as :func:`plain_dumps` (``L``):
    each call a row of its fields."""
    if isinstance(read, LogCalls):
        rows = [tuple(getattr(call, name) for name in _CALL_FIELDS) for call in read.calls]
        return b"L" + plain_dumps((rows, read.problems, read.bad_spans, read.ignored))
    try:
        return b"J" + orjson.dumps(
            [
                [_span_row(span) for span in read.spans],
                read.problems,
                read.bad_spans,
                [[f"{t:x}", s, p, r] for t, s, p, r in read.links],
            ]
        )
    except TypeError:  # orjson.JSONEncodeError: text with a lone surrogate
        spans = [tuple(getattr(span, name) for name in SPAN_FIELDS) for span in read.spans]
        return b"P" + plain_dumps((spans, read.problems, read.bad_spans, read.links))


def _span_row(span: RecordedSpan) -> list[object]:
    """One span's fields in :data:`SPAN_FIELDS`' order, for JSON."""
    return [
        f"{span.trace_id:x}",
        span.span_id,
        span.parent_id,
        span.name,
        _attributes_json(span.attributes),
        [[name, _attributes_json(attributes)] for name, attributes in span.events],
        span.status_error,
        span.start_ns,
        span.end_ns,
        span.start_name,
        None if span.start_attributes is None else _attributes_json(span.start_attributes),
        span.parent_remote,
    ]


def _attributes_json(attributes: Any) -> object:
    """An attribute map as JSON when JSON keeps it (arrays are tuples, and come back as such),
    else its :func:`plain_dumps` in Base64."""
    if type(attributes) is dict and _flat_json(attributes, tuples=True):
        return attributes
    return base64.b64encode(plain_dumps(dict(attributes))).decode()


def _attributes_back(value: object) -> dict[str, object]:
    if isinstance(value, str):
        value = plain_loads(base64.b64decode(value, validate=True))
    elif isinstance(value, dict):
        value = {k: tuple(v) if type(v) is list else v for k, v in value.items()}
    if not isinstance(value, dict):
        raise ValueError(f"attributes: expected a map, got {type(value).__name__}")
    return value


def _span_back(row: list[Any]) -> RecordedSpan:
    (trace_id, span_id, parent_id, name, attributes, events) = row[:6]
    (status_error, start_ns, end_ns, start_name, start_attributes, parent_remote) = row[6:]
    return RecordedSpan(
        int(trace_id, 16),
        int(span_id),
        None if parent_id is None else int(parent_id),
        str(name),
        _attributes_back(attributes),
        tuple((str(event), _attributes_back(values)) for event, values in events),
        bool(status_error),
        int(start_ns),
        int(end_ns),
        None if start_name is None else str(start_name),
        None if start_attributes is None else _attributes_back(start_attributes),
        bool(parent_remote),
    )


def batch_of(payload: bytes) -> OtlpSpans:
    """A :func:`batch_payload` back; ``ValueError`` for anything else."""
    try:
        if payload[:1] == b"L":
            rows, problems, bad_spans, ignored = plain_loads(payload[1:])
            calls = [CallObserved(**dict(zip(_CALL_FIELDS, row, strict=True))) for row in rows]
            return LogCalls(
                [], [str(problem) for problem in problems], int(bad_spans), [], calls, int(ignored)
            )
        if payload[:1] == b"J":
            rows, problems, bad_spans, links = orjson.loads(payload[1:])
            spans = [_span_back(row) for row in rows]
            links = [(int(a, 16), b, c, d) for a, b, c, d in links]
        elif payload[:1] == b"P":
            rows, problems, bad_spans, links = plain_loads(payload[1:])
            spans = [RecordedSpan(*row) for row in rows]
        else:
            raise ValueError("no batch marker")
        return OtlpSpans(
            spans,
            [str(problem) for problem in problems],
            int(bad_spans),
            [(int(a), int(b), None if c is None else int(c), bool(d)) for a, b, c, d in links],
        )
    except (TypeError, ValueError, AttributeError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"not a logged batch ({type(exc).__name__}: {exc})") from None
