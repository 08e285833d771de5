"""The memory fields of the policy (issue 28): ``memory``, ``memory_scope`` and their bounds,
from code, TOML and the environment."""

from __future__ import annotations

import logging

import pytest

from otel_loopguard._settings import DETECTION_RULES
from otel_loopguard.config import (
    MemoryScope,
    Policy,
    Rule,
    policy_from_env,
    policy_from_mapping,
)


def test_memory_defaults() -> None:
    policy = Policy()
    assert policy.memory is True  # where runs follow each other; in-process guards: nowhere
    assert policy.memory_scope is MemoryScope.REPOSITORY
    assert policy.memory_max_entries == 200
    assert policy.memory_max_age_seconds == 30 * 86_400
    assert policy.memory_arguments is False
    assert Rule.MEMORY not in DETECTION_RULES


def test_memory_from_toml_values() -> None:
    assert policy_from_mapping({"memory": False}).memory is False
    assert policy_from_mapping({"memory": "/tmp/dead-ends.json"}).memory == "/tmp/dead-ends.json"
    assert policy_from_mapping({"memory_scope": "agent"}).memory_scope is MemoryScope.AGENT
    assert policy_from_mapping({"memory_scope": "global"}).memory_scope is MemoryScope.GLOBAL


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"memory": ""}, "memory: expected true, false, a file path or a Redis URL, got ''"),
        ({"memory": 3}, "memory: expected true, false, a file path or a Redis URL, got 3"),
        ({"memory_scope": "repo"}, "memory_scope: 'repo' is not one of"),
        ({"memory_max_entries": 0}, "memory_max_entries: expected a positive integer, got 0"),
        ({"memory_max_age_seconds": -1}, "memory_max_age_seconds: expected a number > 0"),
        ({"rules": ["memory"]}, "rules: "),
    ],
)
def test_bad_memory_values_name_field_and_value(values: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match="^" + named.replace("(", r"\(")):
        policy_from_mapping(values)


def test_memory_from_the_environment(caplog: pytest.LogCaptureFixture) -> None:
    assert policy_from_env(environ={"LOOPGUARD_MEMORY": "off"}).memory is False
    assert policy_from_env(environ={"LOOPGUARD_MEMORY": "true"}).memory is True
    assert policy_from_env(environ={"LOOPGUARD_MEMORY": "~/m.sqlite3"}).memory == "~/m.sqlite3"
    scoped = policy_from_env(environ={"LOOPGUARD_MEMORY_SCOPE": "Agent"})
    assert scoped.memory_scope is MemoryScope.AGENT
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        kept = policy_from_env(environ={"LOOPGUARD_MEMORY": " "})
    assert kept.memory is True
    assert "LOOPGUARD_MEMORY=' ' ignored" in caplog.text
