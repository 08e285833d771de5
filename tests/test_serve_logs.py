"""Coding agents' own telemetry through a real ``serve``: Claude Code's, Gemini CLI's and Codex's
tool events (OTLP log records built field by field from their sources, ``tests/data/logs``) sent
by the OpenTelemetry Python SDK's log exporters (OTLP/HTTP and OTLP/gRPC) to
``otel-loopguard serve`` in a subprocess. A looping sequence is decided from these events alone
(remind, deny, stop in ``/metrics``); auth, the body cap, a malformed record, a retried batch and
a restart with ``--state-dir`` behave as for traces."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_loopguard._conventions._log_events import BadLogRecord, tool_call_from_log
from otel_loopguard.service._durable import batch_of, batch_payload
from otel_loopguard.service._otlp_logs import LogCalls, json_log_calls

from .service_tools import ServeProcess, request, require_serve_prerequisites, wait_for

DATA = Path(__file__).resolve().parent / "data" / "logs"
#: The fixtures, by agent: the tool each reports, and the session key it is counted under.
AGENTS = {
    "claude-code": ("claude_code_tool_result.json", "Bash", "session.id"),
    "gemini-cli": ("gemini_cli_tool_call.json", "read_file", "session.id"),
    "codex": ("codex_tool_result.json", "shell", "conversation.id"),
}
#: Calls of the looping sequence: past the default preset's stop.
CALLS = 10
TOKEN = "logs-token-0123456789"
BASE_NS = 1_790_000_000_000_000_000


def fixture(agent: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / AGENTS[agent][0]).read_text())
    return loaded


def looping_events(agent: str, calls: int = CALLS, first: int = 0) -> list[dict[str, Any]]:
    """``calls`` tool events of ``agent``'s fixture, the same call each time (it succeeded, with
    the same output), each with its own call id, sequence and time, as the agent sends them."""
    events = []
    for index in range(first, first + calls):
        event = fixture(agent)
        attributes = event["attributes"]
        attributes["event.timestamp"] = f"2026-12-03T10:{index // 60:02d}:{index % 60:02d}.000Z"
        if agent == "claude-code":
            attributes.update(
                tool_use_id=f"toolu_{index:04d}", success="true", **{"event.sequence": index}
            )
            attributes.pop("error", None)
            attributes.pop("error_type", None)
        elif agent == "codex":
            attributes.update(call_id=f"call_{index:04d}", success="true", output="ok: 3 passed")
        event["time"] = BASE_NS + index * 1_000_000_000
        events.append(event)
    return events


# -- the conventions, read from each fixture --------------------------------------------------


def read(event: Mapping[str, Any]) -> Any:
    return tool_call_from_log(
        event["attributes"],
        body=event["body"],
        service=event["resource"]["service.name"],
        times=(event.get("time", 0), 0),
    )


def test_claude_code_tool_result_is_read_field_by_field() -> None:
    call = read(fixture("claude-code"))
    assert (call.agent, call.tool, call.call_id) == ("claude-code", "Bash", "toolu_01")
    assert call.session == "7f1c2a9e-3b4d-4e5f-8a6b-1c2d3e4f5a6b"
    assert json.loads(call.arguments) == {
        "command": "pytest tests/test_parser.py",
        "description": "Run the parser tests",
    }
    assert call.error is True and call.result == "Exit code 1: 1 failed"
    assert call.duration_seconds == pytest.approx(0.412)


def test_claude_code_without_tool_details_has_no_arguments_and_names_mcp_tools() -> None:
    event = fixture("claude-code")
    for key in ("tool_input", "tool_parameters"):
        del event["attributes"][key]
    assert read(event).arguments is None
    mcp = fixture("claude-code")
    mcp["attributes"].update(
        tool_name="mcp_tool",
        tool_parameters=json.dumps({"mcp_server_name": "github", "mcp_tool_name": "search"}),
    )
    assert read(mcp).tool == "mcp__github__search"  # as Claude Code's hooks name it


def test_gemini_cli_tool_call_has_no_call_id_so_one_is_made_from_the_record() -> None:
    event = fixture("gemini-cli")
    call = read(event)
    assert (call.agent, call.tool, call.error) == ("gemini-cli", "read_file", False)
    assert json.loads(call.arguments) == {"absolute_path": "/work/app/src/parser.py"}
    assert call.session == "5d2e8f10-6a7b-4c8d-9e0f-1a2b3c4d5e6f"
    assert call.call_id is not None and call.call_id.startswith("log:")
    assert read(event).call_id == call.call_id  # the same record again: the same id
    later = fixture("gemini-cli")
    later["attributes"]["event.timestamp"] = "2026-12-03T10:00:01.000Z"
    assert read(later).call_id != call.call_id
    rejected = fixture("gemini-cli")
    rejected["attributes"]["decision"] = "reject"
    assert read(rejected).error is True


def test_codex_tool_result_is_read_field_by_field() -> None:
    call = read(fixture("codex"))
    assert (call.agent, call.tool, call.call_id, call.error) == ("codex", "shell", "call_01", True)
    assert call.session == "0199a3b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b"
    assert json.loads(call.arguments)["command"] == ["bash", "-lc", "cargo test -p parser"]
    assert call.result.startswith("error[E0425]")
    assert call.duration_seconds == pytest.approx(1.84)


def test_other_records_are_not_tool_events_and_bad_tool_events_name_the_field() -> None:
    assert tool_call_from_log({"event.name": "codex.api_request"}) is None
    assert tool_call_from_log({"event.name": "tool_result"}, service="some-app") is None
    assert tool_call_from_log({}, body="claude_code.api_request") is None
    no_tool = fixture("codex")["attributes"]
    del no_tool["tool_name"]
    with pytest.raises(BadLogRecord, match="'tool_name'"):
        tool_call_from_log(no_tool)
    bad_flag = fixture("gemini-cli")["attributes"]
    bad_flag["success"] = "maybe"
    with pytest.raises(BadLogRecord, match="'success'"):
        tool_call_from_log(bad_flag)


def test_a_logged_batch_of_log_calls_reads_back_the_same() -> None:
    batch = json_log_calls(otlp_json(looping_events("codex", 3) + looping_events("gemini-cli", 2)))
    assert isinstance(batch, LogCalls) and batch.accepted == 5
    again = batch_of(batch_payload(batch))
    assert isinstance(again, LogCalls)
    assert again.calls == batch.calls and again.ignored == batch.ignored


# -- a real serve ------------------------------------------------------------------------------


def otlp_json(events: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP JSON of ``events`` (one resource per event, as each agent is its own process)."""

    def value(item: object) -> dict[str, object]:
        if isinstance(item, bool):
            return {"boolValue": item}
        if isinstance(item, int):
            return {"intValue": str(item)}
        return {"stringValue": str(item)}

    def attributes(mapping: Mapping[str, object]) -> list[dict[str, object]]:
        return [{"key": key, "value": value(item)} for key, item in mapping.items()]

    return {
        "resourceLogs": [
            {
                "resource": {"attributes": attributes(event["resource"])},
                "scopeLogs": [
                    {
                        "logRecords": [
                            {
                                "timeUnixNano": str(event.get("time", BASE_NS)),
                                **({"body": value(event["body"])} if event["body"] else {}),
                                "attributes": attributes(event["attributes"]),
                            }
                        ]
                    }
                ],
            }
            for event in events
        ]
    }


