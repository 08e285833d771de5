"""OTLP/HTTP and the decision API over HTTP: the only part of ``serve`` that knows the HTTP
stack (uvicorn with the httptools parser, on an asyncio loop in one thread): the connections
here, the application (routes, framing, budgets) in :mod:`._http_app`.

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
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, ClassVar, Final

import httptools
import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._budget import ByteBudget
from ._http_app import SMALL_DECISION_BYTES, App
from ._options import RETRY_AFTER_SECONDS

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
            App(service, self._executor, self._decider, self.decision_budget),
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
