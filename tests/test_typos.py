"""No silent typos: a misspelt ``LOOPGUARD_*`` variable warns, a misspelt TOML, policy or plugin
key is refused, each with the closest known names; a command hook whose configuration cannot be
used tells the user in the host's user-visible channel (stderr reaches nobody).

The hooks are driven as the hosts run them: ``python -m otel_loopguard hook HOST`` in a process
of its own, the event on stdin, the answer on stdout.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard import _env as env
from otel_loopguard._plugins import load_plugin_config, read_plugin_config
from otel_loopguard.config import (
    KNOWN_VARIABLES,
    PRESETS,
    Policy,
    close_names,
    env_var,
    load_policy,
    policy_from_env,
    policy_from_mapping,
    unknown_variables,
    validate_field,
)
from otel_loopguard.hooks import HOSTS
from otel_loopguard.hooks._runner import FAIL_CLOSED_TEXT, NOTICE_PREFIX

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\bLOOPGUARD_[A-Z0-9_]*[A-Z0-9]\b")

# -- every name is declared -------------------------------------------------------------------


def _sources() -> list[Path]:
    """Where a LOOPGUARD_* name is read or set: the package, the CI scripts, the Collector
    configs, the examples, the docs, the benchmarks and the tests' shared infrastructure (test
    cases, this file among them, spell names wrong on purpose)."""
    files = [*sorted((ROOT / "otel_loopguard").rglob("*.py")), ROOT / "README.md"]
    for folder in (".ci", "collector", "examples", "docs", "benchmarks"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file())
    files += sorted((ROOT / "tests").rglob("conftest.py"))
    files += sorted((ROOT / "tests").glob("*_tools.py"))
    return [
        p for p in files if p.suffix not in (".pyc", ".png", ".sqlite3") and "venv" not in p.parts
    ]


def test_every_loopguard_name_in_the_sources_is_declared() -> None:
    found: dict[str, str] = {}
    for path in _sources():
        text = path.read_text(encoding="utf-8", errors="replace")
        for name in NAME.findall(text):
            found.setdefault(name, str(path.relative_to(ROOT)))
    assert "LOOPGUARD_SERVE_TOKEN" in found and "LOOPGUARD_FRAMEWORK_TESTS" in found
    undeclared = {name: where for name, where in found.items() if name not in KNOWN_VARIABLES}
    assert not undeclared, f"declare these in otel_loopguard/_env.py: {undeclared}"


def test_the_known_names_come_from_the_declarations() -> None:
    fields = {env_var(f) for f in Policy.__dataclass_fields__}
    assert fields | env.DECLARED == KNOWN_VARIABLES
    for name in env.DECLARED:
        assert getattr(env, name) == name and name in env.__all__
    assert {"LOOPGUARD_PRESET", "LOOPGUARD_HOOK_STORE", "LOOPGUARD_SERVE_TOKEN"} <= env.DECLARED
    assert "LOOPGUARD_ADVISOR_MODEL" in KNOWN_VARIABLES  # a field; also handed to an advisor
    assert unknown_variables({name: "" for name in KNOWN_VARIABLES}) == {}


# -- environment -------------------------------------------------------------------------------


def test_an_unknown_variable_names_the_closest_one() -> None:
    found = unknown_variables({"LOOPGUARD_DENY_TRESHOLD": "2", "PATH": "/bin"})
    assert found == {
        "LOOPGUARD_DENY_TRESHOLD": (
            "LOOPGUARD_DENY_TRESHOLD ignored: no such variable"
            " (did you mean LOOPGUARD_DENY_THRESHOLD?)"
        )
    }
    # The shared prefix does not make every name close; nothing close: no guess.
    assert unknown_variables({"LOOPGUARD_FOO": "1"}) == {
        "LOOPGUARD_FOO": "LOOPGUARD_FOO ignored: no such variable"
    }
    assert (
        "did you mean LOOPGUARD_MODE?"
        in unknown_variables({"LOOPGUARD_mode": "x"})["LOOPGUARD_mode"]
    )


def test_an_unknown_variable_never_shows_its_value() -> None:
    (warning,) = unknown_variables({"LOOPGUARD_SERVE_TOKN": "s3cret-value"}).values()
    assert "s3cret" not in warning and "did you mean LOOPGUARD_SERVE_TOKEN?" in warning


def test_an_unknown_variable_warns_like_a_bad_value(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"LOOPGUARD_STALL_THRESHHOLD": "3", "LOOPGUARD_DENY_THRESHOLD": "nine"}
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        policy = policy_from_env(environ=environ)
        policy_from_env(environ=environ)
    assert policy == PRESETS["default"]  # the typo changed nothing
    typo = [r for r in caplog.records if "LOOPGUARD_STALL_THRESHHOLD" in r.getMessage()]
    assert len(typo) == 1  # once per name per process; a bad value warns each time, as before
    assert typo[0].name == "otel_loopguard" and typo[0].levelno == logging.WARNING
    assert "did you mean LOOPGUARD_STALL_THRESHOLD?" in typo[0].getMessage()
    assert sum("'nine'" in r.getMessage() for r in caplog.records) == 2


def test_an_unknown_variable_warns_once_per_process() -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}
    environ["LOOPGUARD_DENY_TRESHOLD"] = "2"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from otel_loopguard import LoopGuard\n"
            "print(LoopGuard().policy.deny_threshold, LoopGuard().policy.deny_threshold)",
        ],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    default = PRESETS["default"].deny_threshold
    assert done.stdout == f"{default} {default}\n"
    assert done.stderr == (
        "LOOPGUARD_DENY_TRESHOLD ignored: no such variable"
        " (did you mean LOOPGUARD_DENY_THRESHOLD?)\n"
    )


def test_close_names_keeps_only_the_near_ones() -> None:
    fields = list(Policy.__dataclass_fields__)
    assert close_names("deny_treshold", fields) == ["deny_threshold"]
    assert close_names("remind_threshold", fields) == ["remind_thresholds"]
    assert close_names("colour", fields) == []


# -- TOML, mappings, plugin configs ------------------------------------------------------------


def test_a_toml_typo_names_the_file_the_key_and_the_closest_field(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text("deny_treshold = 2\n")
    with pytest.raises(ValueError) as caught:
        load_policy(config_path=path, environ={})
    assert str(caught.value) == (
        f"config file {str(path)!r}: unknown policy field: deny_treshold"
        " (did you mean deny_threshold?)"
    )
    path.write_text('[loopguard]\npreest = "brake"\nwindw = 3\ncolour = 1\n')
    with pytest.raises(ValueError) as caught:
        load_policy(config_path=path, environ={})
    assert str(caught.value) == (
        f"config file {str(path)!r}: unknown policy fields: colour,"
        " preest (did you mean preset?), windw (did you mean window_size?)"
    )


def test_mapping_and_replace_typos_name_the_closest_field() -> None:
    with pytest.raises(ValueError, match=r"^unknown policy field: no_progres_threshold \(did you"):
        policy_from_mapping({"no_progres_threshold": 3})
    with pytest.raises(ValueError, match=r"\(did you mean stop_after_denials\?\)$"):
        Policy().replace(stop_after_denial=2)
    with pytest.raises(ValueError, match=r"^unknown policy field: mdoe \(did you mean mode\?\)$"):
        validate_field("mdoe", "observe")
    with pytest.raises(TypeError):  # Python's own error for a keyword typo is left alone
        Policy(deny_treshold=2)  # type: ignore[call-arg]


def test_a_plugin_key_typo_names_the_closest_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as caught:
        read_plugin_config("loop-rescue", {"nudgeat": 3, "zzz": 1})
    assert str(caught.value).startswith(
        "loop-rescue config: unknown keys 'nudgeat' (did you mean 'nudgeAt'?), 'zzz'; known: window,"
    )
    path = tmp_path / "brake.json"
    path.write_text(json.dumps({"id": "loop-brake", "config": {"maxrepeats": 2}}))
    with pytest.raises(ValueError) as caught:
        load_plugin_config(path, environ={})
    assert str(caught.value).startswith(
        f"plugin config file {str(path)!r}: loop-brake config: unknown key 'maxrepeats'"
        " (did you mean 'maxRepeats'?)"
    )


# -- command hooks -----------------------------------------------------------------------------

PRE: dict[str, dict[str, Any]] = {
    "claude-code": {
        "hook_event_name": "PreToolUse",
        "session_id": "s1",
        "tool_name": "Bash",
        "tool_input": {"command": "ls"},
        "tool_use_id": "toolu_1",
    },
    "gemini-cli": {
        "hook_event_name": "BeforeTool",
        "session_id": "s1",
        "tool_name": "read_file",
        "tool_input": {"absolute_path": "a"},
    },
    "codex": {
        "hook_event_name": "PreToolUse",
        "session_id": "s1",
        "tool_name": "Bash",
        "tool_input": {"command": "ls"},
        "tool_use_id": "call_1",
    },
}
PROMPT = {
    "claude-code": "UserPromptSubmit",
    "gemini-cli": "BeforeAgent",
    "codex": "UserPromptSubmit",
}
POST = {"claude-code": "PostToolUse", "gemini-cli": "AfterTool", "codex": "PostToolUse"}
#: Codex refuses an answer with any other top-level field (its strict output schema).
CODEX_TOP_FIELDS = {"hookSpecificOutput", "continue", "stopReason", "systemMessage"}


def hook(host: str, event: dict[str, Any], *args: str, **variables: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}
    environ.update(variables)
    done = subprocess.run(
        [sys.executable, "-m", "otel_loopguard", "hook", host, *args],
        input=json.dumps(event).encode(),
        capture_output=True,
        env=environ,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.count(b"\n") == 1, done
    out = json.loads(done.stdout)
    assert isinstance(out, dict)
    if host == "codex":
        assert set(out) <= CODEX_TOP_FIELDS
    return out


def notice(host: str, out: dict[str, Any]) -> str:
    field = HOSTS[host].notice_field
    assert field == "systemMessage"
    text = out[field]
    assert isinstance(text, str) and text.startswith(NOTICE_PREFIX) and "\n" not in text
    return text


@pytest.mark.slow
@pytest.mark.parametrize("host", list(HOSTS))
def test_a_hook_with_a_typo_in_its_config_tells_the_user(tmp_path: Path, host: str) -> None:
    config = tmp_path / "typo.toml"
    config.write_text("deny_treshold = 2\n")
    store = str(tmp_path / "hooks.sqlite3")
    out = hook(host, PRE[host], "--store", store, "--config", str(config))
    # Allowed (fail-open), and the user reads why the guard is off: the file, the key, the fix.
    assert set(out) == {"systemMessage"}
    text = notice(host, out)
    assert str(config) in text and "deny_treshold" in text
    assert "did you mean deny_threshold?" in text and "not checking tool calls" in text
    # A prompt says it too; after a call nothing more (its pre-tool event said it).
    prompt = {"hook_event_name": PROMPT[host], "session_id": "s1", "prompt": "go"}
    assert notice(host, hook(host, prompt, "--store", store, "--config", str(config))) == text
    post = {**PRE[host], "hook_event_name": POST[host], "tool_response": "ok"}
    assert hook(host, post, "--store", store, "--config", str(config)) == {}


@pytest.mark.parametrize("host", list(HOSTS))
def test_a_hook_with_a_typo_in_its_config_denies_with_fail_closed(
    tmp_path: Path, host: str
) -> None:
    config = tmp_path / "typo.toml"
    config.write_text("[loopguard]\nmdoe = 'observe'\n")
    out = hook(
        host, PRE[host], "--store", str(tmp_path / "s"), "--config", str(config), "--fail-closed"
    )
    if host == "gemini-cli":
        assert set(out) == {"decision", "reason"} and out["decision"] == "deny"
        reason = out["reason"]
    else:
        assert set(out) == {"hookSpecificOutput"}
        assert out["hookSpecificOutput"]["permissionDecision"] == "deny"
        reason = out["hookSpecificOutput"]["permissionDecisionReason"]
    assert reason.startswith(FAIL_CLOSED_TEXT.split("{reason}")[0])
    assert str(config) in reason and "mdoe (did you mean mode?)" in reason


def test_a_hook_with_an_unusable_server_setting_tells_the_user(tmp_path: Path) -> None:
    missing = tmp_path / "token"
    out = hook(
        "claude-code",
        PRE["claude-code"],
        "--server",
        "http://127.0.0.1:9",
        "--token-file",
        str(missing),
    )
    text = notice("claude-code", out)
    assert set(out) == {"systemMessage"} and "--token-file" in text and str(missing) in text


def test_a_hook_whose_store_fails_still_answers_as_before(tmp_path: Path) -> None:
    """Not a configuration mistake (the store, the server): stderr only, as before."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert hook("claude-code", PRE["claude-code"], "--store", str(blocker / "s")) == {}


