"""One command-hook invocation: the host's event on stdin, its answer on stdout, exit 0.

Every tool call of the coding agent waits for this process, so it stays small: no OpenTelemetry
SDK, no Prometheus client, one SQLite transaction (or one HTTP request with ``--server``). Where
the host's transcript carries model usage, the turns new since the last call are charged first
(:mod:`._transcript`), priced without importing genai-prices once a model's rates are kept.

It never raises and always exits 0 with a JSON object on stdout: the hosts treat a crash, a
timeout or another exit status as "allow" anyway, and an answer they cannot read is lost.

- Stdin that is not JSON, or not an event this host sends: a note on stderr, ``{}`` (allow).
- An event of the host that the guard does not decide (the hook installed for another event):
  a note on stderr naming the events it does decide, ``{}``.
- The policy (``--preset``, ``--config``, ``LOOPGUARD_*``) or the state store cannot be used,
  or with ``--server`` the server does not answer a decision (down, too slow, a wrong token, an
  error status, not its JSON): a note on stderr, then allow (fail-open) or, with
  ``--fail-closed``, deny the tool call.
- When that reason is the hook's own configuration (a policy or plugin file, the command line,
  a token setting: :class:`~._answers.Misconfigured`) and the call is allowed (or the event is a
  prompt), the user is told too, in the host's user-visible channel (:attr:`Answer.notice`,
  :data:`MISCONFIGURED_TEXT`): stderr reaches the user only when a hook fails, so the guard
  would otherwise be off without a word. With ``--fail-closed`` the denial's reason says it.
  Not after a call: its pre-tool event already said it.
- ``LOOPGUARD_*`` variables that nothing reads (typos) are named to the user the same way, with
  the closest known names, on every pre-tool and prompt event: each invocation is a process of
  its own, and a warning once per session would need the store, which may be the problem.
- One session's saved state is unreadable: a note on stderr; that session starts afresh.

Where decisions are made is the :class:`Backend` role. :class:`LocalBackend` runs a
:class:`~otel_loopguard._guard.LoopGuard` here on the session saved in the SQLite store;
:class:`~._remote.RemoteBackend` (``--server URL``) asks a running ``otel-loopguard serve``, which
keeps the sessions. Both give the host the same answers for the same events: the rules are in
:mod:`._answers`, shared by both backends and by the decision API of ``serve``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final, TextIO

import orjson

from .._engine import MAX_PENDING_CALLS
from .._env import LOOPGUARD_SERVE_TOKEN
from .._policy import Action
from .._token import EmptyToken, read_token
from ..config import MemoryScope, Policy, load_policy, unknown_variables
from ._answers import (
    Backend,
    Misconfigured,
    Unavailable,
    answer_before,
    decide_after,
    decide_before,
)
from ._hosts import ALLOWED, HOSTS, Answer, EventKind, HookEvent, Host, MalformedEvent
from ._store import DEFAULT_BUSY_TIMEOUT_SECONDS, HookStore, Row, StoreError, default_store_path
from ._transcript import (
    PRICES_SUFFIX,
    TRANSCRIPT_TURNS,
    KnownPrices,
    Reading,
    mark_after,
    read_transcript,
)

if TYPE_CHECKING:
    from .._guard import LoopGuard

__all__ = [
    "FAIL_CLOSED_TEXT",
    "MAX_STDIN_BYTES",
    "MISCONFIGURED_TEXT",
    "NOTICE_PREFIX",
    "Backend",
    "LocalBackend",
    "Unavailable",
    "answer_usage_error",
    "decide",
    "run",
]

#: Larger stdin (a huge tool result) is not read: the call is allowed with a note.
MAX_STDIN_BYTES: Final = 64 << 20
#: Reminders waiting for their call's result, per session; the oldest is dropped beyond this.
MAX_NOTES: Final = MAX_PENDING_CALLS
#: The denial given with ``--fail-closed`` when the guard cannot check a call.
FAIL_CLOSED_TEXT: Final = (
    "[loopguard] Not run: the loop guard could not check this call ({reason}) and is set to"
    " refuse calls it cannot check. Tell the user that the loop guard needs attention."
)
#: How a line for the user (:attr:`Answer.notice`) starts.
NOTICE_PREFIX: Final = "[loopguard] "
#: The user's line when the hook's configuration cannot be used and the call is allowed.
MISCONFIGURED_TEXT: Final = "not checking tool calls until this is fixed: {reason}"
_PROGRAM: Final = "otel-loopguard hook"

Note = Callable[[str], None]


class LocalBackend:
    """A guard in this process, on the session kept in the SQLite store at ``store_path``, or
    in the policy's shared store (Redis) when it names one."""

    def __init__(self, policy: Policy, store_path: Path, note: Note) -> None:
        if policy.memory is True:
            # Dead ends are remembered here by default (runs of one repository follow each
            # other): in the state file, or in the shared Redis store when there is one.
            where = policy.store if policy.store is not None else str(store_path)
            policy = policy.replace(memory=where)
        from .._memory import defer_writes  # the local path only: --server keeps no memory here

        # The state file is held while the guard decides: dead ends are written after.
        defer_writes()
        self.policy = policy
        busy = DEFAULT_BUSY_TIMEOUT_SECONDS
        if policy.advisor_command:
            busy += policy.advisor_timeout_seconds  # a rescue holds the store while it asks
        self.store = HookStore(store_path, busy_timeout_seconds=busy)
        #: genai-prices' rates of the models transcripts named, kept beside the store.
        self.prices = KnownPrices(store_path.with_name(store_path.name + PRICES_SUFFIX))
        self._note = note

    def answer(self, host: Host, event: HookEvent) -> Answer:
        from .._engine import SessionState
        from .._guard import LoopGuard  # the local path only: --server needs no guard
        from .._memory import flush_memories

        policy = self.policy
        try:
            # Wall-clock time: session TTL and advisor cooldown span processes.
            guard = LoopGuard(policy, clock=time.time)
        except ValueError as exc:  # e.g. an advisor_command that cannot be split
            raise Misconfigured(f"policy: {exc}") from None
        if policy.store is not None:
            return self._answer_shared(guard, host, event)
        key = orjson.dumps([host.name, event.session, event.agent]).decode()
        # A prompt without an agent is the user's: as guard.user_message(session) does, it
        # starts a new epoch (and lifts a stop) for the sub-agents' rows of the session too.
        prefix = None
        if event.kind is EventKind.USER_PROMPT and event.agent is None:
            prefix = orjson.dumps([host.name, event.session]).decode()[:-1] + ","
        now = time.time()
        try:
            with self.store.session(
                key,
                now=now,
                ttl_seconds=policy.session_ttl_seconds,
                max_sessions=policy.max_sessions,
                related_prefix=prefix,
                transcript=_reads_transcript(host, event),
            ) as row:
                for problem in row.problems:
                    self._note(f"session {event.session!r}: {problem}; starting it afresh")
                reading = self._read_transcript(host, event, row)
                if reading is not None:
                    guard = self._priced(guard, reading)
                if row.state:  # empty: a row kept only for reminders (a shared store's)
                    try:
                        state = SessionState.from_bytes(row.state, policy)
                    except ValueError as exc:
                        self._note(f"session {event.session!r}: {exc}; starting it afresh")
                    else:
                        guard.import_session(event.session, state, agent=event.agent)
                self._scope(guard, event)
                agents = self._import_related(guard, event.session, row.related, policy)
                self._charge(guard, event, row, reading)
                answer = decide(host, event, guard, row.notes, policy)
                guard.close(wait=True)  # a rescue's advice is cached before the state is saved
                saved = guard.export_session(event.session, agent=event.agent)
                if saved is not None:
                    while len(row.notes) > MAX_NOTES:
                        del row.notes[next(iter(row.notes))]
                    row.save = saved.to_bytes()
                for other, agent in agents.items():
                    kept = guard.export_session(event.session, agent=agent)
                    if kept is not None:
                        row.related_save[other] = kept.to_bytes()
        except StoreError as exc:
            raise Unavailable(str(exc)) from None
        flush_memories()  # a dead end recorded while the state file was held is written now
        return answer

    def _scope(self, guard: LoopGuard, event: HookEvent) -> None:
        """The session's memory scope: the repository of the payload's ``cwd`` (else the
        guard's own: the hook process's working directory)."""
        from .._engine import SessionState
        from .._memory import scope_of

        policy = self.policy
        if (
            policy.memory is False
            or event.cwd is None
            or policy.memory_scope is not MemoryScope.REPOSITORY
            or event.kind is EventKind.OTHER
        ):
            return
        state = guard.export_session(event.session, agent=event.agent)
        if state is None:
            state = SessionState(time.time())
            guard.import_session(event.session, state, agent=event.agent)
        if state.scope is None:  # kept with the session: the git root is looked for once
            state.scope = scope_of(policy, directory=event.cwd)

    def _answer_shared(self, guard: LoopGuard, host: Host, event: HookEvent) -> Answer:
        """With a shared store (``policy.store``: Redis) the guard keeps the session there,
        read and written atomically by every process deciding its calls; the SQLite row keeps
        only the reminders waiting for a call's result (a call's events run on one machine),
        with an empty state."""
        policy = self.policy
        key = orjson.dumps([host.name, event.session, event.agent]).decode()
        try:
            with self.store.session(
                key,
                now=time.time(),
                ttl_seconds=policy.session_ttl_seconds,
                max_sessions=policy.max_sessions,
                transcript=_reads_transcript(host, event),
            ) as row:
                had_notes = bool(row.notes)
                reading = self._read_transcript(host, event, row)
                if reading is not None:
                    guard = self._priced(guard, reading)
                self._charge(guard, event, row, reading)
                answer = decide(host, event, guard, row.notes, policy)
                guard.close(wait=True)
                while len(row.notes) > MAX_NOTES:
                    del row.notes[next(iter(row.notes))]
                if row.notes or had_notes:
                    row.save = b""
        except StoreError as exc:
            raise Unavailable(str(exc)) from None
        finally:
            guard.close(wait=True)
        return answer

    def _read_transcript(self, host: Host, event: HookEvent, row: Row) -> Reading | None:
        """The model turns new in the event's transcript, lines that did not read noted
        (counted once the guard is known: :meth:`_charge`)."""
        skipped: dict[str, int] = {}

        def skip(reason: str, count: int) -> None:
            skipped[reason] = skipped.get(reason, 0) + count
            self._note(f"transcript: {count} model usage line(s) skipped ({reason})")

        reading = read_transcript(host.name, event, row.transcript, skip, self._note)
        if reading is not None:
            reading.skipped = skipped
        return reading

    def _priced(self, guard: LoopGuard, reading: Reading) -> LoopGuard:
        """``guard``, or one whose price table also holds the kept rates of the new turns'
        models (:class:`~._transcript.KnownPrices`; the user's entries still first), so that
        pricing them does not import genai-prices in this process."""
        from .._guard import LoopGuard

        entries = self.prices.table(reading.turns)
        if not entries:
            return guard
        policy = self.policy
        try:
            priced = LoopGuard(policy.replace(prices=policy.prices + entries), clock=time.time)
        except ValueError:
            return guard  # not expected (the policy was checked); the slower way still prices
        guard.close()
        return priced

    def _charge(
        self, guard: LoopGuard, event: HookEvent, row: Row, reading: Reading | None
    ) -> None:
        """Charge the model turns read (before the event's call is counted: a turn comes
        before the calls it requests) and keep where the read stopped."""
        if reading is None:
            return
        for reason, count in reading.skipped.items():
            for _ in range(count):
                guard.model_call_skipped(reason)
        for turn in reading.turns:
            guard.model_call(turn.usage, session=event.session, agent=event.agent)
        mark = mark_after(reading, row.transcript, len(reading.turns))
        if mark is not None:
            row.transcript_save = mark

    @staticmethod
    def _import_related(
        guard: LoopGuard, session: str, related: dict[str, bytes], policy: Policy
    ) -> dict[str, str]:
        """Import the sub-agents' rows of ``session`` (key -> state); their keys -> agents.
        A row that cannot be read is left as it is."""
        from .._engine import SessionState

        agents: dict[str, str] = {}
        for other, data in related.items():
            try:
                parts = orjson.loads(other)
                agent = parts[2] if isinstance(parts, list) and len(parts) == 3 else None
                if not isinstance(agent, str):
                    continue
                guard.import_session(session, SessionState.from_bytes(data, policy), agent=agent)
            except (orjson.JSONDecodeError, ValueError):
                continue
            agents[other] = agent
        return agents


