"""``otel-loopguard hook HOST --server URL``: the command hooks on a running serve.

A real ``otel-loopguard serve`` process (bearer token from ``LOOPGUARD_SERVE_TOKEN``, as it is
started in practice) and the real hook command, one process per event as the hosts run it. The
same host-shaped event sequence goes through the SQLite backend (``--store``) and through the
server, and every answer must be the same JSON. Failures of the server (down, silent, a wrong
token, error statuses, answers that are not the API's) must be answered as a broken local store
is: allow with a one-line note, or deny with ``--fail-closed``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .service_tools import request, require_serve_prerequisites, serve_process

require_serve_prerequisites()

from otel_loopguard import PRESETS, Action, Phase  # noqa: E402
from otel_loopguard.hooks import HOSTS, TOKEN_ENV  # noqa: E402
from otel_loopguard.service._decisions import decision_json  # noqa: E402

from .test_hooks import (  # noqa: E402
    BASH_RESULT,
    BASH_TESTS,
    DENY_AT,
    PRE_EVENTS,
    REMIND_AT,
    STOP_AT,
    Mirror,
    Reply,
    claude,
    claude_post,
    claude_pre,
    clean_env,
    codex,
    fail_closed_denial,
    gemini,
    hook,
)

TOKEN = "hook-test-token"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """One serve for the module (default policy, token from the environment); every test uses
    sessions of its own."""
    assert TOKEN_ENV == "LOOPGUARD_SERVE_TOKEN"
    with serve_process(env=clean_env(**{TOKEN_ENV: TOKEN})) as url:
        yield url


def remote(
    host: str,
    event: object,
    url: str,
    *args: str,
    token: str | None = TOKEN,
    raw: bytes | None = None,
) -> Reply:
    """One hook invocation on the server; the token reaches it as the hosts pass settings
    (``LOOPGUARD_SERVE_TOKEN``), unless ``token`` is None."""
    env = clean_env(**({TOKEN_ENV: token} if token is not None else {}))
    return hook(host, event, None, "--server", url, *args, env=env, raw=raw)


def note_lines(reply: Reply) -> list[str]:
    lines = reply.err.splitlines()
    assert len(lines) == 1, reply.err  # one line per failure, nothing else
    return lines


# -- the same answers as the SQLite backend ----------------------------------------------------


def claude_events(session: str) -> list[dict[str, Any]]:
    """A prompt; one call repeated to the stop (results after the calls that ran); a call while
    stopped; a prompt lifting the stop; a sub-agent's failing edits, whose reminder comes with
    the failure; then results no pre-tool event announced (counted after they ran)."""
    events = [claude("UserPromptSubmit", session, prompt="fix the login test")]
    for call in range(1, STOP_AT + 1):
        events.append(claude_pre("Bash", BASH_TESTS, f"toolu_{call:02d}", session=session))
        if call < DENY_AT:
            events.append(
                claude_post("Bash", BASH_TESTS, f"toolu_{call:02d}", BASH_RESULT, session=session)
            )
    events.append(
        claude_pre("Read", {"file_path": "/work/project/src/auth.py"}, "toolu_90", session=session)
    )
    events.append(claude("UserPromptSubmit", session, prompt="try again"))
    events.append(claude_pre("Bash", BASH_TESTS, "toolu_91", session=session))
    edit = {"file_path": "/work/project/setup.cfg", "old_string": "a", "new_string": "b"}
    for call in range(1, REMIND_AT + 1):
        events.append(
            claude_pre(
                "Edit",
                edit,
                f"toolu_sub_{call}",
                session=session,
                agent_id="agent-7",
                agent_type="general-purpose",
            )
        )
        events.append(
            claude(
                "PostToolUseFailure",
                session,
                tool_name="Edit",
                tool_input=edit,
                tool_use_id=f"toolu_sub_{call}",
                agent_id="agent-7",
                agent_type="general-purpose",
                error="String to replace not found in file.",
            )
        )
    grep = {"pattern": "TODO", "path": "src"}
    for call in range(1, STOP_AT + 2):
        events.append(
            claude_post(
                "Grep",
                grep,
                f"toolu_late_{call}",
                "src/a.py:3: TODO",
                session=session,
                agent_id="agent-8",
            )
        )
    return events


def gemini_events(session: str) -> list[dict[str, Any]]:
    """No call ids: a reminder is matched to its result by the call's arguments. Results no
    pre-tool event announced: the same answer (a denial worded as a reminder), then the same
    failure (a stop at its third time)."""
    read = {"absolute_path": "/work/project/src/auth.py"}
    response = {"llmContent": "def login(user): ...", "returnDisplay": "Read 120 lines"}
    events = [gemini("BeforeAgent", session_id=session, prompt="why does login fail?")]
    for call in range(1, STOP_AT + 1):
        events.append(
            gemini("BeforeTool", session_id=session, tool_name="read_file", tool_input=read)
        )
        if call < DENY_AT:
            events.append(
                gemini(
                    "AfterTool",
                    session_id=session,
                    tool_name="read_file",
                    tool_input=read,
                    tool_response=response,
                )
            )
    events.append(gemini("BeforeAgent", session_id=session, prompt="go on"))
    events.append(gemini("BeforeTool", session_id=session, tool_name="read_file", tool_input=read))
    status = {"command": "git status", "description": "check the tree"}
    clean = {"llmContent": "nothing to commit", "returnDisplay": ""}
    for _ in range(DENY_AT):
        events.append(
            gemini(
                "AfterTool",
                session_id=session,
                tool_name="run_shell_command",
                tool_input=status,
                tool_response=clean,
            )
        )
    shell = {"command": "npm test", "description": "run tests"}
    failed = {"llmContent": "", "returnDisplay": "", "error": {"message": "exit code 1"}}
    for _ in range(STOP_AT + 1):
        events.append(
            gemini(
                "AfterTool",
                session_id=session,
                tool_name="run_shell_command",
                tool_input=shell,
                tool_response=failed,
            )
        )
    return events


def codex_events(session: str) -> list[dict[str, Any]]:
    """Reminders before the call, a stop as a denial, results without a failure flag."""
    shell = {"command": "cargo test -p api"}
    events = [codex("UserPromptSubmit", session_id=session, prompt="make tests pass")]
    for call in range(1, STOP_AT + 1):
        events.append(
            codex(
                "PreToolUse",
                session_id=session,
                tool_name="Bash",
                tool_input=shell,
                tool_use_id=f"call_{call}",
            )
        )
        if call < DENY_AT:
            events.append(
                codex(
                    "PostToolUse",
                    session_id=session,
                    tool_name="Bash",
                    tool_input=shell,
                    tool_use_id=f"call_{call}",
                    tool_response="test result: FAILED",
                )
            )
    events.append(codex("UserPromptSubmit", session_id=session, prompt="again"))
    for call in range(1, STOP_AT + 2):
        events.append(
            codex(
                "PostToolUse",
                session_id=session,
                tool_name="Bash",
                tool_input={"command": "git status"},
                tool_use_id=f"late_{call}",
                tool_response="nothing to commit",
            )
        )
    return events


SEQUENCES = {"claude-code": claude_events, "gemini-cli": gemini_events, "codex": codex_events}


def kind(host: str, out: dict[str, Any]) -> str:
    """allow, remind, deny or stop, read off the host's answer."""
    if not out:
        return "allow"
    if out.get("continue") is False:
        return "stop"
    if host == "gemini-cli" and out.get("decision") == "deny":
        return "deny"
    specific = out["hookSpecificOutput"]
    if "additionalContext" in specific:
        return "remind"
    assert specific["permissionDecision"] == "deny"
    # Codex: a stop decided before a call is a denial that tells the model to end the run.
    return (
        "stop"
        if specific["permissionDecisionReason"].startswith("[loopguard] Stopping")
        else "deny"
    )


