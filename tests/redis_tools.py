"""A real ``redis-server`` (Debian's) for tests: started on a free loopback port in a temporary
directory, never a system service; stopped (or killed) by the test."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def require_redis_server() -> str:
    """The path of ``redis-server``: a failure in CI when missing, a skip elsewhere
    (``apt-get install redis-server``)."""
    path = shutil.which("redis-server")
    if path is None:
        message = "redis-server is not installed (apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must install it (.ci/install)")
        pytest.skip(message)
    try:
        import redis  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("the redis client is missing in CI (pip install -e '.[test]')")
        pytest.skip("the redis client is not installed (pip install 'otel-loopguard[redis]')")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` process. ``aof``: append-only file with ``appendfsync always``, so
    no acknowledged write is lost even to ``kill -9``."""

    def __init__(self, directory: Path, *, aof: bool = False) -> None:
        self.binary = require_redis_server()
        self.directory = directory
        self.aof = aof
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--daemonize",
            "no",
            "--appendonly",
            "yes" if self.aof else "no",
            "--appendfsync",
            "always",
        ]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.directory
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("redis-server did not answer within 10 s")

    def client(self) -> object:
        import redis

        return redis.Redis.from_url(self.url)

    def stop(self, *, kill: bool = False) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        process.wait(timeout=10)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


class Silent:
    """A TCP port that accepts connections and never answers (a hung Redis)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()
