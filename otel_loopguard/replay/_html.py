"""The ``replay --html`` report: one self-contained HTML file with a timeline per session.

Self-contained: one inline style sheet, no scripts, no images, nothing fetched. Everything that
comes from the input (session ids, tool names, arguments) is escaped. Bounded: timelines are kept
for the first :data:`MAX_HTML_SESSIONS` sessions, :data:`MAX_HTML_CALLS` calls each (the replayer
keeps no more, see :class:`~otel_loopguard.replay.Timeline`); the session index lists at most
:data:`MAX_HTML_INDEX_ROWS` sessions. The file says where it was cut.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from ._replayer import SessionReport, Timeline, TimelineCall
from ._report import format_totals, plural

if TYPE_CHECKING:
    from otel_loopguard.config import Policy

#: Sessions drawn with a timeline; later sessions are only listed in the index.
MAX_HTML_SESSIONS: Final = 100
#: Calls drawn per session; later calls are only counted.
MAX_HTML_CALLS: Final = 1_000
#: Sessions listed in the index at the top.
MAX_HTML_INDEX_ROWS: Final = 2_000
#: Calls per timeline row.
CALLS_PER_ROW: Final = 50

#: Non-allow actions, strongest last, with the word the report uses.
_ACTIONS: Final = (
    ("remind", "reminder"),
    ("deny", "denial"),
    ("rescue", "rescue"),
    ("stop", "stop"),
)

_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

_STYLE: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fff}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.6em 0 .3em;word-break:break-all}
table{border-collapse:collapse;margin:.4em 0}td,th{padding:2px 8px;text-align:left;
border-bottom:1px solid #e4e4e4;vertical-align:top}th{background:#f4f4f4}
td.n,th.n{text-align:right}code{font:12px/1.3 ui-monospace,monospace;word-break:break-all}
.note{color:#7a4d00;background:#fff6e0;padding:4px 8px;border-left:3px solid #f0b400}
.muted{color:#777}.legend span{margin-right:1.2em;white-space:nowrap}
.tl{margin:.5em 0}.row{display:flex;align-items:flex-end;margin:0 0 3px}
.ri{width:4em;font:11px ui-monospace,monospace;color:#777;text-align:right;margin-right:6px}
.c{position:relative;display:inline-block;width:12px;height:24px;margin-right:1px}
.c b{position:absolute;left:0;top:0;width:12px;height:16px;background:hsl(var(--h),62%,58%)}
.c.u b{background:#d4d4d4}
.c.rep b::after{content:"";position:absolute;left:4px;top:6px;width:4px;height:4px;
border-radius:50%;background:#fff}
.m{position:absolute;left:0;bottom:0;width:12px;height:6px}
.m.remind{background:#f0b400}.m.deny{background:#d62728}.m.rescue{background:#9467bd}
.m.stop{background:#000;height:8px}
.m.seen{background:none;border:1px dashed #d62728;box-sizing:border-box}
.ep{display:inline-block;width:3px;height:24px;background:#1f77b4;margin:0 3px 0 2px}
.ep.run{background:#17becf}
.sw{display:inline-block;width:12px;height:12px;vertical-align:middle}
"""


def _text(value: object) -> str:
    """Input text made safe for HTML content and attribute values alike."""
    return html.escape(_CONTROL.sub("\ufffd", str(value)), quote=True)


def _hue(signature: str) -> int:
    """A stable colour (hue in degrees) per call signature."""
    try:
        return int(signature[:6], 16) % 360
    except ValueError:
        return 0


def _seconds(report: SessionReport) -> str:
    if report.blocked == 0 or report.blocked_timed == 0:
        return ""
    if report.blocked_timed == report.blocked:
        return f" ({report.blocked_seconds:,.1f} s)"
    return (
        f" (at least {report.blocked_seconds:,.1f} s;"
        f" {report.blocked - report.blocked_timed} without a duration)"
    )


def _call_cell(call: TimelineCall) -> str:
    title = f"#{call.index} {call.tool}"
    if call.signature:
        title += f" [{call.signature}]"
    else:
        title += " (untracked)"
    if call.repeated:
        title += ", repeated"
    if call.action != "allow":
        title += f": {call.action} ({call.rule or '-'}, count {call.count})"
    elif call.detected != "allow":
        title += f": allowed by the mode, detected {call.detected} ({call.rule or '-'},"
        title += f" count {call.count})"
    classes = ["c"]
    if not call.signature:
        classes.append("u")
    if call.repeated:
        classes.append("rep")
    style = f' style="--h:{_hue(call.signature)}"' if call.signature else ""
    if call.action != "allow":
        marker = f'<i class="m {call.action}"></i>'
    elif call.detected != "allow":
        marker = '<i class="m seen"></i>'
    else:
        marker = ""
    return f'<span class="{" ".join(classes)}"{style} title="{_text(title)}"><b></b>{marker}</span>'


