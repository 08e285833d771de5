"""What a session spent on model calls (tokens by kind, the provider's and computed cost,
unpriced calls), what of it went into loops, and what a stop avoided (an estimate): the
:class:`Spend` a session's state carries, in its plain data too."""

from __future__ import annotations

from ._plain import read_count, read_list, read_number
from ._prices import COMPUTED, PROVIDER, Cost, ModelUsage

__all__ = ["Spend"]


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
    :meth:`avoided`."""

    __slots__ = (
        "cache_read_tokens",
        "cache_write_tokens",
        "calls",
        "computed_usd",
        "held",
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
        if cost.usd is None:
            self.unpriced_calls += 1
        elif cost.source == PROVIDER:
            self.provider_usd += cost.usd
            usd = cost.usd
        elif cost.source == COMPUTED:
            self.computed_usd += cost.usd
            usd = cost.usd
        self.held = (usage.input_tokens + usage.output_tokens, usd)

    def call_counted(self, repeated: bool, refused_stopped: bool) -> None:
        """A tool call was counted: the held turn (if any) was spent in a loop when the call
        ``repeated`` an earlier one of the epoch. ``refused_stopped``: refused because the run
        is stopped."""
        held = self.held
        if held is not None:
            self.held = None
            if repeated:
                self.loop_turns += 1
                self.loop_tokens += held[0]
                self.loop_usd += held[1]
        if refused_stopped:
            self.refused_after_stop += 1

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
        ]

    @classmethod
    def from_plain(cls, raw: object) -> Spend:
        """The spend :meth:`to_plain` wrote; ``ValueError`` naming the bad field."""
        items = read_list(raw, "spend")
        if len(items) != 13:
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
        return spend
