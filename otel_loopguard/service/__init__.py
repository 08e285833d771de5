"""``otel-loopguard serve``: the guard as a service for agents in any language.

One process receives OTLP traces (HTTP protobuf and JSON on one port, gRPC on another), feeds
their tool spans through the same conventions, session keys and guard calls as the in-process
span processor (:mod:`otel_loopguard.traces`), and answers decisions over HTTP for hooks in other
processes. See :class:`Service` and :class:`ServeOptions`; ``otel-loopguard serve --help`` for the
command line. Needs the ``serve`` extra (``pip install 'otel-loopguard[serve]'``): protobuf,
opentelemetry-proto, googleapis-common-protos and grpcio, imported only here.
"""

from __future__ import annotations

from .server import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HTTP_PORT,
    TOKEN_ENV,
    ServeOptions,
    Service,
    run_serve,
)

__all__ = [
    "DEFAULT_GRPC_PORT",
    "DEFAULT_HTTP_PORT",
    "ServeOptions",
    "Service",
    "TOKEN_ENV",
    "run_serve",
]
