"""``serve --state-dir DIR``: what the service accepted and decided survives a crash.

Two kinds of file in ``DIR`` (made ``0700``; one ``serve`` at a time, held by an exclusive
``flock`` on ``DIR/lock``):

- ``wal-<first sequence number>.log``, the write-ahead log: one frame per input, appended before
  the input is answered. A frame is ``<length, CRC-32, sequence number, clock time, kind>`` and
  its payload: an accepted batch of spans (``BATCH``: the decoded spans as plain data,
  :func:`batch_payload`), a decision API
  call (``DECISION``: its endpoint and JSON body) or an advisor's answer (``ADVICE``). Frames are
  written by one thread and made durable with ``fdatasync`` in groups (a group commit): every
  request that arrived while the previous group was being synced is in the next one, so a sync
  costs one disk round trip however many requests wait for it.
- ``snapshot``: the whole state at one point (the guard's sessions with their counts, epochs,
  cached advice and cooldowns; the hook-report ledger; the reminders held for command hooks; the
  trace buffer with its spans not yet judged and the span ids already seen), with the sequence
  numbers it covers. Written to a temporary file, synced and renamed over the old one; then the
  log starts a new file and the files the snapshot covers are deleted. Taken by the ingest thread
  every :data:`SNAPSHOT_INTERVAL_SECONDS` when anything changed (or :data:`SNAPSHOT_LOG_BYTES` of
  log), after a restart's replay, and at a clean stop.

On start the snapshot is loaded and every later frame is applied again, in the order it was
written, with the service's clock set to the frame's time (so TTLs and cooldowns run on from
where they were) and the advisor answering from the ``ADVICE`` frames (it is not asked again);
replay updates no metric and writes no decision line or trip line (they were made before the
crash). A torn last frame (the crash hit a write) ends the log; a damaged snapshot is moved aside
to ``snapshot.corrupt-<UTC time>`` with a note on stderr, and the log is replayed alone.

The snapshot and the log's batches are plain data (dicts, lists, tuples, strings, bytes,
numbers, booleans, ``None``: what :meth:`LoopGuard.snapshot
<otel_loopguard._guard.LoopGuard.snapshot>`, :meth:`TraceBuffer.snapshot
<otel_loopguard._traces.TraceBuffer.snapshot>`, the held reminders and each span's fields give),
pickled and read back by an unpickler that loads no class or function at all
(:func:`plain_loads`): reading a state directory cannot run code. The snapshot says its version
(:data:`SNAPSHOT_VERSION`). ``DIR`` is still refused when it, or the snapshot, belongs to another
user or can be written by group or others: another user could change what is counted.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import io
import os
import pickle
import stat
import struct
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from otel_loopguard._traces import OtlpSpans, RecordedSpan

__all__ = [
    "ADVICE",
    "BATCH",
    "DECISION",
    "SNAPSHOT_INTERVAL_SECONDS",
    "SNAPSHOT_LOG_BYTES",
    "SNAPSHOT_VERSION",
    "Gate",
    "Record",
    "Recovered",
    "ServiceClock",
    "StateDir",
    "StateError",
    "batch_of",
    "batch_payload",
    "plain_dumps",
    "plain_loads",
]

BATCH: Final = 1
DECISION: Final = 2
ADVICE: Final = 3

#: Seconds between snapshots while anything changes (the log between two is what a restart
#: replays).
SNAPSHOT_INTERVAL_SECONDS: Final = 30.0
#: Version of the snapshot's plain data (``"version"``); a snapshot of another is set aside.
SNAPSHOT_VERSION: Final = 1
#: Log bytes after which a snapshot is taken sooner.
SNAPSHOT_LOG_BYTES: Final = 64 * 1024 * 1024
#: Seconds a request waits for its frame to be synced before it is answered as a failure.
SYNC_TIMEOUT_SECONDS: Final = 10.0

_PREFIX: Final = struct.Struct("<II")  # payload length, CRC-32 of the head and the payload
_HEAD: Final = struct.Struct("<QdB")  # sequence number, clock time, kind
_FRAME_SIZE: Final = _PREFIX.size + _HEAD.size
_SNAPSHOT_MAGIC: Final = b"otel-loopguard snapshot 2\n"
_SNAPSHOT_HEAD: Final = struct.Struct("<QI")  # payload length, CRC-32 of the payload
_MAX_FRAME: Final = 1 << 31


class StateError(Exception):
    """The state directory cannot be used; the message names it and what went wrong."""


class ServiceClock:
    """The service's clock: monotonic, but anchored to the wall clock when the process started,
    so times kept in a snapshot mean the same after a restart (also after a reboot). While a
    restart replays the log it reads the time of the frame being applied (:meth:`pinned`)."""

    __slots__ = ("_offset", "_pinned")

    def __init__(self) -> None:
        self._offset = time.time() - time.monotonic()
        self._pinned: float | None = None

    def __call__(self) -> float:
        pinned = self._pinned
        return pinned if pinned is not None else time.monotonic() + self._offset

    def pin(self, value: float | None) -> None:
        self._pinned = value


class Gate:
    """Many decision calls at once (each applies its decision and logs it in one step), or one
    snapshot (which must see no decision half done)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if not self._shared:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self, timeout: float) -> Iterator[bool]:
        """Yields whether it got the gate within ``timeout`` (never keeping decisions waiting
        meanwhile: a decision that waits for its advisor holds the shared side for seconds)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._shared:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            got = not self._shared
            if got:
                self._exclusive = True
        try:
            yield got
        finally:
            if got:
                with self._cond:
                    self._exclusive = False
                    self._cond.notify_all()


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    time: float
    kind: int
    payload: bytes


@dataclass
class Recovered:
    """What a state directory held at start."""

    snapshot: dict[str, Any] | None = None
    records: list[Record] = field(default_factory=list)
    next_seq: int = 1
    notes: list[str] = field(default_factory=list)


def layout() -> str:
    """What the files of a state directory depend on, beyond the versions the snapshot's parts
    carry (each part refuses another version of its own, and the snapshot is then set aside):
    the snapshot's :data:`SNAPSHOT_VERSION` and the fields of a recorded span (the log's
    batches, :func:`batch_payload`). No private attribute of any class: renaming one changes
    nothing here. A directory written with another layout is set aside, not loaded
    (:meth:`StateDir.recover`)."""
    import hashlib

    fields = ",".join(_SPAN_FIELDS)
    return f"state-{SNAPSHOT_VERSION}:{hashlib.sha256(fields.encode()).hexdigest()[:16]}"


def _utc_stamp() -> str:
    """A UTC time and this process's id: two set-asides never take the same name."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"


