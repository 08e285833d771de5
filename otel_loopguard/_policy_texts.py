"""The texts of the ladder's decisions (pure): what the model reads on a reminder, a
denial, a rescue or a stop (:func:`message_for`), and the pieces other texts share (arguments
cut, tokens and dollars, the advice and intent lines). Every name is importable from
:mod:`._policy` too."""

from __future__ import annotations

from typing import Final

from ._decision import BLOCKING_ACTIONS, Action, Step
from ._memory import Recalled
from ._rules import LOOP, Overspent
from ._spend import Spent
from .config import CostUnit, Policy, Rule

__all__ = [
    "arguments_preview",
    "has_advice",
    "intent_text",
    "message_for",
    "tokens_text",
    "usd_text",
    "with_advice",
    "without_arguments",
]

_PREFIX: Final = "[loopguard] "
#: Starts the line of a message that quotes the call's arguments (always a line of its own:
#: canonical JSON holds no newline), so that :func:`without_arguments` can drop it.
_ARGUMENTS_LABEL: Final = "Arguments: "
_ADVICE_HEADING: Final = "\n\nAdvice from a reviewer model:\n"


#: Enum members read once: on Python 3.11 a member read through its enum class goes
#: through the metaclass's ``__getattr__`` hook (several times a plain attribute).
_ACT_ALLOW: Final = Action.ALLOW
_ACT_REMIND: Final = Action.REMIND
_ACT_STOP: Final = Action.STOP
_RULE_CONSECUTIVE: Final = Rule.CONSECUTIVE
_RULE_NO_PROGRESS: Final = Rule.NO_PROGRESS
_RULE_STALL: Final = Rule.STALL
_RULE_WINDOW: Final = Rule.WINDOW
_UNIT_TOKENS: Final = CostUnit.TOKENS


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
    if rule is _RULE_CONSECUTIVE:
        return f"{times} in a row"
    if rule is _RULE_WINDOW:
        return f"{times} within your last {policy.window_size} tool calls"
    if rule is _RULE_NO_PROGRESS:
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
        if step.rule is _RULE_STALL or not (
            _RULE_STALL in policy.rules and not policy.rescue_on_stall
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
    if policy.cost_in is _UNIT_TOKENS:
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
    if shown is _ACT_ALLOW:
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
        return _budget_text(over, policy, stop=shown is _ACT_STOP)
    if step.action is _ACT_STOP and shown is _ACT_STOP:
        return _stop_text(step, name, scope) + spent
    # No arguments line when they are not at hand (a conclusion drawn after the call ran).
    preview = arguments_preview(canonical, policy.arguments_preview_chars) if canonical else ""
    arguments = f"\n{_ARGUMENTS_LABEL}{preview}" if canonical else ""
    if shown in BLOCKING_ACTIONS:
        if step.rule is _RULE_STALL:
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
    if not step.detailed and step.action is _ACT_REMIND:
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
    if step.rule is _RULE_STALL:
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
