"""Decisions made from a model's request, before its tools run, kept until the calls come.

A model span ends before the tools it requested start. The guard decides each requested call
then (:meth:`~otel_loopguard._guard.LoopGuard.decide_requested`: counted once, pending under its
call id, as a hook's ``before_tool`` would count it) and keeps the decision here, so that what
later reports the same call reuses it instead of counting it again:

* the tool span's start (the span processor) *claims* it, so ``current_decision()`` inside the
  tool span returns it, and the span's end reports the call under the requested call id (the
  core then only adds its outcome);
* a framework hook's ``before_tool`` for the same call *uses* it: it gets the early decision, not
  a second count (once; a second ``before_tool`` of the same call is a new attempt).

A call is found by its call id, else by its tool and arguments (args key), else, for a tool span
that shows only its tool's name at its start, by the tool's name, oldest first. Each (session,
agent) keeps the calls of its latest response only: a new response replaces them (a requested
call that never ran is not kept, and was never counted as run: it stays an attempt without an
outcome). Bounded: :data:`MAX_EARLY_SESSIONS` sessions, least recently used dropped first, and
:data:`MAX_REQUESTED_CALLS` calls per response. Also kept, per session, when each recent call
was requested and whether it failed (for the intent sentence, :mod:`._intent`).

Threading: one short lock; every method may be called from any thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection
from typing import Final

from ._policy import Decision
from ._record import Record

__all__ = ["MAX_EARLY_SESSIONS", "MAX_REQUESTED_CALLS", "Early", "EarlyDecisions"]

#: Sessions (session, agent) whose latest requested calls are kept.
MAX_EARLY_SESSIONS: Final = 4096
#: Requested calls kept per response (a response asking for more keeps its first ones).
MAX_REQUESTED_CALLS: Final = 64
#: Recent calls per session remembered for the intent sentence (when, whether it failed).
MAX_RECENT_CALLS: Final = 64

_Session = tuple[str, str | None]


class Early(Record):
    """One requested call and its decision. ``key``: its args key (``""`` when the policy does
    not track the tool: its decision is allow and it is kept only to be matched). ``span``: the
    tool span that claimed it; ``used``: a hook's ``before_tool`` got it."""

    __slots__ = ("tool", "key", "call_id", "decision", "span", "used")

    tool: str
    key: str
    call_id: str | None
    decision: Decision
    span: int | None
    used: bool

    __eq__ = object.__eq__  # identity, as with ``eq=False``
    __hash__ = object.__hash__  # type: ignore[assignment]

    def __init__(
        self,
        tool: str,
        key: str,
        call_id: str | None,
        decision: Decision,
        span: int | None = None,
        used: bool = False,
    ) -> None:
        self.tool = tool
        self.key = key
        self.call_id = call_id
        self.decision = decision
        self.span = span
        self.used = used


