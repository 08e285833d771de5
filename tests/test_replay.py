"""Replay: readers, format detection, the report, and bad input (through the real CLI too)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_loopguard import replay
from otel_loopguard.cli import main
from otel_loopguard.config import PRESETS, Mode
from otel_loopguard.replay import (
    MAX_REPORTED_BAD_LINES,
    BadRecord,
    CallFinished,
    CallStarted,
    ClaudeCodeDecoder,
    InputFormat,
    TranscriptDecoder,
    UserPrompt,
    _formats,
    detect_format,
    format_by_name,
    register_format,
    run_replay,
)

DATA = Path(__file__).parent / "data"
CLAUDE_SAMPLE = DATA / "claude_code_session.jsonl"
CLAUDE_SESSION = "5b0c7d2e-8f41-4a6b-9c3d-2e1f0a9b8c7d"
CLAUDE_SUBAGENT = "a3f9c2e1"
PYTEST = "python -m pytest tests/test_durations.py -x -q"


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


def cli(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_loopguard.cli", *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def brake_expected(session: str, calls: int, start: int = 1) -> list[dict[str, Any]]:
    """What the brake preset answers to ``calls`` identical consecutive calls."""
    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    expected = []
    for n in range(1, calls + 1):
        blocked = n >= deny
        expected.append(
            {
                "session": session,
                "index": start + n - 1,
                "tool": "grep",
                "action": "deny" if blocked else "allow",
                "rule": "consecutive" if blocked else None,
                "count": 0 if n == 1 else n,
            }
        )
    return expected


# -- --json output ----------------------------------------------------------------------------


def test_json_prints_exactly_one_line_per_call(tmp_path: Path) -> None:
    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    path = write(tmp_path, [call()] * (deny + 1) + [user(), call()])
    result = cli("replay", "--json", "--preset", "brake", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    after_prompt = {
        "session": "s1",
        "index": deny + 2,
        "tool": "grep",
        "action": "allow",
        "rule": None,
        "count": 0,
    }
    assert json_lines(result.stdout) == brake_expected("s1", deny + 1) + [after_prompt]
    # Key order is part of the format.
    assert list(json.loads(result.stdout.splitlines()[0])) == [
        "session",
        "index",
        "tool",
        "action",
        "rule",
        "count",
    ]


def test_stdin_dash_reads_standard_input(tmp_path: Path) -> None:
    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    text = "".join(line + "\n" for line in [call()] * deny)
    result = cli("replay", "--json", "--preset", "brake", "-", stdin=text.encode())
    assert result.returncode == 0, result.stderr
    assert json_lines(result.stdout) == brake_expected("s1", deny)


def test_sessions_are_indexed_and_kept_apart(tmp_path: Path) -> None:
    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    lines = []
    for _ in range(deny):
        lines += [call(session="a"), call(session="b", tool="grep")]
    path = write(tmp_path, lines)
    out = io.StringIO()
    assert (
        run_replay(
            [str(path)], PRESETS["brake"], json_output=True, stdout=out, stderr=io.StringIO()
        )
        == 0
    )
    rows = json_lines(out.getvalue())
    assert [r for r in rows if r["session"] == "a"] == brake_expected("a", deny)
    assert [r for r in rows if r["session"] == "b"] == brake_expected("b", deny)


def test_agent_is_its_own_chain(tmp_path: Path) -> None:
    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    # Alternating parent and sub-agent calls: neither ever has `deny` identical calls in a row
    # of its own chain... unless they were mixed up, which would make one chain of 2*deny.
    lines = []
    for _ in range(deny - 1):
        lines += [call(), call(agent="sub")]
    out = io.StringIO()
    run_replay(
        [str(write(tmp_path, lines))],
        PRESETS["brake"],
        json_output=True,
        stdout=out,
        stderr=io.StringIO(),
    )
    rows = json_lines(out.getvalue())
    assert {r["session"] for r in rows} == {"s1", "s1/sub"}
    assert all(r["action"] == "allow" for r in rows)


def test_mode_option_overrides_the_policy(tmp_path: Path) -> None:
    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    path = write(tmp_path, [call()] * deny)
    result = cli("replay", "--json", "--preset", "brake", "--mode", "observe", str(path))
    assert result.returncode == 0
    assert [r["action"] for r in json_lines(result.stdout)] == ["allow"] * deny


def test_config_file_chooses_the_policy(tmp_path: Path) -> None:
    path = write(tmp_path, [call()] * 3)
    config = tmp_path / "loopguard.toml"
    config.write_text('[loopguard]\npreset = "brake"\ndeny_threshold = 2\n')
    result = cli("replay", "--json", "--config", str(config), str(path))
    assert result.returncode == 0, result.stderr
    assert [r["action"] for r in json_lines(result.stdout)] == ["allow", "deny", "deny"]


# -- text report ------------------------------------------------------------------------------


def test_text_report_lists_decisions_and_summary(tmp_path: Path) -> None:
    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    path = write(tmp_path, [call(duration_seconds=1.5)] * (deny + 1))
    out = io.StringIO()
    assert run_replay([str(path)], PRESETS["brake"], stdout=out, stderr=io.StringIO()) == 0
    text = out.getvalue()
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(str(deny))]
    assert rows == [[str(deny), "grep", "consecutive", "deny", str(deny)]]
    assert (
        f"  {deny + 1} calls, {deny} repeated; no remind, first deny #{deny}, no stop;"
        " a deny would have saved 2 calls (3.0 s)"
    ) in text
    assert text.rstrip().endswith("0 bad lines")


def test_saved_seconds_say_when_some_durations_are_unknown(tmp_path: Path) -> None:
    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    lines = [call()] * (deny - 1) + [call(duration_seconds=2.0), call()]
    out = io.StringIO()
    run_replay([str(write(tmp_path, lines))], PRESETS["brake"], stdout=out, stderr=io.StringIO())
    assert "saved 2 calls (at least 2.0 s; 1 without a duration)" in out.getvalue()


def test_a_session_without_decisions_says_so(tmp_path: Path) -> None:
    out = io.StringIO()
    run_replay(
        [str(write(tmp_path, [call(), call(tool="ls")]))],
        PRESETS["default"],
        stdout=out,
        stderr=io.StringIO(),
    )
    assert (
        "  2 calls, 0 repeated; no remind, no deny, no stop; a deny would have saved 0 calls\n"
        in out.getvalue()
    )


def test_counts_are_singular_for_one(tmp_path: Path) -> None:
    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    one = write(tmp_path, [call()], "one.jsonl")
    out = io.StringIO()
    run_replay([str(one)], PRESETS["brake"], stdout=out, stderr=io.StringIO())
    text = out.getvalue()
    assert (
        "  1 call, 0 repeated; no remind, no deny, no stop; a deny would have saved 0 calls\n"
        in text
    )
    assert text.endswith(
        "total: 1 file, 1 session (0 with decisions), 1 call, 0 repeated;"
        " a deny would have saved 0 calls; 0 bad lines\n"
    )
    # One blocked call, one bad line, two files: singular where it is one.
    blocked = write(tmp_path, [call(session="b")] * deny + ["garbage"], "blocked.jsonl")
    out = io.StringIO()
    run_replay([str(one), str(blocked)], PRESETS["brake"], stdout=out, stderr=io.StringIO())
    text = out.getvalue()
    assert f"  {deny} calls, {deny - 1} repeated;" in text
    assert "a deny would have saved 1 call\n" in text
    assert text.endswith(
        f"total: 2 files, 2 sessions (1 with decisions), {deny + 1} calls,"
        f" {deny - 1} repeated; a deny would have saved 1 call; 1 bad line\n"
    )
    assert " 1 calls" not in text and " 1 sessions" not in text and " 1 files" not in text


def test_decisions_beyond_the_list_are_counted_in_the_plural(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from otel_loopguard.replay import _replayer

    deny = PRESETS["brake"].deny_threshold
    assert deny is not None
    monkeypatch.setattr(_replayer, "MAX_LISTED_DECISIONS", 1)
    for extra, words in ((1, "1 more decision"), (2, "2 more decisions")):
        out = io.StringIO()
        run_replay(
            [str(write(tmp_path, [call()] * (deny + extra)))],
            PRESETS["brake"],
            stdout=out,
            stderr=io.StringIO(),
        )
        assert f"  … and {words} not listed\n" in out.getvalue()


def test_one_bad_line_beyond_the_limit_is_singular(tmp_path: Path) -> None:
    path = write(tmp_path, ["nope"] * (MAX_REPORTED_BAD_LINES + 1))
    err = io.StringIO()
    run_replay([str(path)], PRESETS["default"], stdout=io.StringIO(), stderr=err)
    assert f"{path}: 1 more bad line not shown" in err.getvalue().splitlines()


def test_help_lists_every_registered_format(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = InputFormat(
        "my-format", "my team's own JSON lines", lambda record: False, TranscriptDecoder
    )
    monkeypatch.setattr(_formats, "FORMATS", [*_formats.FORMATS])  # undone after the test
    monkeypatch.setattr(replay, "FORMATS", _formats.FORMATS)
    register_format(extra)
    assert main(["replay", "--help"]) == 0
    out = capsys.readouterr().out
    listed = out[out.index("input formats") :]
    for fmt in replay.FORMATS:
        line = next(line for line in listed.splitlines() if line.split()[:1] == [fmt.name])
        assert fmt.description.split()[0] in line
    assert "my-format    my team's own JSON lines" in listed


def test_a_directory_means_its_jsonl_files(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    (folder / "deep").mkdir(parents=True)
    write(folder, [call(session="x")], "one.jsonl")
    write(folder / "deep", [call(session="y")], "two.jsonl")
    write(folder, ["ignored"], "notes.txt")
    out = io.StringIO()
    assert (
        run_replay(
            [str(folder)], PRESETS["default"], json_output=True, stdout=out, stderr=io.StringIO()
        )
        == 0
    )
    assert sorted(r["session"] for r in json_lines(out.getvalue())) == ["x", "y"]


# -- bad input --------------------------------------------------------------------------------


def test_bad_lines_are_reported_counted_and_skipped(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            call(),
            "{not json",
            json.dumps({"session": "s1", "tool": "grep"}),
            json.dumps([1, 2]),
            json.dumps({"session": "s1", "tool": "grep", "arguments": {}, "error": "yes"}),
            json.dumps({"session": "", "tool": "grep", "arguments": {}}),
            json.dumps({"type": "banana", "session": "s1"}),
            "",
            call(),
        ],
    )
    result = cli("replay", "--json", str(path))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"{path}:2: not valid JSON (Expecting property name enclosed in double quotes at column 2)",
        f"{path}:3: missing field 'arguments'",
        f"{path}:4: expected a JSON object, got list",
        f"{path}:5: 'error' must be true, false or null, got 'yes'",
        f"{path}:6: 'session' must be a non-empty string, got ''",
        f"{path}:7: unknown record type 'banana' (expected 'tool_call' or 'user_message')",
        "otel-loopguard replay: 6 bad lines skipped; not all input was read (exit status 1)",
    ]
    # The good lines around the bad ones were still replayed, in one session.
    assert [(r["index"], r["action"]) for r in json_lines(result.stdout)] == [
        (1, "allow"),
        (2, "allow"),
    ]


def test_text_report_counts_bad_lines(tmp_path: Path) -> None:
    path = write(tmp_path, [call(), "garbage", call()])
    out, err = io.StringIO(), io.StringIO()
    assert run_replay([str(path)], PRESETS["default"], stdout=out, stderr=err) == 1
    assert out.getvalue().rstrip().endswith("; 1 bad line")
    assert f"{path}:2: not valid JSON" in err.getvalue()


def test_bad_lines_beyond_the_limit_are_counted_not_printed(tmp_path: Path) -> None:
    bad_count = MAX_REPORTED_BAD_LINES + 5
    path = write(tmp_path, ["nope"] * bad_count)
    err = io.StringIO()
    assert run_replay([str(path)], PRESETS["default"], stdout=io.StringIO(), stderr=err) == 1
    lines = err.getvalue().splitlines()
    assert sum(1 for line in lines if "not valid JSON" in line) == MAX_REPORTED_BAD_LINES
    assert f"{path}: 5 more bad lines not shown" in lines
    assert lines[-1].startswith(f"otel-loopguard replay: {bad_count} bad lines skipped")


def test_invalid_utf8_deep_nesting_and_huge_integers_do_not_crash(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_bytes(
        b'{"session": "s\x80"}\n'
        + call(result=2**70).encode()
        + b"\n"
        + b'{"session": "s1", "tool": "t", "arguments": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}\n"
    )
    out, err = io.StringIO(), io.StringIO()
    assert (
        run_replay([str(path)], PRESETS["default"], json_output=True, stdout=out, stderr=err) == 1
    )
    assert err.getvalue().splitlines()[:2] == [
        f"{path}:1: not UTF-8 text (invalid start byte at byte 15)",
        f"{path}:3: not readable JSON (nested too deeply)",
    ]
    assert len(json_lines(out.getvalue())) == 1  # the integer beyond 64 bits is read


def test_missing_file_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    good = write(tmp_path, [call()])
    missing = tmp_path / "missing.jsonl"
    result = cli("replay", str(good), str(missing))
    assert result.returncode == 2
    assert result.stderr == f"otel-loopguard replay: error: no such file: {missing}\n"
    assert result.stdout == ""  # nothing is replayed when an input is missing


def test_empty_directory_is_a_usage_error(tmp_path: Path) -> None:
    result = cli("replay", str(tmp_path))
    assert result.returncode == 2
    assert (
        result.stderr == f"otel-loopguard replay: error: no .jsonl files in directory: {tmp_path}\n"
    )


def test_bad_preset_and_bad_config_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, [call()])
    assert main(["replay", "--preset", "turbo", str(path)]) == 2
    assert (
        "error: preset: 'turbo' is not one of default, reminder, brake, rescue"
        in capsys.readouterr().err
    )
    config = tmp_path / "bad.toml"
    config.write_text("deny_threshold = 1\n")
    assert main(["replay", "--config", str(config), str(path)]) == 2
    err = capsys.readouterr().err
    assert "deny_threshold" in err and "Traceback" not in err


def test_unknown_format_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--format", "xml", str(write(tmp_path, [call()]))]) == 2
    assert "format: 'xml' is not one of claude-code, corpus, transcript" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("options", [["--json"], []], ids=["json", "text"])
def test_broken_pipe_ends_quietly(tmp_path: Path, options: list[str]) -> None:
    """`replay big.jsonl | head -1`: the reader goes away; the replay ends quietly, and the
    closed pipe is not taken for an unreadable input."""
    path = write(tmp_path, [call(session=f"s{i}") for i in range(20_000)])
    process = subprocess.Popen(
        [sys.executable, "-m", "otel_loopguard.cli", "replay", *options, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()  # as head does after its line
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) in (0, 141)
    assert err == ""  # no traceback, no "cannot read", no "not all input was read"
    if options:
        assert json.loads(first)["session"] == "s0"
    else:
        assert first == b"replay: 1 input, mode enforce\n"


# -- Claude Code transcripts -----------------------------------------------------------------


def test_claude_code_sample_is_detected_and_replayed() -> None:
    result = cli("replay", "--json", "--preset", "default", str(CLAUDE_SAMPLE))
    assert result.returncode == 0, result.stderr
    every = json_lines(result.stdout)
    post_rows = [r for r in every if r.get("phase") == "post"]
    rows = [r for r in every if "phase" not in r]
    main_rows = [r for r in rows if r["session"] == CLAUDE_SESSION]
    sub_rows = [r for r in rows if r["session"] == f"{CLAUDE_SESSION}/{CLAUDE_SUBAGENT}"]
    assert len(main_rows) + len(sub_rows) == len(rows)
    assert [r["tool"] for r in main_rows] == (
        ["Bash", "Read", "Grep", "Task"] + ["Bash"] * 3 + ["Read"] + ["Bash"] * 5 + ["Edit", "Bash"]
    )
    assert [r["index"] for r in main_rows] == list(range(1, 16))
    assert [r["tool"] for r in sub_rows] == ["Grep"] * 4

    # The k-th identical test run (same failure each time): the run is stopped right after the
    # failure_stop_threshold-th identical failure (a second line for that call, phase post), and
    # every later attempt in the epoch is answered stop before it runs.
    policy = PRESETS["default"]
    stuck, failures = policy.no_progress_threshold, policy.failure_stop_threshold
    assert stuck is not None and failures is not None
    runs = [r for r in main_rows if r["tool"] == "Bash"][:-1]  # the last run is after the fix
    by_count = {n: runs[n - 1]["action"] for n in range(1, len(runs) + 1)}
    assert by_count[policy.remind_thresholds[0]] == "remind"
    assert all(by_count[n] == "allow" for n in range(1, policy.remind_thresholds[0]))
    assert [r["index"] for r in post_rows] == [runs[failures - 1]["index"]]
    assert post_rows[0]["action"] == "stop" and post_rows[0]["rule"] == "no_progress"
    assert all(r["action"] == "stop" for r in runs[failures:])
    # A user prompt, then an edit: the test run after the fix is allowed again.
    assert main_rows[-1] == {
        "session": CLAUDE_SESSION,
        "index": 15,
        "tool": "Bash",
        "action": "allow",
        "rule": None,
        "count": 0,
    }
    # The sub-agent's identical greps (same result each time) are its own chain: reminded at
    # the first threshold, denied once the same result came back no_progress_threshold times.
    sub_actions = [r["action"] for r in sub_rows]
    assert sub_actions[policy.remind_thresholds[0] - 1] == "remind"
    assert sub_actions[stuck - 1] == "deny" and sub_rows[stuck - 1]["rule"] == "no_progress"
    assert "stop" not in sub_actions


def test_claude_code_text_report_counts_saved_seconds() -> None:
    out = io.StringIO()
    assert (
        run_replay([str(CLAUDE_SAMPLE)], PRESETS["default"], stdout=out, stderr=io.StringIO()) == 0
    )
    text = out.getvalue()
    assert f"session {CLAUDE_SESSION}\n" in text
    assert f"session {CLAUDE_SESSION}/{CLAUDE_SUBAGENT}\n" in text
    summary = next(line for line in text.splitlines() if line.startswith("  15 calls"))
    # Seven test runs blocked after the stop at the third identical failure; their recorded
    # durations (from the line timestamps) add up.
    assert "a deny would have saved 7 calls (17.0 s)" in summary


def test_format_can_be_forced(tmp_path: Path) -> None:
    # Read as a transcript, a Claude Code file has no usable records: every line is bad.
    out, err = io.StringIO(), io.StringIO()
    status = run_replay(
        [str(CLAUDE_SAMPLE)],
        PRESETS["default"],
        json_output=True,
        format_name="transcript",
        stdout=out,
        stderr=err,
    )
    assert status == 1 and out.getvalue() == ""
    assert f"{CLAUDE_SAMPLE}:1: unknown record type 'file-history-snapshot'" in err.getvalue()


def _assistant(
    uses: Sequence[dict[str, Any]],
    *,
    ts: str = "2026-01-01T00:00:00.000Z",
    sidechain: bool = False,
    agent: str | None = None,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "type": "assistant",
        "sessionId": "S",
        "isSidechain": sidechain,
        "timestamp": ts,
        "message": {"role": "assistant", "content": [{"type": "tool_use", **u} for u in uses]},
    }
    if agent:
        record["agentId"] = agent
    return record


def _user(content: object, *, ts: str = "2026-01-01T00:00:02.500Z", **flags: Any) -> dict[str, Any]:
    return {
        "type": "user",
        "sessionId": "S",
        "isSidechain": False,
        "timestamp": ts,
        "message": {"role": "user", "content": content},
        **flags,
    }


def test_claude_code_decoder_pairs_tool_use_and_result() -> None:
    decoder = ClaudeCodeDecoder()
    started = list(
        decoder.decode(
            _assistant(
                [
                    {"id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                    {"id": "toolu_2", "name": "Read", "input": {"file_path": "/a"}},
                ]
            )
        )
    )
    assert started == [
        CallStarted(0, "S", None, "Bash", {"command": "ls"}, "toolu_1", 1767225600.0),
        CallStarted(1, "S", None, "Read", {"file_path": "/a"}, "toolu_2", 1767225600.0),
    ]
    finished = list(
        decoder.decode(
            _user(
                [
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "text"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "is_error": True,
                        "content": [{"type": "text", "text": "boom"}],
                    },
                    {"type": "tool_result", "tool_use_id": "toolu_unknown", "content": "x"},
                ]
            )
        )
    )
    assert finished == [
        CallFinished(1, False, "text", 2.5, 1767225602.5),
        CallFinished(0, True, [{"type": "text", "text": "boom"}], 2.5, 1767225602.5),
    ]


def test_claude_code_decoder_counts_a_tool_use_id_once() -> None:
    decoder = ClaudeCodeDecoder()
    line = _assistant([{"id": "toolu_1", "name": "Bash", "input": {}}])
    assert len(list(decoder.decode(line))) == 1
    assert list(decoder.decode(line)) == []


def test_claude_code_decoder_tells_prompts_from_system_lines() -> None:
    decoder = ClaudeCodeDecoder()
    prompt = UserPrompt("S", None, 1767225602.5)
    assert list(decoder.decode(_user("fix the test"))) == [prompt]
    assert list(
        decoder.decode(_user([{"type": "text", "text": "[Request interrupted by user]"}]))
    ) == [prompt]
    assert list(decoder.decode(_user("Caveat: local commands", isMeta=True))) == []
    assert list(decoder.decode(_user("summary of the chat", isCompactSummary=True))) == []
    assert list(decoder.decode(_user("   "))) == []
    assert list(decoder.decode({"type": "summary", "summary": "x", "leafUuid": "u"})) == []


def test_claude_code_decoder_separates_sub_agents() -> None:
    decoder = ClaudeCodeDecoder()
    (event,) = decoder.decode(
        _assistant([{"id": "toolu_9", "name": "Grep", "input": {}}], sidechain=True, agent="ab12")
    )
    assert isinstance(event, CallStarted) and event.agent == "ab12"
    (event,) = decoder.decode(
        _assistant([{"id": "toolu_8", "name": "Grep", "input": {}}], sidechain=True)
    )
    assert isinstance(event, CallStarted) and event.agent == "sidechain"


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (_assistant([{"id": "toolu_1", "input": {}}]), "tool_use 'toolu_1' without a 'name'"),
        (
            _assistant([{"name": "Bash"}]),
            'tool_use without an \'id\': {"type": "tool_use", "name": "Bash"}',
        ),
        ({"type": "assistant", "sessionId": "S"}, "missing field 'message'"),
        (
            {"type": "user", "message": {"role": "user", "content": "hi"}},
            "missing field 'sessionId'",
        ),
        (_user(42), "'message.content' must be a string or a list, got 42"),
        ("just a string", "expected a JSON object, got str"),
    ],
)
def test_claude_code_decoder_rejects_broken_records(record: object, reason: str) -> None:
    with pytest.raises(BadRecord) as caught:
        list(ClaudeCodeDecoder().decode(record))
    assert str(caught.value) == reason


def test_transcript_decoder_events() -> None:
    decoder = TranscriptDecoder()
    events = list(
        decoder.decode(
            {
                "session": 7,
                "tool": "t",
                "arguments": "a",
                "error": None,
                "call_id": "c",
                "agent": "g",
                "duration_seconds": 2,
                "timestamp": "2026-01-01T00:00:00.5Z",
            }
        )
    )
    assert events == [
        CallStarted(0, "7", "g", "t", "a", "c", 1767225600.5),
        CallFinished(0, None, None, 2.0, 1767225600.5),
    ]
    assert list(decoder.decode({"type": "user_message", "session": "s"})) == [
        UserPrompt("s", None, None)
    ]
    with pytest.raises(BadRecord, match="'duration_seconds' must be a finite number >= 0"):
        list(decoder.decode({"session": "s", "tool": "t", "arguments": {}, "duration_seconds": -1}))


# -- format detection and the registry --------------------------------------------------------


def test_detect_format() -> None:
    assert detect_format([{"type": "file-history-snapshot", "snapshot": {}}]).name == "claude-code"
    assert detect_format([{"type": "user", "sessionId": "S", "message": {}}]).name == "claude-code"
    assert detect_format([{"session": "s", "tool": "t"}]).name == "transcript"
    assert detect_format([{"type": "user_message", "session": "s"}]).name == "transcript"
    # Nothing claimed (garbage, empty file): the transcript reader, whose errors say what is missing.
    assert detect_format([[1], "x", {"foo": 1}]).name == "transcript"
    assert detect_format([]).name == "transcript"


def test_register_format_adds_a_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Spans:
        def decode(self, record: object) -> Iterable[replay.Event]:
            assert isinstance(record, dict)
            return (
                CallStarted(0, record["trace_id"], None, record["name"], {}),
                CallFinished(0, False),
            )

        def finish(self) -> Iterable[replay.Event]:
            return ()

    monkeypatch.setattr(_formats, "FORMATS", list(_formats.FORMATS))
    fmt = InputFormat(
        "spans", "span dumps", lambda r: isinstance(r, dict) and "trace_id" in r, Spans
    )
    register_format(fmt, before="claude-code")
    assert _formats.FORMATS[0] is fmt and format_by_name("spans") is fmt
    with pytest.raises(ValueError, match="already registered"):
        register_format(fmt)
    path = write(tmp_path, [json.dumps({"trace_id": "t1", "name": "search"})])
    out = io.StringIO()
    assert (
        run_replay(
            [str(path)], PRESETS["default"], json_output=True, stdout=out, stderr=io.StringIO()
        )
        == 0
    )
    assert json_lines(out.getvalue()) == [
        {"session": "t1", "index": 1, "tool": "search", "action": "allow", "rule": None, "count": 0}
    ]


# -- nothing crashes --------------------------------------------------------------------------

_FIELDS = (
    "session",
    "tool",
    "arguments",
    "error",
    "result",
    "call_id",
    "agent",
    "duration_seconds",
    "timestamp",
    "type",
    "sessionId",
    "message",
    "isSidechain",
)
_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["user_message", "user", "assistant", "tool_use"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ("type", "id", "name", "input", "content", "tool_use_id", "is_error") + _FIELDS
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
_RECORDS = st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=6)
_LINES = st.lists(
    st.one_of(_RECORDS.map(lambda r: json.dumps(r).encode()), st.binary(max_size=30)),
    max_size=12,
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=_LINES, forced=st.sampled_from([None, "transcript", "claude-code"]))
def test_any_input_gives_a_report_never_an_exception(
    lines: list[bytes], forced: str | None
) -> None:
    data = b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n"
    out = io.StringIO()
    status = run_replay(
        ["-"],
        PRESETS["default"],
        json_output=True,
        format_name=forced,
        stdin=io.BytesIO(data),
        stdout=out,
        stderr=io.StringIO(),
    )
    assert status in (0, 1)
    for row in json_lines(out.getvalue()):
        assert list(row) == ["session", "index", "tool", "action", "rule", "count"]
        assert row["action"] in {"allow", "remind", "deny", "rescue", "stop"}


def test_replay_does_not_ask_the_advisor(tmp_path: Path) -> None:
    marker = tmp_path / "asked"
    policy = PRESETS["rescue"].replace(advisor_command=f"touch {marker}")
    rescue = policy.rescue_threshold
    assert rescue is not None
    path = write(tmp_path, [call()] * (rescue + 1))
    out = io.StringIO()
    run_replay(
        [str(path)], policy, json_output=True, mode=Mode.ENFORCE, stdout=out, stderr=io.StringIO()
    )
    assert not marker.exists()
    assert "deny" in {r["action"] for r in json_lines(out.getvalue())}


def test_a_user_message_line_without_an_agent_lifts_every_agents_stop(tmp_path: Path) -> None:
    # The documented {"type": "user_message", "session": ...} line, after calls with an agent.
    loop = [call(agent="coder"), call(agent="reviewer")] * 12
    lines = [*loop, user(), call(agent="coder"), call(agent="reviewer")]
    out = io.StringIO()
    run_replay(
        [str(write(tmp_path, lines))],
        PRESETS["default"],
        json_output=True,
        stdout=out,
        stderr=io.StringIO(),
    )
    rows = json_lines(out.getvalue())
    for session in ("s1/coder", "s1/reviewer"):
        actions = [r["action"] for r in rows if r["session"] == session]
        assert actions[11] == "stop", actions  # stopped before the user spoke...
        assert actions[12] == "allow", actions  # ... and lifted by the message to the session


def test_a_user_message_without_an_agent_marks_every_agents_timeline() -> None:
    from otel_loopguard._guard import LoopGuard
    from otel_loopguard._trace_events import CallObserved

    replayer = replay.Replayer(
        LoopGuard(PRESETS["default"]), replay.ReplayClock(), timeline_sessions=4, timeline_calls=8
    )
    for agent in ("coder", "reviewer"):
        replayer.handle(0, CallObserved("s1", agent, "grep", {"q": 1}))
    replayer.handle(0, replay.UserPrompt("s1", None))
    replayer.handle(0, replay.UserPrompt("s1", "coder"))
    marks = {
        key[1]: [m.kind for m in report.timeline.marks]
        for key, report in replayer.reports.items()
        if report.timeline is not None
    }
    assert marks == {"coder": ["user message", "user message"], "reviewer": ["user message"]}
