"""The three plugins this project replaces: each plugin's documented examples, run through its
preset and through its own configuration read by ``LoopGuard.from_plugin_config``, give the same
decisions, counts and texts' key facts (plugins.py, the presets in config.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard import PRESETS, Action, Decision, LoopDetected, LoopGuard, Mode, Policy, Rule
from otel_loopguard._plugins import (
    DSH_LOOP_BRAKE_MAX_REPEATS,
    RESCUE_PLUGIN_DEFAULTS,
    load_plugin_config,
    read_plugin_config,
)
from otel_loopguard.config import load_policy, policy_from_env

from .conftest import Call, FakeClock, Transcript, run

# The configuration blocks of the plugins' READMEs, as given (the rescue plugin's text lost the
# `*` of `mcp__claude__*`; see the issue).
REMINDER_DOC: dict[str, Any] = {
    "thresholds": [3, 5, 8],
    "include": [],
    "exclude": ["todo_write"],
    "argumentsPreviewChars": 500,
}
BRAKE_DOC: dict[str, Any] = {"maxRepeats": 5}
RESCUE_DOC: dict[str, Any] = {
    "window": 12,
    "nudgeAt": 3,
    "rescueAt": 5,
    "stallAt": 40,
    "maxRescues": 3,
    "cooldownMs": 45000,
    "include": [],
    "exclude": ["todo_write", "ask_user", "mcp__claude__*"],
    "excludeCommands": [],
    "ignoredArgs": ["description", "explanation", "reasoning", "thought", "comment"],
    "mutatingTools": [
        "edit",
        "write",
        "multi_edit",
        "str_replace_editor",
        "apply_patch",
        "create_file",
        "notebook_edit",
    ],
    "askCommand": "~/.local/bin/ask-claude",
    "askModel": "opus",
    "askTimeoutMs": 90000,
    "logFile": "~/.llmbox/loop-rescue.jsonl",
}


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of its own: the rescue plugin's defaults live under ~ (no real ask-claude)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv(DSH_LOOP_BRAKE_MAX_REPEATS, raising=False)
    return home


def facts(transcript: Transcript) -> list[tuple[str, str | None, int, int]]:
    return [
        (d.action.value, d.rule.value if d.rule else None, d.count, d.threshold)
        for d in transcript.decisions
    ]


def both(
    plugin: str,
    config: dict[str, Any],
    calls: list[Call],
    **kwargs: Any,
) -> tuple[Transcript, Transcript]:
    """The calls through the preset, and through the plugin's config as is."""
    preset = run(LoopGuard(PRESETS[plugin], **kwargs), calls)
    migrated = run(LoopGuard.from_plugin_config(plugin, config, **kwargs), calls)
    assert facts(preset) == facts(migrated)
    assert [d.message for d in preset.decisions] == [d.message for d in migrated.decisions]
    return preset, migrated


def at(transcript: Transcript, action: Action) -> list[int]:
    return [n for n, d in enumerate(transcript.decisions, 1) if d.action is action]


# -- 1. include: [] tracks every tool -----------------------------------------------------------


def test_empty_include_tracks_every_tool_in_code_toml_environment_and_plugin_config(
    tmp_path: Path,
) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('preset = "brake"\ninclude = []\n')
    policies = [
        PRESETS["brake"].replace(include=[]),
        load_policy(config_path=toml, environ={}),
        policy_from_env(PRESETS["brake"], {"LOOPGUARD_INCLUDE": ""}),
        read_plugin_config("rescue", {"include": []}).policy(),
        read_plugin_config("reminder", {"include": []}).policy(),
    ]
    for policy in policies:
        assert policy.include == ("*",)
        guard = LoopGuard(policy.replace(mode=Mode.ENFORCE))
        decisions = run(guard, [Call("grep", {"q": "x"}, report=False)] * 6).decisions
        assert any(d.action is not Action.ALLOW for d in decisions), policy


# -- reminder ------------------------------------------------------------------------------------


def test_reminder_reminds_only_at_its_thresholds_gentle_then_detailed() -> None:
    calls = [Call("grep", {"pattern": "TODO", "path": "src"}, result="none")] * 12
    preset, _ = both("reminder", REMINDER_DOC, calls)
    assert at(preset, Action.REMIND) == [3, 5, 8]  # 9..12: nothing (only at the thresholds)
    assert not any(d.blocks for d in preset.decisions)
    gentle, detailed, last = (preset.decisions[n - 1] for n in (3, 5, 8))
    assert "Arguments:" not in gentle.message and "same arguments" in gentle.message
    for decision, count in ((detailed, 5), (last, 8)):
        assert "`grep`" in decision.message and f"{count} times in a row" in decision.message
        assert 'Arguments: {"path":"src","pattern":"TODO"}' in decision.message
        assert decision.count == count and decision.rule is Rule.CONSECUTIVE


