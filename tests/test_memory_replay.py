"""``otel-loopguard replay`` with a memory (issue 28): a session reminded from an earlier
session's dead end shows rule ``memory`` in the text and JSON reports and is marked in the
HTML report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_loopguard.cli import main


def _lines(session: str, times: int) -> list[str]:
    call = {"session": session, "tool": "bash", "arguments": {"command": "make test"}}
    return [json.dumps({**call, "error": True, "result": "make: *** [test] Error 1"})] * times


def test_replay_marks_calls_reminded_from_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = tmp_path / "sessions.jsonl"
    recorded.write_text("\n".join(_lines("monday", 6) + _lines("tuesday", 2)) + "\n")
    config = tmp_path / "loopguard.toml"
    memory = tmp_path / "memory.json"
    config.write_text(f'memory = "{memory}"\nmemory_scope = "global"\n')
    html = tmp_path / "report.html"
    argv = ["replay", str(recorded), "--config", str(config), "--format", "transcript"]
    assert main([*argv, "--json"]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    tuesday = [a for a in answers if a["session"] == "tuesday" and a["action"] != "allow"]
    assert [(a["index"], a["action"], a["rule"]) for a in tuesday] == [(2, "remind", "memory")]
    memory.unlink()  # the same input again, for the HTML report: monday records it again
    assert main([*argv, "--html", str(html)]) == 0
    text = capsys.readouterr().out
    assert "memory" in text
    page = html.read_text()
    assert 'class="m remind mem"' in page
    assert "reminded from memory: an earlier run was refused or stopped for it" in page
