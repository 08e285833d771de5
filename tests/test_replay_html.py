"""``replay --html``: structure, escaping, self-containment and bounds of the HTML report."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard._guard import LoopGuard
from otel_loopguard.cli import main
from otel_loopguard.config import PRESETS, Mode
from otel_loopguard.replay import (
    MAX_TIMELINE_SIGNATURES,
    CallStarted,
    ReplayClock,
    Replayer,
    UserPrompt,
    _html,
    run_replay,
)

DATA = Path(__file__).parent / "data"
ACTIONS = ("remind", "deny", "rescue", "stop")
#: Every tag the report may contain; anything else came from the input.
TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "h1",
    "h2",
    "p",
    "br",
    "strong",
    "a",
    "code",
    "table",
    "tr",
    "th",
    "td",
    "section",
    "div",
    "span",
    "b",
    "i",
    "details",
    "summary",
    "thead",
    "tbody",
    "button",
    "script",
}


def call(session: str = "s1", tool: str = "grep", arguments: object = None, **extra: Any) -> str:
    record: dict[str, Any] = {
        "session": session,
        "tool": tool,
        "arguments": {"q": "x"} if arguments is None else arguments,
        "error": False,
        "result": "no match",
    }
    record.update(extra)
    return json.dumps(record)


def user(session: str = "s1") -> str:
    return json.dumps({"type": "user_message", "session": session})


def write(tmp_path: Path, lines: Iterable[str], name: str = "calls.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


class Page(HTMLParser):
    """What a browser would see: tags, sessions, call cells, markers, epoch marks, text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: Counter[str] = Counter()
        self.sessions: list[str] = []
        self.cells: dict[str, int] = {}
        self.titles: list[str] = []
        self.markers: dict[str, Counter[str]] = {}
        self.epochs: dict[str, int] = {}
        self.text: list[str] = []
        self._session = ""
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        found = dict(attrs)
        classes = (found.get("class") or "").split()
        if tag == "section" and "session" in classes:
            self._session = found["data-session"] or ""
            self.sessions.append(self._session)
            self.cells[self._session] = 0
            self.markers[self._session] = Counter()
            self.epochs[self._session] = 0
        elif tag == "span" and "c" in classes:
            self.cells[self._session] += 1
            self.titles.append(found.get("title") or "")
        elif tag == "span" and "ep" in classes:
            self.epochs[self._session] += 1
        elif tag == "i" and "m" in classes:
            self.markers[self._session].update(c for c in classes if c != "m")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def replay_html(
    tmp_path: Path, lines: Iterable[str], preset: str = "default", **options: Any
) -> tuple[str, list[dict[str, Any]]]:
    """Replay ``lines`` with --json and --html; return the HTML and the JSON lines."""
    path = write(tmp_path, lines)
    report = tmp_path / "report.html"
    out, err = io.StringIO(), io.StringIO()
    status = run_replay(
        [str(path)],
        PRESETS[preset],
        json_output=True,
        stdout=out,
        stderr=err,
        html_path=str(report),
        **options,
    )
    assert status == 0, err.getvalue()
    assert err.getvalue() == f"otel-loopguard replay: HTML report written to {report}\n"
    return report.read_text(encoding="utf-8"), [json.loads(x) for x in out.getvalue().splitlines()]


def looping_sessions() -> list[str]:
    """Three sessions: a plain loop to a stop, a loop broken by a user message, a healthy one."""
    lines = [call("stuck") for _ in range(12)]
    lines += [call("prompted", tool="bash", arguments={"command": "make"}) for _ in range(5)]
    lines += [user("prompted")]
    lines += [call("prompted", tool="bash", arguments={"command": "make"}) for _ in range(5)]
    lines += [call("healthy", tool="read", arguments={"path": f"f{n}"}) for n in range(6)]
    return lines


# -- structure --------------------------------------------------------------------------------


def test_every_session_is_drawn_with_one_cell_per_call(tmp_path: Path) -> None:
    text, rows = replay_html(tmp_path, looping_sessions())
    page = Page(text)
    calls = Counter(row["session"] for row in rows)
    assert page.sessions == list(calls)  # in the order first seen
    assert page.cells == dict(calls)
    assert page.epochs == {"stuck": 0, "prompted": 1, "healthy": 0}