def test_reminder_untracked_calls_are_transparent_and_another_call_resets() -> None:
    grep = Call("grep", {"pattern": "X"}, result="hit")
    todo = Call("todo_write", {"items": ["a"]}, result="ok")
    calls = [grep, todo, grep, todo, grep, Call("read", {"path": "y"}, result="y"), grep, grep]
    migrated = run(LoopGuard.from_plugin_config("reminder", REMINDER_DOC), calls)
    preset = run(LoopGuard(PRESETS["reminder"].replace(exclude=("todo_write",))), calls)
    assert facts(preset) == facts(migrated)
    # grep X -> todo_write -> grep X counts as two in a row when todo_write is excluded ...
    assert at(migrated, Action.REMIND) == [5]
    assert migrated.decisions[4].count == 3
    # ... and a different tracked call (read) starts the chain again at 1
    assert migrated.decisions[7].count == 2
    # the preset tracks todo_write (the plugin's default exclude is empty): it breaks the chain
    assert at(run(LoopGuard(PRESETS["reminder"]), calls), Action.REMIND) == []


def test_reminder_keyless_snapshot_five_identical_todo_writes() -> None:
    calls = [Call("todo_write", {"items": ["a", "b"]}, result="ok")] * 5
    preset, _ = both("reminder", {}, calls)
    assert at(preset, Action.REMIND) == [3, 5]
    assert "Arguments:" not in preset.decisions[2].message
    assert 'Arguments: {"items":["a","b"]}' in preset.decisions[4].message


def test_reminder_canonicalisation_ignores_property_order_deeply() -> None:
    a = {"a": 1, "nested": {"x": [1, 2], "y": None}}
    b = {"nested": {"y": None, "x": [1, 2]}, "a": 1}
    calls = [Call("search", a), Call("search", b), Call("search", a)]
    preset, _ = both("reminder", REMINDER_DOC, calls)
    assert at(preset, Action.REMIND) == [3]


def test_reminder_gentle_text_keys_to_the_first_threshold_not_the_literal_3() -> None:
    calls = [Call("read", {"path": "a"}, result="a")] * 5
    transcript = run(LoopGuard.from_plugin_config("reminder", {"thresholds": [4, 2]}), calls)
    assert at(transcript, Action.REMIND) == [2, 4]
    assert "Arguments:" not in transcript.decisions[1].message
    assert "Arguments:" in transcript.decisions[3].message


def test_reminder_preview_is_cut_for_the_model_never_for_detection() -> None:
    config = {"thresholds": [2, 3], "argumentsPreviewChars": 50}
    body = "z" * 400
    guard = LoopGuard.from_plugin_config("reminder", config)
    decisions = run(guard, [Call("write", {"body": body})] * 3).decisions
    detailed = decisions[2].message
    assert "… (+" in detailed and "more chars)" in detailed and body not in detailed
    assert len(detailed) < 1000
    # a call that differs only past the cap is another call: the chain starts again
    other = guard.before_tool("write", {"body": body[:-1] + "y"}, session="s")
    assert other.action is Action.ALLOW and other.count == 0


def test_reminder_wildcards_treat_regex_metacharacters_literally() -> None:
    guard = LoopGuard.from_plugin_config("reminder", {"exclude": ["pr.be"], "thresholds": [2]})
    assert run(guard, [Call("probe", {})] * 2).decisions[-1].action is Action.REMIND
    guard = LoopGuard.from_plugin_config("reminder", {"exclude": ["pr*"], "thresholds": [2]})
    assert run(guard, [Call("probe", {})] * 2).decisions[-1].action is Action.ALLOW


def test_reminder_a_user_message_resets_the_chain() -> None:
    guard = LoopGuard.from_plugin_config("reminder", REMINDER_DOC)
    run(guard, [Call("ls", {})] * 2)
    guard.user_message("s")
    assert [d.action for d in run(guard, [Call("ls", {})] * 2).decisions] == [Action.ALLOW] * 2


