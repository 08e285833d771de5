"""Coding-agent command hooks (otel_loopguard/hooks): the real command, host-shaped JSON.

Each event goes through ``python -m otel_loopguard hook HOST --store TMP`` in a process of its
own, as the hosts run it. The texts expected inside the answers come from the same events fed
to an in-process LoopGuard (the hook must wrap the guard's decision, not invent its own); the
JSON around them is written out here as each host's contract says
(tests/data/reference/wire-and-hooks.md).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard import PRESETS, Action, Decision, LoopGuard, Policy
from otel_loopguard._engine import SessionState
from otel_loopguard.hooks import (
    HOSTS,
    MAX_TEXT_CHARS,
    STORE_ENV,
    EventKind,
    default_store_path,
)
from otel_loopguard.hooks._runner import FAIL_CLOSED_TEXT

DEFAULT = PRESETS["default"]
REMIND_AT = DEFAULT.remind_thresholds[0]
assert DEFAULT.no_progress_threshold is not None and DEFAULT.stop_after_denials is not None
DENY_AT = DEFAULT.no_progress_threshold  # the same result came back DENY_AT - 1 times
STOP_AT = DENY_AT + DEFAULT.stop_after_denials  # after stop_after_denials denied attempts

CODEX_TOP_FIELDS = {"hookSpecificOutput", "continue", "stopReason", "systemMessage"}
CODEX_SPECIFIC_FIELDS = {
    "hookEventName",
    "permissionDecision",
    "permissionDecisionReason",
    "additionalContext",
}


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without LOOPGUARD_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}
    env.update(extra)
    return env


@dataclass
class Reply:
    code: int
    out: dict[str, Any]
    err: str


def hook(
    host: str,
    event: object,
    store: Path | None,
    *args: str,
    env: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> Reply:
    """Run one hook invocation as a host does; check it printed exactly one JSON line."""
    argv = [sys.executable, "-m", "otel_loopguard", "hook", host]
    if store is not None:
        argv += ["--store", str(store)]
    data = raw if raw is not None else json.dumps(event).encode()
    proc = subprocess.run(
        [*argv, *args],
        input=data,
        capture_output=True,
        timeout=120,
        env=env if env is not None else clean_env(),
    )
    assert proc.stdout.endswith(b"\n") and proc.stdout.count(b"\n") == 1, proc.stdout
    out = json.loads(proc.stdout)
    assert isinstance(out, dict)
    return Reply(proc.returncode, out, proc.stderr.decode())


# -- host-shaped events -------------------------------------------------------------------------


def claude(name: str, session: str = "sess-1", **fields: Any) -> dict[str, Any]:
    return {
        "session_id": session,
        "transcript_path": "/home/u/.claude/projects/p/s.jsonl",
        "cwd": "/work/project",
        "permission_mode": "default",
        "hook_event_name": name,
        **fields,
    }


def claude_pre(tool: str, tool_input: Any, call_id: str, **fields: Any) -> dict[str, Any]:
    return claude(
        "PreToolUse", tool_name=tool, tool_input=tool_input, tool_use_id=call_id, **fields
    )


def claude_post(
    tool: str, tool_input: Any, call_id: str, response: Any, **fields: Any
) -> dict[str, Any]:
    return claude(
        "PostToolUse",
        tool_name=tool,
        tool_input=tool_input,
        tool_use_id=call_id,
        tool_response=response,
        duration_ms=1200,
        **fields,
    )


def gemini(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "session_id": "gem-1",
        "transcript_path": "/home/u/.gemini/tmp/chat.json",
        "cwd": "/work/project",
        "hook_event_name": name,
        "timestamp": "2026-11-30T10:30:00Z",
        **fields,
    }


def codex(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "session_id": "019a-codex",
        "turn_id": "turn-1",
        "transcript_path": None,
        "cwd": "/work/project",
        "hook_event_name": name,
        "model": "gpt-5-codex",
        "permission_mode": "default",
        **fields,
    }


BASH_TESTS = {
    "command": "pytest -x tests/test_api.py",
    "description": "Run the API tests",
    "timeout": 120000,
}
BASH_RESULT = {
    "stdout": "FAILED tests/test_api.py::test_login - assert 401 == 200\n1 failed",
    "stderr": "",
    "interrupted": False,
    "isImage": False,
}


class Mirror:
    """The same events through an in-process guard: the decisions the hook must wrap."""

    def __init__(self, policy: Policy = DEFAULT) -> None:
        self.guard = LoopGuard(policy)

    def pre(
        self, tool: str, arguments: Any, call_id: str | None, session: str, agent: str | None = None
    ) -> Decision:
        return self.guard.before_tool(
            tool, arguments, session=session, agent=agent, call_id=call_id
        )

    def post(
        self,
        tool: str,
        arguments: Any,
        call_id: str | None,
        session: str,
        result: Any,
        error: bool | None = False,
        agent: str | None = None,
    ) -> Decision | None:
        return self.guard.after_tool(
            tool,
            arguments,
            session=session,
            agent=agent,
            call_id=call_id,
            result=result,
            error=error,
        )


def deny_claude(name: str, text: str) -> dict[str, Any]:
    return {
        "hookSpecificOutput": {
            "hookEventName": name,
            "permissionDecision": "deny",
            "permissionDecisionReason": text,
        }
    }


def context(name: str, text: str) -> dict[str, Any]:
    return {"hookSpecificOutput": {"hookEventName": name, "additionalContext": text}}


# -- Claude Code ------------------------------------------------------------------------------


@pytest.mark.slow
def test_claude_code_allow_remind_deny_stop_and_a_prompt_lifts_the_stop(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    mirror = Mirror()
    assert hook(
        "claude-code", claude("UserPromptSubmit", prompt="fix the login test"), store
    ) == Reply(0, {}, "")
    for call in range(1, STOP_AT + 1):
        call_id = f"toolu_{call:02d}"
        expected = mirror.pre("Bash", BASH_TESTS, call_id, "sess-1")
        reply = hook("claude-code", claude_pre("Bash", BASH_TESTS, call_id), store)
        assert reply.code == 0 and reply.err == ""
        if call < DENY_AT:
            assert expected.action in (Action.ALLOW, Action.REMIND)
            assert reply.out == {}  # Claude Code takes no context before a call: it waits
            mirror.post("Bash", BASH_TESTS, call_id, "sess-1", BASH_RESULT)
            after = hook(
                "claude-code", claude_post("Bash", BASH_TESTS, call_id, BASH_RESULT), store
            )
            if call == REMIND_AT:  # the reminder decided before the call, shown with its result
                assert expected.action is Action.REMIND
                assert after.out == context("PostToolUse", expected.message)
                assert after.out["hookSpecificOutput"]["additionalContext"].startswith(
                    "[loopguard] You have called `Bash` with the same arguments 3 times"
                )
            else:
                assert after.out == {}
        elif call < STOP_AT:  # denied: the tool does not run, no PostToolUse follows
            assert expected.action is Action.DENY
            assert reply.out == deny_claude("PreToolUse", expected.message)
            assert expected.message.startswith("[loopguard] Not run: `Bash`")
        else:
            assert expected.action is Action.STOP
            assert reply.out == {
                "continue": False,
                "stopReason": expected.message,
                **deny_claude("PreToolUse", expected.message),
            }
    # Stopped: any tracked call is refused until the user speaks again.
    other = {"file_path": "/work/project/src/auth.py"}
    expected = mirror.pre("Read", other, "toolu_90", "sess-1")
    assert expected.action is Action.STOP
    reply = hook("claude-code", claude_pre("Read", other, "toolu_90"), store)
    assert reply.out["continue"] is False
    assert hook("claude-code", claude("UserPromptSubmit", prompt="try again"), store).out == {}
    mirror.guard.user_message("sess-1")
    assert mirror.pre("Bash", BASH_TESTS, "toolu_91", "sess-1").action is Action.ALLOW
    assert hook("claude-code", claude_pre("Bash", BASH_TESTS, "toolu_91"), store).out == {}


@pytest.mark.slow
def test_claude_code_failures_sub_agents_and_sessions_have_their_own_chains(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    mirror = Mirror()
    edit = {"file_path": "/work/project/setup.cfg", "old_string": "a", "new_string": "b"}
    error = "String to replace not found in file."
    for call in range(1, REMIND_AT + 1):
        call_id = f"toolu_sub_{call}"
        expected = mirror.pre("Edit", edit, call_id, "sess-1", agent="agent-7")
        pre = hook(
            "claude-code",
            claude_pre("Edit", edit, call_id, agent_id="agent-7", agent_type="general-purpose"),
            store,
        )
        assert pre.out == {}
        mirror.post("Edit", edit, call_id, "sess-1", error, error=True, agent="agent-7")
        failure = hook(
            "claude-code",
            claude(
                "PostToolUseFailure",
                tool_name="Edit",
                tool_input=edit,
                tool_use_id=call_id,
                error=error,
                agent_id="agent-7",
                agent_type="general-purpose",
            ),
            store,
        )
        if call == REMIND_AT:
            # The third identical failure: reminded before it ran, and stopped after it (a
            # PostToolUse stop: the run ends before the next model turn).
            assert expected.action is Action.REMIND
            assert PRESETS["default"].failure_stop_threshold == REMIND_AT
            assert failure.out["continue"] is False
            assert "failed the same way" in failure.out["stopReason"]
        else:
            assert failure.out == {}
    # The main agent of the session and another session start from zero (without memory of
    # dead ends across runs, on by default in the hooks: tests/test_memory_hooks.py).
    no_memory = clean_env(LOOPGUARD_MEMORY="false")
    for session, agent_fields in (("sess-1", {}), ("sess-2", {"agent_id": "agent-7"})):
        for call in range(1, REMIND_AT):
            reply = hook(
                "claude-code",
                claude_pre("Edit", edit, f"t-{session}-{call}", session=session, **agent_fields),
                store,
                env=no_memory,
            )
            assert reply.out == {}
            post = hook(
                "claude-code",
                claude(
                    "PostToolUseFailure",
                    session=session,
                    tool_name="Edit",
                    tool_input=edit,
                    tool_use_id=f"t-{session}-{call}",
                    error=error,
                    **agent_fields,
                ),
                store,
                env=no_memory,
            )
            assert post.out == {}


@pytest.mark.slow
def test_a_user_prompt_lifts_a_stopped_sub_agent_too(tmp_path: Path) -> None:
    """The user's prompt (no agent) starts a new epoch for every agent of the session, as
    ``guard.user_message(session)`` and the ``--server`` backend do: a sub-agent stopped by
    identical failures may run again; another session's sub-agent stays stopped."""
    store = tmp_path / "hooks.sqlite3"
    edit = {"file_path": "/work/project/setup.cfg", "old_string": "a", "new_string": "b"}
    error = "String to replace not found in file."
    for session in ("sess-1", "sess-2"):
        for call in range(1, REMIND_AT + 1):
            call_id = f"t-{session}-{call}"
            hook(
                "claude-code",
                claude_pre("Edit", edit, call_id, session=session, agent_id="agent-7"),
                store,
            )
            failure = hook(
                "claude-code",
                claude(
                    "PostToolUseFailure",
                    session=session,
                    tool_name="Edit",
                    tool_input=edit,
                    tool_use_id=call_id,
                    error=error,
                    agent_id="agent-7",
                ),
                store,
            )
        assert failure.out["continue"] is False  # stopped
    read = {"file_path": "/work/project/README.md"}
    stopped = hook("claude-code", claude_pre("Read", read, "r1", agent_id="agent-7"), store)
    assert stopped.out["continue"] is False
    assert hook("claude-code", claude("UserPromptSubmit", prompt="try again"), store).out == {}
    again = hook("claude-code", claude_pre("Read", read, "r2", agent_id="agent-7"), store)
    assert again == Reply(0, {}, "")
    other = hook(
        "claude-code",
        claude_pre("Read", read, "r3", session="sess-2", agent_id="agent-7"),
        store,
    )
    assert other.out["continue"] is False


