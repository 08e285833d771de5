"""Intent versus action (issue 27): the model says it will change approach, and repeats a call."""

from __future__ import annotations

import pytest

from otel_loopguard import Action, LoopGuard, Policy
from otel_loopguard._early import Early
from otel_loopguard._intent import (
    DEFAULT_INTENT_PHRASES,
    INTENT_LANGUAGES,
    IntentPhrases,
    says_new_approach,
)
from otel_loopguard._policy import ALLOW, Decision
from otel_loopguard._settings import policy_from_mapping

CHANGE = "Let me try a different approach: I will search again."
SEARCH = ("search", {"query": "weather in Paris"})


@pytest.mark.parametrize(
    "text",
    [
        "Let me try a different query.",
        "LET ME TRY ANOTHER search",
        "I\u2019ll try a different tool now.",
        "That failed.   Instead,\n I will look elsewhere.",
        "Maybe another approach works.",
        "Essayons autre chose.",
        "Ich werde es anders versuchen.",
        "Probemos otra búsqueda.",
    ],
)
def test_announcements_are_found(text: str) -> None:
    assert says_new_approach(text) is not None


@pytest.mark.parametrize(
    "text",
    ["", "Searching for the weather in Paris.", "The approach works.", "Let me search."],
)
def test_plain_text_is_not_an_announcement(text: str) -> None:
    assert says_new_approach(text) is None


def test_the_default_set_is_folded_and_says_its_languages() -> None:
    assert INTENT_LANGUAGES[0] == "en"
    for phrase in DEFAULT_INTENT_PHRASES:
        assert phrase == " ".join(phrase.lower().split()), phrase
        assert says_new_approach(f"Well, {phrase.upper()} now.") == phrase


def test_a_configured_set_replaces_the_default() -> None:
    phrases = IntentPhrases(["Plan B"])
    assert phrases.find("Switching to plan b.") == "plan b"
    assert phrases.find(CHANGE) is None
    assert IntentPhrases([]).find(CHANGE) is None


def test_the_policy_fields_are_validated_and_read() -> None:
    policy = policy_from_mapping({"intent_check": False, "intent_phrases": ["plan b"]})
    assert policy.intent_check is False and policy.intent_phrases == frozenset({"plan b"})
    with pytest.raises(ValueError, match="intent_check"):
        Policy(intent_check="sometimes")  # type: ignore[arg-type]


def request(guard: LoopGuard, n: int, text: str = "") -> Decision:
    (decision,) = guard.decide_requested(
        [(SEARCH[0], SEARCH[1], f"call_{n}")], session="s", text=text, at=1_796_049_780.0 + n
    )
    return decision


def test_a_repeat_announced_as_a_change_says_so_in_its_reminder() -> None:
    guard = LoopGuard(Policy())
    for n in range(2):
        request(guard, n)
    decision = request(guard, 2, CHANGE)
    assert decision.action is Action.REMIND
    assert "You said you would change approach" in decision.message
    assert "identical to an earlier one at 14:43 UTC" in decision.message


def test_after_a_failure_it_names_the_failure() -> None:
    guard = LoopGuard(Policy())
    for n in range(2):
        request(guard, n)
        ran = Early("search", guard.requested_key(*SEARCH), f"call_{n}", ALLOW)
        guard.requested_ran("s", None, ran, True, 1_796_049_800.0 + n)
    decision = request(guard, 2, CHANGE)
    assert "identical to the one that failed at 14:43 UTC" in decision.message


def test_without_an_announcement_or_with_the_switch_off_the_text_is_unchanged() -> None:
    texts = []
    for policy, text in ((Policy(), ""), (Policy(intent_check=False), CHANGE)):
        guard = LoopGuard(policy)
        for n in range(3):
            decision = request(guard, n, text)
        texts.append(decision.message)
    assert texts[0] == texts[1]
    assert "change approach" not in texts[0]


def test_a_first_call_announced_as_a_change_is_no_repeat() -> None:
    guard = LoopGuard(Policy())
    assert request(guard, 0, CHANGE).message == ""
