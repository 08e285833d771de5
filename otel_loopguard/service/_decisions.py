"""The decision API of ``serve`` (``POST /v1/decisions/before``, ``/after``, ``/user_message``,
``/new_run``, ``/model_call``), on the answer protocol of the command hooks
(:mod:`otel_loopguard.hooks._answers`).

Each request calls the guard's hook API on its connection's thread; the guard's lock is short,
so decisions do not wait for ingest. For command hooks on hosts that show the model text only
with a call's result, the reminders that wait for a result are kept here
(:class:`HeldReminders`), and the reminder for a call reported only after it ran is worded with
the same function as a hook's local backend: a hook answers as with its local store.

``/model_call`` reports one model turn's usage (``LoopGuard.model_call``): the fields of
:data:`MODEL_CALL_FIELDS`, checked as the hook API checks them (a bad one is a 400 naming it).

Knows nothing of HTTP: a request body parsed as JSON in, the answer as a JSON-ready dict out.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from otel_loopguard._attributes import Shape, decision_attributes
from otel_loopguard._calls import bounded_id
from otel_loopguard._exemplars import DROPPED, counting
from otel_loopguard._guard import LoopGuard
from otel_loopguard._lazy import LOGGER_NAME
from otel_loopguard._memory import MAX_SCOPE_CHARS, repository_scope
from otel_loopguard._policy import Action, Decision
from otel_loopguard._prices import ModelUsage
from otel_loopguard.config import MemoryScope, Policy
from otel_loopguard.hooks._answers import decide_after, decide_before

__all__ = [
    "DECISION_ENDPOINTS",
    "MAX_DECISION_BODY_BYTES",
    "MAX_DECISION_DEPTH",
    "MAX_HELD_REMINDERS",
    "MODEL_CALL_FIELDS",
    "DecisionAPI",
    "DecisionCall",
    "HeldReminders",
    "SharedReminders",
    "call_trace",
    "decision_json",
]

#: The endpoints under ``/v1/decisions/``.
DECISION_ENDPOINTS: Final = frozenset({"before", "after", "user_message", "new_run", "model_call"})
#: The usage fields of ``/model_call`` (all optional; token counts default to 0; a model with
#: no name or no price is counted unpriced): :class:`~otel_loopguard._prices.ModelUsage`'s, as
#: ``LoopGuard.model_call`` takes them.
MODEL_CALL_FIELDS: Final = (
    "model",
    "provider",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reported_cost_usd",
)
#: Largest decision request body.
MAX_DECISION_BODY_BYTES: Final = 1024 * 1024
#: Deepest nesting of a decision request body (objects and arrays; the body itself is level 1):
#: deeper is answered 400 before anything is applied, with or without ``--state-dir`` (whose
#: log must be able to write every call it applies). Arguments are compared to 64 levels
#: (:data:`otel_loopguard._calls.MAX_DEPTH`).
MAX_DECISION_DEPTH: Final = 128
#: Reminders held for the ``/after`` of their call (``"hold_reminder": true``); the oldest is
#: dropped beyond this.
MAX_HELD_REMINDERS: Final = 10_000

_Key = tuple[str, str | None, str]
_log = logging.getLogger(LOGGER_NAME)
_HEX: Final = re.compile(r"[0-9a-fA-F]+")


class HeldReminders:
    """Reminders decided before a call for a caller that can only show them with the call's
    result (a command hook of a host that takes no context before a call): kept under the
    session, agent and call (:func:`~otel_loopguard.hooks._answers.reminder_ref`) until the
    ``/after`` of that call takes them. The oldest is dropped beyond ``limit`` (a result that
    never came)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._texts: OrderedDict[_Key, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._texts)

    def hold(self, key: _Key, text: str) -> None:
        with self._lock:
            self._texts.pop(key, None)
            self._texts[key] = text  # newest last
            while len(self._texts) > self._limit:
                self._texts.popitem(last=False)

    def take(self, key: _Key) -> str | None:
        with self._lock:
            return self._texts.pop(key, None)

    def saved(self) -> OrderedDict[_Key, str]:
        """A copy of what is held, oldest first (``serve --state-dir`` snapshots)."""
        with self._lock:
            return OrderedDict(self._texts)

    def restore(self, texts: OrderedDict[_Key, str]) -> None:
        """Hold what :meth:`saved` gave (before any call)."""
        with self._lock:
            self._texts = OrderedDict(texts)
            while len(self._texts) > self._limit:
                self._texts.popitem(last=False)

    def of(self, session: str, agent: str | None) -> _CallerReminders:
        """The reminders of one session and agent, as the answer protocol keeps them
        (:class:`~otel_loopguard.hooks._answers.Reminders`)."""
        return _CallerReminders(self, session, agent)


