"""The peers' own stuck / not-stuck test cases (issue 9, item 6), translated to our hook API.

Sources, read at the commits the search index holds:
- OpenHands ``tests/unit/controller/test_is_stuck.py`` (OpenHands/OpenHands 331a1a43; the two
  empty-command documentation tests from All-Hands-AI/OpenHands 0c68ea35).
- Gemini CLI ``packages/core/src/services/loopDetectionService.test.ts`` (google-gemini/gemini-cli
  02768438).

Only their tool-call cases: monologue, empty-response, context-window and content/LLM-check cases
are not about tool calls and are left out. Each OpenHands action becomes the tool call its CodeAct
agent makes (``CmdRunAction`` -> ``execute_bash``, ``FileReadAction`` -> ``str_replace_editor``
``view``, ``IPythonRunCellAction`` -> ``execute_ipython_cell``) and its observation the result;
Gemini CLI's ``testTool``/``anotherTool`` become ``read_file``/``glob``.

Counting "when": OpenHands checks after an observation and ends the run, so "stuck at N" means N
calls ran and the next never does; Gemini CLI checks the request, so "loop at the Nth" means N-1
ran. We answer before a call: "denied at N" means N-1 ran. A post-call stop (``!``) means the
call ran and the run ends.

Each step's outcome is one letter: A allow, R remind, D deny, X rescue, S stop; ``!`` after it when
``after_tool`` answered stop.
"""

from __future__ import annotations

from typing import Any

import pytest

from otel_loopguard import PRESETS, Action, LoopGuard, Mode, Policy

DEFAULT = PRESETS["default"]
USER = "user message"
UNREPORTED = object()  # the call's result never reaches the guard (a pre-call hook only)
LETTER = {
    Action.ALLOW: "A",
    Action.REMIND: "R",
    Action.DENY: "D",
    Action.RESCUE: "X",
    Action.STOP: "S",
}

Step = Any  # (tool, arguments, result, error) or USER


def drive(steps: list[Step], policy: Policy = DEFAULT, guard: LoopGuard | None = None) -> str:
    """Run the steps through one session; return the outcome letters, space-separated."""
    guard = guard if guard is not None else LoopGuard(policy)
    out: list[str] = []
    for step in steps:
        if step == USER:
            guard.user_message("s")
            out.append("|")
            continue
        tool, arguments, result, error = step
        pre = guard.before_tool(tool, arguments, session="s")
        letter = LETTER[pre.action]
        if not pre.blocks and result is not UNREPORTED:
            post = guard.after_tool(tool, arguments, session="s", result=result, error=error)
            if post is not None and post.action is Action.STOP:
                letter += "!"
        out.append(letter)
    return " ".join(out)


def bash(command: str, output: str, error: bool = False) -> Step:
    return ("execute_bash", {"command": command}, output, error)


def view(path: str, content: str) -> Step:
    return ("str_replace_editor", {"command": "view", "path": path}, content, False)


def cell(code: str, output: str, error: bool = False) -> Step:
    return ("execute_ipython_cell", {"code": code}, output, error)


LS = bash("ls", "file1.txt\nfile2.txt")
LS_EMPTY = bash("ls", "")
LS_OTHER = bash("ls", "file1.txt\nfile3.txt")  # OpenHands' cmd_ls_different_observation
PWD = bash("pwd", "/home/user")
VIEW1 = view("/workspace/file1.txt", "File content")
VIEW1_OTHER = view("/workspace/file1.txt", "File content, edited elsewhere")
VIEW2 = view("/workspace/file2.txt", "Another file content")


# == OpenHands tests/unit/controller/test_is_stuck.py ==========================================


def test_openhands_history_too_short() -> None:
    """OpenHands test_history_too_short: one `ls` is not stuck. AGREE."""
    assert drive([LS]) == "A"


def test_openhands_interactive_mode_resets_after_user_message() -> None:
    """OpenHands test_interactive_mode_resets_after_user_message: 4 identical `ls` pairs are stuck,
    a user message resets (interactive mode), 2 more are not, 4 after it are. AGREE, one call
    earlier each time: the 4th identical call is denied instead of run; our user message always
    starts a new epoch (OpenHands' headless mode ignores it, see the next test)."""
    steps = [LS_EMPTY] * 4 + [USER] + [LS_EMPTY] * 2
    assert drive(steps) == "A A R D | A A"
    assert drive(steps + [LS_EMPTY] * 2) == "A A R D | A A R D"


