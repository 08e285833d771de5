"""The real coding agents' own telemetry through a real ``serve``: Claude Code (``claude -p``),
Codex (``codex exec``) and Gemini CLI (``gemini -p``), installed from npm
(``tests/coding_agents``: exact versions, the lock file committed, ``npm ci`` into a temporary
directory), run offline against a scripted model server written here (Anthropic's Messages API,
OpenAI's Responses API, the Gemini API) that asks for the same harmless shell call (``ls``)
again and again, then answers with text. Each agent exports its OTLP log events to
``otel-loopguard serve`` in a subprocess; serve's ``/metrics`` must show every call counted and
the loop decided (remind, deny, stop) from the agent's events alone. With ``otel-loopguard hook
HOST --server`` installed as Claude Code's or Codex's hook too, each call still counts once (the
hook and the event share the session and the call id) and the agent gets the denials.

The tool events recorded from these agents (``tests/data/logs/*.otlp.json``) are read here too.
Node and npm come from ``.ci/install``; without them, or when ``npm ci`` fails, the tests that
run the agents skip, and fail in CI (``CI`` set)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_loopguard import PRESETS, Action, LoopGuard
from otel_loopguard._conventions._log_events import codex_output
from otel_loopguard.service._otlp_logs import json_log_calls

from .service_tools import ServeProcess, request, require_serve_prerequisites, wait_for

PROJECT = Path(__file__).resolve().parent / "coding_agents"
#: Tool events the real agents sent, recorded (tests/data/logs/README.md says how).
RECORDED = Path(__file__).resolve().parent / "data" / "logs"
#: Tool calls the scripted model asks for: past the default preset's stop.
CALLS = 10
#: With the hook: more, so that the stop comes whatever each call's evidence (Codex's hook gets
#: no output, its events do, and which reaches serve first varies).
HOOKED_CALLS = 14
#: Seconds one agent run may take (each takes a few seconds offline).
RUN_TIMEOUT = 150
#: The call the scripted Anthropic model asks Claude Code for.
CLAUDE_INPUT = {"command": "ls", "description": "List files"}
#: The call the scripted OpenAI model asks Codex for: its shell tool (unified exec).
CODEX_TOOL = "exec_command"
CODEX_ARGUMENTS = {"cmd": "ls"}
#: The call the scripted Gemini model asks Gemini CLI for.
GEMINI_TOOL = "run_shell_command"
GEMINI_ARGUMENTS = {"command": "ls", "description": "List files"}


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _require(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        _fail_or_skip(f"{program} is not installed (bash .ci/install installs Node and npm)")
    assert path is not None
    return path


@pytest.fixture(scope="module")
def agents_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The npm project installed from its lock file (``npm ci``) in a temporary directory.
    Install scripts are not run (``--ignore-scripts``: Gemini CLI's optional ``node-pty`` would
    compile), except Claude Code's, which only copies its native binary from the platform
    package over its ``bin/claude.exe`` placeholder (no download)."""
    node = _require("node")
    npm = _require("npm")
    require_serve_prerequisites()
    directory = tmp_path_factory.mktemp("coding-agents")
    for name in ("package.json", "package-lock.json"):
        shutil.copy(PROJECT / name, directory / name)
    try:
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
            cwd=directory,
            check=True,
            timeout=900,
            capture_output=True,
        )
        subprocess.run(
            [node, "install.cjs"],
            cwd=directory / "node_modules" / "@anthropic-ai" / "claude-code",
            check=True,
            timeout=120,
            capture_output=True,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        _fail_or_skip(f"installing tests/coding_agents failed: {exc} {getattr(exc, 'stderr', '')}")
    return directory


def _binary(directory: Path, name: str) -> str:
    """The agent's command, as npm linked it (``node_modules/.bin``)."""
    path = directory / "node_modules" / ".bin" / name
    if not path.exists():
        _fail_or_skip(f"{name} is not installed in {directory}")
    return str(path)


# -- the scripted model servers ----------------------------------------------------------------


@dataclass
class Script:
    """What the scripted model saw: the tool results the agent sent back (each as text, with
    whether the agent marked it an error), in the order of the calls."""

    calls: int
    results: list[tuple[str, bool]] = field(default_factory=list)
    #: The call ids the model asked for (each tool call once).
    asked: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    length = handler.headers.get("Content-Length")
    if length is not None:
        return handler.rfile.read(int(length))
    body = b""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        while size := int(handler.rfile.readline().strip() or b"0", 16):
            body += handler.rfile.read(size)
            handler.rfile.readline()
        handler.rfile.readline()
    return body


def _send(handler: BaseHTTPRequestHandler, body: bytes, content_type: str) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
    )


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return json.dumps(content)