def texts(out: dict[str, Any]) -> list[str]:
    specific = out.get("hookSpecificOutput", {})
    return [
        value
        for value in (
            out.get("reason"),
            out.get("stopReason"),
            specific.get("permissionDecisionReason"),
            specific.get("additionalContext"),
        )
        if value
    ]


@pytest.mark.slow
@pytest.mark.parametrize("host", list(HOSTS))
def test_the_server_backend_answers_every_event_as_the_sqlite_backend(
    server: str, tmp_path: Path, host: str
) -> None:
    events = SEQUENCES[host](f"{host}-same-answers")
    store = tmp_path / "hooks.sqlite3"
    with ThreadPoolExecutor(2) as pool:  # the two backends do not share anything
        local_run = pool.submit(lambda: [hook(host, event, store) for event in events])
        remote_run = pool.submit(lambda: [remote(host, event, server) for event in events])
        local, served = local_run.result(), remote_run.result()
    for index, (event, mine, theirs) in enumerate(zip(events, local, served)):
        assert theirs == mine, (index, event["hook_event_name"])
        assert mine.code == 0 and mine.err == ""
    kinds = [kind(host, reply.out) for reply in local]
    assert set(kinds) == {"allow", "remind", "deny", "stop"}, kinds
    post_names = {"PostToolUse", "PostToolUseFailure", "AfterTool"}
    reminders_after = [
        reply.out
        for event, reply in zip(events, local)
        if event["hook_event_name"] in post_names and reply.out
    ]
    if host != "codex":  # reminders decided before a call, shown with its result
        assert any(kind(host, out) == "remind" for out in reminders_after[:1])
    # Calls reported only after they ran: denials are worded as reminders, never "Not run".
    assert any(
        text.startswith("[loopguard] Repeated call")
        for out in reminders_after
        for text in texts(out)
    )
    assert not any("Not run" in text for out in reminders_after for text in texts(out))
    assert any(kind(host, out) == "stop" for out in reminders_after)


