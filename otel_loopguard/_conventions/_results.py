"""What the conventions give for a span: a :class:`SpanToolCall`, a :class:`SpanAgent`, a
:class:`SpanModelCall`, and the :data:`MISSING` sentinel for arguments a span does not carry.

The three are read-only by convention, not frozen dataclasses: every tool, agent and model span
makes one, and a frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field) cost
about 2 µs for nine fields, several times a plain slotted one (issue 29). They compare and hash
by value as before (``unsafe_hash``); nothing assigns to them after they are made."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final


class Missing(enum.Enum):
    """Type of :data:`MISSING`; an enum so the sentinel is a typed singleton that pickles."""

    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = Missing.MISSING
"""``SpanToolCall.arguments`` when the span carries no arguments at all (content capture off,
or not yet set). Distinct from ``{}``, which is a real call without arguments."""


@dataclass(slots=True, unsafe_hash=True)
class SpanToolCall:
    """One tool call recognised in a span.

    ``arguments`` is the decoded arguments (a dict normally; a bare scalar or list when the
    instrumentation gives no parameter names; :data:`MISSING` when the span carries none).
    ``result`` is the decoded result, ``None`` when unknown. ``is_error`` is ``None`` when the
    span says nothing either way. ``agent_id``/``agent_name`` are only what the tool span itself
    carries; the caller falls back to the nearest ancestor agent span. ``convention`` names the
    :data:`TOOL_CONVENTIONS` entry that matched.
    """

    tool: str
    arguments: object
    result: object
    is_error: bool | None
    call_id: str | None
    agent_id: str | None
    agent_name: str | None
    conversation_id: str | None
    convention: str


@dataclass(slots=True, unsafe_hash=True)
class SpanAgent:
    """An agent-run span (``invoke_agent``, OpenInference AGENT, OpenLLMetry agent/workflow).

    Both identity fields may be ``None``: the span still marks the start of an agent run.
    """

    agent_id: str | None
    agent_name: str | None
    conversation_id: str | None


@dataclass(slots=True, unsafe_hash=True)
class SpanModelCall:
    """One model call's usage as a span reports it, not yet checked: the token counts are
    whole numbers when the span's values read as such, else the raw values (the caller checks
    them, :meth:`otel_loopguard._prices.ModelUsage.checked`). ``input_tokens`` includes the
    cache reads and writes (GenAI and OpenInference both count them in). ``reported_cost_usd``:
    the provider's own cost (``gen_ai.usage.cost.amount`` in USD), else ``None``.
    ``agent_id``/``agent_name``/``conversation_id``: only what the model span itself carries
    (as for :class:`SpanToolCall`). ``convention``: ``"genai"`` or ``"openinference"``."""

    model: str | None
    provider: str | None
    input_tokens: object
    output_tokens: object
    cache_read_tokens: object
    cache_write_tokens: object
    reported_cost_usd: object
    agent_id: str | None
    agent_name: str | None
    conversation_id: str | None
    convention: str
