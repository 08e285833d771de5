"""otel-loopguard: catch AI agents stuck repeating tool calls, from their OpenTelemetry traces.

The public API is listed in ``__all__`` (pinned by ``tests/test_exported_members.py``); the
modules are listed in CONTRIBUTING.md, and those named ``_x`` are internal.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from ._lazy import lazy_names as _lazy_names

if _TYPE_CHECKING:
    from ._advice import AdviceRequest, Advisor, AdvisorError, CallRecord, CommandAdvisor
    from ._enforce import enforce
    from ._guard import LoopGuard
    from ._policy import Action, Decision, LoopDetected, Phase
    from .config import PRESETS, AdvisorInput, Mode, Policy, Rule, load_policy
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

# Every public name is imported on first use (PEP 562), so that importing a submodule (the
# command hook imports `otel_loopguard.cli`, a process per tool call) does not import the guard,
# the advisor or the SDK-backed span processor and exporter with the package.
_LAZY = {
    "Action": "_policy",
    "AdviceRequest": "_advice",
    "Advisor": "_advice",
    "AdvisorError": "_advice",
    "AdvisorInput": "config",
    "CallRecord": "_advice",
    "CommandAdvisor": "_advice",
    "Decision": "_policy",
    "LoopDetected": "_policy",
    "LoopGuard": "_guard",
    "LoopGuardSpanExporter": "exporter",
    "LoopGuardSpanProcessor": "processor",
    "Mode": "config",
    "PRESETS": "config",
    "Phase": "_policy",
    "Policy": "config",
    "Rule": "config",
    "current_decision": "processor",
    "enforce": "_enforce",
    "load_policy": "config",
}

__getattr__, __dir__ = _lazy_names(__name__, __name__, _LAZY, globals(), __all__)


__version__ = "0.1.0"
