"""Model calls' usage: which spans are model calls (:data:`MODEL_SPAN_KEYS`,
:func:`may_be_model_span`) and what they cost (:func:`model_call_from_span`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

from ._decoders import (
    _conversation_id,
    _first_text,
    _is_mapping,
)
from ._keys import (
    GEN_AI_AGENT_ID,
    GEN_AI_AGENT_NAME,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_SYSTEM,
    GEN_AI_USAGE_CACHE_READ_TOKENS,
    GEN_AI_USAGE_CACHE_WRITE_TOKENS,
    GEN_AI_USAGE_COST_AMOUNT,
    GEN_AI_USAGE_COST_CURRENCY,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    OPENINFERENCE_AGENT_NAME,
    OPENINFERENCE_LLM_KIND,
    OPENINFERENCE_MODEL_NAME,
    OPENINFERENCE_PROVIDER,
    OPENINFERENCE_SPAN_KIND,
    OPENINFERENCE_SYSTEM,
    OPENINFERENCE_TOKENS_CACHE_READ,
    OPENINFERENCE_TOKENS_CACHE_WRITE,
    OPENINFERENCE_TOKENS_COMPLETION,
    OPENINFERENCE_TOKENS_PROMPT,
    TRACELOOP_SPAN_KIND,
    USAGE_AGGREGATE_KINDS,
    USAGE_AGGREGATE_OPERATIONS,
)
from ._results import SpanModelCall

# -- model calls' usage ------------------------------------------------------------------------
# A model-call span is one that carries token counts of its own call: GenAI semantic-conventions
# usage (gen_ai.usage.input_tokens / output_tokens, or the older prompt_tokens /
# completion_tokens) on a span that is not an agent, workflow or tool span (Strands' and the
# Vercel AI SDK's agent-level spans sum their model calls' usage, so reading them would count
# every token twice), or an OpenInference LLM span with llm.token_count.*.

_INPUT, _PROMPT = GEN_AI_USAGE_INPUT_TOKENS
_OUTPUT, _COMPLETION = GEN_AI_USAGE_OUTPUT_TOKENS
_WHOLE: Final = re.compile(r"[0-9]{1,12}")
#: The attributes of which one marks a span that may be a model call (``may_be_model_span``
#: tests them by hand, for speed; serve's protobuf gate keeps a span that carries one).
MODEL_SPAN_KEYS: Final = (
    _INPUT,
    _OUTPUT,
    OPENINFERENCE_TOKENS_PROMPT,
    _PROMPT,
    OPENINFERENCE_TOKENS_COMPLETION,
)


def may_be_model_span(attributes: Mapping[str, object]) -> bool:
    """Whether a span that is no tool span may be a model call (it carries one of
    :data:`MODEL_SPAN_KEYS`): a few dict lookups, for every span the application ends."""
    return (
        _INPUT in attributes
        or _OUTPUT in attributes
        or OPENINFERENCE_TOKENS_PROMPT in attributes
        or _PROMPT in attributes
        or OPENINFERENCE_TOKENS_COMPLETION in attributes
    )


def _count(attributes: Mapping[str, object], keys: Sequence[str]) -> object:
    """The first of ``keys`` present, as a whole number when it reads as one (OTLP JSON sends
    integers as text), else the raw value; 0 when none is present."""
    for key in keys:
        value = attributes.get(key)
        if value is None:
            continue
        if isinstance(value, str) and _WHOLE.fullmatch(value.strip()):
            return int(value)
        return value
    return 0


def _cost(attributes: Mapping[str, object]) -> object:
    amount = attributes.get(GEN_AI_USAGE_COST_AMOUNT)
    if amount is None:
        return None
    currency = attributes.get(GEN_AI_USAGE_COST_CURRENCY)
    if currency is not None and str(currency).strip().upper() != "USD":
        return None  # another currency: not a figure in dollars; the tokens are priced instead
    if isinstance(amount, str):
        try:
            return float(amount)
        except ValueError:
            return amount
    return amount


def model_call_from_span(name: str, attributes: Mapping[str, object]) -> SpanModelCall | None:
    """The model call a span reports with its usage, or ``None`` (not a model call, or a span
    that sums its children's usage). Never raises."""
    try:
        if not _is_mapping(attributes) or not may_be_model_span(attributes):
            return None
        kind = attributes.get(OPENINFERENCE_SPAN_KIND)
        if kind == OPENINFERENCE_LLM_KIND and (
            OPENINFERENCE_TOKENS_PROMPT in attributes
            or OPENINFERENCE_TOKENS_COMPLETION in attributes
        ):
            return SpanModelCall(
                _first_text(attributes, (OPENINFERENCE_MODEL_NAME, GEN_AI_RESPONSE_MODEL)),
                _first_text(
                    attributes, (OPENINFERENCE_PROVIDER, OPENINFERENCE_SYSTEM, GEN_AI_SYSTEM)
                ),
                _count(attributes, (OPENINFERENCE_TOKENS_PROMPT,)),
                _count(attributes, (OPENINFERENCE_TOKENS_COMPLETION,)),
                _count(attributes, (OPENINFERENCE_TOKENS_CACHE_READ,)),
                _count(attributes, (OPENINFERENCE_TOKENS_CACHE_WRITE,)),
                _cost(attributes),
                _first_text(attributes, (GEN_AI_AGENT_ID,)),
                _first_text(attributes, (GEN_AI_AGENT_NAME, OPENINFERENCE_AGENT_NAME)),
                _conversation_id(attributes),
                "openinference",
            )
        if kind in USAGE_AGGREGATE_KINDS or attributes.get(TRACELOOP_SPAN_KIND) in (
            USAGE_AGGREGATE_KINDS
        ):
            return None
        if attributes.get(GEN_AI_OPERATION_NAME) in USAGE_AGGREGATE_OPERATIONS:
            return None
        if not (_INPUT in attributes or _OUTPUT in attributes or _PROMPT in attributes):
            return None
        return SpanModelCall(
            _first_text(attributes, (GEN_AI_RESPONSE_MODEL, GEN_AI_REQUEST_MODEL)),
            _first_text(attributes, (GEN_AI_PROVIDER_NAME, GEN_AI_SYSTEM)),
            _count(attributes, GEN_AI_USAGE_INPUT_TOKENS),
            _count(attributes, GEN_AI_USAGE_OUTPUT_TOKENS),
            _count(attributes, GEN_AI_USAGE_CACHE_READ_TOKENS),
            _count(attributes, GEN_AI_USAGE_CACHE_WRITE_TOKENS),
            _cost(attributes),
            _first_text(attributes, (GEN_AI_AGENT_ID,)),
            _first_text(attributes, (GEN_AI_AGENT_NAME,)),
            _conversation_id(attributes),
            "genai",
        )
    except Exception:  # the package's contract: never raise on span data
        return None
