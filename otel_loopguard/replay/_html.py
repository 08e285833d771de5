"""The ``replay --html`` report: one self-contained HTML file with a timeline per session.

Self-contained: one inline style sheet and one inline script, no images, nothing fetched.
Everything that comes from the input (session ids, tool names, arguments) is escaped, and only
ever reaches the script as attribute text it shows with ``textContent``. The session index is
sorted worst first (by the strongest action detected, then how often) and sorts by any column
(its headers are buttons). A call where something was detected is a button (``role``,
``tabindex``, ``aria-expanded``): a click, Enter or Space shows its detail (applied and detected
action, rule, count, threshold) below the timeline; other calls have it as hover text only.
Bounded: timelines are kept
for the :data:`MAX_HTML_SESSIONS` worst sessions (see :class:`~otel_loopguard.replay.Replayer`),
:data:`MAX_HTML_CALLS` calls each (the replayer keeps no more, see
:class:`~otel_loopguard.replay.Timeline`); the session index lists at most
:data:`MAX_HTML_INDEX_ROWS` sessions. The file says where it was cut.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from ._replayer import SessionReport, Timeline, TimelineCall
from ._report import (
    ACTION_WORDS,
    actions_text,
    format_spend_totals,
    format_totals,
    plural,
    spend_lines,
)

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

#: How bad each detected action is, for sorting the index worst first (0: nothing detected).
_RANK: Final = {action: rank for rank, (action, _) in enumerate(ACTION_WORDS, start=1)}

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
.m.mem{border-top:2px solid #1f77b4;box-sizing:border-box}
.m.seen{background:none;border:1px dashed #d62728;box-sizing:border-box}
.ep{display:inline-block;width:3px;height:24px;background:#1f77b4;margin:0 3px 0 2px}
.ep.run{background:#17becf}
.sw{display:inline-block;width:12px;height:12px;vertical-align:middle}
.c[tabindex]{cursor:pointer}.c:focus{outline:2px solid #1f77b4;outline-offset:1px}
.c[aria-expanded=true]{outline:2px solid #222}
.detail{margin:.3em 0 .6em;padding:4px 8px;background:#f4f4f4;border-left:3px solid #1f77b4}
th button{font:inherit;font-weight:bold;background:none;border:0;padding:0;cursor:pointer;
color:inherit}th[aria-sort=descending] button::after{content:" \\25BE"}
th[aria-sort=ascending] button::after{content:" \\25B4"}
"""

