"""``serve --state-dir``: kill -9 and a restart on the same directory lose no span answered 200,
and every loop count goes on where it was (issue 14).

Each test drives real ``python -m otel_loopguard serve`` processes over loopback: the real OTLP
HTTP exporter sends spans recorded by a real TracerProvider, hooks' calls go to the decision API.
The same script runs against a server that is never stopped and against one killed with SIGKILL
(twice: once with only the log to replay, once with a snapshot and the log); the decisions at
the end must be the same.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.service_tools import (
    ServeProcess,
    request,
    require_serve_prerequisites,
    run_agent,
    wait_for,
)

require_serve_prerequisites()

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from tests.service_tools import looping  # noqa: E402


class Serve(ServeProcess):
    """A serve that holds tool spans for their trace's root long enough for any test."""

    def __init__(self, *args: str) -> None:
        super().__init__("--hold-seconds", "600", *args)


@contextmanager
def serving(*args: str) -> Iterator[Serve]:
    server = Serve(*args)
    try:
        yield server
    finally:
        server.close()


def _decide(port: int, endpoint: str, **body: Any) -> Any:
    answer = request(
        port,
        "POST",
        f"/v1/decisions/{endpoint}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    assert answer.status == 200, answer.body
    return answer.json()


def _hook_loop(port: int, times: int) -> None:
    for _ in range(times):
        _decide(port, "before", session="hook-1", tool="grep", arguments={"q": "x"})
        _decide(port, "after", session="hook-1", tool="grep", arguments={"q": "x"}, result="same")


def _export(url: str, spans: Sequence[ReadableSpan]) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", timeout=30)
    try:
        assert exporter.export(spans) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]


def _queue_empty(port: int) -> bool:
    page = request(port, "GET", "/metrics").body.decode()
    return "\nloopguard_ingest_queue_spans 0.0\n" in page


class Script:
    """The inputs, recorded once (the same span ids for every server)."""

    def __init__(self) -> None:
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("script")
        run_agent(tracer, looping("coder", 4, "grep", {"pattern": "TODO"}, "3 matches"))
        self.complete = list(memory.get_finished_spans())  # a whole trace, root last
        memory.clear()
        run_agent(tracer, looping("searcher", 4, "search", {"q": "paris"}, "same"))
        held = list(memory.get_finished_spans())
        provider.shutdown()
        self.open = [s for s in held if s.parent is not None]  # waits for its root (hold 600 s)
        self.root = [s for s in held if s.parent is None]
        assert len(self.root) == 1

    @staticmethod
    def _session(spans: Sequence[ReadableSpan]) -> tuple[str, str]:
        agent = next(s for s in spans if s.parent is None)
        assert agent.context is not None
        return (
            f"{agent.context.trace_id:032x}/{agent.context.span_id:016x}",
            str((agent.attributes or {})["gen_ai.agent.name"]),
        )

    def phase1(self, server: Serve) -> None:
        _hook_loop(server.port, 3)
        _export(server.url, self.complete)
        _export(server.url, self.open)  # answered 200, not judged: its trace has no root yet

    def phase2(self, server: Serve) -> None:
        _hook_loop(server.port, 2)
        _decide(server.port, "new_run", session="hook-2")
        _hook_loop(server.port, 0)
        _export(server.url, self.root)
        assert wait_for(lambda: _queue_empty(server.port))

    def probes(self, server: Serve) -> list[Any]:
        """The decisions that show where each count is (each probe is a call too)."""
        answers = []
        for session, agent, tool, arguments in (
            ("hook-1", None, "grep", {"q": "x"}),
            (*self._session(self.complete), "grep", {"pattern": "TODO"}),
            (*self._session(self.open + self.root), "search", {"q": "paris"}),
        ):
            body: dict[str, Any] = {"session": session, "tool": tool, "arguments": arguments}
            if agent is not None:
                body["agent"] = agent
            decision = _decide(server.port, "before", **body)["decision"]
            answers.append({k: decision[k] for k in ("action", "count", "rule", "detected")})
        return answers


