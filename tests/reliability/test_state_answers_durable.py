"""Issue 23, item 7: nothing answered is lost.

Round two: with ``--state-dir`` on a full disk, decisions were answered 200 without being
logged (after kill -9 the count was 2 where the never-killed run had 4), each failed write opened
another log file, and a 260-deep JSON argument was counted and applied, then answered 500 and
never logged. Now a decision is logged and synced before it is applied: one that cannot be is
answered 503 and not applied (the hooks then follow their fail mode), a full disk costs no new
log file, and a body nested deeper than ``MAX_DECISION_DEPTH`` is answered 400 before anything is
applied, with or without ``--state-dir``.

The full disk is a file-size limit (``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored, so a write past
it fails with ``EFBIG`` as one on a full disk fails with ``ENOSPC``): it needs no privilege and
holds for root too.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard.service._decisions import MAX_DECISION_DEPTH
from tests.service_tools import ServeProcess, request, require_serve_prerequisites

require_serve_prerequisites()

#: The largest file serve may write in the full-disk test: the snapshot written at start and
#: the log's header fit, and a few decision frames after them.
FILE_LIMIT = 2048

_LIMITED = (
    "import os, resource, signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'otel_loopguard', *sys.argv[2:]])\n"
)


class LimitedServe:
    """``serve`` whose files cannot grow past ``limit`` bytes (a full disk)."""

    def __init__(self, limit: int, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _LIMITED, str(limit), "serve", "--http-port", "0"]
            + ["--no-grpc", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        started: queue.Queue[str] = queue.Queue()
        stream = self.process.stderr
        assert stream is not None

        def pump() -> None:
            for line in stream:
                self.lines.append(line)
                if " on http://" in line:
                    started.put(line)
            started.put("")

        threading.Thread(target=pump, daemon=True).start()
        first = started.get(timeout=60)
        assert first, "".join(self.lines)
        self.port = int(first.split(" on http://", 1)[1].split(";", 1)[0].rsplit(":", 1)[1])

    def kill9(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


def _call(port: int, endpoint: str, body: dict[str, Any]) -> tuple[int, Any]:
    answer = request(
        port,
        "POST",
        f"/v1/decisions/{endpoint}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    return answer.status, answer.json() if answer.status == 200 else answer.body


GREP = {"session": "disk", "tool": "grep", "arguments": {"q": "x"}}


def _probe(port: int) -> dict[str, Any]:
    status, answer = _call(port, "before", GREP)
    assert status == 200, answer
    decision = answer["decision"]
    return {key: decision[key] for key in ("action", "count", "rule", "message")}


@pytest.mark.slow
def test_on_a_full_disk_decisions_are_503_not_applied_and_a_restart_matches(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    server = LimitedServe(FILE_LIMIT, "--hold-seconds", "600", "--state-dir", str(state))
    try:
        statuses = [_call(server.port, "before", GREP)[0] for _ in range(40)]
        logs = sorted(state.glob("wal-*.log"))
    finally:
        server.kill9()
    kept = statuses.count(200)
    # Answered 200 until the log could not grow, then 503 every time: never 200 for a call not
    # kept, never a 500.
    assert 3 <= kept < 37, statuses
    assert statuses == [200] * kept + [503] * (40 - kept), statuses
    assert any("cannot write the log" in line for line in server.lines), server.lines
    assert len(logs) == 1, logs  # one log file however many writes failed
    assert logs[0].stat().st_size <= FILE_LIMIT

    # The restart counts the calls answered 200, and only those: as a server never attacked
    # that got just those calls.
    restarted = ServeProcess("--hold-seconds", "600", "--state-dir", str(state))
    try:
        after_crash = _probe(restarted.port)
        assert restarted.stop() == 0
    finally:
        restarted.close()
    reference = ServeProcess("--hold-seconds", "600")
    try:
        for _ in range(kept):
            assert _call(reference.port, "before", GREP)[0] == 200
        expected = _probe(reference.port)
        assert reference.stop() == 0
    finally:
        reference.close()
    assert after_crash == expected
    assert expected["count"] == kept + 1


def _nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


def _sessions(port: int) -> float:
    for line in request(port, "GET", "/metrics").body.decode().splitlines():
        if line.startswith("loopguard_sessions "):
            return float(line.split()[1])
    raise AssertionError("no loopguard_sessions")


@pytest.mark.slow
@pytest.mark.parametrize("durable", [False, True])
def test_a_body_nested_too_deep_is_400_and_applies_nothing(tmp_path: Path, durable: bool) -> None:
    """The same limit with and without ``--state-dir``: a body nested ``MAX_DECISION_DEPTH``
    deep is decided (and, with a state directory, kept across kill -9); one level deeper (or
    the 260 of round two) is 400, counts nothing and logs nothing."""
    state = tmp_path / "state"
    args = ("--state-dir", str(state)) if durable else ()
    server = ServeProcess("--hold-seconds", "600", *args)
    try:
        for depth in (MAX_DECISION_DEPTH, 260):  # the body is one level, the arguments the rest
            body = {"session": "deep", "tool": "grep", "arguments": _nested(depth)}
            status, answer = _call(server.port, "before", body)
            assert status == 400, answer
            assert f"{MAX_DECISION_DEPTH} levels".encode() in answer
        assert _sessions(server.port) == 0  # nothing applied
        log_size = sum(path.stat().st_size for path in state.glob("wal-*.log"))
        deepest = {"session": "deep", "tool": "grep", "arguments": _nested(MAX_DECISION_DEPTH - 1)}
        for _ in range(2):
            status, answer = _call(server.port, "before", deepest)
            assert status == 200, answer
        if durable:
            assert sum(path.stat().st_size for path in state.glob("wal-*.log")) > log_size
            server.kill9()
            server = ServeProcess("--hold-seconds", "600", *args)
        status, answer = _call(server.port, "before", deepest)
        assert status == 200 and answer["decision"]["count"] == 3, answer
        assert server.stop() == 0
    finally:
        server.close()
