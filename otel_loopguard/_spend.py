"""What a session spent on model calls (tokens by kind, the provider's and computed cost,
unpriced calls), what of it went into loops (in all, and in the loop now running), and what a
stop avoided (an estimate): the :class:`Spend` a session's state carries, in its plain data
too; :class:`Spent`, the figures a budget and a text read."""

from __future__ import annotations

from typing import Final, NamedTuple

from ._plain import read_count, read_list, read_number, read_optional_text, read_text
from ._prices import COMPUTED, PROVIDER, UNPRICED, Cost, ModelUsage

__all__ = ["MAX_ANCESTORS", "Spend", "Spent"]

#: Items of :meth:`Spend.to_plain`'s list; the 13 first are what the release before the current
#: loop was kept wrote (still read: its current loop is empty), the 19 first what the release
#: before sub-agents' spend was kept wrote (still read: no sub-agent spend).
_PLAIN_ITEMS: Final = 30
_OLD_PLAIN_ITEMS: Final = 13
_PRE_TREE_PLAIN_ITEMS: Final = 19
#: Ancestor agents a spend remembers (nearest first): as deep as a tree's total reaches.
MAX_ANCESTORS: Final = 8
_SOURCES: Final = (PROVIDER, COMPUTED, UNPRICED)


class Spent(NamedTuple):
    """What some model turns used: ``tokens`` (input and output), ``usd`` (the known cost: the
    priced turns'), ``turns``, ``unpriced`` (turns nobody knows the price of: their tokens are
    in ``tokens``, their cost in nothing) and ``computed`` (whether some of ``usd`` was
    computed at API prices rather than reported by the provider). A tuple: built on a hot
    path."""

    tokens: int = 0
    usd: float = 0.0
    turns: int = 0
    unpriced: int = 0
    computed: bool = False

    @property
    def priced(self) -> bool:
        """Whether some of the turns have a price (else ``usd`` is unknown, not zero)."""
        return self.turns > self.unpriced

    def plus(self, other: Spent) -> Spent:
        """Both together (``+`` would join the tuples)."""
        return Spent(
            self.tokens + other.tokens,
            self.usd + other.usd,
            self.turns + other.turns,
            self.unpriced + other.unpriced,
            self.computed or other.computed,
        )


