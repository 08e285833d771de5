"""What a model call cost, in US dollars: the provider's own figure when it reported one, else
computed from the call's token counts at API prices.

Prices come from a user table first (model names or ``*`` patterns, USD per million tokens of
each kind), then from ``genai-prices`` (a maintained price database whose snapshot is bundled with
it and never fetched at run time; the ``cost`` extra installs it). A model neither knows is
*unpriced*: its tokens are counted, no cost is made up (``None``), and it is logged once.

Token counts follow the OpenTelemetry GenAI conventions: ``input_tokens`` includes the cache
reads and cache writes (``cache_read_tokens``, ``cache_write_tokens``), which are priced as the
provider prices them. A model name as a router reports it (``google/gemini-3-pro-preview`` from
OpenRouter) is looked up as its provider's model when the router's own catalogue lacks it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from ._defaults import wildcard_regex
from ._lazy import logger

__all__ = [
    "COMPUTED",
    "MAX_TOKENS_PER_CALL",
    "PROVIDER",
    "Cost",
    "ModelUsage",
    "Price",
    "Pricer",
    "UNPRICED",
]


#: Where a cost came from: the provider reported it, we computed it, or nobody knows the price.
PROVIDER: Final = "provider"
COMPUTED: Final = "computed"
UNPRICED: Final = "unpriced"
#: Token counts above this per model call are not believed (a bad attribute, not a real call).
MAX_TOKENS_PER_CALL: Final = 10**9
#: Model names whose lookup is remembered (hit or miss); beyond it, lookups are not cached.
_MAX_CACHED_MODELS: Final = 4096
#: GenAI ``gen_ai.provider.name`` / ``gen_ai.system`` values and OpenInference ``llm.provider``
#: values -> the provider ids of genai-prices.
_PROVIDERS: Final[Mapping[str, str]] = {
    "gcp.gemini": "google",
    "gcp.vertex_ai": "google",
    "gcp.gen_ai": "google",
    "gemini": "google",
    "vertex_ai": "google",
    "google": "google",
    "aws.bedrock": "aws",
    "azure.ai.openai": "azure",
    "azure.ai.inference": "azure",
    "azure": "azure",
    "openai": "openai",
    "anthropic": "anthropic",
    "mistral_ai": "mistral",
    "mistralai": "mistral",
    "mistral": "mistral",
    "groq": "groq",
    "deepseek": "deepseek",
    "x_ai": "x-ai",
    "xai": "x-ai",
    "perplexity": "perplexity",
    "cohere": "cohere",
    "openrouter": "openrouter",
}
#: The first part of a router's model name (``vendor/model``) -> a genai-prices provider id.
_VENDORS: Final[Mapping[str, str]] = {
    "google": "google",
    "anthropic": "anthropic",
    "openai": "openai",
    "mistralai": "mistral",
    "deepseek": "deepseek",
    "x-ai": "x-ai",
    "meta-llama": "groq",
    "cohere": "cohere",
}
#: genai-prices' ``ModelPrice`` fields, in :class:`Price`'s order.
_DATABASE_FIELDS: Final = ("input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok")
_KINDS: Final = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name}: expected a whole number of tokens, got {value!r}")
    if not 0 <= value <= MAX_TOKENS_PER_CALL:
        raise ValueError(f"{name}: expected 0 to {MAX_TOKENS_PER_CALL:,} tokens, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ModelUsage:
    """One model call's usage: its model and provider (as the telemetry names them), its token
    counts (``input_tokens`` including cache reads and writes), and the cost the provider
    reported for it, if any. Build with :meth:`checked` from untrusted values."""

    model: str | None
    provider: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reported_cost_usd: float | None = None

    @classmethod
    def checked(
        cls,
        model: object,
        provider: object = None,
        *,
        input_tokens: object = 0,
        output_tokens: object = 0,
        cache_read_tokens: object = 0,
        cache_write_tokens: object = 0,
        reported_cost_usd: object = None,
    ) -> ModelUsage:
        """The usage of these values; ``ValueError`` naming the field for a count that is not a
        whole number from 0 to :data:`MAX_TOKENS_PER_CALL`, cache counts above the input, or a
        reported cost that is not a finite number >= 0."""
        if (
            type(input_tokens) is int
            and type(output_tokens) is int
            and type(cache_read_tokens) is int
            and type(cache_write_tokens) is int
            and reported_cost_usd is None
            and 0 <= output_tokens <= MAX_TOKENS_PER_CALL
            and cache_read_tokens >= 0
            and cache_write_tokens >= 0
            and cache_read_tokens + cache_write_tokens <= input_tokens <= MAX_TOKENS_PER_CALL
        ):
            # The usual case (plain ints in range, no reported cost), checked at once: what the
            # general checks below accept unchanged, so the same usage.
            model = str(model) if model is not None else None
            provider = str(provider) if provider is not None else None
            if cls is not ModelUsage:
                return cls(
                    model,
                    provider,
                    input_tokens,
                    output_tokens,
                    cache_read_tokens,
                    cache_write_tokens,
                )
            # Made as the dataclass's __init__ makes it, each field set through its slot's
            # descriptor rather than object.__setattr__ (half the cost).
            usage = _new_object(cls)
            model_slot, provider_slot, input_slot, output_slot, read_slot, write_slot, cost_slot = (
                _USAGE_SLOTS
            )
            model_slot(usage, model)
            provider_slot(usage, provider)
            input_slot(usage, input_tokens)
            output_slot(usage, output_tokens)
            read_slot(usage, cache_read_tokens)
            write_slot(usage, cache_write_tokens)
            cost_slot(usage, None)
            return usage
        counts = {
            name: _count(name, value)
            for name, value in zip(
                _KINDS, (input_tokens, output_tokens, cache_read_tokens, cache_write_tokens)
            )
        }
        if counts["cache_read_tokens"] + counts["cache_write_tokens"] > counts["input_tokens"]:
            raise ValueError(
                "cache_read_tokens + cache_write_tokens: more than input_tokens"
                f" ({counts['cache_read_tokens']} + {counts['cache_write_tokens']}"
                f" > {counts['input_tokens']}); input tokens include the cached ones"
            )
        cost: float | None = None
        if reported_cost_usd is not None:
            if isinstance(reported_cost_usd, bool) or not isinstance(
                reported_cost_usd, (int, float)
            ):
                raise ValueError(f"reported_cost_usd: expected a number, got {reported_cost_usd!r}")
            cost = float(reported_cost_usd)
            if not (math.isfinite(cost) and cost >= 0):
                raise ValueError(f"reported_cost_usd: expected a number >= 0, got {cost!r}")
        return cls(
            model=str(model) if model is not None else None,
            provider=str(provider) if provider is not None else None,
            reported_cost_usd=cost,
            **counts,
        )

    @property
    def tokens(self) -> int:
        """Every token of the call: its input (cached ones included) and its output."""
        return self.input_tokens + self.output_tokens


_new_object: Final = object.__new__
#: The setters of :class:`ModelUsage`'s slots, in field order (:meth:`ModelUsage.checked`).
_USAGE_SLOTS: Final[tuple[Any, ...]] = tuple(
    ModelUsage.__dict__[field.name].__set__ for field in fields(ModelUsage)
)


def _per_million(name: str, value: object, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected USD per million tokens, a number, got {value!r}")
    number = float(value)
    if not (math.isfinite(number) and 0 <= number <= 1e6):
        raise ValueError(f"{name}: expected USD per million tokens from 0 to 1e6, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class Price:
    """A model's API prices, USD per million tokens. Cache reads and writes at their own
    prices when given, else at the input price."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None

    @classmethod
    def of(cls, model: str, value: object) -> Price:
        """A price table entry for ``model``: a :class:`Price`, or a mapping with ``input``,
        ``output`` and optionally ``cache_read`` and ``cache_write``; ``ValueError`` naming the
        model and the field otherwise."""
        if isinstance(value, Price):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(
                f"prices[{model!r}]: expected a table of input, output, cache_read, cache_write"
                f" (USD per million tokens), got {value!r}"
            )
        unknown = set(value) - {"input", "output", "cache_read", "cache_write"}
        if unknown:
            raise ValueError(f"prices[{model!r}]: unknown field(s) {', '.join(sorted(unknown))}")
        fields = {
            name: _per_million(f"prices[{model!r}].{name}", value.get(name), optional)
            for name, optional in (
                ("input", False),
                ("output", False),
                ("cache_read", True),
                ("cache_write", True),
            )
        }
        return cls(**fields)  # type: ignore[arg-type]

    def cost(self, usage: ModelUsage) -> float:
        cache_read = self.input if self.cache_read is None else self.cache_read
        cache_write = self.input if self.cache_write is None else self.cache_write
        uncached = usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens
        return (
            uncached * self.input
            + usage.cache_read_tokens * cache_read
            + usage.cache_write_tokens * cache_write
            + usage.output_tokens * self.output
        ) / 1e6


