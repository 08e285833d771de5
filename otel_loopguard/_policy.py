"""The policy ladder: from the rules' evidence to a :class:`Decision` with the text for the model.

Exceptions, in one place::

    LoopDetected (RuntimeError)     raised by guard.wrap(...) tools when a call is blocked
    AdvisorError (RuntimeError)     raised by an advisor that could not give advice; the guard
                                    catches it, refunds the budget and falls back to a denial
                                    (in otel_loopguard._advice)

Pure: the advisor that runs a process lives in :mod:`otel_loopguard._advice`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from ._calls import SIGNATURE_CHARS
from ._memory import Recalled
from ._rules import LOOP, Overspent, Trend, Verdict
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
    "with_advice",
    "without_arguments",
]

_PREFIX: Final = "[loopguard] "
#: Starts the line of a message that quotes the call's arguments (always a line of its own:
#: canonical JSON holds no newline), so that :func:`without_arguments` can drop it.
_ARGUMENTS_LABEL: Final = "Arguments: "
_ADVICE_HEADING: Final = "\n\nAdvice from a reviewer model:\n"
#: Hex characters of the loop-brake plugin's call hash (:attr:`Decision.hash_prefix`).
_HASH_PREFIX_CHARS: Final = 12


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


@dataclass(frozen=True, slots=True)
class Decision:
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

    @property
    def blocks(self) -> bool:
        """True when the call must not run (deny, rescue, stop); after the call (``post``), that
        the run must end (a stop)."""
        return self.action in BLOCKING_ACTIONS


#: The decision for untracked calls and for every internal fallback.
ALLOW: Final = Decision(Action.ALLOW)


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


@dataclass(frozen=True, slots=True)
class Step:
    """Where the evidence stands on the ladder: the action and why."""

    action: Action
    rule: Rule | None = None
    count: int = 0
    threshold: int = 0
    #: Reminder flavour: gentle (first threshold), detailed (later), polling (spared by outcome).
    detailed: bool = False
    polling: bool = False
    #: Attempts already denied in the epoch before this one (set on blocking steps: a stop says
    #: how many were retried, a denial how many more the policy allows before it stops).
    #: ``failures``: for a stop concluded after the call ran, how many times the same call
    #: failed the same way.
    denials: int = 0
    failures: int = 0
    #: Refused attempts among ``count`` (earlier ones: never this attempt) that the rule's own
    #: count leaves out: no_progress compares results, and a refused attempt has none.
    refused: int = 0
    #: On a rescue: the deny threshold that applied, which a rescue without advice shows as
    #: the denial it becomes.
    deny_threshold: int = 0
    #: On a budget stop: the budget passed.
    over: Overspent | None = None
    #: On a reminder from memory (rule ``memory``): what earlier runs of the scope ended in.
    recalled: Recalled | None = None


def remember(count: int, refused: int, recalled: Recalled) -> Step:
    """The reminder from memory (pure): a call repeated with the outcome an earlier run of the
    same scope was denied or stopped for, at its first repeat (``count`` attempts, ``refused``
    of them refused), its history in the text. Threshold 2: the first repeat."""
    return Step(Action.REMIND, Rule.MEMORY, count, 2, refused=refused, recalled=recalled)


#: The step of a call nothing repeats (the guard's common case skips :func:`climb` with it).
ALLOW_STEP: Final = Step(Action.ALLOW)


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
                Action.RESCUE,
                Rule.STALL,
                stalled.count,
                stall_at,
                denials=denials,
                deny_threshold=stall_at,
            )
        return Step(Action.STOP, Rule.STALL, stalled.count, stall_at, denials=denials)
    if verdict is None:
        return ALLOW_STEP
    count = verdict.count
    allow = Step(Action.ALLOW, verdict.rule, verdict.attempts, refused=verdict.refused)
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
                Action.STOP, block.rule, attempts, stop_after, denials=denials, refused=refused
            )
        rescue = policy.rescue_threshold
        if rescue is not None and count >= rescue:
            return Step(
                Action.RESCUE,
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
                Action.RESCUE,
                block.rule,
                attempts,
                threshold,
                denials=denials,
                refused=refused,
                deny_threshold=threshold,
            )
        return Step(Action.DENY, block.rule, attempts, threshold, denials=denials, refused=refused)
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
            Action.REMIND,
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
            Action.STOP,
            Rule.BUDGET,
            shown.attempts if shown else 1,
            0,
            denials=denials,
            refused=shown.refused if shown else 0,
            over=over,
        )
    return Step(
        Action.STOP,
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
    return Step(Action.STOP, failures.rule, failures.count, limit, failures=failures.count)


def soften(action: Action, mode: Mode) -> Action:
    """What a detected ``action`` becomes in ``mode`` (pure): ``observe`` allows every call,
    ``advise`` turns a blocking action into a reminder, ``enforce`` keeps it."""
    if mode is Mode.OBSERVE:
        return Action.ALLOW
    if mode is Mode.ADVISE and action in BLOCKING_ACTIONS:
        return Action.REMIND
    return action


def settle_rescue(step: Step, advice: str | None, *, asking: bool = False) -> Step:
    """What ``step`` is once its rescue's ask is settled (pure): a rescue without ``advice`` is
    the denial it would have been (at its deny threshold), unless the ask is still ``asking``
    for a caller that did not wait (a span's start): then it stays a rescue, whose advice the
    host can still wait for. Any other step is returned as is."""
    if step.action is not Action.RESCUE or advice is not None or asking:
        return step
    return Step(
        Action.DENY,
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
    if step.action is Action.ALLOW:
        if not repeated:
            return ALLOW
        return Decision(
            Action.ALLOW,
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
        if action is Action.ALLOW
        else message_for(step, tool, canonical, policy, advice, action, spent=spent, run=run)
    )
    blocks = phase is not Phase.POST and action in BLOCKING_ACTIONS
    return Decision(
        action=action,
        message=message,
        rule=step.rule,
        count=step.count,
        threshold=step.threshold,
        signature=key[:SIGNATURE_CHARS],
        tool=tool,
        session=session,
        repeated=repeated,
        detected=step.action,
        hash_prefix=_hash_prefix(tool, canonical) if blocks else "",
        phase=phase,
        loop_tokens=loop_tokens,
        loop_cost_usd=loop_cost_usd,
    )


def _loop_fields(spent: Spent, policy: Policy) -> tuple[int | None, float | None]:
    """(tokens, known USD) of the loop now running, each ``None`` when unknown: no turn
    reported, no turn priced, or a token-only policy's dollars."""
    if not spent.turns:
        return None, None
    usd = spent.usd if spent.priced and policy.cost_in is CostUnit.USD else None
    return spent.tokens, usd


def _hash_prefix(tool: str, canonical: bytes) -> str:
    """The loop-brake plugin's call hash: the first hex of sha256(tool + newline + canonical
    JSON). Computed on blocking decisions only."""
    import hashlib  # here: imported on the first block, not by every hook process

    digest = hashlib.sha256(tool.encode("utf-8", "surrogatepass") + b"\n" + canonical)
    return digest.hexdigest()[:_HASH_PREFIX_CHARS]


def arguments_preview(canonical: bytes, limit: int) -> str:
    """The canonical arguments as text, cut to ``limit`` characters with ``… (+N more chars)``."""
    text = canonical.decode("utf-8", "replace")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit} more chars)"


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _scope(
    rule: Rule | None, count: int, policy: Policy, refused: int = 0, *, now: bool = True
) -> str:
    """How often, as the rule counts it: ``count`` attempts, ``now``: this one included;
    ``refused``: earlier attempts that were refused (no_progress only)."""
    times = _times(count)
    if rule is Rule.CONSECUTIVE:
        return f"{times} in a row"
    if rule is Rule.WINDOW:
        return f"{times} within your last {policy.window_size} tool calls"
    if rule is Rule.NO_PROGRESS:
        if refused:
            ran = count - refused - (1 if now else 0)
            return (
                f"{times}: it ran {_times(ran)} and returned the same result each time, and was"
                f" refused {_times(refused)}{' before this call' if now else ''}"
            )
        return f"{times}, and it returned the same result each time"
    return times


