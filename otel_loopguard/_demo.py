"""``otel-loopguard demo``: a scripted looping agent meeting a real :class:`LoopGuard`.

No model, network or keys: the "agent" is a fixed script of tool calls and the tools return
canned results. Everything the guard says is real: each call goes through
``LoopGuard.before_tool`` and, when it runs, ``after_tool``; what is printed (actions, rules,
counts, the texts the model would get, the summary) is read from the returned decisions.

The story: an agent fixing a failing test keeps re-running the test without changing anything.
The guard reminds it, then refuses the call, then stops the run (with the ``default`` preset;
other presets show their own ladder). The user then steps in, which starts a new progress epoch,
and the agent fixes the bug.

With ``--metrics-port`` the demo is paced for Prometheus: the guard's series for the agent's tools
exist at zero from the start, the story waits for the first scrape, plays one step per
:data:`METRICS_STEP_SECONDS`, and then plays again in a new run every
:data:`METRICS_ROUND_PAUSE_SECONDS` until interrupted, so every call shows on the dashboard.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TextIO

import orjson

if TYPE_CHECKING:
    from otel_loopguard._guard import LoopGuard
    from otel_loopguard._policy import Decision
    from otel_loopguard.config import Policy
    from otel_loopguard.metrics import MetricsServer

__all__ = [
    "DEMO_AGENT",
    "MAX_LOOP_CALLS",
    "METRICS_ROUND_PAUSE_SECONDS",
    "METRICS_STEP_SECONDS",
    "SCRAPE_POLL_SECONDS",
    "MetricsServeError",
    "TERMINAL_DELAY_SECONDS",
    "run_demo",
]

#: Pause between steps when stdout is a terminal and no ``--delay`` is given.
TERMINAL_DELAY_SECONDS: Final = 0.6
#: Pause between steps with ``metrics_port`` and no ``--delay``: a Prometheus scraping every few
#: seconds sees the loop grow over several scrapes, not appear whole in one.
METRICS_STEP_SECONDS: Final = 1.0
#: With ``metrics_port``: the pause before the story plays again, in a new run of the agent.
METRICS_ROUND_PAUSE_SECONDS: Final = 10.0
#: How often the demo looks whether its metrics were scraped yet (before the first play).
SCRAPE_POLL_SECONDS: Final = 0.1
#: The agent's name in the guard's metrics (the ``agent`` label).
DEMO_AGENT: Final = "demo-agent"
#: The stuck agent gives up by itself after this many calls of its loop if the guard never stops it.
MAX_LOOP_CALLS: Final = 20

_SESSION: Final = "demo-session"
_TEST_PATH: Final = "tests/test_durations.py"
_SOURCE_PATH: Final = "src/durations.py"
_FAILURE: Final = (
    "FAILED tests/test_durations.py::test_parse_minutes - AssertionError: assert 90 == 5400\n"
    "1 failed, 7 passed in 0.31s"
)


@dataclass(frozen=True, slots=True)
class _Call:
    """One scripted tool call and what the (fake) tool returns when it runs."""

    tool: str
    arguments: Mapping[str, object]
    result: str
    error: bool = False
    seconds: float = 0.5


# The test runner itself works: its output reports a failing test (the call did not fail). A
# call that fails the same way three times would stop the run at once (failure_stop_threshold),
# without the reminder, the denials and the stop this story shows.
_RUN_TESTS: Final = _Call("run_tests", {"path": _TEST_PATH}, _FAILURE, seconds=2.7)

_WARMUP: Final = (
    _Call(
        "read_file",
        {"path": _SOURCE_PATH},
        '_UNITS = {"s": 1, "m": 1, "h": 3600}\n\ndef parse_duration(text): ...',
        seconds=0.1,
    ),
    _RUN_TESTS,
    _Call(
        "search_code",
        {"pattern": "_UNITS"},
        'src/durations.py:3: _UNITS = {"s": 1, "m": 1, "h": 3600}',
        seconds=0.4,
    ),
)

_USER_PROMPT: Final = "Stop re-running the test and look at the minutes entry in _UNITS."

_AFTER_USER: Final = (
    _Call(
        "edit_file",
        {"path": _SOURCE_PATH, "old": '"m": 1', "new": '"m": 60'},
        "src/durations.py: 1 line changed",
        seconds=0.1,
    ),
    _Call("run_tests", {"path": _TEST_PATH}, "8 passed in 0.29s", seconds=2.6),
)


class MetricsServeError(Exception):
    """The metrics endpoint could not be started (bad address, port taken)."""


class _ScrapeWatch:
    """A collector that exports nothing and notes that the registry was collected (a scrape)."""

    def __init__(self) -> None:
        self.scraped = threading.Event()

    def describe(self) -> list[object]:
        return []

    def collect(self) -> list[object]:
        self.scraped.set()
        return []


class _Style:
    """ANSI emphasis on a terminal (unless ``NO_COLOR`` is set); plain text otherwise."""

    _CODES: Final = {
        "allow": "32",
        "remind": "33",
        "deny": "31",
        "rescue": "35",
        "stop": "1;31",
        "dim": "2",
        "bold": "1",
    }

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, kind: str, text: str) -> str:
        if not self.enabled:
            return text
        return f"\x1b[{self._CODES[kind]}m{text}\x1b[0m"


@dataclass(slots=True)
class _Tally:
    calls: int = 0
    ran: int = 0
    first_step: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    saved_seconds: float = 0.0
    stopped_at: int | None = None
    refused: int = 0  # calls denied (or rescued) in the current progress epoch
    finished_ok: bool = False

    def count(self, action: str) -> int:
        """Count one call the guard answered with ``action``; its number in the story."""
        self.calls += 1
        self.counts[action] = self.counts.get(action, 0) + 1
        if action != "allow":
            self.first_step.setdefault(action, self.calls)
        if action in ("deny", "rescue"):
            self.refused += 1
        return self.calls


class _Clock:
    """The guard's clock in the demo: it moves by each tool's pretend duration, never sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _call_text(call: _Call) -> str:
    arguments = ", ".join(
        f"{name}={orjson.dumps(value).decode()}" for name, value in call.arguments.items()
    )
    return f"{call.tool}({arguments})"


