"""``serve --state-dir`` coming back (:mod:`._durable`): the snapshot taken in, the log records
it does not cover applied again in the ingest thread's order on each record's clock (the advisor
answering from the log), and the snapshots taken between batches. A base class of
:class:`~._service.Service`, which owns the state it declares."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from otel_loopguard._guard import LoopGuard
from otel_loopguard._traces import TraceBuffer

from ._decisions import DecisionAPI
from ._durable import (
    ADVICE,
    BATCH,
    DECISION,
    SNAPSHOT_INTERVAL_SECONDS,
    SNAPSHOT_LOG_BYTES,
    SNAPSHOT_VERSION,
    TICK,
    Gate,
    Record,
    ServiceClock,
    StateDir,
    StateError,
    batch_of,
    note,
)
from ._ingest import Ingest
from ._metrics import ServiceMetrics

__all__ = ["Recovery"]


class Recovery:
    """The service's state directory: recovery and snapshots (see the module)."""

    guard: LoopGuard
    metrics: ServiceMetrics
    _clock: Callable[[], float]
    _ingest: Ingest | None
    _decisions: DecisionAPI
    _state: StateDir | None
    _gate: Gate
    _buffer: TraceBuffer | None
    _next_snapshot: float
    _snapshot_covered: int

    def _recover(self, directory: str) -> None:
        """Open the state directory, load its snapshot, apply its log again, and snapshot."""
        state = StateDir(directory, on_error=self._state_write_failed)
        self._state = state
        try:
            recovered = state.recover()
        except OSError as exc:
            raise StateError(f"state_dir: cannot read {str(state.path)!r}: {exc}") from None
        for text in recovered.notes:
            note(text)
        if recovered.damaged:
            self.metrics.state_errors.labels("damaged").inc(recovered.damaged)
        snapshot = recovered.snapshot
        if snapshot is not None:
            try:
                self._restore(snapshot)
            except Exception as exc:  # not a snapshot of this version: damaged
                note(state.set_aside_snapshot(exc))
                snapshot = None
        replayed = self._replay(recovered.records, snapshot)
        guard = self.guard
        if guard.advisor is not None:
            guard.advisor = _RecordingAdvisor(guard.advisor, self)
        try:
            state.open_log(recovered.next_seq)
        except OSError as exc:
            raise StateError(f"state_dir: cannot write in {str(state.path)!r}: {exc}") from None
        self._snapshot()
        self._next_snapshot = time.monotonic() + SNAPSHOT_INTERVAL_SECONDS
        if recovered.records or snapshot is not None:
            note(
                f"{str(state.path)!r}: loaded {'a snapshot and ' if snapshot else ''}"
                f"{len(recovered.records):,} log records ({replayed:,} applied again)"
            )

    def _restore(self, snapshot: Mapping[str, Any]) -> None:
        """Take a snapshot's state (:meth:`_snapshot`) into the guard, the held reminders and
        the trace buffer; ``ValueError`` naming what is wrong, with nothing taken."""
        buffer = self._buffer
        assert buffer is not None
        version = snapshot.get("version")
        if version != SNAPSHOT_VERSION:
            raise ValueError(
                f"service snapshot: unknown version {version!r} (this is {SNAPSHOT_VERSION})"
            )
        held = OrderedDict()
        for entry in snapshot["held"]:
            session, agent, signature, text = entry
            held[(str(session), None if agent is None else str(agent), str(signature))] = str(text)
        guard = self.guard
        blank = guard.snapshot()
        guard.restore(snapshot["guard"])
        try:
            when = snapshot.get("time")
            clock = self._clock
            assert isinstance(clock, ServiceClock)
            with clock.pinned_here(when if isinstance(when, float) else clock()):
                buffer.restore(snapshot["buffer"])
        except Exception:
            guard.restore(blank)
            raise
        self._decisions.held.restore(held)
        ingest = self._ingest
        assert ingest is not None
        ingest.restore_seen_log_calls(list(snapshot.get("log_calls", ())))

    def _replay(self, records: list[Record], snapshot: Mapping[str, Any] | None) -> int:
        """Apply again the log records a snapshot does not cover (:func:`_replay_order`), on
        the clock of each, with the advisor answering from the log
        (:meth:`LoopGuard.replaying`); how many."""
        answers: dict[str, deque[str | None]] = {}
        for record in records:
            if record.kind == ADVICE:
                advice = orjson.loads(record.payload)
                answers.setdefault(advice["key"], deque()).append(advice["answer"])
        due = _replay_order(
            records,
            snapshot["batches"] if snapshot is not None else 0,
            snapshot["covered"] if snapshot is not None else 0,
        )
        clock = self._clock
        assert isinstance(clock, ServiceClock)
        guard = self.guard
        failed = 0
        problem = ""
        with guard.replaying(_ReplayAdvisor(answers)):
            try:
                for record in due:
                    clock.pin(record.time)
                    try:
                        self._apply(record)
                    except Exception as exc:  # one bad record must not keep the service down
                        failed += 1
                        problem = problem or f"record {record.seq}: {type(exc).__name__}: {exc}"
                        guard.report_internal_error("serve.state", exc)
                guard.close(wait=True)  # replayed asks: their advice settles before going on
            finally:
                clock.pin(None)
        if failed:
            note(f"{failed:,} log records could not be applied again (first: {problem})")
        return len(due)

    def _apply(self, record: Record) -> None:
        """Apply one logged batch, tick or decision call again."""
        ingest = self._ingest
        assert ingest is not None
        if record.kind == BATCH:
            ingest.replay(batch_of(record.payload), record.seq)
            return
        if record.kind == TICK:
            tick = orjson.loads(record.payload)
            ingest.replay_tick(bool(tick["expire"]))
            return
        call = orjson.loads(record.payload)
        try:
            self._decisions.decide(call["endpoint"], call["body"])
        except ValueError:
            pass  # answered 400 then too

    def _checkpoint(self) -> None:
        """On the ingest thread, between batches: a snapshot when one is due."""
        state = self._state
        if state is None:
            return
        now = time.monotonic()
        if now < self._next_snapshot and state.log_bytes < SNAPSHOT_LOG_BYTES:
            return
        if state.appended == self._snapshot_covered:
            self._next_snapshot = now + SNAPSHOT_INTERVAL_SECONDS
            return
        if self._snapshot(wait=0.05):
            self._next_snapshot = now + SNAPSHOT_INTERVAL_SECONDS

    def _snapshot(self, wait: float = 5.0) -> bool:
        """Write a snapshot (on the ingest thread between batches, or with it stopped): False
        when decisions kept the gate for ``wait`` seconds, or it could not be written.

        It covers every frame logged so far (decisions and advice: none is half applied while
        the gate is held) but the batches still queued: the first of those is where a restart
        starts adding batches again."""
        state = self._state
        assert state is not None and self._buffer is not None and self._ingest is not None
        buffer = self._buffer
        with self._gate.exclusive(wait) as got:
            if not got:
                return False
            covered, queued = state.covered(self._ingest.first_queued_seq)
            batches = covered if queued is None else queued - 1
            guard = self.guard.snapshot()
            held = [[*key, text] for key, text in self._decisions.held.saved().items()]
            seen_calls = self._ingest.seen_log_calls()
        # The trace buffer after the gate: decisions never touch it, and only this thread (the
        # ingest thread, or a stopped service) adds to it, so it stays as of `batches` while
        # decisions go on. Its times are kept relative to the snapshot's "time", which a
        # restart restores it at: the hold timer's deadlines stay where they were.
        clock = self._clock
        assert isinstance(clock, ServiceClock)
        when = clock()
        with clock.pinned_here(when):
            spans = buffer.snapshot()
        try:
            state.write_snapshot(
                {
                    "version": SNAPSHOT_VERSION,
                    "time": when,
                    "guard": guard,
                    "held": held,
                    "buffer": spans,
                    "batches": batches,
                    # The log calls fed lately (a retried log batch counts once after a restart).
                    "log_calls": seen_calls,
                },
                covered,
                batches,
            )
        except (OSError, ValueError) as exc:  # ValueError: a part that is not plain data
            self.metrics.state_errors.labels("snapshot").inc()
            note(f"cannot write a snapshot in {str(state.path)!r}: {exc}; the log keeps growing")
            return False
        self._snapshot_covered = covered
        return True

    def _state_write_failed(self, error: OSError) -> None:
        note(f"cannot write the log: {error}; requests are answered 503 until it can")


