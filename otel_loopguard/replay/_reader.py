"""Reading input files: JSON lines to events through a file's format, bad-line reporting, and
the progress bar."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Final, TextIO

import orjson

from ..spans import KeyBy
from ..traces import BadSpan
from ._events import BadRecord, Event, InputFormat
from ._formats import detect_format

#: Input above this many bytes (regular files) shows a progress bar when stderr is a terminal.
LARGE_INPUT_BYTES: Final = 5 * 1024 * 1024
#: Input above this many lines (e.g. a pipe of unknown size) shows a progress line likewise.
LARGE_INPUT_LINES: Final = 50_000
#: Bad lines printed per file; the rest are only counted.
MAX_REPORTED_BAD_LINES: Final = 20
#: Records looked at to pick a file's format.
SNIFF_RECORDS: Final = 32

_PROGRESS_INTERVAL_SECONDS: Final = 0.2


def _parse(line: bytes) -> object:
    """Parse one JSON line; raises :class:`BadRecord` with a readable reason."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    # orjson rejects some valid JSON (integers beyond 64 bits, NaN); the standard parser decides,
    # and its message is the clearer one.
    try:
        text = line.decode("utf-8")  # decoded here: json.loads would guess UTF-16/32 from bytes
    except UnicodeDecodeError as exc:
        raise BadRecord(f"not UTF-8 text ({exc.reason} at byte {exc.start + 1})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRecord(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise BadRecord("not readable JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. integer text past the interpreter's digit limit
        raise BadRecord(f"not readable JSON ({exc})") from None


class _Progress:
    """A one-line progress bar on a terminal's stderr; silent until the input proves large."""

    def __init__(
        self,
        stream: TextIO,
        total_bytes: int | None,
        enabled: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._total = total_bytes
        self._enabled = enabled
        self._clock = clock
        self._bytes = 0
        self._lines = 0
        self._shown = False
        self._next_draw = 0.0
        self._name = ""

    def start_file(self, name: str) -> None:
        self._name = name

    def advance(self, nbytes: int) -> None:
        self._bytes += nbytes
        self._lines += 1
        if not self._enabled or self._lines & 0xFF:
            return  # checking the clock every 256 lines keeps the bar off the hot path
        now = self._clock()
        if now < self._next_draw:
            return
        if not (
            self._shown or self._lines > LARGE_INPUT_LINES or (self._total or 0) > LARGE_INPUT_BYTES
        ):
            return
        self._next_draw = now + _PROGRESS_INTERVAL_SECONDS
        self._draw()

    def _draw(self) -> None:
        name = self._name if len(self._name) <= 30 else "…" + self._name[-29:]
        if self._total:
            fraction = min(1.0, self._bytes / self._total)
            filled = int(fraction * 30)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%}"
        else:
            bar = f"{self._bytes / 1e6:,.1f} MB"
        self._stream.write(f"\r{bar}  {self._lines:,} lines  {name}\x1b[K")
        self._stream.flush()
        self._shown = True

    def clear(self) -> None:
        """Erase the bar (before another message is written to the same stream)."""
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._shown = False
            self._next_draw = 0.0


@dataclass(slots=True)
class _BadLines:
    """Reports bad lines on stderr (the first few per file) and counts them all."""

    stream: TextIO
    progress: _Progress
    total: int = 0
    per_file: dict[str, int] = field(default_factory=dict)
    unreadable_files: int = 0

    def bad(self, name: str, lineno: int, reason: str) -> None:
        self.total += 1
        seen = self.per_file.get(name, 0) + 1
        self.per_file[name] = seen
        if seen <= MAX_REPORTED_BAD_LINES:
            self.progress.clear()
            self.stream.write(f"{name}:{lineno}: {reason}\n")

    def unreadable(self, name: str, reason: str) -> None:
        self.unreadable_files += 1
        self.progress.clear()
        self.stream.write(f"{name}: cannot read: {reason}\n")

    def end_file(self, name: str) -> None:
        hidden = self.per_file.get(name, 0) - MAX_REPORTED_BAD_LINES
        if hidden > 0:
            self.progress.clear()
            lines = "line" if hidden == 1 else "lines"
            self.stream.write(f"{name}: {hidden} more bad {lines} not shown\n")


def _read_events(
    name: str,
    handle: IO[bytes],
    fmt: InputFormat | None,
    bad: _BadLines,
    progress: _Progress,
    key_by: KeyBy = KeyBy.TRACE,
) -> Iterator[Event]:
    """Yield the events of one open file, reporting bad lines to ``bad``."""
    progress.start_file(name)
    lines = enumerate(handle, start=1)
    # Parse the first records ahead to sniff the format, then replay them in order.
    head: list[tuple[int, object, str | None]] = []
    if fmt is None:
        records = 0
        for lineno, line in lines:
            progress.advance(len(line))
            if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
            if not line.strip():
                continue
            try:
                head.append((lineno, _parse(line), None))
                records += 1
            except BadRecord as exc:
                head.append((lineno, None, str(exc)))
            if records >= SNIFF_RECORDS:
                break
        fmt = detect_format(record for _, record, problem in head if problem is None)
    decoder = fmt.decoder(key_by=key_by) if fmt.traces else fmt.decoder()

    def decode(lineno: int, record: object) -> Iterable[Event]:
        try:
            return decoder.decode(record)
        except BadSpan as exc:  # a BadRecord, or a span a shared decoder rejected
            bad.bad(name, lineno, str(exc))
            return exc.events if isinstance(exc, BadRecord) else ()
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            # A shape no check foresaw is still only one bad line, never a crash.
            bad.bad(name, lineno, f"unexpected record shape ({type(exc).__name__}: {exc})")
        return ()

    for lineno, record, problem in head:
        if problem is not None:
            bad.bad(name, lineno, problem)
        else:
            yield from decode(lineno, record)
    for lineno, line in lines:
        progress.advance(len(line))
        if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        if not line.strip():
            continue
        try:
            record = _parse(line)
        except BadRecord as exc:
            bad.bad(name, lineno, str(exc))
            continue
        yield from decode(lineno, record)
    yield from decoder.finish()
