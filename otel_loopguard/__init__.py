"""otel-loopguard: catch AI agents stuck repeating tool calls, from their OpenTelemetry traces.

The public API is listed in ``__all__``; everything else is internal.
"""

from __future__ import annotations

from .config import PRESETS, Mode, Policy, Rule, load_policy
from .guard import LoopGuard
from .policy import (
    Action,
    AdviceRequest,
    Advisor,
    AdvisorError,
    CommandAdvisor,
    Decision,
    LoopDetected,
)

__all__ = [
    "Action",
    "AdviceRequest",
    "Advisor",
    "AdvisorError",
    "CommandAdvisor",
    "Decision",
    "LoopDetected",
    "LoopGuard",
    "Mode",
    "PRESETS",
    "Policy",
    "Rule",
    "__version__",
    "load_policy",
]

__version__ = "0.1.0"
