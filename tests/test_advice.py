"""The advisor: the command contract (argv as the rescue plugin, or JSON on stdin), the question
it is asked (task, refused call, its output, recent calls, what was tried, what to answer) and
its bounds (advice.py, and the trail the guard keeps for it)."""

from __future__ import annotations

import json
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard import (
    PRESETS,
    Action,
    AdviceRequest,
    AdvisorError,
    CommandAdvisor,
    LoopGuard,
    Policy,
)
from otel_loopguard._advice import (
    MAX_QUESTION_CHARS,
    CallRecord,
)
from otel_loopguard._engine import SessionState
from otel_loopguard._trail import (
    MAX_TASK_CHARS,
    MAX_TRAIL_ARGUMENT_CHARS,
    MAX_TRAIL_CALLS,
    MAX_TRAIL_OUTPUT_CHARS,
)

from .conftest import Call, run, threshold

#: Linux caps one argv element at 128 KiB (MAX_ARG_STRLEN).
LINUX_ARG_MAX_BYTES = 128 * 1024

POLICY = PRESETS["default"].replace(
    stop_after_denials=None, cooldown_seconds=0.0, advisor_timeout_seconds=10.0
)
RESCUE_AT = threshold(POLICY.rescue_threshold)


def command(tmp_path: Path, body: str, name: str = "ask") -> Path:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


#: An ask-claude-style command: the question is argv[1]; it records what it got.
RECORDER = """
    import json, os, sys
    with open(os.path.join(os.path.dirname(sys.argv[0]), "got.json"), "w") as f:
        json.dump({"argv": sys.argv[1:], "stdin": sys.stdin.read(),
                   "model": os.environ.get("LOOPGUARD_ADVISOR_MODEL")}, f)
    print("Stop searching the web; call the forecast API with city=Paris.")
"""


