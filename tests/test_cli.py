"""The otel-loopguard command line: entry points, exit statuses, lazy imports."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from otel_loopguard import __version__
from otel_loopguard.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"otel-loopguard {__version__}\n"


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "demo" in out and "replay" in out


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert (
        "error: a command is required (demo, replay, hook, serve, memory)"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["launch"],
        ["replay"],
        ["replay", "--bogus", "x.jsonl"],
        ["replay", "--mode", "panic", "x.jsonl"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_console_script_runs() -> None:
    # the script installed beside the Python running the tests (its virtualenv), else on PATH
    script = shutil.which("otel-loopguard", path=str(Path(sys.executable).parent))
    script = script or shutil.which("otel-loopguard")
    assert script is not None, "the otel-loopguard console script is not installed"
    result = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert result.stdout == f"otel-loopguard {__version__}\n"


def test_importing_the_cli_does_not_import_subcommands() -> None:
    code = (
        "import sys, otel_loopguard.cli; "
        "print(sorted(m for m in ('otel_loopguard.replay', 'otel_loopguard._demo') "
        "if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_demo_runs_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--delay", "0"]) == 0
    assert "guard: STOP" in capsys.readouterr().out


def test_a_mistyped_option_gets_the_subcommands_usage_and_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["replay", "--jsn", "x.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: otel-loopguard replay ")
    assert "--json" in err.split("error:")[0]  # the replay usage, with its options
    assert err.rstrip().endswith(
        "otel-loopguard replay: error: unrecognized arguments: --jsn (did you mean --json?)"
    )


def test_an_unknown_option_with_nothing_close_gets_no_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["replay", "x.jsonl", "--zzzzzz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: otel-loopguard replay ")
    assert err.rstrip().endswith("error: unrecognized arguments: --zzzzzz")