def test_openhands_repeating_action_observation() -> None:
    """OpenHands test_is_stuck_repeating_action_observation: `ls` with the same output 4 times is
    stuck (headless, the user message between the 2nd and 3rd ignored). AGREE, one call earlier:
    3 identical results and the 4th is denied. With the user message delivered to us we DIFFER:
    a real user message is a new progress epoch, so the count starts over."""
    assert drive([LS_EMPTY] * 4) == "A A R D"
    assert drive([LS_EMPTY] * 2 + [USER] + [LS_EMPTY] * 2) == "A A | A A"


def test_openhands_repeating_action_error_with_different_errors() -> None:
    """OpenHands test_is_stuck_repeating_action_error: the same command failing 4 times with
    different error texts is stuck (3 errors suffice). DIFFER, later: failures with different
    texts are not the same failure and the results change, so no early stop; with no progress
    the call is denied at deny_threshold (6) and the run stopped at the 9th call."""
    errors = [
        "Command not found",
        "Command still not found or another error",
        "Different error",
        "Command not found",
    ]
    steps = [bash("invalid_command", text, error=True) for text in errors * 3]
    assert drive(steps[:4]) == "A A R A"
    assert drive(steps[:9]) == "A A R A R D D D S"
    assert DEFAULT.deny_threshold == 6


def test_openhands_repeating_action_error_same_error() -> None:
    """OpenHands test_is_stuck_repeating_action_error, the same error each time (their
    loop_repeat_times == 3). AGREE at the same count: stopped right after the 3rd identical
    failure ran (failure_stop_threshold = 3, taken from OpenHands)."""
    steps = [bash("invalid_command", "bash: invalid_command: command not found", error=True)] * 4
    assert drive(steps) == "A A R! S"


SYNTAX_ERRORS = [
    "SyntaxError: invalid syntax. Perhaps you forgot a comma?",
    "SyntaxError: incomplete input",
]
CODE = (
    'edit_file_by_replace(\n    \'book_store.py\',\n    to_replace="""def total(basket):\n'
    "    if not basket:\n        return 0\n"
)
JUPYTER = (
    "\n[Jupyter current working directory: /workspace]"
    "\n[Jupyter Python interpreter: /usr/bin/python]"
)


def syntax_output(message: str, incident: int, random_line: bool) -> str:
    line = (incident + 1) * 10 if random_line else 42
    extra = "\n" * (incident + 1) if random_line else ""
    return (
        f'  Cell In[1], line {line}\nto_replace="""def largest(min_factor, max_factor):\n'
        f"            ^\n{message}{extra}{JUPYTER}"
    )


def unterminated_output(incident: int, random_line: bool) -> str:
    line = (incident + 1) * 10 if random_line else 1
    return (
        f'print("  Cell In[1], line {line}\nhello\n       ^\nSyntaxError: unterminated string '
        f"literal (detected at line {line}){JUPYTER}"
    )


@pytest.mark.parametrize("message", SYNTAX_ERRORS + ["unterminated"])
def test_openhands_same_syntax_error_four_times(message: str) -> None:
    """OpenHands test_is_stuck_invalid_syntax_error, test_is_stuck_incomplete_input_error,
    test_is_stuck_ipython_unterminated_string_error: the same cell with the same SyntaxError 4
    times is stuck. AGREE, one call earlier: OpenHands returns the traceback as a normal cell
    output, so it is the same result 3 times and the 4th is denied; a host that flags the cell
    as failed gets a stop right after the 3rd identical failure."""

    def output(i: int) -> str:
        return (
            unterminated_output(i, False)
            if message == "unterminated"
            else syntax_output(message, i, False)
        )

    assert drive([cell(CODE, output(i)) for i in range(4)]) == "A A R D"
    assert drive([cell(CODE, output(i), error=True) for i in range(4)]) == "A A R! S"


@pytest.mark.parametrize("message", SYNTAX_ERRORS + ["unterminated"])
def test_openhands_syntax_error_on_changing_lines(message: str) -> None:
    """OpenHands test_is_not_stuck_invalid_syntax_error_random_lines,
    test_is_not_stuck_incomplete_input_error, test_is_not_stuck_ipython_unterminated_string_error
    _random_lines: the same cell whose error moves to another line each time is not stuck after
    4. AGREE (reminded, not blocked): a changing result is polling for us. Past their test we
    DIFFER: polling is denied at poll_limit (12), failed or not, where OpenHands never stops it."""

    def output(i: int) -> str:
        return (
            unterminated_output(i, True)
            if message == "unterminated"
            else syntax_output(message, i, True)
        )

    assert drive([cell(CODE, output(i)) for i in range(4)]) == "A A R A"
    for error in (False, True):
        outcomes = drive([cell(CODE, output(i), error=error) for i in range(12)]).split()
        assert outcomes.index("D") + 1 == DEFAULT.poll_limit == 12
        assert not any(o.endswith("!") for o in outcomes)


