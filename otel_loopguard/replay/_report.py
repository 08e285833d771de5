"""The report: one ``--json`` line per call, or the text report per session and in total;
with ``--summary``, one line (text or JSON) per session. A session whose input reported model
usage also shows what it spent (:func:`spend_lines`, :func:`spend_json`): tokens, cost and its
source, spend in loops, and the estimate of what a stop avoided; the others show nothing more."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import orjson

from ._replayer import SessionReport

if TYPE_CHECKING:
    from otel_loopguard._policy import Decision
    from otel_loopguard._spend import Spend


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
    if report.spend is not None:
        lines.extend(f"  {line}" for line in spend_lines(report.spend))
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
    spend = ""
    if report.spend is not None:
        spent = report.spend
        cost = _cost_text(spent.provider_usd, spent.computed_usd, spent.unpriced_calls, spent.calls)
        spend = f"; spend {spent.tokens:,} tokens{cost}"
        if spent.loop_turns:
            spend += f", in loops {spent.loop_tokens:,} tokens{_loop_cost(spent)}"
    return (
        f"session {report.label}: {plural(report.calls, 'call')}, {report.repeated} repeated;"
        f" decisions: {trips}{'; ' + firsts if firsts else ''}; {saved}{spend}\n"
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
    if report.spend is not None:
        line["spend"] = spend_json(report.spend)
    return orjson.dumps(line).decode() + "\n"


# -- what model calls spent -------------------------------------------------------------------


def usd(amount: float) -> str:
    """``$3.40``; ``$0.0092`` below a cent (four decimals: a turn's cost stays visible)."""
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.4f}"


def cost_source(provider_usd: float, computed_usd: float) -> str | None:
    """Where a known cost came from: ``provider`` (reported by it), ``computed`` (at API
    prices), ``mixed``; ``None`` when no call had a price."""
    if provider_usd and computed_usd:
        return "mixed"
    if provider_usd:
        return "provider"
    if computed_usd:
        return "computed"
    return None


def _cost_text(provider_usd: float, computed_usd: float, unpriced: int, calls: int) -> str:
    """``, about $3.40 at API prices``, ``, $3.40 reported by the provider``, ..., with the
    calls nobody knows the price of; empty when no call had a price."""
    source = cost_source(provider_usd, computed_usd)
    total = provider_usd + computed_usd
    if source == "provider":
        text = f", {usd(total)} reported by the provider"
    elif source == "computed":
        text = f", about {usd(total)} at API prices"
    elif source == "mixed":
        text = (
            f", {usd(total)} ({usd(provider_usd)} reported by the provider, about"
            f" {usd(computed_usd)} at API prices)"
        )
    elif calls and unpriced == calls:
        return f", cost unknown ({plural(unpriced, 'model call')} without a price)"
    else:
        text = ", $0.00"
    if unpriced:
        text += f" ({plural(unpriced, 'model call')} without a price)"
    return text


def _loop_cost(spend: Spend) -> str:
    """`` , $1.20`` of the loop spend, when some of the cost is known."""
    return f", {usd(spend.loop_usd)}" if spend.cost_usd or spend.loop_usd else ""


def spend_lines(spend: Spend) -> list[str]:
    """A session's spend in the text report: its model calls, tokens and cost (with where the
    cost came from), then, when some turns were spent in loops, that share and what a stop
    avoided (labelled an estimate)."""
    lines = [
        f"spend: {plural(spend.calls, 'model call')}, {spend.tokens:,} tokens"
        f" ({spend.input_tokens:,} input, {spend.cache_read_tokens:,} of them cache reads"
        f"{f' and {spend.cache_write_tokens:,} cache writes' if spend.cache_write_tokens else ''};"
        f" {spend.output_tokens:,} output)"
        + _cost_text(spend.provider_usd, spend.computed_usd, spend.unpriced_calls, spend.calls)
    ]
    if spend.loop_turns:
        share = f" ({spend.loop_usd / spend.cost_usd:.0%} of the cost)" if spend.cost_usd else ""
        line = (
            f"in loops: {plural(spend.loop_turns, 'turn')}, {spend.loop_tokens:,} tokens"
            f"{_loop_cost(spend)}{share}"
        )
        tokens, avoided = spend.avoided()
        if tokens:
            line += (
                f"; a stop avoided about {tokens:,} tokens{', ' + usd(avoided) if avoided else ''}"
                f" (an estimate: the loop's mean per turn x"
                f" {plural(spend.refused_after_stop, 'call')} refused after the stop)"
            )
        lines.append(line)
    return lines


def spend_json(spend: Spend) -> dict[str, object]:
    """A session's spend in the JSON output: ``model_calls``, ``tokens`` (``input_tokens``,
    with the cached ones, ``output_tokens``, ``cache_read_tokens``, ``cache_write_tokens``),
    ``cost_usd`` (the known cost; ``null`` when no call had a price), ``cost_source``
    (``provider``, ``computed`` at API prices, ``mixed``, ``null``), ``provider_usd``,
    ``computed_usd``, ``unpriced_calls``; ``loop`` (``turns``, ``tokens``, ``cost_usd``) and
    ``avoided_estimate`` (``tokens``, ``cost_usd``, ``refused_calls``: an estimate)."""
    source = cost_source(spend.provider_usd, spend.computed_usd)
    tokens, avoided = spend.avoided()
    return {
        "model_calls": spend.calls,
        "tokens": spend.tokens,
        "input_tokens": spend.input_tokens,
        "output_tokens": spend.output_tokens,
        "cache_read_tokens": spend.cache_read_tokens,
        "cache_write_tokens": spend.cache_write_tokens,
        "cost_usd": None if source is None and spend.unpriced_calls else spend.cost_usd,
        "cost_source": source,
        "provider_usd": spend.provider_usd,
        "computed_usd": spend.computed_usd,
        "unpriced_calls": spend.unpriced_calls,
        "loop": {
            "turns": spend.loop_turns,
            "tokens": spend.loop_tokens,
            "cost_usd": spend.loop_usd,
        },
        "avoided_estimate": {
            "tokens": tokens,
            "cost_usd": avoided,
            "refused_calls": spend.refused_after_stop,
        },
    }


def format_spend_totals(reports: Sequence[SessionReport]) -> str:
    """The closing line of what every session's model calls spent; empty when no input
    reported usage."""
    spends = [r.spend for r in reports if r.spend is not None]
    if not spends:
        return ""
    calls = sum(s.calls for s in spends)
    tokens = sum(s.tokens for s in spends)
    provider = sum(s.provider_usd for s in spends)
    computed = sum(s.computed_usd for s in spends)
    unpriced = sum(s.unpriced_calls for s in spends)
    loop_tokens = sum(s.loop_tokens for s in spends)
    loop_usd = sum(s.loop_usd for s in spends)
    avoided = [s.avoided() for s in spends]
    line = (
        f"spend: {plural(calls, 'model call')}, {tokens:,} tokens"
        f"{_cost_text(provider, computed, unpriced, calls)}; in loops {loop_tokens:,} tokens"
        f"{', ' + usd(loop_usd) if provider or computed else ''}"
    )
    avoided_tokens = sum(a[0] for a in avoided)
    if avoided_tokens:
        avoided_usd = sum(a[1] for a in avoided)
        line += (
            f"; stops avoided about {avoided_tokens:,} tokens"
            f"{', ' + usd(avoided_usd) if avoided_usd else ''} (an estimate)"
        )
    return line + "\n"
