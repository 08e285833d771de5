"""OTLP/gRPC: ``TraceService/Export`` (and ``LogsService/Export``, coding agents' tool events:
:mod:`._otlp_logs`) on a ``grpc.aio`` server (grpcio, imported when started),
on an asyncio loop in a thread of its own.

A call costs a coroutine while it waits, never a thread: the handler is registered as
client-streaming, so it runs as soon as the call's headers are in, before its message. It
authenticates first (``UNAUTHENTICATED`` at once, nothing read), then waits for the one
message at most ``request_timeout_seconds`` (``DEADLINE_EXCEEDED`` after), so calls that send
headers and never a message cannot hold anything for long. At most
:data:`MAX_CONCURRENT_STREAMS` calls run on one connection and :data:`MAX_CONCURRENT_RPCS` in
all (more: ``RESOURCE_EXHAUSTED`` from gRPC); keepalive pings are enforced as gRPC-Go's
defaults do (:data:`_KEEPALIVE`: a client pinging more often than every 5 minutes, or without a
call under way, is sent GOAWAY).

The message then takes its size from the service's in-flight byte budget
(``RESOURCE_EXHAUSTED`` with a retry delay past it, :mod:`._budget`), is decoded
(:func:`~otel_loopguard.service._proto.proto_spans`, raw bytes in: no generated stubs) and
offered to the ingest queue (:meth:`Service.accept`) on one of :data:`GRPC_WORKERS` threads; a
full queue or a draining service answers ``RESOURCE_EXHAUSTED`` / ``UNAVAILABLE`` with a retry
delay in the trailing metadata. An unexpected error is counted as the guard's internal error
(``where="serve.grpc"``) and answered ``INTERNAL``.

A port gRPC cannot bind is an ``OSError`` whose ``strerror`` says why (``Address already in
use``), found by binding it the same way with a plain socket; the gRPC C core's own log line
about it (written to file descriptor 2 before Python hears of the failure) is held back, since
serve reports the failure in one line of its own. Whatever else the C core writes meanwhile, and
everything when the port is bound, still reaches stderr.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any, Final, TypeVar

from otel_loopguard._otlp_json import BadSpan

from ._options import RETRY_AFTER_SECONDS
from ._otlp_logs import logs_response_bytes, proto_log_calls
from ._proto import RPC_RESOURCE_EXHAUSTED, proto_spans, response_bytes

if TYPE_CHECKING:
    from ._seam import ServiceSeam

__all__ = ["GRPC_WORKERS", "MAX_CONCURRENT_RPCS", "MAX_CONCURRENT_STREAMS", "GrpcReceiver"]

#: Threads decoding messages and queueing their spans (a call waiting for its message holds
#: none).
GRPC_WORKERS: Final = 8
#: gRPC calls under way at once, over every connection; more are refused by gRPC with
#: RESOURCE_EXHAUSTED. A waiting call costs a coroutine, and waits at most the request timeout.
MAX_CONCURRENT_RPCS: Final = 1024
#: Calls under way at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
MAX_CONCURRENT_STREAMS: Final = 100
#: Keepalive enforcement, as gRPC-Go's server (and so the Collector) does by default.
_KEEPALIVE: Final = (
    ("grpc.http2.min_ping_interval_without_data_ms", 300_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_ping_strikes", 2),
)

_GRPC_SERVICE: Final = "opentelemetry.proto.collector.trace.v1.TraceService"
#: OTLP logs: coding agents' tool events (:mod:`._otlp_logs`), on the same server and path.
_GRPC_LOGS_SERVICE: Final = "opentelemetry.proto.collector.logs.v1.LogsService"
_T = TypeVar("_T")


class GrpcReceiver:
    """The gRPC port of ``service``, bound (``OSError`` when it cannot be); serves from
    :meth:`start` until :meth:`stop`."""

    def __init__(self, service: ServiceSeam) -> None:
        self._service = service
        self._executor = ThreadPoolExecutor(GRPC_WORKERS, thread_name_prefix="loopguard-grpc")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="loopguard-grpc", daemon=True
        )
        self._thread.start()
        try:
            self._server, self.port = self._run(self._bind())
        except BaseException:
            self._close_loop()
            raise

    def _run(self, coroutine: Coroutine[Any, Any, _T], timeout: float | None = 30) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _bind(self) -> tuple[Any, int]:
        import grpc

        options = self._service.options
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", options.max_body_bytes),
                ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
                ("grpc.so_reuseport", 0),
                *_KEEPALIVE,
            ],
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
        )
        handler = grpc.method_handlers_generic_handler(
            _GRPC_SERVICE,
            {
                # Client-streaming: the handler runs once the headers are in, before the
                # message. No deserializer: it reads the raw bytes (see proto.proto_spans).
                "Export": grpc.stream_unary_rpc_method_handler(self._export),
            },
        )
        logs_handler = grpc.method_handlers_generic_handler(
            _GRPC_LOGS_SERVICE,
            {"Export": grpc.stream_unary_rpc_method_handler(self._export_logs)},
        )
        server.add_generic_rpc_handlers((handler, logs_handler))
        host = options.host.strip("[]")
        host = f"[{host}]" if ":" in host else options.host
        assert options.grpc_port is not None, "no gRPC port to serve (--no-grpc)"
        return server, _add_port(server, host, options.grpc_port)

    def start(self) -> None:
        self._run(self._server.start())

    def stop(self, grace: float) -> bool:
        """Stop accepting, give calls under way ``grace`` seconds; False if they did not end."""
        try:
            self._run(self._server.stop(grace), grace + 5)
            return True
        except Exception:  # noqa: BLE001 - not stopped in time: the loop is closed anyway
            return False
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
        self._executor.shutdown(wait=False)

    async def _export(self, requests: AsyncIterator[bytes], context: Any) -> bytes:
        """OTLP/gRPC ``TraceService/Export``: raw bytes in and out."""
        return await self._exported(context, False)

    async def _export_logs(self, requests: AsyncIterator[bytes], context: Any) -> bytes:
        """OTLP/gRPC ``LogsService/Export``: raw bytes in and out."""
        return await self._exported(context, True)

    async def _exported(self, context: Any, logs: bool) -> bytes:
        import grpc

        service = self._service
        outcome, message, answer = "error", "internal error", b""
        try:
            outcome, message, answer = await self._answer(context, logs)
        except Exception as exc:
            service.guard.report_internal_error("serve.grpc", exc)
        service.metrics.requests.labels("grpc", outcome).inc()
        if outcome in ("ok", "partial"):
            return answer
        trailers: tuple[tuple[str, bytes], ...] = ()
        if outcome in ("throttled", "over_budget", "unavailable"):
            trailers = _retry_metadata(message)
        code = {
            "unauthorized": grpc.StatusCode.UNAUTHENTICATED,
            "bad_request": grpc.StatusCode.INVALID_ARGUMENT,
            "throttled": grpc.StatusCode.RESOURCE_EXHAUSTED,
            "over_budget": grpc.StatusCode.RESOURCE_EXHAUSTED,
            "unavailable": grpc.StatusCode.UNAVAILABLE,
            "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
        }.get(outcome, grpc.StatusCode.INTERNAL)
        await context.abort(code, message, trailers)  # raises
        return b""  # pragma: no cover

    async def _answer(self, context: Any, logs: bool) -> tuple[str, str, bytes]:
        import grpc

        service = self._service
        metadata = dict(context.invocation_metadata() or ())
        if not service.authorized(metadata.get("authorization")):
            return "unauthorized", "missing or wrong bearer token", b""
        timeout = service.options.request_timeout_seconds
        try:
            request = await asyncio.wait_for(context.read(), timeout)
        except asyncio.TimeoutError:
            return "timeout", f"no whole message within {timeout:g} s", b""
        if request is grpc.aio.EOF or not isinstance(request, bytes):
            return "bad_request", "no message", b""
        budget = service.budget
        if not budget.take(len(request)):
            # grpcio has read the message (at most max_body_bytes); decoding it costs many
            # times that, so it is refused before, as HTTP refuses before reading.
            return (
                "over_budget",
                f"too many request bytes in flight (over {budget.limit:,});"
                f" retry after {RETRY_AFTER_SECONDS} s",
                b"",
            )
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, self._decode, request, logs
            )
        finally:
            budget.give(len(request))

    def _decode(self, request: bytes, logs: bool) -> tuple[str, str, bytes]:
        """Decode a message and queue its spans (``logs``: its coding agents' tool calls), on a
        worker thread."""
        try:
            read = proto_log_calls(request) if logs else proto_spans(request)
        except BadSpan as exc:
            return "bad_request", str(exc), b""
        outcome, message = self._service.accept(read, "grpc")
        if outcome in ("ok", "partial"):
            answer = logs_response_bytes if logs else response_bytes
            return outcome, message, answer(read.bad_spans, message)
        return outcome, message, b""


def _add_port(server: Any, host: str, port: int) -> int:
    """Bind ``host:port`` for ``server``; the port bound. ``OSError`` (with errno and strerror)
    when it cannot be, the C core's log line about it held back (see the module docstring)."""
    address = f"{host}:{port}"
    failure: Exception | None = None
    with _Fd2Held() as held:
        try:
            bound = int(server.add_insecure_port(address))
        except RuntimeError as exc:  # grpcio >= 1.5x: "Failed to bind to address ..."
            bound, failure = 0, exc
        if bound:
            held.release()  # nothing failed: whatever the C core said is shown
        else:
            held.release(drop=lambda line: b"add_port" in line or b"to add port" in line)
    if bound:
        return bound
    code, reason = _bind_problem(host, port)
    raise OSError(code, reason or f"gRPC could not bind it ({failure or 'no port added'})")


def _bind_problem(host: str, port: int) -> tuple[int, str | None]:
    """Why ``host:port`` cannot be bound, found by binding it as gRPC does (``SO_REUSEADDR``):
    the errno and its text, or ``(0, None)`` when a plain socket binds it."""
    try:
        infos = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        return errno.EADDRNOTAVAIL, f"cannot resolve {host!r}: {exc.strerror}"
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(sockaddr)
        except OSError as exc:
            return exc.errno or 0, exc.strerror or str(exc)
    return 0, None


class _Fd2Held:
    """File descriptor 2 redirected to a temporary file while the block runs (the gRPC C core
    logs there, past Python's ``sys.stderr``); :meth:`release` writes what was caught back to
    the real fd 2, but for the lines ``drop`` says are already reported. Without an fd 2 (a
    daemon), nothing is redirected."""

    def __init__(self) -> None:
        self._saved: int | None = None
        self._file: IO[bytes] | None = None

    def __enter__(self) -> _Fd2Held:
        try:
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        try:
            self._saved = os.dup(2)
        except OSError:
            return self
        self._file = tempfile.TemporaryFile()
        os.dup2(self._file.fileno(), 2)
        return self

    def release(self, drop: Callable[[bytes], bool] | None = None) -> None:
        """Restore fd 2 and write back what was caught (without the lines ``drop`` accepts)."""
        saved, file = self._saved, self._file
        if saved is None or file is None:
            return
        self._saved = self._file = None
        os.dup2(saved, 2)
        os.close(saved)
        with file:
            file.seek(0)
            caught = file.read()
        lines = caught.splitlines(keepends=True)
        kept = b"".join(line for line in lines if drop is None or not drop(line))
        if kept:
            try:
                os.write(2, kept)
            except OSError:
                pass

    def __exit__(self, *exc: object) -> None:
        self.release()  # an exception inside: restore fd 2 and show everything


def _retry_metadata(message: str) -> tuple[tuple[str, bytes], ...]:
    """Trailing metadata carrying a retry delay: as the Python exporter reads it
    (``google.rpc.retryinfo-bin``) and as the Collector reads it (in the status details)."""
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2

    info = error_details_pb2.RetryInfo()
    info.retry_delay.seconds = RETRY_AFTER_SECONDS
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=RPC_RESOURCE_EXHAUSTED, message=message, details=[detail])
    return (
        ("google.rpc.retryinfo-bin", info.SerializeToString()),
        ("grpc-status-details-bin", status.SerializeToString()),
    )
