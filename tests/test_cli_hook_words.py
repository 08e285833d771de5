"""``hook``'s ordinary command line is read without argparse (issue 29 item 1), and reads as
argparse reads it: every command line below is parsed both ways; where the light reader
declines (help, mistakes, rare spellings) argparse answers, with its own output."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from otel_loopguard._cli_hook import HookArguments, hook_arguments
from otel_loopguard._cli_parser import hook_arguments_of
from otel_loopguard.cli import build_parser

#: Command lines (after ``hook``) the light reader reads.
READ = [
    ["claude-code"],
    ["codex", "--store", "/tmp/s.sqlite3"],
    ["--store=/tmp/s.sqlite3", "gemini-cli"],
    ["claude-code", "--store", "", "--fail-closed"],
    ["claude-code", "--preset", "strict", "--config", "p.toml", "--plugin-config", "x=y.yaml"],
    ["claude-code", "--server", "http://127.0.0.1:4318", "--token", "t", "--timeout", "2.5"],
    ["claude-code", "--server=http://h:1", "--token-file", "/tmp/tok", "--timeout=0"],
    ["claude-code", "--store=--odd", "--fail-closed"],
    ["--fail-closed", "--timeout", "1e1", "codex"],
]

#: Command lines the light reader leaves to argparse: each is valid or not for argparse.
DECLINED = [
    [],
    ["--help"],
    ["claude-code", "-h"],
    ["claude-code", "--stor", "x"],  # abbreviated: argparse accepts it
    ["claude-code", "--store"],
    ["claude-code", "--store", "-"],  # argparse reads "-" as the value
    ["claude-code", "--store", "--fail-closed"],
    ["claude-code", "--fail-closed", "--fail-closed"],
    ["claude-code", "--store", "a", "--store", "b"],
    ["claude-code", "--token", "t", "--token-file", "f"],
    ["claude-code", "--timeout", "-1"],
    ["claude-code", "--timeout", "nan"],
    ["claude-code", "--timeout", "inf"],
    ["claude-code", "--timeout", "soon"],
    ["claude-code", "--fail-closed=yes"],
    ["claude-code", "codex"],
    ["cursor"],
    ["claude-code", "--unknown"],
    ["claude-code", "--", "x"],
]


def by_argparse(words: list[str]) -> HookArguments:
    return hook_arguments_of(build_parser(hook_only=True).parse_args(["hook", *words]))


@pytest.mark.parametrize("words", READ, ids=" ".join)
def test_read_as_argparse_reads_it(words: list[str]) -> None:
    read = hook_arguments(words)
    assert read is not None
    assert read == by_argparse(words)


@pytest.mark.parametrize("words", DECLINED, ids=lambda w: " ".join(w) or "nothing")
def test_anything_else_is_left_to_argparse(words: list[str]) -> None:
    assert hook_arguments(words) is None


def test_the_options_are_argparse_s_options() -> None:
    """A new option of ``hook`` must be taught to the light reader (or it declines every
    command line that uses it, and the hook pays for argparse again)."""
    parser = build_parser(hook_only=True)
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    options = {o for a in commands.choices["hook"]._actions for o in a.option_strings}
    for option in options - {"-h", "--help", "--fail-closed"}:
        value = "1" if option == "--timeout" else "v"
        assert hook_arguments(["codex", option, value]) == by_argparse(["codex", option, value])


def run_cli(*words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_loopguard", *words],
        input="{}",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_help_is_argparse_s_help() -> None:
    parser = build_parser(hook_only=True)
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    shown = run_cli("hook", "--help")
    assert shown.returncode == 0
    assert shown.stdout == commands.choices["hook"].format_help()
    assert "usage: otel-loopguard hook [-h]" in shown.stdout


def test_a_mistake_is_argparse_s_error_and_an_answer() -> None:
    shown = run_cli("hook", "claude-code", "--timeout", "soon")
    assert shown.returncode == 0  # a hook always answers
    assert shown.stdout.strip() == "{}"  # fail-open: allowed
    lines = shown.stderr.splitlines()
    assert lines[0].startswith("usage: otel-loopguard hook [-h]")
    assert "argument --timeout: expected a number of seconds, got 'soon'" in shown.stderr
