"""``otel-loopguard serve``: the guard as a service for agents in any language.

One process receives OTLP traces (HTTP protobuf and JSON on one port, gRPC on another), feeds
their tool spans through the same conventions, session keys and guard calls as the in-process
span processor (:mod:`otel_loopguard._traces`), and answers decisions over HTTP for hooks in other
processes. See :class:`Service` and :class:`ServeOptions`; ``otel-loopguard serve --help`` for the
command line. Needs the ``serve`` extra (from a checkout of the repository,
``pip install '.[serve]'``): protobuf, opentelemetry-proto, googleapis-common-protos and
grpcio, imported only here.

Private modules, one job each: ``_options`` (:class:`ServeOptions`, defaults and limits),
``_ingest`` (the queue and the thread feeding the trace buffer to the guard), ``_decisions``
(the decision API, on :mod:`otel_loopguard.hooks._answers`), ``_http`` (OTLP/HTTP and the
decision API over the standard library's ``http.server``: the only module that knows it),
``_grpc`` (OTLP/gRPC), ``_metrics`` (the service's own metrics), ``_logs`` (one log line per
decision, text or JSON), ``_service``
(:class:`Service`: lifecycle, authorization, admission) and ``_run`` (:func:`run_serve`).
:mod:`._proto` decodes OTLP protobuf. ``TOKEN_ENV`` is
:data:`otel_loopguard._env.LOOPGUARD_SERVE_TOKEN`.
"""

from __future__ import annotations

from otel_loopguard._env import LOOPGUARD_SERVE_TOKEN as TOKEN_ENV

from ._options import DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT, ServeOptions
from ._run import run_serve
from ._service import Service

__all__ = [
    "DEFAULT_GRPC_PORT",
    "DEFAULT_HTTP_PORT",
    "ServeOptions",
    "Service",
    "TOKEN_ENV",
    "run_serve",
]
