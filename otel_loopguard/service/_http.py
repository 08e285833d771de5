"""OTLP/HTTP and the decision API over HTTP: the only part of ``serve`` that knows the HTTP
stack (uvicorn with the httptools parser, on an asyncio loop in one thread).

Why uvicorn + httptools (measured, docs/serve.md "Limits"): under 256-512 slowloris connections the
standard library's ``http.server`` answered nothing, while uvicorn with the deadline below kept
answering every legitimate request; httptools (llhttp) refuses every hostile framing probe
(duplicate or malformed ``Content-Length``, ``Content-Length`` with ``Transfer-Encoding``, bare
LF, obsolete line folding) with 400 + close; and it ingested fastest of the servers tried.

The socket is bound here, in the caller's thread (an ``OSError`` at once; port 0 works), then
uvicorn serves it from a daemon thread. Each connection is a :class:`_DeadlineProtocol`: the
whole request (headers and body) must arrive within ``request_timeout_seconds`` of the
connection's accept or of the request's first byte (408 + close while the headers are
incomplete, else close), at most ``max_connections`` are open (one more is closed at once), and
an idle keep-alive connection is closed after :data:`CONNECTION_TIMEOUT_SECONDS`.

Each request is authenticated, framed strictly (``Content-Length`` required for a POST body:
411; larger than the cap: 413; the body's bytes taken from the service's in-flight byte budget
before it is read, else 429 with ``Retry-After``) and decoded / decided on a worker thread, off
the event loop:

- ``POST /v1/traces``: protobuf (:func:`~otel_loopguard.service._proto.proto_spans`) or OTLP
  JSON (:func:`~otel_loopguard._traces.otlp_json_spans`), gzip or not, offered to the ingest
  queue (:meth:`Service.accept`); answered in the request's encoding once queued: 200 (with
  ``partial_success`` when some spans were rejected), 400 for data that cannot be read, 429 / 503
  with ``Retry-After`` when the queue is full or the service is draining.
- ``POST /v1/decisions/{before,after,user_message,new_run}``: :meth:`Service.decide` (not
  subject to the byte budget: its bodies are small, and a hook's decision must stay answered).
- ``GET /metrics`` and ``GET /healthz`` (the only endpoint without the token).

An unexpected error is counted as the guard's internal error (``where="serve.http"``) and
answered 500; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from otel_loopguard._traces import BadSpan, OtlpSpans, otlp_json_spans

from ._decisions import DECISION_ENDPOINTS, MAX_DECISION_BODY_BYTES
from ._durable import StateError
from ._options import RETRY_AFTER_SECONDS
from ._proto import (
    RPC_INVALID_ARGUMENT,
    RPC_RESOURCE_EXHAUSTED,
    RPC_UNAUTHENTICATED,
    RPC_UNAVAILABLE,
    proto_spans,
    response_bytes,
)

if TYPE_CHECKING:
    from ._budget import ByteBudget
    from ._seam import ServiceSeam

__all__ = ["CONNECTION_TIMEOUT_SECONDS", "HTTP_WORKERS", "HTTPReceiver", "bind_http"]

#: Seconds an idle keep-alive HTTP connection stays open.
CONNECTION_TIMEOUT_SECONDS: Final = 30.0
#: Threads decoding requests and answering decisions (off the event loop).
HTTP_WORKERS: Final = 16
#: A body up to this many times the cap is left to the parser to skip (without buffering it)
#: after the 413, so the client reads the answer; a larger one gets the 413 and a close.
_DISCARD_FACTOR: Final = 4

_PROTOBUF: Final = "application/x-protobuf"
_JSON: Final = "application/json"
_408: Final = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: 29\r\n"
    b'connection: close\r\n\r\n{"error": "request too slow"}'
)

_Message = Mapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def bind_http(service: ServiceSeam) -> HTTPReceiver:
    """Bind the HTTP port of ``service`` (``OSError`` when it cannot; ``ValueError`` when its
    TLS certificate or key cannot be loaded); serve with :meth:`HTTPReceiver.serve_in_background`.
    """
    return HTTPReceiver(service)


# -- the connection ----------------------------------------------------------------------------


class _DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools connection with a deadline for each whole request and a connection
    cap. Its limits are class attributes of a subclass made for each service
    (:meth:`HTTPReceiver._protocol`)."""

    request_deadline: float = 10.0
    max_connections: int = 1024
    on_timeout: Callable[[], None] = staticmethod(lambda: None)

    _deadline: asyncio.TimerHandle | None = None
    _app_called = False  # the current request's headers are in: the app has it
    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:  # before super() adds this one
            self._refused = True
            transport.abort()
            return
        super().connection_made(transport)
        self._arm()  # a silent new connection is covered too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if not self._refused:
            super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()  # a further request on a keep-alive connection (armed already on the first)

    def on_headers_complete(self) -> None:
        self._app_called = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()
        cycle = self.cycle
        if (
            cycle is not None
            and cycle.response_complete
            and not self.pipeline
            and self.timeout_keep_alive_task is None
            and not self.transport.is_closing()
        ):
            # Answered before its body was in (401, 413, 429): the body was skipped; from now on
            # the connection is idle, so the keep-alive timeout applies.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def _arm(self) -> None:
        if self._deadline is None:
            self._app_called = False
            self._deadline = self.loop.call_later(self.request_deadline, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        type(self).on_timeout()
        if self._app_called:  # the body is late: the app reads a disconnect
            self.transport.abort()
        else:
            self.transport.write(_408)
            self.transport.close()


# -- the server --------------------------------------------------------------------------------


class HTTPReceiver:
    """The HTTP port of a :class:`Service`, bound; :meth:`serve_in_background` serves it from a
    daemon thread, :meth:`stop` stops it."""

    def __init__(self, service: ServiceSeam) -> None:
        options = service.options
        self.service = service
        self.protocol = self._protocol(service)
        self._executor = ThreadPoolExecutor(HTTP_WORKERS, thread_name_prefix="loopguard-http")
        config = uvicorn.Config(
            _App(service, self._executor),
            http=self.protocol,
            loop="asyncio",
            lifespan="off",
            ws="none",
            interface="asgi3",
            log_config=None,
            log_level="error",  # not one warning line per hostile request
            access_log=False,
            server_header=False,
            date_header=True,
            timeout_keep_alive=int(CONNECTION_TIMEOUT_SECONDS),
            timeout_graceful_shutdown=max(1, round(options.drain_timeout_seconds)),
            ssl_certfile=options.tls_cert,
            ssl_keyfile=options.tls_key,
        )
        try:
            config.load()  # the TLS context: a bad certificate is an error now, not in the thread
        except (OSError, ssl.SSLError) as exc:
            self._executor.shutdown(wait=False)
            raise ValueError(
                f"tls_cert / tls_key: cannot load {options.tls_cert!r} / {options.tls_key!r}: {exc}"
            ) from None
        host = options.host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it uvicorn's two writes (headers, then body) wait out the peer's delayed ACK
        # (about 40 ms per answer on a keep-alive connection).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, options.http_port))
            sock.listen(128)
        except BaseException:
            sock.close()
            self._executor.shutdown(wait=False)
            raise
        self._socket = sock
        self.port: int = int(sock.getsockname()[1])
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @staticmethod
    def _protocol(service: ServiceSeam) -> type[_DeadlineProtocol]:
        options = service.options
        timeouts = service.metrics.requests.labels("http", "timeout")
        return type(
            "_ServiceProtocol",
            (_DeadlineProtocol,),
            {
                "request_deadline": options.request_timeout_seconds,
                "max_connections": options.max_connections,
                "on_timeout": staticmethod(timeouts.inc),
            },
        )

    def serve_in_background(self) -> None:
        """Serve from a daemon thread until :meth:`stop`; returns once it accepts."""
        thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name="loopguard-http",
            daemon=True,
        )
        self._thread = thread
        thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)

    def stop(self) -> None:
        """Stop accepting and close the port; requests under way finish (within the drain
        timeout), idle connections are closed."""
        thread = self._thread
        if thread is not None:
            self._server.should_exit = True
            thread.join(self.service.options.drain_timeout_seconds + 2)
            if thread.is_alive():
                self._server.force_exit = True
                thread.join(2)
        self._socket.close()
        self._executor.shutdown(wait=False)


