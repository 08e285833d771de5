"""The policy object, presets, TOML and environment overrides (config.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from otel_loopguard import PRESETS, Action, LoopGuard, Mode, Policy, Rule, load_policy
from otel_loopguard._classifier import Classifier
from otel_loopguard.config import (
    DEFAULT_FINAL_ANSWER_TOOLS,
    env_var,
    policy_from_env,
    wildcard_regex,
)


def test_policy_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Policy().deny_threshold = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        ({"remind_thresholds": (1, 3)}, "remind_thresholds", "1"),
        ({"remind_thresholds": (3, 3)}, "remind_thresholds", "[3, 3]"),
        ({"remind_thresholds": (2.5,)}, "remind_thresholds", "2.5"),
        ({"deny_threshold": 1}, "deny_threshold", "1"),
        ({"deny_threshold": True}, "deny_threshold", "True"),
        ({"remind_thresholds": (3, 6)}, "remind_thresholds", "[3, 6]"),
        ({"rescue_threshold": 5}, "rescue_threshold", "5"),
        ({"poll_limit": 6}, "poll_limit", "6"),
        ({"arguments_preview_chars": 0}, "arguments_preview_chars", "0"),
        ({"cooldown_seconds": -1}, "cooldown_seconds", "-1"),
        ({"exclude_commands": ("(unclosed",)}, "exclude_commands", "'(unclosed'"),
        ({"mutating_commands": ("[z-a]",)}, "mutating_commands", "'[z-a]'"),
        ({"mode": "loud"}, "mode", "'loud'"),
        ({"rules": ("consecutive", "psychic")}, "rules", "'psychic'"),
        ({"include": "bash"}, "include", "'bash'"),
        ({"max_sessions": 0}, "max_sessions", "0"),
        ({"stall_threshold": 1}, "stall_threshold", "1"),
        ({"remind_past_thresholds": "no"}, "remind_past_thresholds", "'no'"),
        ({"rescue_on_stall": 1}, "rescue_on_stall", "1"),
        ({"final_answer_tools": "final_answer"}, "final_answer_tools", "'final_answer'"),
        ({"count_calls_without_arguments": "yes"}, "count_calls_without_arguments", "'yes'"),
        ({"advisor_input": "stdin"}, "advisor_input", "'stdin'"),
        ({"advisor_model": ""}, "advisor_model", "''"),
        ({"advisor_model": 3}, "advisor_model", "3"),
    ],
)
def test_nonsense_fails_loudly_naming_field_and_value(
    changes: dict[str, object], field: str, value: str
) -> None:
    with pytest.raises(ValueError) as info:
        PRESETS["default"].replace(**changes)
    assert field in str(info.value) and value in str(info.value)


def test_unknown_field_is_named() -> None:
    with pytest.raises(ValueError, match="deny_treshold"):
        PRESETS["default"].replace(deny_treshold=3)


def test_thresholds_are_sorted_on_load() -> None:
    assert Policy(remind_thresholds=[5, 2, 3]).remind_thresholds == (2, 3, 5)  # type: ignore[arg-type]


def test_rescue_needs_deny() -> None:
    with pytest.raises(ValueError, match="rescue_threshold"):
        Policy(deny_threshold=None, rescue_threshold=8, poll_limit=None)


def test_presets_reproduce_the_plugins() -> None:
    reminder, brake, rescue = PRESETS["reminder"], PRESETS["brake"], PRESETS["rescue"]
    assert reminder.mode is Mode.ADVISE and reminder.rules == {Rule.CONSECUTIVE}
    assert reminder.remind_thresholds == (3, 5, 8) and reminder.deny_threshold is None
    assert not reminder.remind_past_thresholds and reminder.arguments_preview_chars == 500
    assert brake.rules == {Rule.CONSECUTIVE} and brake.deny_threshold == 4
    # both compare arguments whole and know no progress epochs but a user message
    for plugin in (reminder, brake):
        assert plugin.ignored_args == frozenset() and plugin.exclude == ()
        assert plugin.mutating_tools == () and plugin.mutating_commands == ()
    assert rescue.rules == {Rule.WINDOW, Rule.STALL} and rescue.window_size == 12
    assert (rescue.deny_threshold, rescue.rescue_threshold, rescue.stall_threshold) == (3, 5, 40)
    assert rescue.rescue_on_stall and rescue.stop_after_denials is None
    assert rescue.exclude == ("todo_write", "ask_user", "mcp__claude__*")
    assert (rescue.max_rescues, rescue.cooldown_seconds, rescue.advisor_timeout_seconds) == (
        3,
        45.0,
        90.0,
    )
    assert rescue.advisor_command is None and rescue.trip_log_path is None


def test_the_default_preset_keeps_its_detection() -> None:
    default = PRESETS["default"]
    assert default.remind_past_thresholds and not default.rescue_on_stall
    assert default.include == ("*",) and default.advisor_input.value == "argv"


def test_empty_include_means_every_tool() -> None:
    assert Policy(include=()).include == ("*",) == Policy(include=[]).include  # type: ignore[arg-type]
    assert Policy(include=()) == Policy()


def test_validate_field_names_the_label_and_the_value() -> None:
    from otel_loopguard.config import validate_field

    assert validate_field("remind_thresholds", [5, 3]) == (3, 5)
    with pytest.raises(ValueError, match=r"^thresholds: .*1"):
        validate_field("remind_thresholds", [1], label="thresholds")
    with pytest.raises(ValueError, match="unknown policy field: nope"):
        validate_field("nope", 1)


def test_env_sets_the_new_fields() -> None:
    env = {
        "LOOPGUARD_ADVISOR_INPUT": "STDIN_JSON",
        "LOOPGUARD_ADVISOR_MODEL": "opus",
        "LOOPGUARD_REMIND_PAST_THRESHOLDS": "false",
        "LOOPGUARD_RESCUE_ON_STALL": "yes",
    }
    policy = policy_from_env(environ=env)
    assert policy.advisor_input.value == "stdin_json" and policy.advisor_model == "opus"
    assert not policy.remind_past_thresholds and policy.rescue_on_stall


def test_wildcards_treat_regex_metacharacters_literally() -> None:
    assert wildcard_regex("mcp__*").fullmatch("mcp__github__search")
    assert not wildcard_regex("a.c").fullmatch("abc")
    assert wildcard_regex("a.c").fullmatch("A.C")
    assert not wildcard_regex("read").fullmatch("read_file")


def test_env_overrides_defaults() -> None:
    env = {
        env_var("deny_threshold"): "7",
        env_var("remind_thresholds"): "4,2",
        env_var("mode"): "ADVISE",
        env_var("exclude_commands"): r"^docker ps;;^kubectl get",
    }
    policy = policy_from_env(environ=env)
    assert policy.deny_threshold == 7
    assert policy.remind_thresholds == (2, 4)
    assert policy.mode is Mode.ADVISE
    assert policy.exclude_commands == ("^docker ps", "^kubectl get")


@pytest.mark.parametrize(
    ("variable", "text"),
    [
        ("LOOPGUARD_DENY_THRESHOLD", "six"),
        ("LOOPGUARD_DENY_THRESHOLD", "1"),
        ("LOOPGUARD_MODE", "loud"),
        ("LOOPGUARD_COOLDOWN_SECONDS", "-3"),
        ("LOOPGUARD_EXCLUDE_COMMANDS", "(oops"),
        ("LOOPGUARD_PRESET", "nope"),
    ],
)
def test_bad_env_value_warns_naming_the_variable_and_keeps_default(
    variable: str, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        policy = policy_from_env(environ={variable: text})
    assert policy == PRESETS["default"]
    assert variable in caplog.text and repr(text) in caplog.text


def test_env_can_turn_off_an_optional_threshold() -> None:
    env = {"LOOPGUARD_RESCUE_THRESHOLD": "none"}
    assert policy_from_env(environ=env).rescue_threshold is None


def test_load_policy_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "loopguard.toml"
    path.write_text('[loopguard]\npreset = "brake"\ndeny_threshold = 5\nexclude = ["todo_*"]\n')
    policy = load_policy(config_path=path, environ={})
    assert policy.deny_threshold == 5 and policy.rules == {Rule.CONSECUTIVE}
    assert policy.exclude == ("todo_*",)


def test_toml_false_turns_off_optional_thresholds(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("rescue_threshold = false\npoll_limit = false\n")
    policy = load_policy(config_path=path, environ={})
    assert policy.rescue_threshold is None and policy.poll_limit is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("deny_threshold = 1\n", "deny_threshold"),
        ("colour = 3\n", "colour"),
        ("deny_threshold = \n", "not valid TOML"),
        ('preset = "x"\n', "preset"),
    ],
)
def test_bad_config_file_names_file_and_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_policy(config_path=path, environ={})
    assert str(path) in str(info.value) and needle in str(info.value)


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nope.toml"):
        load_policy(config_path=tmp_path / "nope.toml", environ={})


def test_config_file_beats_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("deny_threshold = 9\nrescue_threshold = 10\npoll_limit = 15\n")
    env = {"LOOPGUARD_DENY_THRESHOLD": "7", "LOOPGUARD_WINDOW_SIZE": "30"}
    policy = load_policy(config_path=path, environ=env)
    assert policy.deny_threshold == 9 and policy.window_size == 30


@pytest.mark.slow
def test_wildcard_union_matches_when_any_pattern_does() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from otel_loopguard.config import wildcard_union

    alphabet = st.sampled_from(list("ab*.|(?[\\-_X"))

    @settings(max_examples=300)
    @given(st.lists(st.text(alphabet, max_size=5), max_size=4), st.text(alphabet, max_size=6))
    def check(patterns: list[str], name: str) -> None:
        union = wildcard_union(patterns)
        expected = any(wildcard_regex(p).fullmatch(name) for p in patterns)
        assert (union is not None and union.fullmatch(name) is not None) is expected

    check()
    assert wildcard_union([]) is None


# -- final-answer tools, calls without arguments ----------------------------------------------


@pytest.mark.parametrize("preset", list(PRESETS))
def test_final_answer_tools_are_never_tracked_and_exclude_adds_to_them(preset: str) -> None:
    policy = PRESETS[preset]
    assert policy.final_answer_tools == DEFAULT_FINAL_ANSWER_TOOLS
    assert "final_answer" in DEFAULT_FINAL_ANSWER_TOOLS  # smolagents
    own = policy.replace(exclude=(*policy.exclude, "todo_*"))
    for tool in DEFAULT_FINAL_ANSWER_TOOLS:
        assert Classifier(policy).tool_kind(tool)[0] is False
        assert Classifier(own).tool_kind(tool)[0] is False  # a user's exclude adds to them
    assert Classifier(own).tool_kind("todo_write")[0] is False
    assert Classifier(own).tool_kind("search")[0] is True
    tracked = policy.replace(final_answer_tools=())
    assert Classifier(tracked).tool_kind("final_answer")[0] is True


def test_a_stopped_agent_can_still_give_its_final_answer() -> None:
    guard = LoopGuard(PRESETS["default"])
    decisions = [
        guard.after_tool("search", {"query": "weather in Paris"}, session="s", result="nothing")
        for _ in range(8)
    ]
    assert decisions[-1] is not None and decisions[-1].action is Action.STOP
    refused = guard.before_tool("search", {"query": "elsewhere"}, session="s")
    assert refused.action is Action.STOP  # the run is stopped for every tracked tool
    for _ in range(3):
        answer = guard.before_tool("final_answer", {"answer": "It is sunny."}, session="s")
        assert answer.action is Action.ALLOW
    tracking = LoopGuard(PRESETS["default"].replace(final_answer_tools=()))
    for _ in range(8):
        tracking.after_tool("search", {"query": "weather in Paris"}, session="s", result="x")
    assert tracking.before_tool("final_answer", {"answer": "a"}, session="s").blocks


def test_count_calls_without_arguments_from_env_and_toml(tmp_path: Path) -> None:
    assert PRESETS["default"].count_calls_without_arguments is False
    env = {
        env_var("count_calls_without_arguments"): "true",
        env_var("final_answer_tools"): "final_answer,done_*",
    }
    policy = policy_from_env(environ=env)
    assert policy.count_calls_without_arguments is True
    assert policy.final_answer_tools == ("final_answer", "done_*")
    path = tmp_path / "loopguard.toml"
    path.write_text("count_calls_without_arguments = true\nfinal_answer_tools = []\n")
    policy = load_policy(config_path=path, environ={})
    assert policy.count_calls_without_arguments and policy.final_answer_tools == ()