class SharedReminders:
    """:class:`HeldReminders` kept in the guard's Redis store (``policy.store``), so that the
    ``/after`` of a call finds its reminder on whichever replica it reaches: one key per
    reminder, ``<store_prefix>{<session>}:held:[agent, ref]`` (the session's hash tag), expiring
    with the session (``session_ttl_seconds``). A Redis that fails loses the reminder (the
    call's result is then shown without it), logged once; never raised."""

    def __init__(self, policy: Policy) -> None:
        from otel_loopguard._redis_store import RedisSessions  # imports the Redis client

        self._sessions = RedisSessions(policy)
        self._failed = False

    def __len__(self) -> int:
        return 1  # some may be held: the caller looks

    def _key(self, key: _Key) -> str:
        session, agent, ref = key
        return self._sessions.key(session) + ":held:" + orjson.dumps([agent, ref]).decode()

    def hold(self, key: _Key, text: str) -> None:
        try:
            self._sessions.client.set(self._key(key), text.encode(), px=self._sessions.ttl_ms)
        except Exception as exc:
            self._failure("hold", exc)

    def take(self, key: _Key) -> str | None:
        try:
            value = self._sessions.client.getdel(self._key(key))
        except Exception as exc:
            self._failure("take", exc)
            return None
        return None if value is None else bytes(value).decode()

    def _failure(self, what: str, exc: Exception) -> None:
        if not self._failed:
            self._failed = True
            _log.warning(
                "serve: cannot %s a held reminder in %s (%s: %s); reminders may be lost while"
                " it fails",
                what,
                self._sessions.url,
                type(exc).__name__,
                exc,
            )

    def of(self, session: str, agent: str | None) -> _CallerReminders:
        return _CallerReminders(self, session, agent)

    def close(self) -> None:
        self._sessions.close()


class _CallerReminders:
    __slots__ = ("_agent", "_held", "_session")

    def __init__(
        self, held: HeldReminders | SharedReminders, session: str, agent: str | None
    ) -> None:
        self._held = held
        self._session = session
        self._agent = agent

    def __len__(self) -> int:  # any held at all (cheap): else no signature is computed
        return len(self._held)

    def hold(self, ref: str, text: str) -> None:
        self._held.hold((self._session, self._agent, ref), text)

    def take(self, ref: str) -> str | None:
        return self._held.take((self._session, self._agent, ref))


@dataclass(frozen=True, slots=True)
class DecisionCall:
    """One decision API call, its fields checked (:meth:`DecisionAPI.parse`): what
    :meth:`DecisionAPI.apply` applies."""

    endpoint: str
    session: str
    agent: str | None
    tool: str = ""
    arguments: object = None
    call_id: str | None = None
    hold: bool = False
    error: bool | None = False
    result: object = None
    duration: float | None = None
    text: str | None = None  # user_message: the user's text; new_run: the run's task
    #: (trace id, span id) of the caller's tool span (:func:`call_trace`), or None.
    trace: tuple[int, int] | None = None
    #: model_call: the turn's usage.
    usage: ModelUsage | None = None
    #: before/after: the caller's repository (its git root), for memory's scope.
    repository: str | None = None