@pytest.mark.slow
def test_claude_code_events_it_does_not_act_on_are_answered_empty_with_a_note(
    tmp_path: Path,
) -> None:
    store = tmp_path / "hooks.sqlite3"
    for name, fields in (
        ("Stop", {"stop_hook_active": False}),
        ("SessionStart", {"source": "startup"}),
        ("Notification", {"message": "waiting"}),
    ):
        reply = hook("claude-code", claude(name, **fields), store)
        assert (reply.code, reply.out) == (0, {})
        # One line on stderr naming the event and the events the hook does decide.
        assert reply.err == (
            f"otel-loopguard hook claude-code: event {name!r} is not one this hook decides"
            f" ({', '.join(HOSTS['claude-code'].events)}); nothing to do\n"
        )
    assert not store.exists()  # nothing to decide: the store is not even opened


# -- Gemini CLI -------------------------------------------------------------------------------


@pytest.mark.slow
def test_gemini_cli_allow_remind_deny_stop(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    mirror = Mirror()
    read = {"absolute_path": "/work/project/src/auth.py"}
    response = {"llmContent": "def login(user): ...", "returnDisplay": "Read 120 lines"}
    assert hook("gemini-cli", gemini("BeforeAgent", prompt="why does login fail?"), store).out == {}
    for call in range(1, STOP_AT + 1):
        expected = mirror.pre("read_file", read, None, "gem-1")
        reply = hook(
            "gemini-cli", gemini("BeforeTool", tool_name="read_file", tool_input=read), store
        )
        assert reply.code == 0
        if call < DENY_AT:
            assert reply.out == {}
            mirror.post("read_file", read, None, "gem-1", response["llmContent"])
            after = hook(
                "gemini-cli",
                gemini("AfterTool", tool_name="read_file", tool_input=read, tool_response=response),
                store,
            )
            assert after.out == (
                context("AfterTool", expected.message) if call == REMIND_AT else {}
            )
        elif call < STOP_AT:
            assert reply.out == {"decision": "deny", "reason": expected.message}
        else:
            assert expected.action is Action.STOP
            assert reply.out == {
                "decision": "deny",
                "reason": expected.message,
                "continue": False,
                "stopReason": expected.message,
            }
    assert hook("gemini-cli", gemini("BeforeAgent", prompt="go on"), store).out == {}
    assert (
        hook("gemini-cli", gemini("BeforeTool", tool_name="read_file", tool_input=read), store).out
        == {}
    )


@pytest.mark.slow
def test_gemini_cli_tool_errors_are_outcomes(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    mirror = Mirror()
    shell = {"command": "npm test", "description": "run tests"}
    failed = {"llmContent": "", "returnDisplay": "", "error": {"message": "exit code 1"}}
    for call in range(1, DENY_AT + 1):
        expected = mirror.pre("run_shell_command", shell, None, "gem-1")
        reply = hook(
            "gemini-cli",
            gemini("BeforeTool", tool_name="run_shell_command", tool_input=shell),
            store,
        )
        if call == DENY_AT:  # the same error came back each time: the run was stopped
            assert expected.action is Action.STOP
            assert reply.out["decision"] == "deny" and reply.out["continue"] is False
            break
        assert reply.out == {}
        post = mirror.post("run_shell_command", shell, None, "gem-1", failed["error"], error=True)
        after = hook(
            "gemini-cli",
            gemini(
                "AfterTool", tool_name="run_shell_command", tool_input=shell, tool_response=failed
            ),
            store,
        )
        if call == PRESETS["default"].failure_stop_threshold:
            # The third identical failure: stopped after the call ran, before the next turn.
            assert post is not None and post.action is Action.STOP
            assert after.out.get("continue") is False


# -- Codex --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_codex_remind_before_the_call_deny_and_stop_within_the_strict_schema(
    tmp_path: Path,
) -> None:
    store = tmp_path / "hooks.sqlite3"
    mirror = Mirror()
    shell = {"command": "cargo test -p api"}
    replies: list[Reply] = [
        hook("codex", codex("UserPromptSubmit", prompt="make tests pass"), store)
    ]
    assert replies[-1].out == {}
    for call in range(1, STOP_AT + 1):
        call_id = f"call_{call}"
        expected = mirror.pre("Bash", shell, call_id, "019a-codex")
        reply = hook(
            "codex",
            codex("PreToolUse", tool_name="Bash", tool_input=shell, tool_use_id=call_id),
            store,
        )
        replies.append(reply)
        if call < DENY_AT:
            # Codex takes context before a call: the reminder goes out at once.
            assert reply.out == (
                {} if call != REMIND_AT else context("PreToolUse", expected.message)
            )
            mirror.post("Bash", shell, call_id, "019a-codex", "test result: FAILED", error=None)
            after = hook(
                "codex",
                codex(
                    "PostToolUse",
                    tool_name="Bash",
                    tool_input=shell,
                    tool_use_id=call_id,
                    tool_response="test result: FAILED",
                ),
                store,
            )
            replies.append(after)
            assert after.out == {}
        else:
            # Deny, and stop as a denial: Codex refuses continue/stopReason on PreToolUse.
            assert expected.action is (Action.DENY if call < STOP_AT else Action.STOP)
            assert reply.out == deny_claude("PreToolUse", expected.message)
    for reply in replies:
        assert reply.code == 0
        assert set(reply.out) <= CODEX_TOP_FIELDS
        assert set(reply.out.get("hookSpecificOutput", {})) <= CODEX_SPECIFIC_FIELDS
        if reply.out:
            assert reply.out["hookSpecificOutput"]["hookEventName"] in ("PreToolUse", "PostToolUse")


def test_hosts_on_the_command_line_are_the_hosts_of_the_package() -> None:
    from otel_loopguard._cli_hook import HOOK_HOSTS

    assert tuple(HOSTS) == HOOK_HOSTS == ("claude-code", "gemini-cli", "codex")


# -- texts are capped -------------------------------------------------------------------------


@pytest.mark.slow
def test_texts_are_cut_to_the_hosts_limit(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    env = clean_env(LOOPGUARD_PRESET="brake", LOOPGUARD_ARGUMENTS_PREVIEW_CHARS="50000")
    huge = {"command": "echo " + "x" * 30_000}
    assert PRESETS["brake"].deny_threshold is not None
    for call in range(1, PRESETS["brake"].deny_threshold + 1):
        reply = hook("claude-code", claude_pre("Bash", huge, f"t{call}"), store, env=env)
        hook("claude-code", claude_post("Bash", huge, f"t{call}", "x"), store, env=env)
    reason = reply.out["hookSpecificOutput"]["permissionDecisionReason"]
    assert len(reason) == MAX_TEXT_CHARS and reason.endswith("… (cut)")
    assert reason.startswith("[loopguard] Not run: `Bash`")


# -- failure modes ------------------------------------------------------------------------------


PRE_EVENT_NAMES = {"claude-code": "PreToolUse", "gemini-cli": "BeforeTool", "codex": "PreToolUse"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"hook_event_name": 3}',
        b'{"hook_event_name": "PRE", "tool_name": "Bash"}',
        b'{"hook_event_name": "PRE", "session_id": "s"}',
        b'{"hook_event_name": "PRE", "session_id": 7, "tool_name": "x"}',
    ],
)
def test_malformed_stdin_allows_with_a_note(tmp_path: Path, raw: bytes) -> None:
    for host in HOSTS:
        data = raw.replace(b'"PRE"', json.dumps(PRE_EVENT_NAMES[host]).encode())
        reply = hook(host, None, tmp_path / "hooks.sqlite3", raw=data)
        assert reply.code == 0 and reply.out == {}
        assert f"otel-loopguard hook {host}: stdin is not a {host} hook event" in reply.err
        # Even --fail-closed allows: there is no call to deny.
        assert hook(host, None, tmp_path / "s", "--fail-closed", raw=data).out == {}


