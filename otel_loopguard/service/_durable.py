"""``serve --state-dir DIR``: what the service accepted and decided survives a crash.

Two kinds of file in ``DIR`` (``0700``; one ``serve`` at a time, held by an exclusive ``flock``
on ``DIR/lock``):

- ``wal-<first sequence number>.log``, the write-ahead log. A header (``otel-loopguard log 2``
  and a random 16-byte key of that file), then one frame per input, appended before the input
  is answered: a marker, the payload's length, a 64-bit BLAKE2b digest keyed with the file's key,
  the sequence number, the clock time, the kind, and the payload: an accepted batch of spans
  (``BATCH``: the decoded spans as plain data, :func:`batch_payload`), a decision API call
  (``DECISION``: its endpoint and JSON body, logged and synced *before* it is applied), an
  advisor's answer (``ADVICE``), or a judgement of the hold timer (``TICK``: the time it ran and
  the last batch the ingest thread had added then). Frames are written by one thread and made
  durable with ``fdatasync`` in groups (a group commit): every request that arrived while the
  previous group was being synced is in the next one, so a sync costs one disk round trip
  however many requests wait for it. A group that cannot be written (a full disk) is cut off
  again (``ftruncate`` to the last synced byte), so the file ends in whole frames and the next
  group goes on in the same file.
- ``snapshot``: the whole state at one point (the guard's sessions with their counts, epochs,
  cached advice and cooldowns; the hook-report ledger; the reminders held for command hooks; the
  trace buffer with its spans not yet judged and the span ids already seen), with the sequence
  numbers it covers. Written to a temporary file, synced and renamed over the old one; then the
  log starts a new file and the files the snapshot covers are deleted. Taken by the ingest thread
  every :data:`SNAPSHOT_INTERVAL_SECONDS` when anything changed (or :data:`SNAPSHOT_LOG_BYTES` of
  log), after a restart's replay, and at a clean stop.

On start the snapshot is loaded and every later frame is applied again, with the service's clock
set to the frame's time (so TTLs and cooldowns run on from where they were, and the hold timer
judges the same spans at the same time) and the advisor answering from the ``ADVICE`` frames (it
is not asked again); replay updates no metric and writes no decision line or trip line (they
were made before the crash). A torn last frame (the crash hit a write) ends the log; a damaged
stretch in the middle of a file is skipped and reported (where, how many bytes, and the sequence
numbers lost) and the frames after it whose digests hold are recovered; a damaged snapshot is
moved aside to ``snapshot.corrupt-<UTC time>`` with a note on stderr, and the log is replayed
alone.

Nothing in ``DIR`` can run code: the snapshot and the batches are encoded by :func:`plain_dumps`,
a data-only format of this module (tagged values: ``None``, booleans, integers of any size,
floats, strings, bytes, lists, tuples, dicts; nothing else can be written or read, nesting is
bounded, and every length is checked), decisions and advice are JSON; no ``pickle``, ``marshal``
or ``eval`` reads anything. ``DIR`` and every file in it are opened without following symbolic
links (``O_NOFOLLOW``; the files relative to the directory's descriptor) and checked on the
opened descriptor: ``DIR`` must belong to the serving user (group and other permissions are
taken away, with a note), each file must be a regular file of that user not writable by group or
others; else ``serve`` refuses to start, naming the file. The state of the release before this
format (pickled: layout ``state-1:...``) is not read: ``serve`` refuses to start and says how to
start fresh (move or delete ``DIR``).
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import fcntl
import hashlib
import os
import stat
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from otel_loopguard._otlp_json import OtlpSpans, RecordedSpan
from otel_loopguard._trace_events import CallObserved

from ._otlp_logs import LogCalls

__all__ = [
    "ADVICE",
    "BATCH",
    "DECISION",
    "SNAPSHOT_INTERVAL_SECONDS",
    "SNAPSHOT_LOG_BYTES",
    "SNAPSHOT_VERSION",
    "STATE_FORMAT",
    "TICK",
    "Gate",
    "Record",
    "Recovered",
    "ServiceClock",
    "StateDir",
    "StateError",
    "batch_of",
    "batch_payload",
    "layout",
    "plain_dumps",
    "plain_loads",
]

BATCH: Final = 1
DECISION: Final = 2
ADVICE: Final = 3
TICK: Final = 4
_KINDS: Final = frozenset({BATCH, DECISION, ADVICE, TICK})

#: Seconds between snapshots while anything changes (the log between two is what a restart
#: replays).
SNAPSHOT_INTERVAL_SECONDS: Final = 30.0
#: Version of the snapshot's plain data (``"version"``); a snapshot of another is set aside.
SNAPSHOT_VERSION: Final = 1
#: Version of the files' encoding (the log's frames, the snapshot's container,
#: :func:`plain_dumps`). Format 1 was pickled; it is refused, not read.
STATE_FORMAT: Final = 2
#: Log bytes after which a snapshot is taken sooner.
SNAPSHOT_LOG_BYTES: Final = 64 * 1024 * 1024
#: Seconds a request waits for its frame to be synced before it is answered as a failure.
SYNC_TIMEOUT_SECONDS: Final = 10.0

_LOG_MAGIC: Final = b"otel-loopguard log 2\n"
_KEY_SIZE: Final = 16
_LOG_HEADER_SIZE: Final = len(_LOG_MAGIC) + _KEY_SIZE
_FRAME_MARK: Final = b"\xf7LGf"
_PREFIX: Final = struct.Struct("<4sI8s")  # marker, payload length, keyed digest
_HEAD: Final = struct.Struct("<QdB")  # sequence number, clock time, kind
_FRAME_SIZE: Final = _PREFIX.size + _HEAD.size
_MAX_FRAME: Final = 1 << 31
_SNAPSHOT_MAGIC: Final = b"otel-loopguard snapshot 3\n"
_SNAPSHOT_HEAD: Final = struct.Struct("<Q32s")  # payload length, BLAKE2b-256 of the payload
#: The layout marker's prefix of format 1 (pickled): refused with a message.
_PICKLED_LAYOUT: Final = "state-1:"
_NOFOLLOW: Final = os.O_NOFOLLOW | os.O_CLOEXEC


class StateError(Exception):
    """The state directory cannot be used, or a decision cannot be logged; the message names
    it and what went wrong."""


class ServiceClock:
    """The service's clock: monotonic, but anchored to the wall clock when the process started,
    so times kept in a snapshot mean the same after a restart (also after a reboot). While a
    restart replays the log it reads the time of the frame being applied (:meth:`pin`, for every
    thread); a thread applying one logged input reads that input's logged time
    (:meth:`pinned_here`), so the replay sees the same times."""

    __slots__ = ("_here", "_offset", "_pinned")

    def __init__(self) -> None:
        self._offset = time.time() - time.monotonic()
        self._pinned: float | None = None
        self._here = threading.local()

    def __call__(self) -> float:
        pinned = self._pinned
        if pinned is None:
            pinned = getattr(self._here, "time", None)
        return pinned if pinned is not None else time.monotonic() + self._offset

    def pin(self, value: float | None) -> None:
        self._pinned = value

    @contextmanager
    def pinned_here(self, value: float) -> Iterator[None]:
        """This thread reads ``value`` while inside."""
        here = self._here
        before = getattr(here, "time", None)
        here.time = value
        try:
            yield
        finally:
            here.time = before


class Gate:
    """Many decision calls at once (each logs its decision and applies it in one step), or one
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
    #: Damaged stretches found in the log (skipped; the good frames after each recovered).
    damaged: int = 0


