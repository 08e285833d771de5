"""Serve replicas sharing one Redis (``serve --store URL``): real ``serve`` processes and a real
``redis-server`` on loopback. Behind a plain round-robin client (no affinity) they give the same
decisions and counts as one serve keeping its sessions in memory; spans sent to one replica and
hook decisions to another (the Collector routing spans by trace while hooks hit any replica) see
one session; a replica killed with SIGKILL mid-run loses nothing the others need."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .redis_tools import RedisServer, require_redis_server
from .service_tools import ServeProcess, request, require_serve_prerequisites

require_serve_prerequisites()

from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: E402
    OTLPSpanExporter,
)
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from .service_tools import wait_for  # noqa: E402

REPLICAS = 3
#: The guard's counters compared between the replicas (summed) and one serve.
COUNTERS = (
    "loopguard_decisions_total",
    "loopguard_repeated_calls_total",
    "loopguard_stopped_runs_total",
    "loopguard_tool_calls_total",
)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    require_redis_server()
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


def _serve(*args: str, store: str | None = None) -> ServeProcess:
    extra = ("--store", store) if store is not None else ()
    return ServeProcess("--hold-seconds", "0.2", "--key-by", "conversation", *extra, *args)


def _script() -> list[tuple[str, dict[str, Any]]]:
    """A scripted hook workload: three sessions whose agent loops on one call (the default
    policy reminds, denies, then stops it), one that works, and a user prompt that lifts a
    stop; interleaved, so that every session's calls land on every replica."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for step in range(9):
        for session in ("loop-a", "loop-b", "loop-c"):
            call = {
                "session": session,
                "agent": "coder",
                "tool": "grep",
                "arguments": {"pattern": "TODO"},
                "call_id": f"{session}-{step}",
            }
            # A command hook of a host that shows text only with a call's result: the reminder
            # is held by the replica that decided it, and taken by the one the result reaches.
            calls.append(("before", {**call, "hold_reminder": True}))
            calls.append(("after", {**call, "result": "3 matches", "duration_seconds": 0.1}))
        work = {
            "session": "healthy",
            "agent": "coder",
            "tool": "read_file",
            "arguments": {"path": f"src/{step}.py"},
            "call_id": f"healthy-{step}",
        }
        calls.append(("before", work))
        calls.append(("after", {**work, "result": f"contents {step}"}))
        if step == 6:
            calls.append(("user_message", {"session": "loop-b", "text": "try another way"}))
    return calls


