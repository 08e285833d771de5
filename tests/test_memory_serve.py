"""Dead-end memory in ``serve`` (issue 28): with ``--state-dir``, ``memory = true`` keeps the
dead ends in the state directory, so a loop stopped in one session is reminded at its first
repeat in the next, over the decision API, also after a restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otel_loopguard.config import MemoryScope, Policy

from .service_tools import request, require_serve_prerequisites
from .test_hooks import claude_post, claude_pre, clean_env, hook

CALL = {"tool": "bash", "arguments": {"command": "pytest tests/test_io.py"}}


def _decide(port: int, endpoint: str, **body: Any) -> Any:
    answer = request(
        port,
        "POST",
        f"/v1/decisions/{endpoint}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    assert answer.status == 200, answer.body
    return answer.json()["decision"]


def _loop(port: int, session: str, times: int) -> list[Any]:
    decisions = []
    for _ in range(times):
        before = _decide(port, "before", session=session, **CALL)
        decisions.append(before)
        if before["action"] in ("deny", "rescue", "stop"):
            continue
        after = _decide(port, "after", session=session, error=True, result="1 failed", **CALL)
        if after is not None:
            decisions.append(after)
    return decisions


def test_a_stopped_loop_is_reminded_in_the_next_session_and_after_a_restart(
    tmp_path: Path,
) -> None:
    require_serve_prerequisites()
    from otel_loopguard.service import ServeOptions, Service

    state = tmp_path / "state"
    policy = Policy(memory_scope=MemoryScope.GLOBAL)
    options = ServeOptions(http_port=0, grpc_port=None, state_dir=str(state))
    with Service(options, policy=policy) as service:
        first = _loop(service.http_port, "run-1", 6)
        assert any(d and d["action"] == "stop" for d in first)
        second = _loop(service.http_port, "run-2", 2)
        reminded = [d for d in second if d and d["action"] == "remind"]
        assert [d["rule"] for d in reminded] == ["memory"]
        assert "in an earlier run" in reminded[0]["message"]
    assert (state / "memory.json").is_file()
    with Service(options, policy=policy) as again:
        third = _loop(again.http_port, "run-3", 2)
        assert [d["rule"] for d in third if d and d["action"] == "remind"] == ["memory"]
    off = ServeOptions(http_port=0, grpc_port=None, state_dir=str(tmp_path / "off"))
    with Service(off, policy=policy.replace(memory=False)) as quiet:
        _loop(quiet.http_port, "run-1", 6)
        assert all(d is None or d["rule"] != "memory" for d in _loop(quiet.http_port, "r2", 2))
    assert not (tmp_path / "off" / "memory.json").exists()


def _reminded_from_memory(decisions: list[Any]) -> list[Any]:
    return [d for d in decisions if d and d["action"] == "remind" and d["rule"] == "memory"]


def _loop_in(port: int, session: str, times: int, repository: str) -> list[Any]:
    decisions = []
    for _ in range(times):
        before = _decide(port, "before", session=session, repository=repository, **CALL)
        decisions.append(before)
        if before["action"] in ("deny", "rescue", "stop"):
            continue
        after = _decide(port, "after", session=session, repository=repository, error=True, **CALL)
        decisions.append(after)
    return decisions


def test_the_callers_repository_is_the_scope_so_one_serve_keeps_repositories_apart(
    tmp_path: Path,
) -> None:
    """``memory_scope = "repository"`` (the default): the decision API takes the caller's
    repository (``hook --server`` sends the git root of the event's cwd), so a dead end of one
    repository is not recalled in another one served by the same serve."""
    require_serve_prerequisites()
    from otel_loopguard.service import ServeOptions, Service

    options = ServeOptions(http_port=0, grpc_port=None, state_dir=str(tmp_path / "state"))
    with Service(options, policy=Policy()) as service:
        port = service.http_port
        assert any(d and d["action"] == "stop" for d in _loop_in(port, "a-1", 6, "/src/a"))
        assert _reminded_from_memory(_loop_in(port, "b-1", 2, "/src/b")) == []
        assert len(_reminded_from_memory(_loop_in(port, "a-2", 2, "/src/a"))) == 1
    entries = json.loads((tmp_path / "state" / "memory.json").read_text())
    assert "repository:/src/a" in json.dumps(entries)
    assert "repository:/src/b" not in json.dumps(entries)


def test_a_bad_repository_field_is_a_400_naming_it(tmp_path: Path) -> None:
    require_serve_prerequisites()
    from otel_loopguard.service import ServeOptions, Service

    with Service(ServeOptions(http_port=0, grpc_port=None), policy=Policy()) as service:
        for bad in (7, "", "x" * 600):
            answer = request(
                service.http_port,
                "POST",
                "/v1/decisions/before",
                json.dumps({"session": "s", "repository": bad, **CALL}).encode(),
                {"Content-Type": "application/json"},
            )
            assert answer.status == 400 and "repository" in answer.body.decode(), answer.body


def test_hook_server_sends_the_git_root_of_the_events_cwd(tmp_path: Path) -> None:
    """The real hook process with ``--server``: the git root of the payload's cwd is the scope."""
    require_serve_prerequisites()
    from otel_loopguard.service import ServeOptions, Service

    repos = {}
    for name in ("a", "b"):
        (tmp_path / name / ".git").mkdir(parents=True)
        (tmp_path / name / "src").mkdir()
        repos[name] = str(tmp_path / name / "src")
    options = ServeOptions(http_port=0, grpc_port=None, state_dir=str(tmp_path / "state"))
    with Service(options, policy=Policy()) as service:
        url = f"http://127.0.0.1:{service.http_port}"

        def run(session: str, repo: str, times: int) -> list[str]:
            texts = []
            command = {"command": "make"}
            failed = {"stdout": "", "stderr": "make: *** No targets.  Stop.", "exit_code": 2}
            for n in range(times):
                cwd = {"session": session, "cwd": repos[repo]}
                for event in (
                    claude_pre("Bash", command, f"{session}-{n}", **cwd),
                    claude_post("Bash", command, f"{session}-{n}", failed, **cwd),
                ):
                    reply = hook("claude-code", event, None, "--server", url, env=clean_env())
                    texts.append(json.dumps(reply.out))
            return texts

        run("a-1", "a", 6)
        assert not any("earlier run" in text for text in run("b-1", "b", 2))
        assert any("earlier run" in text for text in run("a-2", "a", 2))
    assert f"repository:{tmp_path / 'a'}" in (tmp_path / "state" / "memory.json").read_text()