def _consequence(step: Step, policy: Policy) -> str:
    """What retrying will do, as the policy will really do it."""
    stop_after = policy.stop_after_denials
    if stop_after is None:
        if step.rule is Rule.STALL or not (
            Rule.STALL in policy.rules and not policy.rescue_on_stall
        ):
            return "retrying it unchanged will be refused again."
        return (
            "retrying it unchanged will be refused again, and repeating calls without"
            " progress will end the run."
        )
    left = stop_after - (step.denials + 1)  # refusals still allowed after this one
    if left <= 0:
        return "if another call is refused, the run will end."
    plural = "s" if left != 1 else ""
    return f"after {left} more refused call{plural}, the next one will end the run."


def tokens_text(tokens: float) -> str:
    """A token count as texts give it: exact up to 9,999, then ``35.2k``, ``1.2M``."""
    if tokens < 10_000:
        return f"{tokens:,.0f}"
    if tokens < 999_950:
        return f"{tokens / 1e3:.1f}".removesuffix(".0") + "k"
    return f"{tokens / 1e6:.1f}".removesuffix(".0") + "M"


def usd_text(usd: float) -> str:
    """US dollars as texts give them: ``$3.40``, ``$0.0092`` under a cent."""
    if usd >= 0.01 or usd == 0:
        return f"${usd:,.2f}"
    return f"${usd:.4f}" if usd >= 0.0001 else "under $0.0001"


