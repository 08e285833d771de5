"""The ASGI application of ``serve``'s HTTP side (:mod:`._http` serves it): the routes, each
request's framing and byte budget, and the decoding, queueing and deciding off the event loop
(the endpoint table of docs/serve.md)."""

from __future__ import annotations

import asyncio
import functools
import zlib
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, cast

import orjson

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

__all__ = ["SMALL_DECISION_BYTES", "App"]

#: A decision body over this may take at most half of the decision API's own byte budget
#: (:data:`~._http.DECISION_BUDGET_SHARE`), so that small decisions always find room.
SMALL_DECISION_BYTES: Final = 64 * 1024
#: A body up to this many times the cap is left to the parser to skip (without buffering it)
#: after the 413, so the client reads the answer; a larger one gets the 413 and a close.
_DISCARD_FACTOR: Final = 4

_PROTOBUF: Final = "application/x-protobuf"
_JSON: Final = "application/json"

_Message = Mapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


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


class App:
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