#: Opens a call's detail (click, Enter, Space) and sorts the index by a column (its button).
#: Input text reaches it only as attribute values, shown with textContent.
_SCRIPT: Final = """
(function () {
  "use strict";
  function toggle(cell) {
    var panel = document.getElementById(cell.getAttribute("aria-controls"));
    if (!panel) return;
    var shown = panel.getAttribute("data-cell");
    if (shown && shown !== cell.id) {
      var previous = document.getElementById(shown);
      if (previous) previous.setAttribute("aria-expanded", "false");
    }
    if (cell.getAttribute("aria-expanded") === "true") {
      cell.setAttribute("aria-expanded", "false");
      panel.removeAttribute("data-cell");
      panel.hidden = true;
      return;
    }
    cell.setAttribute("aria-expanded", "true");
    panel.textContent = cell.getAttribute("data-detail");
    panel.setAttribute("data-cell", cell.id);
    panel.hidden = false;
  }
  function value(row, column, numeric) {
    var cell = row.cells[column];
    var text = cell.hasAttribute("data-v") ? cell.getAttribute("data-v") : cell.textContent;
    return numeric ? parseFloat(text.replace(/,/g, "")) : text.toLowerCase();
  }
  function sortBy(button) {
    var th = button.parentNode;
    var headers = Array.prototype.slice.call(th.parentNode.children);
    var column = headers.indexOf(th);
    var numeric = th.getAttribute("data-sort") === "number";
    var now = th.getAttribute("aria-sort");
    var ascending = now ? now === "descending" : !numeric;
    var body = th.closest("table").tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = value(a, column, numeric), y = value(b, column, numeric);
      var order = x < y ? -1 : x > y ? 1 : 0;
      return ascending ? order : -order;
    });
    headers.forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    rows.forEach(function (row) { body.appendChild(row); });
  }
  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!(target instanceof Element)) return;
    var cell = target.closest(".c[data-detail]");
    if (cell) { toggle(cell); return; }
    var button = target.closest("th button");
    if (button) sortBy(button);
  });
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Enter" && event.key !== " ") return;
    var target = event.target;
    if (!(target instanceof Element)) return;
    var cell = target.closest(".c[data-detail]");
    if (cell) { event.preventDefault(); toggle(cell); }
  });
})();
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


#: The rule of a reminder from memory (an earlier run's dead end, issue 28): marked apart.
_MEMORY_RULE: Final = "memory"


def _detail(call: TimelineCall) -> str:
    """What a click on a call where something was detected shows."""
    where = f"call #{call.index} {call.tool}"
    if call.signature:
        where += f" [{call.signature}]"
    if call.repeated:
        where += ", repeated"
    memory = (
        " (reminded from memory: an earlier run was refused or stopped for this call)"
        if call.rule == _MEMORY_RULE
        else ""
    )
    return (
        f"{where}: applied {call.action}, detected {call.detected};"
        f" rule {call.rule or '-'}, count {call.count}, threshold {call.threshold}{memory}"
    )


def _call_cell(call: TimelineCall, number: int) -> str:
    title = f"#{call.index} {call.tool}"
    if call.signature:
        title += f" [{call.signature}]"
    else:
        title += " (untracked)"
    if call.repeated:
        title += ", repeated"
    memory = call.rule == _MEMORY_RULE
    if call.action != "allow":
        title += f": {call.action} ({call.rule or '-'}, count {call.count})"
        if memory:
            title += ", reminded from memory: an earlier run was refused or stopped for it"
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
        marker = f'<i class="m {call.action}{" mem" if memory else ""}"></i>'
    elif call.detected != "allow":
        marker = '<i class="m seen"></i>'
    else:
        marker = ""
    button = ""
    if call.action != "allow" or call.detected != "allow":
        button = (
            f' id="s{number}c{call.index}" role="button" tabindex="0" aria-expanded="false"'
            f' aria-controls="d{number}" data-detail="{_text(_detail(call))}"'
        )
    return (
        f'<span class="{" ".join(classes)}"{style} title="{_text(title)}"{button}>'
        f"<b></b>{marker}</span>"
    )


def _timeline(timeline: Timeline, number: int) -> str:
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
        cells.append(_call_cell(call, number))
    for before_index in sorted(marks):  # after the last call drawn
        for kind in marks[before_index]:
            extra = " run" if kind == "new run" else ""
            cells.append(
                f'<span class="ep{extra}" title="{_text(kind)}: a new progress epoch"></span>'
            )
    if cells:
        rows.append(_row(row_start, cells))
    return (
        f'<div class="tl">{"".join(rows)}</div>'
        f'<div class="detail" id="d{number}" role="region" aria-live="polite"'
        ' aria-label="call detail" hidden></div>'
    )


def _row(start: int, cells: list[str]) -> str:
    return f'<div class="row"><span class="ri">{start}</span>{"".join(cells)}</div>'


def _detections(report: SessionReport) -> str:
    trips = actions_text(report.actions)
    if report.detected != report.actions:
        trips += f" (detected: {actions_text(report.detected)})"
    return trips


def _summary(report: SessionReport) -> str:
    firsts = ", ".join(
        f"first {action} at call {report.first_index[action]}"
        if action in report.first_index
        else f"no {action}"
        for action in ("remind", "deny", "stop")
    )
    spend = ""
    if report.spend is not None:
        spend = "".join(
            f"<br>{_text(line[0].upper() + line[1:])}." for line in spend_lines(report.spend)
        )
    return (
        f"<p>{plural(report.calls, 'call')}, {report.repeated} repeated; decisions:"
        f" {_detections(report)}; {firsts}.<br>"
        f"A deny would have saved <strong>{plural(report.blocked, 'call')}"
        f"{_seconds(report)}</strong>.{spend}</p>"
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
            f'<td class="n">{summary.repeated}</td><td>{actions_text(summary.actions)}</td></tr>'
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
        _timeline(timeline, number),
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


def _worst(report: SessionReport) -> tuple[int, ...]:
    """The index's default order, worst first: the detected actions counted strongest first,
    then the calls a deny would have saved, then the calls."""
    return report.severity()


def _worst_cell(report: SessionReport) -> str:
    """The strongest action detected and how often; its sort value orders by both."""
    detected = [action for action, _ in ACTION_WORDS if report.detected.get(action)]
    if not detected:
        return '<td data-v="0">-</td>'
    action = detected[-1]
    count = report.detected[action]
    value = _RANK[action] * 1_000_000_000 + min(count, 999_999_999)
    return f'<td data-v="{value}">{action} ({count})</td>'


def _index(reports: Sequence[SessionReport], anchors: dict[int, int]) -> str:
    ordered = sorted(enumerate(reports), key=lambda item: _worst(item[1]), reverse=True)
    # sorted() with reverse=True keeps equal keys in input order.
    rows = []
    for position, report in ordered[:MAX_HTML_INDEX_ROWS]:
        label = _text(report.label)
        number = anchors.get(position)
        name = f'<a href="#s{number}">{label}</a>' if number is not None else label
        counts = "".join(
            f'<td class="n">{report.actions.get(action, 0)}</td>' for action, _ in ACTION_WORDS
        )
        rows.append(
            f'<tr><td>{name}</td><td class="n">{report.calls}</td>'
            f'<td class="n">{report.repeated}</td>{counts}{_worst_cell(report)}'
            f'<td class="n">{report.blocked}</td>'
            f'<td class="n" data-v="{report.blocked_seconds:.3f}">'
            f"{report.blocked_seconds:,.1f}</td></tr>"
        )
    # (header, sort as, class): the worst column sorts by its data-v, set in _worst_cell.
    headers = [("session", "text", "")]
    headers += [(word, "number", ' class="n"') for word in ("calls", "repeated")]
    headers += [(f"{word}s", "number", ' class="n"') for _, word in ACTION_WORDS]
    headers += [("worst detected", "number", "")]
    headers += [(word, "number", ' class="n"') for word in ("calls saved", "seconds saved")]
    head = "".join(
        f'<th{align} data-sort="{sort}"><button type="button">{word}</button></th>'
        for word, sort, align in headers
    )
    cut = ""
    if len(reports) > MAX_HTML_INDEX_ROWS:
        cut = (
            '<p class="note">Index cut: the worst'
            f" {plural(MAX_HTML_INDEX_ROWS, 'session')} are listed,"
            f" {plural(len(reports) - MAX_HTML_INDEX_ROWS, 'more session')}"
            " not (the text report lists every session).</p>"
        )
    return (
        '<p class="muted">Sessions, worst first; a column&#8217;s header sorts by it.</p>'
        f'<table class="index"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>{cut}"
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
    '</p><p class="muted">Hover a call for its index, tool, signature and decision; click a'
    " call with a marker (or focus it and press Enter) for what was applied and detected, its"
    " count and threshold. Epochs started by a mutating call are not marked.</p>"
)


def _spend_totals(reports: Sequence[SessionReport]) -> str:
    """The totals of what model calls spent, when some input reported usage."""
    line = format_spend_totals(reports).strip()
    return f"<p>{_text(line[0].upper() + line[1:])}.</p>" if line else ""


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
            f'<p class="note">Timelines cut: the worst {plural(len(sections), "session")}'
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
        f"{_spend_totals(reports)}"
        f"{_LEGEND}{cut}{_index(reports, anchors)}{''.join(sections)}"
        f"<script>{_SCRIPT}</script></body></html>\n"
    )
