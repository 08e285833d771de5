"""otel-loopguard serve: OTLP/HTTP protobuf ingest throughput and decision API latency.

    python benchmarks/bench_serve.py [--batches 400] [--repeat 3] [--decisions 5000]
        [--workloads mixed,agents,fixtures] [--baseline REV] [--state-dir]

Ingest: ``otel-loopguard serve`` runs as a subprocess pinned to one CPU (``sched_setaffinity``);
a client process pinned to the other CPU sends pre-encoded ``ExportTraceServiceRequest`` bodies
of 512 spans each (encoded by the OpenTelemetry exporter's own encoder from spans a real
TracerProvider recorded, fresh trace ids in every batch) over two keep-alive connections, as
fast as the server answers. Every run (every repeat, every variant) sends the same bodies with
the trace ids changed (XOR with a fresh random mask), so no span is one the server already
received (it drops those as an exporter's retry, far faster than it ingests). The time runs
from the first request until every span was fed to the guard: once the client has every
answer (a request is answered once its spans are queued), the server's threads are read from
/proc every millisecond, and the run ends at the first of two reads in a row where none ran,
when /metrics then shows every span accepted and none queued (else the reads go on). Spans/s
on one core = spans / that time. Server CPU time (user + system, from /proc, up to the same
read) is reported too.

Why so (measured 2026-12-04): the run used to end at a /metrics poll spaced by an estimate of
the work left. The estimate came from the rate while the server was still decoding requests,
so after the last answer it slept 0.45 s while the server drained its queue in 0.22 s: the
server was busy 72% of a 40-batch run (``benchmarks/compare.py``'s), which showed 20.4k spans/s
for 28k spans per second of server CPU, and 64% of a 10-batch run. And each poll makes the server
build its whole /metrics page on the core it ingests on (about 10 ms): a 10-batch run cost 49 µs
of server CPU a span against 35 µs for 40 to 200 batches. Reading /proc costs the server
nothing: now 10 and 200 batches cost the same CPU a span (33 µs on that loaded machine; the
20 warm-up batches suffice). Short runs stay noisier in wall time: a moment's load on the
machine weighs more in them.

Baseline: a bare protobuf parse of the same bytes (``ExportTraceServiceRequest.FromString``) in
this process, on one core; the ratio is ingest seconds per span over parse seconds per span.

Where the time goes: the same batches through the service's pieces in this process, without
HTTP: decoding (``proto_spans``) and the ingest step (trace buffer, conventions, guard), each
timed alone.

Workloads (``--workloads``, default all three):
  - mixed: the realistic mix the ingest target is set on: most spans are HTTP, database and
    model spans with their usual attributes, about 10% tool spans (per request an HTTP server
    span, an invoke_agent span and 8 steps of: a chat span with its HTTP POST to the model
    API, an execute_tool span with a Redis GET, four PostgreSQL queries and two HTTP GETs
    under it); one request in three loops on one call.
  - agents: GenAI-semconv agent runs: per run an invoke_agent span, and per step a chat span
    (model, token counts, a short output message) and an execute_tool span (arguments, call id,
    result); one run in three loops on one call. About half the spans are tool spans.
  - fixtures: the real framework span dumps of tests/data/spans (Pydantic AI,
    LangGraph with OpenInference and OpenLLMetry, Strands), rebuilt through a TracerProvider:
    large LLM spans carrying whole conversations (about 4.7 KB a span).

Decision API: on the same (idle) server, one keep-alive connection, ``POST
/v1/decisions/before`` with a small call, 200 warm-up requests then ``--decisions`` timed round
trips; p50 / p99 / max.

Variants, side by side in one run (each its own serve subprocess, all pinned to the same CPU,
only one busy at a time):
  - current: this working tree's serve (always); with ``PYTHONPATH`` naming another tree
    first (``benchmarks/compare.py``), that tree's.
  - baseline (``--baseline REV``): the serve of a git revision of this repository (e.g.
    ``8a4c614^``), checked out with ``git worktree add --detach`` into a temporary directory
    (removed at the end) and run from there with ``PYTHONPATH`` set to it; only the optional
    serve flags its ``serve --help`` lists are passed.
  - state-dir (``--state-dir``): this tree's serve with ``--state-dir`` (a fresh temporary
    directory per server start).
For each workload and each repeat every variant runs once, in rotating order (repeat 0: A B C,
repeat 1: B C A, ...), so drift in the machine's load hits all of them alike; each reported
figure is the median over the repeats. Each server first takes 20 batches of the workload
untimed (warm-up), and before each run every server must be idle (no CPU time used for 0.1 s).
Decisions are timed in 10 chunks of ``--decisions``/10 calls per variant, in rotating order,
after 200 warm-up calls each. "ratio to current" is the variant's median spans/s
over current's; "paired ratios" are the same ratio per repeat (runs next to each other in time).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import http.client
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from _results import record
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "data" / "spans"
BATCH = 512


# -- workloads ---------------------------------------------------------------------------------


def agent_spans(count: int) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    run = 0
    while len(exporter.get_finished_spans()) < count:
        run += 1
        loops = run % 3 == 0
        with tracer.start_as_current_span(
            f"invoke_agent agent{run % 7}",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": f"agent{run % 7}",
                "gen_ai.conversation.id": f"conv-{run}",
            },
        ):
            for step in range(8):
                with tracer.start_as_current_span(
                    "chat gpt-4o",
                    attributes={
                        "gen_ai.operation.name": "chat",
                        "gen_ai.provider.name": "openai",
                        "gen_ai.request.model": "gpt-4o",
                        "gen_ai.response.model": "gpt-4o",
                        "gen_ai.usage.input_tokens": 1200 + step,
                        "gen_ai.usage.output_tokens": 40,
                        "gen_ai.response.finish_reasons": ("tool_calls",),
                    },
                ) as chat:
                    chat.set_attribute(
                        "gen_ai.output.messages",
                        json.dumps(
                            [
                                {
                                    "role": "assistant",
                                    "parts": [
                                        {"type": "tool_call", "name": "search", "id": f"c{step}"}
                                    ],
                                }
                            ]
                        ),
                    )
                query = "weather in Paris" if loops else f"topic {run}-{step}"
                with tracer.start_as_current_span(
                    "execute_tool search",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "search",
                        "gen_ai.tool.type": "function",
                    },
                ) as tool:
                    tool.set_attribute("gen_ai.tool.call.arguments", json.dumps({"query": query}))
                    tool.set_attribute("gen_ai.tool.call.id", f"call-{run}-{step}")
                    tool.set_attribute("gen_ai.tool.call.result", f"results for {query}")
    return list(exporter.get_finished_spans())[:count]


def _http_client(tracer: Tracer, method: str, url: str, host: str, status: int) -> None:
    """An outgoing HTTP request as httpx/requests instrumentation records it."""
    with tracer.start_as_current_span(
        method,
        kind=SpanKind.CLIENT,
        attributes={
            "http.request.method": method,
            "url.full": url,
            "server.address": host,
            "server.port": 443,
            "network.protocol.version": "1.1",
            "http.response.status_code": status,
            "http.response.body.size": 2048,
        },
    ):
        pass


def _db(tracer: Tracer, system: str, operation: str, table: str, query: str) -> None:
    """A database call as SQLAlchemy/psycopg or redis instrumentation records it."""
    with tracer.start_as_current_span(
        f"{operation} {table}",
        kind=SpanKind.CLIENT,
        attributes={
            "db.system.name": system,
            "db.namespace": "app",
            "db.operation.name": operation,
            "db.collection.name": table,
            "db.query.text": query,
            "server.address": f"{system}.internal",
            "server.port": 5432 if system == "postgresql" else 6379,
        },
    ):
        pass


def mixed_spans(count: int) -> list[ReadableSpan]:
    """The realistic mix: most spans are HTTP, database and model spans, about 10% tool spans.

    Per request: an HTTP server span (the root), an ``invoke_agent`` span, and per step (8) a
    GenAI chat span (usage) with its HTTP POST to the model API, then an ``execute_tool`` span
    running a Redis GET, four PostgreSQL queries and two HTTP GETs: 10 spans a step, 82 a
    request, 8 of them tool spans (9.8%); one request in three loops on one call."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    run = 0
    while len(exporter.get_finished_spans()) < count:
        run += 1
        loops = run % 3 == 0
        with (
            tracer.start_as_current_span(
                "POST /v1/chat",
                kind=SpanKind.SERVER,
                attributes={
                    "http.request.method": "POST",
                    "url.path": "/v1/chat",
                    "url.scheme": "https",
                    "http.route": "/v1/chat",
                    "server.address": "agents.internal",
                    "client.address": f"10.0.{run % 250}.{run % 7}",
                    "user_agent.original": "python-httpx/0.28.1",
                    "http.response.status_code": 200,
                },
            ),
            tracer.start_as_current_span(
                f"invoke_agent agent{run % 7}",
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": f"agent{run % 7}",
                    "gen_ai.conversation.id": f"conv-{run}",
                },
            ),
        ):
            for step in range(8):
                with tracer.start_as_current_span(
                    "chat gpt-4o",
                    kind=SpanKind.CLIENT,
                    attributes={
                        "gen_ai.operation.name": "chat",
                        "gen_ai.provider.name": "openai",
                        "gen_ai.request.model": "gpt-4o",
                        "gen_ai.response.model": "gpt-4o-2024-08-06",
                        "gen_ai.response.id": f"chatcmpl-{run}-{step}",
                        "gen_ai.usage.input_tokens": 1200 + step,
                        "gen_ai.usage.output_tokens": 40,
                        "gen_ai.response.finish_reasons": ("tool_calls",),
                        "server.address": "api.openai.com",
                    },
                ):
                    _http_client(
                        tracer,
                        "POST",
                        "https://api.openai.com/v1/chat/completions",
                        "api.openai.com",
                        200,
                    )
                query = "weather in Paris" if loops else f"topic {run}-{step}"
                with tracer.start_as_current_span(
                    "execute_tool search",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "search",
                        "gen_ai.tool.type": "function",
                    },
                ) as tool:
                    tool.set_attribute("gen_ai.tool.call.arguments", json.dumps({"query": query}))
                    tool.set_attribute("gen_ai.tool.call.id", f"call-{run}-{step}")
                    _db(tracer, "redis", "GET", "cache", f"GET search:{run}:{step}")
                    _db(
                        tracer,
                        "postgresql",
                        "SELECT",
                        "documents",
                        "SELECT id, title, body FROM documents WHERE tsv @@ plainto_tsquery($1)"
                        " ORDER BY rank DESC LIMIT 20",
                    )
                    _db(
                        tracer,
                        "postgresql",
                        "SELECT",
                        "users",
                        "SELECT id, name, plan FROM users WHERE id = $1",
                    )
                    _db(
                        tracer,
                        "postgresql",
                        "SELECT",
                        "permissions",
                        "SELECT scope FROM permissions WHERE user_id = $1 AND tool = $2",
                    )
                    _http_client(
                        tracer,
                        "GET",
                        f"https://search.internal/v2/query?q=topic+{step}",
                        "search.internal",
                        200,
                    )
                    _http_client(
                        tracer,
                        "GET",
                        f"https://search.internal/v2/doc/{run}-{step}",
                        "search.internal",
                        200,
                    )
                    _db(
                        tracer,
                        "postgresql",
                        "INSERT",
                        "search_log",
                        "INSERT INTO search_log (user_id, query, at) VALUES ($1, $2, now())",
                    )
                    tool.set_attribute("gen_ai.tool.call.result", f"results for {query}")
    return list(exporter.get_finished_spans())[:count]


