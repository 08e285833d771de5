"""What a model call cost (issue 24, item 2): the provider's figure, else the user's table, else
genai-prices' bundled snapshot; unpriced models counted, never given a made-up cost."""

from __future__ import annotations

import logging
import math
from decimal import Decimal

import pytest
from genai_prices import Usage, calc_price
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_loopguard._prices import (
    COMPUTED,
    MAX_TOKENS_PER_CALL,
    PROVIDER,
    UNPRICED,
    Cost,
    ModelUsage,
    Pricer,
)

#: Two model turns of the corpus (mini-swe-agent with Gemini 3 Pro Preview through OpenRouter):
#: tokens as recorded, and the cost OpenRouter reported for each.
CORPUS_TURNS = [
    ({"input_tokens": 2704, "output_tokens": 314}, 0.009176),
    ({"input_tokens": 3631, "output_tokens": 407, "cache_read_tokens": 2050}, 0.008456),
]


@pytest.mark.parametrize(("tokens", "reported"), CORPUS_TURNS)
def test_a_router_model_name_is_priced_as_its_provider_prices_it(
    tokens: dict[str, int], reported: float
) -> None:
    cost = Pricer().cost(ModelUsage.checked("google/gemini-3-pro-preview", **tokens))
    assert cost.source == COMPUTED
    assert cost.usd == pytest.approx(reported, abs=1e-9)


def test_the_providers_reported_cost_wins() -> None:
    usage = ModelUsage.checked(
        "google/gemini-3-pro-preview", input_tokens=2704, output_tokens=314, reported_cost_usd=0.5
    )
    assert Pricer().cost(usage) == Cost(0.5, PROVIDER)


MODELS = [
    ("gemini-3-pro-preview", "gcp.gemini"),  # tiered: past 200k input tokens every token costs more
    ("claude-sonnet-4-5", "anthropic"),  # tiered, with its own cache write price
    ("gpt-4o-mini", "openai"),  # flat
    ("gpt-4.1", "openai"),
]


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    cache_read=st.integers(0, 300_000),
    cache_write=st.integers(0, 300_000),
    uncached=st.integers(0, 400_000),
    output=st.integers(0, 100_000),
)
def test_computed_costs_equal_the_databases_own(
    model: tuple[str, str], cache_read: int, cache_write: int, uncached: int, output: int
) -> None:
    """The rates read into floats give what genai-prices computes itself, tiers included."""
    name, provider = model
    usage = ModelUsage.checked(
        name,
        provider,
        input_tokens=uncached + cache_read + cache_write,
        output_tokens=output,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )
    ours = Pricer().cost(usage)
    theirs = calc_price(
        Usage(
            input_tokens=usage.input_tokens,
            output_tokens=output,
            cache_read_tokens=cache_read or None,
            cache_write_tokens=cache_write or None,
        ),
        model_ref=name,
    ).total_price
    assert ours.source == COMPUTED and ours.usd is not None
    assert math.isclose(ours.usd, float(theirs), rel_tol=1e-9, abs_tol=1e-12), (ours, theirs)
    assert isinstance(theirs, Decimal)


def test_the_users_table_wins_over_the_database_by_name_or_pattern() -> None:
    pricer = Pricer(
        {
            "gpt-4o-mini": {"input": 1.0, "output": 2.0},
            "my-*": {"input": 10, "output": 20, "cache_read": 1, "cache_write": 12.5},
        }
    )
    usage = ModelUsage.checked("GPT-4o-mini", input_tokens=1_000_000, output_tokens=1_000_000)
    assert pricer.cost(usage) == Cost(3.0, COMPUTED)
    mine = ModelUsage.checked(
        "my-model",
        input_tokens=4_000_000,
        output_tokens=0,
        cache_read_tokens=2_000_000,
        cache_write_tokens=1_000_000,
    )
    assert pricer.cost(mine) == Cost(10 + 2 + 12.5, COMPUTED)
    # cache prices left out: cache tokens at the input price
    plain = Pricer({"x": {"input": 2, "output": 0}}, database=False)
    assert plain.cost(
        ModelUsage.checked("x", input_tokens=3_000_000, cache_read_tokens=1_000_000)
    ) == Cost(6.0, COMPUTED)


def test_an_unpriced_model_counts_its_tokens_and_invents_no_cost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pricer = Pricer()
    usage = ModelUsage.checked("scripted-model-7", input_tokens=100, output_tokens=5)
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        assert pricer.cost(usage) == Cost(None, UNPRICED)
        assert pricer.cost(usage) == Cost(None, UNPRICED)
    assert pricer.unpriced == {"scripted-model-7": 2}
    lines = [r.getMessage() for r in caplog.records if "scripted-model-7" in r.getMessage()]
    assert len(lines) == 1 and "its tokens are counted, its cost is not" in lines[0]
    assert usage.tokens == 105
    assert Pricer().cost(ModelUsage.checked(None, input_tokens=1)) == Cost(None, UNPRICED)


def test_without_the_database_only_the_table_prices() -> None:
    usage = ModelUsage.checked("gpt-4o-mini", "openai", input_tokens=1000)
    assert Pricer(database=False).cost(usage) == Cost(None, UNPRICED)
    assert Pricer().cost(usage).source == COMPUTED


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"input_tokens": -1}, "input_tokens: expected 0 to"),
        ({"output_tokens": MAX_TOKENS_PER_CALL + 1}, "output_tokens: expected 0 to"),
        ({"input_tokens": "12"}, "input_tokens: expected a whole number"),
        ({"input_tokens": True}, "input_tokens: expected a whole number"),
        ({"input_tokens": 1.5}, "input_tokens: expected a whole number"),
        ({"input_tokens": 5, "cache_read_tokens": 6}, "more than input_tokens"),
        ({"reported_cost_usd": float("nan")}, "reported_cost_usd: expected a number >= 0"),
        ({"reported_cost_usd": -0.01}, "reported_cost_usd: expected a number >= 0"),
        ({"reported_cost_usd": "0.1"}, "reported_cost_usd: expected a number"),
    ],
)
def test_bad_usage_is_refused_naming_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelUsage.checked("m", **fields)


def test_whole_floats_are_token_counts() -> None:
    assert ModelUsage.checked("m", input_tokens=12.0).input_tokens == 12


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"m": {"input": -1, "output": 1}}, r"prices\['m'\]\.input: expected USD per million"),
        ({"m": {"input": 1}}, r"prices\['m'\]\.output: expected USD per million tokens, a number"),
        ({"m": {"input": "1", "output": 1}}, r"prices\['m'\]\.input"),
        ({"m": {"input": 1, "output": 1, "cache": 1}}, r"prices\['m'\]: unknown field\(s\) cache"),
        ({"m": 3}, r"prices\['m'\]: expected a table"),
        ({"m": {"input": float("inf"), "output": 1}}, r"prices\['m'\]\.input"),
    ],
)
def test_a_nonsense_price_table_is_refused_naming_the_entry(
    table: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Pricer(table)
    with pytest.raises(ValueError, match="prices: expected a table"):
        Pricer(["m"])  # type: ignore[arg-type]