# -- failures of the server: the rules of a broken store -----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("host", list(HOSTS))
def test_a_wrong_or_missing_token_fails_open_or_closed(server: str, host: str) -> None:
    event = PRE_EVENTS[host]
    for reply in (
        remote(host, event, server, token="nope"),
        remote(host, event, server, token=None),
    ):
        assert reply.code == 0 and reply.out == {}
        (line,) = note_lines(reply)
        assert line == (
            f"otel-loopguard hook {host}: server {server}: HTTP 401 (missing or"
            " wrong bearer token); allowing the call (fail-open)"
        )
    closed = remote(host, event, server, "--fail-closed", token="nope")
    assert closed.code == 0
    assert note_lines(closed)[0].endswith(
        "HTTP 401 (missing or wrong bearer token); denying the call (--fail-closed)"
    )
    fail_closed_denial(host, "HTTP 401", closed.out)
    # --token beats the environment.
    right = hook(
        host,
        event,
        None,
        "--server",
        server,
        "--token",
        TOKEN,
        env=clean_env(**{TOKEN_ENV: "nope"}),
    )
    assert right == Reply(0, {}, "")


@pytest.mark.slow
def test_the_token_from_a_file_and_a_bad_file_fails_open_or_closed(
    server: str, tmp_path: Path
) -> None:
    """``--token-file``: the token stays out of ``ps``; an empty or unreadable file is a
    failure of the backend (one line, fail-open or closed), never a request without a token."""
    host = "claude-code"
    event = PRE_EVENTS[host]
    good = tmp_path / "token"
    good.write_text(f"  {TOKEN}\n")
    # The file beats a wrong variable (as --token does).
    assert remote(host, event, server, "--token-file", str(good), token="nope") == Reply(0, {}, "")
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    missing = tmp_path / "missing"
    for path, reason in (
        (empty, f"--token-file {str(empty)!r}: the token is empty"),
        (missing, f"--token-file: cannot read {str(missing)!r}"),
    ):
        reply = remote(host, event, server, "--token-file", str(path), token=None)
        # Allowed, and the user is told: a setting of the hook's own to fix.
        assert reply.code == 0 and set(reply.out) == {"systemMessage"}
        assert reason in reply.out["systemMessage"]
        (line,) = note_lines(reply)
        assert reason in line and line.endswith("allowing the call (fail-open)"), line
        closed = remote(host, event, server, "--token-file", str(path), "--fail-closed")
        assert reason in note_lines(closed)[0]
        fail_closed_denial(host, reason.split(":")[0], closed.out)
    both = remote(host, event, server, "--token", TOKEN, "--token-file", str(good))
    assert both.code == 0 and "not allowed with argument" in both.err