def fixture_spans(count: int) -> list[ReadableSpan]:
    sys.path.insert(0, str(ROOT))
    from tests.span_dumps import load, rebuild

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    paths = sorted(FIXTURES.glob("*/*.jsonl"))
    while len(exporter.get_finished_spans()) < count:
        for path in paths:
            rebuild(load(path), tracer)
    return list(exporter.get_finished_spans())[:count]


def batches(spans: list[ReadableSpan]) -> list[bytes]:
    return [
        encode_spans(spans[i : i + BATCH]).SerializeToString()
        for i in range(0, len(spans) - BATCH + 1, BATCH)
    ]


# -- the variants ------------------------------------------------------------------------------

#: optional serve flags (with their values) passed when a variant's ``serve --help`` lists them
OPTIONAL_FLAGS: tuple[tuple[str, ...], ...] = (("--no-grpc",), ("--max-queued-spans", "1000000"))
STATE_DIR_FLAG = "--state-dir"
#: batches each server takes untimed before a workload's timed runs
WARMUP_BATCHES = 20


class BenchError(Exception):
    """A variant cannot be set up or started: reported in one message, exit status 2."""


@dataclasses.dataclass
class Variant:
    """One serve build: where it runs from and the serve arguments it gets."""

    name: str
    tree: Path  # the checkout whose otel_loopguard package it imports (also its cwd)
    description: str
    state_dir: bool = False
    args: list[str] = dataclasses.field(default_factory=list)
    dropped: list[str] = dataclasses.field(default_factory=list)
    package: str = ""

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        paths = [str(self.tree)]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    def prepare(self) -> None:
        """Check it imports its own tree's package, and pick the flags its serve knows."""
        found = subprocess.run(
            [sys.executable, "-c", "import otel_loopguard; print(otel_loopguard.__file__)"],
            cwd=self.tree,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        package = Path(found.stdout.strip() or "?").resolve()
        if found.returncode != 0 or not package.is_relative_to(self.tree.resolve()):
            raise BenchError(
                f"variant {self.name}: otel_loopguard imports from {package}, not from"
                f" {self.tree} (exit {found.returncode}): {found.stderr.strip()[-500:]}"
            )
        self.package = str(package.parent)
        shown = subprocess.run(
            [sys.executable, "-m", "otel_loopguard", "serve", "--help"],
            cwd=self.tree,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if shown.returncode != 0:
            raise BenchError(
                f"variant {self.name}: 'otel-loopguard serve --help' failed (exit"
                f" {shown.returncode}): {shown.stderr.strip()[-500:]}"
            )
        known = set(re.findall(r"--[a-z][a-z0-9-]*", shown.stdout))
        if "--http-port" not in known:
            raise BenchError(f"variant {self.name}: its serve has no --http-port option")
        self.args = ["--http-port", "0"]
        for flag in OPTIONAL_FLAGS:
            if flag[0] in known:
                self.args += flag
            else:
                self.dropped.append(flag[0])
        if self.state_dir and STATE_DIR_FLAG not in known:
            raise BenchError(
                f"variant {self.name}: this tree's 'otel-loopguard serve' has no {STATE_DIR_FLAG}"
                f" option (yet), so the {STATE_DIR_FLAG} variant cannot run; leave out"
                f" {STATE_DIR_FLAG} or add the option to serve first"
            )


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[tuple[Path, str]]:
    """A detached ``git worktree`` of ``revision`` in a temporary directory, removed after."""
    resolved = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if resolved.returncode != 0:
        raise BenchError(f"--baseline {revision}: not a commit of {ROOT}")
    commit = resolved.stdout.strip()
    subject = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%h %s", commit],
        capture_output=True,
        text=True,
    ).stdout.strip()
    tree = Path(tempfile.mkdtemp(prefix="bench-serve-baseline-"))
    added = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit],
        capture_output=True,
        text=True,
    )
    try:
        if added.returncode != 0:
            raise BenchError(f"git worktree add {tree} {revision}: {added.stderr.strip()}")
        yield tree, subject
    finally:
        if added.returncode == 0:
            removed = subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
                text=True,
            )
            if removed.returncode != 0:
                print(
                    f"warning: git worktree remove --force {tree}: {removed.stderr.strip()}",
                    file=sys.stderr,
                )
        shutil.rmtree(tree, ignore_errors=True)


