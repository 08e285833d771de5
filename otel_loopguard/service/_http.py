"""OTLP/HTTP and the decision API over HTTP: the only part of ``serve`` that knows the HTTP
stack (the standard library's ``http.server``).

One thread per connection (keep-alive; at most :data:`MAX_HTTP_CONNECTIONS`, a silent one times
out) authenticates each request and reads its body (``Content-Length`` only, gzip, capped):

- ``POST /v1/traces``: protobuf (:func:`~otel_loopguard.service.proto.proto_spans`) or OTLP
  JSON (:func:`~otel_loopguard.traces.otlp_json_spans`), offered to the ingest queue
  (:meth:`Service.accept`); answered in the request's encoding once queued: 200 (with
  ``partial_success`` when some spans were rejected), 400 for data that cannot be read, 429 / 503
  with ``Retry-After`` when the queue is full or the service is draining.
- ``POST /v1/decisions/{before,after,user_message,new_run}``: :meth:`Service.decide`.
- ``GET /metrics`` and ``GET /healthz`` (the only endpoint without the token).

An unexpected error is counted as the guard's internal error (``where="serve.http"``) and
answered 500; the server keeps serving.
"""

from __future__ import annotations

import logging
import socket
import threading
import zlib
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final

import orjson

from otel_loopguard.traces import BadSpan, OtlpSpans, otlp_json_spans

from ._decisions import DECISION_ENDPOINTS, MAX_DECISION_BODY_BYTES
from ._options import RETRY_AFTER_SECONDS
from .proto import (
    RPC_INVALID_ARGUMENT,
    RPC_RESOURCE_EXHAUSTED,
    RPC_UNAUTHENTICATED,
    RPC_UNAVAILABLE,
    proto_spans,
    response_bytes,
)

if TYPE_CHECKING:
    from ._service import Service

__all__ = ["CONNECTION_TIMEOUT_SECONDS", "MAX_HTTP_CONNECTIONS", "HTTPReceiver", "bind_http"]

_log = logging.getLogger("otel_loopguard")

#: Seconds an HTTP connection may stay silent (mid-request or idle keep-alive) before it is closed.
CONNECTION_TIMEOUT_SECONDS: Final = 30.0
#: Open HTTP connections (one thread each); a connection beyond it is closed at once.
MAX_HTTP_CONNECTIONS: Final = 256
#: An oversized body up to this many times the cap is read and dropped before the 413.
_DISCARD_FACTOR: Final = 4

_PROTOBUF: Final = "application/x-protobuf"
_JSON: Final = "application/json"


def bind_http(service: Service) -> HTTPReceiver:
    """Bind the HTTP port of ``service`` (``OSError`` when it cannot); serve with
    :meth:`HTTPReceiver.serve_in_background`."""
    options = service.options
    server_class = _HTTPReceiver6 if ":" in options.host else HTTPReceiver
    server = server_class((options.host.strip("[]"), options.http_port), _Handler)
    server.service = service
    return server


class HTTPReceiver(ThreadingHTTPServer):
    """The HTTP port of a :class:`Service`: one thread per connection, at most
    :data:`MAX_HTTP_CONNECTIONS` of them."""

    daemon_threads = True
    request_queue_size = 128
    service: Service

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self._connections = threading.BoundedSemaphore(MAX_HTTP_CONNECTIONS)
        # The semaphore each open connection took its slot from: it gives the slot back to that
        # one even if the bound was changed meanwhile.
        self._slots: dict[Any, threading.BoundedSemaphore] = {}
        self._serving_thread: threading.Thread | None = None
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

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def serve_in_background(self) -> None:
        """Answer requests from a daemon thread until :meth:`stop`."""
        thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="loopguard-http",
            daemon=True,
        )
        self._serving_thread = thread
        thread.start()

    def stop(self) -> None:
        """Stop accepting and close the port (connections under way finish on their threads)."""
        if self._serving_thread is not None:
            self.shutdown()
        self.server_close()


class _HTTPReceiver6(HTTPReceiver):
    address_family = socket.AF_INET6