def _spent_phrase(spent: Spent, policy: Policy, usd_limit: float | None) -> str:
    """What ``spent`` used, as texts say it: its tokens, and its known cost only when known
    (``about ... at API prices`` when some of it was computed; ``at least`` when some turns
    have no price, saying how many, and that a dollar budget ``usd_limit`` counts only the
    others). Tokens only for a token-only policy."""
    tokens = f"{tokens_text(spent.tokens)} tokens"
    if policy.cost_in is CostUnit.TOKENS:
        return tokens
    budget = ", so its dollar budget counts only the others" if usd_limit is not None else ""
    if not spent.priced:
        if usd_limit is None:
            return tokens
        return f"{tokens} (none of its model turns has a price: its dollar budget cannot count it)"
    usd = usd_text(spent.usd)
    at = " at API prices" if spent.computed else ""
    if spent.unpriced:
        return (
            f"{tokens}, at least {usd}{at} ({spent.unpriced} of its {spent.turns} model turns"
            f" {'has' if spent.unpriced == 1 else 'have'} no price{budget})"
        )
    return f"{tokens}, {'about ' if spent.computed else ''}{usd}{at}"


def _spent_sentence(spent: Spent | None, run: Spent | None, policy: Policy) -> str:
    """What the loop now running has used (and the run, under a run budget), as sentences
    to add to a text (with a leading space); empty when no model turn was reported, or the
    turns reported nothing (a scripted model's zero usage says nothing worth the model's
    reading)."""
    text = ""
    if spent is not None and spent.turns and (spent.tokens or spent.usd):
        text = f" This loop has used {_spent_phrase(spent, policy, policy.max_loop_cost_usd)}."
    if run is not None and run.turns and (run.tokens or run.usd):
        text += f" This run has used {_spent_phrase(run, policy, policy.max_run_cost_usd)}."
    return text