@pytest.mark.slow
def test_kill_9_and_restart_lose_nothing_and_counts_go_on(tmp_path: Path) -> None:
    script = Script()
    with serving() as control:
        script.phase1(control)
        script.phase2(control)
        expected = script.probes(control)
        assert control.stop() == 0
    # The probes reached the sessions the spans made (counts past the first call).
    assert [answer["count"] for answer in expected] == [6, 5, 5], expected

    state = tmp_path / "state"
    with serving("--state-dir", str(state)) as first:
        script.phase1(first)
        first.kill9()  # right after the 200s: the open trace's spans are in no snapshot
    with serving("--state-dir", str(state)) as second:
        assert any("applied again" in line for line in second.lines), second.lines
        script.phase2(second)
        second.kill9()  # now a snapshot (written at the restart) and a log after it
    with serving("--state-dir", str(state)) as third:
        assert script.probes(third) == expected
        assert third.stop() == 0
    # A clean stop leaves a snapshot and an empty log (its header alone).
    from otel_loopguard.service._durable import _LOG_HEADER_SIZE

    logs = sorted(state.glob("wal-*.log"))
    assert [path.stat().st_size for path in logs] == [_LOG_HEADER_SIZE]
    assert (state / "snapshot").stat().st_size > 0
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


@pytest.mark.slow
def test_a_torn_last_frame_is_cut_and_the_rest_replayed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with serving("--state-dir", str(state)) as first:
        _hook_loop(first.port, 3)
        first.kill9()
    (log,) = sorted(state.glob("wal-*.log"))
    with open(log, "ab") as file:
        file.write(b"\x40\x00\x00\x00torn")  # a crash in the middle of a write
    with serving("--state-dir", str(state)) as second:
        assert any("cut at byte" in line for line in second.lines), second.lines
        decision = _decide(
            second.port, "before", session="hook-1", tool="grep", arguments={"q": "x"}
        )
        assert decision["decision"]["count"] == 4
        assert second.stop() == 0


