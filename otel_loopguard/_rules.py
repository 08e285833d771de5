"""The four detection rules of DESIGN §4, as pure functions over one session's history, and
the budget rule, a pure function of what the loop and the run have spent (:func:`budget`).

A rule reads the history of the current progress epoch and the args key of the attempt being
decided, and returns a :class:`Verdict` (which rule, how strong the evidence is) or ``None``. Rules
never log, count, raise, mutate or read global configuration: what they need is passed in.

Counts include the attempt being decided, so "count 3" means "this would be the third". A
refused attempt is an attempt too: the consecutive, window and stall counts include it; the
no_progress count compares results, which a refused attempt has none of, so its verdict carries
the refused attempts apart (:attr:`Verdict.refused`) and :attr:`Verdict.attempts` is the count
people see.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Final, Protocol

from ._record import FrozenRecord, slot_setters
from ._spend import Spent
from .config import Policy, Rule

__all__ = [
    "LOOP",
    "RUN",
    "History",
    "Overspent",
    "SignatureHistory",
    "Trend",
    "Verdict",
    "budget",
    "consecutive",
    "evaluate",
    "identical_failures",
    "no_progress",
    "no_progress_after_failures",
    "stall",
    "trend",
    "window",
]


class Trend(str, Enum):
    """What the known outcomes of one signature say about progress."""

    #: No outcome known yet (hook without an after call, span still open).
    UNKNOWN = "unknown"
    #: The last known outcome equals the one before it, or only one is known.
    SAME = "same"
    #: The last two known outcomes differ: something is changing (polling).
    CHANGING = "changing"


class Verdict(FrozenRecord):
    """A rule's finding: ``count`` attempts count as evidence under ``rule`` (what thresholds
    are compared with); ``refused``: attempts of the same evidence that were refused, so not in
    ``count`` (only no_progress has them: a refused attempt returned no result to compare)."""

    __slots__ = ("rule", "count", "refused")

    rule: Rule
    count: int
    refused: int

    def __init__(
        self,
        rule: Rule,
        count: int,
        refused: int = 0,
    ) -> None:
        _V_RULE(self, rule)
        _V_COUNT(self, count)
        _V_REFUSED(self, refused)

    @property
    def attempts(self) -> int:
        """The count shown to people: every attempt the evidence covers, refused ones included,
        this one too. It grows by one with each repeat (until the evidence is reset: a new
        result, a new epoch)."""
        return self.count + self.refused


_V_RULE, _V_COUNT, _V_REFUSED = slot_setters(Verdict)  # bound once (see _record)


class SignatureHistory(Protocol):
    """What the rules read about one signature in the current epoch."""

    @property
    def count(self) -> int: ...  # attempts so far (not including the one being decided)
    @property
    def last_outcome(self) -> str | None: ...  # None while no outcome is known
    @property
    def same_outcomes(self) -> int: ...  # finished calls in a row that gave last_outcome
    @property
    def changed(self) -> bool: ...  # last_outcome differs from the outcome before it
    @property
    def failed(self) -> bool: ...  # last_outcome was a failure
    @property
    def novel_seen(self) -> int: ...  # the history's ``novel`` at this signature's last attempt
    @property
    def looped(self) -> bool: ...  # once repeated with nothing new since its previous attempt
    @property
    def refused(self) -> int: ...  # attempts refused (never ran) since last_outcome first came


class History(Protocol):
    """What the rules read about one session's current epoch."""

    @property
    def window(self) -> Sequence[str]: ...  # args keys of the latest tracked calls, oldest first
    @property
    def last_key(self) -> str | None: ...
    @property
    def run_length(self) -> int: ...
    @property
    def redundant(self) -> int: ...  # calls this epoch whose args key had been seen before
    @property
    def novel(self) -> int: ...  # calls this epoch whose args key was new (exploration)
    def signature(self, key: str) -> SignatureHistory | None: ...


#: The rules' members, read once: on Python 3.11 a member read through its enum class goes
#: through the metaclass's ``__getattr__`` hook (several times a plain attribute).
_CONSECUTIVE: Final = Rule.CONSECUTIVE
_WINDOW: Final = Rule.WINDOW
_NO_PROGRESS: Final = Rule.NO_PROGRESS
_STALL: Final = Rule.STALL


def consecutive(history: History, key: str) -> Verdict | None:
    """The same args key N times in a row among tracked calls (the plain stuck call)."""
    if history.last_key != key:
        return None
    return Verdict(_CONSECUTIVE, history.run_length + 1)


def window(history: History, key: str, size: int) -> Verdict | None:
    """The same args key N times within the last ``size`` tracked calls of the epoch.

    1. Look at the latest ``size - 1`` tracked calls (the attempt itself is the ``size``-th).
    2. Count those with this args key; add one for the attempt.
    Catches periodic loops (A,B,A,B; grep,grep,read,grep,...) that break a consecutive run.
    """
    recent = history.window
    start = len(recent) - (size - 1)
    count = 1 + (recent.count(key) if start <= 0 else recent[start:].count(key))
    return Verdict(_WINDOW, count) if count > 1 else None


def no_progress(history: History, key: str) -> Verdict | None:
    """The same args key with the same outcome key N times in the epoch (a loop that learns
    nothing).

    1. Take the signature's latest known outcome.
    2. Count the attempts of this signature, latest first, that gave that same outcome without
       a different one in between (calls elsewhere in the session do not interrupt it).
    3. Add one for the attempt, which is expected to give it again.
    A poll whose result changes every time keeps this count at 2. The attempts refused since
    that result first came (they gave no result) are the verdict's ``refused``.
    """
    signature = history.signature(key)
    if signature is None or signature.last_outcome is None:
        return None
    return Verdict(_NO_PROGRESS, signature.same_outcomes + 1, signature.refused)