@pytest.mark.parametrize(
    ("config", "key", "value"),
    [
        ({"thresholds": []}, "thresholds", "[]"),
        ({"thresholds": [1, 3]}, "thresholds", "1"),
        ({"thresholds": [3, 3]}, "thresholds", "[3, 3]"),
        ({"thresholds": [2.5]}, "thresholds", "2.5"),
        ({"thresholds": ["3"]}, "thresholds", "'3'"),
        ({"thresholds": 3}, "thresholds", "3"),
        ({"argumentsPreviewChars": 0}, "argumentsPreviewChars", "0"),
        ({"argumentsPreviewChars": "500"}, "argumentsPreviewChars", "'500'"),
        ({"include": "bash"}, "include", "'bash'"),
        ({"exclude": [3]}, "exclude", "3"),
        ({"thresholdz": [3]}, "thresholdz", "thresholdz"),
    ],
)
def test_reminder_nonsense_fails_naming_the_plugins_key_and_value(
    config: dict[str, Any], key: str, value: str
) -> None:
    with pytest.raises(ValueError) as info:
        LoopGuard.from_plugin_config("reminder", config)
    assert "repeat-tool-reminder" in str(info.value)
    assert key in str(info.value) and value in str(info.value)


def test_reminder_thresholds_given_as_json_numbers_are_integers() -> None:
    policy = read_plugin_config("reminder", {"thresholds": [3.0, 5.0]}).policy()
    assert policy.remind_thresholds == (3, 5)


# -- brake ---------------------------------------------------------------------------------------


def test_brake_denies_the_fourth_consecutive_identical_call_and_every_one_after() -> None:
    calls = [Call("search", {"q": "weather"}, result="sunny")] * 6
    preset, migrated = both("brake", {}, calls)
    assert at(preset, Action.DENY) == [4, 5, 6]
    assert [d.count for d in preset.decisions[3:]] == [4, 5, 6]  # the denied attempts count
    assert not at(preset, Action.REMIND) and not at(preset, Action.STOP)


def test_brake_max_repeats_example_and_max_repeats_one() -> None:
    calls = [Call("search", {"q": "weather"})] * 7
    assert at(run(LoopGuard.from_plugin_config("brake", BRAKE_DOC), calls), Action.DENY) == [6, 7]
    one = run(LoopGuard.from_plugin_config("brake", {"maxRepeats": 1}), calls)
    assert at(one, Action.DENY) == [2, 3, 4, 5, 6, 7]


def test_brake_key_order_is_the_same_call_anything_else_is_not() -> None:
    same = [Call("f", {"a": 1, "b": 2}), Call("f", {"b": 2, "a": 1})] * 2
    assert at(both("brake", {}, same)[0], Action.DENY) == [4]
    # timestamps, nonces, cursors: different hashes, never caught
    stamped = [Call("f", {"a": 1, "ts": n}) for n in range(8)]
    assert not at(both("brake", {}, stamped)[0], Action.DENY)
    # alternating A, B, A, B: the brake counts only consecutive repeats
    alternating = [Call("f", {"a": 1}), Call("g", {"a": 1})] * 6
    assert not at(both("brake", {}, alternating)[0], Action.DENY)
    # a numbered description is a different call to the brake (it strips nothing)
    described = [Call("bash", {"command": "npm test", "description": f"run {n}"}) for n in range(6)]
    assert not at(both("brake", {}, described)[0], Action.DENY)


def test_brake_sessions_are_isolated_and_another_call_resets() -> None:
    guard = LoopGuard.from_plugin_config("brake", {})
    for session in ("s1", "s2"):
        run(guard, [Call("f", {}, session=session)] * 3)
    assert not guard.before_tool("g", {}, session="s1").blocks
    assert [guard.before_tool("f", {}, session="s1").blocks for _ in range(4)] == [
        False,
        False,
        False,
        True,
    ]
    assert guard.before_tool("f", {}, session="s2").blocks  # its 4th


def test_brake_error_carries_the_plugins_fields_and_never_the_arguments() -> None:
    guard = LoopGuard(PRESETS["brake"])
    secret = "hunter2-token"
    arguments = {"token": secret, "q": "weather"}

    @guard.wrap(tool="search", session="s1")
    def search(token: str, q: str) -> str:
        return "sunny"

    for _ in range(3):
        search(secret, "weather")
    with pytest.raises(LoopDetected) as info:
        search(secret, "weather")
    error = info.value
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    expected_hash = hashlib.sha256(f"search\n{canonical}".encode()).hexdigest()[:12]
    assert (error.toolName, error.count, error.maxRepeats, error.sessionId) == (
        "search",
        4,
        3,
        "s1",
    )
    assert error.hashPrefix == error.hash_prefix == expected_hash
    assert error.signature and error.signature != expected_hash  # the project's own stays
    assert error.plugin_fields == {
        "code": "LOOP_BRAKE",
        "toolName": "search",
        "count": 4,
        "maxRepeats": 3,
        "hashPrefix": expected_hash,
        "sessionId": "s1",
        "plugin": "dsh-loop-brake",
    }
    assert error.code == "deny" and "Not run: `search`" in error.message
    for text in (str(error), repr(error.args), error.message, repr(error.plugin_fields)):
        assert secret not in text and "Arguments:" not in text


