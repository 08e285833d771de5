"""``otel-loopguard serve`` on a port something else holds: one line naming the port, exit 2.

A real socket holds the port; a real ``python -m otel_loopguard serve`` process is refused it.
The gRPC C core logs a bind failure to file descriptor 2 before Python hears of it; serve holds
that line back (its own line says it), and lets everything else the C core writes through.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from otel_loopguard.service._grpc import _Fd2Held

SERVE = [sys.executable, "-m", "otel_loopguard", "serve"]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("LOOPGUARD_", "GRPC_"))}


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port held by a listening socket for the test's length."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def refused(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVE, *args], capture_output=True, text=True, timeout=120, env=clean_env()
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("option", "other", "what"),
    [("--grpc-port", "--http-port", "OTLP/gRPC"), ("--http-port", "--grpc-port", "OTLP/HTTP")],
)
def test_a_busy_port_is_one_line_naming_it_and_exit_2(
    held_port: int, option: str, other: str, what: str
) -> None:
    done = refused(option, str(held_port), other, "0")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.endswith("\n"), done.stderr
    assert done.stderr == (
        f"otel-loopguard serve: error: cannot listen on 127.0.0.1:{held_port} ({what}):"
        f" {os.strerror(errno.EADDRINUSE)} (choose another with {option})\n"
    )


def test_a_busy_grpc_port_shows_no_grpc_core_log_line(held_port: int) -> None:
    done = refused("--grpc-port", str(held_port), "--http-port", "0")
    # The C core's line ("E1203 ... add_port.cc:83] Failed to add port to server: ...") and
    # grpcio's advice to set GRPC_VERBOSITY are gone; the reason is the socket's own.
    assert "add_port" not in done.stderr and "to add port" not in done.stderr
    assert "GRPC_VERBOSITY" not in done.stderr and "Failed to bind" not in done.stderr
    assert os.strerror(errno.EADDRINUSE) in done.stderr


@pytest.mark.slow
def test_a_free_grpc_port_still_serves_and_stops_cleanly() -> None:
    process = subprocess.Popen(
        [*SERVE, "--http-port", "0", "--grpc-port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert process.stderr is not None
        started = process.stderr.readline()
        assert " on http://127.0.0.1:" in started and "; OTLP/gRPC on 127.0.0.1:" in started
        grpc_port = int(started.split("OTLP/gRPC on 127.0.0.1:", 1)[1].split(";", 1)[0])
        with socket.create_connection(("127.0.0.1", grpc_port), timeout=10):
            pass  # gRPC listens on the port it bound
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert out == "" and "add_port" not in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def test_held_fd2_lets_other_lines_through(capfd: pytest.CaptureFixture[str]) -> None:
    """What the C core writes while a port is bound reaches stderr, but for the lines serve
    reports itself."""
    with _Fd2Held() as held:
        os.write(2, b"E0000 add_port.cc:83] Failed to add port to server\n")
        os.write(2, b"E0000 other.cc:1] something else went wrong\n")
        assert capfd.readouterr().err == ""  # held while the block runs
        held.release(drop=lambda line: b"add_port" in line)
    os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert err == "E0000 other.cc:1] something else went wrong\nafter\n"
    with _Fd2Held():
        os.write(2, b"E0000 add_port.cc:83] kept when nothing failed\n")
    assert "kept when nothing failed" in capfd.readouterr().err