def export(
    serve: ServeProcess, protocol: str, events: list[dict[str, Any]], token: str | None
) -> None:
    """``events`` through the OpenTelemetry SDK's OTLP log exporter (one provider per agent
    resource, as each agent process has its own), flushed."""
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.resources import Resource

    exporter: Any
    if protocol == "http":
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

        headers = {"Authorization": f"Bearer {token}"} if token else None
        exporter = OTLPLogExporter(endpoint=f"{serve.url}/v1/logs", headers=headers)
    else:
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
            OTLPLogExporter as GrpcLogExporter,
        )

        exporter = GrpcLogExporter(
            endpoint=f"127.0.0.1:{serve.grpc_port}",
            insecure=True,
            headers=(("authorization", f"Bearer {token}"),) if token else None,
        )
    provider = LoggerProvider(resource=Resource.create(events[0]["resource"]))
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    logger = provider.get_logger("loopguard-test")
    for event in events:
        logger.emit(
            timestamp=event.get("time"),
            observed_timestamp=event.get("time"),
            body=event["body"],
            attributes=event["attributes"],
        )
    provider.force_flush()
    provider.shutdown()


def samples(serve: ServeProcess, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    answer = request(serve.port, "GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status == 200, answer.body
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.body.decode())
        for sample in family.samples
        if sample.name == name
    }


def total(serve: ServeProcess, name: str, **labels: str) -> float:
    return sum(
        value
        for key, value in samples(serve, name).items()
        if all(dict(key).get(label) == wanted for label, wanted in labels.items())
    )