def test_decision_markers_equal_the_json_decisions(tmp_path: Path) -> None:
    text, rows = replay_html(tmp_path, looping_sessions())
    page = Page(text)
    expected: dict[str, Counter[str]] = {session: Counter() for session in page.sessions}
    for row in rows:
        if row["action"] != "allow":
            expected[row["session"]][row["action"]] += 1
    assert page.markers == expected
    assert (
        sum(sum(c.values()) for c in page.markers.values())
        == sum(1 for row in rows if row["action"] != "allow")
        > 0
    )
    assert {"remind", "deny", "stop"} <= set().union(*page.markers.values())


def test_each_cell_names_index_tool_and_decision(tmp_path: Path) -> None:
    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    text, rows = replay_html(tmp_path, [call()] * deny, preset="brake")
    page = Page(text)
    assert [row["action"] for row in rows] == ["allow"] * (deny - 1) + ["deny"]
    assert page.titles[0].startswith("#1 grep [")
    signature = page.titles[0].split("[")[1].split("]")[0]
    assert all(f"[{signature}]" in title for title in page.titles)  # one signature, one colour
    assert page.titles[-1] == (
        f"#{deny} grep [{signature}], repeated: deny (consecutive, count {deny})"
    )


def test_summary_gives_calls_decisions_and_savings(tmp_path: Path) -> None:
    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    text, _ = replay_html(tmp_path, [call(duration_seconds=1.5)] * (deny + 1), preset="brake")
    words = " ".join("".join(Page(text).text).split())
    assert (
        f"{deny + 1} calls, {deny} repeated; decisions: 2 denials;"
        f" no remind, first deny at call {deny}, no stop."
    ) in words
    assert "A deny would have saved 2 calls (3.0 s)." in words


def test_one_call_is_singular(tmp_path: Path) -> None:
    text, _ = replay_html(tmp_path, [call()])
    words = " ".join("".join(Page(text).text).split())
    assert "1 call, 0 repeated; decisions: none;" in words
    assert "A deny would have saved 0 calls." in words


def test_observe_mode_marks_what_was_detected(tmp_path: Path) -> None:
    text, rows = replay_html(tmp_path, [call()] * 8, mode=Mode.OBSERVE)
    page = Page(text)
    assert {row["action"] for row in rows} == {"allow"}
    assert set(page.markers["s1"]) == {"seen"}


def test_recorded_traces_are_drawn(tmp_path: Path) -> None:
    lines = (DATA / "spans" / "pydantic_ai" / "spans.jsonl").read_text().splitlines()
    text, rows = replay_html(tmp_path, lines)
    page = Page(text)
    assert page.cells == dict(Counter(row["session"] for row in rows))


