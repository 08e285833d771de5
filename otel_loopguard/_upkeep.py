"""The guard core's upkeep, beside its decisions (:mod:`._core`): sessions in and out
(export and import, snapshot and restore, replaying a log), expiry, new epochs, the advisor's
cached advice, model-call spend, metrics wiring and internal errors. A base class of
:class:`~otel_loopguard._core.GuardCore`, which sets the attributes declared here."""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, cast

from ._asks import Rescues
from ._calls import MAX_ID_CHARS, bounded_id, tool_name
from ._engine import SessionState
from ._lazy import logger
from ._ledger import ReportLedger
from ._policy import Action, Decision, has_advice, with_advice
from ._prices import Cost, ModelUsage, Pricer
from ._reporter import Reporter
from ._session_store import SessionStore
from ._spend import Spend
from ._trail import Trail
from .config import Policy
from .metrics import NoopRecorder

if TYPE_CHECKING:
    from ._advice import Advisor
    from .metrics.prometheus import PrometheusRecorder

__all__ = ["MAX_SETTLED_CALLS", "MAX_SETTLED_SESSIONS", "SNAPSHOT_VERSION", "Upkeep", "text_of"]


#: Calls remembered as reported, per session, so that a second report of the same call (a
#: framework hook's and its span's, in either order) does not count it again; and sessions kept.
MAX_SETTLED_CALLS: Final = 64
MAX_SETTLED_SESSIONS: Final = 1024
#: Reasons kept for skipped model calls (the field a bad value was in); others are not counted.
_MAX_SKIP_REASONS: Final = 64
#: Version of :meth:`LoopGuard.snapshot`'s layout; :meth:`LoopGuard.restore` refuses others.
SNAPSHOT_VERSION: Final = 1


def text_of(value: object) -> str:
    return value if isinstance(value, str) else tool_name(value)


