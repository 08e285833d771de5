"""Recognise tool calls and agents in spans, whichever instrumentation made them.

This package turns the fields of one span (name, attributes, events, error status) into a
:class:`SpanToolCall` or a :class:`SpanAgent`, or ``None`` for every other span. It is pure and
data-driven: stdlib and orjson only, no OpenTelemetry import, so the in-process span processor,
the OTLP receiver and the replay reader all share it.

How a span is read is a table, :data:`TOOL_CONVENTIONS` (and :data:`AGENT_CONVENTIONS`): each
entry says how to recognise one instrumentation's tool span (:class:`Condition`) and which
attributes or events carry the tool name, arguments, result and call id, plus the small "shape"
function that unwraps that instrumentation's encoding. Adding an instrumentation is one table
entry and one test. The first entry whose conditions all hold wins, so specific entries come
before the generic GenAI semantic-conventions ones.

Contract shared by every public function here:

* It never raises, whatever the value types (non-str values, bytes, huge strings, deeply nested
  or invalid JSON, NaN). Anything it cannot read is treated as absent or kept raw.
* It never mutates its inputs and keeps no state, so it may be called concurrently from any
  thread, including the application's threads through ``SpanProcessor.on_start``/``on_end``.
* Deciding that a span is *not* a tool span costs a few dict lookups (see
  :func:`tool_call_from_span`), because it runs for every span the application ends. The first
  condition of every entry is its *gate*; :func:`may_be_tool_span` is the tool table's gates
  alone, derived from the table once, for callers that skip a span before reading it.

Normalisation goal: the same call made through different instrumentations gives the same decoded
arguments (``search(query="weather in Paris")`` -> ``{"query": "weather in Paris"}``) and, where
the instrumentation allows, the same decoded result (``"results for ..."`` whether it arrived as
a plain string, a JSON string, Strands text blocks, a LangChain ``ToolMessage`` or ADK's
``{"result": ...}`` wrapper).

Layout (private modules; imports point one way, each only to those above it):

* ``_keys``: attribute keys, event names and marker values, each declared once;
* ``_results``: :class:`SpanToolCall`, :class:`SpanAgent`, :data:`MISSING`;
* ``_decoders``: JSON and identifier decoding, event look-ups, :func:`conversation_id`, and
  the per-instrumentation shapes that unwrap arguments and results;
* ``_tables``: :class:`Condition`, the entry types and the tables themselves;
* ``_requested``: the tool calls a model span's response requests, and its text (issue 27);
* ``_dispatch``: the tables compiled for the hot path (gates indexed once, at import), and the
  tool table's gate (:func:`may_be_tool_span`);
* ``_readers``: the public readers of tool and agent spans built on them;
* ``_usage``: model calls' usage (:func:`may_be_model_span`, :func:`model_call_from_span`);
* ``_gates``: :func:`may_matter_at_end`, the one cheap check that a span ending cannot matter.

Names with a leading underscore are shared between those modules, not part of this API.
"""

from ._decoders import MAX_DECODE_CHARS, conversation_id, decode_json
from ._dispatch import may_be_tool_span
from ._gates import END_GATE_KEYS, may_matter_at_end
from ._readers import agent_from_span, arguments_available_at_start, tool_call_from_span
from ._requested import (
    ANONYMOUS_TOOL_SPANS,
    REQUEST_GATE_KEYS,
    Requested,
    RequestedCall,
    may_request_calls,
    requested_from_span,
)
from ._results import MISSING, Missing, SpanAgent, SpanModelCall, SpanToolCall
from ._tables import (
    AGENT_CONVENTIONS,
    ARGUMENTS_AT_START_CONVENTIONS,
    TOOL_CONVENTIONS,
    AgentConvention,
    Condition,
    ToolConvention,
)

# Importable from here as before the split, though not in __all__: the vocabulary a table entry
# is written in (On and the Condition builders), which the OTLP receiver reads too.
from ._tables import On as On
from ._tables import attribute_is as attribute_is
from ._tables import attribute_present as attribute_present
from ._tables import has_event as has_event
from ._tables import span_name_is as span_name_is
from ._tables import span_name_starts as span_name_starts
from ._usage import MODEL_SPAN_KEYS, may_be_model_span, model_call_from_span

__all__ = [
    "AGENT_CONVENTIONS",
    "ANONYMOUS_TOOL_SPANS",
    "ARGUMENTS_AT_START_CONVENTIONS",
    "END_GATE_KEYS",
    "MAX_DECODE_CHARS",
    "MISSING",
    "REQUEST_GATE_KEYS",
    "TOOL_CONVENTIONS",
    "AgentConvention",
    "Condition",
    "Missing",
    "Requested",
    "RequestedCall",
    "SpanAgent",
    "SpanModelCall",
    "SpanToolCall",
    "ToolConvention",
    "agent_from_span",
    "arguments_available_at_start",
    "conversation_id",
    "decode_json",
    "MODEL_SPAN_KEYS",
    "may_be_model_span",
    "may_be_tool_span",
    "may_matter_at_end",
    "may_request_calls",
    "model_call_from_span",
    "requested_from_span",
    "tool_call_from_span",
]
