"""Replay recorded tool calls through the guard and report what would have tripped.

Input is JSON lines. Each file is read by one *input format*, chosen by sniffing its first records
(or forced by name). A format turns one parsed JSON record into zero or more replay events:

- :class:`CallStarted`: a tool call about to run, fed to ``LoopGuard.before_tool``;
- :class:`CallFinished`: the recorded outcome of a started call, fed to ``LoopGuard.after_tool``;
- :class:`UserPrompt`: a real user message, fed to ``LoopGuard.user_message``;
- :class:`CallDecidedAtStart`: a tool span whose arguments were there when it started (Pydantic
  AI): decided as the span processor decides at ``on_start`` (``LoopGuard.decide_at_span_start``);
- :class:`CallObserved`: a tool span at its end, fed to ``LoopGuard.after_tool`` only, as the span
  processor does at ``on_end``: it counts the call after the fact, or only adds the outcome of a
  call decided at its start.

The last two are defined with the span decoding and the trace buffer in the private module
``_traces``, shared with ``serve``; they are importable from here.

Formats live in a registry (:data:`FORMATS`, :func:`register_format`); each is a sniffing
predicate plus a decoder factory. Built in: Claude Code sessions, the labelled corpus's lines,
tool-call transcripts, OTLP JSON lines (the Collector's ``file`` exporter) and span dumps (the
fixtures' span JSON lines). Model usage the input carries
(:class:`~otel_loopguard._trace_events.ModelUsed`; a bad one :class:`ModelSkipped`) is fed to
``LoopGuard.model_call``; each session's report then gives what it spent
(:attr:`SessionReport.spend`).

Recorded traces go through the same conventions, session keys and guard calls as the in-process
:class:`~otel_loopguard.processor.LoopGuardSpanProcessor`, so a replay gives the decisions the
processor gave (the trace buffer in ``_traces`` puts a trace back in time order).

Bad input never stops a replay: an unparsable line, or a record a decoder rejects, is reported as
``FILE:LINE: reason`` and counted. :func:`run_replay` returns exit status 0 when every line was
read, 1 when some were bad or a file could not be read; usage errors (a missing file, a bad
policy) are raised as :class:`UsageError` before anything is replayed.
"""

from __future__ import annotations

from .._trace_events import CallDecidedAtStart, CallObserved
from ._events import (
    BadRecord,
    CallFinished,
    CallStarted,
    Event,
    InputFormat,
    ModelSkipped,
    RecordDecoder,
    UserPrompt,
)
from ._formats import FORMATS, detect_format, format_by_name, register_format
from ._reader import LARGE_INPUT_BYTES, LARGE_INPUT_LINES, MAX_REPORTED_BAD_LINES
from ._replayer import (
    MAX_LISTED_DECISIONS,
    MAX_TIMELINE_SIGNATURES,
    ListedDecision,
    ReplayClock,
    Replayer,
    SessionReport,
    SignatureSummary,
    Timeline,
    TimelineCall,
    TimelineMark,
)
from ._report import format_session, format_totals
from ._run import UsageError, run_replay
from ._trace_formats import OtlpJsonDecoder, SpanDumpDecoder
from ._transcript_formats import ClaudeCodeDecoder, CorpusDecoder, TranscriptDecoder

__all__ = [
    "BadRecord",
    "CallDecidedAtStart",
    "CallFinished",
    "CallObserved",
    "CallStarted",
    "ClaudeCodeDecoder",
    "CorpusDecoder",
    "Event",
    "FORMATS",
    "InputFormat",
    "LARGE_INPUT_BYTES",
    "LARGE_INPUT_LINES",
    "ListedDecision",
    "MAX_LISTED_DECISIONS",
    "MAX_TIMELINE_SIGNATURES",
    "MAX_REPORTED_BAD_LINES",
    "ModelSkipped",
    "OtlpJsonDecoder",
    "RecordDecoder",
    "ReplayClock",
    "Replayer",
    "SessionReport",
    "SignatureSummary",
    "SpanDumpDecoder",
    "Timeline",
    "TimelineCall",
    "TimelineMark",
    "TranscriptDecoder",
    "UsageError",
    "UserPrompt",
    "detect_format",
    "format_by_name",
    "format_session",
    "format_totals",
    "register_format",
    "run_replay",
]
