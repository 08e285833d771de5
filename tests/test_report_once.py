"""Each call counts once when a framework hook and the call's span both report it: with or
without call ids, in either order, whether the hook passes the same argument objects or copies."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_loopguard import PRESETS, LoopGuard

SEARCH = ("search", {"query": "weather in Paris"})
WEATHER = ("get_weather", {"city": "Paris", "unit": "C"})


def _run(
    calls: list[tuple[str, dict[str, str]]],
    *,
    span_first: bool,
    with_ids: bool,
    same_objects: bool,
    span: bool = True,
) -> list[str]:
    """The guard's answers: the pre-call action of each call, then any post-call action."""
    guard = LoopGuard(PRESETS["default"])
    answers = []
    for number, (tool, arguments) in enumerate(calls):
        call_id = f"call_{number}" if with_ids else None
        decision = guard.before_tool(tool, arguments, session="s", call_id=call_id)
        answers.append(decision.action.value)
        if decision.blocks:
            continue  # the tool did not run: no span, no result
        hook_args = arguments if same_objects else dict(arguments)
        reports = [("hook", hook_args, call_id)]
        if span:
            # a span carries the id only where the instrumentation records it
            reports.append(("span", dict(arguments), call_id))
        if span_first:
            reports.reverse()
        for _source, args, rid in reports:
            post = guard.after_tool(tool, args, session="s", call_id=rid, result="same result")
            if post is not None and post.action.value != "allow":
                answers.append("post:" + post.action.value)
    return answers


LOOP = [SEARCH] * 6 + [WEATHER, SEARCH]


def test_the_fixture_loop_is_denied_and_the_other_tool_runs_in_every_reporting_shape() -> None:
    hook_only = _run(LOOP, span_first=False, with_ids=False, same_objects=False, span=False)
    assert hook_only == ["allow", "allow", "remind", "deny", "deny", "deny", "allow", "stop"]
    for span_first in (False, True):
        for with_ids in (False, True):
            for same_objects in (False, True):
                both = _run(
                    LOOP, span_first=span_first, with_ids=with_ids, same_objects=same_objects
                )
                assert both == hook_only, (span_first, with_ids, same_objects)


@settings(max_examples=150, deadline=None)
@given(
    calls=st.lists(st.sampled_from([SEARCH, WEATHER, ("read", {"path": "a.py"})]), max_size=25),
    span_first=st.booleans(),
    with_ids=st.booleans(),
    same_objects=st.booleans(),
)
def test_a_span_beside_the_hook_never_changes_an_answer(
    calls: list[tuple[str, dict[str, str]]], span_first: bool, with_ids: bool, same_objects: bool
) -> None:
    hook_only = _run(calls, span_first=False, with_ids=with_ids, same_objects=True, span=False)
    both = _run(calls, span_first=span_first, with_ids=with_ids, same_objects=same_objects)
    assert both == hook_only


def test_a_span_without_the_result_then_the_hook_with_it_adds_the_outcome_once() -> None:
    """AutoGen's tool span (call id, no arguments, no result) ends before its hook reports the
    result: the hook's report adds the outcome, so the same result ends in a denial at the
    no_progress count, and three identical failures stop the run after the third."""
    policy = PRESETS["default"]
    guard = LoopGuard(policy)
    actions = []
    for n in range(5):
        decision = guard.before_tool(*SEARCH, session="s", call_id=f"c{n}")
        actions.append(decision.action.value)
        if decision.blocks:
            continue
        assert guard.after_tool("search", {}, session="s", call_id=f"c{n}") is None  # the span
        post = guard.after_tool(*SEARCH, session="s", call_id=f"c{n}", result="nothing useful")
        assert post is None
    assert actions == ["allow", "allow", "remind", "deny", "deny"]

    guard = LoopGuard(policy)
    posts = []
    for n in range(3):
        guard.before_tool("build", {"target": "app"}, session="s", call_id=f"b{n}")
        guard.after_tool("build", {}, session="s", call_id=f"b{n}")  # the span: nothing known
        posts.append(
            guard.after_tool(
                "build", {"target": "app"}, session="s", call_id=f"b{n}", error=True, result="E1"
            )
        )
    assert [p.action.value if p else None for p in posts] == [None, None, "stop"]
    assert posts[-1] is not None and posts[-1].phase.value == "post"
