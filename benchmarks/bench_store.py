"""Sessions in memory vs in Redis (issue 25): decisions per second and latency per call.

    python benchmarks/bench_store.py [--pairs 4000] [--processes 1,4] [--repeat 3]

Each client process drives its own guard through the public hook API with the default policy,
before_tool + after_tool per call, on bench_engine's "mixed" workload (100 live sessions; in
each, every 5th call repeats the one before it), after 200 pairs of warm-up. Side by side in one
run, for 1 and N client processes started together:

  - memory: ``LoopGuard()``, each process its own sessions (what one process does today);
  - redis: ``LoopGuard(store=URL)`` on a redis-server this script starts on loopback (no
    persistence), every process on the same 100 sessions (each process 37 calls further on in
    the sequence, not in step), so processes update one session at once now and then: the
    compare-and-set's tries again are in the figures and counted per pair;
  - redis, AOF always: the same with ``appendonly yes``, ``appendfsync always`` (no
    acknowledged write lost; an fsync per write, on this machine's disk).

Then ``otel-loopguard serve``'s decision API (HTTP, ``POST /v1/decisions/before``) from one
client, --decisions calls round-robin with no affinity: one serve with sessions in memory vs two
replicas sharing the Redis (``LOOPGUARD_STORE``); decisions per second, p50 / p99 round trip,
and whether the replicas gave exactly the one serve's actions and counts.

Reported: pairs per second over all processes (wall time from the common start to the last
process's end), and the p50 / p99 latency of before_tool (the decision) and of after_tool, over
every call of every process. Medians over --repeat runs. The store timeout is 10 s here, so that
a slow answer is measured rather than answered by store_failure (errors are listed; 0 expected). Needs ``redis-server`` on PATH and the
``redis`` client (``pip install 'otel-loopguard[redis]'``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _results import record
from bench_engine import workload

from otel_loopguard import PRESETS, LoopGuard

WARMUP = 200


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_redis(directory: Path, aof: bool) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)]
    args += ["--save", "", "--appendonly", "yes" if aof else "no", "--appendfsync", "always"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return process, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.02)
    process.kill()
    sys.exit("redis-server did not start")


def client(store: str | None, prefix: str, pairs: int, start: Any, queue: Any, index: int) -> None:
    # A long timeout: a slow answer is measured, not turned into a (fast) fail-open.
    policy = PRESETS["default"].replace(store_prefix=prefix, store_timeout_seconds=10.0)
    guard = LoopGuard(policy, store=store)
    calls = workload("mixed", pairs + WARMUP)
    if store is None:  # each process its own sessions: a process's memory is its own
        calls = [(t, a, f"{s}-p{index}", r) for t, a, s, r in calls]
    else:  # the same sessions, each process at another point of the sequence (not in step)
        shift = index * 37
        calls = calls[shift:] + calls[:shift]
    before, after = guard.before_tool, guard.after_tool
    for tool, arguments, session, result in calls[:WARMUP]:
        if not before(tool, arguments, session=session).blocks:
            after(tool, arguments, session=session, result=result)
    decide: list[int] = []
    report: list[int] = []
    clock = time.perf_counter_ns
    start.wait()
    for tool, arguments, session, result in calls[WARMUP:]:
        t0 = clock()
        decision = before(tool, arguments, session=session)
        t1 = clock()
        decide.append(t1 - t0)
        if not decision.blocks:
            after(tool, arguments, session=session, result=result)
            report.append(clock() - t1)
    retries = getattr(guard._core, "retries", 0)
    queue.put((time.perf_counter(), decide, report, dict(guard.store_errors), retries))


def run(store: str | None, processes: int, pairs: int, prefix: str) -> dict[str, float]:
    context = multiprocessing.get_context("fork")
    start = context.Barrier(processes + 1)
    queue = context.Queue()
    workers = [
        context.Process(target=client, args=(store, prefix, pairs, start, queue, i))
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    results = [queue.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    ended = max(r[0] for r in results)
    decide = sorted(x for r in results for x in r[1])
    report = sorted(x for r in results for x in r[2])
    errors = sum(sum(r[3].values()) for r in results)
    if errors:
        print(f"  store errors: {[r[3] for r in results]}", file=sys.stderr)

    def quantile(values: list[int], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] / 1000  # µs

    return {
        "pairs/s": processes * pairs / (ended - began),
        "decide p50": quantile(decide, 0.50),
        "decide p99": quantile(decide, 0.99),
        "report p50": quantile(report, 0.50),
        "report p99": quantile(report, 0.99),
        "errors": errors,
        "retries": sum(r[4] for r in results) / (processes * pairs),
    }


class Serve:
    """``otel-loopguard serve`` in a subprocess (HTTP only), sessions in ``store`` (given as
    ``LOOPGUARD_STORE``, the policy field) or in its memory."""

    def __init__(self, store: str | None, prefix: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}
        if store is not None:
            env.update(LOOPGUARD_STORE=store, LOOPGUARD_STORE_PREFIX=prefix)
            env.update(LOOPGUARD_STORE_TIMEOUT_SECONDS="10")
        command = [sys.executable, "-m", "otel_loopguard", "serve", "--http-port", "0"]
        self.process = subprocess.Popen(
            [*command, "--no-grpc"], env=env, stderr=subprocess.PIPE, text=True
        )
        self.port = 0
        ready = threading.Event()

        def drain() -> None:  # serve logs a line per decision: keep reading
            assert self.process.stderr is not None
            for line in self.process.stderr:
                match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
                if match is not None and not ready.is_set():
                    self.port = int(match.group(1))
                    ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(60):
            self.process.kill()
            sys.exit("serve did not start")
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def decide(self, body: bytes) -> dict[str, Any]:
        self.conn.request(
            "POST", "/v1/decisions/before", body, {"Content-Type": "application/json"}
        )
        response = self.conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"decision status {response.status}: {data[:200]!r}")
        answer: dict[str, Any] = json.loads(data)
        return answer

    def close(self) -> None:
        self.conn.close()
        self.process.terminate()
        self.process.wait(30)


def serve_run(replicas: list[Serve], count: int) -> tuple[dict[str, float], list[tuple[str, int]]]:
    """``count`` decisions from one client, round-robin over ``replicas`` (no affinity): 20
    sessions, 50 argument values, as bench_serve.py's decision client."""
    times: list[int] = []
    answers: list[tuple[str, int]] = []
    for n in range(count + WARMUP):
        body = json.dumps(
            {"tool": "grep", "arguments": {"pattern": f"p{n % 50}"}, "session": f"s{n % 20}"}
        ).encode()
        started = time.perf_counter_ns()
        answer = replicas[n % len(replicas)].decide(body)
        if n >= WARMUP:
            times.append(time.perf_counter_ns() - started)
        answers.append((str(answer.get("action")), int(answer.get("count", 0))))
    times.sort()
    return {
        "decisions/s": len(times) / (sum(times) / 1e9),
        "p50": times[len(times) // 2] / 1000,
        "p99": times[int(0.99 * len(times))] / 1000,
    }, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=4000, help="pairs per client process")
    parser.add_argument("--processes", default="1,4", help="client process counts")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--decisions", type=int, default=2000, help="serve decisions per setup (0: none)"
    )
    options = parser.parse_args()
    counts = [int(n) for n in options.processes.split(",")]
    print(f"Python {platform.python_version()}, {platform.machine()}, {options.pairs} pairs")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "plain").mkdir()
        (Path(tmp) / "aof").mkdir()
        plain, plain_url = start_redis(Path(tmp) / "plain", aof=False)
        durable, durable_url = start_redis(Path(tmp) / "aof", aof=True)
        try:
            setups = [("memory", None), ("redis", plain_url), ("redis, AOF always", durable_url)]
            rows: dict[tuple[str, int], list[dict[str, float]]] = {}
            for round_ in range(options.repeat):
                for name, url in setups:
                    for processes in counts:
                        prefix = f"bench{round_}-{processes}:"
                        result = run(url, processes, options.pairs, prefix)
                        rows.setdefault((name, processes), []).append(result)
            served: dict[str, list[dict[str, float]]] = {}
            same = True
            for round_ in range(options.repeat if options.decisions else 0):
                runs = [("one serve, memory", None, 1), ("two serve replicas, Redis", plain_url, 2)]
                answers = []
                for name, url, count in runs:
                    replicas = [Serve(url, f"serve{round_}:") for _ in range(count)]
                    try:
                        result, given = serve_run(replicas, options.decisions)
                    finally:
                        for replica in replicas:
                            replica.close()
                    served.setdefault(name, []).append(result)
                    answers.append(given)
                same = same and answers[0] == answers[1]
        finally:
            plain.terminate()
            durable.terminate()
            plain.wait()
            durable.wait()
    print(
        "| store | client processes | pairs/s | before_tool p50 / p99 (µs) |"
        " after_tool p50 / p99 (µs) | tries again per pair | store errors |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (name, processes), results in rows.items():

        def median(field: str, results: list[dict[str, float]] = results) -> float:
            return statistics.median(r[field] for r in results)

        print(
            f"| {name} | {processes} | {median('pairs/s'):,.0f} |"
            f" {median('decide p50'):,.0f} / {median('decide p99'):,.0f} |"
            f" {median('report p50'):,.0f} / {median('report p99'):,.0f} |"
            f" {median('retries'):.3f} | {sum(r['errors'] for r in results):.0f} |"
        )
        setup = f"{name}, {processes} process{'es' if processes > 1 else ''}"
        record(f"{setup}: pairs/s", median("pairs/s"), "pairs/s", better="higher")
        record(f"{setup}: before_tool p50", median("decide p50"), "µs")
        record(f"{setup}: before_tool p99", median("decide p99"), "µs")

    if served:
        print()
        print("| serve decision API, one client | decisions/s | p50 / p99 (µs) |")
        print("| --- | --- | --- |")
        for name, results in served.items():
            rate = statistics.median(r["decisions/s"] for r in results)
            p50 = statistics.median(r["p50"] for r in results)
            p99 = statistics.median(r["p99"] for r in results)
            print(f"| {name} | {rate:,.0f} | {p50:,.0f} / {p99:,.0f} |")
            record(f"serve API, {name}: decisions/s", rate, "decisions/s", better="higher")
            record(f"serve API, {name}: p50", p50, "µs")
        print(f"\nround-robin replicas gave the one serve's actions and counts: {same}")


if __name__ == "__main__":
    main()