def _ladder(policy: Policy) -> str:
    """A one-line description of the policy's ladder, read from the policy itself."""
    from otel_loopguard.config import Rule

    parts = [f"mode {policy.mode.value}"]
    if policy.remind_thresholds:
        parts.append("remind at " + ", ".join(str(t) for t in policy.remind_thresholds))
    stuck = policy.no_progress_threshold if Rule.NO_PROGRESS in policy.rules else None
    if policy.deny_threshold is not None:
        deny = f"deny from {policy.deny_threshold}"
        if stuck is not None and stuck < policy.deny_threshold:
            deny += f" ({stuck} when the result repeats)"
        parts.append(deny)
    elif stuck is not None:
        parts.append(f"deny from {stuck} when the result repeats")
    stops = []
    if policy.stop_after_denials is not None:
        stops.append(f"{policy.stop_after_denials} denials")
    if policy.failure_stop_threshold is not None:
        stops.append(f"{policy.failure_stop_threshold} identical failures")
    if stops:
        parts.append("stop after " + " or ".join(stops))
    parts.append("rules " + ", ".join(sorted(rule.value for rule in policy.rules)))
    return "; ".join(parts)


class _Screen:
    def __init__(self, out: TextIO, style: _Style, width: int) -> None:
        self.out = out
        self.style = style
        self.width = width

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def block(self, label: str, text: str, indent: int = 7) -> None:
        """``label`` then ``text`` wrapped under it (each paragraph of ``text`` kept)."""
        prefix = " " * indent
        self.line(prefix + label)
        for paragraph in text.splitlines() or [""]:
            wrapped = textwrap.wrap(paragraph, max(40, self.width - indent - 2)) or [""]
            for piece in wrapped:
                self.line(prefix + "  " + self.style("dim", piece) if piece else "")