@pytest.mark.slow
def test_after_a_call_or_at_a_prompt_a_failure_records_nothing_and_denies_nothing(
    server: str,
) -> None:
    post = claude_post("Bash", BASH_TESTS, "toolu_1", BASH_RESULT, session="failures")
    prompt = claude("UserPromptSubmit", "failures", prompt="hi")
    for event in (post, prompt):
        reply = remote("claude-code", event, server, "--fail-closed", token="nope")
        assert reply.out == {}
        assert note_lines(reply)[0].endswith(
            "HTTP 401 (missing or wrong bearer token); nothing recorded"
        )
    # A result beyond the decision API's body limit (1 MiB): not recorded, said so.
    huge = claude_post("Bash", BASH_TESTS, "toolu_2", "x" * (2 << 20), session="failures")
    reply = remote("claude-code", huge, server, "--fail-closed")
    assert reply.out == {}
    (line,) = note_lines(reply)
    assert ": HTTP 413 (body of 2,09" in line
    assert line.endswith("bytes is larger than 1,048,576); nothing recorded")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("host", list(HOSTS))
def test_a_dead_server_fails_open_at_once(host: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    reply = remote(host, PRE_EVENTS[host], url)
    elapsed = time.monotonic() - started
    assert reply.code == 0 and reply.out == {}
    assert note_lines(reply) == [
        f"otel-loopguard hook {host}: server {url}: connection refused;"
        " allowing the call (fail-open)"
    ]
    assert elapsed < 10  # a process start; no waiting on the dead port
    closed = remote(host, PRE_EVENTS[host], url, "--fail-closed")
    fail_closed_denial(host, "connection refused", closed.out)


@pytest.mark.slow
def test_a_server_that_never_answers_is_given_up_on_after_the_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        for args, limit in ((("--timeout", "0.5"), 0.5), ((), 2.0)):  # the default: 2 s
            started = time.monotonic()
            reply = remote("claude-code", PRE_EVENTS["claude-code"], url, *args)
            elapsed = time.monotonic() - started
            assert reply.code == 0 and reply.out == {}
            assert note_lines(reply) == [
                f"otel-loopguard hook claude-code: server {url}: no answer within {limit:g} s;"
                " allowing the call (fail-open)"
            ]
            assert limit <= elapsed < limit + 8, elapsed
        closed = remote(
            "claude-code", PRE_EVENTS["claude-code"], url, "--fail-closed", "--timeout", "0.3"
        )
        fail_closed_denial("claude-code", "no answer within 0.3 s", closed.out)


class _Fake(BaseHTTPRequestHandler):
    """Answers by the first path segment (the --server URL's path prefix)."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, dict[str, str], Any]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, dict(self.headers), json.loads(body)))
        case = self.path.split("/")[1]
        if case == "hangup":
            self.close_connection = True
            return
        status, data = {
            "ok": (200, b'{"decision": {"action": "allow", "message": ""}}'),
            "error500": (500, b'{"error": "internal error"}'),
            "text503": (503, b"Service Unavailable\r\nretry later"),
            "notjson": (200, b"<html>hello</html>"),
            "list": (200, b"[]"),
            "nodecision": (200, b"{}"),
            "badaction": (200, b'{"decision": {"action": "explode", "message": ""}}'),
        }[case]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def fake() -> Iterator[str]:
    _Fake.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("error500", "HTTP 500 (internal error)"),
        ("text503", "HTTP 503"),
        ("notjson", "the answer is not JSON"),
        ("list", "unexpected answer (a JSON list, not an object)"),
        ("nodecision", "unexpected answer (no 'decision')"),
        ("badaction", "unexpected answer (unknown action 'explode')"),
        ("hangup", "the connection closed without an answer"),
    ],
)
def test_error_statuses_and_answers_that_are_not_the_apis_fail_open_or_closed(
    fake: str, case: str, said: str
) -> None:
    url = f"{fake}/{case}/"
    reply = remote("claude-code", PRE_EVENTS["claude-code"], url)
    assert reply.code == 0 and reply.out == {}
    assert note_lines(reply) == [
        f"otel-loopguard hook claude-code: server {fake}/{case}: {said};"
        " allowing the call (fail-open)"
    ]
    closed = remote("claude-code", PRE_EVENTS["claude-code"], url, "--fail-closed")
    fail_closed_denial("claude-code", said, closed.out)


@pytest.mark.slow
def test_what_the_hook_sends(fake: str) -> None:
    for host in HOSTS:
        assert remote(host, PRE_EVENTS[host], f"{fake}/ok") == Reply(0, {}, "")
    post = claude_post("Bash", BASH_TESTS, "toolu_1", BASH_RESULT, agent_id="agent-2")
    remote("claude-code", post, f"{fake}/ok", token=None)
    remote("claude-code", claude("UserPromptSubmit", prompt="hi"), f"{fake}/ok")
    paths = [path for path, _, _ in _Fake.seen]
    assert paths == ["/ok/v1/decisions/before"] * 3 + [
        "/ok/v1/decisions/after",
        "/ok/v1/decisions/user_message",
    ]
    auth = [headers.get("Authorization") for _, headers, _ in _Fake.seen]
    assert auth == [f"Bearer {TOKEN}"] * 3 + [None, f"Bearer {TOKEN}"]
    bodies = [body for _, _, body in _Fake.seen]
    assert bodies[0] == {
        "session": "sess-1",
        "agent": None,
        "tool": "Bash",
        "arguments": BASH_TESTS,
        "call_id": "toolu_1",
        "hold_reminder": True,
        "repository": "/work/project",  # the event's cwd (no git root above it here)
    }
    assert bodies[1]["hold_reminder"] is True and bodies[1]["call_id"] is None  # Gemini CLI
    assert bodies[2]["hold_reminder"] is False  # Codex shows reminders before the call
    assert bodies[3] == {
        "session": "sess-1",
        "agent": "agent-2",
        "tool": "Bash",
        "arguments": BASH_TESTS,
        "call_id": "toolu_1",
        "error": False,
        "result": BASH_RESULT,
        "duration_seconds": 1.2,
        "repository": "/work/project",
    }
    assert bodies[4] == {"session": "sess-1", "agent": None, "text": "hi"}


@pytest.mark.slow
def test_bad_server_options_still_answer_json(tmp_path: Path, server: str) -> None:
    event = PRE_EVENTS["claude-code"]
    for args, said in [
        (("--store", str(tmp_path / "s.sqlite3")), "--store cannot be combined with --server"),
        (("--preset", "brake"), "--preset cannot be combined with --server"),
        (("--timeout", "0"), "--timeout: expected a number of seconds > 0"),
    ]:
        reply = remote("claude-code", event, server, *args)
        assert said in note_lines(reply)[0], reply.err
        assert set(reply.out) == {"systemMessage"} and said in reply.out["systemMessage"]
        fail_closed_denial(
            "claude-code", said, remote("claude-code", event, server, *args, "--fail-closed").out
        )
    for url, said in [
        ("ftp://example.org", "--server: expected http://HOST:PORT"),
        ("http://u:p@127.0.0.1:1", "--server: no credentials in the URL"),
        ("http://127.0.0.1:99999", "--server: bad port"),
    ]:
        reply = remote("claude-code", event, url)
        assert said in note_lines(reply)[0], reply.err
        assert set(reply.out) == {"systemMessage"} and said in reply.out["systemMessage"]
    assert not (tmp_path / "s.sqlite3").exists()


def test_the_server_path_imports_no_grpc_protobuf_sdk_or_service(server: str) -> None:
    code = (
        "import io, sys\n"
        "from otel_loopguard.cli import main\n"
        "sys.stdin = io.TextIOWrapper(io.BytesIO(sys.argv[2].encode()))\n"
        "main(['hook', 'claude-code', '--server', sys.argv[1]])\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('grpc', 'google.protobuf',"
        " 'opentelemetry', 'prometheus_client', 'otel_loopguard.service')))\n"
        "print(heavy, file=sys.stderr)\n"
    )
    event = json.dumps(claude_pre("Bash", {"command": "ls"}, "toolu_1", session="light"))
    proc = subprocess.run(
        [sys.executable, "-c", code, server, event],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(**{TOKEN_ENV: TOKEN}),
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {}
    assert proc.stderr.strip() == "[]"


# -- a stop concluded after a call ran (phase post) -----------------------------------------------

FAILED_RUN = "Exit code 1\nFAILED tests/test_api.py::test_login - assert 401 == 200"


def test_after_answers_the_stop_at_the_third_identical_failure(server: str) -> None:
    """``/v1/decisions/after`` of a call ``before`` counted: ``{"decision": null}`` until the
    result shows the run is stuck, then the guard's conclusion, ``"phase": "post"``."""
    port = urllib.parse.urlsplit(server).port
    assert port is not None
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}

    def call(endpoint: str, **fields: Any) -> Any:
        body = json.dumps(
            {"session": "post-api", "tool": "Bash", "arguments": BASH_TESTS, **fields}
        )
        answer = request(port, "POST", f"/v1/decisions/{endpoint}", body.encode(), headers)
        assert answer.status == 200, answer.body
        return answer.json()

    limit = PRESETS["default"].failure_stop_threshold
    assert limit is not None
    mirror = Mirror()
    for n in range(1, limit + 1):
        before = call("before", call_id=f"toolu_{n}", hold_reminder=True)["decision"]
        expected = mirror.pre("Bash", BASH_TESTS, f"toolu_{n}", "post-api")
        assert (before["action"], before["phase"]) == (expected.action.value, "pre")
        after = call("after", call_id=f"toolu_{n}", error=True, result=FAILED_RUN)
        post = mirror.post("Bash", BASH_TESTS, f"toolu_{n}", "post-api", FAILED_RUN, error=True)
        if n < limit:
            assert after == {"decision": None} and post is None
            continue
        # the reminder held for this call gives way to the stop
        assert expected.action is Action.REMIND and post is not None
        assert after == {"decision": decision_json(post)}
        assert after["decision"]["action"] == "stop" and after["decision"]["phase"] == "post"
        assert after["decision"]["blocks"] is True and after["decision"]["message"] == post.message
    # the run stays stopped: the next attempt is refused before it runs
    again = call("before", call_id=f"toolu_{limit + 1}")["decision"]
    assert (again["action"], again["phase"]) == ("stop", "pre")


