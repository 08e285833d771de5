"""The ``--server URL`` backend: decisions from a running ``otel-loopguard serve``.

The server keeps the guard and every session; this process sends the host's event to its
decision API (``POST /v1/decisions/before``, ``/after``, ``/user_message``) and turns the answer
into the host's answer with the rules of :mod:`._answers`, as :class:`~._runner.LocalBackend` turns
its own guard's decision, so the same events get the same answers from either backend. The
server applies its own policy; the hook's ``--preset``, ``--config`` and ``LOOPGUARD_*`` settings
do not apply.

Reminders that wait for a call's result (hosts that take no context before a call) are kept by
the server too: the pre-tool request says ``"hold_reminder": true``, and the post-tool answer of
the same call carries the reminder. The post-tool answer also carries the text for a call that
only its result reported, phrased by the server (its policy's words), as the local backend
phrases it with :func:`~._answers.after_the_fact`; and a stop the server concludes from a call's
result (``"phase": "post"``, e.g. the third identical failure) becomes the host's stop, as the
local backend's does.

Model usage: where the host's transcript carries it (:mod:`._transcript`), the turns new since
the last call are sent first, one ``POST /v1/decisions/model_call`` each; where the transcript
was last read is kept in the hooks' SQLite file on this machine (``--store`` is refused with
``--server``: the default file, :func:`~._store.default_store_path`), as the local backend keeps
it. A turn the server does not take is sent again at the next call (those it took are
remembered); a state file that cannot be used only leaves usage unread (a note on stderr).

One request per invocation (and one per new model turn), a POST on a plain socket
(:mod:`._wire`: ``http.client`` cost a hook process more than its request), with a connect and
read timeout. No
connection, no answer in time, a status other than 200 (a wrong token: 401) or an answer that
is not the API's JSON raise :class:`~._answers.Unavailable`: the runner allows the call with a
note on stderr, or denies it with ``--fail-closed``, as for a broken local store. Nothing is
retried.
"""

from __future__ import annotations

import math
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

import orjson

from .._env import LOOPGUARD_SERVE_TOKEN
from .._memory import MAX_SCOPE_CHARS, repository_root
from .._policy import Action
from .._prices import ModelUsage
from .._trail import MAX_TASK_CHARS
from ._answers import Unavailable, answer_before
from ._hosts import ALLOWED, Answer, EventKind, HookEvent, Host
from ._store import HookStore, StoreError
from ._transcript import TRANSCRIPT_TURNS, charge_transcript
from ._wire import BadAnswer, post

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "RemoteBackend", "TOKEN_ENV"]

#: Environment variable holding the bearer token (declared in :mod:`otel_loopguard._env`, kept
#: here under this name for compatibility): ``serve`` requires it when set (``--token``
#: overrides it there), and the hooks send it (``--token`` overrides it here).
TOKEN_ENV: Final = LOOPGUARD_SERVE_TOKEN
#: Seconds to wait for the server to accept the connection, and for each read of its answer.
DEFAULT_TIMEOUT_SECONDS: Final = 2.0
#: An answer carries one decision (texts the guard keeps short); larger ones are not read.
_MAX_ANSWER_BYTES: Final = 1 << 20
#: How much of an error answer's text is quoted in the note on stderr.
_QUOTED_CHARS: Final = 200
#: Transcript marks kept with ``--server`` (the server's policy, which bounds sessions, is not
#: known here): idle ones are dropped after this many seconds, the oldest beyond this many.
MARK_TTL_SECONDS: Final = 7 * 24 * 3600.0
MAX_MARKS: Final = 10_000