def anthropic_reply(script: Script, request_body: dict[str, Any]) -> tuple[bytes, str]:
    """Anthropic's Messages API: a ``Bash`` ``ls`` tool use while fewer than ``script.calls``
    tool results are in the conversation, then text. A request without the Bash tool (a side
    request: a title, a summary) gets text."""
    results = [
        block
        for message in request_body.get("messages", [])
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    tools = {tool.get("name") for tool in request_body.get("tools", [])}
    looping = "Bash" in tools
    if looping:
        with script.lock:
            script.results[:] = [
                (_text_of(block.get("content")), bool(block.get("is_error"))) for block in results
            ]
    block: dict[str, Any]
    if looping and len(results) < script.calls:
        block = {
            "type": "tool_use",
            "id": f"toolu_{len(results) + 1:02d}",
            "name": "Bash",
            "input": CLAUDE_INPUT,
        }
        with script.lock:
            script.asked.add(block["id"])
        stop = "tool_use"
    else:
        block, stop = {"type": "text", "text": "Done."}, "end_turn"
    message: dict[str, Any] = {
        "id": f"msg_{len(results)}",
        "type": "message",
        "role": "assistant",
        "model": request_body.get("model"),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    if not request_body.get("stream"):
        return json.dumps({**message, "content": [block], "stop_reason": stop}).encode(), (
            "application/json"
        )
    if block["type"] == "tool_use":
        start = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    else:
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": start},
        ),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return _sse(events), "text/event-stream"


def responses_reply(script: Script, request_body: dict[str, Any]) -> tuple[bytes, str]:
    """OpenAI's Responses API (streamed): an ``exec_command`` ``ls`` function call while fewer
    than ``script.calls`` outputs are in the input, then text."""
    outputs = [
        item
        for item in request_body.get("input", [])
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    with script.lock:
        script.results[:] = [(_text_of(item.get("output")), False) for item in outputs]
    item: dict[str, Any]
    if len(outputs) < script.calls:
        item = {
            "type": "function_call",
            "id": f"fc_{len(outputs) + 1}",
            "call_id": f"call_{len(outputs) + 1:02d}",
            "name": CODEX_TOOL,
            "arguments": json.dumps(CODEX_ARGUMENTS),
            "status": "completed",
        }
        with script.lock:
            script.asked.add(item["call_id"])
    else:
        item = {
            "type": "message",
            "id": "msg_done",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
        }
    response_id = f"resp_{len(outputs)}"
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": response_id}},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": {"id": response_id, "usage": usage}},
    ]
    return _sse([(event["type"], event) for event in events]), "text/event-stream"