@dataclass(frozen=True, slots=True)
class Cost:
    """A model call's cost: ``usd`` (``None`` when unpriced) and where it came from
    (:data:`PROVIDER`, :data:`COMPUTED` at API prices, or :data:`UNPRICED`)."""

    usd: float | None
    source: str


class Pricer:
    """Prices model calls: the provider's reported cost, else the user's ``table`` (model name
    or ``*`` pattern -> :class:`Price` or its mapping; checked here, ``ValueError`` naming the
    bad entry), else genai-prices' bundled snapshot (unless ``database=False``, or when the
    ``cost`` extra is not installed: then only the table prices). Thread-safe; never raises
    from :meth:`cost`."""

    def __init__(self, table: Mapping[str, object] | None = None, *, database: bool = True) -> None:
        if table is not None and not isinstance(table, Mapping):
            raise ValueError(f"prices: expected a table of model -> prices, got {table!r}")
        self._table = [
            (wildcard_regex(str(pattern)), Price.of(str(pattern), value))
            for pattern, value in (table or {}).items()
        ]
        self._database = database
        self._lock = threading.Lock()
        self._found: dict[tuple[str, str | None], tuple[_DatabasePrice | None, Any] | None] = {}
        self.unpriced: dict[str, int] = {}
        #: Whether an unpriced model is logged (once); ``replay`` counts it in its report instead.
        self.log_unpriced = True

    def cost(self, usage: ModelUsage) -> Cost:
        """What ``usage`` cost, and the source of the figure."""
        if usage.reported_cost_usd is not None:
            return Cost(usage.reported_cost_usd, PROVIDER)
        model = usage.model
        if model:
            for pattern, price in self._table:
                if pattern.fullmatch(model):
                    return Cost(price.cost(usage), COMPUTED)
            try:
                usd = self._database_cost(model, usage)
            except Exception as exc:  # a database failure is an unpriced call, never an error
                logger().debug("genai-prices failed for %r: %s", model, exc)
                usd = None
            if usd is not None:
                return Cost(usd, COMPUTED)
        self._unpriced(model or "unknown")
        return Cost(None, UNPRICED)

    def _unpriced(self, model: str) -> None:
        with self._lock:
            seen = self.unpriced.get(model)
            if seen is None and len(self.unpriced) >= _MAX_CACHED_MODELS:
                return
            self.unpriced[model] = (seen or 0) + 1
        if seen is None and self.log_unpriced:
            logger().warning(
                "loopguard: no price for model %r: its tokens are counted, its cost is not"
                " (give it one in the policy's prices, or install otel-loopguard[cost])",
                model,
            )

    def _database_cost(self, model: str, usage: ModelUsage) -> float | None:
        found = self._lookup(model, usage)
        if found is None:
            return None
        rates, model_price = found
        if rates is not None and rates.covers(usage):
            return rates.cost(usage)  # float arithmetic: a few µs, not the database's 300
        from genai_prices import Usage

        tokens = Usage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens or None,
            cache_write_tokens=usage.cache_write_tokens or None,
        )
        return float(model_price.calc_price(tokens)["total_price"])

    def _lookup(self, model: str, usage: ModelUsage) -> tuple[_DatabasePrice | None, Any] | None:
        """(the model's rates read into floats, genai-prices' ``ModelPrice``), found once
        per (model, provider) and remembered; ``None`` for a model the database lacks."""
        key = (model, usage.provider)
        with self._lock:
            known = self._found.get(key, False)
        if known is not False:
            return known  # type: ignore[return-value]
        if not self._database:
            return None
        try:
            from genai_prices import Usage, calc_price
        except ImportError:
            self._database = False
            return None
        found = None
        for provider, name in _candidates(model, usage.provider):
            try:
                result = calc_price(Usage(input_tokens=0), model_ref=name, provider_id=provider)
            except LookupError:
                continue
            found = (_database_price(result.model_price), result.model_price)
            break
        with self._lock:
            if len(self._found) < _MAX_CACHED_MODELS:
                self._found[key] = found
        return found


