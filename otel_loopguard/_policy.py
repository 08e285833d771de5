"""The policy ladder: from the rules' evidence to a :class:`Decision` with the text for the model.

Exceptions, in one place::

    LoopDetected (RuntimeError)     raised by guard.wrap(...) tools when a call is blocked
    AdvisorError (RuntimeError)     raised by an advisor that could not give advice; the guard
                                    catches it, refunds the budget and falls back to a denial
                                    (in otel_loopguard._advice)

Pure: the advisor that runs a process lives in :mod:`otel_loopguard._advice`. What a decision
is (:class:`Decision`, :class:`Step`, :class:`Action`) is :mod:`._decision`'s, the texts the
model reads are :mod:`._policy_texts`'; both are importable from here as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ._calls import SIGNATURE_CHARS
from ._decision import ALLOW, ALLOW_STEP, BLOCKING_ACTIONS, Action, Decision, Phase, Step
from ._memory import Recalled
from ._policy_texts import (
    arguments_preview,
    has_advice,
    intent_text,
    message_for,
    tokens_text,
    usd_text,
    with_advice,
    without_arguments,
)
from ._rules import Overspent, Trend, Verdict
from ._spend import Spent
from .config import CostUnit, Mode, Policy, Rule

__all__ = [
    "ALLOW",
    "ALLOW_STEP",
    "BLOCKING_ACTIONS",
    "Action",
    "Decision",
    "LoopDetected",
    "Phase",
    "Step",
    "arguments_preview",
    "climb",
    "conclude",
    "decide",
    "has_advice",
    "intent_text",
    "message_for",
    "remember",
    "settle_rescue",
    "soften",
    "tokens_text",
    "usd_text",
    "with_advice",
    "without_arguments",
]

#: Hex characters of the loop-brake plugin's call hash (:attr:`Decision.hash_prefix`).
_HASH_PREFIX_CHARS: Final = 12


class LoopDetected(RuntimeError):
    """A tool call was blocked by the guard.

    Carries ``code`` (the action's wire string: deny, rescue or stop), ``tool``, ``count``,
    ``threshold``, ``signature`` (12-hex prefix of the args key), ``hash_prefix`` (the
    loop-brake plugin's hash prefix) and ``session``, and ``message``, the text meant for the
    model without the line quoting the arguments: never the arguments, so it can be logged and
    reported safely.

    The loop-brake plugin's ``LoopBrakeError`` fields are here under their own names too, for
    code and logs ported from it: ``toolName``, ``maxRepeats`` (``threshold - 1``: the attempts
    allowed before the block), ``hashPrefix`` and ``sessionId``; :attr:`plugin_fields` gives
    them all as that error had them (``code`` ``"LOOP_BRAKE"``, ``plugin`` ``"dsh-loop-brake"``).
    """

    def __init__(self, decision: Decision) -> None:
        self.code = decision.action.value
        self.tool = decision.tool
        self.count = decision.count
        self.threshold = decision.threshold
        self.signature = decision.signature
        self.hash_prefix = decision.hash_prefix
        self.session = decision.session
        self.message = without_arguments(decision.message)
        rule = decision.rule.value if decision.rule else "none"
        super().__init__(
            f"loop detected ({self.code}): tool {self.tool!r} count {self.count}"
            f" threshold {self.threshold} rule {rule} signature {self.signature}"
            f" hash {self.hash_prefix or '-'} session {self.session!r}"
        )

    # The loop-brake plugin's names (LoopBrakeError), for ported code.

    @property
    def toolName(self) -> str:  # noqa: N802 - the plugin's name
        return self.tool

    @property
    def maxRepeats(self) -> int:  # noqa: N802
        return max(0, self.threshold - 1)

    @property
    def hashPrefix(self) -> str:  # noqa: N802
        return self.hash_prefix

    @property
    def sessionId(self) -> str:  # noqa: N802
        return self.session

    @property
    def plugin_fields(self) -> dict[str, object]:
        """The loop-brake plugin's error fields, under its names, as it would have logged them."""
        return {
            "code": "LOOP_BRAKE",
            "toolName": self.tool,
            "count": self.count,
            "maxRepeats": self.maxRepeats,
            "hashPrefix": self.hash_prefix,
            "sessionId": self.session,
            "plugin": "dsh-loop-brake",
        }


#: Enum members read once: on Python 3.11 a member read through its enum class goes
#: through the metaclass's ``__getattr__`` hook (several times a plain attribute).
_ACT_ALLOW: Final = Action.ALLOW
_ACT_DENY: Final = Action.DENY
_ACT_REMIND: Final = Action.REMIND
_ACT_RESCUE: Final = Action.RESCUE
_ACT_STOP: Final = Action.STOP
_MODE_ADVISE: Final = Mode.ADVISE
_MODE_OBSERVE: Final = Mode.OBSERVE
_PHASE_POST: Final = Phase.POST
_RULE_BUDGET: Final = Rule.BUDGET
_RULE_MEMORY: Final = Rule.MEMORY
_RULE_STALL: Final = Rule.STALL
_UNIT_USD: Final = CostUnit.USD


def remember(count: int, refused: int, recalled: Recalled) -> Step:
    """The reminder from memory (pure): a call repeated with the outcome an earlier run of the
    same scope was denied or stopped for, at its first repeat (``count`` attempts, ``refused``
    of them refused), its history in the text. Threshold 2: the first repeat."""
    return Step(_ACT_REMIND, _RULE_MEMORY, count, 2, refused=refused, recalled=recalled)


def climb(
    verdict: Verdict | None,
    stalled: Verdict | None,
    outcome_trend: Trend,
    *,
    denials: int,
    stopped: bool,
    policy: Policy,
    stuck: Verdict | None = None,
    stop_threshold: int = 0,
    over: Overspent | None = None,
) -> Step:
    """Place the evidence on the ladder (pure). ``verdict`` is the strongest signature rule's,
    ``stuck`` the no_progress rule's (same outcome), ``stalled`` the stall rule's;
    ``stop_threshold``: for a session already stopped, the threshold of that stop; ``over``:
    the budget rule's finding (:func:`~otel_loopguard._rules.budget`).

    The step's ``count`` is the attempts of the rule it names (:attr:`Verdict.attempts`: refused
    repeats included, so it grows with every repeat); its ``threshold`` is the threshold of the
    step taken: the reminder's, the deny threshold that applied, the rescue's, the stop's
    (``stop_after_denials`` for a stop after denied attempts: that one counts denials).

    1. A session already told to stop gives stop; so does a stall verdict, or with
       ``rescue_on_stall`` a rescue (a stop once ``stop_after_denials`` is reached).
    2. A call is blocked when the same outcome came back often enough (``stuck`` reaches
       ``no_progress_threshold``: the strongest evidence, so the earliest block), or from
       ``deny_threshold`` on when there is no sign of progress (same or unknown outcome); a call
       whose outcome keeps changing (polling) is spared until ``poll_limit``.
    3. A blocked call becomes stop once ``stop_after_denials`` attempts were already denied in the
       epoch, rescue from ``rescue_threshold`` on (and, with a ``rescue_threshold``, the last
       denial before a stop is a rescue too), else deny.
    4. Otherwise a reminder at each of ``remind_thresholds`` and, with
       ``remind_past_thresholds``, on every call past the last one (and on spared polls); gentle
       at the first threshold, detailed later.

    Before all of these, a budget passed (``over``) is a stop, whatever the count (``budget``
    rule; its count is the call's attempts as its strongest rule counts them, at least 1; its
    threshold 0: the budget is in the text).
    """
    if over is not None or stopped:
        return _stopped(verdict, stuck, over, denials, stop_threshold, policy)
    if stalled is not None:
        stop_after = policy.stop_after_denials
        stall_at = policy.stall_threshold
        if policy.rescue_on_stall and (stop_after is None or denials < stop_after):
            return Step(
                _ACT_RESCUE,
                _RULE_STALL,
                stalled.count,
                stall_at,
                denials=denials,
                deny_threshold=stall_at,
            )
        return Step(_ACT_STOP, _RULE_STALL, stalled.count, stall_at, denials=denials)
    if verdict is None:
        return ALLOW_STEP
    count = verdict.count
    allow = Step(_ACT_ALLOW, verdict.rule, verdict.attempts, refused=verdict.refused)
    deny = policy.deny_threshold
    stuck_limit = policy.no_progress_threshold
    polling = False
    block: Verdict | None = None
    threshold = 0
    if stuck is not None and stuck_limit is not None and stuck.count >= stuck_limit:
        block, threshold = stuck, stuck_limit
    elif deny is not None and count >= deny:
        spared = (
            outcome_trend is Trend.CHANGING
            and policy.poll_limit is not None
            and count < policy.poll_limit
        )
        if spared:
            polling = True
        else:
            block, threshold = verdict, deny
    if block is not None:
        stop_after = policy.stop_after_denials
        attempts, refused = block.attempts, block.refused
        if stop_after is not None and denials >= stop_after:
            return Step(
                _ACT_STOP, block.rule, attempts, stop_after, denials=denials, refused=refused
            )
        rescue = policy.rescue_threshold
        if rescue is not None and count >= rescue:
            return Step(
                _ACT_RESCUE,
                block.rule,
                attempts,
                rescue,
                denials=denials,
                refused=refused,
                deny_threshold=threshold,
            )
        if rescue is not None and stop_after is not None and denials + 1 >= stop_after:
            # The last refusal before the run ends: the advisor gets its one chance, also when
            # the stop comes before rescue_threshold (no_progress blocks from its 4th call).
            return Step(
                _ACT_RESCUE,
                block.rule,
                attempts,
                threshold,
                denials=denials,
                refused=refused,
                deny_threshold=threshold,
            )
        return Step(_ACT_DENY, block.rule, attempts, threshold, denials=denials, refused=refused)
    thresholds = policy.remind_thresholds
    if not thresholds and not polling:
        return allow
    past = count > thresholds[-1] if thresholds else False
    if polling or count in thresholds or (past and policy.remind_past_thresholds):
        detailed = polling or count > thresholds[0]
        reached = (
            deny if polling and deny else max((t for t in thresholds if t <= count), default=0)
        )
        return Step(
            _ACT_REMIND,
            verdict.rule,
            verdict.attempts,
            reached,
            detailed=detailed,
            polling=polling,
            refused=verdict.refused,
        )
    return allow


def _stopped(
    verdict: Verdict | None,
    stuck: Verdict | None,
    over: Overspent | None,
    denials: int,
    stop_threshold: int,
    policy: Policy,
) -> Step:
    """:func:`climb`'s stop for a budget passed (``over``) or a session already stopped: the
    call's attempts as its longest evidence counts them."""
    shown = verdict
    if stuck is not None and (shown is None or stuck.attempts > shown.attempts):
        shown = stuck  # its refused repeats make it the longer evidence
    if over is not None:
        return Step(
            _ACT_STOP,
            _RULE_BUDGET,
            shown.attempts if shown else 1,
            0,
            denials=denials,
            refused=shown.refused if shown else 0,
            over=over,
        )
    return Step(
        _ACT_STOP,
        shown.rule if shown else None,
        shown.attempts if shown else 1,
        stop_threshold or policy.stop_after_denials or 0,
        denials=denials,
        refused=shown.refused if shown else 0,
    )


def conclude(failures: Verdict | None, *, policy: Policy) -> Step | None:
    """After a call ran (pure): a stop when ``failures`` (:func:`~otel_loopguard._rules.
    no_progress_after_failures`) reached ``failure_stop_threshold``, else nothing.

    The same call failing the same way is stronger evidence than the same call succeeding: the
    result already shows the next try will fail too, so the run ends now rather than after more
    denied attempts (OpenHands stops at three identical errors).
    """
    limit = policy.failure_stop_threshold
    if failures is None or limit is None or failures.count < limit:
        return None
    return Step(_ACT_STOP, failures.rule, failures.count, limit, failures=failures.count)


def soften(action: Action, mode: Mode) -> Action:
    """What a detected ``action`` becomes in ``mode`` (pure): ``observe`` allows every call,
    ``advise`` turns a blocking action into a reminder, ``enforce`` keeps it."""
    if mode is _MODE_OBSERVE:
        return _ACT_ALLOW
    if mode is _MODE_ADVISE and action in BLOCKING_ACTIONS:
        return _ACT_REMIND
    return action


def settle_rescue(step: Step, advice: str | None, *, asking: bool = False) -> Step:
    """What ``step`` is once its rescue's ask is settled (pure): a rescue without ``advice`` is
    the denial it would have been (at its deny threshold), unless the ask is still ``asking``
    for a caller that did not wait (a span's start): then it stays a rescue, whose advice the
    host can still wait for. Any other step is returned as is."""
    if step.action is not _ACT_RESCUE or advice is not None or asking:
        return step
    return Step(
        _ACT_DENY,
        step.rule,
        step.count,
        step.deny_threshold or step.threshold,
        denials=step.denials,
        refused=step.refused,
    )


def decide(
    step: Step,
    *,
    tool: str,
    key: str,
    session: str,
    policy: Policy,
    canonical: bytes = b"",
    advice: str | None = None,
    repeated: bool = True,
    phase: Phase = Phase.PRE,
    spent: Spent | None = None,
    run: Spent | None = None,
) -> Decision:
    """The :class:`Decision` for ``step`` (pure): the step's action softened by the policy's
    mode (:func:`soften`), its text (:func:`message_for`), the args ``key``'s display prefix, and
    before a call (``pre``) that blocks the loop-brake plugin's ``hash_prefix``. An allow step
    of a call not ``repeated`` is :data:`ALLOW`; an allowed repeat carries its rule and count.
    A decision after the call ran (``post``) quotes no arguments and carries no hash. What the
    loop now running has used (``spent``, when model turns were reported) is its
    ``loop_tokens`` and ``loop_cost_usd``, and its text says it (and what the ``run`` has used,
    given under a run budget)."""
    loop_tokens = loop_cost_usd = None
    if spent is not None:
        loop_tokens, loop_cost_usd = _loop_fields(spent, policy)
    if step.action is _ACT_ALLOW:
        if not repeated:
            return ALLOW
        return Decision(
            _ACT_ALLOW,
            rule=step.rule,
            count=step.count,
            signature=key[:SIGNATURE_CHARS],
            tool=tool,
            session=session,
            repeated=True,
            phase=phase,
            loop_tokens=loop_tokens,
            loop_cost_usd=loop_cost_usd,
        )
    action = soften(step.action, policy.mode)
    message = (
        ""
        if action is _ACT_ALLOW
        else message_for(step, tool, canonical, policy, advice, action, spent=spent, run=run)
    )
    blocks = phase is not _PHASE_POST and action in BLOCKING_ACTIONS
    return Decision(  # (by position: this runs for every repeat)
        action,
        message,
        step.rule,
        step.count,
        step.threshold,
        key[:SIGNATURE_CHARS],
        tool,
        session,
        repeated,
        step.action,
        _hash_prefix(tool, canonical) if blocks else "",
        phase,
        loop_tokens,
        loop_cost_usd,
    )


def _loop_fields(spent: Spent, policy: Policy) -> tuple[int | None, float | None]:
    """(tokens, known USD) of the loop now running, each ``None`` when unknown: no turn
    reported, no turn priced, or a token-only policy's dollars."""
    if not spent.turns:
        return None, None
    usd = spent.usd if spent.priced and policy.cost_in is _UNIT_USD else None
    return spent.tokens, usd


class _Sha256:
    """hashlib's sha256, once the first block needed it (an import in the function costs a
    lookup on every block)."""

    function: Callable[[bytes], Any] | None = None


def _hash_prefix(tool: str, canonical: bytes) -> str:
    """The loop-brake plugin's call hash: the first hex of sha256(tool + newline + canonical
    JSON). Computed on blocking decisions only."""
    sha256 = _Sha256.function
    if sha256 is None:
        import hashlib  # here: imported on the first block, not by every hook process

        sha256 = _Sha256.function = hashlib.sha256
    digest = sha256(tool.encode("utf-8", "surrogatepass") + b"\n" + canonical)
    return digest.hexdigest()[:_HASH_PREFIX_CHARS]