class Upkeep:
    """The core's upkeep (see the module); :class:`~otel_loopguard._core.GuardCore` decides."""

    policy: Policy
    store: SessionStore
    reporter: Reporter
    rescues: Rescues
    pricer: Pricer
    skipped_model_calls: dict[str, int]
    _keep_trail: bool
    _clock: Callable[[], float]
    _lock: threading.Lock
    _evictions: list[str]
    _settled: ReportLedger
    _errors: dict[str, int]
    _logged: set[tuple[str, str]]

    def await_advice(self, decision: Decision, agent: str | None) -> Decision:
        try:
            if decision.action is not Action.RESCUE or has_advice(decision.message):
                return decision
            sid, aid = self._ids(decision.session, agent)
            advice = self.rescues.awaited(sid, aid, decision.signature)
            if not advice:
                return decision
            return dataclasses.replace(decision, message=with_advice(decision.message, advice))
        except Exception as exc:
            self.report_internal_error("await_advice", exc)
            return decision

    def set_task(self, session: str, task: str, agent: str | None) -> None:
        if not self._keep_trail or not isinstance(task, str) or not task.strip():
            return
        try:
            with self._lock:
                state = self.store.get(self._store_key(*self._ids(session, agent)))
                evictions = self._take_evictions()
                if state is not None:
                    trail = state.trail
                    if trail is None:
                        trail = state.trail = Trail()
                    trail.new_task(task)
            self._evicted(evictions)
        except Exception as exc:
            self.report_internal_error("set_task", exc)

    def set_scope(self, session: str, scope: str, agent: str | None) -> None:
        """The memory scope of the session's run, as its entrance knows it (the command hooks'
        and the decision API's repository of the caller's working directory), kept with the
        session; a scope it has already is kept. Nothing without memory."""
        if getattr(self, "memory", None) is None:
            return
        try:
            with self._lock:
                state = self.store.get(self._store_key(*self._ids(session, agent)))
                evictions = self._take_evictions()
                if state is not None and state.scope is None:
                    state.scope = scope
            self._evicted(evictions)
        except Exception as exc:
            self.report_internal_error("set_scope", exc)

    def errors(self) -> dict[str, int]:
        with self._lock:
            return dict(self._errors)

    def count_sessions(self) -> int:
        self.expire()
        with self._lock:
            return len(self.store)

    def expire(self) -> int:
        try:
            with self._lock:
                self.store.expire()
                evictions = self._take_evictions()
            self._evicted(evictions)
            return len(evictions)
        except Exception as exc:
            self.report_internal_error("expire_idle_sessions", exc)
            return 0

    def export_session(self, session: str, agent: str | None) -> SessionState | None:
        with self._lock:
            state = self.store.get(self._store_key(*self._ids(session, agent)), create=False)
            evictions = self._take_evictions()
        self._evicted(evictions)
        return state

    def import_session(self, session: str, state: SessionState, agent: str | None) -> None:
        with self._lock:
            self.store.put(self._store_key(*self._ids(session, agent)), state)
            evictions = self._take_evictions()
        self._evicted(evictions)

    def _evicted(self, evictions: list[str]) -> None:
        for reason in evictions:
            self.reporter.recorder.evicted(reason)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "version": SNAPSHOT_VERSION,
                "sessions": self.store.snapshot(),
                "reported": self._settled.snapshot(),
            }

    def restore(self, data: Mapping[str, Any]) -> None:
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
        settled = ReportLedger(MAX_SETTLED_SESSIONS, MAX_SETTLED_CALLS)
        settled.restore(data.get("reported"))
        with self._lock:
            self.store, self._settled = store, settled

    @contextmanager
    def replaying(self, advisor: Advisor | None) -> Iterator[None]:
        reporter, rescues = self.reporter, self.rescues
        saved = (reporter.recorder, reporter.trip_log, rescues.advisor)
        reporter.recorder, reporter.trip_log = NoopRecorder(), None
        if rescues.advisor is not None:
            rescues.advisor = advisor
        try:
            yield
        finally:
            reporter.recorder, reporter.trip_log, rescues.advisor = saved

    def prometheus(self) -> PrometheusRecorder:
        """The Prometheus recorder, installed now if there was none (metrics served later)."""
        from .metrics.prometheus import PrometheusRecorder

        reporter = self.reporter
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
            core = ref()
            return core.count_sessions() if core is not None else 0

        observe(recorder, count)

    @staticmethod
    def _ids(session: object, agent: object) -> tuple[str, str | None]:
        sid = session if type(session) is str else text_of(session)
        aid = agent if agent is None or type(agent) is str else text_of(agent)
        if len(sid) > MAX_ID_CHARS:
            sid = bounded_id(sid)
        if aid is not None and len(aid) > MAX_ID_CHARS:
            aid = bounded_id(aid)
        return sid, aid

    @staticmethod
    def _store_key(sid: str, aid: str | None) -> object:
        # The session string alone when there is no agent (the common case, and less memory).
        return sid if aid is None else (sid, aid)

    def model_call(
        self,
        usage: ModelUsage,
        session: object,
        agent: object,
        ancestors: tuple[tuple[str, str | None], ...] = (),
    ) -> Cost | None:
        """Count one model call's usage under ``session`` and ``agent`` (the keys of the tool
        calls it requested), priced (:class:`~otel_loopguard._prices.Pricer`) off the lock;
        then, off it too, in the metrics (``loopguard_model_tokens_total`` and the like).
        ``ancestors``: the agents this one runs under, nearest first (bounded ids), kept in its
        spend; the caller charges them the turn with :meth:`charge_below`."""
        cost = self.pricer.cost(usage)
        sid, aid = self._ids(session, agent)
        with self._lock:
            state: SessionState = self.store.get(self._store_key(sid, aid))  # type: ignore[assignment]
            spend = state.spend
            if spend is None:
                spend = state.spend = Spend()
            spend.add(usage, cost)
            if ancestors and spend.ancestors != ancestors:
                spend.ancestors = ancestors
            evictions = self._take_evictions()
        recorder = self.reporter.recorder
        for reason in evictions:
            recorder.evicted(reason)
        try:
            recorder.model_call(
                aid,
                usage.model,
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
                cost.usd,
                None if cost.usd is None else cost.source,
            )
        except Exception as exc:  # a recorder must not raise; if one does, the spend stands
            self.report_internal_error("model_call", exc)
        return cost

    def charge_below(
        self,
        session: str,
        agent: str | None,
        tokens: int,
        usd: float | None,
        *,
        apart: bool,
        loop: bool = False,
    ) -> None:
        """A sub-agent's model turn (``loop``: its spend moved into a loop) charged to the
        agent ``(session, agent)`` it runs under: in its sub-agents' total
        (:meth:`Spend.tree`); ``apart`` when the sub-agent is kept under another session (then
        in the run's total too). An ancestor not kept yet is made (its own turns come later)."""
        with self._lock:
            state: SessionState = self.store.get(self._store_key(session, agent))  # type: ignore[assignment]
            spend = state.spend
            if spend is None:
                spend = state.spend = Spend()
            if loop:
                spend.add_below_loop(tokens, usd or 0.0)
            else:
                spend.add_below(tokens, usd, apart=apart)
            evictions = self._take_evictions()
        for reason in evictions:
            self.reporter.recorder.evicted(reason)

    def charge_ancestors(
        self,
        session: str,
        ancestors: tuple[tuple[str, str | None], ...],
        tokens: int,
        usd: float | None,
        *,
        loop: bool = False,
    ) -> None:
        """:meth:`charge_below` for each of ``ancestors`` of an agent of ``session``; an
        ancestor that fails is reported, the others are still charged."""
        for ancestor_session, ancestor_agent in ancestors:
            try:
                self.charge_below(
                    ancestor_session,
                    ancestor_agent,
                    tokens,
                    usd,
                    apart=ancestor_session != session,
                    loop=loop,
                )
            except Exception as exc:
                self.report_internal_error("charge_ancestors", exc)

    def model_call_skipped(self, reason: str) -> None:
        """A model call's usage that could not be read (a bad value): counted by ``reason``."""
        with self._lock:
            skipped = self.skipped_model_calls
            if reason in skipped or len(skipped) < _MAX_SKIP_REASONS:
                skipped[reason] = skipped.get(reason, 0) + 1

    def reset(
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
                store = self.store
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
                self.reporter.recorder.evicted(reason)
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
            logger().warning(
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
                logger().error(
                    "loopguard internal error in %s; falling back to allow"
                    " (further %s errors here are counted, not logged)",
                    where,
                    type(exc).__name__,
                    exc_info=exc,
                )
            self.reporter.recorder.internal_error(where)
        except Exception:  # pragma: no cover - logging itself failed; nothing left to do
            pass
