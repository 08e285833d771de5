"""Replay for big inputs: the progress bar (on a real pseudo-terminal, never through a pipe or
with --json), --summary, and what the advise and observe modes detected beside what they did."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard.config import PRESETS, Mode
from otel_loopguard.replay import LARGE_INPUT_BYTES, _reader, run_replay

#: One call line of about this many bytes; the big file has just enough of them.
LINE_BYTES = 2_000


def call(session: str = "s1", tool: str = "grep", arguments: object = None) -> str:
    record: dict[str, Any] = {
        "session": session,
        "tool": tool,
        "arguments": {"q": "x"} if arguments is None else arguments,
        "error": False,
        "result": "no match",
    }
    return json.dumps(record)


def write(tmp_path: Path, lines: Iterable[str], name: str = "calls.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def big_file(tmp_path: Path) -> Path:
    """Just over LARGE_INPUT_BYTES: sessions of distinct calls with long arguments."""
    pad = "p" * LINE_BYTES
    count = LARGE_INPUT_BYTES // LINE_BYTES + 50
    lines = [call(f"s{n % 40}", "read", {"path": f"f{n}", "pad": pad}) for n in range(count)]
    path = write(tmp_path, lines, "big.jsonl")
    assert path.stat().st_size > LARGE_INPUT_BYTES
    return path


def looping() -> list[str]:
    """A session looping to a stop (default preset), and a healthy one."""
    return [call("stuck")] * 12 + [call("ok", "read", {"path": f"f{n}"}) for n in range(3)]


class Terminal:
    """A real pseudo-terminal: ``slave`` is the child's stderr; everything the child writes
    to it is collected from the master side until the child closes it."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every slave side is closed
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    def output(self) -> str:
        """Close our slave side, wait for the reader, return what was written."""
        os.close(self.slave)
        self._reader.join(timeout=60)
        os.close(self.master)
        return b"".join(self._chunks).decode("utf-8", "replace")


def replay_cli(*args: str, stderr_terminal: bool) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run ``otel-loopguard replay ARGS`` with stdout a pipe and stderr a pseudo-terminal or a
    pipe; return the process and what reached stderr."""
    command = [sys.executable, "-m", "otel_loopguard.cli", "replay", *args]
    env = {**os.environ, "COLUMNS": "100"}
    if not stderr_terminal:
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        return result, result.stderr
    terminal = Terminal()
    try:
        result = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=terminal.slave, text=True, timeout=300, env=env
        )
    finally:
        written = terminal.output()
    return result, written


# -- progress bar -----------------------------------------------------------------------------


def test_a_large_file_shows_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    path = big_file(tmp_path)
    result, terminal = replay_cli(str(path), stderr_terminal=True)
    assert result.returncode == 0
    assert "%|" in terminal and "lines" in terminal and "big.jsonl" in terminal  # tqdm's bar
    assert terminal.rstrip(" ").endswith("\r")  # leave=False: the line is blanked
    assert "\r" not in result.stdout and result.stdout.startswith("replay: 1 input")
    assert "total: 1 file, 40 sessions" in result.stdout


@pytest.mark.slow
def test_no_progress_bar_through_a_pipe(tmp_path: Path) -> None:
    path = big_file(tmp_path)
    result, stderr = replay_cli(str(path), stderr_terminal=False)
    assert result.returncode == 0
    assert stderr == ""
    assert "total: 1 file, 40 sessions" in result.stdout


@pytest.mark.slow
def test_no_progress_bar_with_json_even_on_a_terminal(tmp_path: Path) -> None:
    path = big_file(tmp_path)
    result, terminal = replay_cli("--json", str(path), stderr_terminal=True)
    assert result.returncode == 0
    assert terminal == ""
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == LARGE_INPUT_BYTES // LINE_BYTES + 50


def test_no_progress_bar_for_small_input_on_a_terminal(tmp_path: Path) -> None:
    result, terminal = replay_cli(str(write(tmp_path, looping())), stderr_terminal=True)
    assert result.returncode == 0
    assert terminal == ""


def test_input_of_unknown_size_shows_the_bar_past_the_line_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stdin has no size: the bar appears once LARGE_INPUT_LINES lines were read (lowered here
    to keep the test short; the real pseudo-terminal is the stream tqdm draws on)."""
    monkeypatch.setattr(_reader, "LARGE_INPUT_LINES", 1_000)
    lines = [call(f"s{n % 7}", "read", {"path": f"f{n}"}) for n in range(3_000)]
    data = "".join(line + "\n" for line in lines).encode()
    terminal = Terminal()
    stderr = os.fdopen(os.dup(terminal.slave), "w", encoding="utf-8")
    assert stderr.isatty()
    out = io.StringIO()
    try:
        status = run_replay(
            ["-"], PRESETS["default"], stdin=io.BytesIO(data), stdout=out, stderr=stderr
        )
    finally:
        stderr.close()
        written = terminal.output()
    assert status == 0
    assert "lines" in written and "B/s" in written  # a byte count and rate: no total to show
    assert "%|" not in written
    assert "total: 1 file, 7 sessions" in out.getvalue()

    small = Terminal()
    stderr = os.fdopen(os.dup(small.slave), "w", encoding="utf-8")
    try:
        run_replay(
            ["-"],
            PRESETS["default"],
            stdin=io.BytesIO(b"".join(line.encode() + b"\n" for line in lines[:900])),
            stdout=out,
            stderr=stderr,
        )
    finally:
        stderr.close()
    assert small.output() == ""