class DecisionAPI:
    """The decision endpoints on ``guard``, with the reminders held for command hooks."""

    def __init__(self, guard: LoopGuard, max_held_reminders: int = MAX_HELD_REMINDERS) -> None:
        self.guard = guard
        self.held = HeldReminders(max_held_reminders)
        #: With a Redis store the reminders are held there, for every replica (:attr:`held`
        #: stays empty).
        self.shared = SharedReminders(guard.policy) if guard.policy.store is not None else None

    def _held(self, session: str, agent: str | None) -> _CallerReminders:
        return (self.shared if self.shared is not None else self.held).of(session, agent)

    def decide(
        self, endpoint: str, payload: object, traceparent: str | None = None
    ) -> dict[str, object]:
        """One decision API call; raises ``ValueError`` naming a bad field (nothing applied)."""
        return self.apply(self.parse(endpoint, payload, traceparent))

    def parse(self, endpoint: str, payload: object, traceparent: str | None = None) -> DecisionCall:
        """Check one call's fields without applying anything; ``ValueError`` naming a bad field,
        a body nested deeper than :data:`MAX_DECISION_DEPTH`, or an unknown endpoint. The
        call's trace comes from the body's ``trace_id`` and ``span_id``, else from the W3C
        ``traceparent`` header given (:func:`call_trace`)."""
        call = self._parse(endpoint, payload)
        trace = call_trace(payload, traceparent) if isinstance(payload, dict) else None
        return call if trace is None else replace(call, trace=trace)

    def _parse(self, endpoint: str, payload: object) -> DecisionCall:
        if endpoint not in DECISION_ENDPOINTS:
            raise ValueError(f"no such decision endpoint: {endpoint!r}")
        if not isinstance(payload, dict):
            raise ValueError("expected a JSON object")
        if _nested_deeper(payload, MAX_DECISION_DEPTH):
            raise ValueError(f"the body is nested more than {MAX_DECISION_DEPTH} levels deep")
        # Bounded here too: the reminders held for a caller are keyed by them.
        session = bounded_id(_text(payload, "session", required=True))
        agent = _text(payload, "agent")
        agent = None if agent is None else bounded_id(agent)
        if endpoint == "user_message":
            return DecisionCall(endpoint, session, agent, text=_prose(payload, "text"))
        if endpoint == "new_run":
            return DecisionCall(endpoint, session, agent, text=_prose(payload, "task"))
        if endpoint == "model_call":
            return DecisionCall(endpoint, session, agent, usage=_usage(payload))
        tool = _text(payload, "tool", required=True)
        arguments = payload.get("arguments", {})
        call_id = _text(payload, "call_id")
        repository = _text(payload, "repository")
        if repository is not None and len(repository) > MAX_SCOPE_CHARS:
            raise ValueError(f"'repository' must be at most {MAX_SCOPE_CHARS} characters")
        if endpoint == "before":
            hold = payload.get("hold_reminder", False)
            if not isinstance(hold, bool):
                raise ValueError(f"'hold_reminder' must be true or false, got {hold!r}")
            return DecisionCall(
                endpoint, session, agent, tool, arguments, call_id, hold=hold, repository=repository
            )
        error = payload.get("error", False)
        if error is not None and not isinstance(error, bool):
            raise ValueError(f"'error' must be true, false or null, got {error!r}")
        duration = payload.get("duration_seconds")
        if duration is not None and (
            isinstance(duration, bool)
            or not isinstance(duration, (int, float))
            or not 0 <= duration < float("inf")
        ):
            raise ValueError(f"'duration_seconds' must be a number >= 0, got {duration!r}")
        return DecisionCall(
            endpoint,
            session,
            agent,
            tool,
            arguments,
            call_id,
            error=error,
            result=payload.get("result"),
            duration=None if duration is None else float(duration),
            repository=repository,
        )

    def apply(self, call: DecisionCall) -> dict[str, object]:
        """Apply a call checked by :meth:`parse` to the guard; its answer. The metrics it
        counts carry its trace as their exemplar, when it has one."""
        if call.trace is None:
            return self._apply(call)
        with counting(*call.trace):
            return self._apply(call)

    def _apply(self, call: DecisionCall) -> dict[str, object]:
        guard = self.guard
        session, agent = call.session, call.agent
        if call.endpoint == "user_message":
            guard.user_message(session, agent=agent, text=call.text)
            return {}
        if call.endpoint == "new_run":
            guard.new_run(session, agent=agent, task=call.text)
            return {}
        if call.endpoint == "model_call":
            assert call.usage is not None
            cost = guard.model_call(call.usage, session=session, agent=agent)
            # None: not charged (the guard's store failed; logged and counted by the guard).
            return {
                "charged": cost is not None,
                "cost_usd": None if cost is None else cost.usd,
                "cost_source": None if cost is None else cost.source,
            }
        if call.repository is not None and guard.policy.memory_scope is MemoryScope.REPOSITORY:
            guard.set_scope(session, repository_scope(call.repository), agent=agent)
        if call.endpoint == "before":
            before = decide_before(
                guard,
                call.tool,
                call.arguments,
                session=session,
                agent=agent,
                call_id=call.call_id,
                held=self._held(session, agent) if call.hold else None,
            )
            return {"decision": decision_json(before)}
        decision, shown = decide_after(
            guard,
            call.tool,
            call.arguments,
            session=session,
            agent=agent,
            call_id=call.call_id,
            error=call.error,
            result=call.result,
            duration_seconds=call.duration,
            held=self._held(session, agent),
            policy=guard.policy,
        )
        # Counted before it ran: the reminder that waited for this result, if any, and the
        # guard's conclusion from the result (phase post: a stop), if any; counted only now: what
        # a hook shows for a call that already ran.
        answer: dict[str, object] = {
            "decision": None if decision is None else decision_json(decision)
        }
        if shown.action is Action.REMIND:
            answer["reminder"] = shown.message
        return answer