def _budget_text(over: Overspent, policy: Policy, *, stop: bool) -> str:
    """The text of a stop because ``over``'s budget was passed; not ``stop``: the reminder
    it becomes in advise mode."""
    spent, limit = over.spent, over.limit
    usd_limit = policy.max_loop_cost_usd if over.scope == LOOP else policy.max_run_cost_usd
    phrase = _spent_phrase(spent, policy, usd_limit)
    if over.usd:
        budget, by = usd_text(limit), usd_text(spent.usd - limit)
        close = usd_text(spent.usd) == budget
    else:
        extra = spent.tokens - limit
        budget = f"{tokens_text(limit)} tokens"
        by = f"{tokens_text(extra)} token{'' if extra == 1 else 's'}"
        close = tokens_text(spent.tokens) == tokens_text(limit)
    if close:  # just past it: say by how much, the figures read the same
        budget += f" (by {by})"
    if over.scope == LOOP:
        what, then = "this loop", "They can continue by sending a new message."
    else:
        what = "this run (every model call of the session, its agents' included)"
        then = "The run's budget is spent: they can continue by raising it, or in a new session."
    passed = f"{what} has used {phrase}, more than its budget of {budget}."
    if not stop:
        return (
            f"{_PREFIX}Over budget: {passed} Stop repeating calls: use what you already have,"
            " or tell the user what is blocking you."
        )
    return (
        f"{_PREFIX}Stopping: {passed} End this run now: tell the user what you tried, what you"
        f" found, and what is blocking you. {then}"
    )


def message_for(
    step: Step,
    tool: str,
    canonical: bytes,
    policy: Policy,
    advice: str | None = None,
    action: Action | None = None,
    *,
    spent: Spent | None = None,
    run: Spent | None = None,
) -> str:
    """The text shown to the model for ``step`` (``action`` overrides the step's action, e.g. a
    blocking step softened to a reminder in advise mode).

    Texts that quote the arguments do so on a line of their own, last before any advice (see
    :func:`without_arguments`). A denial says the run will end only when the policy will end
    it (``stop_after_denials``, the stall rule). What the loop now running has used
    (``spent``), and the run under a run budget (``run``), is said before the arguments line,
    only when model turns were reported."""
    shown = action or step.action
    if shown is Action.ALLOW:
        return ""
    cost = "" if spent is None and run is None else _spent_sentence(spent, run, policy)
    return _message(step, shown, tool, canonical, policy, advice, cost)


def _message(
    step: Step,
    shown: Action,
    tool: str,
    canonical: bytes,
    policy: Policy,
    advice: str | None,
    spent: str,
) -> str:
    """:func:`message_for` once the action shown is known (not allow)."""
    name = f"`{tool}`"
    scope = _scope(step.rule, step.count, policy, step.refused)
    over = step.over
    if over is not None:
        return _budget_text(over, policy, stop=shown is Action.STOP)
    if step.action is Action.STOP and shown is Action.STOP:
        return _stop_text(step, name, scope) + spent
    # No arguments line when they are not at hand (a conclusion drawn after the call ran).
    preview = arguments_preview(canonical, policy.arguments_preview_chars) if canonical else ""
    arguments = f"\n{_ARGUMENTS_LABEL}{preview}" if canonical else ""
    if shown in BLOCKING_ACTIONS:
        if step.rule is Rule.STALL:
            text = (
                f"{_PREFIX}Not run: {name} repeats an earlier call, and {step.count} of your tool"
                " calls since the last change repeated earlier calls, with no edit or new input"
                " in between, so the run is not making progress. Use what you already have,"
                " take a different approach, or tell the user what is blocking you; "
                + _consequence(step, policy)
            )
        else:
            earlier = _scope(step.rule, step.count - 1, policy, step.refused, now=False)
            text = (
                f"{_PREFIX}Not run: {name} with these arguments was already called {earlier}."
                " This call was refused so that you do not spend another call on an answer you"
                " already have. Use the earlier result, change the arguments, or take a different"
                " approach; " + _consequence(step, policy)
            )
        text += spent + arguments
        return with_advice(text, advice) if advice else text
    if step.recalled is not None:
        return _memory_text(name, step.recalled) + spent + arguments
    if step.polling:
        limit = policy.poll_limit
        return (
            f"{_PREFIX}{name} has now been called with the same arguments {step.count} times and"
            " its result changes each time, so this looks like polling. If you are waiting for"
            " something, wait longer between checks or tell the user what you are waiting for"
            + (f"; from call {limit} on it will be refused." if limit else ".")
            + spent
        )
    if not step.detailed and step.action is Action.REMIND:
        return (
            f"{_PREFIX}You have called {name} with the same arguments {scope}. Read the last"
            " result before calling it again; if it did not help, change the arguments or the"
            " approach." + spent
        )
    return (
        f"{_PREFIX}Repeated call: {name} with the same arguments, {scope}. Repeating it will not"
        " give a different answer. Next: use the last result, change the arguments, try a"
        " different tool, or tell the user what is blocking you." + spent + arguments
    )


