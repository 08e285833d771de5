"""Helpers for the serve tests: prerequisites, a scripted agent workload, HTTP and metrics."""

from __future__ import annotations

import datetime
import http.client
import importlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import Status, StatusCode, Tracer

from otel_loopguard.metrics import METRICS

#: What the serve tests import beyond the package's core dependencies (the test extra).
PREREQUISITES = (
    "grpc",
    "uvicorn",
    "httptools",
    "google.protobuf",
    "google.rpc.status_pb2",
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
)


def require_serve_prerequisites() -> None:
    """Skip without the serve extra and the exporters; in CI (``CI`` set) fail instead."""
    for name in PREREQUISITES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            if os.environ.get("CI"):
                pytest.fail(f"{name} is missing in CI (pip install -e '.[test]'): {exc}")
            pytest.skip(f"{name} is not installed")


# -- a scripted agent workload -----------------------------------------------------------------


@dataclass(frozen=True)
class Agent:
    """One scripted agent run: ``calls`` of (tool, arguments, result)."""

    name: str
    calls: tuple[tuple[str, Mapping[str, Any], str], ...]
    sub: Agent | None = None  # a sub-agent run inside this one, after its calls


def looping(
    name: str,
    times: int = 8,
    tool: str = "grep",
    arguments: Mapping[str, Any] | None = None,
    result: str = "3 matches",
) -> Agent:
    return Agent(
        name, tuple((tool, arguments or {"pattern": "TODO"}, result) for _ in range(times))
    )


def varied(name: str, count: int = 6) -> Agent:
    return Agent(
        name, tuple(("read_file", {"path": f"src/{n}.py"}, f"contents {n}") for n in range(count))
    )


def polling(name: str, count: int = 8) -> Agent:
    return Agent(name, tuple(("status", {"job": 7}, f"running {n}") for n in range(count)))


def run_agent(tracer: Tracer, agent: Agent, *, call_prefix: str = "call") -> None:
    """One run as GenAI-semconv spans: ``invoke_agent`` around ``execute_tool`` spans (arguments,
    call id and result set after start, as most instrumentations do) and ``chat`` spans."""
    with tracer.start_as_current_span(
        f"invoke_agent {agent.name}",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent.name},
    ):
        for index, (tool, arguments, result) in enumerate(agent.calls):
            with tracer.start_as_current_span(
                "chat scripted",
                attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "scripted"},
            ) as chat:
                chat.set_attribute(
                    "gen_ai.output.messages",
                    json.dumps(
                        [{"role": "assistant", "parts": [{"type": "tool_call", "name": tool}]}]
                    ),
                )
            with tracer.start_as_current_span(
                f"execute_tool {tool}",
                attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool},
            ) as span:
                span.set_attribute("gen_ai.tool.call.arguments", json.dumps(arguments))
                span.set_attribute("gen_ai.tool.call.id", f"{call_prefix}-{agent.name}-{index}")
                span.set_attribute("gen_ai.tool.call.result", result)
                if result.startswith("error"):
                    span.set_status(Status(StatusCode.ERROR, result))
        if agent.sub is not None:
            run_agent(tracer, agent.sub, call_prefix=call_prefix)


def workload(tracer: Tracer, traces: int = 1) -> None:
    """A mixed workload: loops, healthy work, polling, a looping sub-agent, one trace each."""
    for n in range(traces):
        run_agent(tracer, looping("coder"), call_prefix=f"t{n}")
        run_agent(tracer, varied("reviewer"), call_prefix=f"t{n}")
        run_agent(tracer, polling("watcher"), call_prefix=f"t{n}")
        run_agent(
            tracer,
            Agent(
                "planner",
                (("plan", {"goal": "x"}, "ok"),),
                sub=looping("searcher", 7, "search", {"q": "paris"}, "same"),
            ),
            call_prefix=f"t{n}",
        )
        run_agent(
            tracer,
            looping("builder", 6, "bash", {"command": "make"}, "error: boom"),
            call_prefix=f"t{n}",
        )


# -- reading what a guard did ------------------------------------------------------------------