PRE_EVENTS: dict[str, dict[str, Any]] = {
    "claude-code": claude_pre("Bash", BASH_TESTS, "toolu_1"),
    "gemini-cli": gemini("BeforeTool", tool_name="read_file", tool_input={"absolute_path": "a"}),
    "codex": codex(
        "PreToolUse", tool_name="Bash", tool_input={"command": "ls"}, tool_use_id="call_1"
    ),
}


def fail_closed_denial(host: str, reason_part: str, out: dict[str, Any]) -> str:
    """The denial text in ``out`` after checking its shape for ``host``."""
    if host == "gemini-cli":
        assert set(out) == {"decision", "reason"} and out["decision"] == "deny"
        text: str = out["reason"]
    else:
        assert set(out) == {"hookSpecificOutput"}
        specific = out["hookSpecificOutput"]
        assert specific["hookEventName"] == "PreToolUse"
        assert specific["permissionDecision"] == "deny"
        text = specific["permissionDecisionReason"]
    prefix = FAIL_CLOSED_TEXT.split("{reason}")[0]
    assert text.startswith(prefix) and reason_part in text
    return text


@pytest.mark.slow
@pytest.mark.parametrize("host", list(HOSTS))
def test_a_corrupt_store_is_moved_aside_and_rebuilt(tmp_path: Path, host: str) -> None:
    store = tmp_path / "hooks.sqlite3"
    garbage = b"this is not a database, just bytes\x00\xff" * 200
    store.write_bytes(garbage)
    reply = hook(host, PRE_EVENTS[host], store, "--fail-closed")
    assert reply.code == 0 and "denying" not in reply.err and "fail-open" not in reply.err
    lines = [line for line in reply.err.splitlines() if "moved it to" in line]
    assert len(lines) == 1 and "file is not a database" in lines[0]
    (aside,) = tmp_path.glob("hooks.sqlite3.corrupt-*")
    assert aside.read_bytes() == garbage  # kept for a post-mortem, never overwritten
    again = hook(host, PRE_EVENTS[host], store, "--fail-closed")
    assert again.code == 0 and again.out == reply.out and "moved it to" not in again.err