def call_trace(payload: Mapping[str, object], traceparent: str | None) -> tuple[int, int] | None:
    """The (trace id, span id) of a decision call: the body's ``trace_id`` (32 hex digits) and
    ``span_id`` (16), else a W3C ``traceparent`` header (``00-<trace id>-<span id>-<flags>``);
    ``None`` without them. Ids that are missing, all zero or malformed give ``None`` and are
    counted in :data:`otel_loopguard._exemplars.DROPPED`, never an error: the decision is
    the same with or without them."""
    trace_id, span_id = payload.get("trace_id"), payload.get("span_id")
    if trace_id is None and span_id is None:
        if not traceparent:
            return None
        parts = traceparent.strip().split("-")
        if len(parts) < 4 or parts[0] == "ff" or len(parts[0]) != 2:
            DROPPED.count += 1
            return None
        trace_id, span_id = parts[1], parts[2]
    ids = _hex(trace_id, 32), _hex(span_id, 16)
    if ids[0] is None or ids[1] is None:
        DROPPED.count += 1
        return None
    return ids[0], ids[1]


def _hex(value: object, digits: int) -> int | None:
    """A non-zero id written as exactly ``digits`` hex digits, else ``None``."""
    if not isinstance(value, str) or len(value) != digits or not _HEX.fullmatch(value):
        return None
    return int(value, 16) or None


def _nested_deeper(value: object, limit: int) -> bool:
    """Whether JSON data (dicts and lists) nests deeper than ``limit`` (the top is level 1);
    without recursion, so any depth the parser gave is looked at safely."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def decision_json(decision: Decision) -> dict[str, object]:
    """A decision as the decision API returns it; ``phase`` is ``post`` for a conclusion drawn
    from a call's result (``/after``), else ``pre``; ``hash_prefix`` is the loop-brake
    plugin's call hash prefix on a blocking decision, else empty."""
    return decision_attributes(decision, Shape.API)


def _text(payload: Mapping[str, object], name: str, required: bool = False) -> Any:
    value = payload.get(name)
    if value is None:
        if required:
            raise ValueError(f"missing field {name!r}")
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name!r} must be a non-empty string, got {value!r}")
    return value


def _usage(payload: Mapping[str, object]) -> ModelUsage:
    """The usage of a ``/model_call`` body; ``ValueError`` naming the bad field."""
    model = _text(payload, "model")
    provider = _text(payload, "provider")
    try:
        return ModelUsage.checked(
            model,
            provider,
            **{name: payload.get(name, 0) for name in MODEL_CALL_FIELDS[2:6]},
            reported_cost_usd=payload.get("reported_cost_usd"),
        )
    except ValueError as exc:
        name, _, problem = str(exc).partition(": ")
        raise ValueError(f"{name!r}: {problem}") from None


def _prose(payload: Mapping[str, object], name: str) -> str | None:
    """An optional text (the user's message, the run's task): a string, or absent / null."""
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{name!r} must be a string, got {type(value).__name__}")
    return value or None
