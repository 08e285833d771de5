"""``otel-loopguard serve`` on the command line: serve until SIGINT or SIGTERM, then drain."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

from otel_loopguard.config import Policy

from ._options import ServeOptions
from ._service import Service

__all__ = ["run_serve"]


def run_serve(
    options: ServeOptions,
    policy: Policy,
    *,
    stderr: TextIO | None = None,
    ready: Callable[[Service], None] | None = None,
) -> int:
    """Serve until SIGINT or SIGTERM, then drain and stop; return the exit status (0, or 1
    when draining did not finish in time). ``OSError`` when a port cannot be bound."""
    err = stderr if stderr is not None else sys.stderr
    stop = threading.Event()
    service = Service(options, policy=policy).start()
    previous: dict[signal.Signals, Any] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
        except ValueError:  # not the main thread (tests): the caller stops us another way
            pass
    urls = service.urls
    grpc_text = f"; OTLP/gRPC on {urls['grpc']}" if "grpc" in urls else ""
    err.write(
        f"otel-loopguard serve: OTLP/HTTP, decisions and /metrics on {urls['http']}"
        f"{grpc_text}; mode {policy.mode.value}"
        f"{'; bearer token required' if options.token else ''} (pid {os.getpid()})\n"
    )
    err.flush()
    if ready is not None:
        ready(service)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        err.write("otel-loopguard serve: stopping; draining accepted spans\n")
        err.flush()
        drained = service.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    err.write(
        "otel-loopguard serve: stopped\n"
        if drained
        else "otel-loopguard serve: stopped before everything was drained\n"
    )
    return 0 if drained else 1
