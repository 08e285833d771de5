"""Coding-agent command hooks: ``otel-loopguard hook claude-code | gemini-cli | codex``.

The host runs the command before and after each tool call and on each user prompt, with the
event as JSON on stdin, and reads the answer as JSON on stdout: deny (the reason is shown to the
model), a reminder (added to what the model reads), or stop; and a line for the user when the
hook's own configuration cannot be used or an unknown ``LOOPGUARD_*`` variable is set. Each call
is a new process; the session's state is kept in a SQLite file between calls (:mod:`._store`), or
by a running ``otel-loopguard serve`` (``--server URL``, :mod:`._remote`).

- :mod:`._hosts`: each host's events and answers (pure).
- :mod:`._answers`: the answer protocol every entrance shares (the two backends below and serve's
  decision API): what a host is told before and after a call, where a reminder waits (pure).
- :mod:`._store`: the SQLite state file, safe under concurrent hook processes.
- :mod:`._transcript`: model usage from the host's transcript (Claude Code, Codex), read from
  where the last call stopped, each response charged once; genai-prices' rates kept between
  processes.
- :mod:`._runner`: one invocation, its failure modes, and the local backend.
- :mod:`._remote`: the backend that asks serve's decision API (one POST on a plain socket,
  :mod:`._wire`).

Importing this package does not import the OpenTelemetry SDK or the Prometheus client; the
runner, the remote backend and the store (SQLite) are imported when one of their names is first
used, so that serve's decision API imports :mod:`._answers` without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from ._answers import Backend, Misconfigured, Unavailable
from ._hosts import HOSTS, MAX_TEXT_CHARS, Answer, EventKind, HookEvent, Host, MalformedEvent

if TYPE_CHECKING:
    from ._remote import DEFAULT_TIMEOUT_SECONDS, TOKEN_ENV, RemoteBackend
    from ._runner import LocalBackend, answer_usage_error, decide, run
    from ._store import STORE_ENV, HookStore, StoreError, default_store_path

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
    "Misconfigured",
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

_LAZY = {
    "LocalBackend": "_runner",
    "answer_usage_error": "_runner",
    "decide": "_runner",
    "run": "_runner",
    "DEFAULT_TIMEOUT_SECONDS": "_remote",
    "TOKEN_ENV": "_remote",
    "RemoteBackend": "_remote",
    "STORE_ENV": "_store",
    "HookStore": "_store",
    "StoreError": "_store",
    "default_store_path": "_store",
}

__getattr__, __dir__ = lazy_names(__name__, __name__, _LAZY, globals(), __all__)
