"""How ``serve`` listens and how much it holds: :class:`ServeOptions`, its defaults and checks,
and the fixed limits every part of the service shares."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

from otel_loopguard._env import LOOPGUARD_SERVE_TOKEN
from otel_loopguard._serve_defaults import (
    DEFAULT_DRAIN_TIMEOUT_SECONDS,
    DEFAULT_GRPC_PORT,
    DEFAULT_HOLD_SECONDS,
    DEFAULT_HTTP_PORT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_MAX_QUEUED_SPANS,
    DEFAULT_REQUEST_TIMEOUT_SECONDS,
)
from otel_loopguard._traces import MAX_BUFFERED_SPANS

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT_SECONDS",
    "DEFAULT_GRPC_PORT",
    "DEFAULT_HOLD_SECONDS",
    "DEFAULT_HTTP_PORT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_MAX_QUEUED_SPANS",
    "DEFAULT_REQUEST_TIMEOUT_SECONDS",
    "RETRY_AFTER_SECONDS",
    "ServeOptions",
]

#: Seconds a throttled or draining client is told to wait (``Retry-After``, gRPC RetryInfo).
RETRY_AFTER_SECONDS: Final = 1


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name}: expected an integer {bound}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How ``serve`` listens and how much it holds. Bad values raise ``ValueError`` naming the
    field and the value.

    ``host``: address to bind (loopback by default); a non-loopback address needs ``token`` or
    ``insecure=True``. ``http_port``/``grpc_port``: 0 picks a free port; ``grpc_port=None``
    turns gRPC off. ``token``: bearer token every endpoint but ``/healthz`` requires.
    ``tls_cert``/``tls_key``: PEM files; both given, the HTTP port speaks HTTPS.
    ``state_dir``: keep a write-ahead log and snapshots there, so that a crash loses nothing
    answered (:mod:`._durable`). ``store``: keep the sessions in this Redis (a URL, overriding
    the policy's ``store``), shared by every replica that uses it; Redis is then the durability,
    so it cannot be combined with ``state_dir``.
    """

    host: str = "127.0.0.1"
    http_port: int = DEFAULT_HTTP_PORT
    grpc_port: int | None = DEFAULT_GRPC_PORT
    token: str | None = None
    insecure: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_queued_spans: int = DEFAULT_MAX_QUEUED_SPANS
    max_buffered_spans: int = MAX_BUFFERED_SPANS
    hold_seconds: float = DEFAULT_HOLD_SECONDS
    drain_timeout_seconds: float = DEFAULT_DRAIN_TIMEOUT_SECONDS
    #: "trace" (trace + agent, as the in-process processor by default) or "conversation".
    key_by: str = "trace"
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS
    tls_cert: str | None = None
    tls_key: str | None = None
    #: Directory of the write-ahead log and snapshots (None: state lives in memory only).
    state_dir: str | None = None
    #: Redis URL of the session store (None: the policy's ``store``, else this process's memory).
    store: str | None = None

    def __post_init__(self) -> None:
        if self.key_by not in ("trace", "conversation"):
            raise ValueError(f"key_by: expected 'trace' or 'conversation', got {self.key_by!r}")
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host: expected an address, got {self.host!r}")
        _check_int("http_port", self.http_port, 0, 65535)
        if self.grpc_port is not None:
            _check_int("grpc_port", self.grpc_port, 0, 65535)
        if self.token is not None and (
            not isinstance(self.token, str)
            or not self.token
            or any(c.isspace() for c in self.token)
        ):
            raise ValueError("token: expected a non-empty string without spaces")
        _check_int("max_body_bytes", self.max_body_bytes, 1024)
        _check_int("max_queued_spans", self.max_queued_spans, 1)
        _check_int("max_buffered_spans", self.max_buffered_spans, 1)
        _check_int("max_inflight_bytes", self.max_inflight_bytes, 1024)
        _check_int("max_connections", self.max_connections, 1)
        timeout = self.request_timeout_seconds
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not (0 < timeout < float("inf"))
        ):
            raise ValueError(f"request_timeout_seconds: expected a number > 0, got {timeout!r}")
        for name in ("tls_cert", "tls_key"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name}: expected a file path, got {value!r}")
        if self.state_dir is not None and (
            not isinstance(self.state_dir, str) or not self.state_dir
        ):
            raise ValueError(f"state_dir: expected a directory path, got {self.state_dir!r}")
        if self.store is not None and (not isinstance(self.store, str) or not self.store):
            raise ValueError("store: expected a redis://, rediss:// or unix:// URL")
        if self.store is not None and self.state_dir is not None:
            raise ValueError(
                "store, state_dir: give one; with a Redis store the sessions and their"
                " durability are Redis's (run it with appendonly yes, appendfsync always)"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert, tls_key: give both (a PEM certificate and its key)")
        for name in ("hold_seconds", "drain_timeout_seconds"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (0 <= value < float("inf"))
            ):
                raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
        if not _is_loopback(self.host) and self.token is None and not self.insecure:
            raise ValueError(
                f"host: {self.host!r} is not a loopback address; binding it without a token"
                f" would let anyone send spans and read decisions. Set a token (--token or"
                f" {LOOPGUARD_SERVE_TOKEN}) or pass --insecure"
            )
