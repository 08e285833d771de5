"""The report: one ``--json`` line per call, or the text report per session and in total;
with ``--summary``, one line (text or JSON) per session."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import orjson

from ._replayer import SessionReport

if TYPE_CHECKING:
    from otel_loopguard._policy import Decision


def _json_line(report: SessionReport, index: int, tool: str, decision: Decision) -> str:
    """One ``--json`` line. ``rule`` is null for an allowed call (no rule acted, even when
    evidence is building up); ``count`` is the decision's evidence count (0 for a new call).
    A decision made after the call ran is a second line for the same ``index`` with
    ``"phase": "post"``; a pre-call line carries no phase. In the observe and advise modes a
    line whose action the mode softened also has ``detected``, what the ladder reached (e.g.
    ``"action": "remind", "detected": "stop"``), and ``rule`` and ``count`` are of that."""
    action = decision.action.value
    detected = decision.detected.value
    acted = (action != "allow" or detected != "allow") and decision.rule is not None
    rule = decision.rule.value if acted and decision.rule is not None else None
    line: dict[str, object] = {
        "session": report.label,
        "index": index,
        "tool": tool,
        "action": decision.action.value,
        "rule": rule,
        "count": decision.count,
    }
    if detected != "allow" and detected != action:
        line["detected"] = detected
    if decision.phase.value == "post":
        line["phase"] = "post"
    return orjson.dumps(line).decode() + "\n"


def plural(count: int, noun: str) -> str:
    """``1 call``, ``2 calls``: a count and its noun, pluralised with an ``s``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _seconds(report_seconds: float, timed: int, blocked: int) -> str:
    if blocked == 0 or timed == 0:
        return ""
    if timed == blocked:
        return f" ({report_seconds:,.1f} s)"
    return f" (at least {report_seconds:,.1f} s; {blocked - timed} without a duration)"


def _action_text(action: str, detected: str) -> str:
    """``remind``, or ``remind (detected: stop)`` when the mode softened what was detected."""
    return action if detected == action else f"{action} (detected: {detected})"


def format_session(report: SessionReport) -> str:
    """The text report of one session: its decisions, then a summary line."""
    lines = [f"session {report.label}"]
    if report.decisions:
        tool_width = min(30, max(4, *(len(d.tool) for d in report.decisions)))
        actions = [_action_text(d.action, d.detected) for d in report.decisions]
        action_width = max(7, *(len(a) for a in actions))
        lines.append(
            f"  {'call':>6}  {'tool':<{tool_width}}  {'rule':<11}  {'action':<{action_width}}"
            "  count"
        )
        for d, action in zip(report.decisions, actions):
            tool = d.tool if len(d.tool) <= tool_width else d.tool[: tool_width - 1] + "…"
            lines.append(
                f"  {d.index:>6}  {tool:<{tool_width}}  {d.rule or '-':<11}"
                f"  {action:<{action_width}}  {d.count:>5}"
            )
        hidden = report.decision_count - len(report.decisions)
        if hidden > 0:
            lines.append(f"  … and {plural(hidden, 'more decision')} not listed")
    firsts = ", ".join(
        f"first {action} #{report.first_index[action]}"
        if action in report.first_index
        else f"no {action}"
        for action in ("remind", "deny", "stop")
    )
    saved = (
        f"a deny would have saved {plural(report.blocked, 'call')}"
        f"{_seconds(report.blocked_seconds, report.blocked_timed, report.blocked)}"
    )
    lines.append(f"  {plural(report.calls, 'call')}, {report.repeated} repeated; {firsts}; {saved}")
    return "\n".join(lines) + "\n"


def format_totals(reports: Sequence[SessionReport], files: int, bad_lines: int) -> str:
    """The closing line of a text report."""
    calls = sum(r.calls for r in reports)
    repeated = sum(r.repeated for r in reports)
    blocked = sum(r.blocked for r in reports)
    seconds = sum(r.blocked_seconds for r in reports)
    timed = sum(r.blocked_timed for r in reports)
    tripped = sum(1 for r in reports if r.decision_count)
    return (
        f"total: {plural(files, 'file')}, {plural(len(reports), 'session')} ({tripped} with"
        f" decisions), {plural(calls, 'call')}, {repeated} repeated; a deny would have saved"
        f" {plural(blocked, 'call')}{_seconds(seconds, timed, blocked)};"
        f" {plural(bad_lines, 'bad line')}\n"
    )


#: Non-allow actions, weakest first, with the word the report uses.
ACTION_WORDS: Final = (
    ("remind", "reminder"),
    ("deny", "denial"),
    ("rescue", "rescue"),
    ("stop", "stop"),
)


def actions_text(actions: dict[str, int]) -> str:
    """``2 reminders, 1 stop``, or ``none``."""
    parts = [plural(actions[action], word) for action, word in ACTION_WORDS if actions.get(action)]
    return ", ".join(parts) if parts else "none"


def format_session_summary(report: SessionReport) -> str:
    """One ``--summary`` line: a session's totals and trips (what the guard did; what was
    detected too when the mode softened it)."""
    trips = actions_text(report.actions)
    if report.detected != report.actions:
        trips += f" (detected: {actions_text(report.detected)})"
    firsts = ", ".join(
        f"first {action} #{report.first_index[action]}"
        for action in ("remind", "deny", "stop")
        if action in report.first_index
    )
    saved = (
        f"a deny would have saved {plural(report.blocked, 'call')}"
        f"{_seconds(report.blocked_seconds, report.blocked_timed, report.blocked)}"
    )
    return (
        f"session {report.label}: {plural(report.calls, 'call')}, {report.repeated} repeated;"
        f" decisions: {trips}{'; ' + firsts if firsts else ''}; {saved}\n"
    )


def summary_json_line(report: SessionReport) -> str:
    """One ``--summary --json`` line: ``{"session", "calls", "repeated", "actions",
    "detected", "first", "saved_calls", "saved_seconds"}``; ``actions`` and ``detected`` count
    the non-allow decisions by action (equal in the enforce mode), ``first`` is the index of
    the first remind, deny and stop, ``saved_seconds`` null when no blocked call had a
    duration."""
    line = {
        "session": report.label,
        "calls": report.calls,
        "repeated": report.repeated,
        "actions": {a: report.actions[a] for a, _ in ACTION_WORDS if a in report.actions},
        "detected": {a: report.detected[a] for a, _ in ACTION_WORDS if a in report.detected},
        "first": dict(sorted(report.first_index.items(), key=lambda item: item[1])),
        "saved_calls": report.blocked,
        "saved_seconds": round(report.blocked_seconds, 3) if report.blocked_timed else None,
    }
    return orjson.dumps(line).decode() + "\n"
