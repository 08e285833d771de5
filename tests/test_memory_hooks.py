"""Dead-end memory in the command hooks (issue 28): on by default, kept in the state file, its
scope the repository of the payload's cwd. Each event is a real ``otel-loopguard hook``
process, as the hosts run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from .test_hooks import BASH_RESULT, BASH_TESTS, claude_post, claude_pre, clean_env, hook


def _attempts(store: Path, session: str, cwd: Path, times: int) -> list[dict[str, Any]]:
    """``times`` attempts of the failing test run in ``session``: each answer (pre, and post
    when the call ran)."""
    answers = []
    for n in range(times):
        call_id = f"{session}-{n}"
        pre = hook(
            "claude-code",
            claude_pre("Bash", BASH_TESTS, call_id, session_id=session, cwd=str(cwd)),
            store,
        ).out
        answers.append(pre)
        denied = pre.get("hookSpecificOutput", {}).get("permissionDecision") == "deny"
        if denied or pre.get("continue") is False:
            continue
        post = claude_post("Bash", BASH_TESTS, call_id, BASH_RESULT, session_id=session)
        answers.append(hook("claude-code", {**post, "cwd": str(cwd)}, store).out)
    return answers


def _texts(answers: list[dict[str, Any]]) -> list[str]:
    found = []
    for answer in answers:
        specific = answer.get("hookSpecificOutput", {})
        found += [
            str(specific[k])
            for k in ("additionalContext", "permissionDecisionReason")
            if k in specific
        ]
        if "stopReason" in answer:
            found.append(str(answer["stopReason"]))
    return found


def test_a_loop_stopped_in_one_session_is_reminded_at_its_first_repeat_in_the_next(
    tmp_path: Path,
) -> None:
    store = tmp_path / "hooks.sqlite3"
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    first = _texts(_attempts(store, "sess-1", repo, 6))
    assert any("Not run" in text or "Stopping" in text for text in first)
    assert not any("earlier run" in text for text in first)

    second = _texts(_attempts(store, "sess-2", repo / "src", 2))  # the same repository
    assert len(second) == 1, second
    assert "This exact call gave the same result in an earlier run, last on " in second[0]

    elsewhere = tmp_path / "other"
    (elsewhere / ".git").mkdir(parents=True)
    assert _texts(_attempts(store, "sess-3", elsewhere, 2)) == []  # another repository

    listed = subprocess.run(
        [sys.executable, "-m", "otel_loopguard", "memory", "list", "--store", str(store)],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    ).stdout
    assert f"repository:{repo}" in listed and "  1 run, last " in listed


def test_memory_false_turns_it_off_in_the_hooks(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    env = clean_env(LOOPGUARD_MEMORY="false")
    for session in ("sess-1", "sess-2"):
        for n in range(6 if session == "sess-1" else 2):
            call_id = f"{session}-{n}"
            event = claude_pre("Bash", BASH_TESTS, call_id, session_id=session, cwd=str(repo))
            pre = hook("claude-code", event, store, env=env).out
            if pre:
                continue
            post = claude_post("Bash", BASH_TESTS, call_id, BASH_RESULT, session_id=session)
            out = hook("claude-code", {**post, "cwd": str(repo)}, store, env=env).out
            assert session == "sess-1" or not out, out
