"""LoopGuard: one engine, one state per session, fed by the hook API (and later by spans).

Threading contract: every public method may be called from any application thread, concurrently.
State updates happen under one short lock; canonicalisation, hashing, message building, metrics
and advisor calls happen outside it. ``before_tool``/``after_tool``/``user_message``/``new_run``
never raise: an internal error is logged once per kind, counted, and answered with ``allow``.

The guard keeps the hook API and each session's bookkeeping; what a step on the ladder becomes
is :mod:`otel_loopguard.policy`'s (:func:`~otel_loopguard.policy.decide`), what a decision
reports is the reporter's (:mod:`otel_loopguard._reporter`), and the advisor's threads are
:class:`otel_loopguard._asks.AdvisorPool`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar, cast, overload

from ._asks import Rescues, Reserved
from ._reporter import Reporter
from ._wrap import wrap_tool
from .advice import (
    MAX_QUESTION_ARGUMENT_CHARS,
    AdviceRequest,
    Advisor,
    CommandAdvisor,
)
from .calls import (
    MAX_ID_CHARS,
    MAX_TOOL_NAME_CHARS,
    SIGNATURE_CHARS,
    args_key,
    bounded_id,
    canonical_arguments,
    canonical_json,
    outcome_key,
    tool_name,
)
from .config import Mode, Policy, policy_from_env
from .engine import (
    MAX_TRAIL_ARGUMENT_CHARS,
    MAX_TRAIL_OUTPUT_CHARS,
    Classifier,
    Pending,
    ReportLedger,
    SessionState,
    SessionStore,
    Settled,
    Trail,
)
from .metrics import MetricsServer, NoopRecorder, PrometheusRecorder, Recorder
from .policy import (
    ALLOW,
    ALLOW_STEP,
    BLOCKING_ACTIONS,
    Action,
    Decision,
    Phase,
    Step,
    arguments_preview,
    climb,
    conclude,
    decide,
    has_advice,
    message_for,
    settle_rescue,
    with_advice,
)
from .rules import evaluate, identical_failures, trend
from .triplog import TripLog

__all__ = ["LoopGuard"]

_log = logging.getLogger("otel_loopguard")

#: Calls remembered as reported, per session, so that a second report of the same call (a
#: framework hook's and its span's, in either order) does not count it again; and sessions kept.
_MAX_SETTLED_CALLS: Final = 64
_MAX_SETTLED_SESSIONS: Final = 1024
#: Version of :meth:`LoopGuard.snapshot`'s layout; :meth:`LoopGuard.restore` refuses others.
SNAPSHOT_VERSION: Final = 1

F = TypeVar("F", bound=Callable[..., Any])


def _text(value: object) -> str:
    return value if isinstance(value, str) else tool_name(value)


def _cut_utf8(data: bytes, limit: int) -> str:
    """The first ``limit`` characters of UTF-8 ``data``, decoding no more than needed."""
    return data[: limit * 4].decode("utf-8", "ignore")[:limit]


def _output_text(result: object) -> str | None:
    """A call's result as text for the advisor's question, cut (``None`` when there is none).
    Only a guard that keeps trails pays for this."""
    if result is None:
        return None
    if type(result) is str:
        return result[:MAX_TRAIL_OUTPUT_CHARS]
    if isinstance(result, (bytes, bytearray)):
        return _cut_utf8(bytes(result[: MAX_TRAIL_OUTPUT_CHARS * 4]), MAX_TRAIL_OUTPUT_CHARS)
    return _cut_utf8(canonical_json(canonical_arguments(result)), MAX_TRAIL_OUTPUT_CHARS)


def _ended(error: bool | None) -> str:
    """How a call that ran ended, as the advisor's question says it."""
    return "error" if error is True else "ok" if error is False else "ran"


@dataclass(frozen=True, slots=True)
class _Ran:
    """A call reported only after it ran: how ``after_tool`` classified and keyed it (so nothing
    is computed twice) and how it ended."""

    mutating: bool
    canonical: bytes
    key: str
    outcome: str | None
    error: bool | None
    duration_seconds: float | None
    output: str | None = None  # cut result text, only when the guard keeps trails


@dataclass(frozen=True, slots=True)
class _Call:
    """One attempt, keyed: the tool's name, canonical arguments, args key, and the bounded
    session and agent ids."""

    name: str
    canonical: bytes
    key: str
    sid: str
    aid: str | None


@dataclass(slots=True)
class _Turn:
    """What counting one attempt under the lock found; reported and decided off it."""

    step: Step
    repeated: bool
    newly_stopped: bool
    post: Step | None = None
    advice: str | None = None
    rescue_outcome: str | None = None
    ask: Reserved | None = None
    context: dict[str, Any] | None = None
    evictions: list[str] | None = None


@dataclass(frozen=True, slots=True)
class _Outcome:
    """How a reported call ended (``after_tool``'s report), with its call id as text."""

    ref: str | None
    outcome: str | None
    error: bool | None
    output: str | None
    duration_seconds: float | None


