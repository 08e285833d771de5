"""A policy field left at its default is not checked again on every ``Policy`` built (a hook
process builds two per tool call, issue 29 item 1): that is sound only while every declared
default passes its own field's check unchanged. These tests hold that to account."""

from __future__ import annotations

import dataclasses

import pytest

from otel_loopguard._policy_fields import SPECS
from otel_loopguard._validation import check_value
from otel_loopguard.config import Policy


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_each_default_passes_its_check_unchanged(spec: dataclasses.Field[object]) -> None:
    assert spec.default is not dataclasses.MISSING, "a default factory would be checked"
    checked = check_value(spec.name, spec.default, spec.metadata)
    assert checked == spec.default
    assert type(checked) is type(spec.default)


def test_a_default_policy_holds_the_declared_defaults() -> None:
    policy = Policy()
    for spec in SPECS:
        if spec.name == "include":
            assert policy.include == ("*",)  # empty means every tool
        else:
            assert getattr(policy, spec.name) == spec.default, spec.name


def test_a_value_other_than_the_default_is_still_checked() -> None:
    with pytest.raises(ValueError, match="window_size"):
        Policy(window_size=0)
    with pytest.raises(ValueError, match="exclude_commands"):
        Policy(exclude_commands=("(unclosed",))
    # equal to a default but another object: checked (and normalised) as any value
    assert Policy(rules=["consecutive"]).rules == frozenset({"consecutive"})  # type: ignore[arg-type]


def test_the_checks_across_fields_still_run_on_defaults() -> None:
    with pytest.raises(ValueError, match="remind_thresholds"):
        Policy(deny_threshold=2)  # the default reminders come at 2 and later: not before 2