# -- the application ---------------------------------------------------------------------------


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


class _Gone(Exception):
    """The client went away (or missed the deadline) before its body was in."""


class _Exchange:
    """One request and its answer."""

    def __init__(self, scope: _Message, receive: _Receive, send: _Send) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[str, str] = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
        }
        self._receive = receive
        self._send = send
        self.close = False
        self.sent = False

    async def body(self, length: int) -> bytes:
        """The body (``length`` bytes, as ``Content-Length`` says and the parser enforces)."""
        parts: list[bytes] = []
        got = 0
        while True:
            message = await self._receive()
            if message["type"] != "http.request":
                raise _Gone
            chunk: bytes = message.get("body", b"")
            if chunk:
                parts.append(chunk)
                got += len(chunk)
            if not message.get("more_body", False):
                break
        if got != length:
            raise _Gone
        return b"".join(parts)

    async def send(
        self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None
    ) -> None:
        """The whole answer (status, headers and body)."""
        raw = [
            (b"content-type", content_type.encode("latin-1")),
            (b"content-length", str(len(body)).encode("latin-1")),
        ]
        raw.extend(
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        )
        if self.close:
            raw.append((b"connection", b"close"))
        self.sent = True
        await self._send({"type": "http.response.start", "status": status, "headers": raw})
        await self._send({"type": "http.response.body", "body": body})


