"""The registry of input formats (:data:`FORMATS`) and picking a file's format by sniffing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ._events import InputFormat
from ._trace_formats import (
    OtlpJsonDecoder,
    SpanDumpDecoder,
    _claims_otlp_json,
    _claims_span_dump,
)
from ._transcript_formats import (
    ClaudeCodeDecoder,
    CorpusDecoder,
    TranscriptDecoder,
    _claims_claude_code,
    _claims_corpus,
    _claims_transcript,
)

#: The input formats, most specific first: the first whose ``claims`` accepts one of a file's
#: first records reads the file.
FORMATS: list[InputFormat] = [
    InputFormat(
        "claude-code",
        "Claude Code session transcripts (~/.claude/projects/*/*.jsonl)",
        _claims_claude_code,
        ClaudeCodeDecoder,
    ),
    InputFormat(
        "corpus",
        'the labelled corpus\'s lines: {"agent", "seq", "tool", "arguments", "is_error",'
        ' "result", "usage", "source"} per call (one run per file, named by its source)',
        _claims_corpus,
        CorpusDecoder,
    ),
    InputFormat(
        "transcript",
        'tool-call transcripts: {"session", "tool", "arguments", "error"} per call,'
        ' {"type": "user_message", "session"} per prompt',
        _claims_transcript,
        TranscriptDecoder,
    ),
    # Recorded traces. Their records carry none of the keys the formats above claim by.
    InputFormat(
        "otlp-json",
        "OTLP JSON lines: one ExportTraceServiceRequest per line (the Collector's file exporter)",
        _claims_otlp_json,
        OtlpJsonDecoder,
        traces=True,
    ),
    InputFormat(
        "span-dump",
        'span JSON lines: {"name", "trace_id", "span_id", "attributes", ...} per finished span',
        _claims_span_dump,
        SpanDumpDecoder,
        traces=True,
    ),
]

#: Read with this format when no record is claimed (its errors then say what is missing).
_FALLBACK_FORMAT: Final = "transcript"


def register_format(fmt: InputFormat, *, before: str | None = None) -> None:
    """Add ``fmt`` to :data:`FORMATS` (before the format named ``before``, else last).

    Raises ``ValueError`` when a format of that name is already registered or ``before`` is
    unknown.
    """
    if any(existing.name == fmt.name for existing in FORMATS):
        raise ValueError(f"format: {fmt.name!r} is already registered")
    if before is None:
        FORMATS.append(fmt)
        return
    for position, existing in enumerate(FORMATS):
        if existing.name == before:
            FORMATS.insert(position, fmt)
            return
    raise ValueError(f"before: no format named {before!r}")


def format_by_name(name: str) -> InputFormat:
    """Return the registered format ``name``; raises ``ValueError`` naming the known ones."""
    for fmt in FORMATS:
        if fmt.name == name:
            return fmt
    raise ValueError(f"format: {name!r} is not one of {', '.join(f.name for f in FORMATS)}")


def detect_format(records: Iterable[object]) -> InputFormat:
    """Pick the format of a file from its first records: the first record any registered
    format claims decides; when none is claimed, the transcript format."""
    for record in records:
        for fmt in FORMATS:
            try:
                claimed = fmt.claims(record)
            except (TypeError, ValueError, KeyError, AttributeError):
                claimed = False  # a predicate tripping over odd input has not claimed it
            if claimed:
                return fmt
    return format_by_name(_FALLBACK_FORMAT)