def _reads_transcript(host: Host, event: HookEvent) -> bool:
    """Whether the event's transcript is read for model usage (the host's lines are known)."""
    return event.transcript_path is not None and host.name in TRANSCRIPT_TURNS


def decide(
    host: Host, event: HookEvent, guard: LoopGuard, notes: dict[str, str], policy: Policy
) -> Answer:
    """Feed ``event`` to ``guard`` and say what the host should be told, by the rules of
    :mod:`._answers` (shared with the remote backend and serve's decision API).

    1. A prompt starts a new progress epoch (and lifts a stop).
    2. Before a call: deny, rescue (a denial with advice) and stop block it. A reminder goes out
       at once where the host takes context before a call; elsewhere it is kept in ``notes``
       under the call's id (else its signature) and shown with the call's result.
    3. After a call: the outcome is added to the attempt counted before it, and a kept reminder
       is shown. A call no pre-tool event counted is counted now; having run, it can only be
       reminded about (or the run stopped).
    """
    if event.kind is EventKind.USER_PROMPT:
        # The prompt is what an advisor is told the task is (kept only with an advisor).
        guard.user_message(event.session, agent=event.agent, text=event.prompt)
        return ALLOWED
    if event.kind is EventKind.PRE_TOOL:
        decision = decide_before(
            guard,
            event.tool,
            event.arguments,
            session=event.session,
            agent=event.agent,
            call_id=event.call_id,
            held=None if host.pre_tool_context else _Notes(notes),
        )
        return answer_before(host, decision.action, decision.message)
    if event.kind is not EventKind.POST_TOOL:
        return ALLOWED
    _, shown = decide_after(
        guard,
        event.tool,
        event.arguments,
        session=event.session,
        agent=event.agent,
        call_id=event.call_id,
        error=event.error,
        result=event.result,
        duration_seconds=event.duration_seconds,
        held=_Notes(notes),
        policy=policy,
    )
    return shown