GEMINI_SHELL = {"command": "npm test", "description": "run tests"}


def failing_events(host: str, session: str) -> list[dict[str, Any]]:
    """A prompt, then one call failing the same way, each attempt with its failure, until the
    stop and once more."""
    limit = PRESETS["default"].failure_stop_threshold
    assert limit is not None
    if host == "claude-code":
        events = [claude("UserPromptSubmit", session, prompt="make the API tests pass")]
        for n in range(1, limit + 2):
            events.append(claude_pre("Bash", BASH_TESTS, f"toolu_{n}", session=session))
            events.append(
                claude(
                    "PostToolUseFailure",
                    session,
                    tool_name="Bash",
                    tool_input=BASH_TESTS,
                    tool_use_id=f"toolu_{n}",
                    error=FAILED_RUN,
                )
            )
        return events
    failed = {"llmContent": "", "returnDisplay": "", "error": {"message": FAILED_RUN}}
    events = [gemini("BeforeAgent", session_id=session, prompt="make the tests pass")]
    for _ in range(1, limit + 2):
        shell = GEMINI_SHELL
        events.append(
            gemini(
                "BeforeTool", session_id=session, tool_name="run_shell_command", tool_input=shell
            )
        )
        events.append(
            gemini(
                "AfterTool",
                session_id=session,
                tool_name="run_shell_command",
                tool_input=shell,
                tool_response=failed,
            )
        )
    return events


