"""The demo: a scripted looping agent, a real guard, and output that tells the truth."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from otel_loopguard import Decision, LoopGuard
from otel_loopguard._demo import (
    DEMO_AGENT,
    MAX_LOOP_CALLS,
    METRICS_ROUND_PAUSE_SECONDS,
    METRICS_STEP_SECONDS,
    SCRAPE_POLL_SECONDS,
    TERMINAL_DELAY_SECONDS,
    run_demo,
)
from otel_loopguard.config import PRESETS


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _flat(text: str) -> str:
    return " ".join(text.split())


def _step_lines(output: str, action: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip().startswith(f"guard: {action}")]


def test_demo_command_shows_reminder_denial_and_stop() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}
    # Settings meant for a real agent must not change the demo.
    env["LOOPGUARD_MODE"] = "observe"
    result = subprocess.run(
        [sys.executable, "-m", "otel_loopguard.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    policy = PRESETS["default"]
    assert policy.no_progress_threshold is not None  # the demo's tool answers the same each time
    assert _step_lines(out, "REMIND")[0].endswith(
        f"count {policy.remind_thresholds[0]} (threshold {policy.remind_thresholds[0]})"
    )
    assert _step_lines(out, "DENY")[0].endswith(
        f"count {policy.no_progress_threshold} (threshold {policy.no_progress_threshold})"
        " - the tool does not run"
    )
    assert len(_step_lines(out, "STOP")) == 1
    assert "the model gets instead of a result:" in out
    assert "the model gets, and the run should end:" in out
    assert "\x1b[" not in out  # no colours when stdout is not a terminal
    assert result.stderr == ""


def test_demo_prints_the_guards_actual_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Decision] = []
    real = LoopGuard.before_tool

    def spy(self: LoopGuard, *args: Any, **kwargs: Any) -> Decision:
        decision = real(self, *args, **kwargs)
        seen.append(decision)
        return decision

    monkeypatch.setattr(LoopGuard, "before_tool", spy)
    out = io.StringIO()
    assert run_demo(PRESETS["default"], out=out) == 0
    text = out.getvalue()
    flat = _flat(text)
    # One printed step per decision, in order, each with the action the guard returned...
    printed = [m.group(1) for m in re.finditer(r"guard: (\w+)", text)]
    assert printed == [
        d.action.value if d.action.value == "allow" else d.action.value.upper() for d in seen
    ]
    # ... and every message the model would get, word for word.
    for decision in seen:
        if decision.message:
            assert _flat(decision.message) in flat
    stop_step = next(i for i, d in enumerate(seen, start=1) if d.action.value == "stop")
    assert f"stopped the run at call {stop_step}." in flat
    saved = sum(1 for d in seen if d.blocks)
    assert f"{saved} blocked calls never ran" in flat
    assert f"the agent made {len(seen)} tool calls and {len(seen) - saved} of them ran" in flat


def test_demo_with_another_preset_tells_its_own_story() -> None:
    # The brake preset denies but never stops: the summary must say so, not repeat a script.
    out = io.StringIO()
    run_demo(PRESETS["brake"], preset="brake", out=out)
    text = out.getvalue()
    assert _step_lines(text, "DENY") and not _step_lines(text, "STOP")
    assert not _step_lines(text, "REMIND")
    assert "policy: preset brake (mode enforce;" in text
    assert (
        f"did not stop the run (the agent gave up after {MAX_LOOP_CALLS} attempts by itself)"
        in _flat(text)
    )
    assert "never reminded" in text


def test_advisory_preset_never_blocks() -> None:
    out = io.StringIO()
    run_demo(PRESETS["reminder"], preset="reminder", out=out)
    text = out.getvalue()
    assert _step_lines(text, "REMIND")
    assert not _step_lines(text, "DENY") and not _step_lines(text, "STOP")
    assert "never refused a call" in _flat(text)


def test_delay_only_on_a_terminal_unless_given() -> None:
    pauses: list[float] = []
    run_demo(PRESETS["default"], out=io.StringIO(), sleep=pauses.append)
    assert pauses == []

    run_demo(PRESETS["default"], out=_Terminal(), sleep=pauses.append)
    assert pauses and set(pauses) == {TERMINAL_DELAY_SECONDS}

    pauses.clear()
    run_demo(PRESETS["default"], out=io.StringIO(), delay=0.25, sleep=pauses.append)
    assert pauses and set(pauses) == {0.25}


def test_colours_on_a_terminal_unless_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    terminal = _Terminal()
    run_demo(PRESETS["default"], out=terminal, delay=0, sleep=lambda _: None)
    assert "\x1b[31mDENY\x1b[0m" in terminal.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    plain = _Terminal()
    run_demo(PRESETS["default"], out=plain, delay=0, sleep=lambda _: None)
    assert "\x1b[" not in plain.getvalue()


def test_demo_never_runs_an_advisor_command(tmp_path: Any) -> None:
    marker = tmp_path / "asked"
    out = io.StringIO()
    run_demo(PRESETS["rescue"].replace(advisor_command=f"touch {marker}"), preset="rescue", out=out)
    assert not marker.exists()
    assert _step_lines(out.getvalue(), "DENY")


@pytest.mark.parametrize("delay", ["-1", "soon", "nan"])
def test_bad_delay_is_a_usage_error(delay: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "otel_loopguard.cli", "demo", "--delay", delay],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "argument --delay" in result.stderr and "Traceback" not in result.stderr


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _decisions(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], action: str) -> float:
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "loopguard_decisions_total" and ("action", action) in labels
    )


class _Scraper:
    """The demo's ``sleep``: scrapes the demo's endpoint when the demo waits for a scrape or
    pauses between plays, and never sleeps."""

    def __init__(self, out: io.StringIO, interrupt_after: int | None = None) -> None:
        self.out = out
        self.scrapes: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []
        self.pauses: list[float] = []
        self.interrupt_after = interrupt_after

    def url(self) -> str:
        match = re.search(
            r"^metrics: (http://127\.0\.0\.1:\d+/metrics)$", self.out.getvalue(), re.M
        )
        assert match is not None
        return match[1]

    def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if seconds == SCRAPE_POLL_SECONDS and not self.scrapes:
            assert "Waiting for the first scrape" in _flat(self.out.getvalue())
            assert "run_tests(" not in self.out.getvalue()  # nothing ran before it
            self.scrapes.append(_scrape(self.url()))
        elif seconds == METRICS_ROUND_PAUSE_SECONDS:
            self.scrapes.append(_scrape(self.url()))
            if self.interrupt_after is not None and len(self.scrapes) > self.interrupt_after:
                raise KeyboardInterrupt  # what Ctrl-C does while the demo waits


def _calls(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], tool: str) -> float:
    return samples[("loopguard_tool_calls_total", (("agent", DEMO_AGENT), ("tool", tool)))]


def test_demo_with_metrics_waits_for_the_first_scrape_with_series_at_zero() -> None:
    out = io.StringIO()
    scraper = _Scraper(out)
    assert run_demo(PRESETS["default"], out=out, metrics_port=0, sleep=scraper, rounds=1) == 0
    first = scraper.scrapes[0]
    for tool in ("read_file", "run_tests", "search_code", "edit_file"):
        assert _calls(first, tool) == 0
        assert (
            first[("loopguard_repeated_calls_total", (("agent", DEMO_AGENT), ("tool", tool)))] == 0
        )
    assert _decisions(first, "stop") == _decisions(first, "deny") == 0
    assert any(name == "loopguard_decisions_total" for name, _ in first)
    # Paced for scrapes: one step per METRICS_STEP_SECONDS.
    steps = len(re.findall(r"^\s+\d+  \w+\(", out.getvalue(), re.M))
    assert scraper.pauses.count(METRICS_STEP_SECONDS) >= steps


@pytest.mark.slow
def test_demo_serves_its_metrics_and_plays_again_until_interrupted() -> None:
    out = io.StringIO()
    scraper = _Scraper(out, interrupt_after=2)
    assert run_demo(PRESETS["default"], out=out, metrics_port=0, delay=0, sleep=scraper) == 0
    text = out.getvalue()
    url = scraper.url()
    assert f"metrics: serving {url}" in text
    assert "Press Ctrl-C to stop." in _flat(text)
    after_first, after_second = scraper.scrapes[1], scraper.scrapes[2]
    assert _decisions(after_first, "stop") == len(_step_lines(text, "STOP")) == 1
    assert _decisions(after_first, "deny") == len(_step_lines(text, "DENY"))
    assert _decisions(after_first, "remind") == len(_step_lines(text, "REMIND"))
    calls = len(re.findall(r"^\s+\d+  run_tests\(", text, re.M))
    assert _calls(after_first, "run_tests") == calls
    # The second play is the same story in a new run: every count doubles.
    assert _calls(after_second, "run_tests") == 2 * calls
    assert _decisions(after_second, "stop") == 2
    play = re.search(r"^play 2: (\d+) calls, ", text, re.M)
    assert play is not None and int(play[1]) == len(re.findall(r"^\s+\d+  \w+\(", text, re.M))
    with pytest.raises(OSError):  # closed when the demo ended
        _scrape(url)


def test_demo_metrics_port_as_a_command() -> None:
    import queue
    import threading

    process = subprocess.Popen(
        [sys.executable, "-m", "otel_loopguard.cli", "demo", "--delay", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout

    def pump() -> None:
        for line in stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        url = None
        while url is None:
            match = re.match(r"metrics: (http://\S+)$", lines.get(timeout=60))
            url = match[1] if match else None
        first = _scrape(url)  # the story starts at the first scrape
        assert _calls(first, "run_tests") == 0
        while "Ctrl-C" not in lines.get(timeout=60):
            pass
        samples = _scrape(url)
        assert _decisions(samples, "stop") == 1
        assert samples[("loopguard_sessions", ())] == 1
        assert process.poll() is None  # still serving, and playing again
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_demo_metrics_port_taken_or_bad_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import socket

    from otel_loopguard.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--delay", "0", "--metrics-port", str(port)]) == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}" in capsys.readouterr().err
    assert main(["demo", "--metrics-port", "70000"]) == 2
    assert "argument --metrics-port" in capsys.readouterr().err


@pytest.mark.parametrize("stop_after", [1, 2, 3])
def test_the_policy_line_and_the_stop_state_the_real_counts(stop_after: int) -> None:
    policy = PRESETS["default"].replace(stop_after_denials=stop_after)
    out = io.StringIO()
    run_demo(policy, out=out)
    text = out.getvalue()
    assert policy.no_progress_threshold is not None and policy.deny_threshold is not None
    assert (
        f"deny from {policy.deny_threshold} ({policy.no_progress_threshold} when the result"
        f" repeats); stop after {stop_after} denials or {policy.failure_stop_threshold}"
        " identical failures;" in text
    )
    denials = _step_lines(text, "DENY")
    assert len(denials) == stop_after
    (stop,) = _step_lines(text, "STOP")
    assert stop.endswith(
        f"; {stop_after} call{'s' if stop_after != 1 else ''} refused before"
        f" (threshold {stop_after}) - the tool does not run"
    )