class Spend:
    """Model-call totals of one session: ``calls``; ``input_tokens`` (cached ones included),
    ``output_tokens``, ``cache_read_tokens``, ``cache_write_tokens``; ``provider_usd`` (costs
    the provider reported) and ``computed_usd`` (computed at API prices); ``unpriced_calls``
    (calls whose cost nobody knows: their tokens are counted, their cost is not).

    In loops: a model turn comes before the calls it requests, so its tokens and known cost are
    held (``held``) until the first call after it is counted; when that call repeats an earlier
    one of the epoch (a repeat without progress: progress starts a new epoch), the turn was
    spent in a loop (``loop_turns``, ``loop_tokens``, ``loop_usd``). A turn followed by another
    turn before any call (a final answer, a turn of text) is not. ``refused_after_stop``: calls
    the guard refused because the run was stopped (the stopping call included), for
    :meth:`avoided`. ``held_source``: where the held turn's cost came from (provider, computed,
    unpriced).

    The loop now running (``current_*``, :meth:`current_loop`): its turns, tokens, known cost,
    turns without a price and turns whose cost was computed, from its first turn until
    progress starts a new epoch (:meth:`new_loop`) or the run is stopped (the turns after a
    stop are loop spend in all, not the stopped loop's).

    Sub-agents (a model call or a loop of an agent that runs under this one, in the same trace):
    ``below_*`` add up what every agent under this one spent (``below_turns``,
    ``below_tokens``, ``below_usd``, ``below_unpriced``) and spent in loops
    (``below_loop_tokens``, ``below_loop_usd``); ``apart_*`` the part of it spent by agents kept
    under another session (keyed by trace, each agent span is its own session), which a run
    budget adds to the session's own (:meth:`run`). :meth:`tree` and :meth:`tree_loop` are the
    totals with the sub-agents'. ``ancestors``: the agents this one runs under, nearest first
    (``(session, agent)`` pairs, at most :data:`MAX_ANCESTORS`), as its model calls' spans said;
    what this agent spends in loops is added to theirs."""

    __slots__ = (
        "ancestors",
        "apart_tokens",
        "apart_turns",
        "apart_unpriced",
        "apart_usd",
        "below_loop_tokens",
        "below_loop_usd",
        "below_tokens",
        "below_turns",
        "below_unpriced",
        "below_usd",
        "cache_read_tokens",
        "cache_write_tokens",
        "calls",
        "computed_usd",
        "current_computed",
        "current_tokens",
        "current_turns",
        "current_unpriced",
        "current_usd",
        "held",
        "held_source",
        "input_tokens",
        "loop_tokens",
        "loop_turns",
        "loop_usd",
        "output_tokens",
        "provider_usd",
        "refused_after_stop",
        "unpriced_calls",
    )

    def __init__(self) -> None:
        self.calls = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cache_read_tokens = 0
        self.cache_write_tokens = 0
        self.provider_usd = 0.0
        self.computed_usd = 0.0
        self.unpriced_calls = 0
        self.held: tuple[int, float] | None = None  # the last turn's (tokens, known usd)
        self.loop_turns = 0
        self.loop_tokens = 0
        self.loop_usd = 0.0
        self.refused_after_stop = 0
        self.held_source = UNPRICED
        self.current_turns = 0
        self.current_tokens = 0
        self.current_usd = 0.0
        self.current_unpriced = 0
        self.current_computed = 0
        self.ancestors: tuple[tuple[str, str | None], ...] = ()
        self.below_turns = self.below_tokens = self.below_unpriced = 0
        self.below_usd = 0.0
        self.below_loop_tokens = 0
        self.below_loop_usd = 0.0
        self.apart_turns = self.apart_tokens = self.apart_unpriced = 0
        self.apart_usd = 0.0

    @property
    def tokens(self) -> int:
        """Every token: input (cached ones included) and output."""
        return self.input_tokens + self.output_tokens

    @property
    def cost_usd(self) -> float:
        """The known cost: the provider's figures plus the computed ones (unpriced calls add
        nothing; see :attr:`unpriced_calls`)."""
        return self.provider_usd + self.computed_usd

    def add(self, usage: ModelUsage, cost: Cost) -> None:
        """Count one model call and its cost; hold it until its first tool call is counted."""
        self.calls += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cache_read_tokens += usage.cache_read_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        usd = 0.0
        source = UNPRICED
        if cost.usd is None:
            self.unpriced_calls += 1
        elif cost.source == PROVIDER:
            self.provider_usd += cost.usd
            usd, source = cost.usd, PROVIDER
        elif cost.source == COMPUTED:
            self.computed_usd += cost.usd
            usd, source = cost.usd, COMPUTED
        self.held = (usage.input_tokens + usage.output_tokens, usd)
        self.held_source = source

    def current_loop(self, repeated: bool = False, stopped: bool = False) -> Spent:
        """The loop now running; with ``repeated`` (and not ``stopped``), as it will be once
        the call being counted moves the held turn into it (what a budget is checked on)."""
        spent = Spent(
            self.current_tokens,
            self.current_usd,
            self.current_turns,
            self.current_unpriced,
            self.current_computed > 0,
        )
        held = self.held
        if held is None or not repeated or stopped:
            return spent
        source = self.held_source
        return spent.plus(Spent(held[0], held[1], 1, int(source == UNPRICED), source == COMPUTED))

    def run(self) -> Spent:
        """Every model turn of this session (or agent), and of its sub-agents kept under other
        sessions: what a run budget adds up over a session's agents."""
        return Spent(
            self.input_tokens + self.output_tokens + self.apart_tokens,
            self.cost_usd + self.apart_usd,
            self.calls + self.apart_turns,
            self.unpriced_calls + self.apart_unpriced,
            self.computed_usd > 0,
        )

    def tree(self) -> Spent:
        """Every model turn of this agent and of every agent under it (the tree's total)."""
        return Spent(
            self.input_tokens + self.output_tokens + self.below_tokens,
            self.cost_usd + self.below_usd,
            self.calls + self.below_turns,
            self.unpriced_calls + self.below_unpriced,
            self.computed_usd > 0,
        )

    def tree_loop(self) -> tuple[int, float]:
        """(tokens, known USD) spent in loops by this agent and every agent under it."""
        return self.loop_tokens + self.below_loop_tokens, self.loop_usd + self.below_loop_usd

    def add_below(self, tokens: int, usd: float | None, *, apart: bool) -> None:
        """A sub-agent's model turn: ``usd`` ``None`` when it has no price; ``apart`` when
        that sub-agent is kept under another session."""
        self.below_turns += 1
        self.below_tokens += tokens
        if usd is None:
            self.below_unpriced += 1
        else:
            self.below_usd += usd
        if apart:
            self.apart_turns += 1
            self.apart_tokens += tokens
            if usd is None:
                self.apart_unpriced += 1
            else:
                self.apart_usd += usd

    def add_below_loop(self, tokens: int, usd: float) -> None:
        """A sub-agent's turn was spent in a loop."""
        self.below_loop_tokens += tokens
        self.below_loop_usd += usd

    def call_counted(
        self, repeated: bool, refused_stopped: bool, *, stopped: bool = False
    ) -> tuple[int, float, int, float]:
        """A tool call was counted: the held turn (if any) was spent in a loop when the call
        ``repeated`` an earlier one of the epoch, and in the loop now running unless the run
        was already ``stopped``. ``refused_stopped``: refused because the run is stopped.

        Returns (tokens, USD) moved into loop spend, then (tokens, USD) the refused call
        avoided: the **estimate** of :meth:`avoided` for one call, the loop's mean per turn
        (zeros when nothing moved or nothing was refused)."""
        moved_tokens, moved_usd = 0, 0.0
        held = self.held
        if held is not None:
            self.held = None
            if repeated:
                moved_tokens, moved_usd = held
                self.loop_turns += 1
                self.loop_tokens += moved_tokens
                self.loop_usd += moved_usd
                if not stopped:
                    self.current_turns += 1
                    self.current_tokens += moved_tokens
                    self.current_usd += moved_usd
                    self.current_unpriced += int(self.held_source == UNPRICED)
                    self.current_computed += int(self.held_source == COMPUTED)
        if not refused_stopped:
            return moved_tokens, moved_usd, 0, 0.0
        self.refused_after_stop += 1
        if not self.loop_turns:
            return moved_tokens, moved_usd, 0, 0.0
        turns = self.loop_turns
        return moved_tokens, moved_usd, round(self.loop_tokens / turns), self.loop_usd / turns

    def new_loop(self) -> None:
        """Progress: the loop now running (if any) is over."""
        self.current_turns = self.current_tokens = 0
        self.current_unpriced = self.current_computed = 0
        self.current_usd = 0.0

    def avoided(self) -> tuple[int, float]:
        """An **estimate** of what the stop avoided, (tokens, USD): the loop's mean tokens and
        known cost per turn times the calls refused because the run was stopped (each refused
        call is taken for one more turn of the loop had the run gone on). (0, 0.0) without a
        stop or a loop."""
        if not self.loop_turns or not self.refused_after_stop:
            return 0, 0.0
        share = self.refused_after_stop / self.loop_turns
        return round(self.loop_tokens * share), self.loop_usd * share

    def copy(self) -> Spend:
        other = Spend()
        for name in Spend.__slots__:
            setattr(other, name, getattr(self, name))
        return other

    def to_plain(self) -> list[object]:
        return [
            self.calls,
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_write_tokens,
            self.provider_usd,
            self.computed_usd,
            self.unpriced_calls,
            None if self.held is None else list(self.held),
            self.loop_turns,
            self.loop_tokens,
            self.loop_usd,
            self.refused_after_stop,
            self.held_source,
            self.current_turns,
            self.current_tokens,
            self.current_usd,
            self.current_unpriced,
            self.current_computed,
            [[session, agent] for session, agent in self.ancestors],
            self.below_turns,
            self.below_tokens,
            self.below_usd,
            self.below_unpriced,
            self.below_loop_tokens,
            self.below_loop_usd,
            self.apart_turns,
            self.apart_tokens,
            self.apart_usd,
            self.apart_unpriced,
        ]

    @classmethod
    def from_plain(cls, raw: object) -> Spend:
        """The spend :meth:`to_plain` wrote, or the 13 items the release before the current
        loop was kept wrote (read with no loop running), or the 19 the release before
        sub-agents' spend was kept wrote (read with none); ``ValueError`` naming the bad
        field."""
        items = read_list(raw, "spend")
        if len(items) not in (_OLD_PLAIN_ITEMS, _PRE_TREE_PLAIN_ITEMS, _PLAIN_ITEMS):
            raise ValueError(f"session state: bad spend {raw!r}")
        spend = cls()
        spend.calls = read_count(items[0], "spend calls")
        spend.input_tokens = read_count(items[1], "spend input tokens")
        spend.output_tokens = read_count(items[2], "spend output tokens")
        spend.cache_read_tokens = read_count(items[3], "spend cache read tokens")
        spend.cache_write_tokens = read_count(items[4], "spend cache write tokens")
        spend.provider_usd = read_number(items[5], "spend provider usd")
        spend.computed_usd = read_number(items[6], "spend computed usd")
        spend.unpriced_calls = read_count(items[7], "spend unpriced calls")
        held = items[8]
        if held is not None:
            pair = read_list(held, "spend held turn")
            if len(pair) != 2:
                raise ValueError(f"session state: bad spend held turn {held!r}")
            spend.held = (read_count(pair[0], "spend held tokens"), read_number(pair[1], "usd"))
        spend.loop_turns = read_count(items[9], "spend loop turns")
        spend.loop_tokens = read_count(items[10], "spend loop tokens")
        spend.loop_usd = read_number(items[11], "spend loop usd")
        spend.refused_after_stop = read_count(items[12], "spend refused after stop")
        if len(items) == _OLD_PLAIN_ITEMS:
            if spend.held is not None and spend.held[1] > 0:
                spend.held_source = COMPUTED  # not written then: a cost, say at API prices
            return spend
        source = read_text(items[13], "spend held source")
        if source not in _SOURCES:
            raise ValueError(f"session state: bad spend held source {source!r}")
        spend.held_source = source
        spend.current_turns = read_count(items[14], "spend current loop turns")
        spend.current_tokens = read_count(items[15], "spend current loop tokens")
        spend.current_usd = read_number(items[16], "spend current loop usd")
        spend.current_unpriced = read_count(items[17], "spend current loop unpriced turns")
        spend.current_computed = read_count(items[18], "spend current loop computed turns")
        if len(items) == _PRE_TREE_PLAIN_ITEMS:
            return spend
        spend.ancestors = _read_ancestors(items[19])
        spend.below_turns = read_count(items[20], "spend sub-agent turns")
        spend.below_tokens = read_count(items[21], "spend sub-agent tokens")
        spend.below_usd = read_number(items[22], "spend sub-agent usd")
        spend.below_unpriced = read_count(items[23], "spend sub-agent unpriced turns")
        spend.below_loop_tokens = read_count(items[24], "spend sub-agent loop tokens")
        spend.below_loop_usd = read_number(items[25], "spend sub-agent loop usd")
        spend.apart_turns = read_count(items[26], "spend apart turns")
        spend.apart_tokens = read_count(items[27], "spend apart tokens")
        spend.apart_usd = read_number(items[28], "spend apart usd")
        spend.apart_unpriced = read_count(items[29], "spend apart unpriced turns")
        return spend


def _read_ancestors(raw: object) -> tuple[tuple[str, str | None], ...]:
    items = read_list(raw, "spend ancestors")
    if len(items) > MAX_ANCESTORS:
        raise ValueError(f"session state: bad spend ancestors {raw!r}")
    ancestors = []
    for item in items:
        pair = read_list(item, "spend ancestor")
        if len(pair) != 2:
            raise ValueError(f"session state: bad spend ancestor {item!r}")
        ancestors.append(
            (
                read_text(pair[0], "spend ancestor session"),
                read_optional_text(pair[1], "spend ancestor agent"),
            )
        )
    return tuple(ancestors)
