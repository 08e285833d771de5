"""Property (issue 25): a guard keeping its sessions in Redis decides every random sequence of
hook calls exactly as the in-memory guard does (attempts, reports with and without call ids, the
same arguments object or an equal one, errors, user messages, new runs, agents)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_loopguard import PRESETS, LoopGuard

from .conftest import FakeClock
from .redis_tools import RedisServer

TOOLS = ("grep", "ls", "edit_file", "bash")
ARGS = (
    {"p": 1},
    {"p": 2},
    {"command": "ls"},
    {"command": "sed -i s/a/b/ f"},
)

step = st.one_of(
    st.tuples(
        st.just("before"),
        st.sampled_from(TOOLS),
        st.integers(0, len(ARGS) - 1),
        st.sampled_from(("s1", "s2")),
        st.sampled_from((None, "a")),
        st.sampled_from((None, None, "c1", "c2")),
    ),
    st.tuples(
        st.just("after"),
        st.sampled_from(TOOLS),
        st.integers(0, len(ARGS) - 1),
        st.sampled_from(("s1", "s2")),
        st.sampled_from((None, "a")),
        st.sampled_from((None, None, "c1", "c2")),
        st.sampled_from(("same", "other", None)),
        st.sampled_from((None, False, True)),
        st.booleans(),  # the very arguments object the last attempt passed
    ),
    st.tuples(st.just("user"), st.sampled_from(("s1", "s2")), st.sampled_from((None, "a"))),
    st.tuples(st.just("run"), st.sampled_from(("s1", "s2")), st.sampled_from((None, "a"))),
    st.tuples(st.just("tick"), st.sampled_from((0.5, 30.0, 1800.0))),
)


@pytest.fixture(scope="module")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("redis"))).start()
    try:
        yield server
    finally:
        server.stop()


def play(guard: LoopGuard, steps: list[tuple[Any, ...]], clock: FakeClock) -> list[object]:
    answers: list[object] = []
    last: dict[str, Any] = {}
    for item in steps:
        kind = item[0]
        if kind == "before":
            _, tool, args, session, agent, call_id = item
            arguments = dict(ARGS[args])
            last = arguments
            answers.append(
                guard.before_tool(tool, arguments, session=session, agent=agent, call_id=call_id)
            )
        elif kind == "after":
            _, tool, args, session, agent, call_id, result, error, same = item
            arguments = last if same and last else dict(ARGS[args])
            answers.append(
                guard.after_tool(
                    tool,
                    arguments,
                    session=session,
                    agent=agent,
                    call_id=call_id,
                    result=result,
                    error=error,
                    duration_seconds=0.5,
                )
            )
        elif kind == "user":
            guard.user_message(item[1], agent=item[2])
        elif kind == "run":
            guard.new_run(item[1], agent=item[2])
        else:
            clock.advance(item[1])
    return answers


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(step, max_size=60), st.sampled_from(("default", "brake", "rescue")))
def test_redis_and_memory_decide_alike(
    shared_redis: RedisServer, steps: list[tuple[Any, ...]], preset: str
) -> None:
    # A generous timeout: this is about equal decisions, not faults (the machine may be busy).
    policy = PRESETS[preset].replace(
        store_prefix=f"p{uuid.uuid4().hex}:", store_timeout_seconds=5.0
    )
    memory_clock, redis_clock = FakeClock(), FakeClock()
    memory = LoopGuard(policy, clock=memory_clock)
    shared = LoopGuard(policy, clock=redis_clock, store=shared_redis.url)
    assert play(shared, steps, redis_clock) == play(memory, steps, memory_clock)
    assert shared.store_errors == {} and shared.internal_errors == {}
    for session in ("s1", "s2"):
        for agent in (None, "a"):
            mine = memory.export_session(session, agent=agent)
            theirs = shared.export_session(session, agent=agent)
            assert (mine is None) == (theirs is None)
            if mine is not None and theirs is not None:
                assert mine.to_bytes() == theirs.to_bytes()
