"""The entry point, :func:`run_replay`: check the inputs, read, replay, report."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, TextIO

from .._spans import KeyBy
from .._trace_events import CallDecidedAtStart, CallObserved
from . import _html
from ._events import CallFinished, CallStarted, Event
from ._formats import format_by_name
from ._reader import _BadLines, _Progress, _read_events
from ._replayer import ReplayClock, Replayer
from ._report import (
    _json_line,
    format_session,
    format_session_summary,
    format_spend_totals,
    format_totals,
    plural,
    summary_json_line,
)

if TYPE_CHECKING:
    from otel_loopguard.config import Mode, Policy

    from ._events import InputFormat
    from ._replayer import SessionReport


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


def _reading(label: str, events: Iterator[Event], bad: _BadLines) -> Iterator[Event]:
    """``events``, with an error reading the input reported as an unreadable file (the rest of
    the file is skipped). Only reading is guarded: an error writing the report (a closed pipe
    on stdout) is not the input's fault and goes to the caller."""
    try:
        yield from events
    except OSError as exc:
        bad.unreadable(label, exc.strerror or str(exc))


def _open_html(path: str) -> TextIO:
    """Open the ``--html`` file before anything is replayed; raises :class:`UsageError`."""
    try:
        return open(path, "w", encoding="utf-8")  # closed by run_replay
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


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
    html_path: str | None = None,
    summary: bool = False,
) -> int:
    """Replay ``paths`` (``-`` is stdin; a directory is its ``*.jsonl`` files) through a fresh
    guard with ``policy`` and write the report; return the exit status (0 all input read, 1 some
    lines bad or a file unreadable).

    ``mode`` overrides the policy's mode. ``key_by`` keys recorded traces' sessions by trace and
    agent (default) or by conversation, as the span processor and ``serve`` can. The policy's
    advisor is dropped: a replay reports where a rescue would trip but never buys advice.
    ``progress`` forces the progress bar on or off (default: on when ``stderr`` is a terminal,
    the input is large and the output is not JSON). ``html_path`` also writes the HTML report
    there (a timeline per session; see :mod:`otel_loopguard.replay._html` for its bounds),
    besides the text or JSON output. ``summary`` prints one line per session instead, its totals
    and trips (text, or JSON with ``json_output``). Raises :class:`UsageError` for a missing or
    unreadable path, an unknown format name or an HTML file that cannot be written. An error
    writing to ``stdout`` (a closed pipe) propagates.
    """
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
    html_out = _open_html(html_path) if html_path is not None else None
    try:
        return _replay(
            inputs,
            policy,
            json_output=json_output,
            fmt=fmt,
            source_in=source_in,
            out=out,
            err=err,
            progress=progress,
            keyed_by=keyed_by,
            html_out=html_out,
            html_path=html_path,
            summary=summary,
        )
    finally:
        if html_out is not None:
            html_out.close()


def _replay(
    inputs: list[str],
    policy: Policy,
    *,
    json_output: bool,
    fmt: InputFormat | None,
    source_in: IO[bytes],
    out: TextIO,
    err: TextIO,
    progress: bool | None,
    keyed_by: KeyBy,
    html_out: TextIO | None,
    html_path: str | None,
    summary: bool,
) -> int:
    """The replay itself, once the inputs and options are checked (see :func:`run_replay`)."""
    from otel_loopguard._guard import LoopGuard

    clock = ReplayClock()
    # Timelines (per-session call lists) are kept only for the HTML report, bounded by it.
    timelines = html_out is not None
    guard = LoopGuard(policy=policy, clock=clock)
    # Replay's output is its report: a log line about an unpriced model would only mix into it.
    guard.log_unpriced_models = False
    replayer = Replayer(
        guard,
        clock,
        timeline_sessions=_html.MAX_HTML_SESSIONS if timelines else 0,
        timeline_calls=_html.MAX_HTML_CALLS if timelines else 0,
    )
    # Never with --json: its lines go to stdout as the replay runs, and on a terminal they
    # would be drawn through the bar.
    show_progress = (err.isatty() and not json_output) if progress is None else progress
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
            for event in _reading(label, _read_events(label, handle, fmt, bad, bar, keyed_by), bad):
                started = replayer.handle(source, event)
                if started is not None and json_output and not summary:
                    report, index, decision = started
                    assert isinstance(
                        event, (CallStarted, CallFinished, CallDecidedAtStart, CallObserved)
                    )
                    tool = decision.tool if isinstance(event, CallFinished) else event.tool
                    out.write(_json_line(report, index, tool, decision))
        finally:
            if handle is not source_in:
                handle.close()
        bad.end_file(label)
    bar.close()

    replayer.settle_spend()
    reports = list(replayer.reports.values())
    if json_output and summary:
        for report in reports:
            out.write(summary_json_line(report))
    elif not json_output:
        _write_text(out, reports, len(inputs), policy, bad.total, summary=summary)
        skipped = guard.skipped_model_calls
        if skipped:
            fields = ", ".join(f"{field} {count}" for field, count in sorted(skipped.items()))
            out.write(
                f"{plural(sum(skipped.values()), 'model call')} not counted: their usage did"
                f" not read ({fields})\n"
            )
    out.flush()
    if html_out is not None:
        replayer.keep_drawn_timelines()
        try:
            html_out.write(
                _html.render_html(reports, inputs=inputs, policy=policy, bad_lines=bad.total)
            )
            html_out.flush()
        except OSError as exc:
            raise UsageError(f"cannot write {html_path}: {exc.strerror or exc}") from None
        err.write(f"otel-loopguard replay: HTML report written to {html_path}\n")
    return _exit_status(bad, err)


def _write_text(
    out: TextIO,
    reports: list[SessionReport],
    inputs: int,
    policy: Policy,
    bad_lines: int,
    *,
    summary: bool,
) -> None:
    """The text report: a header, each session (in full, or one line each with ``summary``),
    the totals."""
    out.write(f"replay: {inputs} input{'s' if inputs != 1 else ''}, mode {policy.mode.value}\n\n")
    for report in reports:
        if summary:
            out.write(format_session_summary(report))
        else:
            out.write(format_session(report))
            out.write("\n")
    if summary:
        out.write("\n")
    out.write(format_totals(reports, inputs, bad_lines))
    out.write(format_spend_totals(reports))


def _exit_status(bad: _BadLines, err: TextIO) -> int:
    """0 when every input was read; else 1, after a note on ``err`` of what was not."""
    if not (bad.total or bad.unreadable_files):
        return 0
    parts = []
    if bad.total:
        parts.append(f"{bad.total} bad line{'s' if bad.total != 1 else ''} skipped")
    if bad.unreadable_files:
        parts.append(
            f"{bad.unreadable_files} file{'s' if bad.unreadable_files != 1 else ''} unreadable"
        )
    err.write(
        f"otel-loopguard replay: {' and '.join(parts)}; not all input was read (exit status 1)\n"
    )
    return 1