def guard_samples(registry: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the guard's own metrics (METRICS) in ``registry``."""
    names = {spec.name for spec in METRICS}
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in registry.collect():
        if family.name not in names:
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def sample(registry: Any, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)


def trip_lines(path: Path) -> list[dict[str, Any]]:
    """The trip log without its times."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for line in lines:
        line.pop("time", None)
    return lines


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``condition`` every 20 ms until true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


# -- HTTP --------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> Answer:
    """One request on a fresh loopback connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        response = conn.getresponse()
        return Answer(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        conn.close()


@contextmanager
def keep_alive(port: int, timeout: float = 10.0) -> Iterator[http.client.HTTPConnection]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        yield conn
    finally:
        conn.close()


def timed_decisions(
    port: int,
    count: int,
    token: str | None = None,
    timeout: float = 2.0,
    pause: float = 0.0,
    context: Any = None,
) -> list[tuple[int, float]]:
    """``count`` hook decisions (``/v1/decisions/before``), one after another, each on a fresh
    connection with the hook's ``timeout``: ``(status, seconds)`` each, status -1 when none
    came in time. ``context``: an ``ssl.SSLContext`` for HTTPS."""
    results: list[tuple[int, float]] = []
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    for n in range(count):
        body = json.dumps(
            {"session": f"legit-{n % 7}", "tool": "read_file", "arguments": {"path": f"{n}.py"}}
        ).encode()
        start = time.monotonic()
        conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
            if context is not None
            else http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        )
        try:
            conn.request("POST", "/v1/decisions/before", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            status = response.status
        except OSError:
            status = -1
        finally:
            conn.close()
        results.append((status, time.monotonic() - start))
        if pause:
            time.sleep(pause)
    return results


class ServeProcess:
    """A real ``python -m otel_loopguard serve`` on a free loopback HTTP port, no gRPC (with
    ``grpc``: on a free port, :attr:`grpc_port`), with ``args`` added, started and listening;
    its stderr lines are collected in :attr:`lines`. ``open_files``: its file descriptor limit."""

    def __init__(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        grpc: bool = False,
        open_files: int | None = None,
    ) -> None:
        import queue
        import subprocess
        import sys
        import threading

        command = [sys.executable, "-m", "otel_loopguard", "serve", "--http-port", "0"]
        limit: Callable[[], None] | None = None
        if open_files is not None:

            def limit() -> None:
                import resource

                resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        self.process = subprocess.Popen(
            [*command, *(("--grpc-port", "0") if grpc else ("--no-grpc",)), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env) if env is not None else None,
            preexec_fn=limit,
        )
        self.lines: list[str] = []
        started: queue.Queue[str] = queue.Queue()
        stream = self.process.stderr
        assert stream is not None

        def pump() -> None:
            for line in stream:
                self.lines.append(line)
                if " on http://" in line or " on https://" in line:
                    started.put(line)
            started.put("")  # ended before it listened

        threading.Thread(target=pump, daemon=True).start()
        try:
            first = started.get(timeout=timeout)
            assert first, "".join(self.lines)
        except BaseException:
            self.close()
            raise
        #: Its HTTP URL.
        self.url = first.split(" on ", 1)[1].split(";", 1)[0].strip()
        self.port = int(self.url.rsplit(":", 1)[1])
        #: Its gRPC port (with ``grpc``).
        self.grpc_port: int | None = None
        if " OTLP/gRPC on " in first:
            self.grpc_port = int(
                first.split(" OTLP/gRPC on ", 1)[1].split(";", 1)[0].rsplit(":", 1)[1]
            )

    def peak_rss_mb(self) -> float:
        """Its peak resident memory so far (VmHWM in /proc), in MiB."""
        return _proc_status_mb(self.process.pid, "VmHWM")

    def rss_mb(self) -> float:
        """Its resident memory now (VmRSS in /proc), in MiB."""
        return _proc_status_mb(self.process.pid, "VmRSS")

    def kill9(self) -> None:
        """A crash: SIGKILL, nothing drained."""
        import signal

        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (drain and stop); the exit status."""
        import signal

        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def _proc_status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@contextmanager
def serve_process(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 30.0
) -> Iterator[str]:
    """A :class:`ServeProcess`; yields its HTTP URL. Stopped with SIGTERM on exit, which must
    end it with status 0 (drained)."""
    server = ServeProcess(*args, env=env, timeout=timeout)
    try:
        yield server.url
        assert server.stop(timeout) == 0
    finally:
        server.close()


# -- TLS ---------------------------------------------------------------------------------------


def self_signed(directory: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (the ``cryptography`` package, else openssl)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
            + ["-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
            + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
            check=True,
            capture_output=True,
            timeout=30,
        )
        return str(cert), str(key)
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert), str(key)
