"""What the ladder decides and the steps it climbs (:class:`Action`, :class:`Phase`,
:class:`Decision`, :class:`Step`): the vocabulary of the ladder (:mod:`._policy`) and of its
texts (:mod:`._policy_texts`). Every name is importable from :mod:`._policy` too."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from ._memory import Recalled
from ._record import FrozenRecord, slot_setters
from ._rules import Overspent
from .config import Rule

__all__ = ["ALLOW", "ALLOW_STEP", "BLOCKING_ACTIONS", "Action", "Decision", "Phase", "Step"]


class Action(str, Enum):
    """What should happen to a tool call; values are the wire strings."""

    ALLOW = "allow"
    REMIND = "remind"
    DENY = "deny"
    RESCUE = "rescue"
    STOP = "stop"


class Phase(str, Enum):
    """When a decision was made; values are the wire strings (``replay --json``, the evaluator's
    protocol)."""

    #: Before the call ran: "may this call run?" (``before_tool``, a span's start).
    PRE = "pre"
    #: After the call ran, from its result: the run is stuck now (``after_tool``, a span's end).
    #: The call itself already ran; a stop ends the run before the next model turn.
    POST = "post"
    #: Before the call ran, from the model's request (a model span's requested calls, at its
    #: end): the same decision as ``pre``, made earlier; the tool's span or hook then reuses it.
    REQUEST = "request"


#: The actions that keep a call from running (the one declaration; hosts and guard use it).
BLOCKING_ACTIONS: Final = frozenset({Action.DENY, Action.RESCUE, Action.STOP})


@dataclass(frozen=True, slots=True, init=False, repr=False, eq=False)
class Decision(FrozenRecord):
    """The answer to "may this call run?".

    ``action`` is what the caller should do (already softened by the mode); ``detected`` is what
    the ladder reached before the mode was applied (equal in ``enforce`` mode). ``message`` is the
    text for the model (empty for allow). ``count`` is the attempts of the call that ``rule``'s
    evidence covers, this one and refused ones included: it grows by one with each repeat until
    the evidence is reset (a new result, a new epoch). ``threshold`` is the threshold of the
    step taken: the reminder's, the deny threshold that applied, the rescue's, the stop's
    (``stop_after_denials``, which counts denied attempts, for a stop after them); ``signature`` the
    12-hex display prefix of the args key; ``repeated`` whether the args key was already seen in
    this epoch. ``hash_prefix``, on blocking decisions only, is the loop-brake plugin's call
    hash: the first 12 hex characters of sha256(tool + newline + canonical arguments JSON).
    ``phase`` says whether the decision came before the call ran (``pre``) or after, from its
    result (``post``: a stop there ends the run at the next turn; the call ran).
    ``loop_tokens`` and ``loop_cost_usd``: what the loop now running has used, when model
    turns were reported (its tokens) and some of its turns have a price (its known cost, in
    US dollars: the provider's figures, else computed at API prices; never with the policy's
    ``cost_in = "tokens"``); ``None`` when unknown.
    """

    action: Action
    message: str = ""
    rule: Rule | None = None
    count: int = 0
    threshold: int = 0
    signature: str = ""
    tool: str = ""
    session: str = ""
    repeated: bool = False
    detected: Action = Action.ALLOW
    hash_prefix: str = ""
    phase: Phase = Phase.PRE
    loop_tokens: int | None = None
    loop_cost_usd: float | None = None

    def __init__(
        self,
        action: Action,
        message: str = "",
        rule: Rule | None = None,
        count: int = 0,
        threshold: int = 0,
        signature: str = "",
        tool: str = "",
        session: str = "",
        repeated: bool = False,
        detected: Action = Action.ALLOW,
        hash_prefix: str = "",
        phase: Phase = Phase.PRE,
        loop_tokens: int | None = None,
        loop_cost_usd: float | None = None,
    ) -> None:
        _D_ACTION(self, action)
        _D_MESSAGE(self, message)
        _D_RULE(self, rule)
        _D_COUNT(self, count)
        _D_THRESHOLD(self, threshold)
        _D_SIGNATURE(self, signature)
        _D_TOOL(self, tool)
        _D_SESSION(self, session)
        _D_REPEATED(self, repeated)
        _D_DETECTED(self, detected)
        _D_HASH_PREFIX(self, hash_prefix)
        _D_PHASE(self, phase)
        _D_LOOP_TOKENS(self, loop_tokens)
        _D_LOOP_COST_USD(self, loop_cost_usd)

    @property
    def blocks(self) -> bool:
        """True when the call must not run (deny, rescue, stop); after the call (``post``), that
        the run must end (a stop)."""
        return self.action in BLOCKING_ACTIONS


# (Bound once: see _record.slot_setters.)
(
    _D_ACTION,
    _D_MESSAGE,
    _D_RULE,
    _D_COUNT,
    _D_THRESHOLD,
    _D_SIGNATURE,
    _D_TOOL,
    _D_SESSION,
    _D_REPEATED,
    _D_DETECTED,
    _D_HASH_PREFIX,
    _D_PHASE,
    _D_LOOP_TOKENS,
    _D_LOOP_COST_USD,
) = slot_setters(Decision)

#: The decision for untracked calls and for every internal fallback.
ALLOW: Final = Decision(Action.ALLOW)


class Step(FrozenRecord):
    """Where the evidence stands on the ladder: the action and why."""

    __slots__ = (
        "action",
        "rule",
        "count",
        "threshold",
        "detailed",
        "polling",
        "denials",
        "failures",
        "refused",
        "deny_threshold",
        "over",
        "recalled",
    )

    action: Action
    rule: Rule | None
    count: int
    threshold: int
    #: Reminder flavour: gentle (first threshold), detailed (later), polling (spared by outcome).
    detailed: bool
    polling: bool
    #: Attempts already denied in the epoch before this one (set on blocking steps: a stop says
    #: how many were retried, a denial how many more the policy allows before it stops).
    #: ``failures``: for a stop concluded after the call ran, how many times the same call
    #: failed the same way.
    denials: int
    failures: int
    #: Refused attempts among ``count`` (earlier ones: never this attempt) that the rule's own
    #: count leaves out: no_progress compares results, and a refused attempt has none.
    refused: int
    #: On a rescue: the deny threshold that applied, which a rescue without advice shows as
    #: the denial it becomes.
    deny_threshold: int
    #: On a budget stop: the budget passed.
    over: Overspent | None
    #: On a reminder from memory (rule ``memory``): what earlier runs of the scope ended in.
    recalled: Recalled | None

    def __init__(
        self,
        action: Action,
        rule: Rule | None = None,
        count: int = 0,
        threshold: int = 0,
        detailed: bool = False,
        polling: bool = False,
        denials: int = 0,
        failures: int = 0,
        refused: int = 0,
        deny_threshold: int = 0,
        over: Overspent | None = None,
        recalled: Recalled | None = None,
    ) -> None:
        _S_ACTION(self, action)
        _S_RULE(self, rule)
        _S_COUNT(self, count)
        _S_THRESHOLD(self, threshold)
        _S_DETAILED(self, detailed)
        _S_POLLING(self, polling)
        _S_DENIALS(self, denials)
        _S_FAILURES(self, failures)
        _S_REFUSED(self, refused)
        _S_DENY_THRESHOLD(self, deny_threshold)
        _S_OVER(self, over)
        _S_RECALLED(self, recalled)


(
    _S_ACTION,
    _S_RULE,
    _S_COUNT,
    _S_THRESHOLD,
    _S_DETAILED,
    _S_POLLING,
    _S_DENIALS,
    _S_FAILURES,
    _S_REFUSED,
    _S_DENY_THRESHOLD,
    _S_OVER,
    _S_RECALLED,
) = slot_setters(Step)

#: The step of a call nothing repeats (the guard's common case skips :func:`climb` with it).
ALLOW_STEP: Final = Step(Action.ALLOW)
