"""OTLP/HTTP and the decision API over HTTP: the only part of ``serve`` that knows the HTTP
stack (uvicorn with the httptools parser, on an asyncio loop in one thread).

Why uvicorn + httptools (measured, docs/serve.md "Limits"): under 256-512 slowloris connections the
standard library's ``http.server`` answered nothing, while uvicorn with the deadline below kept
answering every legitimate request; httptools (llhttp) refuses every hostile framing probe
(duplicate or malformed ``Content-Length``, ``Content-Length`` with ``Transfer-Encoding``, bare
LF, obsolete line folding) with 400 + close; and it ingested fastest of the servers tried.

The socket is bound here, in the caller's thread (an ``OSError`` at once; port 0 works), then
uvicorn serves it from a daemon thread. Each connection is a :class:`_DeadlineProtocol`, which
bounds what one client can hold (the class says how):

- time: the whole request (TLS handshake, head and body) must arrive within
  ``request_timeout_seconds`` of the connection's accept or of the request's first byte (408 +
  close while the head is incomplete, else close); answers left unread that long close it; an
  idle keep-alive connection is closed after :data:`CONNECTION_TIMEOUT_SECONDS`;
- memory: a head over :data:`MAX_HEAD_BYTES` or :data:`MAX_HEADERS` is 431 while it is read; at
  most :data:`MAX_PIPELINED` pipelined requests wait (then nothing more is read); at most
  :data:`WRITE_BUFFER_BYTES` of unsent answers in serve and :data:`SEND_BUFFER_BYTES` in the
  kernel;
- slots: at most ``max_connections`` are open or in their TLS handshake (fewer when the file
  limit cannot hold them); the last eighth (:data:`RESERVED_SHARE`) serve only decisions and
  ``/healthz``; when all are taken a new connection replaces the slowest reader, else the oldest
  connection waiting in the reserved slots, else it is closed at once.

Each request is authenticated, framed strictly (``Content-Length`` required for a POST body:
411; larger than the cap: 413; the body's bytes taken from a byte budget before it is read,
else 429 with ``Retry-After``; ``/v1/traces`` and ``/v1/logs`` also take one
``Transfer-Encoding: chunked`` without ``Content-Length``, its bytes counted against the cap and
taken from the budget as they arrive, 413 or 429 and a close as soon as they pass either, any
other transfer coding 400 and a close) and decoded / decided on a worker thread, off the event loop:

- ``POST /v1/traces``: protobuf (:func:`~otel_loopguard.service._proto.proto_spans`) or OTLP
  JSON (:func:`~otel_loopguard._otlp_json.otlp_json_spans`), gzip or not (inflated 256 KiB at a
  time, each step taken from the budget first: the body limit applies after decompression),
  offered to the ingest queue (:meth:`Service.accept`); answered in the request's encoding once
  queued: 200 (with ``partial_success`` when some spans were rejected), 400 for data that cannot
  be read, 429 / 503 with ``Retry-After`` when the queue is full or the service is draining.
- ``POST /v1/logs``: the same path for OTLP logs (:mod:`._otlp_logs`: coding agents' tool
  events read as calls that already ran; every other record is ignored and counted), answered
  with ``partial_success.rejectedLogRecords`` for tool events that cannot be read.
- ``POST /v1/decisions/{before,after,user_message,new_run}``: :meth:`Service.decide` on
  :data:`DECISION_WORKERS` threads of their own, the body from a budget of its own (an eighth,
  :data:`DECISION_BUDGET_SHARE`, of ``max_inflight_bytes``; a body over
  :data:`SMALL_DECISION_BYTES` may take half of it), so a flood of exports or of big decision
  bodies never delays a hook's small one; a decision the state log cannot keep is 503.
- ``GET /metrics`` (OpenMetrics with exemplars when ``Accept`` asks for it, else the text format;
  pages made one at a time per format, shared by the requests that arrived meanwhile)
  and ``GET /healthz`` (the only endpoint without the token).

An unexpected error is counted as the guard's internal error (``where="serve.http"``) and
answered 500; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar, Final, cast

import httptools
import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from otel_loopguard._otlp_json import BadSpan, OtlpSpans, otlp_json_spans
from otel_loopguard.metrics._exposition import content_type as exposition_type

from ._budget import ByteBudget
from ._decisions import DECISION_ENDPOINTS, MAX_DECISION_BODY_BYTES
from ._durable import StateError
from ._options import RETRY_AFTER_SECONDS
from ._otlp_logs import json_log_calls, logs_response_bytes, proto_log_calls
from ._proto import (
    RPC_INVALID_ARGUMENT,
    RPC_RESOURCE_EXHAUSTED,
    RPC_UNAUTHENTICATED,
    RPC_UNAVAILABLE,
    proto_spans,
    response_bytes,
)

if TYPE_CHECKING:
    from ._seam import ServiceSeam

__all__ = [
    "CONNECTION_TIMEOUT_SECONDS",
    "DECISION_BUDGET_SHARE",
    "DECISION_WORKERS",
    "FILE_HEADROOM",
    "HTTP_WORKERS",
    "LISTEN_BACKLOG",
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "MAX_PIPELINED",
    "RESERVED_SHARE",
    "SEND_BUFFER_BYTES",
    "SMALL_DECISION_BYTES",
    "WRITE_BUFFER_BYTES",
    "HTTPReceiver",
    "bind_http",
]

#: Seconds an idle keep-alive HTTP connection stays open.
CONNECTION_TIMEOUT_SECONDS: Final = 30.0
#: Threads decoding OTLP requests and building /metrics (off the event loop).
HTTP_WORKERS: Final = 16
#: Threads answering decisions: their own, so a flood of exports never delays a hook.
DECISION_WORKERS: Final = 4
#: Largest request head (request line and headers, in bytes) and most headers: 431 beyond,
#: enforced while the head is read (the Collector's Go server allows 1 MiB; browsers send < 8 KiB).
MAX_HEAD_BYTES: Final = 64 * 1024
MAX_HEADERS: Final = 100
#: Requests waiting for their answers on one connection (pipelined); past it nothing more is
#: read from it until they are answered.
MAX_PIPELINED: Final = 16
#: The kernel's send buffer of each connection (fixed, not autotuned up to megabytes): answers
#: a client does not read fill it and then the write buffer, whose deadline closes the connection.
SEND_BUFFER_BYTES: Final = 128 * 1024
#: Unsent answer bytes a connection holds before its writes wait (and the write deadline
#: starts); asyncio's default is 64 KiB.
WRITE_BUFFER_BYTES: Final = 16 * 1024
#: Connections waiting to be accepted (the kernel caps it at net.core.somaxconn); asyncio also
#: accepts up to this many at once before serve counts them (uvicorn's default is 2,048).
LISTEN_BACKLOG: Final = 256
#: File descriptors kept for everything but HTTP connections (a burst of accepts, the gRPC port
#: and its connections, the state directory, logs): ``max_connections`` is lowered to the
#: process's file limit less these when the limit cannot be raised.
FILE_HEADROOM: Final = LISTEN_BACKLOG + 128
#: Bytes parsed at a time outside a body of known length (so that one read of many tiny
#: pipelined requests queues at most MAX_PIPELINED + 15 of them).
_HEAD_STEP: Final = 256
#: The share of ``max_connections`` kept for ``/v1/decisions/*`` and ``/healthz`` (at least one
#: slot when ``max_connections`` is 2 or more).
RESERVED_SHARE: Final = 8
#: The decision API's own byte budget is this share of ``max_inflight_bytes`` (on top of it);
#: a body over :data:`SMALL_DECISION_BYTES` may take at most half of it, so that small decisions
#: always find room.
DECISION_BUDGET_SHARE: Final = 8
SMALL_DECISION_BYTES: Final = 64 * 1024
#: A body up to this many times the cap is left to the parser to skip (without buffering it)
#: after the 413, so the client reads the answer; a larger one gets the 413 and a close.
_DISCARD_FACTOR: Final = 4

_PROTOBUF: Final = "application/x-protobuf"
_JSON: Final = "application/json"


def _raw_answer(status: str, error: str, extra: bytes = b"") -> bytes:
    """A whole answer with a JSON error and ``connection: close``, for the connection to write
    itself (no request reached the application)."""
    body = orjson.dumps({"error": error})
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n".encode()
        + extra
        + b"connection: close\r\n\r\n"
        + body
    )


_408: Final = _raw_answer("408 Request Timeout", "request too slow")
_431: Final = _raw_answer(
    "431 Request Header Fields Too Large",
    f"request head over {MAX_HEAD_BYTES:,} bytes or {MAX_HEADERS} headers",
)
_503: Final = _raw_answer(
    "503 Service Unavailable",
    "every connection slot is taken; the last ones serve /v1/decisions and /healthz only",
    f"retry-after: {RETRY_AFTER_SECONDS}\r\n".encode(),
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


class _HeadTooLarge(Exception):
    """The request head passed :data:`MAX_HEAD_BYTES` or :data:`MAX_HEADERS` (raised inside
    the parser's callbacks, which stops it)."""


class _ReservedOnly(Exception):
    """A connection admitted into the reserved slots asked for something else."""


class _DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools connection with deadlines, caps and a reserve. Its limits are class
    attributes of a subclass made for each service (:meth:`HTTPReceiver._protocol`):

    - the whole request (head and body) must arrive within ``request_deadline`` of the
      connection's accept (the TLS handshake included) or of the request's first byte;
    - an answer the client does not read (the kernel's send buffer, fixed at
      :data:`SEND_BUFFER_BYTES`, is full and the transport's write buffer stays past its
      high-water mark) for ``request_deadline`` closes the connection;
    - the head is capped while it is read (:data:`MAX_HEAD_BYTES`, :data:`MAX_HEADERS`: 431);
    - at most :data:`MAX_PIPELINED` pipelined requests wait for their answers: past them,
      what was read is kept unparsed and nothing more is read until they are answered (bytes
      are parsed :data:`_HEAD_STEP` at a time, a body up to its ``Content-Length`` at once, so
      one read cannot queue thousands);
    - at most ``max_connections`` are open or in their TLS handshake; the last ``reserve`` of
      them only serve ``/v1/decisions/*`` and ``/healthz`` (anything else: 503), and when all
      are taken a new connection replaces the one whose client has left its answers unread
      longest, else the oldest reserved one still waiting for a request, else it is closed.
    """

    request_deadline: float = 10.0
    max_connections: int = 1024
    reserve: int = 0
    tls: ssl.SSLContext | None = None
    on_timeout: Callable[[], None] = staticmethod(lambda: None)
    on_too_large: Callable[[], None] = staticmethod(lambda: None)
    #: Connections in their TLS handshake, in the reserved slots, and whose writes wait for the
    #: client to read (oldest first); per service.
    handshaking: ClassVar[set[_DeadlineProtocol]] = set()
    reserved: ClassVar[set[_DeadlineProtocol]] = set()
    stalled: ClassVar[dict[_DeadlineProtocol, None]] = {}

    _deadline: asyncio.TimerHandle | None = None
    _write_deadline: asyncio.TimerHandle | None = None
    _raw: asyncio.Transport | None = None  # the TCP transport, while the TLS handshake runs
    _app_called = False  # the current request's headers are in: the app has it
    _refused = False
    _made = False  # uvicorn's connection_made ran
    _in_head = True  # waiting for (or reading) a request's head
    _head_bytes = 0  # bytes received since the head began
    _head_size = 0  # the head's URL, names and values
    _header_count = 0
    _body_left: int | None = None  # body bytes still to come (Content-Length), when known
    _held = b""  # bytes read but not yet parsed: enough pipelined requests wait already
    _since = 0.0

    # -- accept ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        cls = type(self)
        open_now = len(self.connections) + len(cls.handshaking)
        if open_now >= self.max_connections and not self._evict():
            self._refused = True
            transport.abort()
            return
        open_now = len(self.connections) + len(cls.handshaking)
        if open_now - len(cls.reserved) >= self.max_connections - self.reserve:
            cls.reserved.add(self)
        self._since = self.loop.time()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:  # a fixed kernel buffer: an unread answer fills it soon, and costs no more
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            except OSError:
                pass
        self._arm()  # a silent new connection is covered too, its TLS handshake included
        if self.tls is None:
            self._start(transport)
            return
        self._raw = transport
        cls.handshaking.add(self)
        self.loop.create_task(self._handshake(transport, self.tls))

    async def _handshake(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        try:
            secure = await self.loop.start_tls(
                raw,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=self.request_deadline,
            )
        except (OSError, ssl.SSLError, asyncio.TimeoutError, asyncio.CancelledError):
            secure = None
        type(self).handshaking.discard(self)
        self._raw = None
        if secure is None or raw.is_closing():
            self._disarm()
            type(self).reserved.discard(self)
            raw.abort()
            return
        self._start(secure)

    def _start(self, transport: asyncio.Transport) -> None:
        self._made = True
        transport.set_write_buffer_limits(WRITE_BUFFER_BYTES)
        super().connection_made(transport)
        if self._held:
            self.data_received(b"")

    def _evict(self) -> bool:
        """Make room: close the connection whose client has left its answers unread longest,
        else the oldest reserved connection still waiting for a request (one that has sent
        nothing yet first). True if one was."""
        cls = type(self)
        if cls.stalled:
            cls.on_timeout()
            next(iter(cls.stalled))._close_now()
            return True
        waiting = [
            connection for connection in cls.reserved if connection._in_head and connection._idle()
        ]
        if waiting:  # silent ones first
            min(waiting, key=lambda c: (c._head_bytes > 0, c._since))._close_now()
            return True
        return False

    def _idle(self) -> bool:
        return (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    def _close_now(self) -> None:
        self._forget()
        transport = self._raw if self._raw is not None else getattr(self, "transport", None)
        if transport is not None:
            transport.abort()

    def _forget(self) -> None:
        """No longer counted: the connection is being closed."""
        cls = type(self)
        cls.reserved.discard(self)
        cls.handshaking.discard(self)
        cls.stalled.pop(self, None)
        self.connections.discard(self)
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
        if self._made:
            super().connection_lost(exc)

    # -- reading -----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if not self._made:  # TLS: what came with the handshake's end, before start_tls returned
            self._held += data
            return
        self._unset_keepalive_if_required()
        if self._held:  # reading is paused; this is what was left over
            data, self._held = self._held + data, b""
        pos, size = 0, len(data)
        while pos < size:
            if len(self.pipeline) >= MAX_PIPELINED:
                # Enough requests wait for answers: keep the rest, read nothing more until
                # they are answered (the client's writes then wait: TCP pushes back).
                self._held = data[pos:]
                self.flow.pause_reading()
                return
            left = self._body_left
            step = left if not self._in_head and left is not None and left > 0 else _HEAD_STEP
            piece = data[pos : pos + step]
            pos += len(piece)
            if self._in_head:
                self._head_bytes += len(piece)
            if not self._feed(piece):
                return
            if self._in_head and self._head_bytes > MAX_HEAD_BYTES:
                type(self).on_too_large()
                self._answer_and_close(_431)
                return

    def _feed(self, data: bytes) -> bool:
        """Parse ``data``; False (answered or closed) when the connection is done with."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _HeadTooLarge):
                type(self).on_too_large()
                self._answer_and_close(_431)
            elif isinstance(cause, _ReservedOnly):
                self._answer_and_close(_503)
            else:
                self.send_400_response("Invalid HTTP request received.")
            return False
        except httptools.HttpParserError:
            self.send_400_response("Invalid HTTP request received.")
            return False
        except httptools.HttpParserUpgrade:
            return False  # no upgrade is served: the request was answered as a plain one
        return True

    def _feed_held(self) -> None:
        if self._held and not self.transport.is_closing() and self.parser is not None:
            self.data_received(b"")

    def _answer_and_close(self, answer: bytes) -> None:
        """Answer at once and close, unless an earlier answer is still due (then just close)."""
        self._forget()  # its slot is free now
        if self._idle():
            self.transport.write(answer)
            self.transport.close()
        else:
            self.transport.abort()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_size = 0
        self._header_count = 0
        self._arm()  # a further request on a keep-alive connection (armed already on the first)

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        if self._head_size > MAX_HEAD_BYTES:
            raise _HeadTooLarge
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD_BYTES or self._header_count > MAX_HEADERS:
            raise _HeadTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self in type(self).reserved:
            path = self.url.split(b"?", 1)[0]
            if path != b"/healthz" and not path.startswith(b"/v1/decisions/"):
                raise _ReservedOnly
        self._app_called = True
        super().on_headers_complete()
        length = dict(self.headers).get(b"content-length")
        self._body_left = int(length) if length and length.isdigit() else None

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        self._head_bytes = 0
        self._since = self.loop.time()
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

    def on_body(self, body: bytes) -> None:
        if self._body_left is not None:
            self._body_left -= len(body)
        super().on_body(body)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # reads again, and starts the next pipelined request
        if self._held and not self.transport.is_closing():
            self.flow.pause_reading()  # what is held first
            self.loop.call_soon(self._feed_held)

    # -- writing -----------------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(self.request_deadline, self._unread)
            type(self).stalled[self] = None

    def resume_writing(self) -> None:
        super().resume_writing()
        type(self).stalled.pop(self, None)
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _unread(self) -> None:
        """The client has not read its answers for the deadline: close the connection."""
        self._write_deadline = None
        type(self).on_timeout()
        self.transport.abort()

    # -- the request deadline ----------------------------------------------------------------

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
        if self._raw is not None:  # the TLS handshake did not finish
            type(self).on_timeout()
            self._close_now()
            return
        if not self._made or self.transport.is_closing():
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
        self._decider = ThreadPoolExecutor(DECISION_WORKERS, thread_name_prefix="loopguard-decide")
        #: Decision bodies being read or decided (their own share: :data:`DECISION_BUDGET_SHARE`).
        self.decision_budget = ByteBudget(
            max(4 * SMALL_DECISION_BYTES, options.max_inflight_bytes // DECISION_BUDGET_SHARE)
        )
        config = uvicorn.Config(
            _App(service, self._executor, self._decider, self.decision_budget),
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
            backlog=LISTEN_BACKLOG,
            ssl_certfile=options.tls_cert,
            ssl_keyfile=options.tls_key,
        )
        try:
            config.load()  # the TLS context: a bad certificate is an error now, not in the thread
        except (OSError, ssl.SSLError) as exc:
            self._shutdown_workers()
            raise ValueError(
                f"tls_cert / tls_key: cannot load {options.tls_cert!r} / {options.tls_key!r}: {exc}"
            ) from None
        # The connection does the TLS handshake itself (after the cap, under the deadline):
        # the listener accepts plain TCP.
        self.protocol.tls, config.ssl = config.ssl, None
        host = options.host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it uvicorn's two writes (headers, then body) wait out the peer's delayed ACK
        # (about 40 ms per answer on a keep-alive connection).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, options.http_port))
            sock.listen(LISTEN_BACKLOG)
        except BaseException:
            sock.close()
            self._shutdown_workers()
            raise
        self._socket = sock
        self.port: int = int(sock.getsockname()[1])
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @staticmethod
    def _protocol(service: ServiceSeam) -> type[_DeadlineProtocol]:
        options = service.options
        timeouts = service.metrics.requests.labels("http", "timeout")
        too_large = service.metrics.requests.labels("http", "too_large")
        slots = _connection_slots(options.max_connections)
        return type(
            "_ServiceProtocol",
            (_DeadlineProtocol,),
            {
                "request_deadline": options.request_timeout_seconds,
                "max_connections": slots,
                "reserve": max(1, slots // RESERVED_SHARE) if slots >= 2 else 0,
                "on_timeout": staticmethod(timeouts.inc),
                "on_too_large": staticmethod(too_large.inc),
                "handshaking": set(),
                "reserved": set(),
                "stalled": {},
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
        self._shutdown_workers()

    def _shutdown_workers(self) -> None:
        self._executor.shutdown(wait=False)
        self._decider.shutdown(wait=False)


def _connection_slots(wanted: int) -> int:
    """How many connections the process can hold open: ``wanted``, the file descriptor limit
    raised to hold them and :data:`FILE_HEADROOM` more when it can be (as Go does at start),
    else fewer, with a warning (a connection accepted past the limit would stop every accept)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return wanted
    unlimited = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FILE_HEADROOM
    if soft != unlimited and soft < need:
        target = need if hard == unlimited else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == unlimited or soft >= need:
        return wanted
    slots = max(1, soft - FILE_HEADROOM)
    logging.getLogger("otel_loopguard.serve").warning(
        "max_connections: %d connections need %d file descriptors, the limit is %d:"
        " serving at most %d (raise it with ulimit -n)",
        wanted,
        need,
        soft,
        slots,
    )
    return slots


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
        #: Every ``Transfer-Encoding`` value, in order (the dict above keeps only the last).
        self.transfer_encodings = [
            value.decode("latin-1")
            for name, value in scope["headers"]
            if name == b"transfer-encoding"
        ]
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

    async def chunked_body(self, limit: int, held: _Held) -> bytearray:
        """A chunked body, bounded as a body of known length is: its bytes are counted and
        taken from the byte budget (``held``) as they arrive, 413 as soon as they pass
        ``limit`` and 429 as soon as the budget cannot cover them, both with a close (the rest
        is unread and its length unknown); the request deadline covers it (a late body is a
        disconnect: :class:`_Gone`)."""
        body = bytearray()
        while True:
            message = await self._receive()
            if message["type"] != "http.request":
                raise _Gone
            chunk: bytes = message.get("body", b"")
            if chunk:
                if len(body) + len(chunk) > limit:
                    raise _Reject(
                        413,
                        RPC_INVALID_ARGUMENT,
                        f"chunked body larger than {limit:,} bytes",
                        "too_large",
                        close=True,
                    )
                try:
                    held.grow(len(body) + len(chunk))
                except _Reject as reject:
                    reject.close = True
                    raise
                body += chunk
            if not message.get("more_body", False):
                return body

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

    def __init__(
        self,
        service: ServiceSeam,
        executor: ThreadPoolExecutor,
        decider: ThreadPoolExecutor,
        decision_budget: ByteBudget,
    ) -> None:
        self._service = service
        self._executor = executor
        self._decider = decider
        self._decision_budget = decision_budget
        #: One page maker per format (content type), so that scrapes sharing a page agree on it.
        self._pages: dict[str, _Pages] = {}

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
                await self._otlp(exchange, False)
            elif path == "/v1/logs":
                await self._otlp(exchange, True)
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
            accept = exchange.headers.get("accept")
            kind = exposition_type(accept)  # OpenMetrics when asked for, else the text format
            pages = self._pages.get(kind)
            if pages is None:
                pages = self._pages[kind] = _Pages(
                    functools.partial(service.metrics_page, accept), self._executor
                )
            page, content_type = await pages.next_page()
            await exchange.send(200, page, content_type)
            return
        await exchange.send(404, orjson.dumps({"error": f"no such endpoint: GET {path}"}), _JSON)

    # -- OTLP/HTTP -------------------------------------------------------------------------

    async def _otlp(self, exchange: _Exchange, logs: bool) -> None:
        """``/v1/traces``, or ``/v1/logs`` (``logs``: coding agents' tool events,
        :mod:`._otlp_logs`): one path, the same checks and budget."""
        service = self._service
        kind = exchange.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        as_json = kind != _PROTOBUF  # answers in the request's type; JSON when it has none we know
        outcome = "error"
        counted = False  # each request is counted once, before its answer goes out
        held = _Held(service.budget)

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
            body: bytes | bytearray
            if _chunked(exchange):
                body = await exchange.chunked_body(limit, held)
            else:
                length = _content_length(exchange, limit)
                held.grow(length)
                body = await exchange.body(length)
            outcome, answer = await self._off_loop(
                _ingest, service, exchange.headers, body, as_json, held, logs
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
            held.release()
            if not counted:
                count(outcome)

    # -- decisions -------------------------------------------------------------------------

    async def _decision(self, exchange: _Exchange, endpoint: str) -> None:
        service = self._service
        if not service.authorized(exchange.headers.get("authorization")):
            await _unauthorized(exchange)
            return
        budget = self._decision_budget
        taken = 0
        try:
            length = _content_length(exchange, MAX_DECISION_BODY_BYTES)
            ceiling = budget.limit if length <= SMALL_DECISION_BYTES else budget.limit // 2
            if not budget.take(length, ceiling):
                raise _Reject(
                    429,
                    RPC_RESOURCE_EXHAUSTED,
                    f"too many decision bytes in flight (over {ceiling:,});"
                    f" retry after {RETRY_AFTER_SECONDS} s",
                    "over_budget",
                )
            taken = length
            body = await exchange.body(length)
            answer = await asyncio.get_running_loop().run_in_executor(
                self._decider, _decide, service, endpoint, body, exchange.headers.get("traceparent")
            )
        except _Reject as reject:
            if reject.close:
                exchange.close = True
            retry = reject.status in (429, 503)
            headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if retry else None
            await exchange.send(
                reject.status, orjson.dumps({"error": reject.message}), _JSON, headers
            )
            return
        finally:
            if taken:
                budget.give(taken)
        service.metrics.decisions.labels(endpoint).inc()
        await exchange.send(200, orjson.dumps(answer), _JSON)


class _Pages:
    """``/metrics`` pages, made one at a time however many are asked for at once: a request
    gets the next page begun after it arrived, shared by every request that arrived meanwhile
    (so a flood of scrapes costs one page at a time, and no answer is older than its request).
    """

    def __init__(self, make: Callable[[], tuple[bytes, str]], executor: ThreadPoolExecutor) -> None:
        self._make = make
        self._executor = executor
        self._running: asyncio.Future[tuple[bytes, str]] | None = None
        self._next: asyncio.Future[tuple[bytes, str]] | None = None

    async def next_page(self) -> tuple[bytes, str]:
        page = self._next
        if page is None:
            page = self._next = asyncio.get_running_loop().create_future()
            if self._running is None:
                self._begin()
        return await asyncio.shield(page)

    def _begin(self) -> None:
        page, self._next = self._next, None
        assert page is not None
        self._running = page
        job = asyncio.get_running_loop().run_in_executor(self._executor, self._make)

        def done(job: asyncio.Future[tuple[bytes, str]]) -> None:
            self._running = None
            error = job.exception()
            if error is not None:
                page.set_exception(error)
                page.exception()  # retrieved: each waiting request raises it
            else:
                page.set_result(job.result())
            if self._next is not None:
                self._begin()

        job.add_done_callback(done)


async def _unauthorized(exchange: _Exchange) -> None:
    exchange.close = True  # the body, if any, is left unread
    await exchange.send(
        401,
        _status_body(RPC_UNAUTHENTICATED, "missing or wrong bearer token", True),
        _JSON,
        {"WWW-Authenticate": 'Bearer realm="otel-loopguard"'},
    )


def _chunked(exchange: _Exchange) -> bool:
    """Whether an OTLP/HTTP request's body is chunked: one ``Transfer-Encoding: chunked`` and no
    ``Content-Length`` (the OpenTelemetry Node SDK's exporter always streams its body). Any
    other ``Transfer-Encoding`` (several, another coding, with ``Content-Length``: the parser
    refuses that one already) is 400 with a close: a framing two parsers could read apart."""
    codings = exchange.transfer_encodings
    if not codings:
        return False
    if (
        len(codings) != 1
        or codings[0].strip().lower() != "chunked"
        or "content-length" in exchange.headers
    ):
        raise _Reject(
            400,
            RPC_INVALID_ARGUMENT,
            "Transfer-Encoding: send one 'chunked' without Content-Length, or Content-Length",
            "bad_request",
            close=True,
        )
    return True


def _content_length(exchange: _Exchange, limit: int) -> int:
    """The body's length, from a ``Content-Length`` the parser validated (one, digits only);
    411 without one (chunked bodies are accepted on ``/v1/traces`` and ``/v1/logs`` only:
    :func:`_chunked`),
    413 past ``limit``."""
    if "transfer-encoding" in exchange.headers:
        raise _Reject(
            411,
            RPC_INVALID_ARGUMENT,
            "chunked bodies are accepted on /v1/traces and /v1/logs only: send Content-Length",
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
    service: ServiceSeam,
    headers: Mapping[str, str],
    body: bytes | bytearray,
    as_json: bool,
    held: _Held,
    logs: bool = False,
) -> tuple[str, bytes]:
    """Decode, read and queue one OTLP body (``logs``: an ``ExportLogsServiceRequest``):
    ``(outcome, answer body)``, the inflated bytes of a gzip body taken from the budget into
    ``held``; raises :class:`_Reject`."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        body = _inflated(bytes(body), encoding, service.options.max_body_bytes, held)
    read = _spans(body, as_json, logs)
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
                "rejectedLogRecords" if logs else "rejectedSpans": str(read.bad_spans),
                "errorMessage": message,
            }
        return outcome, orjson.dumps(answer)
    if logs:
        return outcome, logs_response_bytes(read.bad_spans, message)
    return outcome, response_bytes(read.bad_spans, message)


class _Held:
    """What one request holds of the byte budget: :meth:`grow` to a size (429 when the budget
    cannot cover it), :meth:`release` when the request ends."""

    def __init__(self, budget: ByteBudget) -> None:
        self._budget = budget
        self.taken = 0

    def grow(self, size: int) -> None:
        if size <= self.taken:
            return
        if not self._budget.take(size - self.taken, held=self.taken):
            raise _Reject(
                429,
                RPC_RESOURCE_EXHAUSTED,
                f"too many request bytes in flight (over {self._budget.limit:,});"
                f" retry after {RETRY_AFTER_SECONDS} s",
                "over_budget",
            )
        self.taken = size

    def release(self) -> None:
        if self.taken:
            self._budget.give(self.taken)
            self.taken = 0


#: Bytes inflated at a time: each step is taken from the budget before the next one is made.
_INFLATE_STEP: Final = 256 * 1024


def _inflated(body: bytes, encoding: str, limit: int, held: _Held) -> bytearray:
    """A gzip body inflated step by step, the inflated bytes taken from the budget as they grow
    (the Collector's rule: the body limit applies after decompression): 413 as soon as they pass
    ``limit``, 429 as soon as the budget cannot cover them (the compressed body, still held, and
    the inflated bytes both count)."""
    if encoding != "gzip":
        raise _Reject(
            415,
            RPC_INVALID_ARGUMENT,
            f"unsupported Content-Encoding {encoding!r}: send gzip or none",
            "unsupported",
        )
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    pending = body
    try:
        while True:
            step = inflater.decompress(pending, _INFLATE_STEP)
            pending = inflater.unconsumed_tail
            if len(out) + len(step) > limit:
                raise _Reject(
                    413,
                    RPC_INVALID_ARGUMENT,
                    f"body inflates to more than {limit:,} bytes",
                    "too_large",
                )
            held.grow(len(body) + len(out) + len(step))
            out += step
            if inflater.eof or not (step or pending):
                break
    except zlib.error as exc:
        raise _Reject(400, RPC_INVALID_ARGUMENT, f"not valid gzip ({exc})", "bad_request") from None
    if not inflater.eof:
        raise _Reject(400, RPC_INVALID_ARGUMENT, "gzip body is truncated", "bad_request")
    return out  # not copied: both readers take a bytearray


def _spans(body: bytes | bytearray, as_json: bool, logs: bool = False) -> OtlpSpans:
    try:
        if not as_json:
            # protobuf reads any bytes-like object
            return proto_log_calls(cast(bytes, body)) if logs else proto_spans(cast(bytes, body))
        try:
            record = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadSpan(f"not valid JSON ({exc})") from None
        if not isinstance(record, dict):
            kind = "ExportLogsServiceRequest" if logs else "ExportTraceServiceRequest"
            raise BadSpan(f"expected a JSON object (an {kind}), got {type(record).__name__}")
        return json_log_calls(record) if logs else otlp_json_spans(record)
    except BadSpan as exc:
        raise _Reject(400, RPC_INVALID_ARGUMENT, str(exc), "bad_request") from None


def _decide(
    service: ServiceSeam, endpoint: str, body: bytes, traceparent: str | None
) -> dict[str, object]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _Reject(400, RPC_INVALID_ARGUMENT, f"not valid JSON ({exc})", "bad_request") from None
    try:
        return service.decide(endpoint, payload, traceparent)
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