@pytest.fixture
def serve() -> Iterator[ServeProcess]:
    require_serve_prerequisites()
    server = ServeProcess("--token", TOKEN, "--max-body-bytes", "65536", grpc=True)
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_a_looping_agent_is_decided_from_its_tool_events_alone(
    serve: ServeProcess, agent: str, protocol: str
) -> None:
    tool = AGENTS[agent][1]
    events = looping_events(agent)
    export(serve, protocol, events, TOKEN)
    assert wait_for(lambda: total(serve, "loopguard_tool_calls_total", tool=tool) == CALLS)
    accepted = total(serve, "loopguard_otlp_log_records_total", result="accepted")
    assert accepted == CALLS
    for action in ("remind", "deny", "stop"):
        assert total(serve, "loopguard_decisions_total", action=action, tool=tool) >= 1, action
    # Sent again (an exporter's retry of the same records): counted once.
    export(serve, protocol, events, TOKEN)
    assert wait_for(
        lambda: total(serve, "loopguard_otlp_log_records_total", result="duplicate") == CALLS
    )
    assert total(serve, "loopguard_tool_calls_total", tool=tool) == CALLS
    assert total(serve, "loopguard_otlp_requests_total", transport=protocol, outcome="ok") >= 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_log_records_without_the_token_are_refused(serve: ServeProcess, protocol: str) -> None:
    export(serve, protocol, looping_events("codex", 3), None)
    assert (
        total(serve, "loopguard_otlp_requests_total", transport=protocol, outcome="unauthorized")
        >= 1
    )
    assert total(serve, "loopguard_otlp_log_records_total", result="accepted") == 0
    plain = request(serve.port, "POST", "/v1/logs", b"{}", {"Content-Type": "application/json"})
    assert plain.status == 401