def _replay_order(records: list[Record], batches: int, covered: int) -> list[Record]:
    """The records a snapshot does not cover (batches after ``batches``, ticks and decisions
    after ``covered``), in the order to apply them: the log's, except that batches and ticks
    keep the ingest thread's order (a tick comes right after the batch it followed, and a batch
    the tick preceded waits for it: a batch is logged when it is received, before the ingest
    thread adds it)."""
    ingest: list[tuple[tuple[int, int, int], Record]] = []
    decisions: list[Record] = []
    for record in records:
        if record.kind == BATCH and record.seq > batches:
            ingest.append(((record.seq, 0, 0), record))
        elif record.kind == TICK and record.seq > covered:
            after = int(orjson.loads(record.payload)["after"])
            ingest.append(((after, 1, record.seq), record))
        elif record.kind == DECISION and record.seq > covered:
            decisions.append(record)
    ingest.sort(key=lambda item: item[0])
    placed: list[tuple[int, int, int, Record]] = [(r.seq, 0, r.seq, r) for r in decisions]
    position = 0
    for index, (_, record) in enumerate(ingest):
        position = max(position, record.seq)  # never before what the ingest thread did first
        placed.append((position, 1, index, record))
    placed.sort(key=lambda item: item[:3])
    return [item[3] for item in placed]


class _ReplayAdvisor:
    """The advisor while a restart applies its log: the answers the log kept, in order."""

    def __init__(self, answers: dict[str, deque[str | None]]) -> None:
        self._answers = answers

    def __call__(self, request: Any) -> str | None:
        kept = self._answers.get(_advice_key(request))
        return kept.popleft() if kept else None


class _RecordingAdvisor:
    """The advisor, each answer logged (``ADVICE``) so that a restart need not ask again."""

    def __init__(self, advisor: Callable[[Any], str | None], service: Recovery) -> None:
        self.inner = advisor
        self._service = service

    def __call__(self, request: Any) -> str | None:
        answer = self.inner(request)
        state = self._service._state
        if state is not None:
            state.append(
                ADVICE,
                self._service._clock(),
                orjson.dumps({"key": _advice_key(request), "answer": answer}),
            )
        return answer


def _advice_key(request: Any) -> str:
    return f"{request.session}\0{request.agent}\0{request.signature}\0{request.count}"