def test_tqdm_is_imported_only_to_draw_a_bar(tmp_path: Path) -> None:
    """import otel_loopguard, the hooks, the command line and a replay without a bar leave
    tqdm unimported (command hooks start a process per tool call)."""
    path = write(tmp_path, looping())
    code = (
        "import io, sys\n"
        "import otel_loopguard, otel_loopguard.hooks, otel_loopguard.replay\n"
        "from otel_loopguard.cli import build_parser, main\n"
        "build_parser()\n"
        "before = 'tqdm' in sys.modules\n"
        "sys.stdout = io.StringIO()\n"
        "main(['replay', sys.argv[1]])\n"
        "sys.stdout = sys.__stdout__\n"
        "print(before, 'tqdm' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


# -- --summary --------------------------------------------------------------------------------


@pytest.mark.slow
def test_summary_prints_one_line_per_session(tmp_path: Path) -> None:
    path = write(tmp_path, looping())
    result, _ = replay_cli("--summary", str(path), stderr_terminal=False)
    assert result.returncode == 0, result.stderr
    full, _ = replay_cli(str(path), stderr_terminal=False)
    lines = result.stdout.splitlines()
    assert lines[0] == "replay: 1 input, mode enforce"
    sessions = [line for line in lines if line.startswith("session ")]
    assert len(sessions) == 2
    assert sessions[0].startswith("session stuck: 12 calls, 11 repeated; decisions: ")
    assert "stop" in sessions[0] and "first stop #" in sessions[0]
    assert sessions[1] == (
        "session ok: 3 calls, 0 repeated; decisions: none; a deny would have saved 0 calls"
    )
    assert lines[-1] == full.stdout.splitlines()[-1]  # the same total line
    assert "consecutive" not in result.stdout and "consecutive" in full.stdout  # no call list


@pytest.mark.slow
def test_summary_json_agrees_with_the_per_call_json(tmp_path: Path) -> None:
    path = write(tmp_path, looping())
    result, _ = replay_cli("--summary", "--json", str(path), stderr_terminal=False)
    assert result.returncode == 0, result.stderr
    per_call, _ = replay_cli("--json", str(path), stderr_terminal=False)
    calls = [json.loads(line) for line in per_call.stdout.splitlines()]
    summaries = [json.loads(line) for line in result.stdout.splitlines()]
    assert [s["session"] for s in summaries] == ["stuck", "ok"]
    for summary in summaries:
        rows = [row for row in calls if row["session"] == summary["session"]]
        actions: dict[str, int] = {}
        for row in rows:
            if row["action"] != "allow":
                actions[row["action"]] = actions.get(row["action"], 0) + 1
        assert summary["actions"] == actions == summary["detected"]  # enforce: the same
        assert summary["calls"] == max(row["index"] for row in rows)
        for action, index in summary["first"].items():
            assert index == min(row["index"] for row in rows if row["action"] == action)
        blocking = {"deny", "rescue", "stop"}
        assert summary["saved_calls"] == sum(
            1 for row in rows if row["action"] in blocking and row.get("phase") != "post"
        )
    assert list(summaries[0]) == [
        "session",
        "calls",
        "repeated",
        "actions",
        "detected",
        "first",
        "saved_calls",
        "saved_seconds",
    ]


# -- what the advise and observe modes detected -----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", [Mode.ADVISE, Mode.OBSERVE])
def test_softened_lines_show_what_was_detected(tmp_path: Path, mode: Mode) -> None:
    path = write(tmp_path, looping())
    enforced, _ = replay_cli("--json", str(path), stderr_terminal=False)
    softened, _ = replay_cli("--json", "--mode", mode.value, str(path), stderr_terminal=False)
    text, _ = replay_cli("--mode", mode.value, str(path), stderr_terminal=False)
    truth = [json.loads(line) for line in enforced.stdout.splitlines()]
    rows = [json.loads(line) for line in softened.stdout.splitlines()]
    assert len(rows) == len(truth)
    differing = 0
    for strict, soft in zip(truth, rows):
        assert (soft["session"], soft["index"]) == (strict["session"], strict["index"])
        if soft["action"] == strict["action"]:
            assert "detected" not in soft
            continue
        differing += 1
        assert soft["action"] == ("remind" if mode is Mode.ADVISE else "allow")
        assert soft["detected"] == strict["action"]
        assert (soft["rule"], soft["count"]) == (strict["rule"], strict["count"])
        # The text report's line for that call shows both.
        shown = f"{soft['action']} (detected: {soft['detected']})"
        line = next(
            line
            for line in text.stdout.splitlines()
            if line.split()[:2] == [str(soft["index"]), soft["tool"]]
        )
        assert shown in line and line.split()[-1] == str(soft["count"])
    assert differing > 0
    assert {row["action"] for row in truth} >= {"deny", "stop"}
