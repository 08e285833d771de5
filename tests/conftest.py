"""Shared test helpers: a fake clock and a scripted-call runner."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard import Action, Decision, LoopGuard

DATA = Path(__file__).resolve().parent / "data"
# Real framework span dumps, copied with their provenance (tests/data/spans/README.md).
SPAN_DUMPS = DATA / "spans"


@dataclass
class FakeClock:
    """A monotonic clock the test moves by hand."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Call:
    """One scripted tool call: what the agent asks and what the tool returns."""

    tool: str
    arguments: Any
    result: Any = None
    error: bool | None = False
    session: str = "s"
    report: bool = True  # call after_tool when the call ran


@dataclass
class Transcript:
    decisions: list[Decision] = field(default_factory=list)

    @property
    def actions(self) -> list[Action]:
        return [d.action for d in self.decisions]

    def first(self, action: Action) -> int | None:
        """1-based index of the first decision with ``action``."""
        for index, decision in enumerate(self.decisions, 1):
            if decision.action is action:
                return index
        return None

    def count(self, action: Action) -> int:
        return sum(1 for d in self.decisions if d.action is action)


def threshold(value: int | None) -> int:
    """A preset's threshold that a test counts up to: set (None turns its rule off)."""
    assert value is not None
    return value


def run(guard: LoopGuard, calls: Iterable[Call]) -> Transcript:
    """Drive the hook API as a framework adapter would: before, then after when it ran."""
    transcript = Transcript()
    for call in calls:
        decision = guard.before_tool(call.tool, call.arguments, session=call.session)
        transcript.decisions.append(decision)
        if call.report and not decision.blocks:
            guard.after_tool(
                call.tool,
                call.arguments,
                session=call.session,
                error=call.error,
                result=call.result,
            )
    return transcript


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