def _memory_text(name: str, recalled: Recalled) -> str:
    """A reminder from memory: what earlier runs of the same scope ended in (pure)."""
    import time  # here: only a reminder from memory formats a date

    runs = recalled.runs
    earlier = "an earlier run" if runs == 1 else f"{runs} earlier runs"
    how = "failed the same way" if recalled.failed else "gave the same result"
    day = time.strftime("%Y-%m-%d", time.gmtime(recalled.last))
    those = "that run was" if runs == 1 else "those runs were"
    attempts = recalled.attempts
    return (
        f"{_PREFIX}{name} with these arguments {how} again. This exact call {how} in {earlier},"
        f" last on {day}, and {those} refused or stopped for repeating it ({attempts} attempt"
        f"{'' if attempts == 1 else 's'} the last time). Do not repeat it: change the arguments"
        " or the approach, or tell the user what is blocking you."
    )


def _stop_text(step: Step, name: str, scope: str) -> str:
    """The text of a stop on the rules' evidence."""
    if step.rule is Rule.STALL:
        return (
            f"{_PREFIX}Stopping: {step.count} of your tool calls since the last change repeated"
            " earlier calls, with no edit or new input in between, so the run is not making"
            " progress. End this run now: tell the user what you tried, what you found, and"
            " what is blocking you. They can continue by sending a new message."
        )
    if step.failures:
        return (
            f"{_PREFIX}Stopping: {name} with the same arguments failed the same way"
            f" {step.failures} times since the last change; another try will fail again."
            " End this run now: tell the user what you tried, the error you keep getting,"
            " and what is blocking you. They can continue by sending a new message."
        )
    if not step.denials:
        return (
            f"{_PREFIX}Stopping: this run was stopped since the last change because it"
            f" kept repeating a call that failed the same way (now {name})."
            " End this run now: tell the user what you tried, the error you keep getting,"
            " and what is blocking you. They can continue by sending a new message."
        )
    this_call = f" ({name} with the same arguments, {scope})" if step.rule else ""
    return (
        f"{_PREFIX}Stopping: calls were refused {step.denials} times since the last change"
        f" and retried anyway{this_call}. End this run now: tell the user what you tried,"
        " what you found, and what is blocking you. They can continue by sending a new"
        " message."
    )


def intent_text(at: str | None, failed: bool | None) -> str:
    """The sentence added to a reminder or refusal when the model's own text announced a change
    of approach while the call repeats an earlier one (:mod:`otel_loopguard._intent`): ``at``,
    the earlier call's time (``HH:MM`` UTC) when known; ``failed``, whether it failed."""
    which = "the one that failed" if failed else "an earlier one"
    when = f" at {at} UTC" if at else ""
    return (
        f"You said you would change approach, but this call is identical to {which}{when}."
        " Change the arguments or the tool, or say why the same call should now give"
        " something new."
    )


def with_advice(message: str, advice: str) -> str:
    """A denial's text with the advisor's ``advice`` after it (a rescue's text)."""
    return f"{message}{_ADVICE_HEADING}{advice}"


def has_advice(message: str) -> bool:
    """Whether a rescue's text already carries advice."""
    return _ADVICE_HEADING in message


def without_arguments(message: str) -> str:
    """``message`` without the line quoting the call's arguments (what :class:`LoopDetected`
    carries: an error that may be logged must not hold the arguments)."""
    head, heading, advice = message.partition(_ADVICE_HEADING)
    lines = [line for line in head.split("\n") if not line.startswith(_ARGUMENTS_LABEL)]
    return "\n".join(lines) + heading + advice