#: A database price per million tokens: a number, or (base, ((start, price), ...)) when it
#: depends on the call's input tokens (genai-prices' "cliff" tiers: past a tier's start, every
#: token of that kind costs the tier's price).
_Rate = float | tuple[float, tuple[tuple[int, float], ...]]


class _DatabasePrice:
    """A genai-prices ``ModelPrice`` read once into floats: input, output, cache read and
    cache write rates (``None``: the database has none for that kind)."""

    __slots__ = ("rates",)

    def __init__(self, rates: tuple[_Rate | None, ...]) -> None:
        self.rates = rates

    def covers(self, usage: ModelUsage) -> bool:
        """Whether every kind ``usage`` has tokens of has a rate here (else the database
        itself computes, with its own rules for the missing one)."""
        _, _, cache_read, cache_write = self.rates
        return (usage.cache_read_tokens == 0 or cache_read is not None) and (
            usage.cache_write_tokens == 0 or cache_write is not None
        )

    def cost(self, usage: ModelUsage) -> float:
        tokens = usage.input_tokens
        counts = (
            tokens - usage.cache_read_tokens - usage.cache_write_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
        )
        total = 0.0
        for count, rate in zip(counts, self.rates):
            if not count or rate is None:
                continue
            if isinstance(rate, tuple):
                base, tiers = rate
                for start, tier in reversed(tiers):
                    if tokens > start:
                        base = tier
                        break
                rate = base
            total += count * rate
        return total / 1e6