@pytest.mark.slow
@pytest.mark.parametrize("host", list(HOSTS))
def test_an_unknown_variable_reaches_the_user_through_the_hook(tmp_path: Path, host: str) -> None:
    store = str(tmp_path / "hooks.sqlite3")
    out = hook(host, PRE[host], "--store", store, LOOPGUARD_DENY_TRESHOLD="2")
    assert set(out) == {"systemMessage"}  # the call itself is allowed as usual
    assert notice(host, out) == (
        f"{NOTICE_PREFIX}LOOPGUARD_DENY_TRESHOLD ignored: no such variable"
        " (did you mean LOOPGUARD_DENY_THRESHOLD?)"
    )
    # Every pre-tool event says it (each hook call is a process of its own); without the
    # variable, nothing is said.
    assert hook(host, PRE[host], "--store", store, LOOPGUARD_DENY_TRESHOLD="2") == out
    assert "systemMessage" not in hook(host, PRE[host], "--store", store)


def test_a_toml_table_typo_or_a_field_beside_the_table_is_named(tmp_path: Path) -> None:
    path = tmp_path / "loopguard.toml"
    path.write_text('[loopgaurd]\nmode = "advise"\n')
    with pytest.raises(ValueError) as caught:
        load_policy(config_path=path, environ={})
    assert str(caught.value) == (
        f"config file {str(path)!r}: unknown table: loopgaurd (did you mean loopguard?);"
        " policy fields go at the top level or in [loopguard]"
    )
    # Beside a [loopguard] table, a top-level field was ignored without a word.
    path.write_text('deny_threshold = 3\n[loopguard]\nmode = "advise"\n')
    with pytest.raises(ValueError) as caught:
        load_policy(config_path=path, environ={})
    assert str(caught.value) == (
        f"config file {str(path)!r}: deny_threshold outside the [loopguard] table would be"
        " ignored; put it in the table"
    )
    # Other tools' tables beside [loopguard] are theirs.
    path.write_text('[tool.other]\nx = 1\n[loopguard]\nmode = "advise"\n')
    assert load_policy(config_path=path, environ={}).mode.value == "advise"


def test_a_hook_command_line_typo_tells_the_user_what_argparse_said_but_no_value() -> None:
    out = hook("claude-code", PRE["claude-code"], "--tokn", "s3cret-token", "--fail-open")
    text = notice("claude-code", out)
    assert "bad command line (unrecognized arguments: --tokn --fail-open" in text
    assert "(did you mean --token?)" in text
    assert "s3cret-token" not in text  # a word that is not an option may be a secret
    bad = hook("claude-code", PRE["claude-code"], "--timeout", "soon")
    assert "bad command line (argument --timeout: expected a number" in notice("claude-code", bad)
    assert "soon" not in notice("claude-code", bad)