class _App:
    """The ASGI application: routes as the endpoint table of docs/serve.md says."""

    def __init__(self, service: ServiceSeam, executor: ThreadPoolExecutor) -> None:
        self._service = service
        self._executor = executor

    async def _off_loop(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def __call__(self, scope: _Message, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            return
        service = self._service
        exchange = _Exchange(scope, receive, send)
        method = exchange.method
        if method == "GET":
            await self._get(exchange)
            return
        if method != "POST":
            exchange.close = True
            await exchange.send(
                405,
                orjson.dumps({"error": f"method {method} not allowed"}),
                _JSON,
                {"Allow": "GET, POST"},
            )
            return
        path = exchange.path
        service.enter_request()
        try:
            if path == "/v1/traces":
                await self._traces(exchange)
            elif path.startswith("/v1/decisions/") and path[14:] in DECISION_ENDPOINTS:
                await self._decision(exchange, path[14:])
            else:
                exchange.close = True  # its body is left unread
                await exchange.send(
                    404, orjson.dumps({"error": f"no such endpoint: POST {path}"}), _JSON
                )
        except _Gone:
            pass
        except Exception as exc:  # never let one request take the server down
            service.guard.report_internal_error("serve.http", exc)
            if not exchange.sent:
                exchange.close = True
                await exchange.send(500, orjson.dumps({"error": "internal error"}), _JSON)
        finally:
            service.leave_request()

    async def _get(self, exchange: _Exchange) -> None:
        service = self._service
        path = exchange.path
        if path == "/healthz":
            status = 503 if service.closing else 200
            body = orjson.dumps({"status": "draining" if status == 503 else "ok"})
            await exchange.send(status, body, _JSON)
            return
        if not service.authorized(exchange.headers.get("authorization")):
            await _unauthorized(exchange)
            return
        if path == "/metrics":
            page, content_type = await self._off_loop(service.metrics_page)
            await exchange.send(200, page, content_type)
            return
        await exchange.send(404, orjson.dumps({"error": f"no such endpoint: GET {path}"}), _JSON)

    # -- OTLP/HTTP -------------------------------------------------------------------------

    async def _traces(self, exchange: _Exchange) -> None:
        service = self._service
        kind = exchange.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        as_json = kind != _PROTOBUF  # answers in the request's type; JSON when it has none we know
        outcome = "error"
        counted = False  # each request is counted once, before its answer goes out
        budget = service.budget
        taken = 0

        def count(result: str) -> None:
            nonlocal counted
            service.metrics.requests.labels("http", result).inc()
            counted = True

        try:
            if not service.authorized(exchange.headers.get("authorization")):
                count("unauthorized")
                await _unauthorized(exchange)
                return
            if kind not in (_PROTOBUF, _JSON):
                raise _Reject(
                    415,
                    RPC_INVALID_ARGUMENT,
                    f"unsupported Content-Type {kind or '(none)'!r}: send {_PROTOBUF} or {_JSON}",
                    "unsupported",
                    close=True,
                )
            limit = service.options.max_body_bytes
            length = _content_length(exchange, limit)
            if not budget.take(length):
                raise _Reject(
                    429,
                    RPC_RESOURCE_EXHAUSTED,
                    f"too many request bytes in flight (over {budget.limit:,});"
                    f" retry after {RETRY_AFTER_SECONDS} s",
                    "over_budget",
                )
            taken = length
            body = await exchange.body(length)
            outcome, answer, taken = await self._off_loop(
                _ingest, service, exchange.headers, body, as_json, taken
            )
            count(outcome)
            await exchange.send(200, answer, _JSON if as_json else _PROTOBUF)
        except _Reject as reject:
            count(reject.outcome)
            if reject.close:
                exchange.close = True
            headers = {}
            if reject.status in (429, 503):
                headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
            await exchange.send(
                reject.status,
                _status_body(reject.code, reject.message, as_json),
                _JSON if as_json else _PROTOBUF,
                headers,
            )
        finally:
            if taken:
                budget.give(taken)
            if not counted:
                count(outcome)

    # -- decisions -------------------------------------------------------------------------

    async def _decision(self, exchange: _Exchange, endpoint: str) -> None:
        service = self._service
        if not service.authorized(exchange.headers.get("authorization")):
            await _unauthorized(exchange)
            return
        try:
            length = _content_length(exchange, MAX_DECISION_BODY_BYTES)
            body = await exchange.body(length)
            answer = await self._off_loop(_decide, service, endpoint, body)
        except _Reject as reject:
            if reject.close:
                exchange.close = True
            headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if reject.status == 503 else None
            await exchange.send(
                reject.status, orjson.dumps({"error": reject.message}), _JSON, headers
            )
            return
        service.metrics.decisions.labels(endpoint).inc()
        await exchange.send(200, orjson.dumps(answer), _JSON)


async def _unauthorized(exchange: _Exchange) -> None:
    exchange.close = True  # the body, if any, is left unread
    await exchange.send(
        401,
        _status_body(RPC_UNAUTHENTICATED, "missing or wrong bearer token", True),
        _JSON,
        {"WWW-Authenticate": 'Bearer realm="otel-loopguard"'},
    )


def _content_length(exchange: _Exchange, limit: int) -> int:
    """The body's length, from a ``Content-Length`` the parser validated (one, digits only);
    411 without one (chunked bodies are not accepted), 413 past ``limit``."""
    if "transfer-encoding" in exchange.headers:
        raise _Reject(
            411,
            RPC_INVALID_ARGUMENT,
            "chunked bodies are not accepted: send Content-Length",
            "bad_request",
            close=True,
        )
    text = exchange.headers.get("content-length")
    if text is None:
        raise _Reject(
            411, RPC_INVALID_ARGUMENT, "Content-Length is required", "bad_request", close=True
        )
    if not text.isdigit():  # the parser refuses these already
        raise _Reject(
            400, RPC_INVALID_ARGUMENT, f"bad Content-Length {text!r}", "bad_request", close=True
        )
    length = int(text)
    if length > limit:
        # A moderately oversized body is skipped by the parser after the answer (never buffered),
        # so the client reads the 413; a huge one gets the 413 and a close.
        raise _Reject(
            413,
            RPC_INVALID_ARGUMENT,
            f"body of {length:,} bytes is larger than {limit:,}",
            "too_large",
            close=length > _DISCARD_FACTOR * limit,
        )
    return length


# -- on a worker thread ------------------------------------------------------------------------


def _ingest(
    service: ServiceSeam, headers: Mapping[str, str], body: bytes, as_json: bool, taken: int
) -> tuple[str, bytes, int]:
    """Decode, read and queue one OTLP body: ``(outcome, answer body, bytes taken from the
    budget)``; raises :class:`_Reject`."""
    limit = service.options.max_body_bytes
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        body = _inflated(body, encoding, limit)
        taken = _take_more(service.budget, taken, len(body))
    read = _spans(body, as_json)
    del body
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
    if as_json:
        answer: dict[str, object] = {}
        if read.bad_spans:
            answer["partialSuccess"] = {
                "rejectedSpans": str(read.bad_spans),
                "errorMessage": message,
            }
        return outcome, orjson.dumps(answer), taken
    return outcome, response_bytes(read.bad_spans, message), taken


def _take_more(budget: ByteBudget, taken: int, size: int) -> int:
    """Grow a request's share of the budget to ``size`` (its inflated body); 429 when it
    cannot."""
    if size <= taken:
        return taken
    if not budget.take(size - taken):
        raise _Reject(
            429,
            RPC_RESOURCE_EXHAUSTED,
            f"too many request bytes in flight (over {budget.limit:,});"
            f" retry after {RETRY_AFTER_SECONDS} s",
            "over_budget",
        )
    return size


def _inflated(body: bytes, encoding: str, limit: int) -> bytes:
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
        raise _Reject(400, RPC_INVALID_ARGUMENT, f"not valid gzip ({exc})", "bad_request") from None
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


def _decide(service: ServiceSeam, endpoint: str, body: bytes) -> dict[str, object]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _Reject(400, RPC_INVALID_ARGUMENT, f"not valid JSON ({exc})", "bad_request") from None
    try:
        return service.decide(endpoint, payload)
    except ValueError as exc:
        raise _Reject(400, RPC_INVALID_ARGUMENT, str(exc), "bad_request") from None
    except StateError as exc:  # not logged, so not applied: the hook follows its fail mode
        raise _Reject(503, RPC_UNAVAILABLE, str(exc), "unavailable") from None


def _status_body(code: int, message: str, as_json: bool) -> bytes:
    """A ``google.rpc.Status`` in the request's encoding."""
    if as_json:
        return orjson.dumps({"code": code, "message": message})
    from google.rpc import status_pb2

    return bytes(status_pb2.Status(code=code, message=message).SerializeToString())