class EarlyDecisions:
    """The ledger of early decisions (see the module docstring)."""

    def __init__(self, max_sessions: int = MAX_EARLY_SESSIONS) -> None:
        self._lock = threading.Lock()
        self._max = max_sessions
        self._calls: OrderedDict[_Session, list[Early]] = OrderedDict()
        self._recent: OrderedDict[_Session, OrderedDict[str, tuple[float, bool | None]]] = (
            OrderedDict()
        )
        #: Tool names with a kept call, with how many: the span processor's start gate reads it
        #: (a plain dict, read without the lock).
        self.tools: dict[str, int] = {}

    def __len__(self) -> int:
        return sum(len(calls) for calls in self._calls.values())

    # -- writing -----------------------------------------------------------------------------

    def put(self, session: str, agent: str | None, calls: list[Early]) -> None:
        """Keep ``calls``, one response's, for (``session``, ``agent``), replacing the last
        response's."""
        keys = (session, agent)
        with self._lock:
            old = self._calls.pop(keys, None)
            if old:
                self._untool(old)
            if calls:
                calls = calls[:MAX_REQUESTED_CALLS]
                self._calls[keys] = calls
                tools = self.tools
                for call in calls:
                    tools[call.tool] = tools.get(call.tool, 0) + 1
                while len(self._calls) > self._max:
                    _, dropped = self._calls.popitem(last=False)
                    self._untool(dropped)

    def _untool(self, calls: list[Early]) -> None:
        tools = self.tools
        for call in calls:
            left = tools.get(call.tool, 0) - 1
            if left > 0:
                tools[call.tool] = left
            else:
                tools.pop(call.tool, None)

    def remember(
        self, session: str, agent: str | None, key: str, at: float, failed: bool | None
    ) -> None:
        """When the call with args ``key`` was last requested or ran (``at``, seconds since the
        epoch), and whether it failed (``None``: unknown, e.g. not run yet)."""
        if not key:
            return
        keys = (session, agent)
        with self._lock:
            recent = self._recent.get(keys)
            if recent is None:
                recent = self._recent[keys] = OrderedDict()
                while len(self._recent) > self._max:
                    self._recent.popitem(last=False)
            else:
                self._recent.move_to_end(keys)
            earlier = recent.pop(key, None)
            if failed is None and earlier is not None and earlier[1]:
                failed = True  # a failure stays known until the call runs again
            recent[key] = (at, failed)
            while len(recent) > MAX_RECENT_CALLS:
                recent.popitem(last=False)

    def earlier(
        self, session: str, agent: str | None, key: str
    ) -> tuple[float, bool | None] | None:
        """When the call with args ``key`` was last requested or ran in this session, and
        whether it failed; ``None`` when not remembered."""
        with self._lock:
            recent = self._recent.get((session, agent))
            return recent.get(key) if recent is not None else None

    # -- reading -----------------------------------------------------------------------------

    def _find(
        self,
        calls: list[Early],
        tools: Collection[str] | None,
        call_id: str | None,
        key: str | None,
        unclaimed: bool,
    ) -> Early | None:
        """Under the lock: by call id; else by args key; else (no key) by tool name."""
        if call_id is not None:
            for call in calls:
                if call.call_id == call_id:
                    return call
        if key is not None:
            for call in calls:
                if call.key == key and (tools is None or call.tool in tools):
                    if not unclaimed or call.span is None:
                        return call
            return None
        if tools is None:
            return None
        for call in calls:
            if call.tool in tools and (not unclaimed or call.span is None):
                return call
        return None

    def claim(
        self,
        session: str,
        agent: str | None,
        tools: Collection[str] | None,
        call_id: str | None,
        key: str | None,
        span: int,
    ) -> Early | None:
        """A tool span started: the kept call it runs (by ``call_id``, else its args ``key``,
        else one of its possible tool names ``tools``), marked as claimed by ``span``; ``None``
        when none is kept. A call already claimed by another span is found by its call id only
        (a retry of the same call id), never by its name or arguments."""
        with self._lock:
            calls = self._calls.get((session, agent))
            if not calls:
                return None
            found = self._find(calls, tools, call_id, key, unclaimed=True)
            if found is not None:
                found.span = span
            return found

    def use(
        self, session: str, agent: str | None, tool: str, call_id: str | None, key: str | None
    ) -> Decision | None:
        """A hook's ``before_tool`` for a call: the kept decision of the same call, once (a
        second ``before_tool`` of it is a new attempt: ``None``, and the call is forgotten)."""
        with self._lock:
            calls = self._calls.get((session, agent))
            if not calls:
                return None
            found = self._find(calls, (tool,), call_id, key, unclaimed=False)
            if found is None:
                return None
            if found.used:
                calls.remove(found)
                self._untool([found])
                return None
            found.used = True
            return found.decision

    def drop(self, session: str, agent: str | None, call: Early) -> None:
        """The call's tool span ended: forget it."""
        with self._lock:
            calls = self._calls.get((session, agent))
            if calls and call in calls:
                calls.remove(call)
                self._untool([call])
                if not calls:
                    del self._calls[(session, agent)]

    def clear(self) -> None:
        with self._lock:
            self._calls.clear()
            self._recent.clear()
            self.tools.clear()
