"""OTLP logs in ``serve``: ``ExportLogsServiceRequest`` (protobuf or OTLP JSON) to the tool calls
coding agents report in their own telemetry (:mod:`otel_loopguard._conventions._log_events`).

A request becomes a :class:`LogCalls`, an :class:`~otel_loopguard._otlp_json.OtlpSpans` with no
spans and one :class:`~otel_loopguard._trace_events.CallObserved` per tool event, so it takes the
traces' path unchanged: the same receivers' auth, body cap and byte budget, the same ingest
queue (:meth:`Service.accept`), the same write-ahead log with ``--state-dir``
(:func:`~._durable.batch_payload`), and the same feed to the guard, as calls that already ran
(decided after the fact, like a tool span that ends). A retried batch counts once: each call
carries the agent's call id, or one made from the record's own fields, and the ingest thread
feeds a session's call id once (remembered in the snapshot too); a hook reporting the same
call id is counted once with it by the guard's report ledger.

Records that are not a coding agent's tool event (model requests, prompts, anything else) are
ignored, and counted so (``loopguard_otlp_log_records_total{result="ignored"}``); a tool event
that cannot be read (no tool name, no session, a bad success flag) is rejected and named in
``partial_success``, the others still count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from otel_loopguard._conventions._log_events import BadLogRecord, LogToolCall, tool_call_from_log
from otel_loopguard._otlp_json import (
    MAX_SPAN_PROBLEMS,
    BadSpan,
    OtlpSpans,
    _any_value,
    _otlp_attributes,
    read_nanos,
    short_value,
)
from otel_loopguard._trace_events import CallObserved
from otel_loopguard.metrics import MetricKind, MetricSpec

from ._proto import _attributes, _value

__all__ = [
    "LOG_RECORD_RESULTS",
    "OTLP_LOG_RECORDS",
    "LogCalls",
    "LogMetrics",
    "iter_calls",
    "json_log_calls",
    "logs_response_bytes",
    "proto_log_calls",
]

OTLP_LOG_RECORDS: Final = MetricSpec(
    "loopguard_otlp_log_records",
    MetricKind.COUNTER,
    "Log records received over OTLP (/v1/logs, LogsService), by result: accepted (a coding"
    " agent's tool event, queued), ignored (any other record), rejected (a tool event that"
    " cannot be read), throttled (queue full); duplicate: accepted, then dropped as a call"
    " already received (an exporter's retry).",
    ("result",),
    "{record}",
)
LOG_RECORD_RESULTS: Final = ("accepted", "ignored", "rejected", "throttled", "duplicate")


@dataclass(frozen=True, slots=True)
class LogCalls(OtlpSpans):
    """The tool calls read from one OTLP logs request (``spans`` and ``links`` stay empty):
    ``calls`` in the request's order, ``ignored`` records that are no tool event; ``bad_spans``
    and ``problems`` are its rejected records."""

    calls: list[CallObserved] = field(default_factory=list)
    ignored: int = 0

    @property
    def accepted(self) -> int:
        """Tool calls read (what the ingest queue holds of this request)."""
        return len(self.calls)


class LogMetrics:
    """``loopguard_otlp_log_records_total{result}`` on the service's registry."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter

        spec = OTLP_LOG_RECORDS
        self.records = Counter(spec.name, spec.description, spec.labels, registry=registry)
        for result in LOG_RECORD_RESULTS:
            self.records.labels(result)
        self.duplicates = self.records.labels("duplicate")


def _call(read: LogToolCall) -> CallObserved:
    return CallObserved(
        read.session,
        None,
        read.tool,
        {} if read.arguments is None else read.arguments,
        read.call_id,
        read.error,
        read.result,
        read.duration_seconds,
        without_arguments=read.arguments is None,
    )


class _Reader:
    """What one request's records give, gathered as they are read."""

    def __init__(self) -> None:
        self.calls: list[CallObserved] = []
        self.problems: list[str] = []
        self.bad = 0
        self.ignored = 0

    def record(
        self,
        where: str,
        attributes: Mapping[str, object],
        event_name: str,
        body: object,
        service: object,
        times: tuple[int, int],
    ) -> None:
        try:
            read = tool_call_from_log(
                attributes, event_name=event_name, body=body, service=service, times=times
            )
        except BadLogRecord as exc:
            self.bad_record(where, str(exc))
            return
        if read is None:
            self.ignored += 1
        else:
            self.calls.append(_call(read))

    def bad_record(self, where: str, problem: str) -> None:
        self.bad += 1
        if len(self.problems) < MAX_SPAN_PROBLEMS:
            self.problems.append(f"{where}: {problem}")

    def result(self) -> LogCalls:
        return LogCalls([], self.problems, self.bad, [], self.calls, self.ignored)


