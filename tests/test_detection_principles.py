"""The detection principles of issue 9, each on a small real-shaped sequence, through the hook API.

Progress (what starts a new epoch), failures weighing more than successes, long cycles, and the
post-call conclusion that ``after_tool`` returns.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_loopguard import PRESETS, Action, LoopGuard
from otel_loopguard._calls import failure_text, outcome_key
from otel_loopguard._classifier import Classifier
from otel_loopguard._policy import Phase

from .conftest import threshold

DEFAULT = PRESETS["default"]
FAILURES = threshold(DEFAULT.failure_stop_threshold)
DENY = threshold(DEFAULT.deny_threshold)


def drive(
    guard: LoopGuard, calls: Sequence[tuple[str, object, object, bool | None]], session: str = "s"
) -> list[tuple[Action, Action | None]]:
    """(pre action, post action or None) per call; a blocked call is not run."""
    out: list[tuple[Action, Action | None]] = []
    for tool, arguments, result, error in calls:
        pre = guard.before_tool(tool, arguments, session=session)
        post = None
        if not pre.blocks:
            answer = guard.after_tool(tool, arguments, session=session, result=result, error=error)
            post = answer.action if answer is not None else None
        out.append((pre.action, post))
    return out


def blocked(actions: list[tuple[Action, Action | None]]) -> bool:
    return any(
        pre in (Action.DENY, Action.RESCUE, Action.STOP) or post is Action.STOP
        for pre, post in actions
    )


# -- progress: an identical mutation is not progress -----------------------------------------


def test_the_same_commit_thirty_times_is_a_loop() -> None:
    commit = ("bash", {"command": "git commit -am 'fix'"}, "[main 1a2b3c] fix", False)
    actions = drive(LoopGuard(DEFAULT), [commit] * 30)
    assert blocked(actions)
    first = next(i for i, (pre, _) in enumerate(actions, 1) if pre is not Action.ALLOW)
    assert first <= DEFAULT.remind_thresholds[0]


def test_the_same_write_ten_times_is_a_loop() -> None:
    write = ("write_file", {"path": "a.py", "content": "x = 1\n"}, "wrote 6 bytes", False)
    assert blocked(drive(LoopGuard(DEFAULT), [write] * 10))


def test_a_different_mutation_is_progress() -> None:
    calls = []
    for n in range(12):
        calls.append(("bash", {"command": "pytest -x"}, "1 failed", False))
        calls.append(
            ("edit_file", {"path": "a.py", "old": f"v{n}", "new": f"v{n + 1}"}, "ok", False)
        )
    assert not blocked(drive(LoopGuard(DEFAULT), calls))


def test_a_failed_structured_mutation_changed_nothing() -> None:
    book = ("book_reservation", {"user_id": "u1", "flight": "HAT001"}, "Error: no seats", True)
    look = ("get_user_details", {"user_id": "u1"}, "user u1", False)
    actions = drive(LoopGuard(DEFAULT), [look, book] * 4)
    assert blocked(actions)


# -- progress: multi-command tools and shell tools by argument -------------------------------


def test_multi_command_tools_are_classified_per_command() -> None:
    classify = Classifier(DEFAULT).classify
    assert classify("str_replace_editor", {"command": "view", "path": "/a.py"}) == (True, False)
    for command in ("create", "str_replace", "insert"):
        assert classify("str_replace_editor", {"command": command, "path": "/a.py"}) == (True, True)
    # Any tool whose command/action argument names the operation (SWE-agent's own commands).
    assert classify("create", {"command": "create reproduce.py"}) == (True, True)
    assert classify("open", {"command": "open src/a.py 120"}) == (True, False)
    assert classify("files", {"action": "delete", "path": "a"}) == (True, True)


def test_the_operation_table_is_policy_data() -> None:
    policy = DEFAULT.replace(read_operations=(), mutating_operations=())
    assert Classifier(policy).classify("str_replace_editor", {"command": "view"}) == (True, True)
    for name in ("reminder", "brake", "rescue"):  # the seeds keep their plugin's own lists
        assert PRESETS[name].read_operations == () and PRESETS[name].mutating_operations == ()


def test_a_tool_whose_argument_is_a_command_line_is_a_shell_tool() -> None:
    classify = Classifier(DEFAULT).classify
    for tool in ("bash", "execute_bash", "run_shell_command", "exec_command", "my_runner"):
        assert classify(tool, {"command": "sed -i 's/a/b/' x.py"}) == (True, True), tool
        assert classify(tool, {"command": "grep -rn foo src"}) == (True, False), tool
    assert classify("my_runner", {"cmd": ["bash", "-lc", "git commit -m x"]}) == (True, True)


def test_a_view_between_repeats_is_not_progress() -> None:
    grep = ("grep", {"pattern": "parse", "path": "src"}, "src/a.py:1", False)
    view = ("str_replace_editor", {"command": "view", "path": "/src/a.py"}, "1 def parse", False)
    assert blocked(drive(LoopGuard(DEFAULT), [grep, view] * 6))


# -- failures weigh more, and volatile parts do not make a failure new -----------------------


def test_the_third_identical_failure_stops_after_the_call() -> None:
    build = ("bash", {"command": "cargo build"}, "error[E0425]: cannot find value", True)
    actions = drive(LoopGuard(DEFAULT), [build] * 5)
    assert [post for _, post in actions[: FAILURES - 1]] == [None] * (FAILURES - 1)
    assert actions[FAILURES - 1][1] is Action.STOP
    assert all(pre is Action.STOP for pre, _ in actions[FAILURES:])


def test_identical_successes_are_not_stopped_after_the_call() -> None:
    read = ("read_file", {"path": "a.py"}, "x = 1", False)
    assert all(post is None for _, post in drive(LoopGuard(DEFAULT), [read] * 5))


def test_failures_differing_in_volatile_parts_are_the_same_failure() -> None:
    calls = [
        (
            "bash",
            {"command": "python run.py"},
            f"Traceback at 2025-01-0{n}T10:0{n}:00Z (pid {4000 + n}) in /tmp/tmpab{n}cd9xy:"
            f" object at 0x7f3a{n}b2c0 timed out after {n}.5s",
            True,
        )
        for n in range(1, 4)
    ]
    assert drive(LoopGuard(DEFAULT), calls)[-1][1] is Action.STOP
    assert outcome_key(calls[0][2], True) == outcome_key(calls[1][2], True)
    assert failure_text("exit 1") == "exit 1"


def test_failures_with_different_messages_are_not_the_same_failure() -> None:
    calls = [("bash", {"command": "pytest"}, f"{n} failed", True) for n in range(1, 4)]
    assert all(post is None for _, post in drive(LoopGuard(DEFAULT), calls))


def test_successful_rereads_spread_among_new_exploration_stay_quiet() -> None:
    calls = []
    for n in range(10):
        calls.append(("read_file", {"path": "README.md"}, "readme", False))
        calls += [("read_file", {"path": f"src/m{n}_{k}.py"}, f"m{n}{k}", False) for k in range(4)]
    actions = drive(LoopGuard(DEFAULT), calls)
    assert not blocked(actions)


# -- long cycles -------------------------------------------------------------------------------


def test_a_cycle_of_six_calls_without_results_is_denied_long_before_the_stall() -> None:
    cycle = [("search_code", {"code_str": f"name{n}"}, None, None) for n in range(6)]
    actions = drive(LoopGuard(DEFAULT), cycle * 8)
    first = next(i for i, (pre, _) in enumerate(actions, 1) if pre is Action.DENY)
    assert first <= 6 * (DENY - 1) + 1 < DEFAULT.stall_threshold
    assert DEFAULT.window_size >= 6 * DENY


# -- the post-call contract --------------------------------------------------------------------


def test_after_tool_returns_a_post_decision_only_when_it_concludes() -> None:
    guard = LoopGuard(DEFAULT)
    answers = []
    for _ in range(FAILURES):
        guard.before_tool("bash", {"command": "make"}, session="s", call_id=None)
        answers.append(
            guard.after_tool(
                "bash",
                {"command": "make"},
                session="s",
                result="make: *** [all] Error 2",
                error=True,
            )
        )
    assert answers[:-1] == [None] * (FAILURES - 1)
    last = answers[-1]
    assert last is not None and last.phase is Phase.POST and last.action is Action.STOP
    assert last.count == FAILURES and "failed the same way" in last.message


def test_a_post_decision_is_softened_by_the_mode() -> None:
    from otel_loopguard import Mode

    guard = LoopGuard(DEFAULT.replace(mode=Mode.OBSERVE))
    for _ in range(FAILURES):
        guard.before_tool("bash", {"command": "make"}, session="s")
        answer = guard.after_tool("bash", {"command": "make"}, session="s", result="E", error=True)
    assert answer is not None and answer.action is Action.ALLOW and answer.detected is Action.STOP


# -- properties ---------------------------------------------------------------------------------


_READS = st.sampled_from(
    [
        ("grep", {"pattern": "x"}),
        ("read_file", {"path": "a.py"}),
        ("bash", {"command": "pytest -q"}),
    ]
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_READS, min_size=1, max_size=40), st.booleans())
def test_a_different_successful_mutation_between_every_repeat_is_never_blocked(
    reads: list[tuple[str, object]], failing: bool
) -> None:
    guard = LoopGuard(DEFAULT)
    calls: list[tuple[str, object, object, bool]] = []
    for n, (tool, arguments) in enumerate(reads):
        calls.append((tool, arguments, "same" if not failing else "E", failing))
        calls.append(("edit_file", {"path": "a.py", "new": f"v{n}"}, "ok", False))
    assert not blocked(drive(guard, calls))


@settings(max_examples=60, deadline=None)
@given(st.lists(_READS, min_size=1, max_size=30), st.booleans())
def test_a_user_message_always_starts_a_new_epoch(
    reads: list[tuple[str, object]], failing: bool
) -> None:
    guard = LoopGuard(DEFAULT)
    for tool, arguments in reads:
        for _ in range(3):
            drive(guard, [(tool, arguments, "E" if failing else "r", failing)])
        guard.user_message("s")
        assert guard.before_tool(tool, arguments, session="s").action is Action.ALLOW
        guard.after_tool(tool, arguments, session="s", result="r", error=False)
        guard.user_message("s")
