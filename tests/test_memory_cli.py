"""``otel-loopguard memory list|show|forget|clear`` (issue 28)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_loopguard._memory import DeadEnd, FileMemory, SqliteMemory
from otel_loopguard.cli import main
from otel_loopguard.config import Policy


def _entry(key: str, scope: str, runs: int = 1) -> DeadEnd:
    now = time.time()
    return DeadEnd(scope, key, "o1", "bash", "no_progress", 4, runs, now, now, f"run-{key}")


@pytest.fixture
def memory_file(tmp_path: Path) -> Path:
    path = tmp_path / "memory.json"
    memory = FileMemory(path, Policy())
    memory.record(_entry("a1b2c3d4e5f6a7b8", "global"))
    memory.record(_entry("ffeeddccbbaa0099", f"repository:{tmp_path}"))
    return path


def test_list_show_forget_clear(memory_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--memory", str(memory_file)]
    assert main(["memory", "list", *where]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith(("a1b2c3d4e5f6  bash", "ffeeddccbbaa  bash"))
    assert "1 run, last " in lines[0] and "4 attempts" in lines[0]

    assert main(["memory", "show", "a1b2c3", *where]) == 0
    shown = capsys.readouterr().out
    assert "signature  a1b2c3d4e5f6a7b8" in shown and "scope      global" in shown

    assert main(["memory", "list", "--json", "--scope", "global", *where]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["key"] == "a1b2c3d4e5f6a7b8"

    assert main(["memory", "forget", "a1b2c3", *where]) == 0
    assert capsys.readouterr().out.startswith("forgot 1 dead end ")
    assert main(["memory", "forget", "a1b2c3", *where]) == 1
    assert main(["memory", "show", "a1b2c3", *where]) == 1
    capsys.readouterr()
    assert main(["memory", "clear", "--scope", str(memory_file.parent), *where]) == 0
    assert capsys.readouterr().out.startswith("forgot 1 dead end ")
    assert main(["memory", "list", *where]) == 0
    assert capsys.readouterr().out.startswith("no dead ends remembered")


def test_the_hooks_state_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "hooks.sqlite3"
    memory = SqliteMemory(store, Policy())
    memory.record(_entry("0123456789abcdef", "agent:coder", runs=1))
    memory.flush()
    assert main(["memory", "list", "--store", str(store)]) == 0
    assert "agent:coder" in capsys.readouterr().out
    assert main(["memory", "clear", "--store", str(store)]) == 0
    assert SqliteMemory(store, Policy()).entries() == []


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["memory", "forget", "abc"], "give a signature of at least 6 hex characters"),
        (["memory", "show", "zzzzzzzz"], "give a signature of at least 6 hex characters"),
        (["memory", "list", "abcdef"], "list takes no signature"),
        (["memory", "list", "--scope", "/no/such/dir"], "is not global, agent:NAME"),
    ],
)
def test_usage_errors(argv: list[str], error: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "otel_loopguard", *argv, "--memory", str(tmp_path / "m.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert error in done.stderr and "Traceback" not in done.stderr
