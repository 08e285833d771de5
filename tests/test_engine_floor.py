"""The engine's cheap paths (issue 29 item 2) answer as the general ones, and the patterns a
command hook seldom needs are compiled on first use (item 4)."""

from __future__ import annotations

import json
import subprocess
import sys

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard._classifier import Classifier
from otel_loopguard._policy import Action


def test_calls_patterns_are_compiled_on_first_use() -> None:
    script = (
        "import json\n"
        "from otel_loopguard import _calls\n"
        "before = [_calls._Compiled.long_digits, _calls._Compiled.volatile]\n"
        "_calls.canonical_arguments('{\"a\": 1}')\n"
        "digits = _calls._Compiled.long_digits is not None\n"
        "text = _calls.failure_text('pid 42 at 2024-01-01T00:00:00Z')\n"
        "print(json.dumps([before == [None, None], digits,"
        " _calls._Compiled.volatile is not None, text]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == [True, True, True, "pid <n> at <time>"]


def test_classifier_compiles_command_patterns_only_for_a_command() -> None:
    policy = PRESETS["default"].replace(exclude_commands=(r"^sleep\b",))
    classifier = Classifier(policy)
    assert classifier.classify("read", {"path": "a"}) == (True, False)
    assert classifier.classify("write_file", {"path": "a"}) == (True, True)
    assert classifier._commands_compiled is False
    assert classifier.classify("bash", {"command": "sleep 5"}) == (False, False)
    assert classifier._commands_compiled is True
    assert classifier.classify("bash", {"command": "sed -i s/a/b/ f"}) == (True, True)
    assert classifier.classify("bash", {"command": "ls"}) == (True, False)


def test_classifier_plain_dict_and_mapping_answer_alike() -> None:
    """The plain-dict shortcut answers as the general path does for any other mapping."""
    from types import MappingProxyType

    classifier = Classifier(PRESETS["default"])
    cases = [
        ("str_replace_editor", {"command": "view", "path": "a"}),
        ("str_replace_editor", {"command": "create", "path": "a"}),
        ("edit_file", {"action": "read", "path": "a"}),
        ("edit_file", {"path": "a"}),
        ("grep", {"pattern": "x"}),
        ("runner", {"cmd": "git commit -m x"}),
        ("runner", {"script": "ls"}),
        ("bash", {"command": "rm -rf x"}),
        ("bash", {"cmd": "ls"}),
    ]
    for tool, arguments in cases:
        assert classifier.classify(tool, arguments) == classifier.classify(
            tool, MappingProxyType(arguments)
        ), (tool, arguments)


def test_ignored_fields_still_dropped_on_the_dict_shortcut() -> None:
    guard = LoopGuard(PRESETS["default"])
    actions = []
    for i in range(4):
        arguments = {"path": "src", "description": f"try {i}"}
        decision = guard.before_tool("grep", arguments, session="s")
        actions.append(decision.action)
        guard.after_tool("grep", arguments, session="s", result="same")
    assert actions == [Action.ALLOW, Action.ALLOW, Action.REMIND, Action.DENY]


def test_after_tool_of_the_same_objects_ends_the_pending_call_once() -> None:
    """after_tool reuses the key and store key of this thread's last before_tool: the span's
    echo of the same call (same arguments, no id) adds nothing."""
    guard = LoopGuard(PRESETS["default"])
    arguments = {"path": "a"}
    guard.before_tool("read", arguments, session="s", agent="x")
    assert guard.after_tool("read", arguments, session="s", agent="x", result="r") is None
    state = guard.export_session("s", agent="x")
    assert state is not None and state.pending is None
    assert guard.after_tool("read", dict(arguments), session="s", agent="x", result="r") is None
    assert state.signatures[next(iter(state.signatures))].count == 1


def test_unknown_outcome_between_failures_neither_counts_nor_clears() -> None:
    """A report without a result (outcome unknown) between identical failures neither counts
    as one nor clears them: the third real failure still stops (only a known outcome that is
    no failure skips the post-call conclusion)."""
    guard = LoopGuard(PRESETS["default"])
    post = []
    for error, result in ((True, "boom"), (True, "boom"), (None, None), (True, "boom")):
        guard.before_tool("run", {"x": 1}, session="s")
        post.append(guard.after_tool("run", {"x": 1}, session="s", error=error, result=result))
    assert post[:3] == [None, None, None]
    assert post[3] is not None and post[3].action is Action.STOP