class StateDir:
    """The state directory: :meth:`recover` reads it, :meth:`open_log` starts logging,
    :meth:`append` / :meth:`wait` log and sync, :meth:`write_snapshot` compacts."""

    def __init__(self, path: str, *, on_error: Callable[[OSError], None] | None = None) -> None:
        self.path = Path(path).expanduser()
        self._on_error = on_error
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"state_dir: cannot create {str(self.path)!r}: {exc}") from None
        self._check_trusted(self.path, "it")
        try:
            self._lock_fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StateError(f"state_dir: cannot write in {str(self.path)!r}: {exc}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StateError(
                    f"state_dir: {str(self.path)!r} is in use by another otel-loopguard serve"
                ) from None
            raise StateError(f"state_dir: cannot lock {str(self.path)!r}: {exc}") from None
        self._cond = threading.Condition()
        self._io = threading.Lock()
        self._pending: list[bytes] = []
        self._appended = 0  # last sequence number appended
        self._settled = 0  # last sequence number whose write ended (synced, or failed)
        self._failures: deque[tuple[int, int]] = deque(maxlen=64)  # (first, last) not written
        self._broken = False  # the last write failed: the next group starts a new file
        self._closing = False
        self._fd: int | None = None
        self._segments: deque[int] = deque()  # each log file's first sequence number, oldest first
        self.log_bytes = 0  # since the last snapshot
        self._thread: threading.Thread | None = None

    # -- reading what is there -------------------------------------------------------------

    def _check_trusted(self, path: Path, what: str) -> None:
        try:
            info = path.stat()
        except OSError as exc:
            raise StateError(f"state_dir: cannot read {str(path)!r}: {exc}") from None
        if info.st_uid != os.geteuid():
            raise StateError(
                f"state_dir: {str(path)!r} belongs to another user (uid {info.st_uid}); it"
                f" decides what is counted, so {what} must be this user's"
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise StateError(
                f"state_dir: {str(path)!r} can be written by group or others; it decides what"
                f" is counted (chmod go-w it)"
            )

    def _segment_files(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.path.glob("wal-*.log"):
            digits = path.name[4:-4]
            if digits.isdigit():
                found.append((int(digits), path))
        return sorted(found)

    def recover(self) -> Recovered:
        """The snapshot (None without one) and every log frame, in order; a torn last frame
        ends the log (the file is cut there). State written with another :func:`layout` is
        moved to ``DIR/previous-<UTC time>/`` with a note, and not loaded."""
        out = Recovered()
        self._set_aside_other_layout(out)
        snapshot_path = self.path / "snapshot"
        if snapshot_path.exists():
            self._check_trusted(snapshot_path, "the snapshot")
            try:
                out.snapshot = _read_snapshot(snapshot_path)
            except Exception as exc:  # any unpickling error: damaged
                out.notes.append(self.set_aside_snapshot(exc))
        if out.snapshot is not None:
            out.next_seq = int(out.snapshot["next_seq"])
        segments = self._segment_files()
        for index, (first, path) in enumerate(segments):
            self._segments.append(first)
            last = index == len(segments) - 1
            good, problem = _read_frames(path, out.records)
            if problem is not None:
                if last:
                    with open(path, "r+b") as file:
                        file.truncate(good)
                        os.fsync(file.fileno())
                    out.notes.append(f"log {str(path)!r}: {problem}; cut at byte {good:,}")
                else:
                    out.notes.append(
                        f"log {str(path)!r}: {problem} at byte {good:,}; the rest of that file"
                        f" is skipped"
                    )
        if out.records:
            out.next_seq = max(out.next_seq, out.records[-1].seq + 1)
        return out

    def _set_aside_other_layout(self, out: Recovered) -> None:
        marker = self.path / "layout"
        ours = layout()
        try:
            theirs = marker.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            theirs = None
        except (OSError, UnicodeDecodeError) as exc:
            raise StateError(f"state_dir: cannot read {str(marker)!r}: {exc}") from None
        kept = [
            path
            for path in self.path.iterdir()
            if path.name == "snapshot" or (path.name.startswith("wal-") and path.suffix == ".log")
        ]
        if theirs != ours and kept:
            aside = self.path / f"previous-{_utc_stamp()}"
            aside.mkdir(mode=0o700)
            for path in kept:
                os.replace(path, aside / path.name)
            out.notes.append(
                f"the state in {str(self.path)!r} was written by another version"
                f" ({theirs or 'unknown'}; this is {ours}): moved to {str(aside)!r}, not loaded"
                f" (counts start afresh)"
            )
        if theirs != ours:
            temporary = self.path / "layout.tmp"
            temporary.write_text(ours + "\n", encoding="utf-8")
            os.replace(temporary, marker)
            _sync_directory(self.path)

    def set_aside_snapshot(self, problem: object) -> str:
        """Move a snapshot that cannot be used to ``snapshot.corrupt-<UTC time>``; the note."""
        path = self.path / "snapshot"
        aside = path.with_name(f"snapshot.corrupt-{_utc_stamp()}")
        os.replace(path, aside)
        return (
            f"snapshot {str(path)!r} cannot be read ({problem}); moved to {str(aside)!r};"
            f" replaying the log alone (the counts it held are lost)"
        )

    # -- logging ---------------------------------------------------------------------------

    def open_log(self, next_seq: int) -> None:
        """Start a new log file at ``next_seq`` and the syncing thread."""
        self._appended = self._settled = next_seq - 1
        self._fd = self._new_segment(next_seq)
        self._thread = threading.Thread(target=self._sync_loop, name="loopguard-wal", daemon=True)
        self._thread.start()

    def _new_segment(self, first: int) -> int:
        path = self.path / f"wal-{first:020d}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        _sync_directory(self.path)
        if not self._segments or self._segments[-1] != first:
            self._segments.append(first)
        return fd

    def append(
        self, kind: int, when: float, payload: bytes, admit: Callable[[int], bool] | None = None
    ) -> int:
        """Queue one frame; its sequence number (wait for it with :meth:`wait`). With ``admit``,
        the frame is queued only if ``admit(its sequence number)`` says so, in the same step
        (0 is returned when it does not): the ingest queue's order is the log's."""
        with self._cond:
            seq = self._appended + 1
            if admit is not None and not admit(seq):
                return 0
            self._appended = seq
            head = _HEAD.pack(seq, when, kind)
            crc = zlib.crc32(payload, zlib.crc32(head))
            self._pending.append(_PREFIX.pack(len(payload), crc) + head)
            self._pending.append(payload)
            self.log_bytes += _FRAME_SIZE + len(payload)
            self._cond.notify_all()
        return seq

    @property
    def appended(self) -> int:
        return self._appended

    def covered(self, first_unapplied: Callable[[], int | None]) -> tuple[int, int | None]:
        """The last sequence number appended and ``first_unapplied()``, read in one step (no
        frame appended between them)."""
        with self._cond:
            return self._appended, first_unapplied()

    def wait(self, seq: int, timeout: float = SYNC_TIMEOUT_SECONDS) -> bool:
        """Whether frame ``seq`` is synced: False when its write failed or took past
        ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._settled < seq:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return not any(low <= seq <= high for low, high in self._failures)

    def _sync_loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
            with self._io:  # not held while waiting: a snapshot's rotation takes it
                with self._cond:
                    if not self._pending:
                        continue  # the rotation wrote them
                    data = b"".join(self._pending)
                    self._pending.clear()
                    first, upto = self._settled + 1, self._appended
                error = self._write_group(first, data)
                self._settle(first, upto, error)

    def _write_group(self, first: int, data: bytes) -> OSError | None:
        """Write and sync one group (under ``_io``). After a failed write the file may end in
        a torn frame, which would hide every later frame from a replay: the next group starts a
        new file."""
        if self._broken:
            try:
                fd = self._new_segment(first)
            except OSError as exc:
                return exc
            old, self._fd = self._fd, fd
            self._broken = False
            if old is not None:
                os.close(old)
        error = self._write(self._fd, data)
        if error is not None:
            self._broken = True
        return error

    def _settle(self, first: int, upto: int, error: OSError | None) -> None:
        with self._cond:
            self._settled = max(self._settled, upto)
            if error is not None:
                self._failures.append((first, upto))
            self._cond.notify_all()
        if error is not None and self._on_error is not None:
            self._on_error(error)

    def _write(self, fd: int | None, data: bytes) -> OSError | None:
        if fd is None:
            return OSError(errno.EBADF, "the log is closed")
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fdatasync(fd)
        except OSError as exc:
            return exc
        return None

    # -- snapshots -------------------------------------------------------------------------

    def write_snapshot(self, state: dict[str, Any], covered: int, keep_after: int) -> None:
        """Write ``state`` (every frame up to ``covered`` applied in it, but the batches after
        ``keep_after``), start a new log file, and delete the files that hold nothing after
        ``keep_after``. ``OSError`` when it cannot be written, ``ValueError`` when ``state`` is
        not plain data (:func:`plain_dumps`; the old snapshot and the log stay as they were)."""
        state = {**state, "next_seq": covered + 1, "covered": covered}
        payload = plain_dumps(state)
        temporary = self.path / "snapshot.tmp"
        with open(temporary, "wb") as file:
            os.fchmod(file.fileno(), 0o600)
            file.write(_SNAPSHOT_MAGIC)
            file.write(_SNAPSHOT_HEAD.pack(len(payload), zlib.crc32(payload)))
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path / "snapshot")
        _sync_directory(self.path)
        self._rotate()
        while len(self._segments) > 1 and self._segments[1] <= keep_after + 1:
            first = self._segments.popleft()
            try:
                os.unlink(self.path / f"wal-{first:020d}.log")
            except FileNotFoundError:
                pass

    def _rotate(self) -> None:
        """Sync what is pending into the current file, then log into a new one."""
        with self._io:
            with self._cond:
                data = b"".join(self._pending)
                self._pending.clear()
                first, upto = self._settled + 1, self._appended
            error = self._write_group(first, data) if data else None
            self._settle(first, upto, error)
            if self._segments[-1] != upto + 1:
                fd = self._new_segment(upto + 1)
                old, self._fd = self._fd, fd
                self._broken = False
                if old is not None:
                    os.close(old)
            with self._cond:
                self.log_bytes = 0

    def close(self) -> None:
        """Sync what is pending and stop; releases the directory."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(SYNC_TIMEOUT_SECONDS)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        os.close(self._lock_fd)


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_snapshot(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    if not data.startswith(_SNAPSHOT_MAGIC):
        raise ValueError("not an otel-loopguard snapshot (or another version)")
    start = len(_SNAPSHOT_MAGIC) + _SNAPSHOT_HEAD.size
    if len(data) < start:
        raise ValueError("truncated")
    length, crc = _SNAPSHOT_HEAD.unpack_from(data, len(_SNAPSHOT_MAGIC))
    payload = data[start:]
    if len(payload) != length or zlib.crc32(payload) != crc:
        raise ValueError("damaged (length or checksum)")
    state = plain_loads(payload)
    if not isinstance(state, dict) or "next_seq" not in state:
        raise ValueError("no state in it")
    return state


_PLAIN: Final = (dict, list, tuple, str, bytes, int, float, bool, type(None))


def plain_dumps(data: object) -> bytes:
    """``data``, plain data only (dicts, lists, tuples, strings, bytes, numbers, booleans,
    ``None``), as a pickle :func:`plain_loads` reads. ``ValueError`` naming the first value of
    another type (its path from the top)."""
    _check_plain(data, "snapshot")
    return pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)


def _check_plain(value: object, path: str) -> None:
    kind = type(value)
    if kind not in _PLAIN:
        raise ValueError(f"{path}: {kind.__name__} is not plain data")
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            _check_plain(key, f"{path} key")
            _check_plain(item, f"{path}[{key!r:.40}]")
    elif kind is list or kind is tuple:
        for index, item in enumerate(value):  # type: ignore[arg-type]
            _check_plain(item, f"{path}[{index}]")


class _PlainUnpickler(pickle.Unpickler):
    """Loads no global: a pickle that names any class or function (the only way a pickle runs
    code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise ValueError(f"not plain data: the snapshot names {module}.{name}")


def plain_loads(payload: bytes) -> Any:
    """A :func:`plain_dumps` pickle back; ``ValueError`` for one that names a class or
    function (or any damage)."""
    try:
        return _PlainUnpickler(io.BytesIO(payload)).load()
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"not a plain-data pickle ({type(exc).__name__}: {exc})") from None


def _read_frames(path: Path, into: list[Record]) -> tuple[int, str | None]:
    """Append the frames of one log file to ``into``; (bytes read in good frames, what ended
    it early or None)."""
    data = path.read_bytes()
    offset = 0
    size = _FRAME_SIZE
    while offset < len(data):
        if len(data) - offset < size:
            return offset, "torn frame header"
        length, crc = _PREFIX.unpack_from(data, offset)
        head = data[offset + _PREFIX.size : offset + size]
        seq, when, kind = _HEAD.unpack(head)
        end = offset + size + length
        if length > _MAX_FRAME or end > len(data):
            return offset, "torn frame"
        payload = data[offset + size : end]
        if zlib.crc32(payload, zlib.crc32(head)) != crc:
            return offset, "damaged frame (checksum)"
        if kind not in (BATCH, DECISION, ADVICE):
            return offset, f"unknown frame kind {kind}"
        into.append(Record(seq, when, kind, payload))
        offset = end
    return offset, None


def note(text: str) -> None:
    """One line on stderr about the state directory."""
    print(f"otel-loopguard serve: state_dir: {text}", file=sys.stderr, flush=True)


#: A recorded span's fields, in order: how a batch's spans are written in the log.
_SPAN_FIELDS: Final = tuple(item.name for item in dataclasses.fields(RecordedSpan))


def batch_payload(read: OtlpSpans) -> bytes:
    """An accepted batch for the log (``BATCH``): its spans' fields, problems, bad-span count
    and parent links, as plain data (:func:`batch_of` reads it)."""
    spans = [tuple(getattr(span, name) for name in _SPAN_FIELDS) for span in read.spans]
    data = (spans, read.problems, read.bad_spans, read.links)
    return pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)


def batch_of(payload: bytes) -> OtlpSpans:
    """A :func:`batch_payload` back; ``ValueError`` for anything else."""
    try:
        spans, problems, bad_spans, links = plain_loads(payload)
        return OtlpSpans(
            [RecordedSpan(*row) for row in spans],
            [str(problem) for problem in problems],
            int(bad_spans),
            [(int(a), int(b), None if c is None else int(c), bool(d)) for a, b, c, d in links],
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a logged batch ({exc})") from None