def _timeline(timeline: Timeline) -> str:
    marks: dict[int, list[str]] = {}
    for mark in timeline.marks:
        marks.setdefault(mark.before_index, []).append(mark.kind)
    rows: list[str] = []
    cells: list[str] = []
    row_start = 1
    for call in timeline.calls:
        if cells and (call.index - row_start) >= CALLS_PER_ROW:
            rows.append(_row(row_start, cells))
            cells = []
            row_start = call.index
        for kind in marks.pop(call.index, ()):
            extra = " run" if kind == "new run" else ""
            cells.append(
                f'<span class="ep{extra}" title="{_text(kind)}: a new progress epoch"></span>'
            )
        cells.append(_call_cell(call))
    for before_index in sorted(marks):  # after the last call drawn
        for kind in marks[before_index]:
            extra = " run" if kind == "new run" else ""
            cells.append(
                f'<span class="ep{extra}" title="{_text(kind)}: a new progress epoch"></span>'
            )
    if cells:
        rows.append(_row(row_start, cells))
    return f'<div class="tl">{"".join(rows)}</div>'


def _row(start: int, cells: list[str]) -> str:
    return f'<div class="row"><span class="ri">{start}</span>{"".join(cells)}</div>'


def _actions_text(actions: dict[str, int]) -> str:
    parts = [plural(actions[action], word) for action, word in _ACTIONS if actions.get(action)]
    return ", ".join(parts) if parts else "none"


def _summary(report: SessionReport) -> str:
    firsts = ", ".join(
        f"first {action} at call {report.first_index[action]}"
        if action in report.first_index
        else f"no {action}"
        for action in ("remind", "deny", "stop")
    )
    return (
        f"<p>{plural(report.calls, 'call')}, {report.repeated} repeated; decisions:"
        f" {_actions_text(report.actions)}; {firsts}.<br>"
        f"A deny would have saved <strong>{plural(report.blocked, 'call')}"
        f"{_seconds(report)}</strong>.</p>"
    )


def _signatures(timeline: Timeline, open_: bool) -> str:
    if not timeline.signatures:
        return ""
    ordered = sorted(timeline.signatures.items(), key=lambda item: -item[1].calls)
    rows = []
    for signature, summary in ordered:
        rows.append(
            f'<tr><td><span class="sw" style="background:hsl({_hue(signature)},62%,58%)">'
            f"</span> <code>{_text(signature)}</code></td><td>{_text(summary.tool)}</td>"
            f'<td><code>{_text(summary.preview)}</code></td><td class="n">{summary.calls}</td>'
            f'<td class="n">{summary.repeated}</td><td>{_actions_text(summary.actions)}</td></tr>'
        )
    other = ""
    if timeline.other_signature_calls:
        other = (
            f'<p class="muted">{plural(timeline.other_signature_calls, "more call")} of'
            " further signatures not described.</p>"
        )
    return (
        f"<details{' open' if open_ else ''}><summary>Calls by signature</summary><table><tr>"
        "<th>signature</th>"
        '<th>tool</th><th>arguments</th><th class="n">calls</th><th class="n">repeated</th>'
        f"<th>decisions</th></tr>{''.join(rows)}</table>{other}</details>"
    )


def _session(number: int, report: SessionReport) -> str:
    timeline = report.timeline
    assert timeline is not None
    parts = [
        f'<section class="session" id="s{number}" data-session="{_text(report.label)}">',
        f"<h2>session {_text(report.label)}</h2>",
        _summary(report),
        _timeline(timeline),
    ]
    if timeline.calls_dropped:
        first = timeline.max_calls + 1
        parts.append(
            f'<p class="note">Timeline cut: calls {first} to {report.calls} not drawn'
            f" ({plural(timeline.decisions_dropped, 'decision')} among them; the text report"
            " lists them).</p>"
        )
    parts.append(_signatures(timeline, report.decision_count > 0))
    parts.append("</section>")
    return "".join(parts)


