"""decision_attributes: every shape of a shown decision from one table, field for field what
the span processor, the exporter, serve's log lines and the decision API showed before."""

from __future__ import annotations

import dataclasses

import pytest

from otel_loopguard._attributes import (
    FIELDS,
    Shape,
    arguments_text,
    decision_attributes,
    log_fields_of_answer,
)
from otel_loopguard._policy import Action, Decision, Phase
from otel_loopguard.config import PRESETS, Mode, Rule

DENY = Decision(
    Action.REMIND,  # softened by advise mode
    message="stop repeating",
    rule=Rule.CONSECUTIVE,
    count=3,
    threshold=3,
    signature="0123456789ab",
    tool="search",
    session="s1",
    repeated=True,
    detected=Action.DENY,
    hash_prefix="feedbeef0000",
)
FIRST_ALLOW = Decision(Action.ALLOW)
LONG = "x" * 300


def test_the_span_shape_is_the_processors_event() -> None:
    got = decision_attributes(
        DENY, Shape.SPAN, mode=Mode.ADVISE, call_id="call-1", arguments='{"q":"x"}'
    )
    assert got == {
        "loopguard.action": "deny",
        "loopguard.rule": "consecutive",
        "loopguard.count": 3,
        "loopguard.threshold": 3,
        "loopguard.signature": "0123456789ab",
        "loopguard.mode": "advise",
        "loopguard.phase": "pre",
        "gen_ai.tool.name": "search",
        "gen_ai.tool.call.id": "call-1",
        "loopguard.arguments": '{"q":"x"}',
    }


def test_the_span_shape_never_holds_null() -> None:
    got = decision_attributes(FIRST_ALLOW, Shape.SPAN, mode=Mode.ENFORCE, call_id="")
    assert got == {
        "loopguard.action": "allow",
        "loopguard.rule": "none",
        "loopguard.count": 0,
        "loopguard.threshold": 0,
        "loopguard.signature": "",
        "loopguard.mode": "enforce",
        "loopguard.phase": "pre",
        "gen_ai.tool.name": "",
    }


def test_the_log_shape_names_the_callers_session_agent_and_tool() -> None:
    got = decision_attributes(
        FIRST_ALLOW, Shape.LOG, source="span", session=LONG, agent=LONG, tool="search"
    )
    assert list(got) == [
        "source",
        "session",
        "agent",
        "tool",
        "action",
        "detected",
        "rule",
        "count",
        "threshold",
        "signature",
        "phase",
    ]
    assert got["session"] == got["agent"] and len(str(got["session"])) == 98  # bounded ids
    assert got["tool"] == "search" and got["rule"] is None and got["signature"] is None
    assert decision_attributes(DENY, Shape.LOG, source="api", session="s1")["agent"] is None


def test_the_api_shape_and_the_log_line_of_an_answer() -> None:
    answer = decision_attributes(dataclasses.replace(DENY, phase=Phase.POST), Shape.API)
    assert answer == {
        "action": "remind",
        "blocks": False,
        "message": "stop repeating",
        "rule": "consecutive",
        "count": 3,
        "threshold": 3,
        "signature": "0123456789ab",
        "hash_prefix": "feedbeef0000",
        "tool": "search",
        "session": "s1",
        "repeated": True,
        "detected": "deny",
        "phase": "post",
    }
    assert log_fields_of_answer(answer, "planner") == {
        "source": "api",
        "session": "s1",
        "agent": "planner",
        "tool": "search",
        "action": "remind",
        "detected": "deny",
        "rule": "consecutive",
        "count": 3,
        "threshold": 3,
        "signature": "0123456789ab",
        "phase": "post",
    }
    # The same line as from the decision itself.
    assert log_fields_of_answer(answer, "planner") == decision_attributes(
        dataclasses.replace(DENY, phase=Phase.POST), Shape.LOG, source="api", agent="planner"
    )


def test_the_trip_shape_is_a_trip_lines_arguments() -> None:
    got = decision_attributes(
        DENY, Shape.TRIP, agent="planner", mode=Mode.ADVISE, arguments=None, kind=None
    )
    assert got == {
        "session": "s1",
        "agent": "planner",
        "tool": "search",
        "action": "deny",  # what was detected, before the mode
        "rule": "consecutive",
        "count": 3,
        "threshold": 3,
        "signature": "0123456789ab",
        "mode": "advise",
        "arguments": None,
        "kind": None,
    }


def test_every_decision_field_is_in_the_table_once() -> None:
    """A new Decision field is one row of FIELDS: this fails until it is there."""
    keys = [row.key for row in FIELDS]
    assert len(keys) == len(set(keys))
    read = {row.key for row in FIELDS if row.read is not None}
    assert {f.name for f in dataclasses.fields(Decision)} | {"detected", "blocks"} == read
    for shape in Shape:
        names = [row.name(shape) for row in FIELDS if row.name(shape) is not None]
        assert len(names) == len(set(names)), shape


@pytest.mark.parametrize("ignored", [True, False])
def test_arguments_text_is_canonical_and_cut(ignored: bool) -> None:
    policy = dataclasses.replace(PRESETS["default"], arguments_preview_chars=12)
    arguments = {"b": 1, "a": "long value", "reasoning": "why"} if ignored else {"a": 1}
    text = arguments_text(arguments, policy)
    if ignored:
        assert text.startswith('{"a":"long v') and text.endswith("more chars)")
        assert "reasoning" not in text
    else:
        assert text == '{"a":1}'