@pytest.mark.slow
@pytest.mark.parametrize("host", ["claude-code", "gemini-cli"])
def test_the_stop_after_the_third_identical_failure_is_the_same_from_the_server(
    server: str, tmp_path: Path, host: str
) -> None:
    session = f"{host}-post-stop"
    events = failing_events(host, session)
    store = tmp_path / "hooks.sqlite3"
    local = [hook(host, event, store) for event in events]
    served = [remote(host, event, server) for event in events]
    for index, (event, mine, theirs) in enumerate(zip(events, local, served)):
        assert theirs == mine, (index, event["hook_event_name"])
        assert mine.code == 0 and mine.err == ""
    # The words of the stop: the same events through a guard in this process.
    limit = PRESETS["default"].failure_stop_threshold
    assert limit is not None
    mirror = Mirror()
    post = None
    for n in range(1, limit + 1):
        if host == "claude-code":
            mirror.pre("Bash", BASH_TESTS, f"toolu_{n}", session)
            post = mirror.post("Bash", BASH_TESTS, f"toolu_{n}", session, FAILED_RUN, error=True)
        else:
            mirror.pre("run_shell_command", GEMINI_SHELL, None, session)
            post = mirror.post(
                "run_shell_command", GEMINI_SHELL, None, session, {"message": FAILED_RUN}, True
            )
    assert post is not None and (post.action, post.phase) == (Action.STOP, Phase.POST)
    # Until then nothing to say (Claude Code and Gemini CLI would show the third attempt's
    # reminder with its result); the result of the limit-th attempt stops the run (the call ran:
    # nothing to deny); the next attempt is refused before it runs.
    stop_at = 2 * limit  # the prompt, then a pre-tool and a post-tool event per attempt
    assert [kind(host, reply.out) for reply in local[:stop_at]] == ["allow"] * stop_at
    stopped = local[stop_at].out
    assert kind(host, stopped) == "stop"
    assert stopped["continue"] is False and stopped["stopReason"] == post.message
    assert kind(host, local[stop_at + 1].out) == "stop"


