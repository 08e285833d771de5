"""``otel-loopguard serve`` on the command line: serve until SIGINT or SIGTERM, then drain."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

from otel_loopguard._settings import redact_url
from otel_loopguard.config import Policy

from ._logs import DECISION_LOGGER, FIELDS, install, uninstall
from ._options import ServeOptions
from ._service import Service

__all__ = ["run_serve"]

_log = logging.getLogger(DECISION_LOGGER)


def run_serve(
    options: ServeOptions,
    policy: Policy,
    *,
    stderr: TextIO | None = None,
    ready: Callable[[Service], None] | None = None,
    log_level: str = "info",
    log_format: str = "text",
) -> int:
    """Serve until SIGINT or SIGTERM, then drain and stop; return the exit status (0, or 1
    when draining did not finish in time). Logs go to ``stderr`` at ``log_level`` as
    ``log_format`` says (:mod:`._logs`: one line per decision). ``OSError`` when a port cannot
    be bound (its message names the address and port); ``ValueError`` naming a bad log level or
    format."""
    handler = install(log_level, log_format, stderr if stderr is not None else sys.stderr)
    try:
        return _serve(options, policy, ready)
    finally:
        uninstall(handler)


def _serve(options: ServeOptions, policy: Policy, ready: Callable[[Service], None] | None) -> int:
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
    store = service.guard.policy.store
    shown_store = redact_url(store) if store is not None else None
    _log.info(
        "OTLP/HTTP, decisions and /metrics on %s%s; mode %s%s%s; hold %gs (pid %d)",
        urls["http"],
        grpc_text,
        policy.mode.value,
        f"; sessions in {shown_store}" if shown_store else "",
        "; bearer token required" if options.token else "",
        options.hold_seconds,
        os.getpid(),
        extra={
            FIELDS: {
                "event": "started",
                "http": urls["http"],
                "grpc": urls.get("grpc"),
                "mode": policy.mode.value,
                "token_required": options.token is not None,
                "hold_seconds": options.hold_seconds,
                "key_by": options.key_by,
                "store": shown_store,
                "pid": os.getpid(),
            }
        },
    )
    if ready is not None:
        ready(service)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        _log.info("stopping; draining accepted spans", extra={FIELDS: {"event": "stopping"}})
        drained = service.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if drained:
        _log.info("stopped", extra={FIELDS: {"event": "stopped"}})
    else:
        _log.warning("stopped before everything was drained", extra={FIELDS: {"event": "stopped"}})
    return 0 if drained else 1
