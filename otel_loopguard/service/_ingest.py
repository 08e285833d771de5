"""The ingest side of ``serve``: the bounded queue of accepted spans and the one thread that owns
the :class:`~otel_loopguard._traces.TraceBuffer` and feeds the guard.

The ingest thread adds each batch, takes the traces whose root arrived (and, on a short tick,
the tool spans that waited ``hold_seconds``), and feeds their events to the guard with
:func:`~otel_loopguard._trace_events.feed`, as the in-process span processor calls it; a batch of
coding agents' tool events (OTLP logs, :class:`~._otlp_logs.LogCalls`) is fed as it comes, each
a call that already ran; each decision is logged (:func:`~._logs.log_decision`). Every
:data:`EXPIRE_INTERVAL_SECONDS` it also drops the guard's idle sessions
(:meth:`~otel_loopguard._guard.LoopGuard.expire_idle_sessions`), so memory and
``loopguard_sessions`` follow the TTL on a quiet server too.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Final, Protocol

import xxhash

from otel_loopguard._guard import LoopGuard
from otel_loopguard._otlp_json import OtlpSpans
from otel_loopguard._policy import Action
from otel_loopguard._trace_events import CallObserved, RunStarted, TraceEvent, feed
from otel_loopguard._traces import TraceBuffer

from ._durable import ServiceClock
from ._logs import decision_fields, log_decision, wants_allow_lines
from ._otlp_logs import LogCalls

__all__ = ["EXPIRE_INTERVAL_SECONDS", "Ingest", "Logged"]

#: How often the ingest thread looks for tool spans that waited ``hold_seconds`` (at most).
_TICK_SECONDS: Final = 0.25
#: How often the ingest thread drops the guard's sessions idle past ``session_ttl_seconds``
#: (calls do so on their own only when calls come; a quiet server would keep them).
EXPIRE_INTERVAL_SECONDS: Final = 1.0
#: Coding agents' tool events remembered by session and call id, so that an exporter's retry of
#: a log batch counts once (the oldest are forgotten first).
MAX_SEEN_LOG_CALLS: Final = 65_536


class Logged(Protocol):
    """What the ingest thread needs of ``serve --state-dir``: the service's clock (pinned to a
    batch's logged time while the batch is added, to a tick's while it judges) and a way to log
    a tick (``TICK``: its time, the last batch added, whether idle sessions were dropped) and
    wait until it is synced."""

    @property
    def clock(self) -> ServiceClock: ...

    def tick(self, when: float, after_batch: int, expire: bool) -> None: ...


class Ingest:
    """The bounded queue of accepted spans and the one thread that feeds them to the guard."""

    def __init__(
        self,
        guard: LoopGuard,
        buffer: TraceBuffer,
        max_queued: int,
        hold_seconds: float,
        on_pause: Callable[[], None] | None = None,
        logged: Logged | None = None,
    ) -> None:
        self._guard = guard
        self._buffer = buffer
        self._max = max_queued
        self._cond = threading.Condition()
        self._batches: deque[tuple[OtlpSpans, int, float]] = deque()
        # Called by the ingest thread between batches (serve --state-dir: a snapshot may be due).
        self._on_pause = on_pause
        self._logged = logged
        self._last_batch = 0  # the sequence number of the last batch added (--state-dir)
        self._quiet = False
        self._closing = False
        self.queued = 0
        self.processed = 0
        self.flushed_early_time = 0
        self.flushed_early_capacity = 0
        self.agents_lost = 0
        self.duplicates = 0
        #: Log records' tool calls dropped as already fed (a retried batch).
        self.duplicate_calls = 0
        self._seen_calls: OrderedDict[int, None] = OrderedDict()
        self._next_expiry = time.monotonic() + EXPIRE_INTERVAL_SECONDS
        self._tick = min(_TICK_SECONDS, hold_seconds / 4) if hold_seconds > 0 else _TICK_SECONDS
        self._thread = threading.Thread(target=self._run, name="loopguard-ingest", daemon=True)

    def start(self) -> None:
        """Start the ingest thread (after :meth:`replay`, if any)."""
        self._thread.start()

    def replay(self, batch: OtlpSpans, seq: int) -> None:
        """On the caller's thread, before :meth:`start`, with the clock at the batch's logged
        time: add a logged batch again as the ingest thread did, without logging its decisions
        (``serve --state-dir`` after a restart)."""
        self._quiet = True
        try:
            self._add(batch)
            self._last_batch = seq
        finally:
            self._quiet = False

    def replay_tick(self, expire: bool) -> None:
        """On the caller's thread, with the clock at the tick's logged time: judge what the
        hold timer judged then (and drop the idle sessions, when it did), quietly."""
        self._quiet = True
        try:
            self._feed(self._buffer.take_due())
            if expire:
                self._guard.expire_idle_sessions()
        finally:
            self._quiet = False

    def first_queued_seq(self) -> int | None:
        """The sequence number of the oldest batch still queued (None when none is)."""
        with self._cond:
            return self._batches[0][1] if self._batches else None

    def offer(self, batch: OtlpSpans, seq: int = 0, when: float = 0.0) -> bool:
        """Queue a batch (``seq`` and ``when``: its frame in the state directory's log, whose
        time it is added at); False when the queue is full (an oversized batch is taken only
        when the queue is empty, so any batch the body cap allows can get through) or
        closing."""
        size = batch.accepted
        with self._cond:
            if self._closing or (self.queued and self.queued + size > self._max):
                return False
            self._batches.append((batch, seq, when))
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
        if not self._thread.is_alive() and self._thread.ident is None:
            self._thread.start()  # never started (a failed start): it only drains
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        buffer = self._buffer
        while True:
            with self._cond:
                if not self._batches and not self._closing:
                    self._cond.wait(self._tick)
                item = self._batches.popleft() if self._batches else None
                done = item is None and self._closing
            if done:
                break
            try:
                logged = self._logged
                if logged is None:
                    if item is not None:
                        self._add(item[0])
                    self._feed(buffer.take_due())
                    if self._expiry_due():
                        self._guard.expire_idle_sessions()
                else:
                    if item is not None:
                        with logged.clock.pinned_here(item[2]):
                            self._add(item[0])
                        self._last_batch = item[1]
                    self._logged_tick(logged)
                self.flushed_early_time = buffer.flushed_early_time
                self.agents_lost = buffer.agents_lost
                self.duplicates = buffer.duplicate_spans
            except Exception as exc:  # the ingest thread must outlive any span
                self._guard.report_internal_error("serve.ingest", exc)
            finally:
                if item is not None:
                    with self._cond:
                        self.queued -= item[0].accepted
                        self.processed += item[0].accepted
                        self._cond.notify_all()
            if self._on_pause is not None:
                try:
                    self._on_pause()
                except Exception as exc:
                    self._guard.report_internal_error("serve.state", exc)
        try:
            self._feed(buffer.finish())
        except Exception as exc:
            self._guard.report_internal_error("serve.ingest", exc)

    def _expiry_due(self) -> bool:
        now = time.monotonic()
        if now < self._next_expiry:
            return False
        self._next_expiry = now + EXPIRE_INTERVAL_SECONDS
        return True

    def _logged_tick(self, logged: Logged) -> None:
        """The hold timer and the session TTL at one time, logged (``TICK``) when they changed
        anything, before the guard is fed: a restart judges the same spans at the same time,
        between the same batches."""
        buffer = self._buffer
        clock = logged.clock
        now = clock()
        expire = self._expiry_due()
        with clock.pinned_here(now):
            before = (buffer.flushed_early_time, buffer.buffered_traces, buffer.buffered_spans)
            events = buffer.take_due()
            expired = self._guard.expire_idle_sessions() if expire else 0
            after = (buffer.flushed_early_time, buffer.buffered_traces, buffer.buffered_spans)
            if events or expired or after != before:
                logged.tick(now, self._last_batch, expire)
            self._feed(events)

    def _add(self, batch: OtlpSpans) -> None:
        if isinstance(batch, LogCalls):
            # Coding agents' tool events (OTLP logs): calls that already ran, fed in order.
            self._feed(self._fresh(batch.calls), "log")
            return
        buffer = self._buffer
        buffer.add_links(batch.links)
        add = buffer.add
        for span in batch.spans:
            add(span)
        self._feed(buffer.take_ready())
        self.flushed_early_capacity = buffer.flushed_early_capacity

    def _fresh(self, calls: list[CallObserved]) -> list[TraceEvent]:
        """The calls not fed before (by session and call id), remembered now."""
        seen = self._seen_calls
        fresh: list[TraceEvent] = []
        for call in calls:
            if call.call_id is not None:
                mark = xxhash.xxh3_64_intdigest(f"{call.session}\0{call.call_id}".encode())
                if mark in seen:
                    seen.move_to_end(mark)
                    self.duplicate_calls += 1
                    continue
                seen[mark] = None
                if len(seen) > MAX_SEEN_LOG_CALLS:
                    seen.popitem(last=False)
            fresh.append(call)
        return fresh

    def seen_log_calls(self) -> list[int]:
        """The log calls remembered, oldest first (for a snapshot: on the ingest thread between
        batches, or with it stopped)."""
        return list(self._seen_calls)

    def restore_seen_log_calls(self, marks: list[int]) -> None:
        """Take :meth:`seen_log_calls` back (before :meth:`start`)."""
        self._seen_calls = OrderedDict((int(mark), None) for mark in marks[-MAX_SEEN_LOG_CALLS:])

    def _feed(self, events: list[TraceEvent], source: str = "span") -> None:
        guard = self._guard
        allows = wants_allow_lines()
        quiet = self._quiet
        for event in events:
            decision = feed(guard, event)
            if (
                not quiet
                and decision is not None
                and (allows or decision.detected is not Action.ALLOW)
                and not isinstance(event, RunStarted)
            ):
                span = event.span
                log_decision(
                    decision_fields(
                        source,
                        decision,
                        event.session,
                        event.agent,
                        event.tool,
                        None if span is None else (span.trace_id, span.span_id),
                    )
                )