def run_demo(
    policy: Policy,
    *,
    preset: str | None = "default",
    delay: float | None = None,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
    metrics_port: int | None = None,
    metrics_addr: str = "127.0.0.1",
    rounds: int | None = None,
) -> int:
    """Play the scripted agent against a fresh guard with ``policy`` and print each step to
    ``out`` (default stdout); return exit status 0.

    ``delay`` is the pause between steps (default :data:`TERMINAL_DELAY_SECONDS` when ``out`` is a
    terminal, else none); ``sleep`` performs it and every other wait (tests inject one). The
    policy's advisor is dropped so the demo never runs an outside command; a rescue shows as the
    local denial.

    With ``metrics_port`` (0: any free port), the guard's Prometheus metrics are served on
    ``metrics_addr`` for Prometheus and the Grafana dashboard, paced for scrapes:

    1. the agent's tools are declared to the recorder, so their series exist at zero before the
       first call (``increase()`` then sees every call, the first ones included);
    2. the story waits until the endpoint is first scraped;
    3. it plays with ``delay`` between steps (default :data:`METRICS_STEP_SECONDS`);
    4. it plays again, in a new run of the same session (a new progress epoch), every
       :data:`METRICS_ROUND_PAUSE_SECONDS`, one summary line per play, until Ctrl-C (status 0)
       or ``rounds`` plays in all (default: no limit).

    Raises :class:`MetricsServeError` when the address cannot be served.
    """
    from otel_loopguard._guard import LoopGuard
    from otel_loopguard.metrics import PrometheusRecorder

    stream = out if out is not None else sys.stdout
    tty = stream.isatty()
    if delay is not None:
        pause = delay
    elif metrics_port is not None:
        pause = METRICS_STEP_SECONDS
    else:
        pause = TERMINAL_DELAY_SECONDS if tty else 0.0
    style = _Style(tty and "NO_COLOR" not in os.environ)
    screen = _Screen(stream, style, min(100, shutil.get_terminal_size((100, 24)).columns))
    policy = policy.replace(advisor_command=None)
    clock = _Clock()
    server: MetricsServer | None = None
    watch = _ScrapeWatch()
    if metrics_port is None:
        guard = LoopGuard(policy=policy, clock=clock)
    else:
        recorder = PrometheusRecorder()
        recorder.declare_tools(sorted({call.tool for call in _WARMUP + _AFTER_USER}), DEMO_AGENT)
        recorder.registry.register(watch)
        guard = LoopGuard(policy=policy, clock=clock, recorder=recorder)
        try:
            server = guard.serve_metrics(metrics_port, metrics_addr)
        except (OSError, ValueError) as exc:
            raise MetricsServeError(
                f"cannot serve metrics on {metrics_addr}:{metrics_port}: {exc}"
            ) from None
    try:
        return _play(
            guard, policy, clock, screen, style, pause, sleep, preset, server, watch, rounds
        )
    except KeyboardInterrupt:  # Ctrl-C while serving metrics: the documented way to end
        if server is None:
            raise
        screen.line()
        return 0
    finally:
        if server is not None:
            server.close()


def _play(
    guard: LoopGuard,
    policy: Policy,
    clock: _Clock,
    screen: _Screen,
    style: _Style,
    pause: float,
    sleep: Callable[[float], None],
    preset: str | None,
    server: MetricsServer | None,
    watch: _ScrapeWatch,
    rounds: int | None,
) -> int:
    """The story once, told step by step; with ``server``, then again until interrupted."""
    tally = _Tally()
    _introduce(policy, screen, style, sleep, preset, server, watch)
    screen.line("user: test_parse_minutes fails since yesterday; please fix it")
    screen.line()

    def step(call: _Call) -> Decision:
        if pause:
            sleep(pause)
        decision = guard.before_tool(
            call.tool, dict(call.arguments), session=_SESSION, agent=DEMO_AGENT
        )
        action = decision.action.value
        refused_before = tally.refused
        number = tally.count(action)
        screen.line(f"{number:>4}  {_call_text(call)}")
        screen.line(f"       guard: {_verdict(decision, refused_before, style)}")
        if decision.blocks:
            tally.saved_seconds += call.seconds
            if action == "stop":
                screen.block("the model gets, and the run should end:", decision.message)
                tally.stopped_at = number
            else:
                screen.block("the model gets instead of a result:", decision.message)
            return decision
        clock.now += call.seconds
        tally.ran += 1
        guard.after_tool(
            call.tool,
            dict(call.arguments),
            session=_SESSION,
            agent=DEMO_AGENT,
            error=call.error,
            result=call.result,
            duration_seconds=call.seconds,
        )
        first = call.result.splitlines()[0]
        screen.line(f"       tool:  {first}{' (error)' if call.error else ''}")
        if action == "remind":
            screen.block("the model also gets:", decision.message)
        return decision

    def story() -> None:
        for call in _WARMUP:
            step(call)
        # The stuck agent: convinced the test is flaky, it re-runs it and ignores every hint,
        # until the guard stops the run (or it gives up after MAX_LOOP_CALLS attempts).
        for _ in range(MAX_LOOP_CALLS):
            if step(_RUN_TESTS).action.value == "stop":
                break
        screen.line()
        if pause:
            sleep(pause)
        screen.line(f"user: {_USER_PROMPT}")
        guard.user_message(_SESSION, agent=DEMO_AGENT)
        tally.refused = 0  # a new progress epoch
        screen.line(
            style(
                "dim", "       (a real user message starts a new progress epoch and lifts a stop)"
            )
        )
        for call in _AFTER_USER:
            last = step(call)
        tally.finished_ok = not last.blocks

    story()
    screen.line()
    for paragraph in _summary(tally):
        screen.line(textwrap.fill(paragraph, screen.width))
        screen.line()
    if server is None:
        return 0
    screen.line(f"metrics: serving {server.url} (the guard's counters from this run)")
    screen.line(
        textwrap.fill(
            f"Import dashboards/loopguard.json into Grafana to watch it. The story plays again"
            " every"
            f" {METRICS_ROUND_PAUSE_SECONDS:g} s in a new run of the agent. Press Ctrl-C to stop.",
            screen.width,
        )
    )
    told = screen
    played = 1
    while rounds is None or played < rounds:
        sleep(METRICS_ROUND_PAUSE_SECONDS)
        played += 1
        screen = _Screen(io.StringIO(), style, told.width)  # later plays: one line each
        tally = _Tally()
        guard.new_run(_SESSION, agent=DEMO_AGENT)
        story()
        told.line(
            f"play {played}: {tally.calls} calls, "
            + ", ".join(f"{count} {action}" for action, count in tally.counts.items())
        )
    return 0