def test_openhands_syntax_error_too_few_incidents() -> None:
    """OpenHands test_is_not_stuck_invalid_syntax_error_only_three_incidents (3, changing lines)
    and test_is_not_stuck_ipython_unterminated_string_error_only_two_incidents (2, identical):
    not stuck. AGREE: 3 are reminded, 2 allowed."""
    message = SYNTAX_ERRORS[0]
    assert drive([cell(CODE, syntax_output(message, i, True)) for i in range(3)]) == "A A R"
    assert drive([cell(CODE, unterminated_output(i, False)) for i in range(2)]) == "A A"


def test_openhands_syntax_error_not_at_end() -> None:
    """OpenHands test_is_not_stuck_ipython_syntax_error_not_at_end: the same cell 4 times, the
    output after the error different each time: not stuck. AGREE: the result changes."""
    code = 'print("hello'
    tails = [
        "1)\nThis is some additional output",
        "1)\nToo much output here on and on",
        "3)\nEnough",
        "2)\nLast line of output",
    ]
    steps = [
        cell(
            code,
            f'print("hello\n       ^\nSyntaxError: unterminated string literal '
            f"(detected at line {tail}",
        )
        for tail in tails
    ]
    assert drive(steps) == "A A R A"


def test_openhands_repeating_action_observation_pattern() -> None:
    """OpenHands test_is_stuck_repeating_action_observation_pattern: `ls`, read file1, three
    times (6 pairs) is stuck. AGREE at the same point: 6 calls run, the 7th is denied (the 4th
    `ls` with the same output). With the user message they put after the 2nd pair delivered to
    us we DIFFER: it starts a new epoch (OpenHands headless ignores it)."""
    assert drive([LS, VIEW1] * 3 + [LS]) == "A A A A R R D"
    assert drive([LS, VIEW1] * 2 + [USER] + [LS, VIEW1]) == "A A A A | A A"


def test_openhands_not_stuck() -> None:
    """OpenHands test_is_stuck_not_stuck: ls, read file1, pwd, read file2, pwd, read file2 (a user
    message before the last two) is not stuck. AGREE: all allowed, with or without it."""
    assert drive([LS, VIEW1, PWD, VIEW2, PWD, VIEW2]) == "A A A A A A"
    assert drive([LS, VIEW1, PWD, VIEW2, USER, PWD, VIEW2]) == "A A A A | A A"


def test_openhands_pattern_needs_six_pairs() -> None:
    """OpenHands test_fail_guard_five_actions (5 pairs of read file1 / ls) and
    test_fail_guard_five_obs (a 6th action without its observation): not stuck. AGREE: not
    blocked; the 3rd identical result is reminded."""
    assert drive([VIEW1, LS, VIEW1, LS, VIEW1]) == "A A A A R"
    assert drive([VIEW1, LS, VIEW1, LS, VIEW1, LS]) == "A A A A R R"  # the 6th's pre-call answer


def test_openhands_pattern_broken_by_a_different_action() -> None:
    """OpenHands test_fail_actions_break_A6_A4 (`pwd` in place of the 2nd `ls`) and
    test_fail_actions_break_A5_A3 (file2 in place of the 2nd read): not stuck. AGREE: never
    blocked (the 3rd identical result is reminded)."""
    pwd_like_ls = bash("pwd", "file1.txt\nfile2.txt")  # their mock pairs pwd with ls' output
    assert drive([VIEW1, LS, VIEW1, pwd_like_ls, VIEW1, LS]) == "A A A A A A"
    view2_like_1 = view("/workspace/file2.txt", "File content")
    assert drive([VIEW1, LS, view2_like_1, LS, VIEW1, LS]) == "A A A A A R"


def test_openhands_pattern_broken_by_a_different_observation() -> None:
    """OpenHands test_fail_obs_break_O6_O4 (the 2nd `ls` output differs) and
    test_fail_obs_break_O5_O3 (the 2nd read differs): not stuck. AGREE: not blocked, reminded
    from the 3rd occurrence (the window counts the call, not the result)."""
    assert drive([VIEW1, LS, VIEW1, LS_OTHER, VIEW1, LS]) == "A A A A R R"
    assert drive([VIEW1, LS, VIEW1_OTHER, LS, VIEW1, LS]) == "A A A A R R"