def test_an_oversized_logs_body_is_413_like_traces(serve: ServeProcess) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    body = json.dumps(otlp_json(looping_events("codex", 200))).encode()
    assert len(body) > 65536
    for path in ("/v1/logs", "/v1/traces"):
        answer = request(
            serve.port, "POST", path, body, {**auth, "Content-Type": "application/json"}
        )
        assert answer.status == 413, (path, answer.body)
    squeezed = gzip.compress(body)
    assert len(squeezed) < 65536  # small on the wire, too large once inflated
    answer = request(
        serve.port,
        "POST",
        "/v1/logs",
        squeezed,
        {**auth, "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert answer.status == 413, answer.body
    assert total(serve, "loopguard_otlp_requests_total", transport="http", outcome="too_large") == 3
    assert total(serve, "loopguard_otlp_log_records_total", result="accepted") == 0


def test_a_malformed_log_record_is_a_counted_skip(serve: ServeProcess) -> None:
    good, bad = looping_events("codex", 2)
    del bad["attributes"]["tool_name"]
    record = otlp_json([good, bad])
    record["resourceLogs"][0]["scopeLogs"][0]["logRecords"].append({"body": {"stringValue": "x"}})
    answer = request(
        serve.port,
        "POST",
        "/v1/logs",
        json.dumps(record).encode(),
        {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    assert answer.status == 200, answer.body
    partial = answer.json()["partialSuccess"]
    assert partial["rejectedLogRecords"] == "1"
    assert "resourceLogs[1].scopeLogs[0].logRecords[0]" in partial["errorMessage"]
    assert "'tool_name'" in partial["errorMessage"]
    assert wait_for(lambda: total(serve, "loopguard_tool_calls_total", tool="shell") == 1)
    assert total(serve, "loopguard_otlp_log_records_total", result="rejected") == 1
    assert total(serve, "loopguard_otlp_log_records_total", result="ignored") == 1
    assert total(serve, "loopguard_otlp_requests_total", transport="http", outcome="partial") == 1


@pytest.mark.slow
def test_log_calls_survive_a_crash_with_a_state_dir(tmp_path: Path) -> None:
    """Half a loop, a SIGKILL, a restart on the same state directory, the other half: the
    session goes on where it was (the stop comes as in one run), and a retry of a batch sent
    before the crash still counts once; so it does after a clean stop (from the snapshot)."""
    require_serve_prerequisites()
    state = str(tmp_path / "state")
    first_half = looping_events("codex", 5)
    server = ServeProcess("--token", TOKEN, "--state-dir", state)
    try:
        export(server, "http", first_half, TOKEN)
        assert wait_for(lambda: total(server, "loopguard_tool_calls_total", tool="shell") == 5)
        assert total(server, "loopguard_decisions_total", action="stop") == 0
        server.kill9()
    finally:
        server.close()
    server = ServeProcess("--token", TOKEN, "--state-dir", state)
    try:
        export(server, "http", first_half, TOKEN)  # the exporter's retry, after the restart
        export(server, "http", looping_events("codex", 5, first=5), TOKEN)
        assert wait_for(
            lambda: total(server, "loopguard_otlp_log_records_total", result="accepted") == 10
        )
        assert wait_for(lambda: total(server, "loopguard_tool_calls_total", tool="shell") == 5)
        assert total(server, "loopguard_otlp_log_records_total", result="duplicate") == 5
        assert total(server, "loopguard_decisions_total", action="stop", tool="shell") >= 1
        assert server.stop() == 0  # drained: a snapshot, the calls it remembers included
    finally:
        server.close()
    server = ServeProcess("--token", TOKEN, "--state-dir", state)
    try:
        export(server, "http", first_half, TOKEN)  # retried once more, after the snapshot
        assert wait_for(
            lambda: total(server, "loopguard_otlp_log_records_total", result="duplicate") == 5
        )
        assert total(server, "loopguard_tool_calls_total", tool="shell") == 0
    finally:
        server.close()


def hook_events(agent: str, event: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pre- and post-tool hook events the agent sends for the call its telemetry ``event``
    reports (the same session and call id; the hooks' own tool names and shapes)."""
    from .test_hooks import claude_post, claude_pre, codex

    attributes = event["attributes"]
    if agent == "claude-code":
        tool_input = json.loads(attributes["tool_input"])
        call_id, session = attributes["tool_use_id"], attributes["session.id"]
        return (
            claude_pre("Bash", tool_input, call_id, session=session),
            claude_post("Bash", tool_input, call_id, "ok: 3 passed", session=session),
        )
    # Codex's hooks: its thread id as session_id, the model's call id as tool_use_id.
    fields = {
        "session_id": attributes["conversation.id"],
        "tool_name": "Bash",
        "tool_input": {"command": "cargo test -p parser"},
        "tool_use_id": attributes["call_id"],
    }
    return codex("PreToolUse", **fields), codex("PostToolUse", tool_response="ok", **fields)


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_a_call_the_hook_and_the_telemetry_both_report_counts_once(
    serve: ServeProcess, agent: str
) -> None:
    """The agent's command hook (the real ``hook HOST --server``) and its tool events report the
    same calls, keyed alike (the session id, the call id): each counts once, whichever report
    comes first. A call only the telemetry reports counts too."""
    from .test_hooks import clean_env, hook

    env = clean_env(LOOPGUARD_SERVE_TOKEN=TOKEN)
    events = looping_events(agent, 4)

    def calls() -> float:
        return total(serve, "loopguard_tool_calls_total")

    def records() -> float:
        return total(serve, "loopguard_otlp_log_records_total", result="accepted")

    for index, event in enumerate(events[:3]):
        pre, post = hook_events(agent, event)
        answer = hook(agent, pre, None, "--server", serve.url, env=env)
        assert answer.code == 0, answer.err
        if index == 2:  # the telemetry first, then the hook's post-tool event
            export(serve, "http", [event], TOKEN)
            assert wait_for(lambda: records() == 1)
            assert calls() == 3
        answer = hook(agent, post, None, "--server", serve.url, env=env)
        assert answer.code == 0, answer.err
    export(serve, "http", events[:2], TOKEN)  # the telemetry after the hook: already counted
    assert wait_for(lambda: records() == 3)
    export(serve, "http", events[3:], TOKEN)  # a call no hook saw: fed after the two above
    assert wait_for(lambda: calls() == 4)
    assert calls() == 4


@pytest.mark.slow
def test_log_bytes_past_the_budget_are_429_before_the_body() -> None:
    """The traces' byte budget holds for logs: a log body under way holds its bytes, and the
    next one past the budget is told 429 with Retry-After, its body never sent."""
    import socket
    import time

    require_serve_prerequisites()
    head = (
        f"POST /v1/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/x-protobuf\r\n"
    ).encode()
    server = ServeProcess("--token", TOKEN, "--max-inflight-bytes", str(1 << 20))
    try:
        with socket.create_connection(("127.0.0.1", server.port), 5) as holder:
            holder.sendall(head + b"Content-Length: 900000\r\n\r\nx")
            time.sleep(1.0)  # its head is read and its bytes taken
            with socket.create_connection(("127.0.0.1", server.port), 5) as late:
                late.sendall(head + b"Content-Length: 200000\r\nConnection: close\r\n\r\n")
                answer = b""
                while b"\r\n\r\n" not in answer:
                    chunk = late.recv(4096)
                    assert chunk, answer
                    answer += chunk
        assert answer.startswith(b"HTTP/1.1 429"), answer
        assert b"retry-after: 1" in answer.lower()
        assert total(server, "loopguard_otlp_requests_total", outcome="over_budget") == 1
    finally:
        server.close()