def _decide(port: int, endpoint: str, body: dict[str, Any]) -> Any:
    answer = request(
        port,
        "POST",
        f"/v1/decisions/{endpoint}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    assert answer.status == 200, (endpoint, answer.status, answer.body)
    return answer.json()


def _counts(ports: list[int]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The guard's counters, summed over ``ports``' ``/metrics``."""
    total: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for port in ports:
        page = request(port, "GET", "/metrics")
        assert page.status == 200
        for family in text_string_to_metric_families(page.body.decode()):
            if family.name + "_total" not in COUNTERS and family.name not in COUNTERS:
                continue
            for sample in family.samples:
                if not sample.name.endswith("_total"):
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                total[key] = total.get(key, 0.0) + sample.value
    return {key: value for key, value in total.items() if value}


def _run(ports: list[int], calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Each call to the next port, round robin."""
    return [
        _decide(ports[n % len(ports)], endpoint, body) for n, (endpoint, body) in enumerate(calls)
    ]


def test_replicas_behind_round_robin_decide_as_one_serve(redis: RedisServer) -> None:
    calls = _script()
    one = _serve()
    try:
        expected = _run([one.port], calls)
        expected_counts = _counts([one.port])
    finally:
        assert one.stop() == 0
    replicas = [_serve(store=redis.url) for _ in range(REPLICAS)]
    try:
        ports = [replica.port for replica in replicas]
        started = replicas[0].lines[0]
        assert f"sessions in {redis.url}" in started, started  # its start line names the store
        got = _run(ports, calls)
        counts = _counts(ports)
    finally:
        for replica in replicas:
            replica.stop()
            replica.close()
    assert got == expected
    actions = [answer["decision"]["action"] for answer in got if answer.get("decision")]
    assert {"remind", "deny", "stop"} <= set(actions)  # the script does loop
    # Held reminders came back with the results, though another replica decided them.
    assert sum("reminder" in answer for answer in got) >= 3
    assert counts == expected_counts
    stopped = sum(v for (name, _), v in counts.items() if name == "loopguard_stopped_runs_total")
    assert stopped == 3  # each looping session stopped once


def _send_loop(port: int, conversation: str, times: int) -> str:
    """A looping agent run of ``times`` grep calls in ``conversation``, through the real
    OTLP/HTTP exporter to ``port``; its trace id (hex)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "agent"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces"))
    )
    tracer = provider.get_tracer("scripted")
    conv = {"gen_ai.conversation.id": conversation}
    with tracer.start_as_current_span(
        "invoke_agent coder",
        attributes={**conv, "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "coder"},
    ) as root:
        trace_id = format(root.get_span_context().trace_id, "032x")
        for n in range(times):
            with tracer.start_as_current_span(
                "execute_tool grep",
                attributes={
                    **conv,
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "grep",
                },
            ) as span:
                span.set_attribute("gen_ai.tool.call.arguments", json.dumps({"pattern": "TODO"}))
                span.set_attribute("gen_ai.tool.call.id", f"{conversation}-{n}")
                span.set_attribute("gen_ai.tool.call.result", "3 matches")
    provider.shutdown()
    return trace_id


def _split(spans_port: int, hooks_port: int) -> list[Any]:
    """Spans of a loop to one port, then the same agent's next calls as hook decisions to the
    other: the answers."""
    _send_loop(spans_port, "conv-split", 4)
    assert wait_for(
        lambda: (
            ("loopguard_tool_calls_total", (("agent", "coder"), ("tool", "grep")))
            in _counts([spans_port])
        ),
        15,
    )
    call = {
        "session": "conv-split",
        "agent": "coder",
        "tool": "grep",
        "arguments": {"pattern": "TODO"},
    }
    return [
        _decide(hooks_port, "before", {**call, "call_id": f"hook-{n}"})["decision"]
        for n in range(4)
    ]


def test_spans_to_one_replica_and_hooks_to_another_see_one_session(redis: RedisServer) -> None:
    one = _serve()
    try:
        expected = _split(one.port, one.port)
    finally:
        assert one.stop() == 0
    spans, hooks = _serve(store=redis.url), _serve(store=redis.url)
    try:
        got = _split(spans.port, hooks.port)
    finally:
        for replica in (spans, hooks):
            replica.stop()
            replica.close()
    assert got == expected
    # The hook replica saw the four calls the spans reported to the other one: its first
    # decision already blocks.
    assert got[0]["action"] in ("deny", "stop"), got


def test_a_replica_killed_mid_run_leaves_exact_counts(redis: RedisServer) -> None:
    calls = _script()
    half = len(calls) // 2
    one = _serve()
    try:
        expected = _run([one.port], calls)
        expected_counts = _counts([one.port])
    finally:
        assert one.stop() == 0
    replicas = [_serve(store=redis.url) for _ in range(REPLICAS)]
    try:
        ports = [replica.port for replica in replicas]
        got = _run(ports, calls[:half])
        killed = replicas[0]
        before_kill = _counts([killed.port])
        killed.kill9()
        # The rest round robin over the two left.
        got += _run(ports[1:], calls[half:])
        counts = _counts(ports[1:])
    finally:
        for replica in replicas:
            if replica.process.poll() is None:
                replica.stop()
            replica.close()
    assert got == expected
    # The dead replica's counters died with it; what the two others counted plus what it had
    # counted is what one serve counts.
    for key, value in before_kill.items():
        counts[key] = counts.get(key, 0.0) + value
    assert counts == expected_counts


def test_store_with_state_dir_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_loopguard",
            "serve",
            "--http-port",
            "0",
            "--no-grpc",
            "--store",
            "redis://127.0.0.1:1/0",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--state-dir cannot be combined with --store" in done.stderr
    assert not (tmp_path / "state").exists()


def test_a_replica_whose_redis_is_down_still_answers_every_decision() -> None:
    """The guard answers as ``store_failure`` says (open: allow) and a held reminder is lost,
    logged once; no request fails and none waits past the store's timeout."""
    import time

    from otel_loopguard.config import PRESETS
    from otel_loopguard.service import ServeOptions, Service

    from .redis_tools import free_port

    require_redis_server()
    options = ServeOptions(http_port=0, grpc_port=None, store=f"redis://127.0.0.1:{free_port()}/0")
    with Service(options, policy=PRESETS["default"]) as service:
        start = time.monotonic()
        for n in range(6):
            call = {"session": "s", "tool": "grep", "arguments": {}, "call_id": f"c{n}"}
            before = _decide(service.http_port, "before", {**call, "hold_reminder": True})
            assert before["decision"]["action"] == "allow"
            _decide(service.http_port, "after", {**call, "result": "same"})
        assert time.monotonic() - start < 10
        assert service.guard.store_errors  # counted


def test_service_refuses_store_with_state_dir(tmp_path: Path) -> None:
    from otel_loopguard.service import ServeOptions

    with pytest.raises(ValueError, match="store, state_dir: give one"):
        ServeOptions(store="redis://127.0.0.1:1/0", state_dir=str(tmp_path))