def test_brake_environment_variable_where_the_plugin_reads_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    env = {DSH_LOOP_BRAKE_MAX_REPEATS: "5"}
    assert read_plugin_config("brake", {}, env).policy().deny_threshold == 6
    assert read_plugin_config("brake", {"maxRepeats": 2}, env).policy().deny_threshold == 3
    monkeypatch.setenv(DSH_LOOP_BRAKE_MAX_REPEATS, "7")
    assert LoopGuard.from_plugin_config("brake", {}).policy.deny_threshold == 8
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        policy = read_plugin_config("brake", {}, {DSH_LOOP_BRAKE_MAX_REPEATS: "0"}).policy()
    assert policy.deny_threshold == 4
    assert DSH_LOOP_BRAKE_MAX_REPEATS in caplog.text and "'0'" in caplog.text


@pytest.mark.parametrize("value", [0, -1, "3", 1.5, True, None])
def test_brake_nonsense_fails_naming_max_repeats(value: object) -> None:
    with pytest.raises(ValueError) as info:
        LoopGuard.from_plugin_config("brake", {"maxRepeats": value})
    assert "loop-brake" in str(info.value) and "maxRepeats" in str(info.value)
    assert repr(value) in str(info.value)


# -- rescue --------------------------------------------------------------------------------------


def grep_read_loop(periods: int) -> list[Call]:
    """The 2026-08-22 session: grep X five times, read Y, over and over."""
    period = [Call("grep", {"pattern": "parse_minutes", "path": "src"}, result="src/d.py:3")] * 5
    return (period + [Call("read", {"path": "src/d.py"}, result="def parse...")]) * periods


def test_rescue_window_denies_the_third_occurrence_and_rescues_from_the_fifth() -> None:
    calls = grep_read_loop(3)
    preset, migrated = both("rescue", RESCUE_DOC, calls)
    denied = at(preset, Action.DENY)
    assert denied[:3] == [3, 4, 5] and preset.decisions[2].rule is Rule.WINDOW
    assert [preset.decisions[n].count for n in (2, 3, 4)] == [3, 4, 5]
    assert not at(preset, Action.STOP) and not at(preset, Action.REMIND)
    # the read in between is never what is refused first
    assert {preset.decisions[n - 1].tool for n in denied[:3]} == {"grep"}
    # with an advisor, the 5th occurrence (rescueAt) on is a rescue, in both
    advised, _ = both(
        "rescue",
        dict(RESCUE_DOC, logFile=""),
        calls,
        advisor=lambda request: "read src/d.py instead",
    )
    assert at(advised, Action.RESCUE)[0] == 5 and advised.decisions[4].threshold == 5
    assert "read src/d.py instead" in advised.decisions[4].message


def test_rescue_clippy_around_edits_is_never_denied() -> None:
    calls: list[Call] = []
    for n in range(4):
        calls.append(Call("bash", {"command": "cargo clippy"}, result=f"{4 - n} warnings"))
        calls.append(
            Call("edit", {"path": "src/lib.rs", "old": f"a{n}", "new": f"b{n}"}, result="ok")
        )
    preset, _ = both("rescue", RESCUE_DOC, calls)
    assert not any(d.blocks for d in preset.decisions)


def test_rescue_strips_narrating_arguments_before_fingerprinting() -> None:
    calls = [
        Call("bash", {"command": "npm test", "description": f"Run tests (run {n})"})
        for n in range(1, 7)
    ]
    preset, _ = both("rescue", RESCUE_DOC, calls)
    assert at(preset, Action.DENY)[0] == 3


def test_rescue_deliberate_polling_exclude_commands_and_one_signature_per_denial() -> None:
    poll = [Call("bash", {"command": "docker ps"}, result="up")] * 6
    config = dict(RESCUE_DOC, excludeCommands=["^docker ps"])
    transcript = run(LoopGuard.from_plugin_config("rescue", config), poll)
    assert not any(d.blocks for d in transcript.decisions)
    guard = LoopGuard.from_plugin_config("rescue", RESCUE_DOC)
    assert run(guard, poll[:3]).decisions[-1].blocks
    assert not guard.before_tool("bash", {"command": "sleep 10 && docker ps"}, session="s").blocks


@pytest.mark.parametrize(
    "tool", ["todo_write", "ask_user", "mcp__claude__ask", "mcp__claude__review"]
)
def test_rescue_never_blocks_its_own_escalation_tool_or_bookkeeping(tool: str) -> None:
    preset, _ = both("rescue", {}, [Call(tool, {"q": "same"})] * 8)
    assert not any(d.blocks for d in preset.decisions)