def layout() -> str:
    """What the files of a state directory depend on, beyond the versions the snapshot's parts
    carry (each part refuses another version of its own, and the snapshot is then set aside):
    the files' :data:`STATE_FORMAT`, the snapshot's :data:`SNAPSHOT_VERSION` and the fields of a
    recorded span (the log's batches, :func:`batch_payload`). No private attribute of any class:
    renaming one changes nothing here. A directory written with another layout is set aside, not
    loaded (:meth:`StateDir.recover`); one of format 1 (pickled) is refused."""
    fields = ",".join(_SPAN_FIELDS)
    digest = hashlib.sha256(f"{SNAPSHOT_VERSION}:{fields}".encode()).hexdigest()[:16]
    return f"state-{STATE_FORMAT}:{digest}"


def _utc_stamp() -> str:
    """A UTC time and this process's id: two set-asides never take the same name."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"


def _digest(key: bytes, data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=8, key=key).digest()


class StateDir:
    """The state directory: :meth:`recover` reads it, :meth:`open_log` starts logging,
    :meth:`append` / :meth:`wait` log and sync, :meth:`write_snapshot` compacts.

    ``DIR`` is opened once, without following a symbolic link, and every file in it is opened
    relative to that descriptor (``dir_fd``) without following one either: a path flipped to
    another directory after the start changes nothing. ``notes`` says what opening it changed
    (its mode tightened to ``0700``)."""

    def __init__(self, path: str, *, on_error: Callable[[OSError], None] | None = None) -> None:
        self.path = Path(path).expanduser()
        self._on_error = on_error
        self.notes: list[str] = []
        self._dir = _open_directory(self.path, self.notes)
        try:
            self._lock_fd = self._open_trusted("lock", os.O_RDWR | os.O_CREAT)
        except BaseException:
            os.close(self._dir)
            raise
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            os.close(self._dir)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StateError(
                    f"state_dir: {str(self.path)!r} is in use by another otel-loopguard serve"
                ) from None
            raise StateError(f"state_dir: cannot lock {str(self.path)!r}: {exc}") from None
        self._cond = threading.Condition()
        self._io = threading.Lock()
        self._pending_frames: list[tuple[int, float, int, bytes]] = []
        self._appended = 0  # last sequence number appended
        self._settled = 0  # last sequence number whose write ended (synced, or failed)
        self._failures: deque[tuple[int, int]] = deque(maxlen=64)  # (first, last) not written
        self._broken: int | None = None  # a write failed and could not be cut off: new file
        self._closing = False
        self._fd: int | None = None
        self._key = b""
        self._size = 0  # bytes of the current file synced (whole frames)
        self._segments: deque[int] = deque()  # each log file's first sequence number, oldest first
        self.log_bytes = 0  # since the last snapshot
        self._thread: threading.Thread | None = None

    # -- files -----------------------------------------------------------------------------

    def _where(self, name: str) -> str:
        return repr(str(self.path / name))

    def _open_trusted(self, name: str, flags: int, create_mode: int = 0o600) -> int:
        """Open ``DIR/name`` without following a symbolic link; refused (``StateError``) unless
        it is a regular file of this user that group and others cannot write.
        ``FileNotFoundError`` when it is not there (and ``flags`` do not create it)."""
        try:
            fd = os.open(name, flags | _NOFOLLOW | os.O_NONBLOCK, create_mode, dir_fd=self._dir)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StateError(
                    f"state_dir: {self._where(name)} is a symbolic link; it decides what is"
                    f" counted, so it must be a file of this directory (remove the link)"
                ) from None
            raise StateError(f"state_dir: cannot open {self._where(name)}: {exc}") from None
        try:
            _check_owned(os.fstat(fd), self._where(name), file=True)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read_file(self, name: str) -> bytes | None:
        """The bytes of ``DIR/name`` (None when it is not there), opened as
        :meth:`_open_trusted` does."""
        try:
            fd = self._open_trusted(name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as file:
            return file.read()

    def _write_new(self, name: str, data: bytes) -> None:
        """Write ``DIR/name`` afresh (exclusive create, after removing what was there), synced."""
        self._unlink(name)
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=self._dir
        )
        try:
            os.fchmod(fd, 0o600)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _replace(self, source: str, target: str) -> None:
        os.replace(source, target, src_dir_fd=self._dir, dst_dir_fd=self._dir)

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._dir)
        except FileNotFoundError:
            pass

    def _sync_directory(self) -> None:
        os.fsync(self._dir)

    def _names(self) -> list[str]:
        return os.listdir(self._dir)

    # -- reading what is there -------------------------------------------------------------

    def _segment_files(self) -> list[tuple[int, str]]:
        found = []
        for name in self._names():
            if name.startswith("wal-") and name.endswith(".log") and name[4:-4].isdigit():
                found.append((int(name[4:-4]), name))
        return sorted(found)

    def recover(self) -> Recovered:
        """The snapshot (None without one) and every log frame, in order. A torn last frame
        ends the log (the file is cut there); a damaged stretch before good frames is skipped
        with a note (and counted in ``damaged``), the frames after it recovered. State written
        with another :func:`layout` is moved to ``DIR/previous-<UTC time>/`` with a note, and not
        loaded; state of format 1 (pickled) is refused (``StateError``)."""
        out = Recovered(notes=list(self.notes))
        self._check_layout(out)
        try:
            data = self._read_file("snapshot")
        except StateError:
            raise
        if data is not None:
            try:
                out.snapshot = _snapshot_of(data)
            except ValueError as exc:
                out.notes.append(self.set_aside_snapshot(exc))
        if out.snapshot is not None:
            out.next_seq = int(out.snapshot["next_seq"])
        segments = self._segment_files()
        for index, (first, name) in enumerate(segments):
            self._segments.append(first)
            last = index == len(segments) - 1
            data = self._read_file(name)
            frames: list[Record] = []
            good, problems = _read_frames(data or b"", frames)
            # A file after a write that could not be cut off starts at the first frame of the
            # failed group: what the earlier file holds from there was never answered.
            bound = segments[index + 1][0] if not last else None
            out.records.extend(r for r in frames if bound is None or r.seq < bound)
            for text in problems:
                out.damaged += 1
                out.notes.append(f"log {self._where(name)}: {text}")
            if good is not None:
                where = self._where(name)
                if last:
                    fd = self._open_trusted(name, os.O_WRONLY)
                    try:
                        os.ftruncate(fd, good)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    out.notes.append(f"log {where}: a torn last frame; cut at byte {good:,}")
                else:
                    out.damaged += 1
                    out.notes.append(f"log {where}: damaged from byte {good:,} to its end; skipped")
        if out.records:
            out.next_seq = max(out.next_seq, out.records[-1].seq + 1)
        return out

    def _check_layout(self, out: Recovered) -> None:
        ours = layout()
        try:
            raw = self._read_file("layout")
            theirs = None if raw is None else raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise StateError(f"state_dir: cannot read {self._where('layout')}: {exc}") from None
        kept = [
            name
            for name in self._names()
            if name == "snapshot" or (name.startswith("wal-") and name.endswith(".log"))
        ]
        if theirs != ours and kept and theirs is not None and theirs.startswith(_PICKLED_LAYOUT):
            raise StateError(
                f"state_dir: {str(self.path)!r} holds state of an earlier release, written in"
                f" its pickled format (layout {theirs}), which this version does not read"
                f" (reading it could run code). To start fresh, move it away or delete it"
                f" (mv {str(self.path)!r} {str(self.path) + '.old'!r}): the loop counts in it are"
                f" lost, and sessions start from zero"
            )
        if theirs != ours and kept:
            aside = f"previous-{_utc_stamp()}"
            os.mkdir(aside, 0o700, dir_fd=self._dir)
            for name in kept:
                self._replace(name, f"{aside}/{name}")
            out.notes.append(
                f"the state in {str(self.path)!r} was written by another version"
                f" ({theirs or 'unknown'}; this is {ours}): moved to"
                f" {str(self.path / aside)!r}, not loaded (counts start afresh)"
            )
        if theirs != ours:
            self._write_new("layout.tmp", (ours + "\n").encode())
            self._replace("layout.tmp", "layout")
            self._sync_directory()

    def set_aside_snapshot(self, problem: object) -> str:
        """Move a snapshot that cannot be used to ``snapshot.corrupt-<UTC time>``; the note."""
        aside = f"snapshot.corrupt-{_utc_stamp()}"
        self._replace("snapshot", aside)
        return (
            f"snapshot {self._where('snapshot')} cannot be read ({problem}); moved to"
            f" {self._where(aside)}; replaying the log alone (the counts it held are lost)"
        )

    # -- logging ---------------------------------------------------------------------------

    def open_log(self, next_seq: int) -> None:
        """Start a new log file at ``next_seq`` and the syncing thread."""
        self._appended = self._settled = next_seq - 1
        self._fd = self._new_segment(next_seq)
        self._thread = threading.Thread(target=self._sync_loop, name="loopguard-wal", daemon=True)
        self._thread.start()

    def _new_segment(self, first: int) -> int:
        """Create ``wal-<first>.log`` with its header (a new key), synced; its descriptor."""
        name = f"wal-{first:020d}.log"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _NOFOLLOW
        try:
            fd = os.open(name, flags, 0o600, dir_fd=self._dir)
        except FileExistsError:
            # Only a file without a frame can have this name (it starts at a sequence number not
            # yet written): replaced.
            self._unlink(name)
            fd = os.open(name, flags, 0o600, dir_fd=self._dir)
        key = os.urandom(_KEY_SIZE)
        try:
            _write_all(fd, _LOG_MAGIC + key)
            os.fdatasync(fd)
            self._sync_directory()
        except OSError:
            os.close(fd)
            self._unlink(name)
            raise
        self._key = key
        self._size = _LOG_HEADER_SIZE
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
            self._pending_frames.append((seq, when, kind, payload))
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

    def _take_pending(self) -> tuple[list[tuple[int, float, int, bytes]], int, int]:
        """(frames, first, last) pending, under ``_cond``."""
        frames = self._pending_frames
        self._pending_frames = []
        return frames, self._settled + 1, self._appended

    def _sync_loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending_frames and not self._closing:
                    self._cond.wait()
                if not self._pending_frames:
                    return
            with self._io:  # not held while waiting: a snapshot's rotation takes it
                with self._cond:
                    if not self._pending_frames:
                        continue  # the rotation wrote them
                    frames, first, upto = self._take_pending()
                error = self._write_group(first, frames)
                self._settle(first, upto, error)

    def _write_group(
        self, first: int, frames: list[tuple[int, float, int, bytes]]
    ) -> OSError | None:
        """Write and sync one group (under ``_io``). A group that fails is cut off again, so
        the file ends in whole frames and the next group goes on in it (a full disk costs no
        new file); only when that cut fails too does the next group start a new file, named
        after this group's first frame (a restart then ignores what the old file holds from
        there)."""
        if self._broken is not None:
            try:
                fd = self._new_segment(self._broken)
            except OSError as exc:
                return exc
            old, self._fd = self._fd, fd
            self._broken = None
            if old is not None:
                os.close(old)
        current = self._fd
        if current is None:
            return OSError(errno.EBADF, "the log is closed")
        key = self._key
        parts = []
        for seq, when, kind, payload in frames:
            head = _HEAD.pack(seq, when, kind)
            size = struct.pack("<I", len(payload))
            digest = hashlib.blake2b(size, digest_size=8, key=key)
            digest.update(head)
            digest.update(payload)
            parts.append(_PREFIX.pack(_FRAME_MARK, len(payload), digest.digest()) + head)
            parts.append(payload)
        data = b"".join(parts)
        try:
            _write_all(current, data)
            os.fdatasync(current)
        except OSError as exc:
            try:
                os.ftruncate(current, self._size)
                os.fdatasync(current)
            except OSError:
                self._broken = first
            return exc
        self._size += len(data)
        return None

    def _settle(self, first: int, upto: int, error: OSError | None) -> None:
        with self._cond:
            self._settled = max(self._settled, upto)
            if error is not None:
                self._failures.append((first, upto))
            self._cond.notify_all()
        if error is not None and self._on_error is not None:
            self._on_error(error)

    # -- snapshots -------------------------------------------------------------------------

    def write_snapshot(self, state: dict[str, Any], covered: int, keep_after: int) -> None:
        """Write ``state`` (every frame up to ``covered`` applied in it, but the batches after
        ``keep_after``), start a new log file, and delete the files that hold nothing after
        ``keep_after``. ``OSError`` when it cannot be written, ``ValueError`` when ``state`` is
        not plain data (:func:`plain_dumps`; the old snapshot and the log stay as they were)."""
        state = {**state, "next_seq": covered + 1, "covered": covered}
        payload = plain_dumps(state)
        head = _SNAPSHOT_HEAD.pack(len(payload), hashlib.blake2b(payload, digest_size=32).digest())
        self._write_new("snapshot.tmp", _SNAPSHOT_MAGIC + head + payload)
        self._replace("snapshot.tmp", "snapshot")
        self._sync_directory()
        self._rotate()
        while len(self._segments) > 1 and self._segments[1] <= keep_after + 1:
            first = self._segments.popleft()
            self._unlink(f"wal-{first:020d}.log")

    def _rotate(self) -> None:
        """Sync what is pending into the current file, then log into a new one."""
        with self._io:
            with self._cond:
                frames, first, upto = self._take_pending()
            error = self._write_group(first, frames) if frames else None
            self._settle(first, upto, error)
            if self._segments[-1] != upto + 1:
                fd = self._new_segment(upto + 1)
                old, self._fd = self._fd, fd
                self._broken = None
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
        os.close(self._dir)


def _check_owned(info: os.stat_result, where: str, *, file: bool) -> None:
    if file and not stat.S_ISREG(info.st_mode):
        raise StateError(f"state_dir: {where} is not a regular file; remove it")
    if info.st_uid != os.geteuid():
        raise StateError(
            f"state_dir: {where} belongs to another user (uid {info.st_uid}); it decides what is"
            f" counted, so it must be this user's"
        )
    if file and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateError(
            f"state_dir: {where} can be written by group or others; it decides what is counted"
            f" (chmod go-w it)"
        )


def _open_directory(path: Path, notes: list[str]) -> int:
    """Open (make, ``0700``, when missing) the state directory without following a symbolic
    link; refused unless it is this user's. Group and other permissions are taken away."""
    flags = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW
    shown = repr(str(path))
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StateError(f"state_dir: cannot create {shown}: {exc}") from None
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise StateError(f"state_dir: cannot open {shown}: {exc}") from None
    except OSError as exc:
        if path.is_symlink():
            raise StateError(
                f"state_dir: {shown} is a symbolic link; give the directory itself (another"
                f" user who can change the link could change what is counted)"
            ) from None
        if exc.errno == errno.ENOTDIR:
            raise StateError(f"state_dir: cannot create {shown}: a file is in the way") from None
        raise StateError(f"state_dir: cannot open {shown}: {exc}") from None
    try:
        info = os.fstat(fd)
        _check_owned(info, shown, file=False)
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            os.fchmod(fd, 0o700)
            notes.append(f"{shown} was mode {mode:04o}; made 0700 (only this user may read it)")
    except OSError as exc:
        os.close(fd)
        raise StateError(f"state_dir: cannot make {shown} 0700: {exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _snapshot_of(data: bytes) -> dict[str, Any]:
    """A snapshot file's state; ``ValueError`` naming what is wrong."""
    if not data.startswith(_SNAPSHOT_MAGIC):
        raise ValueError("not an otel-loopguard snapshot of this format")
    start = len(_SNAPSHOT_MAGIC) + _SNAPSHOT_HEAD.size
    if len(data) < start:
        raise ValueError("truncated")
    length, digest = _SNAPSHOT_HEAD.unpack_from(data, len(_SNAPSHOT_MAGIC))
    payload = data[start:]
    if len(payload) != length or hashlib.blake2b(payload, digest_size=32).digest() != digest:
        raise ValueError("damaged (length or digest)")
    state = plain_loads(payload)
    if not isinstance(state, dict) or not isinstance(state.get("next_seq"), int):
        raise ValueError("no state in it")
    return state


def _read_frames(data: bytes, into: list[Record]) -> tuple[int | None, list[str]]:
    """Append the good frames of one log file to ``into``. Returns where a damaged or torn end
    starts (None when the file ends in a whole frame) and a note for each damaged stretch that
    good frames follow."""
    problems: list[str] = []
    if len(data) < _LOG_HEADER_SIZE or not data.startswith(_LOG_MAGIC):
        # Created, and the crash hit the header: nothing in it was answered. Anything else
        # without the header is no log of this format.
        if _LOG_MAGIC.startswith(data[: len(_LOG_MAGIC)]) and len(data) < _LOG_HEADER_SIZE:
            return (0 if data else None), problems
        return 0, problems
    key = data[len(_LOG_MAGIC) : _LOG_HEADER_SIZE]
    offset = _LOG_HEADER_SIZE
    last_seq = 0
    while offset < len(data):
        frame = _frame_at(data, offset, key)
        if frame is not None:
            into.append(frame[0])
            last_seq = frame[0].seq
            offset = frame[1]
            continue
        # Damaged here: the next frame whose digest holds, if any.
        found = _next_frame(data, offset, key, last_seq)
        if found is None:
            return offset, problems
        first = found[0].seq
        lost = f"; sequence numbers {last_seq + 1}-{first - 1} lost" if last_seq else ""
        problems.append(
            f"{found[1] - offset:,} damaged bytes at byte {offset:,} skipped{lost}; the frames"
            f" after them recovered"
        )
        offset = found[1]
    return None, problems


def _next_frame(data: bytes, offset: int, key: bytes, last_seq: int) -> tuple[Record, int] | None:
    """The first good frame after ``offset`` (one of a later sequence number) and where it
    starts."""
    resume = data.find(_FRAME_MARK, offset + 1)
    while resume != -1:
        frame = _frame_at(data, resume, key)
        if frame is not None and frame[0].seq > last_seq:
            return frame[0], resume
        resume = data.find(_FRAME_MARK, resume + 1)
    return None


def _frame_at(data: bytes, offset: int, key: bytes) -> tuple[Record, int] | None:
    """The frame at ``offset`` and where the next starts, or None when none whole is there."""
    if len(data) - offset < _FRAME_SIZE:
        return None
    mark, length, digest = _PREFIX.unpack_from(data, offset)
    if mark != _FRAME_MARK or length > _MAX_FRAME:
        return None
    start = offset + _PREFIX.size
    end = start + _HEAD.size + length
    if end > len(data):
        return None
    check = hashlib.blake2b(data[offset + 4 : offset + 8], digest_size=8, key=key)
    check.update(data[start:end])
    if check.digest() != digest:
        return None
    seq, when, kind = _HEAD.unpack_from(data, start)
    if kind not in _KINDS:
        return None
    return Record(seq, when, kind, data[start + _HEAD.size : end]), end


def note(text: str) -> None:
    """One line on stderr about the state directory."""
    print(f"otel-loopguard serve: state_dir: {text}", file=sys.stderr, flush=True)


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
_SPAN_FIELDS: Final = tuple(item.name for item in dataclasses.fields(RecordedSpan))
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
        spans = [tuple(getattr(span, name) for name in _SPAN_FIELDS) for span in read.spans]
        return b"P" + plain_dumps((spans, read.problems, read.bad_spans, read.links))


def _span_row(span: RecordedSpan) -> list[object]:
    """One span's fields in :data:`_SPAN_FIELDS`' order, for JSON."""
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