class _Notes:
    """A session's waiting reminders as the store row keeps them (a dict, oldest first)."""

    __slots__ = ("_notes",)

    def __init__(self, notes: dict[str, str]) -> None:
        self._notes = notes

    def __len__(self) -> int:
        return len(self._notes)

    def hold(self, ref: str, text: str) -> None:
        notes = self._notes
        notes.pop(ref, None)
        notes[ref] = text  # newest last

    def take(self, ref: str) -> str | None:
        return self._notes.pop(ref, None)


def run(
    host_name: str,
    *,
    store: str | None = None,
    preset: str | None = None,
    config: str | None = None,
    fail_closed: bool = False,
    problem: str | None = None,
    server: str | None = None,
    plugin_config: str | None = None,
    token: str | None = None,
    timeout_seconds: float | None = None,
    token_file: str | None = None,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    stderr: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Answer one hook event of ``host_name`` read from ``stdin``; always returns 0.

    ``problem``: a reason the guard cannot decide that is already known (a command line that
    could not be parsed); the event is then answered as when the store is unusable.
    ``plugin_config``: a plugin's configuration file read as is (``[NAME=]FILE``, see
    :func:`otel_loopguard._plugins.load_plugin_config`), instead of ``preset``.
    ``server``: ask the ``otel-loopguard serve`` at this URL instead of keeping state in
    ``store`` (:class:`~._remote.RemoteBackend`), with ``token`` (or the one in the file
    ``token_file``; default: ``$LOOPGUARD_SERVE_TOKEN``) and ``timeout_seconds`` (default: 2);
    its failures are answered as an unusable store's.
    """
    err = stderr if stderr is not None else sys.stderr
    out = stdout if stdout is not None else sys.stdout.buffer

    def note(message: str) -> None:
        try:
            err.write(f"{_PROGRAM} {host_name}: {message}\n")
            err.flush()
        except (OSError, ValueError):
            pass  # nowhere left to say it

    answer_json: dict[str, object] = {}
    try:
        answer_json = _answer_json(
            host_name,
            store,
            (preset, config, plugin_config),
            fail_closed,
            problem,
            (server, token, timeout_seconds, token_file),
            stdin if stdin is not None else sys.stdin.buffer,
            environ,
            note,
        )
    except Exception as exc:  # the last line: a bug here must still leave the host an answer
        note(f"internal error ({type(exc).__name__}: {exc}); allowing the call")
        answer_json = {}
    try:
        out.write(orjson.dumps(answer_json) + b"\n")
        out.flush()
    except (OSError, ValueError):
        pass  # the host went away; nothing to answer
    return 0


def _answer_json(
    host_name: str,
    store: str | None,
    policy_sources: tuple[str | None, str | None, str | None],
    fail_closed: bool,
    problem: str | None,
    remote: tuple[str | None, str | None, float | None, str | None],
    stdin: BinaryIO,
    environ: Mapping[str, str] | None,
    note: Note,
) -> dict[str, object]:
    preset, config, plugin_config = policy_sources
    host = HOSTS.get(host_name)
    if host is None:
        note(f"unknown host (one of {', '.join(HOSTS)}); allowing the call")
        return {}
    try:
        data = stdin.read(MAX_STDIN_BYTES + 1)
        if len(data) > MAX_STDIN_BYTES:
            raise MalformedEvent(f"stdin larger than {MAX_STDIN_BYTES} bytes")
        event = host.parse(orjson.loads(data))
    except (orjson.JSONDecodeError, MalformedEvent) as exc:
        note(f"stdin is not a {host_name} hook event ({exc}); allowing the call")
        return {}
    if event.kind is EventKind.OTHER:
        # Installed for an event it does not decide: harmless, but the user should know.
        note(
            f"event {event.name!r} is not one this hook decides"
            f" ({', '.join(host.events)}); nothing to do"
        )
        return {}
    # What the user is shown (not after a call: its pre-tool event showed it).
    notices = (
        list(unknown_variables(environ).values()) if event.kind is not EventKind.POST_TOOL else []
    )
    try:
        if problem is not None:
            raise Misconfigured(problem)
        backend: Backend
        if remote[0] is not None:
            backend = _remote_backend(remote, store, policy_sources, environ, note)
        else:
            try:
                policy = load_policy(preset, config, environ, plugin_config)
            except ValueError as exc:
                raise Misconfigured(f"policy: {exc}") from None
            try:
                path = Path(store).expanduser() if store else default_store_path(environ)
            except StoreError as exc:
                raise Unavailable(str(exc)) from None
            backend = LocalBackend(policy, path, note)
        answer = backend.answer(host, event)
    except Unavailable as exc:
        if fail_closed and event.kind is EventKind.PRE_TOOL:
            note(f"{exc}; denying the call (--fail-closed)")
            answer = Answer(Action.DENY, FAIL_CLOSED_TEXT.format(reason=exc))
        else:
            note(
                f"{exc}; allowing the call (fail-open)"
                if event.kind is EventKind.PRE_TOOL
                else f"{exc}; nothing recorded"
            )
            answer = ALLOWED
            if isinstance(exc, Misconfigured) and event.kind is not EventKind.POST_TOOL:
                notices.insert(0, MISCONFIGURED_TEXT.format(reason=exc))
    if notices:
        # One line: the hosts show it as it is.
        text = NOTICE_PREFIX + "; ".join(" ".join(notice.split()) for notice in notices)
        answer = dataclasses.replace(answer, notice=text)
    return host.render(event, answer)


def _remote_backend(
    remote: tuple[str | None, str | None, float | None, str | None],
    store: str | None,
    policy_sources: tuple[str | None, str | None, str | None],
    environ: Mapping[str, str] | None,
    note: Note,
) -> Backend:
    from ._remote import DEFAULT_TIMEOUT_SECONDS, RemoteBackend  # only the --server path

    url, token, timeout, token_file = remote
    preset, config, plugin_config = policy_sources
    assert url is not None
    local = [
        name
        for name, value in (
            ("--store", store),
            ("--preset", preset),
            ("--config", config),
            ("--plugin-config", plugin_config),
        )
        if value
    ]
    if local:
        raise Misconfigured(
            f"{', '.join(local)} cannot be combined with --server (the server keeps"
            f" the sessions and applies its own policy)"
        )
    if token is not None and token_file is not None:
        raise Misconfigured("--token and --token-file: give one")
    try:
        found = read_token(token, token_file, environ)
    except EmptyToken as exc:
        if exc.where == LOOPGUARD_SERVE_TOKEN:
            # A security setting: an empty one is an error, not "no token" (env.py).
            raise Misconfigured(
                f"{LOOPGUARD_SERVE_TOKEN} is set but empty; give the server's token, or unset it"
            ) from None
        raise Misconfigured(f"{exc}; give the server's token") from None
    except ValueError as exc:
        raise Misconfigured(str(exc)) from None
    token = None if found is None else found[0]
    try:
        marks: Path | None = default_store_path(environ)  # where transcripts were last read
    except StoreError as exc:
        note(f"{exc}; no model usage read")
        marks = None
    try:
        return RemoteBackend(
            url,
            token=token,
            timeout_seconds=(DEFAULT_TIMEOUT_SECONDS if timeout is None else timeout),
            marks=marks,
            note=note,
        )
    except ValueError as exc:
        raise Misconfigured(str(exc)) from None


def answer_usage_error(argv: Sequence[str], message: str) -> int:
    """Answer a ``hook`` command line that could not be parsed (``argv`` after ``hook``): the
    host still gets a JSON answer and exit status 0, as when the store is unusable."""
    host_name = next((arg for arg in argv if arg in HOSTS), "")
    return run(
        host_name, fail_closed="--fail-closed" in argv, problem=f"bad command line ({message})"
    )
