"""The service: OTLP receivers, the ingest worker, the decision API, metrics and shutdown.

Threads and the path of a span:

1. A receiver thread (one per HTTP connection, :mod:`._http`; a pool for gRPC, :mod:`._grpc`)
   authenticates the request, reads and decodes it
   (:func:`~otel_loopguard.service._proto.proto_spans`, or OTLP JSON through
   :func:`~otel_loopguard._otlp_json.otlp_json_spans`), and offers the spans to a bounded ingest
   queue (:meth:`Service.accept`). The answer is sent once they are queued: 200 (with
   ``partial_success`` when some spans were rejected), 400 for data that cannot be read, 429 /
   ``RESOURCE_EXHAUSTED`` with a retry hint when the queue is full (nothing queued, so a retry
   loses nothing). OTLP logs (``/v1/logs``, ``LogsService``) take the same path: their coding
   agents' tool events are read into a :class:`~._otlp_logs.LogCalls`, queued and logged as a
   batch of spans is, and fed to the guard as calls that already ran.
2. One ingest thread (:mod:`._ingest`) owns the :class:`~otel_loopguard._traces.TraceBuffer`: it
   adds each batch, takes the traces whose root arrived (and, on a short tick, the tool spans
   that waited ``hold_seconds``), and feeds their events to the guard with
   :func:`~otel_loopguard._trace_events.feed`, as the in-process span processor calls it.
3. Decision requests (``/v1/decisions/...``, :mod:`._decisions`) call the guard's hook API on
   their own connection thread; the guard's lock is short, so they do not wait for ingest. They
   answer with the command hooks' answer protocol (:mod:`otel_loopguard.hooks._answers`): a hook
   asking the server answers as with its local store.

Shutdown (:meth:`Service.close`) stops accepting, lets requests under way finish, then drains
the queue and flushes every buffered trace through the guard before returning: every span that
was answered 200 is judged.

With ``state_dir`` (:mod:`._durable`), a batch is logged and queued in one step and answered
only once the log is synced (the ingest thread adds it at the time logged with it); a decision
is checked, logged, synced and only then applied, at the time logged with it, under a shared
gate (a snapshot takes it exclusively, so it never sees a decision half done): one that cannot
be logged is not applied (``StateError``: 503). The ingest thread logs the hold timer's
judgements (``TICK``) and takes the snapshots between batches. :meth:`start` loads the snapshot
and applies the log after it again, with the clock pinned to each record's time, before it
listens: a restart judges the same spans at the same times as the live run.

Every receiver catches everything: an unexpected error is counted as the guard's internal error
(``loopguard_internal_errors_total{where="serve..."}``) and answered 500 / ``INTERNAL``; the
server keeps serving.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Mapping
from typing import Final

import orjson

from otel_loopguard._guard import LoopGuard
from otel_loopguard._otlp_json import OtlpSpans
from otel_loopguard._traces import TraceBuffer
from otel_loopguard.config import Policy, policy_from_env
from otel_loopguard.metrics import PrometheusRecorder

from ._budget import ByteBudget
from ._decisions import DecisionAPI, DecisionCall
from ._durable import (
    BATCH,
    DECISION,
    TICK,
    Gate,
    ServiceClock,
    StateDir,
    StateError,
    batch_payload,
)
from ._grpc import GrpcReceiver
from ._http import HTTPReceiver, bind_http
from ._ingest import Ingest
from ._logs import answer_fields, log_decision, trace_fields, wants_allow_lines
from ._metrics import ServiceMetrics
from ._options import RETRY_AFTER_SECONDS, ServeOptions
from ._otlp_logs import LogCalls, LogMetrics
from ._recovery import Recovery

#: Seconds a decision call waits for its log frame to be synced: long, since a call answered
#: 503 must not be in the log (a restart would apply it).
DECISION_SYNC_TIMEOUT_SECONDS: Final = 60.0

__all__ = ["Service"]


class Service(Recovery):
    """``otel-loopguard serve`` as an object: :meth:`start` binds and serves from background
    threads, :meth:`close` drains and stops. Use it as a context manager in tests.

    ``guard``: the guard to feed (default: a new one with ``policy``, or the ``LOOPGUARD_*``
    default). Its metrics are served on ``/metrics``: a guard without a recorder gets a
    :class:`~otel_loopguard.metrics.PrometheusRecorder`. ``clock`` drives the trace hold.
    With ``options.store`` (or a policy whose ``store`` is set) the guard keeps its sessions in
    that Redis: replicas on one Redis decide as one service, whichever gets a span or a call.
    """

    def __init__(
        self,
        options: ServeOptions | None = None,
        *,
        guard: LoopGuard | None = None,
        policy: Policy | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if options is not None and not isinstance(options, ServeOptions):
            raise ValueError(f"options: expected ServeOptions, got {type(options).__name__}")
        if guard is not None and not isinstance(guard, LoopGuard):
            raise ValueError(f"guard: expected a LoopGuard, got {type(guard).__name__}")
        self.options: Final = options if options is not None else ServeOptions()
        store = self.options.store
        if store is not None:
            if guard is not None:
                raise ValueError(
                    "guard: with store the service makes its own guard on that store; give a"
                    " policy instead"
                )
            if clock is not None:
                raise ValueError("clock: with store the sessions are timed by the wall clock")
        elif guard is None:
            policy = policy if policy is not None else policy_from_env()
            store = policy.store
        if store is not None and self.options.state_dir is not None:
            raise ValueError(
                "store, state_dir: give one; with a Redis store the sessions and their"
                " durability are Redis's (run it with appendonly yes, appendfsync always)"
            )
        if self.options.state_dir is not None:
            if guard is not None:
                raise ValueError(
                    "guard: with state_dir the service makes its own guard (its clock and"
                    " state are the ones kept); give a policy instead"
                )
            if clock is not None:
                raise ValueError("clock: with state_dir the service keeps its own clock")
            clock = ServiceClock()
        if guard is None:
            policy = _with_memory(
                policy if policy is not None else policy_from_env(), self.options.state_dir, store
            )
            # With a store, no clock: the Redis store times sessions by the wall clock, which
            # every replica shares.
            guard = LoopGuard(policy, recorder=PrometheusRecorder(), clock=clock, store=store)
        elif not isinstance(guard.recorder, PrometheusRecorder):
            guard.metrics_wsgi_app()  # installs a PrometheusRecorder when it has none
        self.guard = guard
        recorder = guard.recorder
        if not isinstance(recorder, PrometheusRecorder):
            raise ValueError("guard: its recorder has no Prometheus registry to serve")
        self._recorder = recorder
        self._clock: Callable[[], float] = clock if clock is not None else time.monotonic
        self._ingest: Ingest | None = None
        self._http: HTTPReceiver | None = None
        self._grpc: GrpcReceiver | None = None
        self._closing = False
        self._closed = False
        self._inflight = 0
        self._inflight_lock = threading.Condition()
        self.http_port = 0
        self.grpc_port: int | None = None
        self.metrics = ServiceMetrics(recorder.registry, lambda: self.queued_spans)
        #: ``loopguard_otlp_log_records_total`` (OTLP logs: coding agents' tool events).
        self.log_metrics: Final = LogMetrics(recorder.registry)
        self._flushes_synced = [0, 0, 0, 0, 0]
        self._decisions = DecisionAPI(guard)
        #: Request bytes being read or decoded, over both transports (:mod:`._budget`).
        self.budget: Final = ByteBudget(self.options.max_inflight_bytes)
        # serve --state-dir (:mod:`._durable`): None without one.
        self._state: StateDir | None = None
        self._gate = Gate()
        self._buffer: TraceBuffer | None = None
        self._next_snapshot = 0.0
        self._snapshot_covered = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Service:
        """Bind the ports and serve. Raises ``OSError`` when a port cannot be bound, its
        message naming the address, the port and what it was for (nothing is left running
        then)."""
        options = self.options
        buffer = TraceBuffer(
            options.max_buffered_spans,
            key_by=options.key_by,
            hold_seconds=options.hold_seconds,
            clock=self._clock,
        )
        self._buffer = buffer
        self._ingest = Ingest(
            self.guard,
            buffer,
            options.max_queued_spans,
            options.hold_seconds,
            on_pause=self._checkpoint if options.state_dir is not None else None,
            logged=_IngestLog(self) if options.state_dir is not None else None,
        )
        port: tuple[str, int | None] = ("OTLP/HTTP", options.http_port)
        try:
            if options.state_dir is not None:
                self._recover(options.state_dir)
            self._ingest.start()
            self._http = bind_http(self)
            self.http_port = self._http.port
            if options.grpc_port is not None:
                port = ("OTLP/gRPC", options.grpc_port)
                self._grpc = GrpcReceiver(self)
                self.grpc_port = self._grpc.port
                self._grpc.start()
        except BaseException as exc:
            self._stop_listeners(0)
            self._ingest.close(5)
            if self._state is not None:
                self._state.close()
                self._state = None
            if isinstance(exc, StateError):
                raise ValueError(str(exc)) from None
            # grpcio says RuntimeError("Failed to bind ..."); both say which port it was.
            if isinstance(exc, (OSError, RuntimeError)):
                host = options.host.strip("[]")
                shown = f"[{host}]" if ":" in host else host
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                what = "--http-port" if port[0] == "OTLP/HTTP" else "--grpc-port"
                raise OSError(
                    getattr(exc, "errno", None) or 0,
                    f"cannot listen on {shown}:{port[1]} ({port[0]}): {reason}"
                    f" (choose another with {what})",
                ) from exc
            raise
        self._http.serve_in_background()
        return self

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting, let requests under way finish, feed every accepted span and every
        buffered trace to the guard, and stop. Returns False when that took longer than
        ``timeout`` (default: ``drain_timeout_seconds``). Safe to call twice."""
        if self._closed:
            return True
        self._closed = True
        limit = self.options.drain_timeout_seconds if timeout is None else timeout
        deadline = time.monotonic() + limit
        self._closing = True
        drained = self._stop_listeners(limit)
        with self._inflight_lock:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    drained = False
                    break
                self._inflight_lock.wait(left)
        if self._ingest is not None:
            drained = self._ingest.close(max(0.0, deadline - time.monotonic())) and drained
        self.guard.close(wait=True)
        if self._decisions.shared is not None:
            self._decisions.shared.close()
        self._sync_flush_metrics()
        state = self._state
        if state is not None:
            if drained:  # else the log keeps what was not judged, for the next start
                self._snapshot()
            state.close()
        return drained

    def _stop_listeners(self, grace: float) -> bool:
        stopped = True
        if self._grpc is not None:
            stopped = self._grpc.stop(grace)
        if self._http is not None:
            self._http.stop()
        return stopped

    def __enter__(self) -> Service:
        return self.start() if self._ingest is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what tests and operators read -----------------------------------------------------

    @property
    def queued_spans(self) -> int:
        """Spans accepted and not yet fed to the guard."""
        return self._ingest.queued if self._ingest is not None else 0

    @property
    def processed_spans(self) -> int:
        """Spans fed to the trace buffer so far."""
        return self._ingest.processed if self._ingest is not None else 0

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until every accepted span was fed to the trace buffer; False on timeout."""
        ok = self._ingest.wait_idle(timeout) if self._ingest is not None else True
        self._sync_flush_metrics()
        return ok

    @property
    def urls(self) -> Mapping[str, str]:
        """Where it listens: ``http`` (traces, decisions, metrics, health) and ``grpc``."""
        host = self.options.host.strip("[]")
        shown = f"[{host}]" if ":" in host else host
        scheme = "https" if self.options.tls_cert else "http"
        urls = {"http": f"{scheme}://{shown}:{self.http_port}"}
        if self.grpc_port is not None:
            urls["grpc"] = f"{shown}:{self.grpc_port}"
        return urls

    def _sync_flush_metrics(self) -> None:
        """Bring the early-flush and lost-agent counters up to the ingest thread's counts (read
        at scrape)."""
        ingest = self._ingest
        if ingest is None:
            return
        with self._inflight_lock:
            for index, (child, value) in enumerate(
                (
                    (self.metrics.flush_time, ingest.flushed_early_time),
                    (self.metrics.flush_capacity, ingest.flushed_early_capacity),
                    (self.metrics.agents_lost, ingest.agents_lost),
                    (self.metrics.duplicates, ingest.duplicates),
                    (self.log_metrics.duplicates, ingest.duplicate_calls),
                )
            ):
                if value > self._flushes_synced[index]:
                    child.inc(value - self._flushes_synced[index])
                    self._flushes_synced[index] = value

    def metrics_page(self, accept: str | None = None) -> tuple[bytes, str]:
        """What ``/metrics`` answers to a scraper whose ``Accept`` header is ``accept``: the
        guard's and the service's metrics in OpenMetrics, with exemplars (the trace and span of
        each denial, stop and repeat), when it asks for ``application/openmetrics-text`` (as
        Prometheus does), else in the Prometheus text format; and its content type."""
        self._sync_flush_metrics()
        return self._recorder.page(accept)

    # -- request handling shared by both transports ----------------------------------------

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` value carries the token (always, without a token)."""
        token = self.options.token
        if token is None:
            return True
        if not header:
            return False
        # The scheme is case-insensitive (RFC 9110); the token is compared in constant time.
        scheme, _, credentials = header.strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credentials.strip().encode(), token.encode()
        )

    def accept(self, read: OtlpSpans, transport: str) -> tuple[str, str]:
        """Queue the spans (or, for OTLP logs, the coding agents' tool calls,
        :class:`~._otlp_logs.LogCalls`) of one request: ``(outcome, message)`` with outcome
        ``ok``, ``partial``, ``bad_request`` (nothing usable) or ``throttled`` (queue full)."""
        logs = isinstance(read, LogCalls)
        counter = self.log_metrics.records if logs else self.metrics.spans
        if isinstance(read, LogCalls) and read.ignored:
            counter.labels("ignored").inc(read.ignored)
        if read.bad_spans:
            counter.labels("rejected").inc(read.bad_spans)
        message = "; ".join(read.problems)
        if read.bad_spans and not read.accepted:
            return "bad_request", message or ("no usable log record" if logs else "no usable span")
        if read.accepted:
            if self._closing or self._ingest is None:
                counter.labels("throttled").inc(read.accepted)
                return "unavailable", "shutting down"
            state = self._state
            if state is None:
                offered = self._ingest.offer(read)
            else:
                offered, seq = self._offer_logged(state, read)
            if not offered:
                counter.labels("throttled").inc(read.accepted)
                return "throttled", (
                    f"ingest queue full ({self.options.max_queued_spans:,}"
                    f" spans); retry after {RETRY_AFTER_SECONDS} s"
                )
            if state is not None and not state.wait(seq):
                # Queued, but not durable: not answered 200, so the exporter sends it again
                # (and the second copy counts once: ingest is idempotent by span id, and by
                # call id for log records).
                self.metrics.state_errors.labels("log").inc()
                return "unavailable", (
                    f"cannot write the state directory; retry after {RETRY_AFTER_SECONDS} s"
                )
            counter.labels("accepted").inc(read.accepted)
        return ("partial" if read.bad_spans else "ok"), message

    def decide(
        self, endpoint: str, payload: object, traceparent: str | None = None
    ) -> dict[str, object]:
        """One decision API call (:class:`~._decisions.DecisionAPI`), its decision logged
        (:func:`~._logs.log_decision`); raises ``ValueError`` naming a bad field. With
        ``state_dir`` the call is logged and synced before it is applied: ``StateError`` when it
        cannot be (nothing is applied then)."""
        decisions = self._decisions
        # A bad call is neither logged nor applied.
        call = decisions.parse(endpoint, payload, traceparent)
        state = self._state
        if state is None:
            answer = decisions.apply(call)
        else:
            answer = self._decide_logged(state, call, endpoint, payload)
        decision = answer.get("decision")
        if isinstance(decision, dict) and (
            decision.get("detected") != "allow" or wants_allow_lines()
        ):
            log_decision({**answer_fields(decision, call.agent), **trace_fields(call.trace)})
        return answer

    # -- serve --state-dir (:mod:`._durable`) ----------------------------------------------

    def _offer_logged(self, state: StateDir, read: OtlpSpans) -> tuple[bool, int]:
        """Queue a batch and log it, in one step: the queue's order is the log's (the ingest
        thread adds it at the time logged with it)."""
        ingest = self._ingest
        assert ingest is not None
        payload = batch_payload(read)  # off the lock
        when = self._clock()
        seq = state.append(BATCH, when, payload, lambda seq: ingest.offer(read, seq, when))
        return seq != 0, seq

    def _decide_logged(
        self, state: StateDir, call: DecisionCall, endpoint: str, payload: object
    ) -> dict[str, object]:
        """Log a decision call, wait until it is synced, then apply it at the time logged with
        it (as a restart applies it again); not applied when it cannot be logged."""
        try:
            body = orjson.dumps({"endpoint": endpoint, "body": payload})
        except (TypeError, orjson.JSONEncodeError) as exc:
            self.metrics.state_errors.labels("log").inc()
            raise StateError(f"the call cannot be logged ({exc}); not applied") from None
        clock = self._clock
        assert isinstance(clock, ServiceClock)
        # Shared: a snapshot sees a decision logged and applied, or neither.
        with self._gate.shared():
            when = clock()
            seq = state.append(DECISION, when, body)
            if not state.wait(seq, DECISION_SYNC_TIMEOUT_SECONDS):
                self.metrics.state_errors.labels("log").inc()
                raise StateError(
                    f"cannot write the state directory; the call was not applied (retry after"
                    f" {RETRY_AFTER_SECONDS} s)"
                )
            with clock.pinned_here(when):
                return self._decisions.apply(call)

    def log_tick(self, when: float, after_batch: int, expire: bool) -> None:
        """Log a tick of the hold timer (:class:`~._ingest.Logged`) and wait for it."""
        state = self._state
        if state is None:
            return
        payload = orjson.dumps({"after": after_batch, "expire": expire})
        if not state.wait(state.append(TICK, when, payload)):
            self.metrics.state_errors.labels("log").inc()

    def enter_request(self) -> None:
        with self._inflight_lock:
            self._inflight += 1

    def leave_request(self) -> None:
        with self._inflight_lock:
            self._inflight -= 1
            if not self._inflight:
                self._inflight_lock.notify_all()

    @property
    def closing(self) -> bool:
        return self._closing


class _IngestLog:
    """``serve --state-dir`` as the ingest thread sees it (:class:`~._ingest.Logged`)."""

    def __init__(self, service: Service) -> None:
        self._service = service

    @property
    def clock(self) -> ServiceClock:
        clock = self._service._clock
        assert isinstance(clock, ServiceClock)
        return clock

    def tick(self, when: float, after_batch: int, expire: bool) -> None:
        self._service.log_tick(when, after_batch, expire)


def _with_memory(policy: Policy, state_dir: object, store: str | None) -> Policy:
    """``policy`` with its dead-end memory placed (issue 28): ``memory = true`` keeps it in the
    state directory (``memory.json``), or in the shared Redis store; without either, nowhere."""
    if policy.memory is not True:
        return policy
    if state_dir is not None:
        from pathlib import Path

        from .._memory import MEMORY_FILE_NAME

        return policy.replace(memory=str(Path(str(state_dir)) / MEMORY_FILE_NAME))
    if store is not None:
        return policy.replace(memory=store)
    return policy