def _ask_claude(home: Path, script: str) -> Path:
    """A stand-in for ~/.local/bin/ask-claude, following the plugin's contract."""
    path = home / ".local" / "bin" / "ask-claude"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(script))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_rescue_plugin_defaults_ask_claude_by_argv_and_log_every_kind(home: Path) -> None:
    asked = home / "asked.jsonl"
    _ask_claude(
        home,
        f"""
        import json, os, sys
        with open({str(asked)!r}, "a") as f:
            f.write(json.dumps({{"argv": sys.argv[1:], "stdin": sys.stdin.read(),
                                 "model": os.environ.get("LOOPGUARD_ADVISOR_MODEL")}}) + "\\n")
        print("Read src/d.py once and answer from it; stop grepping.")
    """,
    )
    guard = LoopGuard.from_plugin_config("rescue", {"cooldownMs": 0})
    assert guard.policy.advisor_command is not None and guard.policy.trip_log_path is not None
    decisions = run(guard, grep_read_loop(2)).decisions
    rescued = [d for d in decisions if d.action is Action.RESCUE]
    assert rescued and "stop grepping" in rescued[0].message
    (ask,) = [json.loads(line) for line in asked.read_text().splitlines()]
    assert len(ask["argv"]) == 1 and ask["stdin"] == "" and ask["model"] == "opus"
    assert "grep" in ask["argv"][0] and "parse_minutes" in ask["argv"][0]
    log = home / ".llmbox" / "loop-rescue.jsonl"
    kinds = [json.loads(line)["kind"] for line in log.read_text().splitlines()]
    assert kinds[0] == "deny" and "rescue" in kinds
    # a failing ask: the local denial, logged as escalation-failed; the budget is refunded
    _ask_claude(home, "import sys; sys.exit(3)")
    guard = LoopGuard.from_plugin_config("rescue", {"logFile": str(home / "t.jsonl")})
    decisions = run(guard, [Call("ls", {"path": "."}, result="a b")] * 6).decisions
    assert [d.action for d in decisions[4:]] == [Action.DENY, Action.DENY]
    lines = [json.loads(line) for line in (home / "t.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["action"]) for r in lines] == [
        ("deny", "deny"),
        ("deny", "deny"),
        ("escalation-failed", "deny"),
        ("escalation-failed", "deny"),
    ]
    # logFile '' disables the log; askCommand '' the advisor
    quiet = LoopGuard.from_plugin_config("rescue", {"logFile": "", "askCommand": ""})
    assert quiet.trip_log is None and quiet.advisor is None


def test_rescue_advice_is_bought_once_per_signature_bounded_by_budget_and_cooldown() -> None:
    clock = FakeClock()
    asked: list[str] = []

    def advisor(request: Any) -> str:
        asked.append(request.tool)
        return "try another way"

    guard = LoopGuard.from_plugin_config(
        "rescue", dict(RESCUE_DOC, logFile=""), advisor=advisor, clock=clock
    )
    assert guard.policy.cooldown_seconds == 45 and guard.policy.advisor_timeout_seconds == 90
    assert guard.policy.max_rescues == 3

    def hammer(name: str, times: int) -> list[Decision]:
        return run(guard, [Call(name, {"q": 1}, result="same")] * times).decisions

    assert [d.action for d in hammer("a", 6)[4:]] == [Action.RESCUE, Action.RESCUE]
    assert asked == ["a"]  # the second rescue of the same call was free (cached)
    assert hammer("b", 5)[-1].action is Action.DENY  # within the 45 s cooldown
    clock.advance(46)
    assert hammer("b", 1)[-1].action is Action.RESCUE
    clock.advance(46)
    assert hammer("c", 5)[-1].action is Action.RESCUE
    clock.advance(46)
    assert hammer("d", 5)[-1].action is Action.DENY  # maxRescues 3 spent
    assert asked == ["a", "b", "c"]


def test_rescue_stall_rescues_regardless_of_signature_and_zero_disables_it() -> None:
    calls = [Call("read", {"path": f"f{n % 20}"}, result=f"c{n % 20}") for n in range(70)]
    config = dict(RESCUE_DOC, logFile="", askCommand="")
    preset, migrated = both("rescue", config, calls)
    stalls = [d for d in preset.decisions if d.rule is Rule.STALL]
    assert stalls and stalls[0].count == 40 and stalls[0].threshold == 40
    assert stalls[0].action is Action.DENY  # no advisor: the local denial, never a stop
    assert "not making progress" in stalls[0].message
    assert not at(preset, Action.STOP)
    guard = LoopGuard(PRESETS["rescue"], advisor=lambda request: "change approach")
    rescued = [d for d in run(guard, calls).decisions if d.rule is Rule.STALL]
    assert rescued[0].action is Action.RESCUE and "change approach" in rescued[0].message
    off = run(LoopGuard.from_plugin_config("rescue", dict(config, stallAt=0)), calls)
    assert not any(d.rule is Rule.STALL for d in off.decisions)


@pytest.mark.parametrize(
    ("config", "key", "value"),
    [
        ({"window": 1}, "window", "1"),
        ({"nudgeAt": 1}, "nudgeAt", "1"),
        ({"nudgeAt": 6}, "rescueAt", "nudgeAt=6"),
        ({"rescueAt": 2}, "rescueAt", "2"),
        ({"stallAt": 1}, "stallAt", "1"),
        ({"stallAt": -3}, "stallAt", "-3"),
        ({"maxRescues": -1}, "maxRescues", "-1"),
        ({"cooldownMs": -5}, "cooldownMs", "-5"),
        ({"cooldownMs": "45s"}, "cooldownMs", "'45s'"),
        ({"askTimeoutMs": 0}, "askTimeoutMs", "0"),
        ({"excludeCommands": ["(docker"]}, "excludeCommands", "'(docker'"),
        ({"ignoredArgs": "description"}, "ignoredArgs", "'description'"),
        ({"mutatingTools": [None]}, "mutatingTools", "None"),
        ({"askCommand": 42}, "askCommand", "42"),
        ({"logFile": False}, "logFile", "False"),
        ({"nudge": 3}, "nudge", "nudge"),
    ],
)
def test_rescue_nonsense_fails_naming_the_plugins_key_and_value(
    config: dict[str, Any], key: str, value: str
) -> None:
    with pytest.raises(ValueError) as info:
        LoopGuard.from_plugin_config("rescue", config)
    assert "loop-rescue" in str(info.value)
    assert key in str(info.value) and value in str(info.value)


def test_rescue_every_key_maps_to_its_policy_field() -> None:
    policy = read_plugin_config(
        "rescue",
        dict(
            RESCUE_DOC,
            window=200,
            nudgeAt=4,
            rescueAt=6,
            stallAt=30,
            maxRescues=1,
            cooldownMs=1500,
            excludeCommands=["^docker ps"],
            ignoredArgs=["why"],
            mutatingTools=["save"],
            askCommand="/opt/ask me",
            askModel="sonnet",
            askTimeoutMs=2500,
            logFile="/var/log/trips.jsonl",
        ),
    ).policy()
    assert (
        policy.window_size,
        policy.deny_threshold,
        policy.rescue_threshold,
        policy.stall_threshold,
    ) == (200, 4, 6, 30)
    assert policy.max_signatures_per_session >= 400  # room for the window
    assert (policy.max_rescues, policy.cooldown_seconds, policy.advisor_timeout_seconds) == (
        1,
        1.5,
        2.5,
    )
    assert policy.exclude_commands == ("^docker ps",) and policy.ignored_args == {"why"}
    assert policy.mutating_tools == ("save",) and policy.include == ("*",)
    assert policy.advisor_command == "'/opt/ask me'" and policy.advisor_model == "sonnet"
    assert policy.advisor_input.value == "argv" and policy.trip_log_path == "/var/log/trips.jsonl"
    assert policy.rules == {Rule.WINDOW, Rule.STALL} and policy.rescue_on_stall
    defaults = read_plugin_config("rescue", {}).policy()
    assert defaults.advisor_command == "'~/.local/bin/ask-claude'"
    assert defaults.trip_log_path == RESCUE_PLUGIN_DEFAULTS["logFile"]
    assert (
        defaults.replace(advisor_command=None, advisor_model=None, trip_log_path=None)
        == PRESETS["rescue"]
    )


def test_presets_equal_the_plugins_defaults() -> None:
    assert read_plugin_config("reminder", {}).policy() == PRESETS["reminder"]
    assert read_plugin_config("brake", {}).policy() == PRESETS["brake"]
    reminder, brake, rescue = PRESETS["reminder"], PRESETS["brake"], PRESETS["rescue"]
    assert reminder.arguments_preview_chars == 500 and not reminder.remind_past_thresholds
    assert reminder.exclude == () and reminder.ignored_args == frozenset()
    assert brake.deny_threshold == 4 and brake.stop_after_denials is None
    assert brake.ignored_args == frozenset()
    assert rescue.exclude == ("todo_write", "ask_user", "mcp__claude__*")
    assert (rescue.cooldown_seconds, rescue.advisor_timeout_seconds) == (45.0, 90.0)
    assert rescue.rescue_on_stall and rescue.stop_after_denials is None


# -- names, entries and files ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["loop-rescue", "dsh-loop-rescue", "rescue", "github:someone/dsh-loop-rescue"]
)
def test_a_plugin_is_known_by_its_id_package_or_preset_name(name: str) -> None:
    assert read_plugin_config(name, {"window": 10}).policy().window_size == 10


