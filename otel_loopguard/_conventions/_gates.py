"""One cheap check, derived from the tables, that a span ending now cannot matter.

Most spans an application ends are neither tool, model nor agent spans (HTTP, database, a chat
span without usage yet). The span processor asks :func:`may_matter_at_end` before any other
work: ``False`` means that every reader run at a span's end answers nothing for it, so the
processor returns at once. It is a superset of the readers' own gates (a ``True`` costs nothing
but the exact tests that follow), derived here from the same tables and key lists, never
written twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ._dispatch import _TOOLS
from ._keys import GEN_AI_OPERATION_NAME
from ._requested import REQUEST_GATE_KEYS
from ._usage import MODEL_SPAN_KEYS

__all__ = [
    "END_GATE_KEYS",
    "END_GATE_OPERATIONS",
    "may_matter_at_end",
    "name_may_matter_at_end",
]

#: Tool-gate keys tested by value rather than by presence: present on every GenAI span (model
#: and agent spans too), so their presence alone would open the check for most of them.
_BY_VALUE: Final = (GEN_AI_OPERATION_NAME,)

#: Every attribute key whose mere presence may make a span matter at its end: the keys of the
#: tool table's attribute gates (but :data:`_BY_VALUE`), a model call's usage
#: (:data:`MODEL_SPAN_KEYS`) and a model response's requested calls (:data:`REQUEST_GATE_KEYS`).
END_GATE_KEYS: Final = frozenset(
    {key for key, _ in _TOOLS.attribute_gates if key not in _BY_VALUE}
    | set(MODEL_SPAN_KEYS)
    | REQUEST_GATE_KEYS
)

_GATES: Final = dict(_TOOLS.attribute_gates)
#: The values of :data:`_BY_VALUE`'s key (``gen_ai.operation.name``) that open the tool gate.
END_GATE_OPERATIONS: Final = frozenset(_GATES.get(GEN_AI_OPERATION_NAME, {}))
_NAMES: Final = frozenset(_TOOLS.name_bits)
_PREFIXES: Final = _TOOLS.prefixes


def name_may_matter_at_end(name: str) -> bool:
    """The name's part of :func:`may_matter_at_end`: whether ``name`` passes a tool name gate
    (a whole name or a prefix). A ``str`` only."""
    return name in _NAMES or name.startswith(_PREFIXES)


def may_matter_at_end(name: str, attributes: Mapping[str, object]) -> bool:
    """Whether a span ending with ``name`` and ``attributes`` may be a tool span
    (:func:`~._dispatch.may_be_tool_span`), a model call (:func:`~._usage.may_be_model_span`)
    or carry requested calls (:func:`~._requested.may_request_calls`). ``False`` only when none
    of them can be true: the span's name passes no tool name gate, no key of
    :data:`END_GATE_KEYS` is present and its operation is not a tool's. Any thread; never
    raises (a name or attributes of another type answer ``True``: the exact tests decide)."""
    try:
        if not END_GATE_KEYS.isdisjoint(attributes):  # iterates the span's keys, in C
            return True
        operation = attributes.get(GEN_AI_OPERATION_NAME)
        if operation is not None and (
            operation.__class__ is not str or operation in END_GATE_OPERATIONS
        ):
            return True
        return name_may_matter_at_end(name)
    except Exception:  # not a str name, not a mapping: let the exact gates answer
        return True