def test_openhands_loop_ignores_other_events() -> None:
    """OpenHands test_loop_ignores_other_events: events that are neither action nor observation
    between the pairs do not hide the pattern. AGREE: such events never reach our guard, and
    untracked tools (here `think`, excluded) are transparent: the same decisions as without
    them, the 4th `ls` (7th tracked call) denied."""
    policy = DEFAULT.replace(exclude=("think",))

    def think(n: int) -> Step:
        return (
            "think",
            {"thought": f"step {n}: compare file1 with the listing"},
            "Your thought has been logged.",
            False,
        )

    steps = [think(0), VIEW1, think(1), LS, VIEW1, LS, think(2), VIEW1, LS, think(3), LS]
    tracked = [
        o for o, s in zip(drive(steps, policy).split(), steps, strict=True) if s[0] != "think"
    ]
    assert " ".join(tracked) == drive([VIEW1, LS, VIEW1, LS, VIEW1, LS, LS], policy)
    assert tracked[-1] == "D"


def test_distinct_thoughts_are_distinct_calls() -> None:
    """Found translating test_loop_ignores_other_events: OpenHands' `think` tool (sole argument
    `thought`) was denied on its 4th use in an epoch whatever it thought, because `thought` is a
    cosmetic field. A cosmetic field is now kept when it is the call's only argument."""
    steps = [
        (
            "think",
            {"thought": f"Plan step {n}: look at module {n}"},
            "Your thought has been logged.",
            False,
        )
        for n in range(5)
    ]
    assert "D" not in drive(steps).split()


def test_openhands_loop_ignores_extra_actions() -> None:
    """OpenHands test_loop_ignores_extra_actions: an extra `ls` before the 6-pair pattern; stuck
    after 7 ran. AGREE, one call earlier: the extra `ls` is one more identical `ls`, so the last
    (its 4th) is denied and 6 ran."""
    assert drive([LS] + [VIEW1, LS] * 3) == "A A A A R R D"


def test_openhands_loop_ignores_extra_observations() -> None:
    """OpenHands test_loop_ignores_extra_observations: an observation without its action before
    the pattern is ignored; stuck after 6 pairs. DIFFER, earlier: a result reported without
    before_tool (a span seen only when it ends) counts as a run of that call, so the 3rd read
    after it is its 4th identical result and is denied."""
    guard = LoopGuard(DEFAULT)
    tool, arguments, result, error = VIEW1
    answer = guard.after_tool(tool, arguments, session="s", result=result, error=error)
    assert answer is not None and answer.action is Action.ALLOW
    assert drive([VIEW1, LS] * 3, guard=guard) == "A A R A D R"


def test_openhands_empty_command_same_output() -> None:
    """OpenHands (All-Hands-AI) test_empty_command_threshold_documentation: an empty command
    (waiting on a running process) is stuck only at 10, not at 4; a regular one at 4. DIFFER,
    earlier: an empty command that returns the same output 3 times has learned nothing and the
    4th is denied; exclude_commands=(r"^\\s*$",) makes such waits untracked."""
    wait = bash("", "")
    assert drive([wait] * 4) == "A A R D"
    assert drive([wait] * 10, DEFAULT.replace(exclude_commands=(r"^\s*$",))) == " ".join("A" * 10)


def test_openhands_empty_command_changing_output() -> None:
    """OpenHands (All-Hands-AI) test_empty_commands_with_different_observations_documentation:
    empty commands whose output changes are not stuck. AGREE through 11 calls (polling, reminded);
    DIFFER beyond: the 12th (poll_limit) is denied, where OpenHands never stops it."""
    steps = [bash("", f"Downloading torch ... {10 * n}%") for n in range(12)]
    outcomes = drive(steps).split()
    assert "D" not in outcomes[:11] and outcomes[11] == "D"


# == Gemini CLI packages/core/src/services/loopDetectionService.test.ts ========================

APP = ("read_file", {"file_path": "src/app.ts"}, "export const app = createApp();\n", False)
APP_UNREPORTED = (*APP[:2], UNREPORTED, None)
THRESHOLD = 5  # Gemini CLI's TOOL_CALL_LOOP_THRESHOLD


def test_gemini_fewer_than_threshold_identical_calls() -> None:
    """Gemini CLI 'should not detect a loop for fewer than TOOL_CALL_LOOP_THRESHOLD identical
    calls' (4 calls). With results, DIFFER, earlier: the same file content 3 times and the 4th
    read is denied. Without results (only the pre-call hook, as Gemini's own check), AGREE:
    reminded, not blocked."""
    assert drive([APP] * (THRESHOLD - 1)) == "A A R D"
    assert drive([APP_UNREPORTED] * (THRESHOLD - 1)) == "A A R A"