class RemoteBackend:
    """Decisions from the decision API of the ``otel-loopguard serve`` at ``url`` (its HTTP
    port, e.g. ``http://127.0.0.1:4318``; a path prefix is kept). Raises ``ValueError`` for a
    URL, token or timeout it cannot use."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        marks: str | Path | None = None,
        note: Callable[[str], None] | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(url.strip())
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"--server: bad port in {url!r}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--server: expected http://HOST:PORT, got {url!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                f"--server: no credentials in the URL; pass the token with --token or {TOKEN_ENV}"
            )
        if parts.query or parts.fragment:
            raise ValueError(f"--server: expected no query or fragment, got {url!r}")
        if token is not None and (not token or any(c.isspace() for c in token)):
            raise ValueError("--token: expected a non-empty token without spaces")
        if isinstance(timeout_seconds, bool) or not (
            isinstance(timeout_seconds, (int, float))
            and timeout_seconds > 0
            and math.isfinite(timeout_seconds)
        ):
            raise ValueError(
                f"--timeout: expected a number of seconds > 0, got {timeout_seconds!r}"
            )
        self.url = urllib.parse.urlunsplit(
            (parts.scheme, parts.netloc, parts.path.rstrip("/"), "", "")
        )
        self.token = token
        self.timeout_seconds = float(timeout_seconds)
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port if port is not None else (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        #: Where transcript marks are kept (``None``: transcripts are not read).
        self.marks = None if marks is None else HookStore(marks)
        self._note = note if note is not None else (lambda _message: None)

    def answer(self, host: Host, event: HookEvent) -> Answer:
        ids: dict[str, object] = {"session": event.session, "agent": event.agent}
        if (
            self.marks is not None
            and event.transcript_path is not None
            and host.name in TRANSCRIPT_TURNS
            and os.path.exists(event.transcript_path)  # else the state file is not even made
        ):
            self._charge_transcript(self.marks, host, event, ids)
        if event.kind is EventKind.USER_PROMPT:
            # The prompt is what the server's advisor is told the task is, as a local hook's;
            # cut to what the guard keeps of it, so a pasted file never makes the request too
            # large (the new epoch must not be lost).
            text = event.prompt[:MAX_TASK_CHARS] if event.prompt else None
            self._post("user_message", {**ids, "text": text} if text else ids)
            return ALLOWED
        call = {**ids, "tool": event.tool, "arguments": event.arguments, "call_id": event.call_id}
        if event.cwd is not None:
            # Memory's scope is the caller's repository, found here (serve may run elsewhere).
            try:
                call["repository"] = repository_root(event.cwd)[:MAX_SCOPE_CHARS]
            except (OSError, ValueError):
                pass
        if event.kind is EventKind.PRE_TOOL:
            answer = self._post("before", {**call, "hold_reminder": not host.pre_tool_context})
            decision = self._decision(answer)
            if decision is None:
                raise self._unexpected("no decision for a call before it runs")
            return answer_before(host, *decision)
        if event.kind is not EventKind.POST_TOOL:
            return ALLOWED
        answer = self._post(
            "after",
            {
                **call,
                "error": event.error,
                "result": event.result,
                "duration_seconds": event.duration_seconds,
            },
        )
        decision = self._decision(answer)
        reminder = answer.get("reminder")
        if reminder is not None and not isinstance(reminder, str):
            raise self._unexpected(f"'reminder' is {type(reminder).__name__}, not text")
        if decision is not None and decision[0] is Action.STOP:
            return Answer(Action.STOP, decision[1])
        return Answer(Action.REMIND, reminder) if reminder else ALLOWED

    def _charge_transcript(
        self, marks: HookStore, host: Host, event: HookEvent, ids: Mapping[str, object]
    ) -> None:
        """Send the model turns new in the event's transcript (before its call: a turn comes
        before the calls it requests); keep where the read stopped."""
        refused: list[Unavailable] = []

        def charge(usage: ModelUsage) -> bool:
            if refused:
                return False
            body: dict[str, object] = {
                **ids,
                "model": usage.model,
                "provider": usage.provider,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_read_tokens": usage.cache_read_tokens,
                "cache_write_tokens": usage.cache_write_tokens,
            }
            if usage.reported_cost_usd is not None:
                body["reported_cost_usd"] = usage.reported_cost_usd
            try:
                self._post("model_call", body)
            except Unavailable as exc:
                refused.append(exc)
                return False
            return True

        def skip(reason: str, count: int) -> None:
            self._note(f"transcript: {count} model usage line(s) skipped ({reason})")

        key = orjson.dumps([host.name, event.session, event.agent]).decode()
        try:
            with marks.session(
                key,
                now=time.time(),
                ttl_seconds=MARK_TTL_SECONDS,
                max_sessions=MAX_MARKS,
                transcript=True,
            ) as row:
                mark = charge_transcript(host.name, event, row.transcript, charge, skip, self._note)
                if mark is not None:
                    row.transcript_save = mark
        except StoreError as exc:
            self._note(f"{exc}; no model usage read")
        if refused:
            self._note(f"{refused[0]}; model usage sent again at the next call")

    # -- the wire ----------------------------------------------------------------------------

    def _post(self, endpoint: str, body: Mapping[str, object]) -> dict[str, object]:
        where = f"server {self.url}"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            status, data = post(
                self._host,
                self._port,
                f"{self._prefix}/v1/decisions/{endpoint}",
                orjson.dumps(body),
                headers,
                timeout=self.timeout_seconds,
                limit=_MAX_ANSWER_BYTES,
                tls=self._https,
            )
        except TimeoutError:
            raise Unavailable(f"{where}: no answer within {self.timeout_seconds:g} s") from None
        except ConnectionRefusedError:
            raise Unavailable(f"{where}: connection refused") from None
        except OSError as exc:
            raise Unavailable(
                f"{where}: {_one_line(exc.strerror or str(exc) or repr(exc))}"
            ) from None
        except BadAnswer as exc:
            raise Unavailable(f"{where}: {_one_line(str(exc))}") from None
        if status != 200:
            raise Unavailable(f"{where}: HTTP {status}{_quoted_error(data)}")
        if len(data) > _MAX_ANSWER_BYTES:
            raise Unavailable(f"{where}: answer larger than {_MAX_ANSWER_BYTES} bytes")
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise Unavailable(f"{where}: the answer is not JSON") from None
        if not isinstance(answer, dict):
            raise self._unexpected(f"a JSON {type(answer).__name__}, not an object")
        return answer

    def _decision(self, answer: Mapping[str, object]) -> tuple[Action, str] | None:
        """The action and message of the answer's ``decision`` (``None`` when it is null)."""
        if "decision" not in answer:
            raise self._unexpected("no 'decision'")
        decision = answer["decision"]
        if decision is None:
            return None
        if not isinstance(decision, dict):
            raise self._unexpected("'decision' is not an object")
        try:
            action = Action(decision.get("action"))
        except ValueError:
            raise self._unexpected(f"unknown action {decision.get('action')!r}") from None
        message = decision.get("message", "")
        if not isinstance(message, str):
            raise self._unexpected("the decision's 'message' is not text")
        return action, message

    def _unexpected(self, what: str) -> Unavailable:
        return Unavailable(f"server {self.url}: unexpected answer ({what})")


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _QUOTED_CHARS else text[:_QUOTED_CHARS] + "…"


def _quoted_error(data: bytes) -> str:
    """`` (the error text)`` of an error answer, when it has one (JSON ``error``/``message``)."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ""
    text = body.get("error", body.get("message")) if isinstance(body, dict) else None
    return f" ({_one_line(text)})" if isinstance(text, str) and text.strip() else ""
