"""Tool calls, canonical arguments and the keys that identify a call.

Two calls are "the same call" when their tool names are equal and their canonical arguments are
equal. Canonical arguments are JSON with object keys sorted at every depth; a JSON string argument
is parsed first; an unparsable string is compared as the raw string; top-level cosmetic fields
(``ignored_args``) are stripped. Nothing else is fuzzy.

Cost is bounded on hostile input: strings longer than :data:`MAX_PARSE_CHARS` are not parsed as
JSON (they are compared raw), structures deeper than :data:`MAX_DEPTH` are cut at that depth (the
cut subtree is replaced by a digest of its ``repr``-free JSON-ish walk, so different deep values
still differ), and every key derivation is linear in the size of its input.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson
from xxhash import xxh3_128_hexdigest

from ._record import FrozenRecord

__all__ = [
    "MAX_DEPTH",
    "MAX_ID_CHARS",
    "MAX_PARSE_CHARS",
    "MAX_TOOL_NAME_CHARS",
    "SIGNATURE_CHARS",
    "ToolCall",
    "args_key",
    "bounded_id",
    "canonical_arguments",
    "canonical_json",
    "failure_text",
    "outcome_key",
    "tool_name",
]

#: Deepest nesting kept in canonical arguments; deeper subtrees are replaced by a digest.
MAX_DEPTH: Final = 64
#: Longest string argument that is parsed as JSON; longer strings are compared raw.
MAX_PARSE_CHARS: Final = 1 << 20
#: Tool names are cut to this many characters (a hostile name must not grow keys or labels).
MAX_TOOL_NAME_CHARS: Final = 256
#: Session ids and agent names longer than this are kept in their :func:`bounded_id` form (a
#: hostile id must not grow the guard's keys, logs or labels).
MAX_ID_CHARS: Final = 256
#: Characters of a long id kept in front of its hash, so that it stays recognisable.
_ID_PREFIX_CHARS: Final = 64
#: Length of the display prefix of a key (hex characters), e.g. in decision events.
SIGNATURE_CHARS: Final = 12

_SORT: Final = orjson.OPT_SORT_KEYS
_SEPARATOR: Final = b"\x00"
#: Nineteen digits in a row: an integer orjson would read as a float (compiled on first use,
#: like :data:`_VOLATILE`: a command hook's process seldom needs either).
_LONG_DIGITS: Final = r"\d{19}"

#: Parts of a failure's text that change from one identical failure to the next, each with what
#: it is replaced by: timestamps, UUIDs, addresses, temporary paths, process ids, durations.
_VOLATILE: Final = (
    (r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?", "<time>"),
    (r"\b\d\d?:\d\d:\d\d(?:[.,]\d+)?\b", "<time>"),
    (
        r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
        "<uuid>",
    ),
    (r"\b0x[0-9a-fA-F]{4,}\b", "0x<addr>"),
    (r"(?:/private)?/(?:tmp|var/folders|var/tmp)/[^\s'\":,;)\]]*", "<tmp>"),
    (r"\btmp[A-Za-z0-9_]{6,}", "<tmp>"),
    (r"(?i)\b(pid|process|thread)\b(\s*[:=#]?\s*)\d+", r"\1\2<n>"),
    (r"(?i)\b\d+(?:\.\d+)?\s?(?:ms|us|µs|ns|s|sec|secs|seconds|min|minutes)\b", "<duration>"),
)


class _Compiled:
    """The module's patterns, compiled on first use."""

    long_digits: re.Pattern[str] | None = None
    volatile: tuple[tuple[re.Pattern[str], str], ...] | None = None


def _long_digits() -> re.Pattern[str]:
    pattern = _Compiled.long_digits
    if pattern is None:
        pattern = _Compiled.long_digits = re.compile(_LONG_DIGITS)
    return pattern


def _volatile() -> tuple[tuple[re.Pattern[str], str], ...]:
    patterns = _Compiled.volatile
    if patterns is None:
        patterns = _Compiled.volatile = tuple((re.compile(p), r) for p, r in _VOLATILE)
    return patterns


#: A failure's text is normalised on its first this-many characters only (the rest is kept).
MAX_FAILURE_CHARS: Final = 1 << 16


def failure_text(text: str) -> str:
    """A failure's text with its volatile parts (:data:`_VOLATILE`) replaced, so that two failures
    that differ only in a pid, a time, a temporary path, an address or a duration are the same
    failure."""
    head, tail = text[:MAX_FAILURE_CHARS], text[MAX_FAILURE_CHARS:]
    for pattern, replacement in _volatile():
        head = pattern.sub(replacement, head)
    return head + tail


def bounded_id(text: str) -> str:
    """A session id or agent name as the guard keeps it: ``text`` itself up to
    :data:`MAX_ID_CHARS` characters; a longer one as its first 64 characters, ``…#`` and the
    128-bit xxh3 hash of all of it in hex (98 characters: distinct long ids stay distinct, and
    the same id always gives the same form, in every process)."""
    if len(text) <= MAX_ID_CHARS:
        return text
    digest = xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))
    return f"{text[:_ID_PREFIX_CHARS]}…#{digest}"