def got(tmp_path: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((tmp_path / "got.json").read_text())
    return result


def loop_with_context(guard: LoopGuard) -> list[Any]:
    guard.user_message("s", text="What will the weather be in Paris tomorrow?")
    guard.before_tool("read_file", {"path": "notes.md"}, session="s")
    guard.after_tool("read_file", {"path": "notes.md"}, session="s", result="use the web")
    calls = [
        Call(
            "web_search",
            {"query": "paris weather tomorrow"},
            result="No results for this query (rate limited)",
        )
    ] * RESCUE_AT
    return run(guard, calls).decisions


def test_argv_contract_question_as_one_argument_nothing_on_stdin(tmp_path: Path) -> None:
    ask = command(tmp_path, RECORDER)
    guard = LoopGuard(POLICY.replace(advisor_command=str(ask), advisor_model="opus"))
    assert isinstance(guard.advisor, CommandAdvisor) and guard.advisor.input_mode.value == "argv"
    decisions = loop_with_context(guard)
    rescue = decisions[-1]
    assert rescue.action is Action.RESCUE and "forecast API" in rescue.message
    seen = got(tmp_path)
    assert len(seen["argv"]) == 1 and seen["stdin"] == "" and seen["model"] == "opus"
    question = seen["argv"][0]
    # the task, the refused call with its arguments, its latest output
    assert "What will the weather be in Paris tomorrow?" in question
    assert "Tool: web_search" in question and '{"query":"paris weather tomorrow"}' in question
    assert "## Its latest output\nNo results for this query (rate limited)" in question
    # the recent calls with their arguments and outcomes, and what was already tried
    assert 'read_file {"path":"notes.md"} -> ok; output: use the web' in question
    assert (
        f'web_search {{"query":"paris weather tomorrow"}} ({RESCUE_AT} times in a row)'
        f" -> refused" in question
    )
    tried = question.split("## Already tried")[1]
    refused = RESCUE_AT - (POLICY.no_progress_threshold or 0) + 1
    assert (
        f'web_search {{"query":"paris weather tomorrow"}}: {RESCUE_AT} times, {refused}'
        f" refused" in tried
    )
    # what a good answer looks like
    assert "## What a good answer looks like" in question and "next step" in question


def test_stdin_json_contract_keeps_the_request_as_json(tmp_path: Path) -> None:
    ask = command(
        tmp_path,
        """
        import json, os, sys
        request = json.load(sys.stdin)
        with open(os.path.join(os.path.dirname(sys.argv[0]), "got.json"), "w") as f:
            json.dump({"argv": sys.argv[1:], "request": request}, f)
        print("advice from json")
    """,
    )
    guard = LoopGuard(POLICY.replace(advisor_command=str(ask), advisor_input="stdin_json"))
    decisions = loop_with_context(guard)
    assert decisions[-1].action is Action.RESCUE and "advice from json" in decisions[-1].message
    seen = got(tmp_path)
    request = seen["request"]
    assert seen["argv"] == []
    assert request["tool"] == "web_search" and request["task"].startswith("What will")
    assert request["latest_output"].startswith("No results")
    assert request["recent_calls"][0]["tool"] == "read_file"
    assert request["recent_calls"][0]["outcome"] == "ok"
    assert "## The refused call" in request["question"]


def test_tilde_in_the_advisor_command_is_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    command(home / "bin", RECORDER, name="ask-claude")
    guard = LoopGuard(POLICY.replace(advisor_command="~/bin/ask-claude"))
    assert isinstance(guard.advisor, CommandAdvisor)
    assert guard.advisor.argv[0] == str(home / "bin" / "ask-claude")
    assert loop_with_context(guard)[-1].action is Action.RESCUE


def test_the_question_is_bounded_and_a_real_command_receives_it(tmp_path: Path) -> None:
    ask = command(tmp_path, RECORDER)
    guard = LoopGuard(POLICY.replace(advisor_command=str(ask)))
    guard.user_message("s", text="é" * 1_000_000)  # two bytes each in UTF-8
    huge = {"blob": "\u4e2d\x00" * 500_000}
    for n in range(30):
        guard.before_tool("read", {"n": n, "blob": "x" * 50_000}, session="s")
        guard.after_tool(
            "read", {"n": n, "blob": "x" * 50_000}, session="s", result="\U0001f600" * 100_000
        )
    decisions = run(guard, [Call("f", huge, result="\x00" * 1_000_000)] * RESCUE_AT).decisions
    assert decisions[-1].action is Action.RESCUE
    question = got(tmp_path)["argv"][0]
    assert len(question) <= MAX_QUESTION_CHARS
    assert len(question.encode()) < LINUX_ARG_MAX_BYTES // 2
    assert "\x00" not in question
    state = guard.export_session("s")
    assert state is not None and state.trail is not None
    assert len(state.trail.calls) == MAX_TRAIL_CALLS
    assert all(len(c.arguments) <= MAX_TRAIL_ARGUMENT_CHARS for c in state.trail.calls)
    assert all(len(c.output or "") <= MAX_TRAIL_OUTPUT_CHARS for c in state.trail.calls)
    assert state.trail.task is not None and len(state.trail.task) == MAX_TASK_CHARS


def test_a_request_makes_a_bounded_question_on_its_own() -> None:
    request = AdviceRequest(
        session="s",
        tool="t",
        arguments_preview="a" * 50_000,
        count=5,
        rule="window",
        denial="no",
        task="T" * 50_000,
        latest_user_message="L" * 50_000,
        latest_output="O" * 50_000,
        earlier_advice=("A" * 50_000,) * 5,
        recent_calls=tuple(CallRecord("t", "x" * 50_000, "ok", "y" * 50_000) for _ in range(50)),
    )
    question = request.question()
    assert len(question) <= MAX_QUESTION_CHARS
    assert "(not known" not in question and "within its latest calls" in question
    bare = AdviceRequest(
        session="s", tool="t", arguments_preview="{}", count=3, rule="consecutive", denial="no"
    ).question()
    assert "(not known: the agent's host did not pass the user's request)" in bare
    assert "(not reported)" in bare


@pytest.mark.parametrize(
    ("body", "needle"),
    [("import sys; sys.exit(2)", "exited with 2"), ("print('   ')", "printed no advice")],
)
def test_an_advisor_that_fails_is_unavailable(tmp_path: Path, body: str, needle: str) -> None:
    ask = CommandAdvisor(str(command(tmp_path, body)), timeout_seconds=5)
    request = AdviceRequest(
        session="s", tool="t", arguments_preview="{}", count=5, rule="window", denial="no"
    )
    with pytest.raises(AdvisorError, match=needle):
        ask(request)


def test_a_missing_advisor_gives_the_local_denial(tmp_path: Path) -> None:
    guard = LoopGuard(POLICY.replace(advisor_command=str(tmp_path / "nope")))
    decisions = loop_with_context(guard)
    assert decisions[-1].action is Action.DENY and "Advice" not in decisions[-1].message


def test_bad_advisor_options_fail_naming_them() -> None:
    with pytest.raises(ValueError, match="input_mode.*'stdin'"):
        CommandAdvisor("ask", input_mode="stdin")
    with pytest.raises(ValueError, match="advisor_input.*'pipe'"):
        Policy(advisor_input="pipe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="advisor_model.*''"):
        Policy(advisor_model="")


def test_a_new_run_task_replaces_the_task_and_later_messages_are_the_latest() -> None:
    requests: list[AdviceRequest] = []

    def advisor(request: AdviceRequest) -> str:
        requests.append(request)
        return "advice"

    guard = LoopGuard(POLICY, advisor=advisor)
    guard.user_message("s", text="first request")
    guard.user_message("s", text="now also fix the tests")
    run(guard, [Call("ls", {}, result="x")] * RESCUE_AT)
    guard.new_run("s", task="a brand new task")
    run(guard, [Call("pwd", {}, result="/")] * RESCUE_AT)
    assert (requests[0].task, requests[0].latest_user_message) == (
        "first request",
        "now also fix the tests",
    )
    assert (requests[1].task, requests[1].latest_user_message) == ("a brand new task", None)
    assert requests[1].earlier_advice == ()  # a new epoch: the old advice no longer applies


def test_no_advisor_no_trail_and_the_trail_survives_export_and_import() -> None:
    plain = LoopGuard(POLICY)
    plain.user_message("s", text="task")
    run(plain, [Call("ls", {}, result="x")] * 2)
    state = plain.export_session("s")
    assert state is not None and state.trail is None
    assert b"trail" not in state.to_bytes()

    guard = LoopGuard(POLICY, advisor=lambda request: "advice")
    guard.user_message("s", text="the task")
    run(guard, [Call("ls", {"a": 1}, result="x", error=True)] * 2)
    saved = guard.export_session("s")
    assert saved is not None
    restored = SessionState.from_bytes(saved.to_bytes(), POLICY)
    assert restored.trail is not None and restored.trail.task == "the task"
    # the same call back to back is one entry with its count
    assert [(c.tool, c.arguments, c.outcome, c.output, c.times) for c in restored.trail.calls] == [
        ("ls", '{"a":1}', "error", "x", 2)
    ]
    with pytest.raises(ValueError, match="trail"):
        SessionState.from_bytes(saved.to_bytes().replace(b'"calls":[', b'"calls":[7,'), POLICY)


def test_set_task_keeps_the_epoch_and_adapters_pass_the_runs_prompt() -> None:
    from otel_loopguard.integrations._hook import ToolHook

    requests: list[AdviceRequest] = []

    def advisor(request: AdviceRequest) -> str:
        requests.append(request)
        return "advice"

    guard = LoopGuard(POLICY, advisor=advisor)
    run(guard, [Call("ls", {}, result="x")] * (RESCUE_AT - 1))
    guard.set_task("s", "list the files")  # learnt late: the evidence so far is kept
    assert run(guard, [Call("ls", {}, result="x")]).decisions[-1].action is Action.RESCUE
    assert requests[-1].task == "list the files"
    LoopGuard(POLICY).set_task("s", "no advisor: nothing kept, nothing raised")

    hook = ToolHook(guard)
    keys = ("t", None)
    hook.run_marker(keys, "run-1", task="first run's prompt")
    run(guard, [Call("pwd", {}, result="/", session="t")] * RESCUE_AT)
    hook.run_marker(keys, "run-2", task="second run's prompt")
    run(guard, [Call("pwd", {}, result="/", session="t")] * RESCUE_AT)
    assert [r.task for r in requests[-2:]] == ["first run's prompt", "second run's prompt"]


def test_the_last_refusal_before_a_stop_asks_the_advisor() -> None:
    """The default ladder blocks a call whose result keeps coming back the same from its 4th
    time and stops after three refusals, before rescue_threshold (8) is reached: with an
    advisor the last refusal before the stop is a rescue, so the advisor gets its one chance;
    without one the ladder is unchanged."""
    default = PRESETS["default"]
    assert default.no_progress_threshold is not None and default.stop_after_denials is not None
    assert default.rescue_threshold is not None
    assert default.no_progress_threshold + default.stop_after_denials < default.rescue_threshold
    asked: list[AdviceRequest] = []

    def advisor(request: AdviceRequest) -> str:
        asked.append(request)
        return "Read the build log before running make again."

    for with_advisor in (True, False):
        guard = LoopGuard(default, advisor=advisor if with_advisor else None)
        actions = []
        for _ in range(8):
            decision = guard.before_tool("bash", {"command": "make"}, session="s")
            actions.append(decision.action)
            if not decision.blocks:
                guard.after_tool("bash", {"command": "make"}, session="s", result="error 2")
            if decision.action is Action.RESCUE:
                rescue = decision
        last = Action.RESCUE if with_advisor else Action.DENY
        assert (
            actions
            == [Action.ALLOW] * 2 + [Action.REMIND] + [Action.DENY] * 2 + [last] + [Action.STOP] * 2
        ), (with_advisor, actions)
    assert len(asked) == 1
    assert rescue.message.endswith(
        "Advice from a reviewer model:\nRead the build log before running make again."
    )
    assert "if another call is refused, the run will end" in rescue.message


def test_a_rescue_decided_at_span_start_gets_its_advice_when_awaited() -> None:
    """The span processor decides a tool span at its start without waiting for the advisor; an
    adapter that enforces that decision waits for the advice (``await_advice``, which
    ``ToolHook.before`` calls), so the model reads it with the refusal, as with before_tool."""
    from otel_loopguard.integrations._hook import ToolHook

    asked: list[AdviceRequest] = []

    def advisor(request: AdviceRequest) -> str:
        asked.append(request)
        return "Read the build log before running make again."

    policy = PRESETS["default"]
    guard = LoopGuard(policy, advisor=advisor)
    hook = ToolHook(guard)
    arguments = {"command": "make"}
    decisions = []
    for n in range(7):
        decision = guard.decide_at_span_start("bash", arguments, "s", "coder", f"c{n}")
        ticket = hook.before("bash", arguments, f"c{n}", ("s", "coder"), decision)
        decisions.append((decision, ticket.decision))
        if not decision.blocks:
            guard.after_tool(
                "bash", arguments, session="s", agent="coder", call_id=f"c{n}", result="error 2"
            )
    (rescued,) = [pair for pair in decisions if pair[0].action is Action.RESCUE]
    at_start, enforced = rescued
    assert "Advice from a reviewer model" not in at_start.message  # not waited for there
    assert enforced.message == (
        at_start.message + "\n\nAdvice from a reviewer model:\n"
        "Read the build log before running make again."
    )
    assert len(asked) == 1 and asked[0].agent == "coder"
    # Anything else is returned as it is, and an ask not known here too.
    assert guard.await_advice(decisions[0][0]) is decisions[0][0]
    assert guard.await_advice(at_start, agent="someone else") is at_start