@pytest.mark.slow
def test_the_prompt_reaches_the_servers_advisor_as_the_task(tmp_path: Path) -> None:
    """With ``--server`` the user's prompt goes to the server (cut to what the guard keeps),
    so its advisor is told the task, as a local hook's advisor is."""
    question = tmp_path / "question.txt"
    advisor = tmp_path / "advisor.sh"
    advisor.write_text(f"#!/bin/sh\nprintf '%s' \"$1\" > {question}\necho 'Read the log.'\n")
    advisor.chmod(0o755)
    config = tmp_path / "loopguard.toml"
    config.write_text(f'advisor_command = "{advisor}"\nstop_after_denials = false\n')
    rescue_at = PRESETS["default"].rescue_threshold
    assert rescue_at is not None
    prompt = "fix the login test " + "x" * 50_000  # a pasted file: still one small request
    with serve_process("--config", str(config)) as url:
        env = clean_env()
        start = hook(
            "claude-code", claude("UserPromptSubmit", prompt=prompt), None, "--server", url, env=env
        )
        assert start == Reply(0, {}, "")
        for call in range(1, rescue_at + 1):
            reply = hook(
                "claude-code",
                claude_pre("Bash", {"command": "make"}, f"t{call}"),
                None,
                "--server",
                url,
                env=env,
            )
    assert "Read the log." in reply.out["hookSpecificOutput"]["permissionDecisionReason"]
    asked = question.read_text()
    assert "fix the login test" in asked
    assert "x" * 3000 not in asked  # cut, as the guard keeps it
