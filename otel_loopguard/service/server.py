"""The service: OTLP receivers, the ingest worker, the decision API, metrics and shutdown.

Threads and the path of a span:

1. A receiver thread (one per HTTP connection, a pool for gRPC) authenticates the request, reads
   and decodes it (:func:`~otel_loopguard.service.proto.proto_spans`, or OTLP JSON through
   :func:`~otel_loopguard.traces.otlp_json_spans`), and offers the spans to a bounded ingest
   queue. The answer is sent once they are queued: 200 (with ``partial_success`` when some spans
   were rejected), 400 for data that cannot be read, 429 / ``RESOURCE_EXHAUSTED`` with a retry
   hint when the queue is full (nothing queued, so a retry loses nothing).
2. One ingest thread owns the :class:`~otel_loopguard.traces.TraceBuffer`: it adds each batch,
   takes the traces whose root arrived (and, on a short tick, the tool spans that waited
   ``hold_seconds``), and feeds their events to the guard with
   :func:`~otel_loopguard.traces.feed`, as the in-process span processor calls it.
3. Decision requests (``/v1/decisions/...``) call the guard's hook API on their own connection
   thread; the guard's lock is short, so they do not wait for ingest. For command hooks (on
   hosts that show the model text only with a call's result) they also keep the reminders that
   wait for a result (:class:`_HeldReminders`), and word the reminder for a call reported only
   after it ran with the hook runner's own functions: a hook answers as with its local store.

Shutdown (:meth:`Service.close`) stops accepting, lets requests under way finish, then drains
the queue and flushes every buffered trace through the guard before returning: every span that
was answered 200 is judged.

Every receiver catches everything: an unexpected error is counted as the guard's internal error
(``loopguard_internal_errors_total{where="serve..."}``) and answered 500 / ``INTERNAL``; the
server keeps serving.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, TextIO

import orjson

from otel_loopguard.config import Policy
from otel_loopguard.guard import LoopGuard
from otel_loopguard.hooks.remote import TOKEN_ENV
from otel_loopguard.hooks.runner import after_the_fact, call_signature, reminder_ref
from otel_loopguard.metrics import MetricKind, MetricSpec, PrometheusRecorder
from otel_loopguard.policy import Action, Decision
from otel_loopguard.traces import (
    MAX_BUFFERED_SPANS,
    BadSpan,
    OtlpSpans,
    TraceBuffer,
    feed,
    otlp_json_spans,
)

from .proto import proto_spans, response_bytes

__all__ = [
    "DEFAULT_GRPC_PORT",
    "DEFAULT_HOLD_SECONDS",
    "DEFAULT_HTTP_PORT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_QUEUED_SPANS",
    "MAX_DECISION_BODY_BYTES",
    "MAX_HELD_REMINDERS",
    "SERVICE_METRICS",
    "ServeOptions",
    "Service",
    "TOKEN_ENV",
    "run_serve",
]

_log = logging.getLogger("otel_loopguard")

#: OTLP/HTTP's default port: traces, decisions, /metrics and /healthz.
DEFAULT_HTTP_PORT: Final = 4318
#: OTLP/gRPC's default port.
DEFAULT_GRPC_PORT: Final = 4317
#: Largest request body read, after decompression (the OTLP specification suggests 20 MiB);
#: larger ones get 413 (gRPC: RESOURCE_EXHAUSTED from the transport).
DEFAULT_MAX_BODY_BYTES: Final = 20 * 1024 * 1024
#: Spans accepted but not yet fed to the guard; past it requests get 429 / RESOURCE_EXHAUSTED.
DEFAULT_MAX_QUEUED_SPANS: Final = 100_000
#: Seconds a tool span waits for its ancestors when its trace's root has not arrived.
DEFAULT_HOLD_SECONDS: Final = 2.0
#: Seconds ``close`` waits for requests under way and the queue to drain.
DEFAULT_DRAIN_TIMEOUT_SECONDS: Final = 30.0
#: Largest decision request body.
MAX_DECISION_BODY_BYTES: Final = 1024 * 1024
#: Reminders held for the ``/after`` of their call (``"hold_reminder": true``); the oldest is
#: dropped beyond this.
MAX_HELD_REMINDERS: Final = 10_000
# TOKEN_ENV (LOOPGUARD_SERVE_TOKEN), read for the bearer token when --token is not given, is
# declared in otel_loopguard.hooks.remote, which sends it, and re-exported here.
#: Seconds a throttled or draining client is told to wait (``Retry-After``, gRPC RetryInfo).
RETRY_AFTER_SECONDS: Final = 1
#: Seconds an HTTP connection may stay silent (mid-request or idle keep-alive) before it is closed.
CONNECTION_TIMEOUT_SECONDS: Final = 30.0
#: Threads answering gRPC calls.
GRPC_WORKERS: Final = 8
#: gRPC calls under way at once; more are refused by gRPC with RESOURCE_EXHAUSTED.
MAX_CONCURRENT_RPCS: Final = 64
#: Open HTTP connections (one thread each); a connection beyond it is closed at once.
MAX_HTTP_CONNECTIONS: Final = 256
#: How often the ingest thread looks for tool spans that waited ``hold_seconds`` (at most).
_TICK_SECONDS: Final = 0.25
#: An oversized body up to this many times the cap is read and dropped before the 413.
_DISCARD_FACTOR: Final = 4

_GRPC_SERVICE: Final = "opentelemetry.proto.collector.trace.v1.TraceService"
_PROTOBUF: Final = "application/x-protobuf"
_JSON: Final = "application/json"
_DECISION_PATHS: Final = frozenset({"before", "after", "user_message", "new_run"})
# google.rpc.Code values used in Status bodies.
_INVALID_ARGUMENT: Final = 3
_RESOURCE_EXHAUSTED: Final = 8
_UNAUTHENTICATED: Final = 16
_UNAVAILABLE: Final = 14
_INTERNAL: Final = 13

# -- metrics of the service (the guard's own are in otel_loopguard.metrics) --------------------

OTLP_SPANS: Final = MetricSpec(
    "loopguard_otlp_spans", MetricKind.COUNTER,
    "Spans received over OTLP, by result: accepted, rejected (bad data), throttled (queue full).",
    ("result",), "{span}")
OTLP_REQUESTS: Final = MetricSpec(
    "loopguard_otlp_requests", MetricKind.COUNTER,
    "OTLP export requests, by transport (http, grpc) and outcome.", ("transport", "outcome"),
    "{request}")
TRACE_FLUSHES_EARLY: Final = MetricSpec(
    "loopguard_trace_flushes_early", MetricKind.COUNTER,
    "Tool spans judged before their trace's root arrived, by reason: time (hold_seconds passed;"
    " counted per trace flush) or capacity (max_buffered_spans; per trace).", ("reason",),
    "{flush}")
INGEST_QUEUE_SPANS: Final = MetricSpec(
    "loopguard_ingest_queue_spans", MetricKind.GAUGE,
    "Spans accepted and not yet fed to the guard.", (), "{span}")
DECISION_REQUESTS: Final = MetricSpec(
    "loopguard_decision_requests", MetricKind.COUNTER,
    "Decision API requests answered 200, by endpoint.", ("endpoint",), "{request}")
#: The service's own metrics, declared once; registered beside the guard's.
SERVICE_METRICS: Final = (OTLP_SPANS, OTLP_REQUESTS, TRACE_FLUSHES_EARLY, INGEST_QUEUE_SPANS,
                          DECISION_REQUESTS)
_OUTCOMES: Final = ("ok", "partial", "bad_request", "too_large", "throttled", "unauthorized",
                    "unsupported", "unavailable", "error")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name}: expected an integer {bound}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How ``serve`` listens and how much it holds. Bad values raise ``ValueError`` naming the
    field and the value.

    ``host``: address to bind (loopback by default); a non-loopback address needs ``token`` or
    ``insecure=True``. ``http_port``/``grpc_port``: 0 picks a free port; ``grpc_port=None``
    turns gRPC off. ``token``: bearer token every endpoint but ``/healthz`` requires.
    """

    host: str = "127.0.0.1"
    http_port: int = DEFAULT_HTTP_PORT
    grpc_port: int | None = DEFAULT_GRPC_PORT
    token: str | None = None
    insecure: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_queued_spans: int = DEFAULT_MAX_QUEUED_SPANS
    max_buffered_spans: int = MAX_BUFFERED_SPANS
    hold_seconds: float = DEFAULT_HOLD_SECONDS
    drain_timeout_seconds: float = DEFAULT_DRAIN_TIMEOUT_SECONDS
    #: "trace" (trace + agent, as the in-process processor by default) or "conversation".
    key_by: str = "trace"

    def __post_init__(self) -> None:
        if self.key_by not in ("trace", "conversation"):
            raise ValueError(f"key_by: expected 'trace' or 'conversation', got {self.key_by!r}")
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host: expected an address, got {self.host!r}")
        _check_int("http_port", self.http_port, 0, 65535)
        if self.grpc_port is not None:
            _check_int("grpc_port", self.grpc_port, 0, 65535)
        if self.token is not None and (not isinstance(self.token, str) or not self.token
                                       or any(c.isspace() for c in self.token)):
            raise ValueError("token: expected a non-empty string without spaces")
        _check_int("max_body_bytes", self.max_body_bytes, 1024)
        _check_int("max_queued_spans", self.max_queued_spans, 1)
        _check_int("max_buffered_spans", self.max_buffered_spans, 1)
        for name in ("hold_seconds", "drain_timeout_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 <= value < float("inf")):
                raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
        if not _is_loopback(self.host) and self.token is None and not self.insecure:
            raise ValueError(
                f"host: {self.host!r} is not a loopback address; binding it without a token"
                f" would let anyone send spans and read decisions. Set a token (--token or"
                f" {TOKEN_ENV}) or pass --insecure")


# -- ingest ------------------------------------------------------------------------------------


class _Ingest:
    """The bounded queue of accepted spans and the one thread that feeds them to the guard."""

    def __init__(self, guard: LoopGuard, buffer: TraceBuffer, max_queued: int,
                 hold_seconds: float) -> None:
        self._guard = guard
        self._buffer = buffer
        self._max = max_queued
        self._cond = threading.Condition()
        self._batches: deque[OtlpSpans] = deque()
        self._closing = False
        self.queued = 0
        self.processed = 0
        self.flushed_early_time = 0
        self.flushed_early_capacity = 0
        self._tick = min(_TICK_SECONDS, hold_seconds / 4) if hold_seconds > 0 else _TICK_SECONDS
        self._thread = threading.Thread(target=self._run, name="loopguard-ingest", daemon=True)
        self._thread.start()

    def offer(self, batch: OtlpSpans) -> bool:
        """Queue a batch; False when the queue is full (an oversized batch is taken only when
        the queue is empty, so any batch the body cap allows can get through) or closing."""
        size = batch.accepted
        with self._cond:
            if self._closing or (self.queued and self.queued + size > self._max):
                return False
            self._batches.append(batch)
            self.queued += size
            self._cond.notify()
        return True

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every queued span was fed to the guard; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.queued:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float) -> bool:
        """Feed what is queued, then every buffered trace; False if that took past timeout."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        buffer = self._buffer
        while True:
            with self._cond:
                if not self._batches and not self._closing:
                    self._cond.wait(self._tick)
                batch = self._batches.popleft() if self._batches else None
                done = batch is None and self._closing
            if done:
                break
            try:
                if batch is not None:
                    self._add(batch)
                self._feed(buffer.take_due())
                self.flushed_early_time = buffer.flushed_early
            except Exception as exc:  # the ingest thread must outlive any span
                self._guard.report_internal_error("serve.ingest", exc)
            finally:
                if batch is not None:
                    with self._cond:
                        self.queued -= batch.accepted
                        self.processed += batch.accepted
                        self._cond.notify_all()
        try:
            self._feed(buffer.finish())
        except Exception as exc:
            self._guard.report_internal_error("serve.ingest", exc)

    def _add(self, batch: OtlpSpans) -> None:
        buffer = self._buffer
        add_link = buffer.add_link
        for trace_id, span_id, parent_id, remote in batch.links:
            add_link(trace_id, span_id, parent_id, remote)
        add = buffer.add
        for span in batch.spans:
            add(span)
        self._feed(buffer.take_ready())
        self.flushed_early_capacity = buffer.replayed_early

    def _feed(self, events: list[Any]) -> None:
        guard = self._guard
        for event in events:
            feed(guard, event)


# -- the service -------------------------------------------------------------------------------


class _Metrics:
    """The service's counters in the guard's Prometheus registry."""

    def __init__(self, registry: Any, queue_size: Callable[[], int]) -> None:
        from prometheus_client import Counter, Gauge

        self.spans = Counter(OTLP_SPANS.name, OTLP_SPANS.description, OTLP_SPANS.labels,
                             registry=registry)
        self.requests = Counter(OTLP_REQUESTS.name, OTLP_REQUESTS.description,
                                OTLP_REQUESTS.labels, registry=registry)
        self.flushes = Counter(TRACE_FLUSHES_EARLY.name, TRACE_FLUSHES_EARLY.description,
                               TRACE_FLUSHES_EARLY.labels, registry=registry)
        self.decisions = Counter(DECISION_REQUESTS.name, DECISION_REQUESTS.description,
                                 DECISION_REQUESTS.labels, registry=registry)
        queue = Gauge(INGEST_QUEUE_SPANS.name, INGEST_QUEUE_SPANS.description, registry=registry)
        queue.set_function(queue_size)
        for result in ("accepted", "rejected", "throttled"):
            self.spans.labels(result)
        for transport in ("http", "grpc"):
            for outcome in _OUTCOMES:
                self.requests.labels(transport, outcome)
        self.flush_time = self.flushes.labels("time")
        self.flush_capacity = self.flushes.labels("capacity")
        for endpoint in sorted(_DECISION_PATHS):
            self.decisions.labels(endpoint)


class _HeldReminders:
    """Reminders decided before a call for a caller that can only show them with the call's
    result (a command hook of a host that takes no context before a call): kept under the
    session, agent and call (:func:`~otel_loopguard.hooks.runner.reminder_ref`) until the
    ``/after`` of that call takes them. The oldest is dropped beyond ``limit`` (a result that
    never came)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._texts: OrderedDict[tuple[str, str | None, str], str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._texts)

    def hold(self, key: tuple[str, str | None, str], text: str) -> None:
        with self._lock:
            self._texts.pop(key, None)
            self._texts[key] = text  # newest last
            while len(self._texts) > self._limit:
                self._texts.popitem(last=False)

    def take(self, key: tuple[str, str | None, str]) -> str | None:
        with self._lock:
            return self._texts.pop(key, None)