def test_gemini_loop_on_the_threshold_call() -> None:
    """Gemini CLI 'should detect a loop on the TOOL_CALL_LOOP_THRESHOLD-th identical call' (the
    5th). With results AGREE, one call earlier (the 4th is denied); without results DIFFER, one
    later: the 5th is reminded and the 6th (deny_threshold) denied. The seed presets: `brake`
    denies the 4th, `rescue` the 3rd, `reminder` never."""
    assert drive([APP] * THRESHOLD).split()[THRESHOLD - 2] == "D"
    assert drive([APP_UNREPORTED] * (THRESHOLD + 1)) == "A A R A R D"
    assert drive([APP] * THRESHOLD, PRESETS["brake"]) == "A A A D D"
    assert drive([APP] * THRESHOLD, PRESETS["rescue"]) == "A A D D D"
    assert drive([APP] * THRESHOLD, PRESETS["reminder"]) == "A A R A R"


def test_gemini_loop_on_subsequent_identical_calls() -> None:
    """Gemini CLI 'should detect a loop on subsequent identical calls' (the 6th). AGREE: the 6th
    is blocked with or without results."""
    assert drive([APP] * (THRESHOLD + 1)).split()[-1] == "D"
    assert drive([APP_UNREPORTED] * (THRESHOLD + 1)).split()[-1] == "D"


def test_gemini_different_tool_calls() -> None:
    """Gemini CLI 'should not detect a loop for different tool calls': read app.ts, read util.ts,
    glob app.ts, three rounds. AGREE: not blocked (reminded in the 3rd round). Beyond the test we
    DIFFER: any different call resets Gemini's count, so the cycle is never caught; our window
    denies its 4th round."""
    cycle = [
        APP,
        ("read_file", {"file_path": "src/util.ts"}, "export const util = 1;\n", False),
        ("glob", {"pattern": "src/app.ts"}, "src/app.ts", False),
    ]
    assert drive(cycle * 3) == "A A A A A A R R R"
    assert drive(cycle * 4).split()[9] == "D"


def test_gemini_other_events_do_not_reset() -> None:
    """Gemini CLI 'should not reset tool call counter for other event types': 4 calls, a thought,
    the 5th is a loop. AGREE that a thought resets nothing: it never reaches the guard (only a
    user message or a successful new mutation starts an epoch), so the decisions are those of
    the identical calls alone (see the threshold test for the counts)."""
    guard = LoopGuard(DEFAULT)
    first = drive([APP_UNREPORTED] * (THRESHOLD - 1), guard=guard)
    # The model's thought goes to no hook; the 5th and 6th calls continue the same count.
    assert first + " " + drive([APP_UNREPORTED] * 2, guard=guard) == "A A R A R D"


@pytest.mark.parametrize("mode", [Mode.OBSERVE])
def test_gemini_detection_disabled(mode: Mode) -> None:
    """Gemini CLI 'should not detect a loop when disabled for session' and 'should skip loop
    detection if disabled in config'. AGREE with observe mode: every call allowed, while
    Decision.detected still says what the guard would have done. (Ours is per guard, not per
    session.)"""
    guard = LoopGuard(DEFAULT.replace(mode=mode))
    assert drive([APP] * (THRESHOLD + 2), guard=guard) == " ".join("A" * (THRESHOLD + 2))
    assert guard.before_tool(*APP[:2], session="s").detected is not Action.ALLOW


def test_gemini_disabled_after_detection() -> None:
    """Gemini CLI 'should stop reporting a loop if disabled after detection'. DIFFER: there is no
    per-session off switch; what lifts a denial or stop is the next user message (a new epoch)."""
    assert drive([APP] * 4 + [USER, APP]) == "A A R D | A"


def test_gemini_strike_one_then_strike_two() -> None:
    """Gemini CLI 'should correctly transition from Strike 1 to Strike 2': after a detection and
    recovery the very next identical call is detected again. AGREE: the count is kept, so every
    further identical call is denied, and after stop_after_denials (3) denials the run stops."""
    assert drive([APP] * 7) == "A A R D D D S"
    assert DEFAULT.stop_after_denials == 3


def test_gemini_reset_on_new_prompt() -> None:
    """Gemini CLI: every test starts from service.reset(promptId), which the CLI calls for each new
    user prompt and which clears the tool-call counts. AGREE: a user message starts a new epoch;
    4 calls, a prompt, 4 calls are never blocked (without results, as Gemini sees them)."""
    steps = [APP_UNREPORTED] * 4 + [USER] + [APP_UNREPORTED] * 4
    assert drive(steps) == "A A R A | A A R A"
