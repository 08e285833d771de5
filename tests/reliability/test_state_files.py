"""Issue 23, items 1 and 12: state files that cannot run code, and are read only when this user
owns them.

Round two: a write-ahead-log file owned by another user, or mode 0666, was unpickled (a crafted
frame ran its payload); with the directory a symbolic link that another user flipped between the
check and the read, the other user's pickle ran in 1 of 20 starts; an existing 0755 directory
stayed 0755; a damaged frame in the middle of the log dropped every good frame after it. Each
test runs a real ``serve`` subprocess on a real directory.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard.service._durable import _FRAME_MARK, _LOG_HEADER_SIZE, _PREFIX, layout
from tests.service_tools import ServeProcess, request, require_serve_prerequisites

require_serve_prerequisites()

OTHER_USER = 65534  # nobody


class _Runs:
    """A pickle that runs a command when unpickled (round two's attack)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _refused(state_dir: Path, timeout: float = 60) -> str:
    """What ``serve --state-dir`` says as it refuses to start (status 2)."""
    refused = subprocess.run(
        [sys.executable, "-m", "otel_loopguard", "serve", "--http-port", "0", "--no-grpc"]
        + ["--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert refused.returncode == 2, refused.stderr
    return refused.stderr


def _decide(port: int, **body: Any) -> dict[str, Any]:
    answer = request(
        port,
        "POST",
        "/v1/decisions/before",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    assert answer.status == 200, answer.body
    decision = answer.json()["decision"]
    return {key: decision[key] for key in ("action", "count", "rule", "message")}


GREP = {"session": "files", "tool": "grep", "arguments": {"q": "x"}}


def _new_state(tmp_path: Path) -> Path:
    """A state directory as ``serve`` leaves it (layout marker, snapshot, empty log)."""
    state = tmp_path / "state"
    server = ServeProcess("--state-dir", str(state))
    try:
        assert server.stop() == 0
    finally:
        server.close()
    return state


def _round_two_frame(marker: Path) -> bytes:
    """A round-two log frame (``<length, CRC-32>`` then ``<seq, time, kind>``) whose payload is
    a pickle that runs a command."""
    import struct
    import zlib

    payload = pickle.dumps(([], [], 0, [_Runs(marker)]))
    head = struct.pack("<QdB", 1_000, 0.0, 1)
    return struct.pack("<II", len(payload), zlib.crc32(payload, zlib.crc32(head))) + head + payload


@pytest.mark.slow
def test_a_crafted_log_frame_runs_nothing(tmp_path: Path) -> None:
    """Even in a file of this user's, mode 0600, the log is never unpickled: round two's frame
    is a damaged file (noted), a frame of this format whose payload is a pickle is a record that
    cannot be applied (noted); the command never runs and ``serve`` starts."""
    from otel_loopguard.service._durable import BATCH, StateDir

    state = _new_state(tmp_path)
    marker = tmp_path / "ran"
    log = StateDir(str(state))
    log.recover()
    log.open_log(2_000)
    assert log.wait(log.append(BATCH, 0.0, pickle.dumps(_Runs(marker))))
    log.close()
    crafted = state / "wal-00000000000000000900.log"  # before the last file
    crafted.write_bytes(_round_two_frame(marker))
    crafted.chmod(0o600)
    server = ServeProcess("--state-dir", str(state))
    try:
        text = "".join(server.lines)
        assert "wal-00000000000000000900.log" in text and "damaged from byte 0" in text, text
        assert "1 log records could not be applied again" in text, text
        assert _decide(server.port, **GREP)["count"] == 0
        assert server.stop() == 0
    finally:
        server.close()
    assert not marker.exists()


@pytest.mark.slow
def test_a_log_or_snapshot_another_user_could_write_is_refused(tmp_path: Path) -> None:
    state = _new_state(tmp_path)
    (log,) = state.glob("wal-*.log")
    for path in (log, state / "snapshot"):
        path.chmod(0o666)
        assert f"{str(path)!r} can be written by group or others" in _refused(state)
        path.chmod(0o600)
        if os.geteuid() == 0:
            os.chown(path, OTHER_USER, OTHER_USER)
            assert f"{str(path)!r} belongs to another user (uid {OTHER_USER})" in _refused(state)
            os.chown(path, 0, 0)
        elif os.environ.get("CI"):
            pytest.fail("CI runs as root: the other-owner half needs chown")
    # As it was, it starts.
    server = ServeProcess("--state-dir", str(state))
    try:
        assert server.stop() == 0
    finally:
        server.close()


@pytest.mark.slow
def test_symbolic_links_and_special_files_are_never_followed(tmp_path: Path) -> None:
    state = _new_state(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    # The directory given as a link (another user could flip it between a check and a read).
    link = tmp_path / "link"
    link.symlink_to(state)
    assert f"state_dir: {str(link)!r} is a symbolic link" in _refused(link)
    # A file in it as a link.
    snapshot = state / "snapshot"
    snapshot.rename(elsewhere / "snapshot")
    snapshot.symlink_to(elsewhere / "snapshot")
    assert f"{str(snapshot)!r} is a symbolic link" in _refused(state)
    snapshot.unlink()
    (elsewhere / "snapshot").rename(snapshot)
    # A FIFO as a log file: refused at once, not waited on.
    fifo = state / "wal-00000000000000000099.log"
    os.mkfifo(fifo, 0o600)
    started = time.monotonic()
    assert f"{str(fifo)!r} is not a regular file" in _refused(state, timeout=30)
    assert time.monotonic() - started < 30
    fifo.unlink()


@pytest.mark.slow
def test_a_link_flipped_while_serve_runs_changes_nothing(tmp_path: Path) -> None:
    """Round two: 1 of 20 starts read another user's file through a flipped link. A link is
    refused at every start however it is flipped; and a directory moved away and replaced by a
    link while ``serve`` runs: ``serve`` keeps writing into the directory it opened."""
    state = _new_state(tmp_path)
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    (other / "layout").write_text(layout() + "\n")
    marker = tmp_path / "ran"
    (other / "wal-00000000000000000001.log").write_bytes(_round_two_frame(marker))
    link = tmp_path / "link"
    link.symlink_to(state)
    stop = threading.Event()

    def flip() -> None:
        flipped = tmp_path / "flipped"
        while not stop.is_set():
            target = other if os.readlink(link) == str(state) else state
            flipped.unlink(missing_ok=True)
            flipped.symlink_to(target)
            os.replace(flipped, link)
            time.sleep(0.001)

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        for _ in range(20):
            assert "is a symbolic link" in _refused(link)
    finally:
        stop.set()
        flipper.join(10)
    assert not marker.exists()

    server = ServeProcess("--state-dir", str(state))
    try:
        _decide(server.port, **GREP)
        state.rename(tmp_path / "moved")
        (tmp_path / "state").symlink_to(other)
        assert server.stop() == 0  # the last snapshot: into the directory it opened
    finally:
        server.close()
    assert not marker.exists()
    assert sorted(path.name for path in other.iterdir()) == [
        "layout",
        "wal-00000000000000000001.log",
    ]
    moved = tmp_path / "moved"
    assert (moved / "snapshot").stat().st_mtime >= (moved / "layout").stat().st_mtime
    (tmp_path / "state").unlink()
    moved.rename(tmp_path / "state")
    server = ServeProcess("--state-dir", str(state))
    try:
        assert _decide(server.port, **GREP)["count"] == 2  # the call before the move was kept
        assert server.stop() == 0
    finally:
        server.close()


@pytest.mark.slow
def test_an_existing_directory_others_can_read_is_made_0700(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)
    server = ServeProcess("--state-dir", str(state))
    try:
        assert any("was mode 0755; made 0700" in line for line in server.lines), server.lines
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        assert server.stop() == 0
    finally:
        server.close()


def _frame_starts(data: bytes) -> list[int]:
    starts = []
    at = data.find(_FRAME_MARK, _LOG_HEADER_SIZE)
    while at != -1:
        starts.append(at)
        at = data.find(_FRAME_MARK, at + 1)
    return starts


@pytest.mark.slow
@pytest.mark.parametrize("where", ["payload", "length", "marker"])
def test_a_damaged_frame_in_the_middle_is_reported_and_the_rest_recovered(
    tmp_path: Path, where: str
) -> None:
    """Six logged calls, the third frame damaged (in its payload, its length, or its marker):
    the restart says where and which sequence number was lost, counts it in
    ``loopguard_state_errors_total{what="damaged"}``, and applies the five others, as a server
    never damaged that got those five."""
    state = tmp_path / "state"
    server = ServeProcess("--hold-seconds", "600", "--state-dir", str(state))
    try:
        for _ in range(6):
            _decide(server.port, **GREP)
    finally:
        server.kill9()
    (log,) = state.glob("wal-*.log")
    data = bytearray(log.read_bytes())
    starts = _frame_starts(bytes(data))
    assert len(starts) == 6, starts
    third = starts[2]
    offset = {"payload": third + _PREFIX.size + 20, "length": third + 5, "marker": third}[where]
    data[offset] ^= 0x5A
    log.write_bytes(bytes(data))
    restarted = ServeProcess("--hold-seconds", "600", "--state-dir", str(state))
    try:
        text = "".join(restarted.lines)
        assert f"damaged bytes at byte {third:,} skipped; sequence numbers" in text, text
        assert "the frames after them recovered" in text, text
        page = request(restarted.port, "GET", "/metrics").body.decode()
        assert 'loopguard_state_errors_total{what="damaged"} 1.0' in page
        got = _decide(restarted.port, **GREP)
        assert restarted.stop() == 0
    finally:
        restarted.close()
    reference = ServeProcess("--hold-seconds", "600")
    try:
        for _ in range(5):
            _decide(reference.port, **GREP)
        expected = _decide(reference.port, **GREP)
        assert reference.stop() == 0
    finally:
        reference.close()
    assert got == expected and got["count"] == 6