def _index(reports: Sequence[SessionReport], anchors: dict[int, int]) -> str:
    rows = []
    for position, report in enumerate(reports[:MAX_HTML_INDEX_ROWS]):
        label = _text(report.label)
        number = anchors.get(position)
        name = f'<a href="#s{number}">{label}</a>' if number is not None else label
        counts = "".join(
            f'<td class="n">{report.actions.get(action, 0)}</td>' for action, _ in _ACTIONS
        )
        rows.append(
            f'<tr><td>{name}</td><td class="n">{report.calls}</td>'
            f'<td class="n">{report.repeated}</td>{counts}<td class="n">{report.blocked}</td>'
            f'<td class="n">{report.blocked_seconds:,.1f}</td></tr>'
        )
    head = "".join(f'<th class="n">{word}s</th>' for _, word in _ACTIONS)
    cut = ""
    if len(reports) > MAX_HTML_INDEX_ROWS:
        cut = (
            '<p class="note">Index cut: '
            f"{plural(len(reports) - MAX_HTML_INDEX_ROWS, 'more session')}"
            " not listed (the text report lists every session).</p>"
        )
    return (
        '<table class="index"><tr><th>session</th><th class="n">calls</th>'
        f'<th class="n">repeated</th>{head}<th class="n">calls saved</th>'
        f'<th class="n">seconds saved</th></tr>{"".join(rows)}</table>{cut}'
    )


def _policy(policy: Policy) -> str:
    fields = (
        "mode",
        "remind_thresholds",
        "no_progress_threshold",
        "deny_threshold",
        "rescue_threshold",
        "poll_limit",
        "stop_after_denials",
        "stall_threshold",
        "window_size",
    )
    items = []
    for name in fields:
        value = getattr(policy, name)
        if isinstance(value, tuple):
            shown = ", ".join(str(v) for v in value) or "none"
        elif value is None:
            shown = "none"
        else:
            shown = str(getattr(value, "value", value))
        items.append(f"<code>{name}</code> {_text(shown)}")
    rules = ", ".join(sorted(rule.value for rule in policy.rules))
    items.append(f"<code>rules</code> {_text(rules)}")
    return "<p>Policy: " + "; ".join(items) + ".</p>"


_LEGEND: Final = (
    '<p class="legend"><span><span class="sw" style="background:hsl(200,62%,58%)"></span>'
    " a call (colour: its signature, tool and arguments)</span>"
    '<span><span class="sw" style="background:#d4d4d4"></span> untracked</span>'
    "<span>&#9679; on a call: repeated</span>"
    '<span><span class="sw" style="background:#f0b400"></span> remind</span>'
    '<span><span class="sw" style="background:#d62728"></span> deny</span>'
    '<span><span class="sw" style="background:#9467bd"></span> rescue</span>'
    '<span><span class="sw" style="background:#000"></span> stop</span>'
    '<span><span class="sw" style="border:1px dashed #d62728;box-sizing:border-box"></span>'
    " detected, allowed by the mode</span>"
    '<span><span class="sw" style="background:#1f77b4;width:3px"></span> user message</span>'
    '<span><span class="sw" style="background:#17becf;width:3px"></span> new run</span>'
    '</p><p class="muted">Hover a call for its index, tool, signature and decision. Epochs'
    " started by a mutating call are not marked.</p>"
)


def render_html(
    reports: Sequence[SessionReport], *, inputs: Sequence[str], policy: Policy, bad_lines: int
) -> str:
    """The whole HTML report of a replay: policy, totals, a session index, then a timeline per
    session that kept one (:attr:`SessionReport.timeline`)."""
    anchors: dict[int, int] = {}
    sections: list[str] = []
    for position, report in enumerate(reports):
        if report.timeline is not None:
            anchors[position] = len(sections) + 1
            sections.append(_session(len(sections) + 1, report))
    undrawn = len(reports) - len(sections)
    cut = ""
    if undrawn:
        cut = (
            f'<p class="note">Timelines cut: the first {plural(len(sections), "session")}'
            f" are drawn, {plural(undrawn, 'more session')} only listed in the index.</p>"
        )
    names = ", ".join(_text("<stdin>" if name == "-" else name) for name in inputs)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>otel-loopguard replay</title><style>{_STYLE}</style></head><body>"
        "<h1>otel-loopguard replay</h1>"
        f"<p>Input: {names}.</p>{_policy(policy)}"
        f"<p>{_text(format_totals(reports, len(inputs), bad_lines).strip())}</p>"
        f"{_LEGEND}{cut}{_index(reports, anchors)}{''.join(sections)}"
        "</body></html>\n"
    )