# -- the server --------------------------------------------------------------------------------


class Server:
    """A variant's ``otel-loopguard serve`` in a subprocess pinned to ``cpu``."""

    def __init__(self, variant: Variant, cpu: int, timeout: float = 60.0) -> None:
        self.variant = variant
        self.cpu = cpu
        self.port = 0
        self.state_dir: Path | None = None
        args = list(variant.args)
        if variant.state_dir:
            self.state_dir = Path(tempfile.mkdtemp(prefix="bench-serve-state-"))
            args += [STATE_DIR_FLAG, str(self.state_dir)]
        self.command = [sys.executable, "-m", "otel_loopguard", "serve", *args]
        self._lines: collections.deque[str] = collections.deque(maxlen=40)
        self._ready = threading.Event()
        self.process = subprocess.Popen(
            self.command,
            cwd=variant.tree,
            env=variant.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
        )
        # serve logs a line per decision on stderr: keep reading it, or a full pipe stalls it
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self._failed(timeout)

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if not self._ready.is_set():
                self._lines.append(line.rstrip("\n"))
                match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
                if match is not None:
                    self.port = int(match.group(1))
                    self._ready.set()

    def _failed(self, timeout: float) -> None:
        running = self.process.poll() is None
        self.close()
        self._reader.join(5)
        said = "\n  ".join(self._lines) or "(nothing on stderr)"
        how = (
            f"not listening after {timeout:.0f} s" if running else f"exit {self.process.returncode}"
        )
        hint = ""
        unknown = re.search(r"unrecognized arguments: (.*)", "\n".join(self._lines))
        if unknown is not None:
            hint = f"; this serve does not know {unknown.group(1).split()[0]}"
        raise BenchError(
            f"variant {self.variant.name}: serve did not start ({how}{hint}):"
            f" {shlex.join(self.command)}\n  {said}"
        )

    def page(self) -> str:
        """The server's /metrics page (building it costs the server a few ms of CPU)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        return text

    def metric(self, name: str, text: str | None = None, **labels: str) -> float:
        """One sample of ``text`` (a fresh page when None); 0 when missing."""
        if text is None:
            text = self.page()
        wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pattern = re.escape(f"{name}{{{wanted}}}" if labels else name) + r" ([0-9.e+]+)"
        found = re.search(pattern, text)
        return float(found.group(1)) if found else 0.0

    def busy(self) -> bool:
        """Whether a thread of the server is running or runnable (``R``) or in uninterruptible
        I/O (``D``: an fsync of --state-dir), read from /proc: free for the server, unlike a
        /metrics poll. A thread waiting for the GIL sleeps (``S``), but then another holds it."""
        busy = False
        with contextlib.suppress(OSError):
            for task in os.scandir(f"/proc/{self.process.pid}/task"):
                with contextlib.suppress(OSError):
                    stat = Path(task.path, "stat").read_text()
                    if stat[stat.rindex(")") + 2] in "RD":
                        busy = True
                        break
        return busy

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)


def quiet(servers: Sequence[Server], timeout: float = 10.0) -> None:
    """Wait until no server used CPU time for 0.1 s (at most ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    before = [server.cpu_seconds() for server in servers]
    while time.monotonic() < deadline:
        time.sleep(0.1)
        after = [server.cpu_seconds() for server in servers]
        if after == before:
            return
        before = after
    busy = [s.variant.name for s, a, b in zip(servers, after, before, strict=True) if a != b]
    print(f"note: servers still busy after {timeout:.0f} s: {', '.join(busy)}", file=sys.stderr)


def send_all(port: int, bodies: list[bytes], connections: int = 2) -> None:
    """Send every body (split over ``connections`` keep-alive connections, each in a thread)."""
    errors: list[str] = []

    def sender(part: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for body in part:
            while True:
                conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
                response = conn.getresponse()
                response.read()
                if response.status == 429:
                    time.sleep(0.01)
                    continue
                if response.status != 200:
                    errors.append(f"status {response.status}")
                break
        conn.close()

    threads = [
        threading.Thread(target=sender, args=(bodies[n::connections],)) for n in range(connections)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(errors[:3])


def ingest_run(server: Server, bodies: list[bytes], spans: int) -> tuple[float, float]:
    """(wall seconds, server CPU seconds) from the first request until every span was fed to
    the guard. Once the client got every answer (each request is answered once its spans are
    queued), the server's threads are read from /proc every millisecond; when none ran for two
    reads in a row the queue is checked on /metrics, and the run ended at the first idle read.
    Polling /metrics while the queue drains would cost the server's core a few ms a poll, and
    sleeping by an estimate of the work left overshot the end (see the module docstring)."""
    page = server.page()
    duplicates = server.metric("loopguard_otlp_spans_total", page, result="duplicate")
    before = server.metric("loopguard_otlp_spans_total", page, result="accepted")
    cpu = server.cpu_seconds()
    started = time.perf_counter()
    client = threading.Thread(target=send_all, args=(server.port, bodies))
    client.start()
    client.join()
    idle_since: tuple[float, float] | None = None
    last_page = time.perf_counter()
    while True:
        now = time.perf_counter()
        if server.busy():
            idle_since = None
        elif idle_since is None:
            idle_since = (now, server.cpu_seconds())
        else:
            page = server.page()  # idle twice: done, unless the queue still holds spans
            last_page = time.perf_counter()
            accepted = server.metric("loopguard_otlp_spans_total", page, result="accepted")
            queued = server.metric("loopguard_ingest_queue_spans", page)
            if accepted - before >= spans and queued == 0:
                wall, cpu = idle_since[0] - started, idle_since[1] - cpu
                break
            idle_since = None
        if now - last_page > 1.0:  # never seen idle for a second: /metrics then, as a fallback
            page = server.page()
            last_page = time.perf_counter()
            accepted = server.metric("loopguard_otlp_spans_total", page, result="accepted")
            queued = server.metric("loopguard_ingest_queue_spans", page)
            if accepted - before >= spans and queued == 0:
                wall, cpu = time.perf_counter() - started, server.cpu_seconds() - cpu
                break
        time.sleep(0.001)
    dropped = server.metric("loopguard_otlp_spans_total", page, result="duplicate") - duplicates
    if dropped:
        print(
            f"warning: {server.variant.name} dropped {dropped:.0f} duplicate spans", file=sys.stderr
        )
    return wall, cpu


def rekeyed(bodies: list[bytes]) -> list[bytes]:
    """``bodies`` with every trace id XORed with one fresh random mask: the same spans, sizes and
    trace structure, but traces the server has not seen (it drops a span it already received as
    an exporter's retry, so sending the same bodies again would time only that drop)."""
    mask = int.from_bytes(os.urandom(16), "big")

    def new_id(trace_id: bytes) -> bytes:
        return (int.from_bytes(trace_id, "big") ^ mask).to_bytes(16, "big")

    fresh = []
    for body in bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    span.trace_id = new_id(span.trace_id)
                    for link in span.links:
                        link.trace_id = new_id(link.trace_id)
        fresh.append(request.SerializeToString())
    return fresh


def bare_parse(bodies: list[bytes]) -> float:
    started = time.perf_counter()
    for body in bodies:
        ExportTraceServiceRequest.FromString(body)
    return time.perf_counter() - started


def pieces(bodies: list[bytes]) -> tuple[float, float]:
    """Seconds to decode, and to ingest (buffer, conventions, guard), every body in process."""
    from otel_loopguard import LoopGuard
    from otel_loopguard._traces import TraceBuffer
    from otel_loopguard.metrics import PrometheusRecorder
    from otel_loopguard.service._ingest import Ingest
    from otel_loopguard.service._proto import proto_spans

    started = time.perf_counter()
    decoded = [proto_spans(body) for body in bodies]
    decode = time.perf_counter() - started
    guard = LoopGuard(recorder=PrometheusRecorder())
    ingest = Ingest(guard, TraceBuffer(hold_seconds=2.0), 10**9, 2.0)
    started = time.perf_counter()
    for batch in decoded:
        ingest._add(batch)
    add = time.perf_counter() - started
    ingest.close(10)
    return decode, add


class Decisions:
    """Timed ``POST /v1/decisions/before`` round trips on one keep-alive connection."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.sent = 0
        self.reconnects = 0

    def _post(self, body: bytes) -> int:
        self.conn.request(
            "POST", "/v1/decisions/before", body, {"Content-Type": "application/json"}
        )
        response = self.conn.getresponse()
        response.read()
        return response.status

    def run(self, count: int) -> list[float]:
        times: list[float] = []
        for _ in range(count):
            n = self.sent
            self.sent += 1
            body = json.dumps(
                {
                    "tool": "grep",
                    "arguments": {"pattern": f"p{n % 50}"},
                    "session": f"s{n % 20}",
                    "agent": "bench",
                }
            ).encode()
            started = time.perf_counter_ns()
            try:
                status = self._post(body)
            except (http.client.RemoteDisconnected, ConnectionError):
                # the server closed the idle keep-alive connection: reconnect, time the retry
                self.conn.close()
                self.reconnects += 1
                started = time.perf_counter_ns()
                status = self._post(body)
            elapsed = time.perf_counter_ns() - started
            if status != 200:
                raise RuntimeError(f"decision status {status}")
            times.append(elapsed / 1e6)
        return times

    def close(self) -> None:
        self.conn.close()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def rotated(items: Sequence[Server], shift: int) -> list[Server]:
    """``items`` starting at ``shift`` (modulo its length): A B C, B C A, C A B, ..."""
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def chunks(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal counts (none empty)."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if n < total % parts else 0) for n in range(parts)]


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware", "cpu model"):
                return value.strip()
    return platform.processor() or "unknown"


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=400, help="batches of 512 per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--decisions", type=int, default=5000)
    parser.add_argument(
        "--workloads",
        default="mixed,agents,fixtures",
        help="comma-separated workloads to run (default: mixed,agents,fixtures)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also measure the serve of this git revision of the repository (e.g. 8a4c614^)",
    )
    parser.add_argument(
        "--state-dir",
        action="store_true",
        help="also measure this tree's serve with --state-dir (a fresh temporary directory)",
    )
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C: the servers stop, the worktree and state dirs are removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return bench(args)
    except BenchError as exc:
        print(f"bench_serve: error: {exc}", file=sys.stderr)
        return 2


def bench(args: argparse.Namespace) -> int:
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[0]
    if len(cpus) > 1:
        os.sched_setaffinity(0, set(cpus[1:]))  # the client stays off the server's core
    print(f"# {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC,"
        f" {platform.uname().machine}, {cpu_model()}; load average at start {load_average()}"
    )
    print(
        f"# {platform.python_implementation()} {platform.python_version()},"
        f" {platform.machine()}, {os.cpu_count()} CPUs; server pinned to CPU {server_cpu},"
        f" client to CPU {','.join(map(str, cpus[1:] or cpus))}"
    )
    # The package this Python imports: this working tree's, or that of the tree PYTHONPATH
    # names first (benchmarks/compare.py runs this script so against a git ref's worktree).
    import otel_loopguard

    tree = Path(otel_loopguard.__file__).resolve().parents[1]
    here = "this working tree" if tree == ROOT else f"the tree on PYTHONPATH, {tree}"
    with contextlib.ExitStack() as stack:
        variants = [Variant("current", tree, here)]
        if args.baseline:
            tree, subject = stack.enter_context(worktree(args.baseline))
            variants.append(Variant("baseline", tree, f"{args.baseline} = {subject}"))
        if args.state_dir:
            variants.append(Variant("state-dir", tree, f"{here}, {STATE_DIR_FLAG} DIR", True))
        for variant in variants:
            variant.prepare()
            dropped = f"; not passed (unknown to it): {' '.join(variant.dropped)}"
            print(
                f"# variant {variant.name}: {variant.description}; package {variant.package}"
                + (dropped if variant.dropped else "")
            )
        makers = {"mixed": mixed_spans, "agents": agent_spans, "fixtures": fixture_spans}
        wanted = [name.strip() for name in args.workloads.split(",") if name.strip()]
        unknown = [name for name in wanted if name not in makers]
        if unknown or not wanted:
            raise BenchError(
                f"--workloads {args.workloads!r}: expected names among {', '.join(makers)}"
            )
        if "fixtures" in wanted and not FIXTURES.is_dir():
            raise BenchError(f"--workloads fixtures: {FIXTURES} is missing")
        workloads = {name: makers[name](args.batches * BATCH) for name in wanted}
        servers: list[Server] = []
        for variant in variants:
            server = Server(variant, server_cpu)
            stack.callback(server.close)
            servers.append(server)
        measure(args, servers, workloads)
    print(f"\n# load average at end {load_average()}")
    return 0


def measure(
    args: argparse.Namespace, servers: list[Server], workloads: dict[str, list[ReadableSpan]]
) -> None:
    current = servers[0]
    for name, spans in workloads.items():
        bodies = batches(spans)
        total = len(bodies) * BATCH
        size = sum(map(len, bodies)) / total
        walls: dict[str, list[float]] = {server.variant.name: [] for server in servers}
        cpus_used: dict[str, list[float]] = {server.variant.name: [] for server in servers}
        parses = []
        for server in servers:  # warm-up, untimed: the first requests of a server are slower
            warmup = rekeyed(bodies[:WARMUP_BATCHES])
            quiet(servers)
            ingest_run(server, warmup, len(warmup) * BATCH)
        for repeat in range(args.repeat):
            for server in rotated(servers, repeat):
                fresh = rekeyed(bodies)
                quiet(servers)
                wall, cpu = ingest_run(server, fresh, total)
                walls[server.variant.name].append(wall)
                cpus_used[server.variant.name].append(cpu)
            quiet(servers)
            parses.append(bare_parse(bodies))
        wall = statistics.median(walls["current"])
        cpu = statistics.median(cpus_used["current"])
        parse = statistics.median(parses)
        decode, add = pieces(bodies)
        print(
            f"\n## ingest, workload {name}: {len(bodies)} batches of {BATCH} spans,"
            f" {size:,.0f} B/span"
        )
        print(f"ingest spans/s (one core, wall): {total / wall:,.0f}")
        record(f"{name}: ingest spans/s", total / wall, "spans/s", better="higher")
        record(f"{name}: server CPU per span", cpu / total * 1e6, "µs")
        print(
            f"server CPU s per 1k spans: {cpu / total * 1e3 * 1e3:.2f} ms"
            f" (spans per CPU-second {total / cpu:,.0f})"
        )
        print(f"bare parse spans/s: {total / parse:,.0f}")
        print(f"ratio ingest / bare parse: {wall / parse:.2f}x")
        print(
            f"in process, per span: bare parse {parse / total * 1e6:.2f} us,"
            f" decode {decode / total * 1e6:.2f} us, ingest (buffer + conventions +"
            f" guard) {add / total * 1e6:.2f} us; HTTP and the rest"
            f" {(wall - decode - add) / total * 1e6:.2f} us"
        )
        rows = []
        for server in servers:
            own = walls[server.variant.name]
            paired = sorted(a / b for a, b in zip(walls["current"], own, strict=True))
            rows.append(
                [
                    server.variant.name,
                    f"{total / statistics.median(own):,.0f}",
                    f"{wall / statistics.median(own):.2f}x",
                    f"{statistics.median(cpus_used[server.variant.name]) / total * 1e6:.2f}",
                    "—" if server is current else f"{paired[0]:.2f}–{paired[-1]:.2f}x",
                ]
            )
        if "baseline" in walls:
            base = statistics.median(walls["baseline"])
            record(f"{name}: spans/s ratio to baseline", base / wall, "x", better="higher")
            # CPU time a span is steadier than wall time on a loaded machine (other processes
            # on the server's core stretch the wall time, barely its CPU time)
            base_cpu = statistics.median(cpus_used["baseline"])
            record(f"{name}: server CPU per span ratio to baseline", cpu / base_cpu, "x")
        print(
            f"\n{name}, median of {args.repeat} (rotating order; ratio = variant spans/s over"
            " current's):\n"
        )
        print(
            table(
                [
                    "variant",
                    "spans/s (median)",
                    "ratio to current",
                    "server CPU µs/span",
                    "paired ratios (min–max)",
                ],
                rows,
            )
        )

    clients = {server.variant.name: Decisions(server.port) for server in servers}
    times: dict[str, list[float]] = {name: [] for name in clients}
    try:
        for server in servers:
            quiet(servers)
            clients[server.variant.name].run(200)  # warm-up
        for index, count in enumerate(chunks(args.decisions, 10)):
            for server in rotated(servers, index):
                quiet(servers)
                times[server.variant.name] += clients[server.variant.name].run(count)
    finally:
        for client in clients.values():
            client.close()
    own = times["current"]
    print(f"\n## decision API (POST /v1/decisions/before, keep-alive, {len(own)} calls)")
    record("decision API p50", percentile(own, 0.50), "ms")
    record("decision API p99", percentile(own, 0.99), "ms")
    print(
        f"p50 {percentile(own, 0.50):.3f} ms, p99 {percentile(own, 0.99):.3f} ms,"
        f" max {max(own):.3f} ms"
    )
    print(
        f"\ndecisions, {len(own)} per variant in {len(chunks(args.decisions, 10))} chunks"
        " (rotating order), ms:\n"
    )
    rows = [
        [
            name,
            f"{percentile(values, 0.50):.3f}",
            f"{percentile(values, 0.99):.3f}",
            f"{max(values):.3f}",
        ]
        for name, values in times.items()
    ]
    print(table(["variant", "p50", "p99", "max"], rows))
    for name, client in clients.items():
        if client.reconnects:
            print(f"({name}: {client.reconnects} keep-alive connection(s) closed by the server)")


if __name__ == "__main__":
    sys.exit(main())