def _awaits(pending: Pending, outcome: str | None) -> bool:
    """Whether a reported call still lacks its outcome (a blocked call never has one)."""
    return outcome is None and not pending.blocked and not pending.mutating


class LoopGuard:
    """Detects repeated tool calls and decides what to do about them.

    ``policy`` defaults to the ``default`` preset with ``LOOPGUARD_*`` environment overrides.
    ``advisor`` is asked for advice at rescue (default: ``policy.advisor_command`` if set, run
    as ``policy.advisor_input`` says). A guard with an advisor and a policy that can rescue
    keeps, per session, a bounded trail of recent calls (arguments and outputs cut) and the task
    text, so that its question can say what the agent was doing (see :mod:`.advice`).
    ``clock`` (seconds, monotonic) drives session TTL and advisor cooldown; tests inject one.
    ``recorder`` receives metrics (default: none; :meth:`serve_metrics` and the metrics apps
    install a :class:`~otel_loopguard.metrics.PrometheusRecorder`). A recorder with an
    ``observe_sessions`` method is given a reader of :attr:`session_count` for
    ``loopguard_sessions``, read at collection time, never on the hot path.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        advisor: Advisor | None = None,
        clock: Callable[[], float] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        if policy is not None and not isinstance(policy, Policy):
            raise ValueError(f"policy: expected a Policy, got {type(policy).__name__}")
        self.policy: Final = policy if policy is not None else policy_from_env()
        if advisor is None and self.policy.advisor_command:
            advisor = CommandAdvisor(
                self.policy.advisor_command,
                self.policy.advisor_timeout_seconds,
                input_mode=self.policy.advisor_input,
            )
        if advisor is not None and not callable(advisor):
            raise ValueError(f"advisor: expected a callable, got {type(advisor).__name__}")
        # Trails cost a little per call: only a guard that can ask an advisor keeps them.
        self._keep_trail = advisor is not None and (
            self.policy.rescue_threshold is not None or self.policy.rescue_on_stall
        )
        self._clock = clock if clock is not None else time.monotonic
        self._lock = threading.Lock()
        self._evictions: list[str] = []
        self._store = SessionStore(
            self.policy.max_sessions,
            self.policy.session_ttl_seconds,
            self._clock,
            on_evict=self._evictions.append,
        )
        self._classifier = Classifier(self.policy)
        self._reporter = Reporter(
            self.policy,
            recorder if recorder is not None else NoopRecorder(),
            TripLog(self.policy.trip_log_path, arguments=self.policy.trip_log_arguments)
            if self.policy.trip_log_path
            else None,
        )
        self._rescues = Rescues(
            self.policy,
            advisor,
            self._clock,
            self._lock,
            self._reporter,
            self.report_internal_error,
            self._internal_once,
        )
        # Per thread, the last call before_tool keyed: (arguments object, tool, args key). An
        # after_tool with the very same objects reuses the key instead of hashing again.
        self._last = threading.local()
        # Hook attempts whose outcome is in: session key -> {call id: args key}, oldest first. A
        # second report of such a call (by its id, or by its arguments when it carries no id, as
        # OpenInference tool spans do) only returns None. Cleared per session on a new run.
        self._settled = ReportLedger(_MAX_SETTLED_SESSIONS, _MAX_SETTLED_CALLS)
        self._errors: dict[str, int] = {}
        self._logged: set[tuple[str, str]] = set()
        self._watch_sessions(self._reporter.recorder)

    @property
    def advisor(self) -> Advisor | None:
        """Asked for advice at rescue (``None``: a rescue is a denial); may be replaced."""
        return self._rescues.advisor

    @advisor.setter
    def advisor(self, advisor: Advisor | None) -> None:
        self._rescues.advisor = advisor

    @property
    def trip_log(self) -> TripLog | None:
        """The trip log decisions are written to (``policy.trip_log_path``), or ``None``."""
        return self._reporter.trip_log

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
        :mod:`otel_loopguard.plugins` for the mapping."""
        from .plugins import read_plugin_config  # only migrating users need it

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
        """
        try:
            return self._attempt(tool, arguments, session, agent, call_id, wait_for_advice=True)
        except Exception as exc:  # the hot path never raises (STYLE.md, error zone 3)
            self.report_internal_error("before_tool", exc)
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
            return self._finish(
                tool, arguments, session, agent, call_id, error, result, duration_seconds
            )
        except Exception as exc:
            self.report_internal_error("after_tool", exc)
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
            return self._attempt(tool, arguments, session, agent, call_id, wait_for_advice=False)
        except Exception as exc:
            self.report_internal_error("span_start", exc)
            return ALLOW

    def await_advice(self, decision: Decision, *, agent: str | None = None) -> Decision:
        """For a rescue decided without waiting for the advisor (:meth:`decide_at_span_start`,
        which the span processor calls): wait for the advice asked for it, at most the policy's
        ``advisor_timeout_seconds``, and return the decision with it, as :meth:`before_tool`
        would have answered. For the adapters that enforce a decision the processor made at
        the tool span's start. Any other decision, or a rescue whose ask failed or is not known
        here (``agent`` as given to the call), is returned as is. Never raises."""
        try:
            if decision.action is not Action.RESCUE or has_advice(decision.message):
                return decision
            sid, aid = self._ids(decision.session, agent)
            advice = self._rescues.awaited(sid, aid, decision.signature)
            if not advice:
                return decision
            return dataclasses.replace(decision, message=with_advice(decision.message, advice))
        except Exception as exc:
            self.report_internal_error("await_advice", exc)
            return decision

    def user_message(
        self, session: str, *, agent: str | None = None, text: str | None = None
    ) -> None:
        """A real user message arrived: start a new progress epoch and lift a stop, for
        ``agent`` when one is named, else for the session and every agent in it (each
        ``(session, agent)`` the guard keeps from calls made with ``agent=``).

        ``text``, the message, is what an advisor is told the agent's task is (the session's
        first message; a later one as the latest message), cut to
        :data:`~otel_loopguard.engine.MAX_TASK_CHARS`. Kept only by a guard that can ask an
        advisor. Never raises."""
        self._reset(session, agent, "user_message", text, task=False)

    def new_run(self, session: str, *, agent: str | None = None, task: str | None = None) -> None:
        """A new agent run started in this session: start a new progress epoch and lift a stop,
        for ``agent`` when one is named, else for the session and every agent in it (as
        :meth:`user_message`).

        ``task``, the run's prompt, becomes what an advisor is told the task is (as
        :meth:`user_message`'s ``text``). Never raises."""
        self._reset(session, agent, "new_run", task, task=True)

    def set_task(self, session: str, task: str, *, agent: str | None = None) -> None:
        """Tell the guard what the session's task is (what an advisor is told, as
        :meth:`new_run`'s ``task``) without starting a new progress epoch: for hosts that learn
        the run's prompt only once its calls have begun. Kept only by a guard that can ask an
        advisor. Never raises."""
        if not self._keep_trail or not isinstance(task, str) or not task.strip():
            return
        try:
            with self._lock:
                state = self._store.get(self._store_key(*self._ids(session, agent)))
                evictions = self._take_evictions()
                if state is not None:
                    trail = state.trail
                    if trail is None:
                        trail = state.trail = Trail()
                    trail.new_task(task)
            for reason in evictions:
                self._reporter.recorder.evicted(reason)
        except Exception as exc:
            self.report_internal_error("set_task", exc)

    @property
    def internal_errors(self) -> Mapping[str, int]:
        """Caught internal errors so far, by where they happened."""
        with self._lock:
            return dict(self._errors)

    @property
    def session_count(self) -> int:
        """Sessions currently tracked, after dropping those idle beyond the policy's
        ``session_ttl_seconds`` (so the ``loopguard_sessions`` gauge, read at each scrape, is
        never stale). Never raises."""
        self.expire_idle_sessions()
        with self._lock:
            return len(self._store)

    def expire_idle_sessions(self) -> int:
        """Drop the sessions idle beyond ``session_ttl_seconds`` now (calls do so at most once a
        second on their own) and count them in ``loopguard_sessions_evicted_total{reason="ttl"}``;
        returns how many were dropped. For a long-running host's timer. Never raises."""
        try:
            with self._lock:
                self._store.expire()
                evictions = self._take_evictions()
            for reason in evictions:
                self._reporter.recorder.evicted(reason)
            return len(evictions)
        except Exception as exc:
            self.report_internal_error("expire_idle_sessions", exc)
            return 0

    def export_session(self, session: str, *, agent: str | None = None) -> SessionState | None:
        """The state kept for ``session`` (and ``agent``), or ``None`` when there is none.

        For entrances that keep sessions outside this process (command hooks run one process
        per call): save it with :meth:`SessionState.to_bytes` after the calls, give it back with
        :meth:`import_session` next time. The object is live: read it only while no other
        thread calls the guard.
        """
        with self._lock:
            state = self._store.get(self._store_key(*self._ids(session, agent)), create=False)
            evictions = self._take_evictions()
        for reason in evictions:
            self._reporter.recorder.evicted(reason)
        return state

    def import_session(
        self, session: str, state: SessionState, *, agent: str | None = None
    ) -> None:
        """Keep a saved ``state`` (:meth:`SessionState.from_bytes`) for ``session`` (and
        ``agent``), replacing what is kept; a state idle beyond the TTL is forgotten at once."""
        if not isinstance(state, SessionState):
            raise ValueError(f"state: expected a SessionState, got {type(state).__name__}")
        with self._lock:
            self._store.put(self._store_key(*self._ids(session, agent)), state)
            evictions = self._take_evictions()
        for reason in evictions:
            self._reporter.recorder.evicted(reason)

    # -- state, for processes that keep it between runs (serve --state-dir) -----------------

    def snapshot(self) -> dict[str, Any]:
        """Every session the guard keeps and its report ledger, as plain data (dicts, lists,
        strings, numbers, booleans, ``None``), taken under the lock so no call is half applied
        in it. Versioned (``"version"``); give it back with :meth:`restore`. The policy, the
        advisor and the metrics are not in it: they are the restoring guard's own."""
        with self._lock:
            return {
                "version": SNAPSHOT_VERSION,
                "sessions": self._store.snapshot(),
                "reported": self._settled.snapshot(),
            }

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace the kept sessions and the report ledger with a :meth:`snapshot`'s (before
        any call). Raises ``ValueError`` naming what is wrong (an unknown ``version`` names it);
        the guard is then unchanged."""
        if not isinstance(data, Mapping):
            raise ValueError(f"guard snapshot: expected a mapping, got {type(data).__name__}")
        version = data.get("version")
        if version != SNAPSHOT_VERSION:
            raise ValueError(
                f"guard snapshot: unknown version {version!r} (this is {SNAPSHOT_VERSION})"
            )
        store = SessionStore(
            self.policy.max_sessions,
            self.policy.session_ttl_seconds,
            self._clock,
            on_evict=self._evictions.append,
        )
        store.restore(data.get("sessions"), self.policy)
        settled = ReportLedger(_MAX_SETTLED_SESSIONS, _MAX_SETTLED_CALLS)
        settled.restore(data.get("reported"))
        with self._lock:
            self._store, self._settled = store, settled

    @contextmanager
    def replaying(self, advisor: Advisor | None) -> Iterator[None]:
        """While inside: no metric is counted, no trip line written, and ``advisor`` answers
        for the guard's own (when it has one). For a host applying again inputs it logged (a
        restart of ``serve --state-dir``): what they reported was reported the first time."""
        reporter = self._reporter
        saved = (reporter.recorder, reporter.trip_log, self.advisor)
        reporter.recorder, reporter.trip_log = NoopRecorder(), None
        if self.advisor is not None:
            self.advisor = advisor
        try:
            yield
        finally:
            reporter.recorder, reporter.trip_log, self.advisor = saved

    @property
    def recorder(self) -> Recorder:
        """Where the guard reports its metrics."""
        return self._reporter.recorder

    def serve_metrics(self, port: int, addr: str = "127.0.0.1") -> MetricsServer:
        """Serve Prometheus ``/metrics`` from a daemon thread on ``addr`` (loopback unless told
        otherwise) and ``port`` (0: a free one, see ``.port`` and ``.url`` of the result; close
        it with ``.close()``). Installs a :class:`~otel_loopguard.metrics.PrometheusRecorder` if
        the guard has no recorder yet (counting starts then). Raises ``ValueError`` for a bad
        port or a recorder without a Prometheus registry, ``OSError`` if the port is taken."""
        return self._prometheus().serve(port, addr)

    def metrics_wsgi_app(self) -> Callable[..., Any]:
        """A WSGI app serving this guard's metrics, to mount at ``/metrics`` in your server
        (installs a Prometheus recorder as :meth:`serve_metrics` does)."""
        return self._prometheus().wsgi_app()

    def metrics_asgi_app(self) -> Callable[..., Any]:
        """An ASGI app serving this guard's metrics (e.g. FastAPI/Starlette
        ``app.mount("/metrics", guard.metrics_asgi_app())``)."""
        return self._prometheus().asgi_app()

    def close(self, *, wait: bool = False) -> None:
        """Stop the advisor worker. Queued asks are abandoned; with ``wait``, an ask under way is
        waited for, so its advice is cached (or its budget refunded) before this returns. The
        guard stays usable."""
        self._rescues.pool.close(wait=wait)

    def _prometheus(self) -> PrometheusRecorder:
        reporter = self._reporter
        recorder = reporter.recorder
        if type(recorder) is NoopRecorder:
            fresh = PrometheusRecorder()  # built off the lock: the first build imports a library
            self._watch_sessions(fresh)
            with self._lock:
                if type(reporter.recorder) is NoopRecorder:
                    reporter.recorder = fresh
                recorder = reporter.recorder
        if not isinstance(recorder, PrometheusRecorder):
            raise ValueError(
                f"recorder: {type(recorder).__name__} has no Prometheus registry;"
                " serve its metrics the way that recorder does"
            )
        return recorder

    def _watch_sessions(self, recorder: object) -> None:
        """Hand the recorder a reader of the session count (without keeping the guard alive).
        Looked up on the type: a recorder that answers any attribute is not asked."""
        observe = getattr(type(recorder), "observe_sessions", None)
        if observe is None:
            return
        ref = weakref.ref(self)

        def count() -> int:
            guard = ref()
            return guard.session_count if guard is not None else 0

        observe(recorder, count)

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
        return cast(F, wrap_tool(self, fn, **options))

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _ids(session: object, agent: object) -> tuple[str, str | None]:
        sid = session if type(session) is str else _text(session)
        aid = agent if agent is None or type(agent) is str else _text(agent)
        if len(sid) > MAX_ID_CHARS:
            sid = bounded_id(sid)
        if aid is not None and len(aid) > MAX_ID_CHARS:
            aid = bounded_id(aid)
        return sid, aid

    @staticmethod
    def _store_key(sid: str, aid: str | None) -> object:
        # The session string alone when there is no agent (the common case, and less memory).
        return sid if aid is None else (sid, aid)

    def _attempt(
        self,
        tool: object,
        arguments: object,
        session: object,
        agent: object,
        call_id: object,
        *,
        wait_for_advice: bool,
        ran: _Ran | None = None,
    ) -> Decision:
        """Count one attempt and decide. ``ran``: the attempt already ran (reported only when it
        ended, keyed by ``after_tool``), so its outcome is recorded at once and it is never
        pending; ``None`` for an attempt about to run."""
        name = tool if type(tool) is str and len(tool) <= MAX_TOOL_NAME_CHARS else tool_name(tool)
        if ran is None:
            known = self._key_call(name, arguments)
            if known is None:
                return ALLOW
            mutating, canonical, key = known
        else:
            mutating, canonical, key = ran.mutating, ran.canonical, ran.key
        store_key: object
        if type(session) is str and agent is None and len(session) <= MAX_ID_CHARS:
            sid, aid, store_key = session, None, session  # the common case, without the calls
        else:
            sid, aid = self._ids(session, agent)
            store_key = self._store_key(sid, aid)
        call = _Call(name, canonical, key, sid, aid)
        trail_arguments = _cut_utf8(canonical, MAX_TRAIL_ARGUMENT_CHARS) if self._keep_trail else ""
        with self._lock:
            state: SessionState = self._store.get(store_key)  # type: ignore[assignment]
            if ran is None:
                # The kept ids (bounded), not the caller's: a long id only misses this memo.
                self._last.call = (arguments, tool, sid, aid, key, state)
            turn = self._count(state, store_key, call, mutating, call_id, ran, trail_arguments)
        self._report_attempt(turn, call, ran)
        advice, escalation_failed = turn.advice, False
        if turn.ask is not None and turn.context is not None:
            advice, escalation_failed = self._ask(turn.ask, call, turn, wait_for_advice)
        if turn.rescue_outcome is not None:
            self._reporter.recorder.rescue(turn.rescue_outcome)
        step = settle_rescue(turn.step, advice, asking=not wait_for_advice and turn.ask is not None)
        if turn.post is not None:
            return self._post_decision(turn.post, name, key, sid, aid)
        decision = decide(
            step,
            tool=name,
            key=key,
            session=sid,
            policy=self.policy,
            canonical=canonical,
            advice=advice,
            repeated=turn.repeated,
        )
        if step.action is not Action.ALLOW:
            kind = "escalation-failed" if escalation_failed else None
            self._reporter.decided(decision, aid, canonical, kind)
        return decision

    def _climb(self, state: SessionState, key: str) -> Step:
        """Under the lock: where this attempt of ``key`` stands on the ladder."""
        policy = self.policy
        verdict, stuck, stalled = evaluate(state, key, policy)
        if verdict is None and stalled is None and not state.stopped:
            return ALLOW_STEP  # the common case: nothing repeats
        return climb(
            verdict,
            stalled,
            trend(state.signature(key)),
            denials=state.denials,
            stopped=state.stopped,
            policy=policy,
            stuck=stuck,
            stop_threshold=state.stop_threshold,
        )

    def _count(
        self,
        state: SessionState,
        store_key: object,
        call: _Call,
        mutating: bool,
        call_id: object,
        ran: _Ran | None,
        trail_arguments: str,
    ) -> _Turn:
        """Under the lock: count the attempt in ``state``, keep it pending (or record how it
        ran), and reserve an ask at rescue."""
        policy = self.policy
        key = call.key
        step = self._climb(state, key)
        # The first stop of a run (counted once in loopguard_stopped_runs_total; later calls
        # are decided stop again, and in observe mode they keep coming).
        newly_stopped = step.action is Action.STOP and not state.stopped
        detected_block = step.action in BLOCKING_ACTIONS
        enforced_block = detected_block and policy.mode is Mode.ENFORCE and ran is None
        repeated = state.record_attempt(
            key, policy, blocked=detected_block, explores=not mutating, refused=enforced_block
        )
        if newly_stopped:
            state.stopped = True
            state.stop_threshold = step.threshold
        turn = _Turn(step, repeated, newly_stopped)
        if ran is not None:
            # It ran (we only heard of it afterwards): its outcome, maybe progress.
            turn.post = self._ran(state, key, mutating, ran.outcome, ran.error)
        else:
            ref = key if call_id is None else _text(call_id)
            state.add_pending(ref, key, enforced_block, mutating)
            if call_id is not None and self._settled:
                self._settled.take(store_key, ref)  # a new attempt under a reused call id
        if self._keep_trail:
            trail = state.trail
            if trail is None:
                trail = state.trail = Trail()
            if ran is None:
                refused = "refused" if enforced_block else None
                trail.add(call.name, trail_arguments, key, refused, None)
            else:
                trail.add(call.name, trail_arguments, key, _ended(ran.error), ran.output)
        if step.action is Action.RESCUE:
            turn.advice, turn.rescue_outcome, turn.ask = self._rescues.reserve(state, key)
            if turn.ask is not None:
                turn.context = Rescues.context(state, key)
        turn.evictions = self._take_evictions() if self._evictions else None
        return turn

    def _report_attempt(self, turn: _Turn, call: _Call, ran: _Ran | None) -> None:
        """Off the lock: the metrics of one counted attempt (before any decision's)."""
        recorder = self._reporter.recorder
        if turn.evictions:
            for reason in turn.evictions:
                recorder.evicted(reason)
        recorder.tool_call(call.aid, call.name, turn.repeated)
        if turn.newly_stopped:
            self._reporter.stopped(turn.step, call.aid, call.name)
        if ran is not None and turn.repeated and ran.duration_seconds:
            recorder.wasted(call.aid, call.name, ran.duration_seconds)

    def _finish(
        self,
        tool: object,
        arguments: object,
        session: object,
        agent: object,
        call_id: object,
        error: bool | None,
        result: object,
        duration_seconds: float | None,
    ) -> Decision | None:
        done = _Outcome(
            _text(call_id) if call_id is not None else None,
            outcome_key(result, error),
            error,
            _output_text(result) if self._keep_trail else None,
            duration_seconds,
        )
        last = getattr(self._last, "call", None)
        if (
            last is not None
            and last[0] is arguments
            and last[1] is tool
            and last[2] == session
            and last[3] == agent
        ):
            # The same objects this thread's last before_tool keyed: reuse its key and session.
            matched, decision = self._finish_known(tool, session, agent, done, last[4], last[5])
        elif done.ref is not None:
            matched, decision = self._finish_known(tool, session, agent, done, None, None)
        else:
            matched, decision = False, None
        if matched:
            return decision
        return self._finish_by_arguments(tool, arguments, session, agent, call_id, done)

    def _finish_known(
        self,
        tool: object,
        session: object,
        agent: object,
        done: _Outcome,
        known_key: str | None,
        known_state: SessionState | None,
    ) -> tuple[bool, Decision | None]:
        """A report of a call with an id, or keyed by this thread's last ``before_tool``: the
        pending attempt it ends, or the earlier report it repeats. (whether it matched, what
        the guard concludes)."""
        ref = done.ref
        early: Step | None = None
        state: SessionState | None = None
        pending: Pending | None = None
        post: Step | None = None
        # The store key is needed only with a call id, or without the state at hand.
        store_key: object = (
            self._store_key(*self._ids(session, agent))
            if ref is not None or known_state is None
            else None
        )
        with self._lock:
            settled = self._settled.take(store_key, ref) if ref is not None else None
            if settled is not None:
                # This call was reported already (by the hook, or by its span): this report
                # only adds the outcome the first one lacked.
                early = self._late_outcome(store_key, settled, done.outcome, done.error)
            else:
                state = known_state or self._store.get(store_key, create=False)
                if state is not None:
                    pending = self._take_known(state, store_key, done, known_key, session, agent)
                if pending is not None:
                    post = self._apply_outcome(state, pending, done)  # type: ignore[arg-type]
        if settled is not None:
            return True, self._late_decision(early, tool, settled[0], session, agent)
        if pending is None:
            return False, None
        if done.duration_seconds:
            self._record_wasted(state, pending, agent, tool, done.duration_seconds)
        if post is None:
            return True, None
        name = tool_name(tool)
        return True, self._post_decision(post, name, pending.args_key, *self._ids(session, agent))

    def _take_known(
        self,
        state: SessionState,
        store_key: object,
        done: _Outcome,
        known_key: str | None,
        session: object,
        agent: object,
    ) -> Pending | None:
        """Under the lock: the pending attempt a report ends, by its call id, else by the key
        this thread's last ``before_tool`` gave it; settled in the ledger."""
        ref, outcome = done.ref, done.outcome
        pending = None
        if ref is not None:
            pending = state.take_pending(ref)
            if pending is not None:
                self._settled.settle(store_key, ref, pending.args_key, _awaits(pending, outcome))
        if pending is None and known_key is not None:
            pending = state.take_pending(known_key)
            if pending is not None and ref is None:
                # Reported without an id: a second report of it (the span's, or the hook's)
                # is matched by its arguments and adds nothing.
                if store_key is None:
                    store_key = self._store_key(*self._ids(session, agent))
                self._settled.settle(store_key, known_key, known_key, _awaits(pending, outcome))
        return pending

    def _finish_by_arguments(
        self,
        tool: object,
        arguments: object,
        session: object,
        agent: object,
        call_id: object,
        done: _Outcome,
    ) -> Decision | None:
        """A report matched by session and arguments: the pending attempt it ends, an earlier
        report it repeats, or else a call heard of only now (counted as it ran)."""
        store_key = self._store_key(*self._ids(session, agent))
        name = tool_name(tool)
        keyed = self._key_call(name, arguments)
        if keyed is None:
            return None
        mutating, canonical, key = keyed
        settled = None
        late: Step | None = None
        with self._lock:
            state = self._store.get(store_key, create=False)
            pending = None
            if state is not None:
                pending = self._take_by_arguments(state, store_key, key, done)
            post = None
            if pending is not None:
                post = self._apply_outcome(state, pending, done)  # type: ignore[arg-type]
            elif done.ref is None:
                settled = self._settled.take_by_args(store_key, key)
                if settled is not None:
                    # The hook reported this call with its id; this is the span's echo (or the
                    # other way round): it only adds an outcome the first report lacked.
                    late = self._late_outcome(store_key, settled, done.outcome, done.error)
        if settled is not None:
            return self._late_decision(late, name, key, session, agent)
        if pending is not None:
            if done.duration_seconds:
                self._record_wasted(state, pending, agent, name, done.duration_seconds)
            if post is None:
                return None
            return self._post_decision(post, name, key, *self._ids(session, agent))
        ran = _Ran(
            mutating, canonical, key, done.outcome, done.error, done.duration_seconds, done.output
        )
        return self._attempt(
            name, arguments, session, agent, call_id, wait_for_advice=False, ran=ran
        )

    def _take_by_arguments(
        self, state: SessionState, store_key: object, key: str, done: _Outcome
    ) -> Pending | None:
        """Under the lock: the hook may have counted this call without an id (pending under its
        args key), or under an id this report does not carry: match it by its arguments."""
        pending = state.take_pending(key)
        if pending is not None and done.ref is None:
            # Counted without an id, reported without one: remember it, so that the other
            # report of the same call (hook or span, either order) adds nothing.
            self._settled.settle(store_key, key, key, _awaits(pending, done.outcome))
        elif pending is None and state.pending:
            pending = self._settled.take_pending_by_args(
                state, store_key, key, done.outcome is None
            )
        return pending

    def _key_call(self, name: str, arguments: object) -> tuple[bool, bytes, str] | None:
        """(mutating, canonical JSON, args key) of a call of ``name``, or ``None`` when the
        policy does not track it."""
        value = canonical_arguments(arguments, self.policy.ignored_args)
        tracked, mutating = self._classifier.classify(name, value)
        if not tracked:
            return None
        canonical = canonical_json(value)
        return mutating, canonical, args_key(name, canonical)

    def _apply_outcome(self, state: SessionState, pending: Pending, done: _Outcome) -> Step | None:
        if pending.blocked:
            return None  # a denied call never ran: its "result" is our message, never progress
        if state.trail is not None:
            state.trail.settle(pending.args_key, _ended(done.error), done.output)
        return self._ran(state, pending.args_key, pending.mutating, done.outcome, done.error)

    def _late_outcome(
        self, store_key: object, settled: Settled, outcome: str | None, error: bool | None
    ) -> Step | None:
        """Under the lock: a second report of a call whose first report lacked its outcome (a
        span without the result, before the hook's report) adds the outcome now, and may
        conclude the run is stuck (a stop after the call ran). Nothing else is counted again."""
        key, awaiting = settled
        if not awaiting or outcome is None:
            return None
        state = self._store.get(store_key, create=False)
        if state is None:
            return None
        state.record_outcome(key, outcome, failed=error is True)
        return self._conclude(state, key)

    def _late_decision(
        self, late: Step | None, tool: object, key: str, session: object, agent: object
    ) -> Decision | None:
        if late is None:
            return None
        return self._post_decision(late, tool_name(tool), key, *self._ids(session, agent))

    def _ran(
        self, state: SessionState, key: str, mutating: bool, outcome: str | None, error: bool | None
    ) -> Step | None:
        """Under the lock: a call of ``key`` ran with ``outcome``. Record it, start a new epoch
        when it made progress, and return the post-call conclusion (a stop), if any."""
        failed = error is True
        state.record_outcome(key, outcome, failed=failed)
        if mutating and not failed and state.mutated(key, outcome, self.policy):
            return None
        return self._conclude(state, key)

    def _conclude(self, state: SessionState, key: str) -> Step | None:
        """Under the lock: after a call of ``key`` ran, a stop when its failures say the run is
        stuck (once: a session already told to stop is told so by the pre-call answers)."""
        if state.stopped:
            return None
        step = conclude(identical_failures(state, key), policy=self.policy)
        if step is not None:
            state.stopped = True
            state.stop_threshold = step.threshold
        return step

    def _post_decision(
        self, step: Step, name: str, key: str, sid: str, aid: str | None
    ) -> Decision:
        """The :class:`Decision` for a post-call conclusion ``step``: reported, and softened by
        the mode like a pre-call one."""
        decision = decide(
            step, tool=name, key=key, session=sid, policy=self.policy, phase=Phase.POST
        )
        self._reporter.decided(decision, aid, None)
        return decision

    def _record_wasted(
        self,
        state: SessionState | None,
        pending: Pending,
        agent: object,
        tool: object,
        duration_seconds: float,
    ) -> None:
        if pending.blocked or state is None:
            return
        signature = state.signatures.get(pending.args_key)
        if signature is not None and signature.count > 1:
            aid = self._ids("", agent)[1]
            self._reporter.recorder.wasted(aid, tool_name(tool), duration_seconds)

    def _ask(self, ask: Reserved, call: _Call, turn: _Turn, wait: bool) -> tuple[str | None, bool]:
        """Ask the advisor off the lock; wait only when ``wait`` (hooks), never for spans.
        Returns (advice, whether an ask waited for failed).

        The outcome (advice cached, or budget refunded) is settled by :meth:`_advice_done` when
        the ask ends, whether or not anyone waited for it; an ask nobody waited for that fails
        writes its own ``escalation-failed`` trip line."""
        policy, step = self.policy, turn.step
        advisor = self.advisor
        assert advisor is not None and turn.context is not None
        request = AdviceRequest(
            session=call.sid,
            tool=call.name,
            arguments_preview=arguments_preview(call.canonical, MAX_QUESTION_ARGUMENT_CHARS),
            count=step.count,
            rule=step.rule.value if step.rule else "",
            denial=message_for(step, call.name, call.canonical, policy, action=Action.DENY),
            agent=call.aid,
            signature=call.key[:SIGNATURE_CHARS],
            model=policy.advisor_model,
            **turn.context,
        )
        # Nobody waits for an ask at a span's start: if it fails, its own trip line says so.
        trip = None
        if not wait and self._reporter.trip_log is not None:
            asked = decide(
                step,
                tool=call.name,
                key=call.key,
                session=call.sid,
                policy=policy,
                canonical=call.canonical,
            )
            trip = self._reporter.trip_line(asked, call.aid, call.canonical, "escalation-failed")
        return self._rescues.ask(ask, request, call.key, trip, wait)

    def _reset(
        self, session: object, agent: object, where: str, text: object = None, *, task: bool = False
    ) -> None:
        """A new progress epoch, with the stop lifted, for ``session`` and ``agent``; with no
        agent named, for the session and every agent kept in it (a user speaks to the whole
        session; calls made with ``agent=`` are kept per agent)."""
        try:
            keep_text = self._keep_trail and isinstance(text, str) and text.strip()
            with self._lock:
                sid, aid = self._ids(session, agent)
                store_key = self._store_key(sid, aid)
                store = self._store
                keys = [store_key] if aid is not None else [store_key, *store.agent_keys(sid)]
                for key in keys:
                    state = store.get(key, create=key is store_key)
                    if state is not None:
                        state.new_epoch(clear_stop=True)
                        if keep_text:
                            trail = state.trail
                            if trail is None:
                                trail = state.trail = Trail()
                            if task:
                                trail.new_task(cast(str, text))
                            else:
                                trail.user_message(cast(str, text))
                    self._settled.forget(key)  # a new run may reuse call ids
                evictions = self._take_evictions()
            for reason in evictions:
                self._reporter.recorder.evicted(reason)
        except Exception as exc:
            self.report_internal_error(where, exc)

    def _take_evictions(self) -> list[str]:
        if not self._evictions:
            return []
        taken = list(self._evictions)
        self._evictions.clear()
        return taken

    def _internal_once(self, kind: str, exc: BaseException) -> None:
        """Log an advisor failure once per kind (it is expected, not an internal error)."""
        signature = (kind, type(exc).__name__)
        if signature not in self._logged:
            self._logged.add(signature)
            _log.warning(
                "loopguard %s unavailable: %s (further such failures are not logged)", kind, exc
            )

    def report_internal_error(self, where: str, exc: BaseException) -> None:
        """The seam for adapters that catch an exception on the hot path: count it under
        ``where`` (``internal_errors``, ``loopguard_internal_errors_total``) and log it once per
        (place, exception type). Never raises."""
        try:
            with self._lock:
                self._errors[where] = self._errors.get(where, 0) + 1
                first = (where, type(exc).__name__) not in self._logged
                self._logged.add((where, type(exc).__name__))
            if first:
                _log.error(
                    "loopguard internal error in %s; falling back to allow"
                    " (further %s errors here are counted, not logged)",
                    where,
                    type(exc).__name__,
                    exc_info=exc,
                )
            self._reporter.recorder.internal_error(where)
        except Exception:  # pragma: no cover - logging itself failed; nothing left to do
            pass