def gemini_reply(script: Script, request_body: dict[str, Any]) -> tuple[bytes, str]:
    """The Gemini API (``generateContent``, ``streamGenerateContent`` as SSE): a
    ``run_shell_command`` ``ls`` function call while fewer than ``script.calls`` function
    responses are in the contents, then text. A request without that tool (Gemini CLI's model
    router) gets text."""
    responses = [
        part["functionResponse"]
        for content in request_body.get("contents", [])
        for part in content.get("parts", [])
        if isinstance(part, dict) and "functionResponse" in part
    ]
    tools = {
        declaration.get("name")
        for tool in request_body.get("tools", [])
        for declaration in tool.get("functionDeclarations", [])
    }
    looping = GEMINI_TOOL in tools
    if looping:
        with script.lock:
            script.results[:] = [(json.dumps(r.get("response")), False) for r in responses]
    part: dict[str, Any]
    if looping and len(responses) < script.calls:
        part = {"functionCall": {"name": GEMINI_TOOL, "args": GEMINI_ARGUMENTS}}
        with script.lock:
            script.asked.add(f"call-{len(responses) + 1}")
    elif looping:
        part = {"text": "Done."}
    else:  # its model router's classifiers (either schema): the simple route
        route = {
            "reasoning": "A simple listing.",
            "model_choice": "flash",
            "complexity_reasoning": "A simple listing.",
            "complexity_score": 10,
        }
        part = {"text": json.dumps(route)}
    reply = {
        "candidates": [
            {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "gemini-2.5-flash",
    }
    if request_body.get("_stream"):
        return f"data: {json.dumps(reply)}\r\n\r\n".encode(), "text/event-stream"
    return json.dumps(reply).encode(), "application/json"


class ScriptedModel:
    """A scripted model API on a free loopback port, in a thread: ``reply`` answers each POST
    (its JSON body) with (body, content type); every other request is a 404."""

    def __init__(self, reply: Callable[[Script, dict[str, Any]], tuple[bytes, str]]) -> None:
        self.script = Script(CALLS)
        script = self.script

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                raw = _read_body(self)
                try:
                    decoded = json.loads(raw or b"{}")
                except ValueError:
                    decoded = {}
                request_body = decoded if isinstance(decoded, dict) else {}
                if "streamGenerateContent" in self.path:
                    request_body["_stream"] = True
                body, content_type = reply(script, request_body)
                _send(self, body, content_type)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def anthropic() -> Iterator[ScriptedModel]:
    model = ScriptedModel(anthropic_reply)
    try:
        yield model
    finally:
        model.close()


@pytest.fixture
def openai() -> Iterator[ScriptedModel]:
    model = ScriptedModel(responses_reply)
    try:
        yield model
    finally:
        model.close()


@pytest.fixture
def gemini() -> Iterator[ScriptedModel]:
    model = ScriptedModel(gemini_reply)
    try:
        yield model
    finally:
        model.close()


@pytest.fixture
def serve() -> Iterator[ServeProcess]:
    server = ServeProcess()
    try:
        yield server
    finally:
        server.close()


# -- running the agents ------------------------------------------------------------------------


def _environment(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment: a home of its own (no user settings, no credentials), no proxy, no
    OTEL_* or LOOPGUARD_* setting from this process; ``extra`` added."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "LANG": "C.UTF-8",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    env.update(extra)
    return env


def _hook_command(host: str, serve: ServeProcess) -> str:
    return f"{sys.executable} -m otel_loopguard hook {host} --server {serve.url}"


def _workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "project"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("nothing to see\n")
    return workspace


def run_claude(
    agents_dir: Path, tmp_path: Path, model: ScriptedModel, serve: ServeProcess, *, hook: bool
) -> subprocess.CompletedProcess[str]:
    """``claude -p`` once, its model the scripted server (``ANTHROPIC_BASE_URL``, a dummy key),
    its OTLP log events to serve over OTLP/HTTP (protobuf); with ``hook``, ``otel-loopguard hook
    claude-code --server`` installed for its tool and prompt events (user settings)."""
    claude = _binary(agents_dir, "claude")
    home = tmp_path / "home"
    if hook:
        command = [{"type": "command", "command": _hook_command("claude-code", serve)}]
        settings = {
            "hooks": {
                event: [{"matcher": "*", "hooks": command}]
                for event in ("PreToolUse", "PostToolUse", "PostToolUseFailure")
            }
            | {"UserPromptSubmit": [{"hooks": command}]}
        }
        (home / ".claude").mkdir(parents=True)
        (home / ".claude" / "settings.json").write_text(json.dumps(settings))
    env = _environment(
        home,
        ANTHROPIC_BASE_URL=model.url,
        ANTHROPIC_API_KEY="sk-ant-scripted-0000",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_ENABLE_TELEMETRY="1",
        OTEL_LOGS_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_ENDPOINT=serve.url,
        OTEL_LOGS_EXPORT_INTERVAL="500",
        OTEL_LOG_TOOL_DETAILS="1",
    )
    return subprocess.run(
        [
            claude,
            "-p",
            "List the files here.",
            "--allowedTools",
            "Bash",
            "--output-format",
            "json",
        ],
        stdin=subprocess.DEVNULL,
        cwd=_workspace(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


def run_codex(
    agents_dir: Path, tmp_path: Path, model: ScriptedModel, serve: ServeProcess, *, hook: bool
) -> subprocess.CompletedProcess[str]:
    """``codex exec`` once, its model provider the scripted server (``base_url``, the Responses
    API, a dummy key), its OTLP log events to serve over OTLP/HTTP (protobuf); with ``hook``,
    ``otel-loopguard hook codex --server`` in ``$CODEX_HOME/hooks.json``."""
    codex = _binary(agents_dir, "codex")
    home = tmp_path / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        f"""model = "gpt-5-codex"
model_provider = "scripted"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.scripted]
name = "scripted"
base_url = "{model.url}/v1"
wire_api = "responses"
env_key = "SCRIPTED_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[otel]
log_user_prompt = false
exporter = {{ otlp-http = {{ endpoint = "{serve.url}/v1/logs", protocol = "binary" }} }}

[features]
hooks = {"true" if hook else "false"}
"""
    )
    if hook:
        command = [{"type": "command", "command": _hook_command("codex", serve)}]
        hooks = {
            "hooks": {
                "PreToolUse": [{"matcher": "*", "hooks": command}],
                "PostToolUse": [{"matcher": "*", "hooks": command}],
                "UserPromptSubmit": [{"hooks": command}],
            }
        }
        (codex_home / "hooks.json").write_text(json.dumps(hooks))
    env = _environment(home, CODEX_HOME=str(codex_home), SCRIPTED_API_KEY="scripted-0000")
    # Codex runs hooks only once they are trusted (reviewed in its TUI); --dangerously-bypass-
    # hook-trust runs them without that for this invocation (hooks.json is written just above).
    trust = ["--dangerously-bypass-hook-trust"] if hook else []
    return subprocess.run(
        [codex, "exec", *trust, "--skip-git-repo-check", "List the files here."],
        stdin=subprocess.DEVNULL,
        cwd=_workspace(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


def run_gemini(
    agents_dir: Path, tmp_path: Path, model: ScriptedModel, serve: ServeProcess
) -> subprocess.CompletedProcess[str]:
    """``gemini -p`` once (``--yolo``: its shell tool runs unasked), its model the scripted server
    (``GOOGLE_GEMINI_BASE_URL``, a dummy ``GEMINI_API_KEY``), its telemetry to serve over
    OTLP/HTTP (``telemetry.otlpProtocol`` ``http``: JSON), from its user settings."""
    gemini = _binary(agents_dir, "gemini")
    home = tmp_path / "home"
    settings = {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "telemetry": {
            "enabled": True,
            "target": "local",
            "otlpEndpoint": serve.url,
            "otlpProtocol": "http",
            "logPrompts": True,
        },
        # Gemini CLI stops a run itself at the 5th identical call in a row: off, so that the
        # events show the whole loop (as with a model that varies its calls a little).
        "model": {"disableLoopDetection": True},
        "general": {"disableAutoUpdate": True},
        "privacy": {"usageStatisticsEnabled": False},
    }
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    env = _environment(home, GEMINI_API_KEY="scripted-0000", GOOGLE_GEMINI_BASE_URL=model.url)
    return subprocess.run(
        [gemini, "-p", "List the files here.", "--yolo"],
        stdin=subprocess.DEVNULL,
        cwd=_workspace(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


# -- what serve shows --------------------------------------------------------------------------


def samples(serve: ServeProcess, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of metric ``name`` on serve's /metrics, by their sorted labels."""
    text = request(serve.port, "GET", "/metrics").body.decode()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def counted(serve: ServeProcess, name: str, **labels: str) -> float:
    return sum(
        value
        for key, value in samples(serve, name).items()
        if all(dict(key).get(label) == wanted for label, wanted in labels.items())
    )


def decisions_shown(serve: ServeProcess, tool: str) -> dict[str, int]:
    shown: dict[str, int] = {}
    for labels, value in samples(serve, "loopguard_decisions_total").items():
        row = dict(labels)
        if row.get("tool") == tool and value:
            shown[row["action"]] = shown.get(row["action"], 0) + int(value)
    return shown


def expected_decisions(tool: str, arguments: object, results: list[object]) -> dict[str, int]:
    """(action -> how many) the default preset decides for one identical call per result, each
    seen only after it ran (the events: nothing stops them), through the plain hook API."""
    guard = LoopGuard(PRESETS["default"])
    actions: dict[str, int] = {}
    for n, result in enumerate(results):
        decision = guard.after_tool(
            tool,
            arguments,
            session="reference",
            call_id=f"call-{n + 1}",
            error=False,
            result=result,
        )
        if decision is not None and decision.action is not Action.ALLOW:
            actions[decision.action.value] = actions.get(decision.action.value, 0) + 1
    return actions


def accepted_records(serve: ServeProcess) -> float:
    return counted(serve, "loopguard_otlp_log_records_total", result="accepted")


# -- the recorded events -----------------------------------------------------------------------


def test_the_recorded_claude_code_events_read_as_its_calls() -> None:
    """Claude Code 2.1.332's own tool_result records (captured from a run against the scripted
    model): each is its call, keyed by its session.id and its tool_use_id (what its hooks get)."""
    batch = json_log_calls(json.loads((RECORDED / "claude_code_2.1.332.otlp.json").read_text()))
    assert batch.accepted == 3 and not batch.problems
    assert [call.call_id for call in batch.calls] == ["toolu_01", "toolu_02", "toolu_03"]
    assert {call.tool for call in batch.calls} == {"Bash"}
    assert {call.session for call in batch.calls} == {"0a0860d2-01da-4063-b20b-6c8a46a37095"}
    assert all(json.loads(str(call.arguments)) == CLAUDE_INPUT for call in batch.calls)


def test_the_recorded_codex_events_read_as_its_calls_with_one_output() -> None:
    """Codex 0.171.0's own codex.tool_result records: the same ``ls`` three times. Its output
    differs on each (the header's Chunk ID and Wall time); read, the three are one result, so
    that a loop shows no progress."""
    raw = json.loads((RECORDED / "codex_0.171.0.otlp.json").read_text())
    outputs = [
        attribute["value"]["stringValue"]
        for resource in raw["resourceLogs"]
        for scope in resource["scopeLogs"]
        for record in scope["logRecords"]
        for attribute in record["attributes"]
        if attribute["key"] == "output"
    ]
    assert len(set(outputs)) == 3 and all(o.startswith("Chunk ID: ") for o in outputs)
    batch = json_log_calls(raw)
    assert batch.accepted == 3 and not batch.problems
    assert [call.call_id for call in batch.calls] == ["call_01", "call_02", "call_03"]
    assert {call.tool for call in batch.calls} == {CODEX_TOOL}
    assert len({call.session for call in batch.calls}) == 1
    assert all(json.loads(str(call.arguments)) == CODEX_ARGUMENTS for call in batch.calls)
    assert {call.result for call in batch.calls} == {
        "Process exited with code 0\nOriginal token count: 3\nOutput:\nnotes.txt\n"
    }


def test_the_recorded_gemini_cli_events_read_as_its_calls() -> None:
    """Gemini CLI 0.61.0's own gemini_cli.tool_call records: no call id (one is made from each
    record, so three calls are three), ``null`` attributes sent as empty values."""
    batch = json_log_calls(json.loads((RECORDED / "gemini_cli_0.61.0.otlp.json").read_text()))
    assert batch.accepted == 3 and not batch.problems
    assert {call.tool for call in batch.calls} == {GEMINI_TOOL}
    assert len({call.call_id for call in batch.calls}) == 3
    assert {call.session for call in batch.calls} == {"64bf16fd-ebf9-4501-a9fa-92fb44eb838a"}
    assert all(json.loads(str(call.arguments)) == GEMINI_ARGUMENTS for call in batch.calls)
    assert {call.error for call in batch.calls} == {False}


def test_codex_output_drops_only_the_header_lines_that_change() -> None:
    output = "Chunk ID: 91e1e8\nWall time: 0.0012 seconds\nProcess exited with code 1\nOutput:\nx"
    assert codex_output(output) == "Process exited with code 1\nOutput:\nx"
    # the command's own output is kept whatever it says; other results are as they are
    body = "Chunk ID: 1\nWall time: 2 seconds\nOutput:\nWall time: 3 seconds\n"
    assert codex_output(body) == "\nOutput:\nWall time: 3 seconds\n"
    assert codex_output("plain text") == "plain text"
    assert codex_output(None) is None


# -- the real agents ---------------------------------------------------------------------------


@pytest.mark.slow
def test_claude_code_looping_is_decided_from_its_own_telemetry(
    agents_dir: Path, tmp_path: Path, anthropic: ScriptedModel, serve: ServeProcess
) -> None:
    done = run_claude(agents_dir, tmp_path, anthropic, serve, hook=False)
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session_id"]
    # nothing enforces from telemetry: every call ran
    results = anthropic.script.results
    assert len(results) == CALLS and not any(error for _, error in results), results
    assert wait_for(lambda: counted(serve, "loopguard_tool_calls_total", tool="Bash") == CALLS, 30)
    expected = expected_decisions("Bash", json.dumps(CLAUDE_INPUT), [None] * CALLS)
    assert {"remind", "deny", "stop"} <= set(expected)
    assert wait_for(lambda: decisions_shown(serve, "Bash") == expected, 10), decisions_shown(
        serve, "Bash"
    )
    assert counted(serve, "loopguard_stopped_runs_total", tool="Bash") == 1
    # the calls are keyed by Claude Code's own session id (the one its hooks get)
    assert any(f"session={session} " in line for line in serve.lines), serve.lines


@pytest.mark.slow
def test_codex_looping_is_decided_from_its_own_telemetry(
    agents_dir: Path, tmp_path: Path, openai: ScriptedModel, serve: ServeProcess
) -> None:
    done = run_codex(agents_dir, tmp_path, openai, serve, hook=False)
    assert done.returncode == 0, done.stderr
    results = openai.script.results
    assert len(results) == CALLS and all("Output:\nnotes.txt" in r for r, _ in results), results
    assert len({text for text, _ in results}) > 1  # Codex's header differs on every call
    assert wait_for(
        lambda: counted(serve, "loopguard_tool_calls_total", tool=CODEX_TOOL) == CALLS, 30
    )
    expected = expected_decisions(
        CODEX_TOOL, CODEX_ARGUMENTS, [codex_output(text) for text, _ in results]
    )
    assert {"remind", "deny", "stop"} <= set(expected)
    assert wait_for(lambda: decisions_shown(serve, CODEX_TOOL) == expected, 10), decisions_shown(
        serve, CODEX_TOOL
    )
    assert counted(serve, "loopguard_stopped_runs_total", tool=CODEX_TOOL) == 1


@pytest.mark.slow
def test_gemini_cli_looping_is_decided_from_its_own_telemetry(
    agents_dir: Path, tmp_path: Path, gemini: ScriptedModel, serve: ServeProcess
) -> None:
    done = run_gemini(agents_dir, tmp_path, gemini, serve)
    assert done.returncode == 0, done.stderr
    results = gemini.script.results
    assert len(results) == CALLS and all("notes.txt" in text for text, _ in results), results
    assert wait_for(
        lambda: counted(serve, "loopguard_tool_calls_total", tool=GEMINI_TOOL) == CALLS, 30
    )
    # its events carry no output: the guard sees none
    expected = expected_decisions(GEMINI_TOOL, GEMINI_ARGUMENTS, [None] * CALLS)
    assert {"remind", "deny", "stop"} <= set(expected)
    assert wait_for(lambda: decisions_shown(serve, GEMINI_TOOL) == expected, 10), decisions_shown(
        serve, GEMINI_TOOL
    )
    assert counted(serve, "loopguard_stopped_runs_total", tool=GEMINI_TOOL) == 1


@pytest.mark.slow
def test_claude_code_with_the_hook_counts_each_call_once_and_is_denied_then_stopped(
    agents_dir: Path, tmp_path: Path, anthropic: ScriptedModel, serve: ServeProcess
) -> None:
    """The hook (``otel-loopguard hook claude-code --server``) and the telemetry report the same
    calls: each counts once. The hook enforces: Claude Code gets the denials, then the stop ends
    its run before the model's last calls."""
    anthropic.script.calls = HOOKED_CALLS
    done = run_claude(agents_dir, tmp_path, anthropic, serve, hook=True)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["terminal_reason"] == "hook_stopped", printed
    asked = len(anthropic.script.asked)
    assert 0 < asked < HOOKED_CALLS
    denied = [text for text, error in anthropic.script.results if error]
    assert denied and all("[loopguard] Not run" in text for text in denied), denied
    ran = asked - len(printed["permission_denials"])
    assert ran == len(anthropic.script.results) - len(denied)
    # the telemetry of the calls that ran arrived, and counted nothing more
    assert wait_for(lambda: accepted_records(serve) == ran, 30), accepted_records(serve)
    assert counted(serve, "loopguard_tool_calls_total", tool="Bash") == asked
    shown = decisions_shown(serve, "Bash")
    assert shown.get("deny", 0) == len(denied) and shown.get("stop") == 1, shown
    assert counted(serve, "loopguard_stopped_runs_total", tool="Bash") == 1


@pytest.mark.slow
def test_codex_with_the_hook_counts_each_call_once_and_is_denied(
    agents_dir: Path, tmp_path: Path, openai: ScriptedModel, serve: ServeProcess
) -> None:
    """The hook (``otel-loopguard hook codex --server``) and the telemetry report the same calls
    (Codex's hooks name its shell tool ``Bash``, its events ``exec_command``; the session and the
    call id are the same): each counts once. Codex gets the denials and the stop as a denial."""
    openai.script.calls = HOOKED_CALLS
    done = run_codex(agents_dir, tmp_path, openai, serve, hook=True)
    assert done.returncode == 0, done.stderr
    asked = len(openai.script.asked)
    assert asked == HOOKED_CALLS  # Codex does not end its run on a denial
    blocked = [text for text, _ in openai.script.results if "[loopguard]" in text]
    assert blocked and all(
        text.startswith("Command blocked by PreToolUse hook: [loopguard]") for text in blocked
    ), blocked
    ran = len(openai.script.results) - len(blocked)
    assert wait_for(lambda: accepted_records(serve) == ran, 30), accepted_records(serve)
    assert counted(serve, "loopguard_tool_calls_total") == asked
    shown = decisions_shown(serve, "Bash")
    assert shown.get("deny", 0) + shown.get("stop", 0) == len(blocked), shown
    assert shown.get("stop", 0) >= 1 and any("Stopping" in text for text in blocked), shown
    assert counted(serve, "loopguard_stopped_runs_total", tool="Bash") == 1