def _introduce(
    policy: Policy,
    screen: _Screen,
    style: _Style,
    sleep: Callable[[float], None],
    preset: str | None,
    server: MetricsServer | None,
    watch: _ScrapeWatch,
) -> None:
    """The demo's first lines; with ``server``, returns once Prometheus has scraped it."""
    screen.line(
        style("bold", "otel-loopguard demo") + ": a scripted agent gets stuck; a real"
        " LoopGuard watches every tool call."
    )
    screen.line(
        f"policy: {('preset ' + preset) if preset else 'from --config'} ({_ladder(policy)})"
    )
    if server is not None:
        screen.line(f"metrics: {server.url}")
        screen.line(
            textwrap.fill(
                f"Waiting for the first scrape: point Prometheus at {server.host}:{server.port}"
                " (a static target). The story starts then, so the dashboard sees every call.",
                screen.width,
            )
        )
        while not watch.scraped.is_set():
            sleep(SCRAPE_POLL_SECONDS)
    screen.line()


def _verdict(decision: Decision, refused: int, style: _Style) -> str:
    """The guard's line for one call: its action, and for a step its rule, count and
    threshold (``refused``: the calls refused since the last user message)."""
    from otel_loopguard.config import Rule

    action = decision.action.value
    verdict = style(action, action.upper() if action != "allow" else action)
    if action != "allow":
        rule = decision.rule.value if decision.rule is not None else "none"
        verdict += f"  rule {rule}, count {decision.count}"
        if action == "stop" and decision.rule is not Rule.STALL:
            # A stop after denials: its threshold counts refused calls, not repeats.
            verdict += f"; {refused} call{'s' if refused != 1 else ''} refused before"
        if decision.threshold:
            verdict += f" (threshold {decision.threshold})"
    if decision.blocks:
        verdict += " - the tool does not run"
    return verdict


def _summary(tally: _Tally) -> list[str]:
    """One paragraph: what happened, told from the tally of real decisions, then how to use the
    library for real."""
    counts = tally.counts

    def times(action: str, verb: str) -> str:
        n = counts.get(action, 0)
        if not n:
            return f"never {verb}"
        return f"{verb} {n} time{'s' if n != 1 else ''} (first at call {tally.first_step[action]})"

    denials = counts.get("deny", 0) + counts.get("rescue", 0)
    blocked = denials + counts.get("stop", 0)
    happened = [
        f"What happened: the agent made {tally.calls} tool calls and {tally.ran} of them ran.",
        f"The guard {times('remind', 'reminded')},",
    ]
    if denials:
        first_deny = min(tally.first_step[a] for a in ("deny", "rescue") if a in tally.first_step)
        happened.append(
            f"refused {denials} call{'s' if denials != 1 else ''} (first at call {first_deny}),"
        )
    else:
        happened.append("never refused a call,")
    if tally.stopped_at is not None:
        happened.append(f"and stopped the run at call {tally.stopped_at}.")
    else:
        happened.append(
            f"and did not stop the run (the agent gave up after {MAX_LOOP_CALLS}"
            " attempts by itself)."
        )
    if blocked:
        happened.append(
            f"{blocked} blocked call{'s' if blocked != 1 else ''} never ran, saving about"
            f" {tally.saved_seconds:.1f} s of tool time and the tokens of"
            f" {'their' if blocked != 1 else 'its'} results."
        )
    happened.append(
        "After the user's message the agent edited the file, and its tests"
        + (" ran normally." if tally.finished_ok else " were still blocked.")
    )
    usage = (
        "To guard your own agent: create one `LoopGuard()` (policy from a preset, a TOML file or"
        " LOOPGUARD_* variables); before each tool call ask `decision ="
        " guard.before_tool(name, arguments, session=...)`; if `decision.blocks`, give"
        " `decision.message` to the model as the tool's result instead of running it, and end"
        " the run on `stop`; otherwise run the tool and report it with `guard.after_tool(...)`."
        " Call `guard.user_message(session)` when a person speaks. Tune thresholds on your own"
        " recorded sessions first with `otel-loopguard replay FILE`."
    )
    return [" ".join(happened) + " " + usage]