def no_progress_after_failures(history: History, key: str) -> Verdict | None:
    """After an attempt of ``key`` ran: a ``NO_PROGRESS`` verdict counting how many times in a
    row it failed the same way.

    The finished calls of this signature that gave its latest outcome, when that outcome is a
    failure (a failure whose text differs only in volatile parts is the same failure: see
    :func:`otel_loopguard._calls.outcome_key`). Read after the outcome is recorded, so the count
    includes the call that just ended. ``None`` when the latest outcome is not a failure.
    """
    signature = history.signature(key)
    if signature is None or signature.last_outcome is None or not signature.failed:
        return None
    return Verdict(_NO_PROGRESS, signature.same_outcomes)


#: The former name of :func:`no_progress_after_failures`, kept while its callers move (issue 22).
identical_failures: Final = no_progress_after_failures


def stall(history: History, key: str, threshold: int) -> Verdict | None:
    """S redundant calls (args key already seen this epoch) in one epoch, any signature."""
    seen = history.signature(key) is not None
    count = history.redundant + (1 if seen else 0)
    return Verdict(_STALL, count) if seen and count >= threshold else None


def trend(signature: SignatureHistory | None) -> Trend:
    """Classify the known outcomes of a signature (see :class:`Trend`)."""
    if signature is None or signature.last_outcome is None:
        return Trend.UNKNOWN
    return Trend.CHANGING if signature.changed else Trend.SAME


#: What a budget covers: the loop now running, or the whole run (the session and its agents).
LOOP: Final = "loop"
RUN: Final = "run"


class Overspent(FrozenRecord):
    """The budget rule's finding: ``scope`` (:data:`LOOP` or :data:`RUN`) has ``spent`` more
    than its ``limit``, in US dollars (``usd``) or in tokens."""

    __slots__ = ("scope", "usd", "limit", "spent")

    scope: str
    usd: bool
    limit: float
    spent: Spent

    def __init__(
        self,
        scope: str,
        usd: bool,
        limit: float,
        spent: Spent,
    ) -> None:
        object.__setattr__(self, "scope", scope)
        object.__setattr__(self, "usd", usd)
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "spent", spent)


def budget(loop: Spent | None, run: Spent | None, policy: Policy) -> Overspent | None:
    """The first budget passed (strictly more than it): the loop's dollars, then its tokens,
    then the run's dollars, then its tokens; ``None`` when none is (or none is set).

    A dollar budget compares the known cost (the priced turns'): turns without a price add
    nothing to it, so it is passed only when the priced ones alone passed it, and a token
    budget still counts every turn."""
    if loop is not None:
        found = _passed(LOOP, loop, policy.max_loop_cost_usd, policy.max_loop_tokens)
        if found is not None:
            return found
    if run is not None:
        return _passed(RUN, run, policy.max_run_cost_usd, policy.max_run_tokens)
    return None


def _passed(
    scope: str, spent: Spent, usd_limit: float | None, token_limit: int | None
) -> Overspent | None:
    if usd_limit is not None and spent.usd > usd_limit:
        return Overspent(scope, True, usd_limit, spent)
    if token_limit is not None and spent.tokens > token_limit:
        return Overspent(scope, False, token_limit, spent)
    return None


def evaluate(
    history: History, key: str, policy: Policy
) -> tuple[Verdict | None, Verdict | None, Verdict | None]:
    """Run the enabled rules; return (strongest signature verdict, no_progress verdict, stall
    verdict).

    A key not seen in this epoch has no evidence under any rule (the window and the last key
    only hold keys of this epoch, all remembered as signatures), so it returns at once.

    A re-read among exploration is no signature evidence either: when the call last succeeded
    (a known outcome, not a failure) and new calls were made before each of its repeats,
    including this one, the agent is learning, not looping (only the stall rule still counts
    it). A call once repeated with nothing new in between (a cycle, a run of the same call), or
    a call that keeps failing, is counted as usual.
    """
    signature = history.signature(key)
    if signature is None:
        return None, None, None
    rules = policy.rules
    if (
        signature.last_outcome is not None
        and not signature.failed
        and not signature.looped
        and history.novel > signature.novel_seen
    ):
        stalled = stall(history, key, policy.stall_threshold) if _STALL in rules else None
        return None, None, stalled
    # The rules below written out, the signature looked up once and a verdict built only for
    # the winner (this runs for every repeat): no_progress, consecutive, window, stall.
    stuck = None
    if _NO_PROGRESS in rules and signature.last_outcome is not None:
        stuck = Verdict(_NO_PROGRESS, signature.same_outcomes + 1, signature.refused)
    # The strongest: the highest count; on a tie the most specific explanation wins ("in a
    # row" says more than "with the same result", which says more than "recently").
    run = history.run_length + 1 if _CONSECUTIVE in rules and history.last_key == key else 0
    best = stuck if stuck is not None and stuck.count > run else None
    top = best.count if best is not None else run
    if _WINDOW in rules:
        size = policy.window_size
        recent = history.window
        start = len(recent) - (size - 1)
        count = 1 + (recent.count(key) if start <= 0 else recent[start:].count(key))
        if count > 1 and count > top:
            best = Verdict(_WINDOW, count)
    if best is None and run:
        best = Verdict(_CONSECUTIVE, run)
    stalled = None
    if _STALL in rules:
        count = history.redundant + 1  # the signature is seen
        if count >= policy.stall_threshold:
            stalled = Verdict(_STALL, count)
    return best, stuck, stalled
