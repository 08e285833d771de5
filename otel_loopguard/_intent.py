"""Intent versus action: the model says it will change approach, and sends the same call.

A model response carries its text beside the tool calls it requests. When that text announces
a change ("Let me try a different approach", "Instead, I will ...") while a requested call is
identical to an earlier one, the announcement is not what the agent does: users report agents
that say so a dozen times in a row while sending identical arguments. The guard's reminder or
refusal for such a call then says so (:func:`otel_loopguard._policy.intent_text`).

The check is a plain, case-insensitive substring search over a small phrase set
(:data:`DEFAULT_INTENT_PHRASES`: English, with a few French, German and Spanish phrases), after
folding typographic apostrophes and runs of white space; the policy's ``intent_phrases``
replaces the set and ``intent_check`` turns it off. Pure: stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from ._defaults import DEFAULT_INTENT_PHRASES

__all__ = ["DEFAULT_INTENT_PHRASES", "INTENT_LANGUAGES", "IntentPhrases", "says_new_approach"]

#: The languages :data:`DEFAULT_INTENT_PHRASES` covers (English fully; the rest a few phrases).
INTENT_LANGUAGES: Final = ("en", "fr", "de", "es")

_APOSTROPHES: Final = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
_SPACES: Final = re.compile(r"\s+")
#: The text searched: the start of the response (an announcement comes first).
MAX_INTENT_TEXT_CHARS: Final = 4096


class IntentPhrases:
    """A phrase set compiled once, on its first search: one regular expression of the escaped
    phrases (a hook process builds a guard per tool call, and most calls carry no text)."""

    __slots__ = ("_folded", "_pattern")

    def __init__(self, phrases: Iterable[str]) -> None:
        folded = sorted({_fold(phrase) for phrase in phrases if phrase.strip()}, key=len)
        self._folded = tuple(reversed(folded))
        self._pattern: re.Pattern[str] | None = None

    def find(self, text: str) -> str | None:
        """The first phrase ``text`` contains (as folded), or ``None``."""
        if not text:
            return None
        pattern = self._pattern
        if pattern is None:
            if not self._folded:
                return None
            pattern = self._pattern = re.compile("|".join(map(re.escape, self._folded)))
        match = pattern.search(_fold(text[:MAX_INTENT_TEXT_CHARS]))
        return match.group(0) if match else None


def _fold(text: str) -> str:
    return _SPACES.sub(" ", text.translate(_APOSTROPHES).lower()).strip()


_DEFAULT: Final = IntentPhrases(DEFAULT_INTENT_PHRASES)


def says_new_approach(text: str, phrases: IntentPhrases | None = None) -> str | None:
    """The phrase of ``phrases`` (default: :data:`DEFAULT_INTENT_PHRASES`) that ``text``
    announces a change of approach with, or ``None``."""
    return (phrases or _DEFAULT).find(text)