class _Reject(Exception):
    """Answer the request with ``status`` and stop reading it."""

    def __init__(
        self, status: int, code: int, message: str, outcome: str, close: bool = False
    ) -> None:
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
    server: HTTPReceiver

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
            self._send(
                status, orjson.dumps({"status": "draining" if status == 503 else "ok"}), _JSON
            )
            return
        if not service.authorized(self.headers.get("Authorization")):
            self._unauthorized(False)
            return
        if path == "/metrics":
            page, content_type = service.metrics_page()
            self._send(200, page, content_type)
            return
        self._send(404, orjson.dumps({"error": f"no such endpoint: GET {path}"}), _JSON)

    def do_POST(self) -> None:
        service = self.server.service
        path = self.path.split("?", 1)[0]
        service.enter_request()
        try:
            if path == "/v1/traces":
                self._traces(service)
            elif path.startswith("/v1/decisions/") and path[14:] in DECISION_ENDPOINTS:
                self._decision(service, path[14:])
            else:
                self.close_connection = True  # its body is left unread
                self._send(404, orjson.dumps({"error": f"no such endpoint: POST {path}"}), _JSON)
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
        self._send(
            405,
            orjson.dumps({"error": f"method {self.command} not allowed"}),
            _JSON,
            {"Allow": "GET, POST"},
        )

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
                raise _Reject(
                    415,
                    RPC_INVALID_ARGUMENT,
                    f"unsupported Content-Type {kind or '(none)'!r}: send {_PROTOBUF} or {_JSON}",
                    "unsupported",
                    close=True,
                )
            body = self._read_body(service.options.max_body_bytes)
            body = self._decoded(body, service.options.max_body_bytes)
            read = self._spans(body, as_json)
            outcome, message = service.accept(read, "http")
            if outcome == "bad_request":
                raise _Reject(400, RPC_INVALID_ARGUMENT, message, outcome)
            if outcome in ("throttled", "unavailable"):
                throttled = outcome == "throttled"
                raise _Reject(
                    429 if throttled else 503,
                    RPC_RESOURCE_EXHAUSTED if throttled else RPC_UNAVAILABLE,
                    message,
                    outcome,
                )
            count(outcome)
            if as_json:
                answer: dict[str, object] = {}
                if read.bad_spans:
                    answer["partialSuccess"] = {
                        "rejectedSpans": str(read.bad_spans),
                        "errorMessage": message,
                    }
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
            self._send(
                reject.status,
                _status_body(reject.code, reject.message, as_json),
                _JSON if as_json else _PROTOBUF,
                headers,
            )
        finally:
            if not counted:
                count(outcome)

    def _read_body(self, limit: int) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise _Reject(
                411,
                RPC_INVALID_ARGUMENT,
                "chunked bodies are not accepted: send Content-Length",
                "bad_request",
                close=True,
            )
        text = self.headers.get("Content-Length")
        if text is None:
            raise _Reject(
                411, RPC_INVALID_ARGUMENT, "Content-Length is required", "bad_request", close=True
            )
        try:
            length = int(text)
            if length < 0:
                raise ValueError
        except ValueError:
            raise _Reject(
                400, RPC_INVALID_ARGUMENT, f"bad Content-Length {text!r}", "bad_request", close=True
            ) from None
        if length > limit:
            # Read a moderately oversized body away so the client can read the answer (a
            # client still sending when we close gets a reset, not our 413); hang up on a huge one.
            drained = length <= _DISCARD_FACTOR * limit and self._discard(length)
            raise _Reject(
                413,
                RPC_INVALID_ARGUMENT,
                f"body of {length:,} bytes is larger than {limit:,}",
                "too_large",
                close=not drained,
            )
        body = self.rfile.read(length)
        if len(body) != length:
            raise _Reject(
                400,
                RPC_INVALID_ARGUMENT,
                "body shorter than Content-Length",
                "bad_request",
                close=True,
            )
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
            raise _Reject(
                415,
                RPC_INVALID_ARGUMENT,
                f"unsupported Content-Encoding {encoding!r}: send gzip or none",
                "unsupported",
            )
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise _Reject(
                400, RPC_INVALID_ARGUMENT, f"not valid gzip ({exc})", "bad_request"
            ) from None
        if len(out) > limit:
            raise _Reject(
                413,
                RPC_INVALID_ARGUMENT,
                f"body inflates to more than {limit:,} bytes",
                "too_large",
            )
        if not inflater.eof:
            raise _Reject(400, RPC_INVALID_ARGUMENT, "gzip body is truncated", "bad_request")
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
                raise BadSpan(
                    f"expected a JSON object (an ExportTraceServiceRequest), got"
                    f" {type(record).__name__}"
                )
            return otlp_json_spans(record)
        except BadSpan as exc:
            raise _Reject(400, RPC_INVALID_ARGUMENT, str(exc), "bad_request") from None

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
                raise _Reject(
                    400, RPC_INVALID_ARGUMENT, f"not valid JSON ({exc})", "bad_request"
                ) from None
            try:
                answer = service.decide(endpoint, payload)
            except ValueError as exc:
                raise _Reject(400, RPC_INVALID_ARGUMENT, str(exc), "bad_request") from None
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
        self._send(
            401,
            _status_body(RPC_UNAUTHENTICATED, "missing or wrong bearer token", True),
            _JSON,
            {"WWW-Authenticate": 'Bearer realm="otel-loopguard"'},
        )

    def _send(
        self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None
    ) -> None:
        """The whole answer in one write (status line, headers and body)."""
        reason = self.responses.get(status, ("",))[0]
        lines = [
            f"{self.protocol_version} {status} {reason}",
            f"Server: {self.version_string()}",
            f"Date: {self.date_time_string()}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
        ]
        lines.extend(f"{name}: {value}" for name, value in (headers or {}).items())
        if self.close_connection:
            lines.append("Connection: close")
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        self.log_request(status)


def _status_body(code: int, message: str, as_json: bool) -> bytes:
    """A ``google.rpc.Status`` in the request's encoding."""
    if as_json:
        return orjson.dumps({"code": code, "message": message})
    from google.rpc import status_pb2

    return bytes(status_pb2.Status(code=code, message=message).SerializeToString())
