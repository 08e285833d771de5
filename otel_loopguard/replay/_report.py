"""The report: one ``--json`` line per call, or the text report per session and in total."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import orjson

from ._replayer import SessionReport

if TYPE_CHECKING:
    from otel_loopguard.policy import Decision


def _json_line(report: SessionReport, index: int, tool: str, decision: Decision) -> str:
    """One ``--json`` line. ``rule`` is null for an allowed call (no rule acted, even when
    evidence is building up); ``count`` is the decision's evidence count (0 for a new call).
    A decision made after the call ran is a second line for the same ``index`` with
    ``"phase": "post"``; a pre-call line carries no phase."""
    acted = decision.action.value != "allow" and decision.rule is not None
    rule = decision.rule.value if acted and decision.rule is not None else None
    line = {
        "session": report.label,
        "index": index,
        "tool": tool,
        "action": decision.action.value,
        "rule": rule,
        "count": decision.count,
    }
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


def format_session(report: SessionReport) -> str:
    """The text report of one session: its decisions, then a summary line."""
    lines = [f"session {report.label}"]
    if report.decisions:
        tool_width = min(30, max(4, *(len(d.tool) for d in report.decisions)))
        lines.append(f"  {'call':>6}  {'tool':<{tool_width}}  {'rule':<11}  {'action':<7}  count")
        for d in report.decisions:
            tool = d.tool if len(d.tool) <= tool_width else d.tool[: tool_width - 1] + "…"
            lines.append(
                f"  {d.index:>6}  {tool:<{tool_width}}  {d.rule or '-':<11}  {d.action:<7}"
                f"  {d.count:>5}"
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
