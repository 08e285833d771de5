"""``serve``'s defaults, declared once: :class:`~otel_loopguard.service.ServeOptions` uses them
and the command line shows them, without importing the service (and its HTTP stack) to build
its parser. Private: the service's own module (``service._options``) re-exports them.
"""

from __future__ import annotations

from typing import Final

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
]

#: OTLP/HTTP's default port: traces, decisions, /metrics and /healthz.
DEFAULT_HTTP_PORT: Final = 4318
#: OTLP/gRPC's default port.
DEFAULT_GRPC_PORT: Final = 4317
#: Largest request body read, after decompression (the OTLP specification suggests 20 MiB);
#: larger ones get 413 (gRPC: RESOURCE_EXHAUSTED from the transport).
DEFAULT_MAX_BODY_BYTES: Final = 20 * 1024 * 1024
#: Spans accepted but not yet fed to the guard; past it requests get 429 / RESOURCE_EXHAUSTED.
DEFAULT_MAX_QUEUED_SPANS: Final = 100_000
#: Seconds a tool span waits for its ancestors when its trace's root has not arrived. The
#: common exporters batch spans for 5 s (the OpenTelemetry SDKs' BatchSpanProcessor default,
#: OTEL_BSP_SCHEDULE_DELAY), so a run's agent span arrives one or two batches after its first
#: tool spans: two batch delays and a second cover every run shorter than about 10 s
#: (benchmarks/serve_hold.py measures it with the real OTLP exporters).
DEFAULT_HOLD_SECONDS: Final = 11.0
#: Seconds ``close`` waits for requests under way and the queue to drain.
DEFAULT_DRAIN_TIMEOUT_SECONDS: Final = 30.0
#: Request body bytes being read or decoded at once, over both transports (a request costs
#: 13-19 times its body while decoded); past it 429 / RESOURCE_EXHAUSTED with a retry delay.
DEFAULT_MAX_INFLIGHT_BYTES: Final = 32 * 1024 * 1024
#: Open HTTP connections; one more is closed at once.
DEFAULT_MAX_CONNECTIONS: Final = 1024
#: Seconds to receive a whole HTTP request, headers and body (from the connection's accept or
#: the request's first byte); a slower one gets 408 and is closed.
DEFAULT_REQUEST_TIMEOUT_SECONDS: Final = 10.0
