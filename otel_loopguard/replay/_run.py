"""The entry point, :func:`run_replay`: check the inputs, read, replay, report."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, TextIO

from ..spans import KeyBy
from ..traces import CallDecidedAtStart, CallObserved
from ._events import CallFinished, CallStarted
from ._formats import format_by_name
from ._reader import _BadLines, _Progress, _read_events
from ._replayer import ReplayClock, Replayer
from ._report import _json_line, format_session, format_totals

if TYPE_CHECKING:
    from otel_loopguard.config import Mode, Policy


class UsageError(Exception):
    """The command line cannot be carried out (missing file, bad policy); exit status 2."""


def _expand(paths: Sequence[str]) -> list[str]:
    """Check the inputs before anything is replayed; a directory means its ``*.jsonl`` files.
    Raises :class:`UsageError` naming a missing or unusable path."""
    inputs: list[str] = []
    for raw in paths:
        if raw == "-":
            inputs.append(raw)
            continue
        path = Path(raw)
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*.jsonl") if p.is_file())
            if not found:
                raise UsageError(f"no .jsonl files in directory: {raw}")
            inputs.extend(found)
        elif not path.exists():
            raise UsageError(f"no such file: {raw}")
        elif not os.access(path, os.R_OK):
            raise UsageError(f"cannot read file (permission denied): {raw}")
        else:
            inputs.append(raw)
    return inputs


def _input_size(inputs: Sequence[str]) -> int | None:
    total = 0
    for name in inputs:
        if name == "-":
            return None
        try:
            total += os.stat(name).st_size
        except OSError:
            return None
    return total


def run_replay(
    paths: Sequence[str],
    policy: Policy,
    *,
    json_output: bool = False,
    format_name: str | None = None,
    mode: Mode | None = None,
    stdin: IO[bytes] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    progress: bool | None = None,
    key_by: KeyBy | str = KeyBy.TRACE,
) -> int:
    """Replay ``paths`` (``-`` is stdin; a directory is its ``*.jsonl`` files) through a fresh
    guard with ``policy`` and write the report; return the exit status (0 all input read, 1 some
    lines bad or a file unreadable).

    ``mode`` overrides the policy's mode. ``key_by`` keys recorded traces' sessions by trace and
    agent (default) or by conversation, as the span processor and ``serve`` can. The policy's
    advisor is dropped: a replay reports where a rescue would trip but never buys advice.
    ``progress`` forces the progress bar on or off (default: on when ``stderr`` is a terminal and
    the input is large). Raises :class:`UsageError` for a missing or unreadable path or an
    unknown format name.
    """
    from otel_loopguard.guard import LoopGuard

    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    source_in = stdin if stdin is not None else sys.stdin.buffer
    try:
        fmt = format_by_name(format_name) if format_name is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        keyed_by = KeyBy(key_by)
    except ValueError:
        raise UsageError(f"key_by: expected 'trace' or 'conversation', got {key_by!r}") from None
    inputs = _expand(paths)
    changes: dict[str, object] = {"advisor_command": None}
    if mode is not None:
        changes["mode"] = mode
    policy = policy.replace(**changes)

    clock = ReplayClock()
    replayer = Replayer(LoopGuard(policy=policy, clock=clock), clock)
    show_progress = err.isatty() if progress is None else progress
    bar = _Progress(err, _input_size(inputs), show_progress)
    bad = _BadLines(err, bar)

    for source, name in enumerate(inputs):
        label = "<stdin>" if name == "-" else name
        try:
            handle: IO[bytes] = source_in if name == "-" else open(name, "rb")  # noqa: SIM115
        except OSError as exc:
            bad.unreadable(label, exc.strerror or str(exc))
            continue
        try:
            for event in _read_events(label, handle, fmt, bad, bar, keyed_by):
                started = replayer.handle(source, event)
                if started is not None and json_output:
                    report, index, decision = started
                    assert isinstance(event, (CallStarted, CallFinished, CallDecidedAtStart,
                                              CallObserved))
                    tool = decision.tool if isinstance(event, CallFinished) else event.tool
                    out.write(_json_line(report, index, tool, decision))
        except OSError as exc:
            bad.unreadable(label, exc.strerror or str(exc))
        finally:
            if handle is not source_in:
                handle.close()
        bad.end_file(label)
    bar.clear()

    reports = list(replayer.reports.values())
    if not json_output:
        out.write(f"replay: {len(inputs)} input{'s' if len(inputs) != 1 else ''},"
                  f" mode {policy.mode.value}\n\n")
        for report in reports:
            out.write(format_session(report))
            out.write("\n")
        out.write(format_totals(reports, len(inputs), bad.total))
    out.flush()
    if bad.total or bad.unreadable_files:
        parts = []
        if bad.total:
            parts.append(f"{bad.total} bad line{'s' if bad.total != 1 else ''} skipped")
        if bad.unreadable_files:
            parts.append(f"{bad.unreadable_files} file{'s' if bad.unreadable_files != 1 else ''}"
                         " unreadable")
        err.write(f"otel-loopguard replay: {' and '.join(parts)}; not all input was read"
                  " (exit status 1)\n")
        return 1
    return 0