def proto_log_calls(body: bytes) -> LogCalls:
    """The tool calls of a serialized ``ExportLogsServiceRequest``; raises ``BadSpan`` when
    ``body`` is not one."""
    try:
        request = ExportLogsServiceRequest.FromString(body)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise BadSpan(f"not a valid protobuf ExportLogsServiceRequest ({exc})") from None
    reader = _Reader()
    for i, resource_logs in enumerate(request.resource_logs):
        service = _attributes(resource_logs.resource.attributes).get("service.name")
        for j, scope_logs in enumerate(resource_logs.scope_logs):
            for k, record in enumerate(scope_logs.log_records):
                where = f"resource_logs[{i}].scope_logs[{j}].log_records[{k}]"
                try:
                    attributes = _attributes(record.attributes)
                    body_value = _value(record.body, 0) if record.HasField("body") else None
                except BadSpan as exc:
                    reader.bad_record(where, str(exc))
                    continue
                reader.record(
                    where,
                    attributes,
                    record.event_name,
                    body_value,
                    service,
                    (record.time_unix_nano, record.observed_time_unix_nano),
                )
    return reader.result()


def _list(container: Mapping[str, Any], name: str, where: str) -> list[Any]:
    value = container.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadSpan(f"{where}{name} must be a list, got {short_value(value)}")
    return value


def _json_record(raw: object) -> tuple[dict[str, object], str, object, Any]:
    if not isinstance(raw, dict):
        raise BadSpan(f"a log record must be an object, got {short_value(raw)}")
    attributes = _otlp_attributes(raw.get("attributes"), "attributes")
    event_name = raw.get("eventName", "")
    if not isinstance(event_name, str):
        raise BadSpan(f"'eventName' must be a string, got {short_value(event_name)}")
    body = _any_value(raw.get("body"), "body", 0)
    times = tuple(
        read_nanos(raw[key], key, True) if raw.get(key) is not None else 0
        for key in ("timeUnixNano", "observedTimeUnixNano")
    )
    return attributes, event_name, body, times


def json_log_calls(request: Mapping[str, Any]) -> LogCalls:
    """The tool calls of an OTLP JSON ``ExportLogsServiceRequest`` (a parsed object): attribute
    values as :func:`~otel_loopguard._otlp_json.otlp_json_spans` reads them; a record that is not
    an object, or whose attributes, body or times cannot be read, is rejected and named."""
    reader = _Reader()
    for i, resource_logs in enumerate(_list(request, "resourceLogs", "")):
        where = f"resourceLogs[{i}]"
        try:
            if not isinstance(resource_logs, dict):
                raise BadSpan(f"must be an object, got {short_value(resource_logs)}")
            resource = resource_logs.get("resource") or {}
            if not isinstance(resource, dict):
                raise BadSpan(f"'resource' must be an object, got {short_value(resource)}")
            service = _otlp_attributes(resource.get("attributes"), "resource.attributes").get(
                "service.name"
            )
            scopes = _list(resource_logs, "scopeLogs", "")
        except BadSpan as exc:
            reader.bad_record(where, str(exc))
            continue
        for j, scope in enumerate(scopes):
            at = f"{where}.scopeLogs[{j}]"
            try:
                if not isinstance(scope, dict):
                    raise BadSpan(f"must be an object, got {short_value(scope)}")
                records = _list(scope, "logRecords", "")
            except BadSpan as exc:
                reader.bad_record(at, str(exc))
                continue
            for k, raw in enumerate(records):
                here = f"{at}.logRecords[{k}]"
                try:
                    attributes, event_name, body, times = _json_record(raw)
                except BadSpan as exc:
                    reader.bad_record(here, str(exc))
                    continue
                reader.record(here, attributes, event_name, body, service, times)
    return reader.result()


def logs_response_bytes(rejected: int = 0, message: str = "") -> bytes:
    """A serialized ``ExportLogsServiceResponse``; ``partial_success`` only when records were
    rejected."""
    response = ExportLogsServiceResponse()
    if rejected:
        response.partial_success.rejected_log_records = rejected
        response.partial_success.error_message = message
    return bytes(response.SerializeToString())


def iter_calls(batch: OtlpSpans) -> Iterable[CallObserved]:
    """The tool calls a queued batch holds (none for a batch of spans)."""
    return batch.calls if isinstance(batch, LogCalls) else ()