class Service:
    """``otel-loopguard serve`` as an object: :meth:`start` binds and serves from background
    threads, :meth:`close` drains and stops. Use it as a context manager in tests.

    ``guard``: the guard to feed (default: a new one with ``policy``, or the ``LOOPGUARD_*``
    default). Its metrics are served on ``/metrics``: a guard without a recorder gets a
    :class:`~otel_loopguard.metrics.PrometheusRecorder`. ``clock`` drives the trace hold.
    """

    def __init__(self, options: ServeOptions | None = None, *, guard: LoopGuard | None = None,
                 policy: Policy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if options is not None and not isinstance(options, ServeOptions):
            raise ValueError(f"options: expected ServeOptions, got {type(options).__name__}")
        if guard is not None and not isinstance(guard, LoopGuard):
            raise ValueError(f"guard: expected a LoopGuard, got {type(guard).__name__}")
        self.options: Final = options if options is not None else ServeOptions()
        if guard is None:
            guard = LoopGuard(policy, recorder=PrometheusRecorder())
        elif not isinstance(guard.recorder, PrometheusRecorder):
            guard.metrics_wsgi_app()  # installs a PrometheusRecorder when it has none
        self.guard: Final = guard
        recorder = guard.recorder
        if not isinstance(recorder, PrometheusRecorder):
            raise ValueError("guard: its recorder has no Prometheus registry to serve")
        self._recorder = recorder
        self._clock = clock
        self._ingest: _Ingest | None = None
        self._http: _HTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._grpc: Any = None
        self._closing = False
        self._closed = False
        self._inflight = 0
        self._inflight_lock = threading.Condition()
        self.http_port = 0
        self.grpc_port: int | None = None
        self.metrics = _Metrics(recorder.registry, lambda: self.queued_spans)
        self._flushes_synced = [0, 0]
        self._held = _HeldReminders(MAX_HELD_REMINDERS)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Service:
        """Bind the ports and serve. Raises ``OSError`` when a port cannot be bound (nothing
        is left running then)."""
        options = self.options
        buffer = TraceBuffer(options.max_buffered_spans, key_by=options.key_by,
                             hold_seconds=options.hold_seconds,
                             clock=self._clock)
        self._ingest = _Ingest(self.guard, buffer, options.max_queued_spans,
                               options.hold_seconds)
        try:
            server_class = _HTTPServer6 if ":" in options.host else _HTTPServer
            self._http = server_class((options.host.strip("[]"), options.http_port), _Handler)
            self._http.service = self
            self.http_port = int(self._http.server_address[1])
            if options.grpc_port is not None:
                self._start_grpc(options)
        except BaseException:
            self._stop_listeners(0)
            self._ingest.close(5)
            raise
        self._http_thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.1},
            name="loopguard-http", daemon=True)
        self._http_thread.start()
        return self

    def _start_grpc(self, options: ServeOptions) -> None:
        import grpc

        server = grpc.server(
            ThreadPoolExecutor(max_workers=GRPC_WORKERS, thread_name_prefix="loopguard-grpc"),
            options=[("grpc.max_receive_message_length", options.max_body_bytes),
                     ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
        )
        handler = grpc.method_handlers_generic_handler(_GRPC_SERVICE, {
            # No deserializer: the handler gets the request bytes (see proto.proto_spans).
            "Export": grpc.unary_unary_rpc_method_handler(self._grpc_export),
        })
        server.add_generic_rpc_handlers((handler,))
        host = options.host if ":" not in options.host.strip("[]") else (
            f"[{options.host.strip('[]')}]")
        port = server.add_insecure_port(f"{host}:{options.grpc_port}")
        if port == 0:
            raise OSError(f"cannot bind gRPC on {host}:{options.grpc_port}")
        self._grpc = server
        self.grpc_port = port
        server.start()

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
        self._sync_flush_metrics()
        return drained

    def _stop_listeners(self, grace: float) -> bool:
        stopped = True
        if self._grpc is not None:
            stopped = bool(self._grpc.stop(grace).wait(grace + 1))
        if self._http is not None:
            if self._http_thread is not None:
                self._http.shutdown()
            self._http.server_close()
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
        urls = {"http": f"http://{shown}:{self.http_port}"}
        if self.grpc_port is not None:
            urls["grpc"] = f"{shown}:{self.grpc_port}"
        return urls

    def _sync_flush_metrics(self) -> None:
        """Bring the early-flush counters up to the ingest thread's counts (read at scrape)."""
        ingest = self._ingest
        if ingest is None:
            return
        with self._inflight_lock:
            for index, (child, value) in enumerate((
                    (self.metrics.flush_time, ingest.flushed_early_time),
                    (self.metrics.flush_capacity, ingest.flushed_early_capacity))):
                if value > self._flushes_synced[index]:
                    child.inc(value - self._flushes_synced[index])
                    self._flushes_synced[index] = value

    # -- request handling shared by both transports ----------------------------------------

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` value carries the token (always, without a token)."""
        token = self.options.token
        if token is None:
            return True
        if not header:
            return False
        return hmac.compare_digest(header.encode(), f"Bearer {token}".encode())

    def accept(self, read: OtlpSpans, transport: str) -> tuple[str, str]:
        """Queue the spans of one request: ``(outcome, message)`` with outcome ``ok``,
        ``partial``, ``bad_request`` (nothing usable) or ``throttled`` (queue full)."""
        metrics = self.metrics
        if read.bad_spans:
            metrics.spans.labels("rejected").inc(read.bad_spans)
        message = "; ".join(read.problems)
        if read.bad_spans and not read.accepted:
            return "bad_request", message or "no usable span"
        if read.accepted:
            if self._closing or self._ingest is None:
                metrics.spans.labels("throttled").inc(read.accepted)
                return "unavailable", "shutting down"
            if not self._ingest.offer(read):
                metrics.spans.labels("throttled").inc(read.accepted)
                return "throttled", (f"ingest queue full ({self.options.max_queued_spans:,}"
                                     f" spans); retry after {RETRY_AFTER_SECONDS} s")
            metrics.spans.labels("accepted").inc(read.accepted)
        return ("partial" if read.bad_spans else "ok"), message

    def _grpc_export(self, request: bytes, context: Any) -> bytes:
        """OTLP/gRPC ``TraceService/Export`` on a gRPC worker thread; raw bytes in and out."""
        import grpc

        outcome, message, answer = "error", "internal error", b""
        try:
            outcome, message, answer = self._grpc_answer(request, context)
        except Exception as exc:
            self.guard.report_internal_error("serve.grpc", exc)
        self.metrics.requests.labels("grpc", outcome).inc()
        if outcome in ("ok", "partial"):
            return answer
        if outcome in ("throttled", "unavailable"):
            context.set_trailing_metadata(_retry_metadata(message))
        code = {
            "unauthorized": grpc.StatusCode.UNAUTHENTICATED,
            "bad_request": grpc.StatusCode.INVALID_ARGUMENT,
            "throttled": grpc.StatusCode.RESOURCE_EXHAUSTED,
            "unavailable": grpc.StatusCode.UNAVAILABLE,
        }.get(outcome, grpc.StatusCode.INTERNAL)
        context.abort(code, message)  # raises
        return b""  # pragma: no cover

    def _grpc_answer(self, request: bytes, context: Any) -> tuple[str, str, bytes]:
        metadata = dict(context.invocation_metadata())
        if not self.authorized(metadata.get("authorization")):
            return "unauthorized", "missing or wrong bearer token", b""
        try:
            read = proto_spans(request)
        except BadSpan as exc:
            return "bad_request", str(exc), b""
        outcome, message = self.accept(read, "grpc")
        if outcome in ("ok", "partial"):
            return outcome, message, response_bytes(read.bad_spans, message)
        return outcome, message, b""

    def decide(self, endpoint: str, payload: object) -> dict[str, object]:
        """One decision API call; raises ``ValueError`` naming a bad field."""
        if not isinstance(payload, dict):
            raise ValueError("expected a JSON object")
        session = _text(payload, "session", required=True)
        agent = _text(payload, "agent")
        guard = self.guard
        if endpoint == "user_message":
            guard.user_message(session, agent=agent)
            return {}
        if endpoint == "new_run":
            guard.new_run(session, agent=agent)
            return {}
        tool = _text(payload, "tool", required=True)
        arguments = payload.get("arguments", {})
        call_id = _text(payload, "call_id")
        if endpoint == "before":
            hold = payload.get("hold_reminder", False)
            if not isinstance(hold, bool):
                raise ValueError(f"'hold_reminder' must be true or false, got {hold!r}")
            before = guard.before_tool(tool, arguments, session=session, agent=agent,
                                       call_id=call_id)
            if hold and before.action is Action.REMIND:
                self._held.hold((session, agent, reminder_ref(call_id, before.signature)),
                                before.message)
            return {"decision": decision_json(before)}
        error = payload.get("error", False)
        if error is not None and not isinstance(error, bool):
            raise ValueError(f"'error' must be true, false or null, got {error!r}")
        duration = payload.get("duration_seconds")
        if duration is not None and (isinstance(duration, bool)
                                     or not isinstance(duration, (int, float))
                                     or not 0 <= duration < float("inf")):
            raise ValueError(f"'duration_seconds' must be a number >= 0, got {duration!r}")
        decision = guard.after_tool(
            tool, arguments, session=session, agent=agent, call_id=call_id, error=error,
            result=payload.get("result"),
            duration_seconds=None if duration is None else float(duration))
        if decision is None:  # counted by before: a reminder may be waiting for this result
            held = None
            if len(self._held):
                signature = (None if call_id is not None
                             else call_signature(tool, arguments, guard.policy))
                held = self._held.take((session, agent, reminder_ref(call_id, signature)))
            return {"decision": None, "reminder": held} if held else {"decision": None}
        answer: dict[str, object] = {"decision": decision_json(decision)}
        shown = after_the_fact(decision, arguments, guard.policy)  # the call already ran
        if shown.action is Action.REMIND:
            answer["reminder"] = shown.message
        return answer

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


def decision_json(decision: Decision) -> dict[str, object]:
    """A decision as the decision API returns it."""
    return {
        "action": decision.action.value,
        "blocks": decision.blocks,
        "message": decision.message,
        "rule": decision.rule.value if decision.rule is not None else None,
        "count": decision.count,
        "threshold": decision.threshold,
        "signature": decision.signature,
        "tool": decision.tool,
        "session": decision.session,
        "repeated": decision.repeated,
        "detected": decision.detected.value,
    }


def _text(payload: Mapping[str, object], name: str, required: bool = False) -> Any:
    value = payload.get(name)
    if value is None:
        if required:
            raise ValueError(f"missing field {name!r}")
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name!r} must be a non-empty string, got {value!r}")
    return value


def _retry_metadata(message: str) -> tuple[tuple[str, bytes], ...]:
    """Trailing metadata carrying a retry delay: as the Python exporter reads it
    (``google.rpc.retryinfo-bin``) and as the Collector reads it (in the status details)."""
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2

    info = error_details_pb2.RetryInfo()
    info.retry_delay.seconds = RETRY_AFTER_SECONDS
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=_RESOURCE_EXHAUSTED, message=message, details=[detail])
    return (("google.rpc.retryinfo-bin", info.SerializeToString()),
            ("grpc-status-details-bin", status.SerializeToString()))


def _status_body(code: int, message: str, as_json: bool) -> bytes:
    """A ``google.rpc.Status`` in the request's encoding."""
    if as_json:
        return orjson.dumps({"code": code, "message": message})
    from google.rpc import status_pb2

    return bytes(status_pb2.Status(code=code, message=message).SerializeToString())


# -- HTTP --------------------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    service: Service

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self._connections = threading.BoundedSemaphore(MAX_HTTP_CONNECTIONS)
        # The semaphore each open connection took its slot from: it gives the slot back to that
        # one even if the bound was changed meanwhile.
        self._slots: dict[Any, threading.BoundedSemaphore] = {}
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Each connection holds a thread while open: bound them (a silent one times out).
        slots = self._connections
        if not slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        self._slots[request] = slots
        try:
            super().process_request(request, client_address)
        except BaseException:
            if self._slots.pop(request, None) is not None:
                slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            slots = self._slots.pop(request, None)
            if slots is not None:
                slots.release()


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class _Reject(Exception):
    """Answer the request with ``status`` and stop reading it."""

    def __init__(self, status: int, code: int, message: str, outcome: str,
                 close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.outcome = outcome
        self.close = close


class _Handler(BaseHTTPRequestHandler):
    """One HTTP connection (keep-alive); its thread handles its requests one after another."""

    protocol_version = "HTTP/1.1"
    server_version = "otel-loopguard"
    timeout = CONNECTION_TIMEOUT_SECONDS
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        try:  # answers go out in one write; no Nagle delay on small ones
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("serve: %s - %s", self.address_string(), format % args)

    # -- routing -----------------------------------------------------------------------------

    def do_GET(self) -> None:
        service = self.server.service
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            status = 503 if service.closing else 200
            self._send(status, orjson.dumps({"status": "draining" if status == 503 else "ok"}),
                       _JSON)
            return
        if not service.authorized(self.headers.get("Authorization")):
            self._unauthorized(False)
            return
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            service._sync_flush_metrics()
            self._send(200, generate_latest(service._recorder.registry), CONTENT_TYPE_LATEST)
            return
        self._send(404, orjson.dumps({"error": f"no such endpoint: GET {path}"}), _JSON)

    def do_POST(self) -> None:
        service = self.server.service
        path = self.path.split("?", 1)[0]
        service.enter_request()
        try:
            if path == "/v1/traces":
                self._traces(service)
            elif path.startswith("/v1/decisions/") and path[14:] in _DECISION_PATHS:
                self._decision(service, path[14:])
            else:
                self.close_connection = True  # its body is left unread
                self._send(404, orjson.dumps({"error": f"no such endpoint: POST {path}"}),
                           _JSON)
        except Exception as exc:  # never let one request take the server down
            service.guard.report_internal_error("serve.http", exc)
            self.close_connection = True
            try:
                self._send(500, orjson.dumps({"error": "internal error"}), _JSON)
            except OSError:
                pass
        finally:
            service.leave_request()

    def do_PUT(self) -> None:
        self._not_allowed()

    do_DELETE = do_PATCH = do_PUT

    def _not_allowed(self) -> None:
        self.close_connection = True
        self._send(405, orjson.dumps({"error": f"method {self.command} not allowed"}), _JSON,
                   {"Allow": "GET, POST"})

    # -- OTLP/HTTP ---------------------------------------------------------------------------

    def _traces(self, service: Service) -> None:
        kind = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        as_json = kind != _PROTOBUF  # answers in the request's type; JSON when it has none we know
        outcome = "error"
        counted = False  # each request is counted once, before its answer goes out

        def count(result: str) -> None:
            nonlocal counted
            service.metrics.requests.labels("http", result).inc()
            counted = True

        try:
            if not service.authorized(self.headers.get("Authorization")):
                count("unauthorized")
                self._unauthorized(as_json)
                return
            if kind not in (_PROTOBUF, _JSON):
                raise _Reject(415, _INVALID_ARGUMENT,
                              f"unsupported Content-Type {kind or '(none)'!r}: send"
                              f" {_PROTOBUF} or {_JSON}", "unsupported", close=True)
            body = self._read_body(service.options.max_body_bytes)
            body = self._decoded(body, service.options.max_body_bytes)
            read = self._spans(body, as_json)
            outcome, message = service.accept(read, "http")
            if outcome == "bad_request":
                raise _Reject(400, _INVALID_ARGUMENT, message, outcome)
            if outcome in ("throttled", "unavailable"):
                raise _Reject(429 if outcome == "throttled" else 503,
                              _RESOURCE_EXHAUSTED if outcome == "throttled" else _UNAVAILABLE,
                              message, outcome)
            count(outcome)
            if as_json:
                answer: dict[str, object] = {}
                if read.bad_spans:
                    answer["partialSuccess"] = {"rejectedSpans": str(read.bad_spans),
                                                "errorMessage": message}
                self._send(200, orjson.dumps(answer), _JSON)
            else:
                self._send(200, response_bytes(read.bad_spans, message), _PROTOBUF)
        except _Reject as reject:
            count(reject.outcome)
            if reject.close:
                self.close_connection = True
            headers = {}
            if reject.status in (429, 503):
                headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
            self._send(reject.status, _status_body(reject.code, reject.message, as_json),
                       _JSON if as_json else _PROTOBUF, headers)
        finally:
            if not counted:
                count(outcome)

    def _read_body(self, limit: int) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise _Reject(411, _INVALID_ARGUMENT, "chunked bodies are not accepted: send"
                          " Content-Length", "bad_request", close=True)
        text = self.headers.get("Content-Length")
        if text is None:
            raise _Reject(411, _INVALID_ARGUMENT, "Content-Length is required", "bad_request",
                          close=True)
        try:
            length = int(text)
            if length < 0:
                raise ValueError
        except ValueError:
            raise _Reject(400, _INVALID_ARGUMENT, f"bad Content-Length {text!r}",
                          "bad_request", close=True) from None
        if length > limit:
            # Read a moderately oversized body away so the client can read the answer (a
            # client still sending when we close gets a reset, not our 413); hang up on a huge one.
            drained = length <= _DISCARD_FACTOR * limit and self._discard(length)
            raise _Reject(413, _INVALID_ARGUMENT,
                          f"body of {length:,} bytes is larger than {limit:,}", "too_large",
                          close=not drained)
        body = self.rfile.read(length)
        if len(body) != length:
            raise _Reject(400, _INVALID_ARGUMENT, "body shorter than Content-Length",
                          "bad_request", close=True)
        return body

    def _discard(self, length: int) -> bool:
        left = length
        while left:
            chunk = self.rfile.read(min(left, 1 << 20))
            if not chunk:
                return False
            left -= len(chunk)
        return True

    def _decoded(self, body: bytes, limit: int) -> bytes:
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding == "identity":
            return body
        if encoding != "gzip":
            raise _Reject(415, _INVALID_ARGUMENT,
                          f"unsupported Content-Encoding {encoding!r}: send gzip or none",
                          "unsupported")
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise _Reject(400, _INVALID_ARGUMENT, f"not valid gzip ({exc})",
                          "bad_request") from None
        if len(out) > limit:
            raise _Reject(413, _INVALID_ARGUMENT,
                          f"body inflates to more than {limit:,} bytes", "too_large")
        if not inflater.eof:
            raise _Reject(400, _INVALID_ARGUMENT, "gzip body is truncated", "bad_request")
        return out

    @staticmethod
    def _spans(body: bytes, as_json: bool) -> OtlpSpans:
        try:
            if not as_json:
                return proto_spans(body)
            try:
                record = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise BadSpan(f"not valid JSON ({exc})") from None
            if not isinstance(record, dict):
                raise BadSpan(f"expected a JSON object (an ExportTraceServiceRequest), got"
                              f" {type(record).__name__}")
            return otlp_json_spans(record)
        except BadSpan as exc:
            raise _Reject(400, _INVALID_ARGUMENT, str(exc), "bad_request") from None

    # -- decisions ---------------------------------------------------------------------------

    def _decision(self, service: Service, endpoint: str) -> None:
        if not service.authorized(self.headers.get("Authorization")):
            self._unauthorized(True)
            return
        try:
            body = self._read_body(MAX_DECISION_BODY_BYTES)
            try:
                payload = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise _Reject(400, _INVALID_ARGUMENT, f"not valid JSON ({exc})",
                              "bad_request") from None
            try:
                answer = service.decide(endpoint, payload)
            except ValueError as exc:
                raise _Reject(400, _INVALID_ARGUMENT, str(exc), "bad_request") from None
        except _Reject as reject:
            if reject.close:
                self.close_connection = True
            self._send(reject.status, orjson.dumps({"error": reject.message}), _JSON)
            return
        service.metrics.decisions.labels(endpoint).inc()
        self._send(200, orjson.dumps(answer), _JSON)

    # -- writing -----------------------------------------------------------------------------

    def _unauthorized(self, as_json: bool) -> None:
        self.close_connection = True  # the body, if any, is left unread
        self._send(401, _status_body(_UNAUTHENTICATED, "missing or wrong bearer token", True),
                   _JSON, {"WWW-Authenticate": 'Bearer realm="otel-loopguard"'})

    def _send(self, status: int, body: bytes, content_type: str,
              headers: Mapping[str, str] | None = None) -> None:
        """The whole answer in one write (status line, headers and body)."""
        reason = self.responses.get(status, ("",))[0]
        lines = [f"{self.protocol_version} {status} {reason}",
                 f"Server: {self.version_string()}",
                 f"Date: {self.date_time_string()}",
                 f"Content-Type: {content_type}",
                 f"Content-Length: {len(body)}"]
        lines.extend(f"{name}: {value}" for name, value in (headers or {}).items())
        if self.close_connection:
            lines.append("Connection: close")
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        self.log_request(status)


# -- command line ------------------------------------------------------------------------------


def run_serve(options: ServeOptions, policy: Policy, *, stderr: TextIO | None = None,
              ready: Callable[[Service], None] | None = None) -> int:
    """Serve until SIGINT or SIGTERM, then drain and stop; return the exit status (0, or 1
    when draining did not finish in time). ``OSError`` when a port cannot be bound."""
    err = stderr if stderr is not None else sys.stderr
    stop = threading.Event()
    service = Service(options, policy=policy).start()
    previous: dict[signal.Signals, Any] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
        except ValueError:  # not the main thread (tests): the caller stops us another way
            pass
    urls = service.urls
    grpc_text = f"; OTLP/gRPC on {urls['grpc']}" if "grpc" in urls else ""
    err.write(f"otel-loopguard serve: OTLP/HTTP, decisions and /metrics on {urls['http']}"
              f"{grpc_text}; mode {policy.mode.value}"
              f"{'; bearer token required' if options.token else ''} (pid {os.getpid()})\n")
    err.flush()
    if ready is not None:
        ready(service)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        err.write("otel-loopguard serve: stopping; draining accepted spans\n")
        err.flush()
        drained = service.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    err.write("otel-loopguard serve: stopped\n" if drained else
              "otel-loopguard serve: stopped before everything was drained\n")
    return 0 if drained else 1
