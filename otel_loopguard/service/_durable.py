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

import errno
import fcntl
import hashlib
import os
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ._clock import Gate, ServiceClock
from ._state_codec import (
    MAX_PLAIN_DEPTH,
    SPAN_FIELDS,
    batch_of,
    batch_payload,
    plain_dumps,
    plain_loads,
)
from ._state_files import NOFOLLOW, StateError, check_owned, open_directory, write_all

__all__ = [
    "ADVICE",
    "BATCH",
    "DECISION",
    "MAX_PLAIN_DEPTH",
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
    fields = ",".join(SPAN_FIELDS)
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
        self._dir = open_directory(self.path, self.notes)
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
            fd = os.open(name, flags | NOFOLLOW | os.O_NONBLOCK, create_mode, dir_fd=self._dir)
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
            check_owned(os.fstat(fd), self._where(name), file=True)
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
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600, dir_fd=self._dir)
        try:
            os.fchmod(fd, 0o600)
            write_all(fd, data)
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
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | NOFOLLOW
        try:
            fd = os.open(name, flags, 0o600, dir_fd=self._dir)
        except FileExistsError:
            # Only a file without a frame can have this name (it starts at a sequence number not
            # yet written): replaced.
            self._unlink(name)
            fd = os.open(name, flags, 0o600, dir_fd=self._dir)
        key = os.urandom(_KEY_SIZE)
        try:
            write_all(fd, _LOG_MAGIC + key)
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
            write_all(current, data)
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