def tool_name(tool: object) -> str:
    """Return a bounded string name for ``tool``, whatever its type.

    Strings are used as given (cut to :data:`MAX_TOOL_NAME_CHARS`); numbers and booleans by their
    text; bytes decoded leniently; any other object by its type name, so a hostile ``__str__`` is
    never called.
    """
    if isinstance(tool, str):
        name = tool
    elif isinstance(tool, (bool, int, float)):
        name = _number_text(tool)
    elif isinstance(tool, (bytes, bytearray)):
        name = bytes(tool[: MAX_TOOL_NAME_CHARS * 4]).decode("utf-8", "replace")
    elif tool is None:
        name = ""
    else:
        name = f"<{type(tool).__name__}>"
    return name[:MAX_TOOL_NAME_CHARS]


def _number_text(number: bool | int | float) -> str:
    """``repr`` of a number; integers too long for a decimal ``str`` (Python caps the digits)
    are given in hexadecimal, which has no such cap."""
    if isinstance(number, int) and not isinstance(number, bool) and number.bit_length() > 14_000:
        return f"0x{number:x}" if number >= 0 else f"-0x{-number:x}"
    return repr(number)


def _parse_json_string(text: str) -> object:
    """Parse ``text`` as JSON when it plausibly is JSON; otherwise return it unchanged."""
    if len(text) > MAX_PARSE_CHARS:
        return text
    stripped = text.lstrip()
    # Only containers and quoted strings are parsed: "42" or "true" given as a string stay strings,
    # so the raw text a model sent is compared as sent.
    if not stripped or stripped[0] not in '{["':
        return text
    if _long_digits().search(text) is None:  # orjson reads integers beyond 64 bits as floats
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    # Python's json keeps big integers exact and reads NaN/Infinity, as models may send them;
    # nesting too deep for it stays raw. Imported here: most calls never come this far.
    import json

    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _normalise(value: object, depth: int) -> object:
    """Turn ``value`` into plain JSON-able data (dict/list/str/int/float/bool/None), bounded.

    Used only when the fast path (orjson on the value as given) fails: unsupported types, non-str
    keys, integers beyond 64 bits, NaN, or nesting deeper than orjson allows.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        # orjson refuses lone surrogates (a JSON escape such as \ud800 decodes to one): keep
        # them as distinct escape text rather than failing the whole call.
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("ascii", "replace")
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else _number_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # NaN/inf as distinct strings
    if depth >= MAX_DEPTH:
        return {"$loopguard_truncated_depth": _digest(repr(type(value)).encode())}
    if isinstance(value, Mapping):
        return {_key_text(k): _normalise(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [_normalise(v, depth + 1) for v in value]
        return sorted(items, key=lambda item: orjson.dumps(item, option=_SORT))
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return f"<{type(value).__name__}>"


def _key_text(key: object) -> str:
    return key if isinstance(key, str) else tool_name(key)


def canonical_arguments(arguments: object, ignored_args: Iterable[str] = ()) -> object:
    """Return the canonical form of ``arguments`` (before serialisation).

    1. A JSON string is parsed (an unparsable one stays the raw string).
    2. If the result is an object, the top-level keys in ``ignored_args`` are dropped, unless
       nothing else would be left: a field that narrates a call is cosmetic beside fields that
       do something, but it is the whole call of a tool that takes only it (a ``think`` tool's
       ``thought``), and two different thoughts are two different calls.
    Nested values are left as they are; :func:`canonical_json` sorts keys at every depth.
    """
    value = _parse_json_string(arguments) if isinstance(arguments, str) else arguments
    # type() checks first: isinstance against the Mapping ABC costs more than the rest here.
    if (type(value) is dict or isinstance(value, Mapping)) and ignored_args:
        ignored = ignored_args if type(ignored_args) is frozenset else frozenset(ignored_args)
        if not ignored.isdisjoint(value):
            kept = {k: v for k, v in value.items() if k not in ignored}
            if kept:
                value = kept
    return value


def canonical_json(value: object) -> bytes:
    """Serialise canonical arguments to compact JSON with keys sorted at every depth.

    Never raises: values orjson cannot serialise as given take the bounded slow path.
    NaN and infinities become the strings ``"nan"``/``"inf"``/``"-inf"`` (JSON has no such numbers),
    so they stay distinct from ``null``.
    """
    try:
        data = orjson.dumps(value, option=_SORT)
    except (TypeError, orjson.JSONEncodeError, RecursionError):
        return orjson.dumps(_normalise(value, 0), option=_SORT)
    # (find, not ``in``: bytes' ``in`` tries the needle as an int first and clears a TypeError.)
    if data.find(b"null") >= 0 and _has_non_finite(value, 0):
        # orjson writes NaN/inf as null; take the slow path so they stay distinct.
        return orjson.dumps(_normalise(value, 0), option=_SORT)
    return data


def canonical_and_key(tool: str, value: object) -> tuple[bytes, str]:
    """``canonical_json(value)`` and :func:`args_key` of ``tool`` and it, in one call: the guard
    keys every call with this (the same bytes and key as the two, written out here since two
    calls cost a tenth of the rest)."""
    try:
        canonical = orjson.dumps(value, option=_SORT)
    except (TypeError, orjson.JSONEncodeError, RecursionError):
        canonical = canonical_json(value)
    else:
        if canonical.find(b"null") >= 0:
            canonical = canonical_json(value)  # NaN or an infinity, maybe: see canonical_json
    return canonical, xxh3_128_hexdigest(
        tool.encode("utf-8", "surrogatepass") + _SEPARATOR + canonical
    )


def _has_non_finite(value: object, depth: int) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if depth >= MAX_DEPTH:
        return False
    if isinstance(value, Mapping):
        return any(_has_non_finite(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_non_finite(v, depth + 1) for v in value)
    return False


def _digest(data: bytes) -> str:
    # XXH3-128: a 128-bit non-cryptographic hash, several times faster than blake2b on the
    # short inputs of the hot path. Keys only need to tell calls apart, not resist forgery: a
    # crafted collision could at worst make two different calls count as one.
    return xxh3_128_hexdigest(data)


def args_key(tool: str, canonical: bytes) -> str:
    """Return the 128-bit key (32 hex characters) of a tool name and its canonical arguments."""
    return xxh3_128_hexdigest(tool.encode("utf-8", "surrogatepass") + _SEPARATOR + canonical)


_OUTCOME_TYPES: Final = (str, bytes, bytearray, int, float, bool, Mapping, list, tuple)


def outcome_key(result: object, is_error: bool | None) -> str | None:
    """Return the key of a call's outcome, or ``None`` when nothing is known about it.

    The result is normalised like arguments (JSON strings parsed, keys sorted). An error without a
    result still has an outcome (``error``); a success without a result has none. A failure's
    text is compared without its volatile parts (:func:`failure_text`).
    """
    if result is None:
        return _digest(b"error") if is_error else None
    if not isinstance(result, _OUTCOME_TYPES):
        # An arbitrary object has no comparable value here: treat the outcome as unknown rather
        # than letting every object of one type look like "the same result".
        return _digest(b"error") if is_error else None
    prefix = b"E" if is_error else b"R"
    if is_error and type(result) is str:
        result = failure_text(result)
    if type(result) is str and (not result or (result[0] not in '{["' and not result[0].isspace())):
        # Plain text, the usual tool result, is not parsed: the same bytes as the general path,
        # without its checks (text orjson refuses, e.g. lone surrogates, takes that path).
        try:
            return xxh3_128_hexdigest(prefix + _SEPARATOR + orjson.dumps(result))
        except TypeError:
            pass
    canonical = canonical_json(canonical_arguments(result))
    return _digest(prefix + _SEPARATOR + canonical)


class ToolCall(FrozenRecord):
    """One tool-call attempt, reduced to what detection needs.

    ``args_key`` identifies tool + canonical arguments; ``outcome_key`` the normalised result or
    error (``None`` while unknown). ``canonical`` is kept so messages can preview the arguments.
    """

    __slots__ = (
        "tool",
        "canonical",
        "args_key",
        "session",
        "agent",
        "call_id",
        "is_error",
        "outcome_key",
        "duration_seconds",
    )

    tool: str
    canonical: bytes
    args_key: str
    session: str
    agent: str | None
    call_id: str | None
    is_error: bool | None
    outcome_key: str | None
    duration_seconds: float | None

    def __init__(
        self,
        tool: str,
        canonical: bytes,
        args_key: str,
        session: str,
        agent: str | None = None,
        call_id: str | None = None,
        is_error: bool | None = None,
        outcome_key: str | None = None,
        duration_seconds: float | None = None,
    ) -> None:
        object.__setattr__(self, "tool", tool)
        object.__setattr__(self, "canonical", canonical)
        object.__setattr__(self, "args_key", args_key)
        object.__setattr__(self, "session", session)
        object.__setattr__(self, "agent", agent)
        object.__setattr__(self, "call_id", call_id)
        object.__setattr__(self, "is_error", is_error)
        object.__setattr__(self, "outcome_key", outcome_key)
        object.__setattr__(self, "duration_seconds", duration_seconds)

    @property
    def signature(self) -> str:
        """The display prefix of ``args_key`` (:data:`SIGNATURE_CHARS` hex characters)."""
        return self.args_key[:SIGNATURE_CHARS]

    @classmethod
    def build(
        cls,
        tool: object,
        arguments: object,
        *,
        session: str,
        ignored_args: Iterable[str] = (),
        agent: str | None = None,
        call_id: str | None = None,
        is_error: bool | None = None,
        result: Any = None,
        duration_seconds: float | None = None,
    ) -> ToolCall:
        """Canonicalise ``arguments`` and derive the keys of one call."""
        name = tool_name(tool)
        canonical = canonical_json(canonical_arguments(arguments, ignored_args))
        return cls(
            tool=name,
            canonical=canonical,
            args_key=args_key(name, canonical),
            session=session,
            agent=agent,
            call_id=call_id,
            is_error=is_error,
            outcome_key=outcome_key(result, is_error),
            duration_seconds=duration_seconds,
        )
