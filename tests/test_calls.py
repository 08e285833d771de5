"""Canonical arguments and keys (calls.py)."""

from __future__ import annotations

import math
import time

import pytest

from otel_loopguard._calls import (
    MAX_DEPTH,
    MAX_PARSE_CHARS,
    MAX_TOOL_NAME_CHARS,
    SIGNATURE_CHARS,
    ToolCall,
    args_key,
    canonical_arguments,
    canonical_json,
    outcome_key,
    tool_name,
)
from otel_loopguard.config import DEFAULT_IGNORED_ARGS


def key(tool: object, arguments: object) -> str:
    return ToolCall.build(tool, arguments, session="s", ignored_args=DEFAULT_IGNORED_ARGS).args_key


def test_key_order_does_not_matter_at_any_depth() -> None:
    a = {"x": 1, "y": {"b": [1, {"d": 2, "c": 3}], "a": None}}
    b = {"y": {"a": None, "b": [1, {"c": 3, "d": 2}]}, "x": 1}
    assert key("t", a) == key("t", b)


def test_list_order_matters() -> None:
    assert key("t", {"x": [1, 2]}) != key("t", {"x": [2, 1]})


def test_json_string_arguments_are_parsed_first() -> None:
    assert key("t", '{"b": 2, "a": 1}') == key("t", {"a": 1, "b": 2})


def test_unparsable_string_is_compared_raw() -> None:
    assert key("t", "{not json") == key("t", "{not json")
    assert key("t", "{not json") != key("t", "{not json ")
    assert canonical_arguments("{not json") == "{not json"


def test_ignored_args_are_stripped_at_the_top_level_only() -> None:
    assert key("bash", {"command": "ls", "description": "one"}) == key(
        "bash", {"command": "ls", "description": "two"}
    )
    assert key("t", {"inner": {"description": "one"}}) != key("t", {"inner": {"description": "2"}})


def test_tool_name_is_part_of_the_key() -> None:
    assert key("a", {"x": 1}) != key("b", {"x": 1})
    # the separator keeps ("ab", "c...") and ("a", "bc...") apart
    assert args_key("ab", b'"c"') != args_key("a", b'b"c"')


def test_key_is_128_bits_and_signature_is_a_prefix() -> None:
    call = ToolCall.build("t", {"x": 1}, session="s")
    assert len(call.args_key) == 32 and int(call.args_key, 16) >= 0
    assert call.signature == call.args_key[:SIGNATURE_CHARS]
    assert len(call.signature) == 12


def test_nan_and_infinities_stay_distinct_from_null() -> None:
    assert key("t", {"x": math.nan}) != key("t", {"x": None})
    assert key("t", {"x": math.inf}) != key("t", {"x": -math.inf})
    assert key("t", {"x": math.nan}) == key("t", {"x": float("nan")})


def test_non_string_tool_names_are_bounded_strings() -> None:
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("never called")

    assert tool_name(42) == "42"
    assert tool_name(None) == ""
    assert tool_name(Hostile()) == "<Hostile>"
    assert tool_name(b"bash") == "bash"
    assert len(tool_name("x" * 10_000)) == MAX_TOOL_NAME_CHARS


def test_unsupported_values_take_the_bounded_slow_path() -> None:
    weird = {1: {2, 3}, "big": 2**100, "obj": object(), "bytes": b"\xff"}
    data = canonical_json(canonical_arguments(weird))
    assert b'"1":[2,3]' in data and b'"1267650600228229401496703205376"' in data
    assert key("t", {"s": {3, 2, 1}}) == key("t", {"s": {1, 2, 3}})


def test_deep_nesting_is_cut_and_costs_little() -> None:
    deep: object = "leaf"
    for _ in range(10_000):
        deep = [deep]
    started = time.perf_counter()
    data = canonical_json(canonical_arguments({"a": deep}))
    assert time.perf_counter() - started < 2
    assert data.count(b"[") <= MAX_DEPTH + 1
    text = "[" * 100_000 + "]" * 100_000
    assert canonical_arguments(text) == text  # too deep to parse: compared raw


def test_huge_strings_are_not_parsed_but_still_distinguished() -> None:
    big = '{"a": "' + "x" * (10 * 1024 * 1024) + '"}'
    assert len(big) > MAX_PARSE_CHARS
    assert canonical_arguments(big) == big
    assert key("t", big) != key("t", big[:-3] + 'y"}')


def test_outcome_key_normalises_results() -> None:
    assert outcome_key('{"b": 1, "a": 2}', False) == outcome_key({"a": 2, "b": 1}, False)
    assert outcome_key("same", False) != outcome_key("same", True)
    assert outcome_key(None, False) is None
    assert outcome_key(None, None) is None
    assert outcome_key(None, True) is not None
    # an arbitrary object has no comparable value: unknown, not "equal to every other object"
    assert outcome_key(object(), False) is None


@pytest.mark.parametrize("value", ["42", "true", " null"])
def test_scalar_looking_strings_stay_strings(value: str) -> None:
    assert canonical_arguments(value) == value


def test_a_cosmetic_field_is_kept_when_it_is_the_only_argument() -> None:
    ignored = frozenset({"thought", "description"})
    assert canonical_arguments({"thought": "plan A"}, ignored) == {"thought": "plan A"}
    assert canonical_arguments({"thought": "a", "path": "x"}, ignored) == {"path": "x"}
    assert canonical_arguments({"thought": "a", "description": "b"}, ignored) == {
        "thought": "a",
        "description": "b",
    }
