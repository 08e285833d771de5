"""LoopGuard's hook API: counting once, modes, wrap, errors (guard.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from otel_loopguard import PRESETS, Action, LoopDetected, LoopGuard, Mode, Policy, Rule

from .conftest import Call, run, threshold

DEFAULT = PRESETS["default"]
DENY = threshold(DEFAULT.deny_threshold)
STUCK = threshold(DEFAULT.no_progress_threshold)
FIRST_REMIND = DEFAULT.remind_thresholds[0]


def test_before_and_after_for_one_call_count_once() -> None:
    guard = LoopGuard(DEFAULT)
    for n in range(1, STUCK):
        decision = guard.before_tool("search", {"q": "x"}, session="s", call_id=f"c{n}")
        assert decision.count == (n if n > 1 else 0)
        assert (
            guard.after_tool("search", {"q": "x"}, session="s", call_id=f"c{n}", result="r") is None
        )
    assert guard.before_tool("search", {"q": "x"}, session="s").action is Action.DENY


def test_after_without_call_id_matches_the_pending_hook_call() -> None:
    guard = LoopGuard(DEFAULT)
    for _ in range(DENY - 1):
        guard.before_tool("search", {"q": "x"}, session="s")
        # the span reports it with an id the hook never saw: still the same call
        assert guard.after_tool("search", '{"q": "x"}', session="s", call_id="span-id") is None
    assert guard.before_tool("search", {"q": "x"}, session="s").action is Action.DENY


# A framework hook and its tool span both report each call, in either order, with or without the
# call id (OpenInference tool spans carry none): the call counts once and its result once.
@pytest.mark.parametrize(
    "reports",
    [
        ("hook", "span"),  # Pydantic AI, Google ADK: the hook's after, then the span ends
        ("span", "hook"),  # Strands: the span ends before AfterToolCallEvent
        ("span-no-id", "hook"),  # LangGraph + OpenInference: span first, without the call id
        ("hook", "span-no-id"),  # OpenAI Agents + OpenInference: output guardrail, then span
    ],
)
def test_hook_and_span_reports_of_one_call_count_once(reports: tuple[str, str]) -> None:
    guard = LoopGuard(DEFAULT)
    for n in range(1, STUCK):
        decision = guard.before_tool("search", {"query": "x"}, session="s", call_id=f"c{n}")
        assert decision.count == (n if n > 1 else 0)
        for report in reports:
            call_id = f"c{n}" if report in ("hook", "span") else None
            arguments = {"query": "x"} if report == "hook" else '{"query": "x"}'
            assert (
                guard.after_tool("search", arguments, session="s", call_id=call_id, result="same")
                is None
            )
    decision = guard.before_tool("search", {"query": "x"}, session="s", call_id="last")
    assert (decision.action, decision.rule, decision.count) == (
        Action.DENY,
        Rule.NO_PROGRESS,
        STUCK,
    )


def test_a_reused_call_id_is_a_new_call() -> None:
    guard = LoopGuard(DEFAULT)
    counts = []
    for _ in range(2):  # scripted models reuse ids; a new attempt under an old id still counts
        counts.append(guard.before_tool("search", {"q": "x"}, session="s", call_id="c1").count)
        guard.after_tool("search", {"q": "x"}, session="s", call_id="c1", result="r")
    guard.new_run("s")
    counts.append(guard.before_tool("search", {"q": "x"}, session="s", call_id="c1").count)
    assert guard.after_tool("search", {"q": "x"}, session="s", call_id="c1") is None
    assert counts == [0, 2, 0]


def test_a_blocked_attempt_left_pending_never_makes_a_later_call_count_twice() -> None:
    guard = LoopGuard(DEFAULT)
    for n in range(1, STUCK + 1):
        decision = guard.before_tool("search", {"q": "x"}, session="s", call_id=f"c{n}")
        if not decision.blocks:  # LangGraph and Strands emit no tool span for a blocked call
            assert guard.after_tool("search", '{"q": "x"}', session="s", result="r") is None
            guard.after_tool("search", {"q": "x"}, session="s", call_id=f"c{n}", result="r")
    assert decision.action is Action.DENY
    guard.user_message("s")
    allowed = guard.before_tool("search", {"q": "x"}, session="s", call_id="next")
    assert allowed.action is Action.ALLOW
    assert guard.after_tool("search", '{"q": "x"}', session="s", result="r") is None
    assert guard.after_tool("search", {"q": "x"}, session="s", call_id="next") is None
    assert guard.before_tool("search", {"q": "x"}, session="s").count == 2


def test_after_alone_counts_the_call() -> None:
    guard = LoopGuard(DEFAULT)
    decisions = [
        guard.after_tool("search", {"q": "x"}, session="s", result="r") for _ in range(DENY)
    ]
    assert decisions[FIRST_REMIND - 1] is not None
    assert decisions[FIRST_REMIND - 1].action is Action.REMIND  # type: ignore[union-attr]
    assert decisions[-1] is not None and decisions[-1].detected is Action.DENY


def test_denied_attempts_count_and_are_never_progress() -> None:
    policy = DEFAULT.replace(mutating_tools=("write",))
    guard = LoopGuard(policy)
    run(guard, [Call("write", {"path": "a", "text": "x"}, report=False)] * DENY)
    denied = guard.before_tool("write", {"path": "a", "text": "x"}, session="s", call_id="d")
    assert denied.blocks
    # the framework still reports the blocked call as finished "successfully": no new epoch
    guard.after_tool(
        "write", {"path": "a", "text": "x"}, session="s", call_id="d", result=denied.message
    )
    assert guard.before_tool("write", {"path": "a", "text": "x"}, session="s").blocks


def test_successful_mutating_call_starts_a_new_epoch() -> None:
    guard = LoopGuard(DEFAULT)
    run(guard, [Call("read", {"path": "a"}, result="A")] * (DENY - 1))
    run(guard, [Call("write_file", {"path": "a", "text": "B"}, result="ok")])
    assert guard.before_tool("read", {"path": "a"}, session="s").action is Action.ALLOW


def test_failed_mutating_call_is_not_progress() -> None:
    guard = LoopGuard(DEFAULT)
    run(guard, [Call("read", {"path": "a"}, result="A")] * (DENY - 1))
    run(guard, [Call("write_file", {"path": "a"}, error=True, result="denied")])
    assert guard.before_tool("read", {"path": "a"}, session="s").action is Action.DENY


def test_agents_in_one_session_have_separate_chains() -> None:
    guard = LoopGuard(DEFAULT)
    for agent in ("main", "sub-1", "sub-2"):
        for _ in range(DENY - 1):
            assert not guard.before_tool("ls", {}, session="s", agent=agent).blocks
    assert guard.before_tool("ls", {}, session="s", agent="sub-1").blocks


def test_observe_mode_answers_allow_but_detects() -> None:
    guard = LoopGuard(DEFAULT.replace(mode=Mode.OBSERVE))
    transcript = run(guard, [Call("ls", {}, result="x")] * DENY)
    assert set(transcript.actions) == {Action.ALLOW}
    assert transcript.decisions[-1].detected is Action.DENY
    assert transcript.decisions[-1].message == ""


def test_advise_mode_turns_blocks_into_detailed_reminders() -> None:
    guard = LoopGuard(DEFAULT.replace(mode=Mode.ADVISE))
    transcript = run(guard, [Call("ls", {"path": "."}, result="x")] * (DENY + 5))
    assert not any(d.blocks for d in transcript.decisions)
    last = transcript.decisions[DENY - 1]
    assert last.action is Action.REMIND and last.detected is Action.DENY
    assert "Arguments:" in last.message


def test_untracked_tools_are_allowed_without_counting() -> None:
    guard = LoopGuard(DEFAULT.replace(include=("search*",)))
    assert all(guard.before_tool("ls", {}, session="s").count == 0 for _ in range(20))
    assert not any(guard.before_tool("ls", {}, session="s").blocks for _ in range(20))
    assert guard.session_count == 0


def test_loop_detected_carries_no_arguments() -> None:
    guard = LoopGuard(DEFAULT)
    secret = "hunter2-secret-token"
    run(guard, [Call("login", {"password": secret}, report=False)] * (DENY - 1))
    decision = guard.before_tool("login", {"password": secret}, session="s")
    error = LoopDetected(decision)
    assert (error.code, error.tool, error.count, error.threshold) == ("deny", "login", DENY, DENY)
    assert error.signature == decision.signature and error.session == "s"
    assert secret not in str(error) and secret not in repr(error.args)
    assert secret in decision.message  # the model is shown the arguments ...
    assert secret not in error.message and "Not run" in error.message  # ... the error never
    assert len(error.hash_prefix) == 12 and error.hash_prefix in str(error)


def test_hash_prefix_only_on_blocking_decisions() -> None:
    guard = LoopGuard(DEFAULT)
    decisions = run(guard, [Call("ls", {"p": 1}, result="x")] * STUCK).decisions
    assert all(d.hash_prefix == "" for d in decisions if not d.blocks)
    assert decisions[-1].blocks and len(decisions[-1].hash_prefix) == 12


def test_reminders_past_the_last_threshold_only_when_the_policy_says_so() -> None:
    calls = [Call("ls", {}, result="x")] * 7
    policy = DEFAULT.replace(
        rules=frozenset({Rule.CONSECUTIVE}),
        remind_thresholds=(2, 3),
        deny_threshold=None,
        rescue_threshold=None,
        poll_limit=None,
    )
    every = run(LoopGuard(policy), calls).actions
    assert every[1:] == [Action.REMIND] * 6
    only = run(LoopGuard(policy.replace(remind_past_thresholds=False)), calls).actions
    assert only == [Action.ALLOW, Action.REMIND, Action.REMIND] + [Action.ALLOW] * 4


def test_wrap_sync_raises_and_appends_reminders() -> None:
    guard = LoopGuard(DEFAULT)
    ran: list[str] = []

    @guard.wrap
    def search(query: str, limit: int = 10) -> str:
        ran.append(query)
        return f"results for {query}"

    results = [search("x") if n % 2 else search(query="x", limit=10) for n in range(STUCK - 1)]
    assert "[loopguard]" in results[FIRST_REMIND - 1]
    assert results[0] == "results for x"
    with pytest.raises(LoopDetected) as info:
        search("x")
    assert info.value.code == "deny" and info.value.tool == "search"
    assert len(ran) == STUCK - 1  # the denied call did not run


def test_wrap_async_returns_the_message_when_configured() -> None:
    guard = LoopGuard(DEFAULT)

    async def fetch(url: str) -> dict[str, Any]:
        return {"status": 200}

    wrapped = guard.wrap(fetch, tool="http_get", session=lambda: "conv-1", on_block="return")

    async def main() -> list[Any]:
        return [await wrapped("https://example.invalid") for _ in range(DENY)]

    results = asyncio.run(main())
    assert results[0] == {"status": 200}
    assert isinstance(results[-1], str) and "Not run" in results[-1] and "`http_get`" in results[-1]


def test_wrap_reports_errors_as_outcomes() -> None:
    guard = LoopGuard(DEFAULT)

    @guard.wrap(tool="flaky")
    def flaky() -> None:
        raise ConnectionError("down")

    # the same error each time: no progress, and the last identical failure ends the run
    failures = threshold(DEFAULT.failure_stop_threshold)
    for _ in range(failures - 1):
        with pytest.raises(ConnectionError):
            flaky()
    with pytest.raises(LoopDetected) as stopped:
        flaky()
    assert (stopped.value.code, stopped.value.count) == ("stop", failures)


def test_wrap_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="on_block"):
        LoopGuard(DEFAULT).wrap(len, on_block="explode")  # type: ignore[call-overload]


class ExplodingRecorder:
    def __getattr__(self, name: str) -> Any:
        def explode(*args: object) -> None:
            raise RuntimeError(f"recorder {name} failed")

        return explode


def test_internal_errors_fall_back_to_allow_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    guard = LoopGuard(DEFAULT, recorder=ExplodingRecorder())
    with caplog.at_level(logging.ERROR, logger="otel_loopguard"):
        decisions = [guard.before_tool("ls", {}, session="s") for _ in range(5)]
        assert guard.after_tool("ls", {}, session="t") is None
    assert all(d.action is Action.ALLOW for d in decisions)
    assert guard.internal_errors == {"before_tool": 5, "after_tool": 1}
    assert caplog.text.count("internal error in before_tool") == 1


def test_bad_constructor_values_fail_loudly() -> None:
    with pytest.raises(ValueError, match="policy"):
        LoopGuard("strict")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="advisor"):
        LoopGuard(DEFAULT, advisor="gpt")  # type: ignore[arg-type]


def test_stall_stops_varied_grinding() -> None:
    policy = DEFAULT.replace(stall_threshold=10)
    guard = LoopGuard(policy)
    calls = [Call("read", {"path": f"f{n % 4}"}, result=f"content {n % 4}") for n in range(40)]
    transcript = run(guard, calls)
    stop = transcript.first(Action.STOP)
    assert stop is not None
    decision = transcript.decisions[stop - 1]
    assert decision.rule is Rule.STALL and decision.count == policy.stall_threshold
    assert "not making progress" in decision.message


def test_default_policy_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPGUARD_DENY_THRESHOLD", "9")
    monkeypatch.setenv("LOOPGUARD_RESCUE_THRESHOLD", "none")
    assert LoopGuard().policy.deny_threshold == 9


def test_trip_log_has_one_line_per_non_allow_decision(tmp_path: Any) -> None:
    import json

    path = tmp_path / "trips.jsonl"
    guard = LoopGuard(DEFAULT.replace(trip_log_path=str(path)))
    transcript = run(guard, [Call("login", {"password": "s3cret"}, result="no")] * STUCK)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    non_allow = [d for d in transcript.decisions if d.action is not Action.ALLOW]
    assert [(r["action"], r["count"], r["signature"]) for r in lines] == [
        (d.detected.value, d.count, d.signature) for d in non_allow
    ]
    assert lines[-1]["session"] == "s" and lines[-1]["tool"] == "login"
    assert [r["kind"] for r in lines] == [r["action"] for r in lines]
    assert "s3cret" not in path.read_text() and "arguments" not in lines[-1]


def test_trip_log_arguments_only_when_enabled(tmp_path: Any) -> None:
    import json

    path = tmp_path / "trips.jsonl"
    guard = LoopGuard(DEFAULT.replace(trip_log_path=str(path), trip_log_arguments=True))
    run(guard, [Call("read", {"path": "a"}, result="x")] * STUCK)
    assert json.loads(path.read_text().splitlines()[-1])["arguments"] == '{"path":"a"}'


def test_trip_log_makes_its_directory_and_expands_the_home(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    guard = LoopGuard(DEFAULT.replace(trip_log_path="~/.llmbox/trips.jsonl"))
    run(guard, [Call("read", {"path": "a"}, result="x")] * STUCK)
    assert (tmp_path / ".llmbox" / "trips.jsonl").read_text().count("\n") >= 1


def test_unwritable_trip_log_is_counted_never_raised(tmp_path: Any) -> None:
    (tmp_path / "a-file").write_text("")  # a file where the log's directory should be
    guard = LoopGuard(DEFAULT.replace(trip_log_path=str(tmp_path / "a-file" / "t.jsonl")))
    transcript = run(guard, [Call("read", {"path": "a"}, result="x")] * STUCK)
    assert transcript.decisions[-1].action is Action.DENY
    assert guard.trip_log is not None and guard.trip_log.failures >= 2
    assert guard.internal_errors == {}


def test_idle_sessions_are_expired_when_counted_and_on_request() -> None:
    from .conftest import FakeClock

    clock = FakeClock()
    guard = LoopGuard(Policy(session_ttl_seconds=60), clock=clock)
    guard.before_tool("grep", {"q": 1}, session="a")
    guard.before_tool("grep", {"q": 1}, session="b")
    assert guard.session_count == 2
    clock.advance(30)
    guard.before_tool("grep", {"q": 2}, session="b")
    clock.advance(31)  # a idle for 61 s, b for 31 s; no call since: only a count or a sweep sees it
    assert guard.session_count == 1
    clock.advance(30)
    assert guard.expire_idle_sessions() == 1
    assert guard.expire_idle_sessions() == 0
    assert guard.session_count == 0


def _stop(guard: LoopGuard, session: str, agent: str | None) -> None:
    """Repeat one call until the guard stops the run (``agent`` as named)."""
    for _ in range(30):
        decision = guard.before_tool("grep", {"q": "TODO"}, session=session, agent=agent)
        if decision.action is Action.STOP:
            return
        if not decision.blocks:
            guard.after_tool("grep", {"q": "TODO"}, session=session, agent=agent, result="none")
    raise AssertionError("the guard never stopped the run")


def _next(guard: LoopGuard, session: str, agent: str | None) -> Action:
    return guard.before_tool("grep", {"q": "TODO"}, session=session, agent=agent).action


def test_a_user_message_to_the_session_lifts_every_agents_stop() -> None:
    # The README's example: calls with agent="coder", then guard.user_message(conversation_id).
    guard = LoopGuard(DEFAULT)
    for agent in ("coder", "reviewer", None):
        _stop(guard, "conversation", agent)
    _stop(guard, "other", "coder")
    guard.user_message("conversation")
    for agent in ("coder", "reviewer", None):
        assert _next(guard, "conversation", agent) is Action.ALLOW, agent
    assert _next(guard, "other", "coder") is Action.STOP  # another session is untouched


def test_a_user_message_naming_an_agent_lifts_only_that_agents_stop() -> None:
    guard = LoopGuard(DEFAULT)
    for agent in ("coder", "reviewer", None):
        _stop(guard, "conversation", agent)
    guard.user_message("conversation", agent="coder")
    assert _next(guard, "conversation", "coder") is Action.ALLOW
    assert _next(guard, "conversation", "reviewer") is Action.STOP
    assert _next(guard, "conversation", None) is Action.STOP


def test_a_new_run_without_an_agent_starts_every_agents_epoch() -> None:
    guard = LoopGuard(DEFAULT)
    for agent in ("coder", "reviewer"):
        _stop(guard, "conversation", agent)
    guard.new_run("conversation", agent="reviewer")
    assert _next(guard, "conversation", "coder") is Action.STOP
    assert _next(guard, "conversation", "reviewer") is Action.ALLOW
    guard.new_run("conversation")
    assert _next(guard, "conversation", "coder") is Action.ALLOW


def test_a_user_message_after_an_agents_session_was_evicted_is_harmless() -> None:
    guard = LoopGuard(DEFAULT.replace(max_sessions=2))
    _stop(guard, "conversation", "coder")
    for n in range(3):  # push ("conversation", "coder") out
        guard.before_tool("grep", {"q": n}, session=f"s{n}")
    guard.user_message("conversation")
    assert guard.internal_errors == {}
    assert _next(guard, "conversation", "coder") is Action.ALLOW  # a fresh session


def test_a_wrapped_tool_failing_the_same_way_three_times_ends_the_run() -> None:
    guard = LoopGuard(PRESETS["default"])
    threshold_ = PRESETS["default"].failure_stop_threshold
    assert threshold_ == 3

    @guard.wrap(session="s")
    def build(target: str) -> str:
        raise RuntimeError(f"cannot build {target}")

    for _ in range(threshold_ - 1):
        with pytest.raises(RuntimeError):
            build("app")
    with pytest.raises(LoopDetected) as stopped:
        build("app")
    assert (stopped.value.code, stopped.value.count) == ("stop", threshold_)
    assert isinstance(stopped.value.__cause__, RuntimeError)
    with pytest.raises(LoopDetected):  # the run stays stopped until the next user message
        build("other")
    guard.user_message("s")
    with pytest.raises(RuntimeError):
        build("app")


def test_a_post_call_reminder_has_no_empty_arguments_line() -> None:
    guard = LoopGuard(PRESETS["default"].replace(mode=Mode.ADVISE))
    post = None
    for _ in range(3):
        guard.before_tool("build", {"target": "app"}, session="s")
        post = guard.after_tool("build", {"target": "app"}, session="s", error=True, result="boom")
    assert post is not None and post.action is Action.REMIND and post.phase.value == "post"
    assert "Arguments:" not in post.message


def test_huge_session_ids_and_agent_names_are_kept_in_a_short_hash_form() -> None:
    import tracemalloc

    from otel_loopguard._calls import MAX_ID_CHARS, bounded_id

    guard = LoopGuard(DEFAULT)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        decisions = []
        for n in range(DENY):
            session = "s" * (1 << 20) + "1"  # 1 MiB, a new string each call
            agent = "a" * (5 << 20)
            decisions.append(guard.before_tool("grep", {"q": n % 1}, session=session, agent=agent))
            del session, agent
        other = guard.before_tool("grep", {"q": 0}, session="s" * (1 << 20) + "2", agent="a")
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held - before < 256 * 1024  # none of the 6 MiB ids is kept
    assert decisions[-1].action is Action.DENY and decisions[-1].count == DENY
    assert other.action is Action.ALLOW  # a different long id is another session
    assert decisions[-1].session == bounded_id("s" * (1 << 20) + "1")
    assert len(decisions[-1].session) <= MAX_ID_CHARS
    assert guard.export_session("s" * (1 << 20) + "1", agent="a" * (5 << 20)) is not None


def test_an_id_at_the_bound_is_kept_as_it_is() -> None:
    from otel_loopguard._calls import MAX_ID_CHARS, bounded_id

    at = "x" * MAX_ID_CHARS
    above = at + "x"
    assert bounded_id(at) == at
    assert len(bounded_id(above)) < MAX_ID_CHARS and bounded_id(above) != bounded_id(above + "y")
    guard = LoopGuard(DEFAULT)
    guard.before_tool("t", {}, session=at)
    guard.before_tool("t", {}, session=above)
    assert guard.export_session(at) is not None
    assert guard.export_session(bounded_id(above)) is not None  # kept under its short form