@pytest.mark.slow
def test_a_damaged_snapshot_is_moved_aside_with_a_note(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with serving("--state-dir", str(state)) as first:
        _hook_loop(first.port, 2)
        assert first.stop() == 0
    (state / "snapshot").write_bytes(b"otel-loopguard snapshot 1\ngarbage")
    with serving("--state-dir", str(state)) as second:
        assert any("moved to" in line and "corrupt" in line for line in second.lines)
        decision = _decide(
            second.port, "before", session="hook-1", tool="grep", arguments={"q": "x"}
        )
        assert decision["decision"]["count"] == 0  # the counts were in it; the server works
        assert second.stop() == 0
    assert list(state.glob("snapshot.corrupt-*"))


@pytest.mark.slow
def test_one_serve_per_directory_and_an_untrusted_one_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with serving("--state-dir", str(state)) as first:
        assert "in use by another otel-loopguard serve" in _refused(state)
        assert first.stop() == 0
    os.chmod(state, 0o777)  # an existing directory others can enter: tightened, with a note
    with serving("--state-dir", str(state)) as second:
        assert any("was mode 0777; made 0700" in line for line in second.lines), second.lines
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        assert second.stop() == 0
    os.chmod(state / "snapshot", 0o666)
    assert "can be written by group or others" in _refused(state)
    os.chmod(state / "snapshot", 0o600)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert f"state_dir: cannot create {str(a_file)!r}" in _refused(a_file)


def _refused(state_dir: Path) -> str:
    """What ``serve --state-dir state_dir`` says on stderr as it refuses to start (status 2)."""
    refused = subprocess.run(
        [sys.executable, "-m", "otel_loopguard", "serve", "--http-port", "0", "--no-grpc"]
        + ["--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    return refused.stderr


@pytest.mark.slow
def test_a_log_that_cannot_be_written_is_answered_503_never_200(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: OTLP is answered 503 (the exporter sends again) and counted, never 200 for
    spans not kept; once the disk has room the log goes on (here in a new file: with every
    fdatasync failing, the failed group could not be cut off either), and a restart
    replays both."""
    from otel_loopguard.config import Policy
    from otel_loopguard.service import ServeOptions, Service

    script = Script()
    state = tmp_path / "state"
    options = ServeOptions(http_port=0, grpc_port=None, state_dir=str(state), hold_seconds=600)
    real = os.fdatasync
    with Service(options, policy=Policy()) as service:
        port = service.http_port
        url = f"http://127.0.0.1:{port}"
        _hook_loop(port, 2)

        def full(fd: int) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "fdatasync", full)
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        body = encode_spans(script.complete).SerializePartialToString()
        answer = request(
            port, "POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"}
        )
        assert answer.status == 503 and answer.headers["retry-after"] == "1"
        # A decision that cannot be logged: 503, and not applied (the counts below show it).
        grep = {"session": "hook-1", "tool": "grep", "arguments": {"q": "x"}}
        refused = request(
            port,
            "POST",
            "/v1/decisions/before",
            json.dumps(grep).encode(),
            {"Content-Type": "application/json"},
        )
        assert refused.status == 503, refused.body
        page = request(port, "GET", "/metrics").body.decode()
        assert 'loopguard_state_errors_total{what="log"} 2.0' in page
        monkeypatch.setattr(os, "fdatasync", real)
        _export(url, script.complete)  # the exporter's retry: counted once
        _hook_loop(port, 1)
        assert len(list(state.glob("wal-*.log"))) == 2  # the cut failed too: a new file
        expected = [
            _decide(port, "before", session="hook-1", tool="grep", arguments={"q": "x"}),
        ]
        service.wait_idle()
    with serving("--state-dir", str(state)) as again:
        probe = _decide(again.port, "before", session="hook-1", tool="grep", arguments={"q": "x"})
        # One refusal further than the last one before the restart: the ladder went on.
        assert expected[0]["decision"]["action"] == probe["decision"]["action"] == "deny"
        assert "after 2 more refused calls" in expected[0]["decision"]["message"]
        assert "after 1 more refused call," in probe["decision"]["message"]
        assert again.stop() == 0


@pytest.mark.slow
def test_a_snapshot_with_batches_still_queued_replays_each_input_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot taken while batches wait in the queue keeps the log file they are in, which
    also holds decisions the snapshot covers: a restart applies the queued batches again and
    none of those decisions (each would count twice)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_loopguard.config import Policy
    from otel_loopguard.service import ServeOptions, Service
    from otel_loopguard.service._ingest import Ingest

    script = Script()
    state = tmp_path / "state"
    options = ServeOptions(http_port=0, grpc_port=None, state_dir=str(state), hold_seconds=600)
    release = threading.Event()
    real_add = Ingest._add

    def slow_add(self: Ingest, batch: Any) -> None:
        release.wait(30)
        real_add(self, batch)

    monkeypatch.setattr(Ingest, "_add", slow_add)

    def post(port: int, spans: Sequence[ReadableSpan]) -> threading.Thread:
        body = encode_spans(spans).SerializePartialToString()
        thread = threading.Thread(
            target=request,
            args=(port, "POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"}),
        )
        thread.start()
        return thread

    service = Service(options, policy=Policy()).start()
    try:
        port = service.http_port
        _hook_loop(port, 1)  # decisions before the batches
        posts = [post(port, script.complete), post(port, script.open)]
        assert wait_for(lambda: service.queued_spans == len(script.complete) + len(script.open))
        _hook_loop(port, 1)  # a decision after them
        service._next_snapshot = 0.0  # due: taken after the first batch, the second queued
        release.set()
        for thread in posts:
            thread.join(30)
        assert service.wait_idle()
        assert wait_for(lambda: len(list(state.glob("wal-*.log"))) >= 2)
    finally:
        assert service._state is not None
        service._state.close()  # a crash: no last snapshot
        service._state = None
        service.close()
    monkeypatch.setattr(Ingest, "_add", real_add)
    with serving("--state-dir", str(state)) as again:
        _export(again.url, script.root)
        assert wait_for(lambda: _queue_empty(again.port))
        probes = script.probes(again)
        assert again.stop() == 0
    # hook-1: two calls and the probe (each decision applied once); the spans' sessions: four
    # calls each and the probe.
    assert [probe["count"] for probe in probes] == [3, 5, 5], probes


def _advised_calls(port: int, args: dict[str, Any], times: int) -> list[Any]:
    """``times`` calls without results (outcome unknown); their decisions."""
    decisions = []
    for _ in range(times):
        body = {"session": "advised", "tool": "bash", "arguments": args}
        decisions.append(_decide(port, "before", **body)["decision"])
    return decisions


@pytest.mark.slow
def test_cached_advice_cooldowns_and_held_reminders_survive_kill_9(tmp_path: Path) -> None:
    """The advisor is asked once for a loop, before the crash; after the restart the same loop
    gets the same advice without a second ask, a second loop within the cooldown gets none (as
    without the restart), and a reminder held for a call's result comes with that result."""
    from otel_loopguard.config import PRESETS

    DEFAULT = PRESETS["default"]
    assert DEFAULT.rescue_threshold is not None
    rescue_at = DEFAULT.rescue_threshold

    def run(crash: bool, where: Path) -> tuple[list[Any], str]:
        where.mkdir()
        asked = where / "asked.txt"
        advisor = where / "advisor.sh"
        advisor.write_text(
            f"#!/bin/sh\ncat > /dev/null\necho asked >> {asked}\n"
            "echo 'Read the compiler error; the header is missing.'\n"
        )
        advisor.chmod(0o755)
        config = where / "loopguard.toml"
        config.write_text(f'advisor_command = "{advisor}"\nstop_after_denials = false\n')
        args = ("--config", str(config), "--state-dir", str(where / "state"))
        server = Serve(*args)
        try:
            seen = _advised_calls(server.port, {"command": "make"}, rescue_at)
            assert seen[-1]["action"] == "rescue"
            grep = {"session": "held", "tool": "grep", "arguments": {"q": "x"}}
            for call in ("c1", "c2"):
                _decide(server.port, "before", **grep, call_id=call)
                _decide(server.port, "after", **grep, call_id=call, result="3 matches")
            # The third: a reminder, held for its result (as a command hook asks).
            held = _decide(server.port, "before", **grep, call_id="c3", hold_reminder=True)
            if crash:
                server.kill9()
                server = Serve(*args)
            after = _advised_calls(server.port, {"command": "make"}, 1)  # cached advice
            if crash:  # again: now the advice and the held reminder are in a snapshot
                server.kill9()
                server = Serve(*args)
            after += _advised_calls(server.port, {"command": "make test"}, rescue_at)  # cooldown
            result = _decide(server.port, "after", **grep, call_id="c3", result="3 matches")
            assert server.stop() == 0
        finally:
            server.close()
        return [held, *after, result], asked.read_text()

    expected, asked_once = run(False, tmp_path / "control")
    got, asked = run(True, tmp_path / "crashed")
    assert asked == asked_once == "asked\n"  # one ask in all, also across the crash
    assert expected[1]["action"] == "rescue" and "Read the compiler error" in expected[1]["message"]
    assert expected[-2]["action"] == "deny"  # the second loop's rescue: in the cooldown
    assert expected[0]["decision"]["action"] == "remind"
    assert expected[-1]["reminder"].startswith("[loopguard]"), expected[-1]
    assert got == expected


@pytest.mark.slow
def test_state_of_another_version_is_set_aside_and_a_bad_record_is_skipped(
    tmp_path: Path,
) -> None:
    """Pickles are not read across versions: state written with another layout is moved to
    ``previous-<time>/`` with a note. A record that cannot be applied is skipped with a note;
    the service starts (a bad record must not keep it down forever)."""
    from otel_loopguard.service._durable import BATCH, DECISION, StateDir

    state = tmp_path / "state"
    with serving("--state-dir", str(state)) as first:
        _hook_loop(first.port, 2)
        assert first.stop() == 0
    (state / "layout").write_text("0.0.1:0123456789abcdef\n")
    with serving("--state-dir", str(state)) as second:
        assert any("written by another version (0.0.1:0123456789abcdef" in x for x in second.lines)
        decision = _decide(
            second.port, "before", session="hook-1", tool="grep", arguments={"q": "x"}
        )
        assert decision["decision"]["count"] == 0  # afresh
        assert second.stop() == 0
    (aside,) = state.glob("previous-*")
    assert (aside / "snapshot").exists()

    log = StateDir(str(state))
    recovered = log.recover()
    log.open_log(recovered.next_seq)
    seqs = [
        log.append(BATCH, 0.0, b"not a pickle"),
        log.append(
            DECISION,
            0.0,
            b'{"endpoint": "before", "body": {"session": "hook-2",'
            b' "tool": "grep", "arguments": {"q": "y"}}}',
        ),
    ]
    assert log.wait(seqs[-1])
    log.close()
    with serving("--state-dir", str(state)) as third:
        assert any("1 log records could not be applied again" in x for x in third.lines)
        after = _decide(third.port, "before", session="hook-2", tool="grep", arguments={"q": "y"})
        assert after["decision"]["count"] == 2  # the good record after the bad one was applied
        assert third.stop() == 0


@pytest.mark.slow
def test_spans_accepted_over_grpc_are_logged_too(tmp_path: Path) -> None:
    """The gRPC receiver answers OK only once the batch is in the log, as HTTP does: a crash
    right after (here: the directory closed without a last snapshot) loses none of it."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    from otel_loopguard.config import Policy
    from otel_loopguard.service import ServeOptions, Service

    script = Script()
    state = tmp_path / "state"
    options = ServeOptions(
        http_port=0, grpc_port=0, state_dir=str(state), hold_seconds=600, drain_timeout_seconds=5
    )
    service = Service(options, policy=Policy()).start()
    try:
        exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{service.grpc_port}", insecure=True)
        try:
            assert exporter.export(script.complete + script.open) is SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
    finally:
        assert service._state is not None
        service._state.close()  # a crash: no last snapshot, the open trace never judged
        service._state = None
        service.close()
    with serving("--state-dir", str(state)) as again:
        _export(again.url, script.root)
        assert wait_for(lambda: _queue_empty(again.port))
        probes = script.probes(again)
        assert again.stop() == 0
    assert [probe["count"] for probe in probes][1:] == [5, 5], probes
