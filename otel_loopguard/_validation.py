"""How a policy field's value is checked: each field declares its :class:`Kind` once, and
:func:`check_value` validates and normalises a value by it, raising ``ValueError`` naming the
field and the value. Cross-field rules are :class:`~otel_loopguard._settings.Policy`'s own."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any, Final

from ._defaults import DETECTION_RULES, STORE_SCHEMES, Rule, redact_url
from ._prices import Price


class Kind(Enum):
    """What a policy field holds: how it is validated, read from TOML and from the environment.
    Each field declares its kind once, in its metadata; everything else derives from it."""

    CHOICE = "choice"  # a member of the Enum in the field's metadata ("choices")
    RULES = "rules"  # a set of Rule
    THRESHOLDS = "thresholds"  # sorted distinct integers >= 2
    THRESHOLD = "threshold"  # an integer >= minimum
    OPTIONAL_THRESHOLD = "optional threshold"  # an integer >= minimum, or None (off)
    COUNT = "count"  # an integer >= 1
    BUDGET = "budget"  # an integer >= 0
    SECONDS = "seconds"  # a finite number >= 0
    POSITIVE_SECONDS = "positive seconds"  # a finite number > 0
    PATTERNS = "patterns"  # tool-name patterns (* wildcard)
    REGEXES = "regexes"  # regular expressions that must compile
    NAMES = "names"  # a set of strings
    COMMAND = "command"  # a command line, or None
    PATH = "path"  # a non-empty file path, or None (a leading ~ is expanded where it is used)
    TEXT = "text"  # a non-empty string, or None
    URL = "url"  # a Redis URL (a scheme of STORE_SCHEMES), or None
    FLAG = "flag"  # true or false
    MONEY = "money"  # US dollars: a finite number > 0, or None (off)
    TOKENS = "tokens"  # a count of tokens: an integer >= 1, or None (off)
    PRICES = "prices"  # model name or * pattern -> Price (USD per million tokens of each kind)
    MEMORY = "memory"  # true, false, or where: a non-empty file path or a Redis URL


OPTIONAL_KINDS: Final = frozenset(
    {Kind.OPTIONAL_THRESHOLD, Kind.COMMAND, Kind.PATH, Kind.TEXT, Kind.URL, Kind.MONEY, Kind.TOKENS}
)
LIST_KINDS: Final = frozenset({Kind.THRESHOLDS, Kind.PATTERNS, Kind.REGEXES})
SET_KINDS: Final = frozenset({Kind.RULES, Kind.NAMES})


def check_value(name: str, value: object, metadata: Mapping[str, Any]) -> Any:
    """Validate one field value by its kind; return it normalised (the same object when
    nothing changes). Raises ``ValueError`` naming ``name`` and the value."""
    kind: Kind = metadata["kind"]
    if kind in OPTIONAL_KINDS and value is None:
        return value
    if kind is Kind.CHOICE:
        return _enum(metadata["choices"], name, value)
    if kind in _COLLECTION_KINDS:
        return _valid_collection(kind, name, value, metadata["minimum"])
    if kind is Kind.PRICES:
        return price_table(name, value)
    _check_single(kind, name, value, metadata["minimum"])
    return value


_COLLECTION_KINDS: Final = frozenset(
    {Kind.RULES, Kind.THRESHOLDS, Kind.PATTERNS, Kind.REGEXES, Kind.NAMES}
)


def _valid_collection(kind: Kind, name: str, value: object, minimum: int) -> Any:
    """:func:`check_value` for a kind of :data:`_COLLECTION_KINDS`: a tuple or set, normalised."""
    if kind is Kind.RULES:
        rules = frozenset(_enum(Rule, name, item) for item in as_tuple(name, value))
        if not rules <= DETECTION_RULES:
            raise ValueError(
                f"{name}: budget is not a rule to list here: it applies whenever a budget"
                " (max_loop_cost_usd, max_loop_tokens, max_run_cost_usd, max_run_tokens) is set"
            )
        return rules
    if kind is Kind.THRESHOLDS:
        items = as_tuple(name, value)
        for item in items:
            _threshold(name, item, minimum)
        if len(set(items)) != len(items):
            raise ValueError(f"{name}: duplicate thresholds in {list(items)!r}")
        return tuple(sorted(items))
    if kind is Kind.PATTERNS:
        # Literal apart from *, tool-name patterns always compile.
        return _str_tuple(name, value)
    if kind is Kind.REGEXES:
        patterns = _str_tuple(name, value)
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{name}: pattern {pattern!r} does not compile: {exc}") from None
        return patterns
    return frozenset(_str_tuple(name, value))  # Kind.NAMES


def _check_single(kind: Kind, name: str, value: object, minimum: int) -> None:
    """:func:`check_value` for a single value (a number, a string, a flag): kept as given."""
    if kind in (Kind.THRESHOLD, Kind.OPTIONAL_THRESHOLD):
        _threshold(name, value, minimum)
    elif kind is Kind.COUNT:
        _positive_int(name, value)
    elif kind is Kind.BUDGET:
        _non_negative_int(name, value)
    elif kind is Kind.SECONDS:
        _non_negative_float(name, value)
    elif kind is Kind.POSITIVE_SECONDS:
        _positive_float(name, value)
    elif kind is Kind.COMMAND:
        if not isinstance(value, str):
            raise ValueError(f"{name}: expected a string, got {value!r}")
    elif kind in (Kind.PATH, Kind.TEXT):
        if not isinstance(value, str) or not value:
            what = "a file path" if kind is Kind.PATH else "a non-empty string"
            raise ValueError(f"{name}: expected {what}, got {value!r}")
    elif kind is Kind.URL:
        if not isinstance(value, str) or value.partition("://")[0].lower() not in STORE_SCHEMES:
            shown = redact_url(value) if isinstance(value, str) else value
            raise ValueError(
                f"{name}: expected a redis://, rediss:// or unix:// URL, got {shown!r}"
            )
    elif kind is Kind.FLAG and not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    elif kind in (Kind.MONEY, Kind.TOKENS):
        _budget(kind, name, value)
    elif kind is Kind.MEMORY and not (
        isinstance(value, bool) or (isinstance(value, str) and value)
    ):
        raise ValueError(f"{name}: expected true, false, a file path or a Redis URL, got {value!r}")


def _budget(kind: Kind, name: str, value: object) -> None:
    if kind is Kind.TOKENS:
        _positive_int(name, value)
    elif _number(name, value) <= 0:
        raise ValueError(f"{name}: expected US dollars, a number > 0, got {value!r}")


def price_table(name: str, value: object) -> tuple[tuple[str, Price], ...]:
    """A price table (model name or ``*`` pattern -> :class:`~otel_loopguard._prices.Price`,
    or its mapping of ``input``, ``output``, ``cache_read``, ``cache_write`` in USD per million
    tokens) as (pattern, price) pairs in the table's order (the first match wins); ``ValueError``
    naming the entry and its field."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (tuple, list)) and all(
        isinstance(item, (tuple, list)) and len(item) == 2 for item in value
    ):
        items = [(pattern, price) for pattern, price in value]
    else:
        raise ValueError(
            f"{name}: expected a table of model name or pattern -> prices, got {value!r}"
        )
    table = []
    for pattern, price in items:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"{name}: expected model names or patterns, got {pattern!r}")
        try:
            table.append((pattern, Price.of(pattern, price)))
        except ValueError as exc:
            if name == "prices":
                raise
            raise ValueError(f"{name}: {exc}") from None
    return tuple(table)


def _enum(kind: type[Enum], name: str, value: object) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in kind)
        raise ValueError(f"{name}: {value!r} is not one of {choices}") from None


def as_tuple(name: str, value: object) -> tuple[Any, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{name}: expected a list, got {value!r}")
    return tuple(value)


def _str_tuple(name: str, value: object) -> tuple[str, ...]:
    items = as_tuple(name, value)
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{name}: expected strings, got {item!r}")
    return items


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _threshold(name: str, value: object, minimum: int = 2) -> None:
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        raise ValueError(f"{name}: thresholds must be integers >= {minimum}, got {value!r}")


def _positive_int(name: str, value: object) -> None:
    if not _is_int(value) or value < 1:  # type: ignore[operator]
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def _non_negative_int(name: str, value: object) -> None:
    if not _is_int(value) or value < 0:  # type: ignore[operator]
        raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


def _non_negative_float(name: str, value: object) -> None:
    if _number(name, value) < 0:
        raise ValueError(f"{name}: expected a number >= 0, got {value!r}")


def _positive_float(name: str, value: object) -> None:
    if _number(name, value) <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {value!r}")