def _database_price(model_price: Any) -> _DatabasePrice | None:
    """``model_price``'s rates as floats; ``None`` when input or output has none, or a value is
    of a kind this does not know (the database then computes every call)."""
    from decimal import Decimal

    rates: list[_Rate | None] = []
    for name in _DATABASE_FIELDS:
        value = getattr(model_price, name, None)
        if value is None or isinstance(value, Decimal):
            rates.append(None if value is None else float(value))
            continue
        base, tiers = getattr(value, "base", None), getattr(value, "tiers", None)
        if not isinstance(base, Decimal) or not isinstance(tiers, list):
            return None
        rates.append((float(base), tuple((int(tier.start), float(tier.price)) for tier in tiers)))
    if rates[0] is None or rates[1] is None:
        return None
    return _DatabasePrice(tuple(rates))


def _candidates(model: str, provider: str | None) -> list[tuple[str | None, str]]:
    """(provider id, model name) to try in order: as named, the router's vendor prefix as the
    provider, then the name alone (genai-prices matches it across providers)."""
    named = _PROVIDERS.get(provider.lower()) if provider else None
    tries: list[tuple[str | None, str]] = []
    if named is not None:
        tries.append((named, model))
    vendor, slash, rest = model.partition("/")
    if slash and rest:
        tries.append((_VENDORS.get(vendor.lower(), vendor.lower()), rest))
        tries.append((None, rest))
    tries.append((None, model))
    return tries
