"""Reading input files: JSON lines to events through a file's format, bad-line reporting, and
the progress bar (tqdm, imported only when a bar is shown)."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final, TextIO

import orjson

from .._otlp_json import BadSpan
from .._spans import KeyBy
from ._events import BadRecord, Event, InputFormat
from ._formats import detect_format

#: Input above this many bytes (regular files) shows a progress bar when stderr is a terminal.
LARGE_INPUT_BYTES: Final = 5 * 1024 * 1024
#: Input above this many lines (e.g. a pipe of unknown size) shows a progress bar likewise.
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
    """A tqdm progress bar on a terminal's stderr, silent until the input proves large: over
    :data:`LARGE_INPUT_BYTES` in all (regular files), or past :data:`LARGE_INPUT_LINES` lines (a
    pipe of unknown size). tqdm is imported only when the bar is first drawn."""

    def __init__(self, stream: TextIO, total_bytes: int | None, enabled: bool) -> None:
        self._stream = stream
        self._total = total_bytes
        self._enabled = enabled
        self._bytes = 0
        self._lines = 0
        self._reported = 0  # bytes already given to the bar
        self._bar: Any = None
        self._name = ""

    def start_file(self, name: str) -> None:
        self._name = name
        if self._bar is not None:
            self._bar.set_description_str(_short(name), refresh=False)

    def advance(self, nbytes: int) -> None:
        self._bytes += nbytes
        self._lines += 1
        if not self._enabled or self._lines & 0xFF:
            return  # the bar is updated every 256 lines: it stays off the hot path
        if self._bar is None:
            if self._lines > LARGE_INPUT_LINES or (self._total or 0) > LARGE_INPUT_BYTES:
                self._bar = self._open()  # drawn at once, with what was read so far
        else:
            self._bar.set_postfix_str(f"{self._lines:,} lines", refresh=False)
            self._bar.update(self._bytes - self._reported)
        self._reported = self._bytes

    def _open(self) -> Any:
        from tqdm import tqdm  # type: ignore[import-untyped]  # no types-tqdm here

        columns, rows = _screen(self._stream)
        return tqdm(
            total=self._total or None,
            initial=self._bytes,
            postfix=f"{self._lines:,} lines",
            desc=_short(self._name),
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=self._stream,
            leave=False,
            ncols=columns,
            nrows=rows,
            mininterval=_PROGRESS_INTERVAL_SECONDS,
        )

    def clear(self) -> None:
        """Erase the bar (before another message is written to the same stream); it is drawn
        again at its next update."""
        if self._bar is not None:
            self._bar.clear()

    def close(self) -> None:
        """Erase the bar for good (at the end of the input)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _screen(stream: TextIO) -> tuple[int, int]:
    """The terminal's columns and rows; 80 and 24 when it does not say. A new pseudo-terminal
    says 0 and 0, and with 0 rows tqdm draws nothing."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return 80, 24
    return size.columns or 80, size.lines or 24


def _short(name: str) -> str:
    """A file's name (not its directory), cut to 24 characters."""
    name = os.path.basename(name) or name
    return name if len(name) <= 24 else name[:23] + "…"


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
        head = _sniff(lines, progress)
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
    for lineno, line in _records(lines, progress):
        try:
            record = _parse(line)
        except BadRecord as exc:
            bad.bad(name, lineno, str(exc))
            continue
        yield from decode(lineno, record)
    yield from decoder.finish()


def _records(
    lines: Iterator[tuple[int, bytes]], progress: _Progress
) -> Iterator[tuple[int, bytes]]:
    """The numbered lines that are not blank, a byte-order mark cut from the first, each counted
    by ``progress`` as it is read."""
    for lineno, line in lines:
        progress.advance(len(line))
        if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        if line.strip():
            yield lineno, line


def _sniff(
    lines: Iterator[tuple[int, bytes]], progress: _Progress
) -> list[tuple[int, object, str | None]]:
    """The first records read ahead to sniff the format (up to :data:`SNIFF_RECORDS` parsed),
    each ``(line number, record, None)`` or ``(line number, None, problem)``."""
    head: list[tuple[int, object, str | None]] = []
    records = 0
    for lineno, line in _records(lines, progress):
        try:
            head.append((lineno, _parse(line), None))
            records += 1
        except BadRecord as exc:
            head.append((lineno, None, str(exc)))
        if records >= SNIFF_RECORDS:
            break
    return head
