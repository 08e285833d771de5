"""Issue 23, item 4: request heads are bounded while they are read.

Round two: one unauthenticated connection sending small headers for 10 s took serve to 2.6 GB
resident; one 98 MB header value to 222 MB; /healthz took up to 1.4 s meanwhile. Now a head past
64 KiB (request line and headers) or 100 headers is answered 431 and the connection closed, counted
as the bytes arrive (the parser buffers at most one read past the cap).

Each test runs a real ``serve`` process and reads its peak resident memory (VmHWM) from /proc.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from tests.service_tools import ServeProcess, request, require_serve_prerequisites

require_serve_prerequisites()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status"),
]

#: serve's peak resident memory must stay under this (measured: idle + under 10 MiB).
CEILING_MB = 80
#: /healthz must keep answering within this while the head attacks run.
HEALTH_SECONDS = 0.5


def _health_latencies(port: int, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        start = time.monotonic()
        try:
            status = request(port, "GET", "/healthz", timeout=5).status
        except OSError:
            status = -1
        out.append(time.monotonic() - start if status == 200 else float("inf"))
        time.sleep(0.02)


def _send_until_answered(port: int, head: bytes, piece: bytes, limit: int) -> tuple[bytes, int]:
    """``head``, then ``piece`` again and again until serve answers (or ``limit`` bytes were
    sent): the answer's first bytes and how much was sent."""
    with socket.create_connection(("127.0.0.1", port), 5) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        sent, out = len(head), b""
        while sent < limit and not out:
            try:
                sock.sendall(piece)
                sent += len(piece)
            except BlockingIOError:
                time.sleep(0.001)
            except OSError:
                break
            try:
                out = sock.recv(256)
            except BlockingIOError:
                pass
            except OSError:
                break
        sock.setblocking(True)
        sock.settimeout(2)
        try:
            out += sock.recv(256)
        except OSError:
            pass
        return out, sent


def test_small_headers_for_ten_seconds_and_a_huge_header_value_are_cut_at_64_kib() -> None:
    server = ServeProcess()
    stop = threading.Event()
    latencies: list[float] = []
    watcher = threading.Thread(target=_health_latencies, args=(server.port, stop, latencies))
    try:
        idle = server.peak_rss_mb()
        watcher.start()
        # one attacker sending small headers for 10 s, reconnecting whenever it is cut off
        answers, sent_total, connections = [], 0, 0
        end = time.monotonic() + 10
        while time.monotonic() < end:
            out, sent = _send_until_answered(
                server.port, b"GET /healthz HTTP/1.1\r\n", b"X-Small: 1234567890\r\n", 1 << 30
            )
            answers.append(out[:12])
            sent_total += sent
            connections += 1
        # one header value of 98 MB
        huge, huge_sent = _send_until_answered(
            server.port, b"GET /healthz HTTP/1.1\r\nX-Huge: ", b"v" * 65536, 98_000_000
        )
        stop.set()
        watcher.join(10)
        peak = server.peak_rss_mb()
        print(
            f"heads: {connections} connections, {sent_total / 1e6:.1f} MB sent in small headers;"
            f" huge value cut after {huge_sent / 1e6:.2f} MB; idle {idle:.0f} MiB,"
            f" peak {peak:.0f} MiB; /healthz slowest {max(latencies):.3f} s"
        )
        assert answers and set(answers) == {b"HTTP/1.1 431"}, set(answers)
        assert huge.startswith(b"HTTP/1.1 431"), huge[:40]
        assert huge_sent < 8_000_000  # answered long before 98 MB
        assert peak < CEILING_MB, (idle, peak)
        assert latencies and max(latencies) < HEALTH_SECONDS, max(latencies)
    finally:
        stop.set()
        assert server.stop(30) == 0
        server.close()
