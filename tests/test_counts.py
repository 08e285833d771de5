"""Counts and thresholds a person can follow (issue 21, item 4).

One rule: a decision's ``count`` is the attempts of the call that its rule's evidence covers,
this one included, and a refused attempt is an attempt the agent made, so the count grows by one
with each repeat until the evidence is reset (a new result, a new epoch). Its ``threshold`` is the
threshold of the step taken: the reminder's, the deny threshold that applied, the rescue's, the
stop's. Which call gets which action is not this file's business; the expected actions here are
the ones the guard took before counts were fixed.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_loopguard import PRESETS, Action, Decision, LoopGuard, Phase, Policy, Rule
from otel_loopguard._advice import AdviceRequest
from otel_loopguard._demo import run_demo
from otel_loopguard._engine import SessionState
from otel_loopguard.processor import DECISION_EVENT, LoopGuardSpanProcessor

DEFAULT = PRESETS["default"]
USER = "user"  # a script step: a real user message (a new epoch, a stop lifted)
FAIL = "fail"  # a script step: the call, failing the same way each time
CALL = "call"  # a script step: the call, answering the same result each time


@dataclass(frozen=True)
class Case:
    name: str
    policy: Policy
    script: Sequence[str]
    #: (action, count, threshold) of each decision in order; a post-call conclusion follows its
    #: call's decision with phase "post".
    expected: Sequence[tuple[str, int, int] | tuple[str, int, int, str]]
    advice: bool = False


STOP_AFTER_FAILURES = DEFAULT.replace(no_progress_threshold=None, failure_stop_threshold=4)

CASES = [
    Case(
        "same call, same result",
        DEFAULT,
        [CALL] * 10,
        [
            ("allow", 0, 0),
            ("allow", 2, 0),
            ("remind", 3, 3),
            ("deny", 4, 4),  # the no_progress threshold
            ("deny", 5, 4),  # refused repeats count
            ("deny", 6, 4),  # the last denial before the stop: still the deny threshold
            ("stop", 7, 3),  # the stop's threshold: stop_after_denials
            ("stop", 8, 3),
            ("stop", 9, 3),
            ("stop", 10, 3),
        ],
    ),
    Case(
        "same call, a user message, the same call again",
        DEFAULT,
        [CALL] * 6 + [USER] + [CALL] * 6,
        [
            ("allow", 0, 0),
            ("allow", 2, 0),
            ("remind", 3, 3),
            ("deny", 4, 4),
            ("deny", 5, 4),
            ("deny", 6, 4),
            ("allow", 0, 0),  # a new epoch: the evidence starts again
            ("allow", 2, 0),
            ("remind", 3, 3),
            ("deny", 4, 4),
            ("deny", 5, 4),
            ("deny", 6, 4),
        ],
    ),
    Case(
        "same failing call",
        STOP_AFTER_FAILURES,
        [FAIL] * 7,
        [
            ("allow", 0, 0),
            ("allow", 2, 0),
            ("remind", 3, 3),
            ("allow", 4, 0),
            ("stop", 4, 4, "post"),  # the 4th identical failure: failure_stop_threshold
            ("stop", 5, 4),  # stopped by failures: the later stops show that stop's threshold
            ("stop", 6, 4),
            ("stop", 7, 4),
        ],
    ),
    Case(
        "denied repeats (brake preset)",
        PRESETS["brake"],
        [CALL] * 8,
        [("allow", 0, 0), ("allow", 2, 0), ("allow", 3, 0)] + [("deny", n, 4) for n in range(4, 9)],
    ),
    Case(
        "denied repeats past the rescue threshold, no advisor (rescue preset)",
        PRESETS["rescue"],
        [CALL] * 8,
        # From rescue_threshold (5) on, a rescue without advice is a denial: the deny threshold.
        [("allow", 0, 0), ("allow", 2, 0)] + [("deny", n, 3) for n in range(3, 9)],
    ),
    Case(
        "the last denial before the stop asks the advisor",
        DEFAULT,
        [CALL] * 8,
        [
            ("allow", 0, 0),
            ("allow", 2, 0),
            ("remind", 3, 3),
            ("deny", 4, 4),
            ("deny", 5, 4),
            ("rescue", 6, 4),  # the deny threshold that applied, not rescue_threshold
            ("stop", 7, 3),
            ("stop", 8, 3),
        ],
        advice=True,
    ),
]


def _advisor(request: AdviceRequest) -> str:
    return "Read the minutes entry."


def _play(case: Case, guard: LoopGuard) -> list[Decision]:
    decisions: list[Decision] = []
    for step in case.script:
        if step == USER:
            guard.user_message("s")
            continue
        decision = guard.before_tool("run_tests", {"path": "t.py"}, session="s")
        decisions.append(decision)
        if decision.blocks:
            continue
        error = step == FAIL
        post = guard.after_tool(
            "run_tests",
            {"path": "t.py"},
            session="s",
            result="1 failed" if error else "1 passed",
            error=error,
        )
        if post is not None:
            decisions.append(post)
    return decisions


def _row(decision: Decision) -> tuple[str, int, int] | tuple[str, int, int, str]:
    row = (decision.action.value, decision.count, decision.threshold)
    return (*row, "post") if decision.phase is Phase.POST else row


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_count_grows_with_each_repeat_and_threshold_is_the_steps(case: Case) -> None:
    guard = LoopGuard(case.policy, advisor=_advisor if case.advice else None)
    decisions = _play(case, guard)
    assert [_row(d) for d in decisions] == list(case.expected)
    # The rule, spelled out: within an epoch each repeat's count is above the one before.
    epoch: list[int] = []
    for decision in decisions:
        if decision.phase is Phase.POST:
            continue
        if not decision.repeated:
            epoch = []  # a first attempt: a new epoch began
            continue
        assert not epoch or decision.count > epoch[-1], (case.name, decision)
        epoch.append(decision.count)


def test_every_blocking_text_says_the_count_of_its_decision() -> None:
    guard = LoopGuard(DEFAULT)
    decisions = _play(CASES[0], guard)
    for decision in decisions:
        if decision.action is Action.DENY:
            # "already called N times": the attempts before this one.
            assert f"already called {decision.count - 1} times" in decision.message
        if decision.action is Action.STOP and decision.rule is Rule.NO_PROGRESS:
            assert f"with the same arguments, {decision.count} times" in decision.message
    fifth = decisions[4]
    assert fifth.action is Action.DENY
    assert (
        "already called 4 times: it ran 3 times and returned the same result each time,"
        " and was refused once." in " ".join(fifth.message.split())
    )


def test_the_trip_log_says_the_decisions_counts_and_thresholds(tmp_path: Path) -> None:
    log = tmp_path / "trips.jsonl"
    guard = LoopGuard(DEFAULT.replace(trip_log_path=str(log)))
    decisions = [d for d in _play(CASES[0], guard) if d.action is not Action.ALLOW]
    guard.close(wait=True)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["action"], x["count"], x["threshold"]) for x in lines] == [
        (d.action.value, d.count, d.threshold) for d in decisions
    ]
    assert [x["count"] for x in lines] == [3, 4, 5, 6, 7, 8, 9, 10]


def test_span_events_say_the_count_that_grows() -> None:
    guard = LoopGuard(DEFAULT)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(LoopGuardSpanProcessor(guard))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span(
        "invoke_agent a",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"},
    ):
        for n in range(8):
            with tracer.start_as_current_span(
                "execute_tool search",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search",
                    "gen_ai.tool.call.id": f"c{n}",
                    "logfire.msg": "running tool: search",
                    "gen_ai.tool.call.arguments": '{"q": "x"}',
                },
            ) as span:
                span.set_attribute("gen_ai.tool.call.result", "no match")
    provider.shutdown()
    events = [
        dict(event.attributes or {})
        for span in exporter.get_finished_spans()
        for event in span.events
        if event.name == DECISION_EVENT
    ]
    counts = [c for c in (e["loopguard.count"] for e in events) if isinstance(c, int)]
    assert len(counts) == len(events)
    assert len(counts) >= 5 and all(a < b for a, b in zip(counts, counts[1:])), counts
    assert [(e["loopguard.action"], e["loopguard.threshold"]) for e in events] == [
        ("remind", 3),
        ("deny", 4),  # no_progress: the same result; its denied repeats count on
        ("deny", 4),
        ("deny", 4),
        ("stop", 3),
        ("stop", 3),
    ]


def test_a_saved_session_keeps_its_refused_repeats_and_its_stop() -> None:
    guard = LoopGuard(STOP_AFTER_FAILURES)
    _play(Case("", STOP_AFTER_FAILURES, [FAIL] * 5, []), guard)
    state = guard.export_session("s")
    assert state is not None
    again = LoopGuard(STOP_AFTER_FAILURES)
    again.import_session("s", SessionState.from_bytes(state.to_bytes(), STOP_AFTER_FAILURES))
    decision = again.before_tool("run_tests", {"path": "t.py"}, session="s")
    assert (decision.action, decision.count, decision.threshold) == (Action.STOP, 6, 4)

    guard = LoopGuard(DEFAULT)
    _play(Case("", DEFAULT, [CALL] * 5, []), guard)  # two refused repeats
    state = guard.export_session("s")
    assert state is not None
    again = LoopGuard(DEFAULT)
    again.import_session("s", SessionState.from_bytes(state.to_bytes(), DEFAULT))
    decision = again.before_tool("run_tests", {"path": "t.py"}, session="s")
    assert (decision.action, decision.count, decision.threshold) == (Action.DENY, 6, 4)


_GUARD_LINE = re.compile(
    r"^\s*(\d+)  (\w+)\(.*\)$|^\s+guard: (REMIND|DENY|RESCUE|STOP)\s+rule (\w+), count (\d+)"
    r"(?:; (\d+) calls? refused before)?(?: \(threshold (\d+)\))?"
)


def test_the_demo_prints_counts_that_grow_and_the_thresholds_that_applied() -> None:
    out = io.StringIO()
    assert run_demo(DEFAULT, out=out) == 0
    rows: list[tuple[str, int, int]] = []
    for line in out.getvalue().splitlines():
        match = _GUARD_LINE.match(line)
        if match and match.group(3):
            rows.append((match.group(3), int(match.group(5)), int(match.group(7) or 0)))
    assert DEFAULT.no_progress_threshold == 4 and DEFAULT.stop_after_denials == 3
    assert rows == [
        ("REMIND", 3, 3),
        ("DENY", 4, 4),
        ("DENY", 5, 4),
        ("DENY", 6, 4),
        ("STOP", 7, 3),
    ]
    text = " ".join(out.getvalue().split())
    assert "count 7; 3 calls refused before (threshold 3)" in text
    assert "already called 5 times: it ran 3 times" in text
