"""LoopGuard: one engine, one state per session, fed by the hook API (and later by spans).

Threading contract: every public method may be called from any application thread, concurrently.
State updates happen under one short lock; canonicalisation, hashing, message building, metrics
and advisor calls happen outside it. ``before_tool``/``after_tool``/``user_message``/``new_run``
never raise: an internal error is logged once per kind, counted, and answered with ``allow``.

The guard is the hook API; each session's bookkeeping is :mod:`otel_loopguard._core`'s, what a
step on the ladder becomes is :func:`otel_loopguard._policy.decide`'s, what a decision reports
is :mod:`otel_loopguard._reporter`'s, and the advisor's asks are :mod:`otel_loopguard._asks`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, cast, overload

from ._calls import args_key, canonical_arguments, canonical_json, tool_name
from ._core import GuardCore
from ._early import Early, EarlyDecisions
from ._engine import SessionState
from ._intent import IntentPhrases
from ._policy import ALLOW, Action, Decision, Phase, intent_text
from ._prices import Cost, ModelUsage
from ._session_store import SessionStore
from ._spend import MAX_ANCESTORS, Spend
from ._triplog import TripLog
from .config import Policy, policy_from_env
from .metrics import Recorder

if TYPE_CHECKING:
    from ._advice import Advisor
    from .metrics import MetricsServer

__all__ = ["LoopGuard"]

F = TypeVar("F", bound=Callable[..., Any])

#: A call a model requested: tool, arguments (``None``: the span left them out) and call id.
RequestedCall = tuple[str, object, "str | None"]

_USAGE_FIELDS: Final = frozenset(
    {
        "model",
        "provider",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "reported_cost_usd",
    }
)


def _usage_of(value: object) -> ModelUsage:
    """The usage a mapping of :class:`ModelUsage`'s fields gives; ``ValueError`` naming the
    bad field."""
    if not isinstance(value, Mapping):
        raise ValueError(f"usage: expected a ModelUsage or a mapping, got {type(value).__name__}")
    unknown = set(value) - _USAGE_FIELDS
    if unknown:
        raise ValueError(f"usage: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    fields = dict(value)
    return ModelUsage.checked(fields.pop("model", None), fields.pop("provider", None), **fields)


class LoopGuard:
    """Detects repeated tool calls and decides what to do about them.

    ``policy`` defaults to the ``default`` preset with ``LOOPGUARD_*`` environment overrides.
    ``advisor`` is asked for advice at rescue (default: ``policy.advisor_command`` if set, run
    as ``policy.advisor_input`` says). A guard with an advisor and a policy that can rescue
    keeps, per session, a bounded trail of recent calls (arguments and outputs cut) and the task
    text, so that its question can say what the agent was doing (see :mod:`._advice`).
    ``clock`` (seconds, monotonic) drives session TTL and advisor cooldown; tests inject one.
    ``recorder`` receives metrics (default: none; :meth:`serve_metrics` and the metrics apps
    install a :class:`~otel_loopguard.metrics.PrometheusRecorder`). A recorder with an
    ``observe_sessions`` method is given a reader of :attr:`session_count` for
    ``loopguard_sessions``, read at collection time, never on the hot path.
    ``store``: where sessions are kept, overriding ``policy.store``: ``None`` (this process's
    memory) or a Redis URL (``"redis://host:6379/0"``, ``rediss://`` for TLS), shared by every
    guard that uses it, so one session's calls may be decided in any process (see
    :mod:`otel_loopguard._redis_store`; needs ``otel-loopguard[redis]``). Raises
    ``ValueError`` for a bad URL or a missing client; a Redis that is down is not an error
    here: calls are then decided as ``policy.store_failure`` says.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        advisor: Advisor | None = None,
        clock: Callable[[], float] | None = None,
        recorder: Recorder | None = None,
        store: str | None = None,
    ) -> None:
        if policy is not None and not isinstance(policy, Policy):
            raise ValueError(f"policy: expected a Policy, got {type(policy).__name__}")
        policy = policy if policy is not None else policy_from_env()
        if store is not None:
            policy = policy.replace(store=store)
        self.policy: Final = policy
        if advisor is None and self.policy.advisor_command:
            from ._advice import CommandAdvisor  # imported only when the policy names one

            advisor = CommandAdvisor(
                self.policy.advisor_command,
                self.policy.advisor_timeout_seconds,
                input_mode=self.policy.advisor_input,
            )
        if advisor is not None and not callable(advisor):
            raise ValueError(f"advisor: expected a callable, got {type(advisor).__name__}")
        if self.policy.store is None:
            self._core = GuardCore(self.policy, advisor, clock, recorder)
        else:
            from ._redis_store import RedisCore  # imports the Redis client

            self._core = RedisCore(self.policy, advisor, clock, recorder)
        #: Decisions made from a model's request, until the calls come (:mod:`._early`).
        self.early: Final = EarlyDecisions()
        self._intent = (
            IntentPhrases(self.policy.intent_phrases) if self.policy.intent_check else None
        )

    @property
    def advisor(self) -> Advisor | None:
        """Asked for advice at rescue (``None``: a rescue is a denial); may be replaced."""
        return self._core.rescues.advisor

    @advisor.setter
    def advisor(self, advisor: Advisor | None) -> None:
        self._core.rescues.advisor = advisor

    @property
    def trip_log(self) -> TripLog | None:
        """The trip log decisions are written to (``policy.trip_log_path``), or ``None``."""
        return self._core.reporter.trip_log

    @property
    def _store(self) -> SessionStore:
        """The kept sessions (for tests that count them)."""
        return self._core.store

    @classmethod
    def from_plugin_config(
        cls,
        plugin: str,
        config: Mapping[str, object],
        *,
        advisor: Advisor | None = None,
        clock: Callable[[], float] | None = None,
        recorder: Recorder | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> LoopGuard:
        """A guard configured as one of the plugins this project replaces was, from that
        plugin's own configuration, as is: ``plugin`` is ``"reminder"``, ``"brake"`` or
        ``"rescue"`` (or the plugin's id or package name), ``config`` its ``config`` mapping
        (or its whole entry with ``id``/``name`` and ``config``). Keys the configuration leaves
        out take the plugin's defaults (``DSH_LOOP_BRAKE_MAX_REPEATS`` from ``environ``, default
        ``os.environ``, for the brake). ``LOOPGUARD_*`` variables do not apply. Raises
        ``ValueError`` naming the plugin's key and the value. See
        :mod:`otel_loopguard._plugins` for the mapping."""
        from ._plugins import read_plugin_config  # only migrating users need it

        policy = read_plugin_config(plugin, config, environ).policy()
        return cls(policy, advisor=advisor, clock=clock, recorder=recorder)

    # -- public hook API ---------------------------------------------------------------------

    def before_tool(
        self,
        tool: str,
        arguments: object,
        *,
        session: str,
        agent: str | None = None,
        call_id: str | None = None,
    ) -> Decision:
        """Decide whether a tool call may run; counts the attempt (a denied attempt counts too).

        Called on the thread about to run the tool. Blocks only at rescue, for at most the
        policy's ``advisor_timeout_seconds`` while the advisor is asked. Never raises.

        A call decided already from the model's request (:meth:`decide_requested`: the same
        ``call_id``, else the same tool and arguments) is not counted again: its decision is
        returned (once; a second ``before_tool`` of it is a new attempt).
        """
        try:
            early = self.early
            if early.tools and type(tool) is str and tool in early.tools:
                decision = self._early_decision(tool, arguments, session, agent, call_id)
                if decision is not None:
                    return decision
            return self._core.attempt(
                tool, arguments, session, agent, call_id, wait_for_advice=True
            )
        except Exception as exc:  # the hot path never raises (STYLE.md, error zone 3)
            self._core.report_internal_error("before_tool", exc)
            return ALLOW

    def after_tool(
        self,
        tool: str,
        arguments: object,
        *,
        session: str,
        agent: str | None = None,
        call_id: str | None = None,
        error: bool | None = False,
        result: object = None,
        duration_seconds: float | None = None,
    ) -> Decision | None:
        """Report how a call ended; return what the guard concludes after it.

        When ``before_tool`` already counted this call (matched by ``call_id``, else by session
        and arguments), only its outcome is added, and the return is ``None`` unless the result
        shows the run is stuck now: then a :class:`Decision` with ``phase`` ``post`` (today a
        stop, after ``failure_stop_threshold`` identical failures of this call in the epoch).
        The call already ran; the host shows the message with the result or ends the run before
        the next model turn. Otherwise the call is counted now and its decision returned (what
        the guard would have said before it ran), or the post-call conclusion when there is one.
        A mutating call that succeeded starts a new progress epoch unless it repeats the
        mutation this epoch started with; a call the guard blocked never does. ``error=None``
        means unknown (treated as not failed). Never raises.
        """
        try:
            return self._core.finish(
                tool, arguments, session, agent, call_id, error, result, duration_seconds
            )
        except Exception as exc:
            self._core.report_internal_error("after_tool", exc)
            return None

    def decide_at_span_start(
        self, tool: object, arguments: object, session: str, agent: str | None, call_id: str | None
    ) -> Decision:
        """The seam for span entrances (the span processor, the trace reader of ``replay`` and
        ``serve``): ``before_tool`` for a call whose arguments a span carries at its start.

        Counts the attempt exactly as ``before_tool`` does, but never waits for the advisor (a
        rescue asked here is settled in the background and cached). Called on the thread that
        starts the span; never raises (an internal error is reported and answered with allow).
        """
        try:
            return self._core.attempt(
                tool, arguments, session, agent, call_id, wait_for_advice=False
            )
        except Exception as exc:
            self._core.report_internal_error("span_start", exc)
            return ALLOW

    def decide_requested(
        self,
        calls: Sequence[RequestedCall],
        *,
        session: str,
        agent: str | None = None,
        text: str = "",
        at: float | None = None,
    ) -> list[Decision]:
        """The seam for a model's response (the span processor, at a model span's end): decide
        each call it requests (``calls``: tool, arguments, call id) before the tool runs, with
        the same keys, rules and ladder as :meth:`before_tool`, counted once and never waiting
        for the advisor. Each decision (``phase`` ``request`` when not a plain allow) is kept
        (:attr:`early`) until the call comes: its tool span's start claims it (so
        ``current_decision()`` returns it), a hook's :meth:`before_tool` gets it without a
        second count, and the report when it ran only adds the outcome. A call the response
        requests but that never runs stays an attempt without an outcome. A call without
        arguments (``None``) is not decided (allow), only kept to be matched.

        ``text``: what the model said in the same response. When it announces a change of
        approach (the policy's ``intent_phrases``, unless ``intent_check`` is off) and a call
        repeats an earlier one, that call's reminder or refusal says so. ``at``: when the
        response ended (seconds since the epoch; default now). Never raises."""
        try:
            return self._decide_requested(calls, session, agent, text, at)
        except Exception as exc:
            self._core.report_internal_error("requested", exc)
            return []

    def _decide_requested(
        self,
        calls: Sequence[RequestedCall],
        session: str,
        agent: str | None,
        text: str,
        at: float | None,
    ) -> list[Decision]:
        when = time.time() if at is None else at
        intent = self._intent
        announced = intent is not None and bool(text) and intent.find(text) is not None
        kept: list[Early] = []
        decisions: list[Decision] = []
        early = self.early
        for tool, arguments, call_id in calls:
            name = tool_name(tool)
            if arguments is None:
                kept.append(Early(name, "", call_id, ALLOW))
                decisions.append(ALLOW)
                continue
            key = self.requested_key(name, arguments)
            earlier = early.earlier(session, agent, key) if announced else None
            decision = self._core.attempt(
                name, arguments, session, agent, call_id, wait_for_advice=False
            )
            if decision is not ALLOW:
                message = decision.message
                if announced and decision.repeated and message:
                    at_text = time.strftime("%H:%M", time.gmtime(earlier[0])) if earlier else None
                    failed = earlier[1] if earlier else None
                    message = f"{message}\n{intent_text(at_text, failed)}"
                decision = replace(decision, phase=Phase.REQUEST, message=message)
            early.remember(session, agent, key, when, None)
            kept.append(Early(name, key, call_id, decision))
            decisions.append(decision)
        early.put(session, agent, kept)
        return decisions

    def requested_key(self, name: str, arguments: object) -> str:
        """The args key the guard gives a call of ``name`` with ``arguments``: the seam for the
        span processor, which matches a tool span to a requested call by it."""
        value = canonical_arguments(arguments, self.policy.ignored_args)
        return args_key(name, canonical_json(value))

    def _early_decision(
        self, tool: str, arguments: object, session: str, agent: str | None, call_id: str | None
    ) -> Decision | None:
        """The early decision a hook's ``before_tool`` reuses, if the call was requested."""
        key = self.requested_key(tool, arguments)
        decision = self.early.use(session, agent, tool, call_id, key)
        if decision is not None and decision.action is Action.RESCUE:
            # Decided without waiting for the advisor: wait here, as before_tool would have.
            decision = self._core.await_advice(decision, agent)
        return decision

    def requested_ran(
        self, session: str, agent: str | None, call: Early, failed: bool | None, at: float
    ) -> None:
        """The seam for the span processor: a requested call's tool span ended (it ran, and
        ``failed`` or not); forget the kept decision, remember the outcome for the intent
        sentence. Never raises."""
        try:
            self.early.drop(session, agent, call)
            self.early.remember(session, agent, call.key, at, failed)
        except Exception as exc:
            self._core.report_internal_error("requested", exc)

    def await_advice(self, decision: Decision, *, agent: str | None = None) -> Decision:
        """For a rescue decided without waiting for the advisor (:meth:`decide_at_span_start`,
        which the span processor calls): wait for the advice asked for it, at most the policy's
        ``advisor_timeout_seconds``, and return the decision with it, as :meth:`before_tool`
        would have answered. For the adapters that enforce a decision the processor made at
        the tool span's start. Any other decision, or a rescue whose ask failed or is not known
        here (``agent`` as given to the call), is returned as is. Never raises."""
        return self._core.await_advice(decision, agent)

    def user_message(
        self, session: str, *, agent: str | None = None, text: str | None = None
    ) -> None:
        """A real user message arrived: start a new progress epoch and lift a stop, for
        ``agent`` when one is named, else for the session and every agent in it (each
        ``(session, agent)`` the guard keeps from calls made with ``agent=``).

        ``text``, the message, is what an advisor is told the agent's task is (the session's
        first message; a later one as the latest message), cut to
        :data:`~otel_loopguard._engine.MAX_TASK_CHARS`. Kept only by a guard that can ask an
        advisor. Never raises."""
        self._core.reset(session, agent, "user_message", text, task=False)

    def new_run(self, session: str, *, agent: str | None = None, task: str | None = None) -> None:
        """A new agent run started in this session: start a new progress epoch and lift a stop,
        for ``agent`` when one is named, else for the session and every agent in it (as
        :meth:`user_message`).

        ``task``, the run's prompt, becomes what an advisor is told the task is (as
        :meth:`user_message`'s ``text``). Never raises."""
        self._core.reset(session, agent, "new_run", task, task=True)

    def set_task(self, session: str, task: str, *, agent: str | None = None) -> None:
        """Tell the guard what the session's task is (what an advisor is told, as
        :meth:`new_run`'s ``task``) without starting a new progress epoch: for hosts that learn
        the run's prompt only once its calls have begun. Kept only by a guard that can ask an
        advisor. Never raises."""
        self._core.set_task(session, task, agent)

    def set_scope(self, session: str, scope: str, *, agent: str | None = None) -> None:
        """The memory scope of the session's run (``repository:<git root>``, ``agent:<name>``
        or ``global``; see the policy's ``memory_scope``), when the entrance knows it better
        than this process (the decision API is told the caller's repository): its dead ends are
        recorded and recalled there. Kept with the session; a session that has a scope keeps
        it. Nothing without memory. Never raises."""
        self._core.set_scope(session, scope, agent)

    def model_call(
        self,
        usage: ModelUsage | Mapping[str, object],
        *,
        session: str,
        agent: str | None = None,
        ancestors: Sequence[tuple[str, str | None]] = (),
    ) -> Cost | None:
        """Report one model call's usage (a turn of the agent), under the same ``session`` and
        ``agent`` as the tool calls it requests: for hosts that report their calls themselves.
        ``ancestors``: when this agent is a sub-agent, the ``(session, agent)`` keys of the
        agents it runs under, nearest first (at most
        :data:`~otel_loopguard._spend.MAX_ANCESTORS` are kept): the turn, and what this agent
        later spends in loops, also count in their :meth:`spend`'s sub-agent totals
        (:meth:`~otel_loopguard._spend.Spend.tree`) and, for an ancestor kept under another
        session, in that session's run budget. The span processor, the exporter, ``serve`` and
        ``replay`` pass the agent spans above the model call's.

        ``usage``: a :class:`~otel_loopguard._prices.ModelUsage`, or a mapping of its fields
        (``model``, ``provider``, ``input_tokens`` with the cached ones included,
        ``output_tokens``, ``cache_read_tokens``, ``cache_write_tokens``,
        ``reported_cost_usd``: the provider's own cost, which wins over a computed one). Returns
        the call's cost and its source, or ``None`` when the usage is not readable (a count that
        is not a whole number from 0 to 10^9, an unknown field: counted in
        :attr:`skipped_model_calls` by field, never raised) or the store failed. Never raises."""
        try:
            if not isinstance(usage, ModelUsage):
                try:
                    usage = _usage_of(usage)
                except ValueError as exc:
                    self.model_call_skipped(str(exc).split(":", 1)[0])
                    return None
            if not ancestors:
                return self._core.model_call(usage, session, agent)
            if not all(
                isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                for pair in ancestors
            ):
                self.model_call_skipped("ancestors")
                return None
            core = self._core
            kept = tuple(core._ids(*pair) for pair in ancestors[:MAX_ANCESTORS])
            cost = core.model_call(usage, session, agent, kept)
            if cost is not None:
                tokens = usage.input_tokens + usage.output_tokens
                core.charge_ancestors(core._ids(session, agent)[0], kept, tokens, cost.usd)
            return cost
        except Exception as exc:
            self._core.report_internal_error("model_call", exc)
            return None

    def model_call_skipped(self, reason: str) -> None:
        """The seam for span entrances: a model call whose usage could not be read, counted
        under ``reason`` (the bad field) in :attr:`skipped_model_calls`. Never raises."""
        try:
            self._core.model_call_skipped(reason)
        except Exception as exc:
            self._core.report_internal_error("model_call", exc)

    def spend(self, session: str, *, agent: str | None = None) -> Spend | None:
        """A copy of what ``session`` (and ``agent``) spent on model calls so far, or ``None``
        when no model call was reported for it (nor for an agent under it). Its
        :meth:`~otel_loopguard._spend.Spend.tree` and
        :meth:`~otel_loopguard._spend.Spend.tree_loop` add what the agents under it spent
        (see :meth:`model_call`'s ``ancestors``)."""
        state = self._core.export_session(session, agent)
        return None if state is None or state.spend is None else state.spend.copy()

    @property
    def skipped_model_calls(self) -> Mapping[str, int]:
        """Model calls whose usage could not be read, by the field that was bad."""
        return dict(self._core.skipped_model_calls)

    @property
    def log_unpriced_models(self) -> bool:
        """Whether a model with no price is logged (once per model; default ``True``). ``replay``
        turns it off: its output is its report."""
        return bool(self._core.pricer.log_unpriced)

    @log_unpriced_models.setter
    def log_unpriced_models(self, value: bool) -> None:
        self._core.pricer.log_unpriced = bool(value)

    @property
    def internal_errors(self) -> Mapping[str, int]:
        """Caught internal errors so far, by where they happened."""
        return self._core.errors()

    @property
    def store_errors(self) -> Mapping[str, int]:
        """Failures of the Redis store so far, by operation (``read``, ``write``, ``conflict``,
        ``decode``; as ``loopguard_store_errors_total``); empty without a store."""
        return dict(getattr(self._core, "store_errors", {}))

    @property
    def session_count(self) -> int:
        """Sessions currently tracked, after dropping those idle beyond the policy's
        ``session_ttl_seconds`` (so the ``loopguard_sessions`` gauge, read at each scrape, is
        never stale); 0 with a Redis store (the sessions are Redis's). Never raises."""
        return self._core.count_sessions()

    def expire_idle_sessions(self) -> int:
        """Drop the sessions idle beyond ``session_ttl_seconds`` now (calls do so at most once a
        second on their own) and count them in ``loopguard_sessions_evicted_total{reason="ttl"}``;
        returns how many were dropped. For a long-running host's timer. Never raises."""
        return self._core.expire()

    def export_session(self, session: str, *, agent: str | None = None) -> SessionState | None:
        """The state kept for ``session`` (and ``agent``), or ``None`` when there is none.

        For entrances that keep sessions outside this process (command hooks run one process
        per call): save it with :meth:`SessionState.to_bytes` after the calls, give it back with
        :meth:`import_session` next time. The object is live: read it only while no other
        thread calls the guard.
        """
        return self._core.export_session(session, agent)

    def import_session(
        self, session: str, state: SessionState, *, agent: str | None = None
    ) -> None:
        """Keep a saved ``state`` (:meth:`SessionState.from_bytes`) for ``session`` (and
        ``agent``), replacing what is kept; a state idle beyond the TTL is forgotten at once."""
        if not isinstance(state, SessionState):
            raise ValueError(f"state: expected a SessionState, got {type(state).__name__}")
        self._core.import_session(session, state, agent)

    def snapshot(self) -> dict[str, Any]:
        """Every session the guard keeps and its report ledger, as plain data (dicts, lists,
        strings, numbers, booleans, ``None``), taken under the lock so no call is half applied
        in it. Versioned (``"version"``); give it back with :meth:`restore`. The policy, the
        advisor and the metrics are not in it: they are the restoring guard's own."""
        return self._core.snapshot()

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace the kept sessions and the report ledger with a :meth:`snapshot`'s (before
        any call). Raises ``ValueError`` naming what is wrong (an unknown ``version`` names it);
        the guard is then unchanged."""
        self._core.restore(data)

    @contextmanager
    def replaying(self, advisor: Advisor | None) -> Iterator[None]:
        """While inside: no metric is counted, no trip line written, and ``advisor`` answers
        for the guard's own (when it has one). For a host applying again inputs it logged (a
        restart of ``serve --state-dir``): what they reported was reported the first time."""
        with self._core.replaying(advisor):
            yield

    @property
    def recorder(self) -> Recorder:
        """Where the guard reports its metrics."""
        return self._core.reporter.recorder

    def serve_metrics(self, port: int, addr: str = "127.0.0.1") -> MetricsServer:
        """Serve Prometheus ``/metrics`` from a daemon thread on ``addr`` (loopback unless told
        otherwise) and ``port`` (0: a free one, see ``.port`` and ``.url`` of the result; close
        it with ``.close()``). Installs a :class:`~otel_loopguard.metrics.PrometheusRecorder` if
        the guard has no recorder yet (counting starts then). Raises ``ValueError`` for a bad
        port or a recorder without a Prometheus registry, ``OSError`` if the port is taken."""
        return self._core.prometheus().serve(port, addr)

    def metrics_wsgi_app(self) -> Callable[..., Any]:
        """A WSGI app serving this guard's metrics, to mount at ``/metrics`` in your server
        (installs a Prometheus recorder as :meth:`serve_metrics` does)."""
        return self._core.prometheus().wsgi_app()

    def metrics_asgi_app(self) -> Callable[..., Any]:
        """An ASGI app serving this guard's metrics (e.g. FastAPI/Starlette
        ``app.mount("/metrics", guard.metrics_asgi_app())``)."""
        return self._core.prometheus().asgi_app()

    def close(self, *, wait: bool = False) -> None:
        """Stop the advisor worker. Queued asks are abandoned; with ``wait``, an ask under way is
        waited for, so its advice is cached (or its budget refunded) before this returns. The
        guard stays usable (with a Redis store, its connections are opened again when
        needed)."""
        self._core.rescues.pool.close(wait=wait)
        sessions = getattr(self._core, "sessions", None)
        if sessions is not None:
            sessions.close()

    # -- wrapping plain Python tools ---------------------------------------------------------

    @overload
    def wrap(
        self,
        fn: F,
        *,
        tool: str | None = ...,
        session: str | Callable[[], str] = ...,
        agent: str | None = ...,
        on_block: Literal["raise", "return"] = ...,
        append_reminders: bool = ...,
    ) -> F: ...

    @overload
    def wrap(
        self,
        fn: None = ...,
        *,
        tool: str | None = ...,
        session: str | Callable[[], str] = ...,
        agent: str | None = ...,
        on_block: Literal["raise", "return"] = ...,
        append_reminders: bool = ...,
    ) -> Callable[[F], F]: ...

    def wrap(
        self,
        fn: F | None = None,
        *,
        tool: str | None = None,
        session: str | Callable[[], str] = "default",
        agent: str | None = None,
        on_block: Literal["raise", "return"] = "raise",
        append_reminders: bool = True,
    ) -> F | Callable[[F], F]:
        """Guard a plain Python tool function (sync or async); usable as a decorator.

        Before each call the bound arguments (defaults applied) go to ``before_tool``. A blocking
        decision raises :class:`LoopDetected` (``on_block="raise"``) or returns the message for
        the model instead of running the tool (``on_block="return"``). After the call,
        ``after_tool`` gets the result or the error and the duration. With ``append_reminders``,
        a reminder is appended to a string result so the model sees it. A conclusion drawn from
        the result (a stop after the third identical failure) ends the run as a block does: it
        raises :class:`LoopDetected` (chained to the tool's own exception when it raised), or with
        ``on_block="return"`` returns the stop's message instead of the result.
        ``session`` is a string or a callable returning one per call.
        """
        if on_block not in ("raise", "return"):
            raise ValueError(f"on_block: expected 'raise' or 'return', got {on_block!r}")
        options: dict[str, Any] = dict(
            tool=tool,
            session=session,
            agent=agent,
            on_block=on_block,
            append_reminders=append_reminders,
        )
        if fn is None:
            return lambda f: self.wrap(f, **options)
        if not callable(fn):
            raise ValueError(f"fn: expected a callable, got {type(fn).__name__}")
        from ._wrap import wrap_tool  # here: a command hook wraps no function

        return cast(F, wrap_tool(self, fn, **options))

    def report_internal_error(self, where: str, exc: BaseException) -> None:
        """The seam for adapters that catch an exception on the hot path: count it under
        ``where`` (``internal_errors``, ``loopguard_internal_errors_total``) and log it once per
        (place, exception type). Never raises."""
        self._core.report_internal_error(where, exc)