@pytest.mark.slow
def test_cli_writes_the_file_and_keeps_stdout(tmp_path: Path) -> None:
    path = write(tmp_path, looping_sessions())
    report = tmp_path / "out.html"
    plain = subprocess.run(
        [sys.executable, "-m", "otel_loopguard.cli", "replay", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    with_html = subprocess.run(
        [sys.executable, "-m", "otel_loopguard.cli", "replay", "--html", str(report), str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert with_html.returncode == 0, with_html.stderr
    assert with_html.stdout == plain.stdout
    assert with_html.stderr == f"otel-loopguard replay: HTML report written to {report}\n"
    assert Page(report.read_text(encoding="utf-8")).sessions == ["stuck", "prompted", "healthy"]


def test_an_unwritable_html_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, [call()])
    target = tmp_path / "missing" / "report.html"
    assert main(["replay", "--html", str(target), str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"otel-loopguard replay: error: cannot write {target}: No such file or directory\n"
    )
    assert captured.out == ""  # nothing replayed


# -- escaping and self-containment -----------------------------------------------------------


HOSTILE = "<script>alert('x')</script>\"' onload=x \x00&amp;"


def test_everything_from_the_input_is_escaped(tmp_path: Path) -> None:
    lines = [
        call(
            session=HOSTILE,
            tool=f"{HOSTILE}tool",
            arguments={"q": "</code><img src=x onerror=alert(1)>", HOSTILE: 1},
        )
    ] * 5
    lines += [call(session=HOSTILE, agent="<b>agent</b>", tool="<i>t</i>")]
    text, rows = replay_html(tmp_path, lines)
    page = Page(text)
    assert set(page.tags) <= TAGS  # no tag came from the input
    # The one script is the report's own; the input's is text.
    assert page.tags["script"] == 1 and text.lower().count("<script") == 1
    assert "<script>alert" not in text
    assert "<img" not in text and "\x00" not in text
    shown = HOSTILE.replace("\x00", "\ufffd")
    assert page.sessions == [shown, f"{shown}/<b>agent</b>"]
    assert any(title.startswith(f"#1 {shown}tool [") for title in page.titles)
    assert "</code><img src=x onerror=alert(1)>" in "".join(page.text)  # shown, as text
    assert page.markers[shown]["remind"] == sum(
        1 for row in rows if row["session"] == HOSTILE and row["action"] == "remind"
    )


def test_the_file_is_self_contained(tmp_path: Path) -> None:
    text, _ = replay_html(tmp_path, looping_sessions())
    lowered = text.lower()
    for reference in (
        "http",
        "src=",
        "<link",
        "url(",
        "@import",
        "<img",
        "<iframe",
        "<object",
        "<embed",
    ):
        assert reference not in lowered, reference
    page = Page(text)
    assert page.tags["style"] == 1 and page.tags["meta"] >= 1
    assert page.tags["script"] == 1 and lowered.count("<script>") == 1  # inline, no src
    assert '<meta charset="utf-8">' in text


# -- bounds -----------------------------------------------------------------------------------


def test_sessions_and_calls_drawn_are_capped_and_the_file_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_html, "MAX_HTML_SESSIONS", 2)
    monkeypatch.setattr(_html, "MAX_HTML_CALLS", 5)
    lines = [call(session=f"s{n}") for _ in range(8) for n in range(3)]
    text, rows = replay_html(tmp_path, lines)
    page = Page(text)
    assert page.sessions == ["s0", "s1"]
    assert page.cells == {"s0": 5, "s1": 5}
    words = " ".join("".join(page.text).split())
    dropped = sum(
        1
        for row in rows
        if row["session"] == "s0" and row["index"] > 5 and row["action"] != "allow"
    )
    assert (
        f"Timeline cut: calls 6 to 8 not drawn ({dropped} decision"
        f"{'' if dropped == 1 else 's'} among them"
    ) in words
    assert "Timelines cut: the worst 2 sessions are drawn, 1 more session only listed" in words
    assert page.tags["a"] == 2  # the index links the drawn sessions, lists the third
    assert "s2" in page.text


def test_the_worst_sessions_keep_their_timelines_even_when_they_start_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 timelines drawn, 4 kept while replaying: ten quiet sessions first (each call new), then
    # a looping one. It starts when four quiet ones hold a timeline, takes a quiet one's place,
    # and is drawn, first in the index; quiet sessions fill the other place.
    monkeypatch.setattr(_html, "MAX_HTML_SESSIONS", 2)
    quiet = [call(session=f"q{n}", arguments={"q": str(i)}) for n in range(10) for i in range(3)]
    looping = [call(session="loop") for _ in range(9)]
    text, _rows = replay_html(tmp_path, [*quiet, *looping])
    page = Page(text)
    assert "loop" in page.sessions and len(page.sessions) == 2
    assert page.cells["loop"] == 9  # its whole timeline, from its first call
    first_row = re.search(r"<tr><td>(.*?)</td>", text)
    assert first_row is not None and re.fullmatch(r'<a href="#s\d">loop</a>', first_row.group(1))


def test_the_replayer_keeps_no_timeline_unless_asked() -> None:
    clock = ReplayClock()
    replayer = Replayer(LoopGuard(PRESETS["default"], clock=clock), clock)
    for token in range(10):
        replayer.handle(0, CallStarted(token, "s", None, "grep", {"q": "x"}))
    assert all(report.timeline is None for report in replayer.reports.values())


def test_the_replayer_bounds_what_a_timeline_keeps() -> None:
    clock = ReplayClock()
    replayer = Replayer(
        LoopGuard(PRESETS["default"], clock=clock), clock, timeline_sessions=1, timeline_calls=10
    )
    calls = MAX_TIMELINE_SIGNATURES + 30
    for token in range(calls):
        replayer.handle(0, CallStarted(token, "a", None, "read", {"path": f"f{token}"}))
        replayer.handle(0, UserPrompt("a", None))
        replayer.handle(0, CallStarted(token, "b", None, "read", {"path": "x"}))
    first, second = replayer.reports.values()
    timeline = first.timeline
    assert timeline is not None and second.timeline is not None  # 2 kept while replaying
    assert len(timeline.calls) == 10 and timeline.calls_dropped == calls - 10
    # A prompt is marked before the call after it: the marks before calls 2 to 10 are kept.
    assert len(timeline.marks) == 9 and timeline.marks_dropped == calls - 9
    assert len(timeline.signatures) == MAX_TIMELINE_SIGNATURES
    assert timeline.other_signature_calls == calls - MAX_TIMELINE_SIGNATURES
    # Once read, the one drawn is kept: "b", which loops; "a" (all calls new) drops its own.
    replayer.keep_drawn_timelines()
    assert first.timeline is None and second.timeline is not None


def test_long_arguments_are_cut_in_the_legend(tmp_path: Path) -> None:
    text, _ = replay_html(tmp_path, [call(arguments={"q": "y" * 10_000})] * 2)
    assert "y" * 10_000 not in text
    assert "more chars)" in text


# -- interaction (tests/test_replay_browser.py drives it in Chromium) ------------------------


class Buttons(HTMLParser):
    """The call cells that are buttons, and the index's session column in order."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.buttons: list[dict[str, str | None]] = []
        self.plain = 0
        self.index: list[str] = []
        self._cell = False
        self._column = 0
        self._in_body = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "span" and "c" in (found.get("class") or "").split():
            if found.get("role") == "button":
                self.buttons.append(found)
            else:
                self.plain += 1
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr":
            self._column = 0
        elif tag == "td" and self._in_body:
            self._column += 1
            self._cell = self._column == 1
            if self._cell:
                self.index.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._cell = False
        elif tag == "tbody":
            self._in_body = False

    def handle_data(self, data: str) -> None:
        if self._cell:
            self.index[-1] += data


def test_calls_with_a_detection_are_buttons_with_their_detail(tmp_path: Path) -> None:
    text, rows = replay_html(tmp_path, [call()] * 8, mode=Mode.ADVISE)
    page = Buttons(text)
    softened = [row for row in rows if row["action"] != "allow" or "detected" in row]
    assert len(page.buttons) == len(softened) > 0
    assert page.plain == len(rows) - len(softened)
    for button, row in zip(page.buttons, softened):
        assert button["tabindex"] == "0" and button["aria-expanded"] == "false"
        assert button["id"] == f"s1c{row['index']}" and button["aria-controls"] == "d1"
        detail = button["data-detail"] or ""
        assert detail.startswith(f"call #{row['index']} grep [")
        applied = row["action"]
        assert f"applied {applied}, detected {row.get('detected', applied)};" in detail
        assert f"count {row['count']}, threshold " in detail
        assert not detail.endswith("threshold 0")
    assert 'id="d1" role="region" aria-live="polite"' in text


def test_the_index_lists_the_worst_session_first(tmp_path: Path) -> None:
    lines = [call("healthy", "read", {"path": f"f{n}"}) for n in range(5)]
    lines += [call("reminded")] * 3 + [call("stopped", "bash")] * 12 + [call("denied")] * 5
    text, rows = replay_html(tmp_path, lines)
    page = Buttons(text)
    assert Page(text).sessions == ["healthy", "reminded", "stopped", "denied"]  # input order
    assert page.index == ["stopped", "denied", "reminded", "healthy"]
    last = {row["session"]: row["action"] for row in rows if row["action"] != "allow"}
    assert last == {"reminded": "remind", "denied": "deny", "stopped": "stop"}
