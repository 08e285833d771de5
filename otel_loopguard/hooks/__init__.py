"""Coding-agent command hooks: ``otel-loopguard hook claude-code | gemini-cli | codex``.

The host runs the command before and after each tool call and on each user prompt, with the
event as JSON on stdin, and reads the answer as JSON on stdout: deny (the reason is shown to the
model), a reminder (added to what the model reads), or stop. Each call is a new process; the
session's state is kept in a SQLite file between calls (:mod:`.store`), or by a running
``otel-loopguard serve`` (``--server URL``, :mod:`.remote`).

- :mod:`.hosts`: each host's events and answers (pure).
- :mod:`.store`: the SQLite state file, safe under concurrent hook processes.
- :mod:`.runner`: one invocation, its failure modes, and the :class:`~.runner.Backend` role.
- :mod:`.remote`: the backend that asks serve's decision API (standard-library HTTP client,
  imported only when it is used).

Importing this package does not import the OpenTelemetry SDK or the Prometheus client.
"""

from __future__ import annotations

from .hosts import HOSTS, MAX_TEXT_CHARS, Answer, EventKind, HookEvent, Host, MalformedEvent
from .runner import Backend, LocalBackend, Unavailable, answer_usage_error, decide, run
from .remote import DEFAULT_TIMEOUT_SECONDS, TOKEN_ENV, RemoteBackend
from .store import STORE_ENV, HookStore, StoreError, default_store_path

__all__ = [
    "Answer",
    "Backend",
    "DEFAULT_TIMEOUT_SECONDS",
    "EventKind",
    "HOSTS",
    "HookEvent",
    "HookStore",
    "Host",
    "LocalBackend",
    "MAX_TEXT_CHARS",
    "MalformedEvent",
    "RemoteBackend",
    "STORE_ENV",
    "StoreError",
    "TOKEN_ENV",
    "Unavailable",
    "answer_usage_error",
    "decide",
    "default_store_path",
    "run",
]
