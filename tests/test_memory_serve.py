"""Dead-end memory in ``serve`` (issue 28): with ``--state-dir``, ``memory = true`` keeps the
dead ends in the state directory, so a loop stopped in one session is reminded at its first
repeat in the next, over the decision API, also after a restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otel_loopguard.config import MemoryScope, Policy

from .service_tools import request, require_serve_prerequisites

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
