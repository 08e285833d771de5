"""Serving a Prometheus registry: the text format, WSGI and ASGI apps, and a ``/metrics`` HTTP
server on a daemon thread (:class:`MetricsServer`).

The :class:`~.prometheus.PrometheusRecorder` methods of the same names delegate here.
``prometheus_client`` is imported when one of these is called, never at import.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any


def exposition(registry: Any, accept: str | None = None) -> bytes:
    """``registry`` as ``/metrics`` serves it to a scraper whose ``Accept`` header is
    ``accept``: OpenMetrics (with exemplars: the trace of each denial, stop and repeat) when it
    asks for ``application/openmetrics-text``, the Prometheus text format otherwise (exemplars
    left out: that format has none). :func:`content_type` says which."""
    from prometheus_client.exposition import choose_encoder

    encoder, _ = choose_encoder(accept or "")
    return bytes(encoder(registry))


def content_type(accept: str | None = None) -> str:
    """The ``Content-Type`` of :func:`exposition`'s answer to ``accept``."""
    from prometheus_client.exposition import choose_encoder

    return str(choose_encoder(accept or "")[1])


def wsgi_app(registry: Any) -> Callable[..., Iterable[bytes]]:
    """A WSGI app serving ``registry``."""
    from prometheus_client import make_wsgi_app

    return make_wsgi_app(registry)


def asgi_app(registry: Any) -> Callable[..., Any]:
    """An ASGI app serving ``registry``."""
    from prometheus_client import make_asgi_app

    return make_asgi_app(registry)


def serve(registry: Any, port: int, addr: str) -> MetricsServer:
    """Serve ``registry`` at ``/metrics`` from a daemon thread on ``addr``:``port``. Raises
    ``ValueError`` for a bad port or address, ``OSError`` when it cannot be bound."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"port: expected an integer from 0 to 65535, got {port!r}")
    if not isinstance(addr, str) or not addr:
        raise ValueError(f"addr: expected a host address, got {addr!r}")
    from prometheus_client import start_http_server

    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, thread)


class MetricsServer:
    """A running ``/metrics`` HTTP server (see :meth:`PrometheusRecorder.serve`)."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        address = server.server_address
        self.host: str = str(address[0])
        self.port: int = int(address[1])

    @property
    def url(self) -> str:
        """Where to scrape, e.g. ``http://127.0.0.1:9464/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