def test_unknown_plugin_and_a_mismatched_entry_are_named() -> None:
    with pytest.raises(ValueError, match="'loop-guard'"):
        read_plugin_config("loop-guard", {})
    entry = {"id": "loop-brake", "config": {"maxRepeats": 2}}
    assert read_plugin_config("brake", entry).policy().deny_threshold == 3
    with pytest.raises(ValueError, match="another plugin"):
        read_plugin_config("rescue", entry)


YAML_PATCH = """\
- id: repeat-tool-reminder
  name: '@deepseek-ai/dsh-repeat-tool-reminder'
  config:
    thresholds: [3, 5, 8]     # consecutive repeats that remind
    include: []
    exclude: [todo_write]
    argumentsPreviewChars: 500
- insert:
  - id: loop-rescue
    name: dsh-loop-rescue
    config:
      window: 12
      nudgeAt: 3
      rescueAt: 5
      stallAt: 40
      exclude: [todo_write, ask_user, 'mcp__claude__*']
      askCommand: ~/.local/bin/ask-claude
      logFile: ~/.llmbox/loop-rescue.jsonl
"""


def test_plugin_config_files_yaml_json_toml(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    patch = tmp_path / "cordis.patch.yml"
    patch.write_text(YAML_PATCH)
    with pytest.raises(ValueError, match="several plugins.*repeat-tool-reminder.*loop-rescue"):
        load_plugin_config(patch)
    rescue = load_plugin_config(f"loop-rescue={patch}")
    assert rescue.preset == "rescue" and rescue.policy().window_size == 12
    assert load_plugin_config(f"reminder={patch}").policy() == PRESETS["reminder"].replace(
        exclude=("todo_write",)
    )
    brake = tmp_path / "brake.json"
    brake.write_text(json.dumps({"id": "loop-brake", "config": {"maxRepeats": 5}}))
    assert load_plugin_config(brake).policy().deny_threshold == 6
    bare = tmp_path / "bare.toml"
    bare.write_text("maxRepeats = 2\n")
    with pytest.raises(ValueError, match="NAME=FILE"):
        load_plugin_config(bare)
    assert load_plugin_config(f"brake={bare}").policy().deny_threshold == 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"id": "loop-brake", "config": {"maxRepeats": 0}}))
    with pytest.raises(ValueError) as info:
        load_plugin_config(bad)
    assert str(bad) in str(info.value) and "maxRepeats" in str(info.value)
    with pytest.raises(ValueError, match="missing.yml"):
        load_plugin_config(tmp_path / "missing.yml")


