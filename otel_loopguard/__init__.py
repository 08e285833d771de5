"""otel-loopguard: catch AI agents stuck repeating tool calls, from their OpenTelemetry traces.

The public API is listed in ``__all__`` (pinned by ``tests/test_exported_members.py``); the
modules are listed in CONTRIBUTING.md, and those named ``_x`` are internal.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._advice import AdviceRequest, Advisor, AdvisorError, CallRecord, CommandAdvisor
from ._guard import LoopGuard
from ._policy import Action, Decision, LoopDetected, Phase
from .config import PRESETS, AdvisorInput, Mode, Policy, Rule, load_policy

if _TYPE_CHECKING:
    from ._enforce import enforce
    from .exporter import LoopGuardSpanExporter
    from .processor import LoopGuardSpanProcessor, current_decision

__all__ = [
    "Action",
    "AdviceRequest",
    "Advisor",
    "AdvisorError",
    "AdvisorInput",
    "CallRecord",
    "CommandAdvisor",
    "Decision",
    "LoopDetected",
    "LoopGuard",
    "LoopGuardSpanExporter",
    "LoopGuardSpanProcessor",
    "Mode",
    "PRESETS",
    "Phase",
    "Policy",
    "Rule",
    "__version__",
    "current_decision",
    "enforce",
    "load_policy",
]

# The span processor and exporter need opentelemetry-sdk (enforce reads the processor's
# decisions); they are imported on first use so that
# `import otel_loopguard` stays light for command hooks that start a process per call.
_LAZY = {
    "LoopGuardSpanExporter": "exporter",
    "LoopGuardSpanProcessor": "processor",
    "current_decision": "processor",
    "enforce": "_enforce",
}


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'otel_loopguard' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"
