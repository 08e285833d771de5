"""ModelUsage.checked's fast path (issue 29 item 3: model spans in the processor's budget).

Plain ints in range with no reported cost are accepted at once; everything else takes the general
checks. Both must give the same usage, and the same errors as before."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_loopguard._prices import MAX_TOKENS_PER_CALL, ModelUsage

# Around every bound the checks test: 0, MAX_TOKENS_PER_CALL, and the cache-above-input one.
counts = st.one_of(
    st.integers(-3, 3),
    st.integers(MAX_TOKENS_PER_CALL - 3, MAX_TOKENS_PER_CALL + 3),
    st.integers(0, 5000),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([3.0, "12", None]),
)
models = st.one_of(st.none(), st.text(max_size=8), st.integers(0, 9))


def _general(model: object, provider: object, values: tuple[object, ...]) -> ModelUsage:
    """The same values through the general checks: a reported cost of 0 forces that path; the
    cost is then set back to None."""
    usage = ModelUsage.checked(
        model,
        provider,
        input_tokens=values[0],
        output_tokens=values[1],
        cache_read_tokens=values[2],
        cache_write_tokens=values[3],
        reported_cost_usd=0,
    )
    assert usage.reported_cost_usd == 0.0
    return replace(usage, reported_cost_usd=None)


@given(models, models, counts, counts, counts, counts)
def test_the_fast_path_gives_what_the_general_checks_give(
    model: object, provider: object, a: object, b: object, c: object, d: object
) -> None:
    values = (a, b, c, d)
    try:
        expected: ModelUsage | str = _general(model, provider, values)
    except ValueError as exc:
        expected = str(exc)
    try:
        got: ModelUsage | str = ModelUsage.checked(
            model,
            provider,
            input_tokens=a,
            output_tokens=b,
            cache_read_tokens=c,
            cache_write_tokens=d,
        )
    except ValueError as exc:
        got = str(exc)
    assert got == expected
    if isinstance(got, ModelUsage):
        assert type(got.input_tokens) is int and type(got.output_tokens) is int
        assert got.model is None or type(got.model) is str


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ((-1, 0, 0, 0), "input_tokens"),
        ((0, MAX_TOKENS_PER_CALL + 1, 0, 0), "output_tokens"),
        ((5, 0, -1, 0), "cache_read_tokens"),
        ((5, 0, 0, True), "cache_write_tokens"),
        ((5, 0, 3, 3), "cache_read_tokens + cache_write_tokens"),
        ((MAX_TOKENS_PER_CALL + 1, 0, 0, 0), "input_tokens"),
    ],
)
def test_values_the_fast_path_refuses_still_name_their_field(
    values: tuple[object, ...], field: str
) -> None:
    with pytest.raises(ValueError, match=f"^{field.replace('+', '[+]')}:"):
        ModelUsage.checked(
            "m",
            input_tokens=values[0],
            output_tokens=values[1],
            cache_read_tokens=values[2],
            cache_write_tokens=values[3],
        )


def test_plain_values_make_the_usage_they_name() -> None:
    usage = ModelUsage.checked("gpt-4o", "openai", input_tokens=1200, output_tokens=60)
    assert usage == ModelUsage("gpt-4o", "openai", 1200, 60, 0, 0, None)
    assert ModelUsage.checked(
        "m", input_tokens=10, cache_read_tokens=4, cache_write_tokens=6
    ) == ModelUsage("m", None, 10, 0, 4, 6)


def test_the_fast_path_makes_a_usage_like_any_other() -> None:
    """Made field by field through the slots: equal, hashed, shown and frozen as one the
    dataclass's own __init__ makes."""
    fast = ModelUsage.checked("gpt-4o", "openai", input_tokens=12, output_tokens=3)
    made = ModelUsage("gpt-4o", "openai", 12, 3)
    assert type(fast) is ModelUsage
    assert fast == made and hash(fast) == hash(made) and repr(fast) == repr(made)
    assert fast.tokens == 15 and fast.reported_cost_usd is None
    with pytest.raises(FrozenInstanceError):
        fast.model = "other"  # type: ignore[misc]
    assert replace(fast, model="m") == ModelUsage("m", "openai", 12, 3)


class Named(ModelUsage):
    """A subclass: made by its own constructor."""


def test_a_subclass_is_made_by_its_constructor() -> None:
    usage = Named.checked("m", input_tokens=1)
    assert type(usage) is Named and usage == Named("m", None, 1)