def test_load_policy_layers_a_plugin_config_under_the_toml_file(tmp_path: Path) -> None:
    plugin = tmp_path / "brake.json"
    plugin.write_text(json.dumps({"id": "loop-brake", "config": {"maxRepeats": 5}}))
    toml = tmp_path / "c.toml"
    toml.write_text('mode = "observe"\n')
    policy = load_policy(
        config_path=toml, environ={"LOOPGUARD_WINDOW_SIZE": "30"}, plugin_config=plugin
    )
    assert policy.deny_threshold == 6 and policy.mode is Mode.OBSERVE
    assert policy.window_size == 30 and policy.rules == {Rule.CONSECUTIVE}
    with pytest.raises(ValueError, match="preset and a plugin config"):
        load_policy("brake", plugin_config=plugin, environ={})


def test_cli_reads_a_plugin_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from otel_loopguard.cli import main

    plugin = tmp_path / "brake.json"
    plugin.write_text(json.dumps({"id": "loop-brake", "config": {"maxRepeats": 1}}))
    calls = tmp_path / "calls.jsonl"
    call = {"session": "s", "tool": "ls", "arguments": {}, "error": False}
    calls.write_text("\n".join(json.dumps(call) for _ in range(3)) + "\n")
    assert main(["replay", "--json", "--plugin-config", str(plugin), str(calls)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["action"] for row in rows] == ["allow", "deny", "deny"]
    plugin.write_text(json.dumps({"id": "loop-brake", "config": {"maxRepeats": "x"}}))
    assert main(["replay", "--plugin-config", str(plugin), str(calls)]) == 2
    assert "maxRepeats" in capsys.readouterr().err


# -- 6. texts that are true --------------------------------------------------------------------


def _denial(policy: Policy, calls: int) -> str:
    decisions = run(LoopGuard(policy), [Call("ls", {"p": 1}, result="x")] * calls).decisions
    assert decisions[-1].blocks
    return decisions[-1].message


def test_a_denial_says_the_run_will_end_only_when_the_policy_ends_it() -> None:
    for preset in ("brake", "rescue"):
        text = _denial(PRESETS[preset], 6)
        assert "end the run" not in text and "will end" not in text
        assert "refused again" in text
    default = PRESETS["default"]
    stop_after = default.stop_after_denials
    assert stop_after == 3
    stuck = default.no_progress_threshold or 0
    first = _denial(default, stuck)
    assert f"after {stop_after - 1} more refused calls, the next one will end the run" in first
    last = _denial(default, stuck + stop_after - 1)
    assert "if another call is refused, the run will end" in last
    # denials that never stop, but a stall rule that does: say that, and only that
    no_stop = default.replace(stop_after_denials=None)
    assert "repeating calls without progress will end the run" in _denial(no_stop, stuck)
    quiet = no_stop.replace(rules=frozenset({Rule.CONSECUTIVE, Rule.NO_PROGRESS}))
    assert "end the run" not in _denial(quiet, stuck)


def test_every_plugin_example_config_is_valid_through_the_cli_loader(tmp_path: Path) -> None:
    for name, config in (("reminder", REMINDER_DOC), ("brake", BRAKE_DOC), ("rescue", RESCUE_DOC)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(config))
        loaded = load_plugin_config(f"{name}={path}").policy()
        assert loaded == read_plugin_config(name, config).policy()


def test_from_plugin_config_ignores_loopguard_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPGUARD_DENY_THRESHOLD", "9")
    assert LoopGuard.from_plugin_config("brake", {}).policy.deny_threshold == 4


# -- the command hooks: the plugin's config, the prompt and the outputs reach the question -----


def test_a_command_hook_with_the_rescue_plugins_config_asks_with_the_prompt(
    tmp_path: Path, home: Path
) -> None:
    import io

    from otel_loopguard.hooks import run as run_hook

    asked = home / "asked.json"
    ask = _ask_claude(
        home,
        f"""
        import json, sys
        json.dump(sys.argv[1:], open({str(asked)!r}, "w"))
        print("Read the failing test's assertion before rerunning it.")
    """,
    )
    plugin = tmp_path / "cordis.patch.yml"
    plugin.write_text(
        json.dumps(
            [
                {
                    "id": "loop-rescue",
                    "config": {
                        "nudgeAt": 2,
                        "rescueAt": 2,
                        "askCommand": str(ask),
                        "logFile": "",
                        "cooldownMs": 0,
                    },
                }
            ]
        )
    )
    store = tmp_path / "hooks.sqlite3"

    def event(name: str, **fields: Any) -> dict[str, Any]:
        return {"session_id": "sess-1", "hook_event_name": name, "cwd": "/p", **fields}

    def send(payload: dict[str, Any]) -> dict[str, Any]:
        out, err = io.BytesIO(), io.StringIO()
        assert (
            run_hook(
                "claude-code",
                store=str(store),
                plugin_config=str(plugin),
                stdin=io.BytesIO(json.dumps(payload).encode()),
                stdout=out,
                stderr=err,
                environ={"HOME": str(home)},
            )
            == 0
        )
        answer: dict[str, Any] = json.loads(out.getvalue())
        return answer

    send(event("UserPromptSubmit", prompt="Make the login test pass."))
    tests = {"command": "pytest -x tests/test_api.py"}
    for n in (1, 2):
        pre = send(event("PreToolUse", tool_name="Bash", tool_input=tests, tool_use_id=f"c{n}"))
        if n == 1:
            assert pre == {}
            send(
                event(
                    "PostToolUse",
                    tool_name="Bash",
                    tool_input=tests,
                    tool_use_id="c1",
                    tool_response={"stdout": "FAILED test_login - assert 401 == 200"},
                )
            )
    reason = pre["hookSpecificOutput"]["permissionDecisionReason"]
    assert "Read the failing test's assertion" in reason
    (question,) = json.loads(asked.read_text())
    assert "Make the login test pass." in question
    assert "assert 401 == 200" in question and "pytest -x tests/test_api.py" in question


def test_a_yaml_file_without_pyyaml_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rescue.yaml"
    path.write_text("window: 12\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    with pytest.raises(ValueError, match=r"the yaml extra: pip install '\.\[yaml\]'"):
        load_plugin_config(f"loop-rescue={path}")