def test_a_store_still_corrupt_after_the_rebuild_is_an_error(tmp_path: Path) -> None:
    from otel_loopguard.hooks._store import HookStore, StoreError

    path = tmp_path / "hooks.sqlite3"
    path.write_bytes(b"garbage" * 100)
    store = HookStore(path)
    with store.session("s", now=1.0, ttl_seconds=60, max_sessions=10) as row:
        assert row.state is None
        row.save = b"state"
    with store.session("s", now=2.0, ttl_seconds=60, max_sessions=10) as row:
        assert row.state == b"state"
    original = store._connect

    def always_corrupt() -> Any:
        path.write_bytes(b"garbage" * 100)
        return original()

    store._connect = always_corrupt  # type: ignore[method-assign]
    with (
        pytest.raises(StoreError, match="not a database"),
        store.session("s", now=3.0, ttl_seconds=60, max_sessions=10),
    ):
        pass
    assert len(list(tmp_path.glob("hooks.sqlite3.corrupt-*"))) == 2


@pytest.mark.slow
def test_an_unwritable_store_path_fails_open_or_closed(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the store's directory should be")
    store = blocker / "hooks.sqlite3"
    reply = hook("claude-code", PRE_EVENTS["claude-code"], store)
    assert reply.code == 0 and reply.out == {}
    assert str(store) in reply.err and "fail-open" in reply.err
    closed = hook("claude-code", PRE_EVENTS["claude-code"], store, "--fail-closed")
    fail_closed_denial("claude-code", "state file", closed.out)
    # After a call, or at a prompt, there is nothing to deny: fail-closed answers empty too.
    post = claude_post("Bash", BASH_TESTS, "toolu_1", BASH_RESULT)
    assert hook("claude-code", post, store, "--fail-closed").out == {}


@pytest.mark.slow
def test_a_bad_policy_or_command_line_still_answers_json(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    event = PRE_EVENTS["claude-code"]
    missing = hook("claude-code", event, store, "--config", str(tmp_path / "missing.toml"))
    assert missing.code == 0 and "missing.toml" in missing.err
    # Allowed, and the user is told (stderr reaches the user only when a hook fails).
    assert set(missing.out) == {"systemMessage"} and "missing.toml" in missing.out["systemMessage"]
    fail_closed_denial(
        "claude-code",
        "missing.toml",
        hook(
            "claude-code", event, store, "--config", str(tmp_path / "missing.toml"), "--fail-closed"
        ).out,
    )
    bogus = hook("claude-code", event, store, "--bogus")
    assert bogus.code == 0 and "unrecognized arguments: --bogus" in bogus.err
    assert set(bogus.out) == {"systemMessage"} and "bad command line" in bogus.out["systemMessage"]
    fail_closed_denial(
        "claude-code",
        "bad command line",
        hook("claude-code", event, store, "--bogus", "--fail-closed").out,
    )
    unknown = hook("claude-codex", event, store)
    assert unknown.code == 0 and unknown.out == {} and "invalid choice" in unknown.err


# -- concurrency --------------------------------------------------------------------------------


@pytest.mark.slow
def test_concurrent_invocations_on_one_store_lose_no_count(tmp_path: Path) -> None:
    """8 processes at a time on one fresh store, all on one session: every attempt counted
    once, every post matched to its pre."""
    store = tmp_path / "hooks.sqlite3"
    workers, calls = 8, 3
    env = clean_env(LOOPGUARD_MODE="observe")  # nothing blocks, everything is counted
    read = {"file_path": "/work/project/README.md"}

    def worker(index: int) -> list[Reply]:
        replies = []
        for call in range(calls):
            call_id = f"toolu_{index}_{call}"
            replies.append(hook("claude-code", claude_pre("Read", read, call_id), store, env=env))
            replies.append(
                hook("claude-code", claude_post("Read", read, call_id, "# Title"), store, env=env)
            )
        return replies

    with ThreadPoolExecutor(workers) as pool:
        replies = [r for batch in pool.map(worker, range(workers)) for r in batch]
    assert len(replies) == 2 * workers * calls
    assert all(r == Reply(0, {}, "") for r in replies), [r for r in replies if r.err][:1]
    with sqlite3.connect(store) as connection:
        rows = connection.execute("SELECT key, state FROM sessions").fetchall()
    assert [json.loads(key) for key, _ in rows] == [["claude-code", "sess-1", None]]
    state = SessionState.from_bytes(rows[0][1], DEFAULT)
    (signature,) = state.signatures.values()
    assert signature.count == workers * calls
    assert state.redundant == workers * calls - 1
    assert state.pending is None  # each PostToolUse found its PreToolUse
    assert signature.same_outcomes == workers * calls


# -- the trip log, from hook processes ----------------------------------------------------------


@pytest.mark.slow
def test_hook_decisions_are_written_to_the_trip_log(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    trips = tmp_path / "trips.jsonl"
    config = tmp_path / "loopguard.toml"
    config.write_text(f'preset = "brake"\ntrip_log_path = "{trips}"\n')
    brake = PRESETS["brake"]
    assert brake.deny_threshold is not None
    for call in range(1, brake.deny_threshold + 1):
        reply = hook(
            "claude-code",
            claude_pre("Grep", {"pattern": "TODO"}, f"t{call}", agent_id="agent-3"),
            store,
            "--config",
            str(config),
        )
        if call < brake.deny_threshold:
            assert reply.out == {}
            hook(
                "claude-code",
                claude_post("Grep", {"pattern": "TODO"}, f"t{call}", "none", agent_id="agent-3"),
                store,
                "--config",
                str(config),
            )
    assert reply.out["hookSpecificOutput"]["permissionDecision"] == "deny"
    lines = [json.loads(line) for line in trips.read_text().splitlines()]
    assert len(lines) == 1
    line = lines[0]
    assert {
        k: line[k]
        for k in ("session", "agent", "tool", "rule", "action", "mode", "count", "threshold")
    } == {
        "session": "sess-1",
        "agent": "agent-3",
        "tool": "Grep",
        "rule": "consecutive",
        "action": "deny",
        "mode": "enforce",
        "count": brake.deny_threshold,
        "threshold": brake.deny_threshold,
    }
    assert len(line["signature"]) == 12 and "arguments" not in line
    # The same through the environment, with arguments.
    env = clean_env(
        LOOPGUARD_PRESET="brake",
        LOOPGUARD_TRIP_LOG_PATH=str(tmp_path / "e.jsonl"),
        LOOPGUARD_TRIP_LOG_ARGUMENTS="true",
    )
    for _call in range(1, brake.deny_threshold + 1):
        hook(
            "gemini-cli",
            gemini("BeforeTool", tool_name="glob", tool_input={"pattern": "*.py"}),
            store,
            env=env,
        )
    (line,) = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert line["session"] == "gem-1" and line["action"] == "deny"
    assert line["arguments"] == '{"pattern":"*.py"}'


# -- the hot path stays light -------------------------------------------------------------------


def test_the_hook_path_imports_no_sdk_and_no_prometheus(tmp_path: Path) -> None:
    code = (
        "import io, sys\n"
        "import otel_loopguard.hooks\n"
        "from otel_loopguard.cli import main\n"
        "sys.stdin = io.TextIOWrapper(io.BytesIO(sys.argv[2].encode()))\n"
        "main(['hook', 'claude-code', '--store', sys.argv[1]])\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk',"
        " 'prometheus_client')))\n"
        "print(heavy, file=sys.stderr)\n"
    )
    event = json.dumps(claude_pre("Bash", BASH_TESTS, "toolu_1"))
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "s.sqlite3"), event],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {}
    assert proc.stderr.strip() == "[]"


# -- where the store lives ----------------------------------------------------------------------


def test_default_store_path_follows_env_then_xdg_then_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_store_path({}) == tmp_path / ".local/state/otel-loopguard/hooks.sqlite3"
    assert default_store_path({"XDG_STATE_HOME": "/srv/state"}) == Path(
        "/srv/state/otel-loopguard/hooks.sqlite3"
    )
    assert default_store_path({"XDG_STATE_HOME": "relative"}) == (
        tmp_path / ".local/state/otel-loopguard/hooks.sqlite3"
    )  # the XDG spec ignores it
    assert default_store_path({STORE_ENV: "/x/y.db", "XDG_STATE_HOME": "/srv"}) == Path("/x/y.db")


def test_the_default_store_is_used_and_private(tmp_path: Path) -> None:
    env = clean_env(XDG_STATE_HOME=str(tmp_path / "state"))
    reply = hook("claude-code", PRE_EVENTS["claude-code"], None, env=env)
    assert reply == Reply(0, {}, "")
    store = tmp_path / "state" / "otel-loopguard" / "hooks.sqlite3"
    assert store.is_file() and (store.stat().st_mode & 0o777) == 0o600
    assert (store.parent.stat().st_mode & 0o777) == 0o700
    with sqlite3.connect(store) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute("SELECT count(*) FROM sessions").fetchone()[0] == 1


@pytest.mark.slow
def test_sessions_idle_beyond_the_ttl_are_dropped_when_a_new_one_arrives(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    hook("claude-code", claude_pre("Bash", BASH_TESTS, "t1", session="old"), store)
    with sqlite3.connect(store) as connection:
        connection.execute(
            "UPDATE sessions SET updated = updated - ?", (DEFAULT.session_ttl_seconds + 1,)
        )
    hook("claude-code", claude_pre("Bash", BASH_TESTS, "t1", session="new"), store)
    with sqlite3.connect(store) as connection:
        keys = [json.loads(k)[1] for (k,) in connection.execute("SELECT key FROM sessions")]
    assert keys == ["new"]


@pytest.mark.slow
def test_an_unreadable_session_row_starts_that_session_afresh(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    event = claude_pre("Bash", BASH_TESTS, "t1")
    hook("claude-code", event, store)
    with sqlite3.connect(store) as connection:
        connection.execute("UPDATE sessions SET state = ?", (b'{"v": 999}',))
    reply = hook("claude-code", claude_pre("Bash", BASH_TESTS, "t2"), store)
    assert reply.code == 0 and reply.out == {}
    assert "session 'sess-1': session state: unknown version 999; starting it afresh" in reply.err
    with sqlite3.connect(store) as connection:
        (state,) = connection.execute("SELECT state FROM sessions").fetchone()
    (signature,) = SessionState.from_bytes(state, DEFAULT).signatures.values()
    assert signature.count == 1  # counted afresh, and saved readable again


# -- the settings snippets of docs/coding-agents.md ---------------------------------------------


def test_readme_settings_install_every_event_each_host_adapter_acts_on() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "coding-agents.md").read_text()
    snippets = [json.loads(text) for text in re.findall(r"```json\n(.+?)\n```", page, re.S)]
    assert len(snippets) == len(HOSTS)
    for host, snippet in zip(HOSTS.values(), snippets):
        assert set(snippet) == {"hooks"}
        assert set(snippet["hooks"]) == set(host.events), host.name
        for name, groups in snippet["hooks"].items():
            (group,) = groups
            (handler,) = group["hooks"]
            assert handler["type"] == "command"
            assert handler["command"] == f"otel-loopguard hook {host.name}"
            tool_event = host.events[name] in (EventKind.PRE_TOOL, EventKind.POST_TOOL)
            assert group.get("matcher") == ("*" if tool_event else None), (host.name, name)


# -- rescue: advice bought once, kept across hook processes ---------------------------------------


@pytest.mark.slow
def test_rescue_advice_is_asked_once_and_reused_by_later_processes(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    asked = tmp_path / "asked.txt"
    advisor = tmp_path / "advisor.sh"
    advisor.write_text(
        f"#!/bin/sh\ncat > /dev/null\necho asked >> {asked}\n"
        "echo 'Read the compiler error; the header is missing.'\n"
    )
    advisor.chmod(0o755)
    config = tmp_path / "loopguard.toml"
    config.write_text(f'advisor_command = "{advisor}"\nstop_after_denials = false\n')
    assert DEFAULT.rescue_threshold is not None
    rescues = 3
    reasons = []
    for call in range(1, DEFAULT.rescue_threshold + rescues):  # no results: outcome unknown
        reply = hook(
            "claude-code",
            claude_pre("Bash", {"command": "make"}, f"t{call}"),
            store,
            "--config",
            str(config),
        )
        assert reply.code == 0
        if call >= DEFAULT.rescue_threshold:
            reasons.append(reply.out["hookSpecificOutput"]["permissionDecisionReason"])
    assert len(reasons) == rescues
    for reason in reasons:
        assert reason.endswith(
            "Advice from a reviewer model:\nRead the compiler error; the header is missing."
        )
    assert asked.read_text() == "asked\n"  # the later rescues used the advice saved in the store
