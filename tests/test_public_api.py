"""The public API is exactly what __all__ says (a change here is a release note)."""

from __future__ import annotations

import otel_loopguard


def test_all_is_pinned_and_sorted() -> None:
    assert otel_loopguard.__all__ == [
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
    assert otel_loopguard.__all__ == sorted(otel_loopguard.__all__)


def test_every_name_in_all_exists() -> None:
    for name in otel_loopguard.__all__:
        assert hasattr(otel_loopguard, name), name


def test_enum_values_are_the_wire_strings() -> None:
    assert [a.value for a in otel_loopguard.Action] == ["allow", "remind", "deny", "rescue", "stop"]
    assert [r.value for r in otel_loopguard.Rule] == [
        "consecutive",
        "window",
        "no_progress",
        "stall",
        "budget",
        "memory",
    ]
    assert [m.value for m in otel_loopguard.Mode] == ["observe", "advise", "enforce"]
    assert [m.value for m in otel_loopguard.AdvisorInput] == ["argv", "stdin_json"]


def test_import_stays_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, otel_loopguard; "
        "print(any(m.startswith('opentelemetry.sdk') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    from otel_loopguard import LoopGuardSpanExporter, LoopGuardSpanProcessor

    assert LoopGuardSpanProcessor.__name__ == "LoopGuardSpanProcessor"
    assert LoopGuardSpanExporter.__name__ == "LoopGuardSpanExporter"
