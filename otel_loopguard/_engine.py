"""Per-session state, bounded, and the bookkeeping that feeds the rules.

Nothing here locks, logs or counts metrics: the guard holds its lock around these calls and
reports what they return. Every structure is bounded: sessions by ``max_sessions`` (LRU) and
``session_ttl_seconds`` (idle), signatures per session by ``max_signatures_per_session`` (LRU),
the window by ``window_size``, pending hook calls by :data:`MAX_PENDING_CALLS`.

A session's state can leave the process and come back (:meth:`SessionState.to_bytes`,
:meth:`SessionState.from_bytes`, :meth:`SessionStore.put`): command hooks run one process per
call and keep sessions in a file between calls.
"""

from __future__ import annotations

import math
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import orjson

from ._calls import MAX_TOOL_NAME_CHARS as MAX_TOOL_CHARS
from .config import Policy, wildcard_union

__all__ = [
    "MAX_COMMAND_CHARS",
    "MAX_PENDING_CALLS",
    "MAX_TASK_CHARS",
    "MAX_TRAIL_ARGUMENT_CHARS",
    "MAX_TRAIL_CALLS",
    "MAX_TRAIL_OUTPUT_CHARS",
    "Classifier",
    "Pending",
    "ReportLedger",
    "SessionState",
    "SessionStore",
    "STORE_SNAPSHOT_VERSION",
    "SignatureState",
    "Trail",
    "TrailCall",
    "shell_command",
]

#: Hook calls awaiting their ``after_tool`` per session; the oldest is forgotten beyond this.
MAX_PENDING_CALLS: Final = 64
#: Shell commands longer than this are matched on their first this-many characters only.
MAX_COMMAND_CHARS: Final = 4096
#: What a session remembers for an advisor's question (kept only by a guard that can ask one):
#: its latest calls (oldest forgotten first), each call's canonical arguments and output cut to
#: these many characters, and the task and the latest user message cut to MAX_TASK_CHARS.
MAX_TRAIL_CALLS: Final = 8
MAX_TRAIL_ARGUMENT_CHARS: Final = 300
MAX_TRAIL_OUTPUT_CHARS: Final = 1000
MAX_TASK_CHARS: Final = 2000
_MAX_KEY_CHARS: Final = 64
_COMMAND_KEYS: Final = ("command", "cmd", "script", "commands")
_MAX_CACHED_TOOL_NAMES: Final = 1024
#: Characters of a ``command``/``action`` value searched for its first word (an operation name).
_MAX_OPERATION_CHARS: Final = 64
_EXPIRY_INTERVAL_SECONDS: Final = 1.0
#: Version of the :meth:`SessionState.to_bytes` layout; other versions are refused on load.
_SNAPSHOT_VERSION: Final = 1
#: Version of the :meth:`SessionStore.snapshot` layout; :meth:`SessionStore.restore` refuses
#: others.
STORE_SNAPSHOT_VERSION: Final = 1


def shell_command(arguments: object) -> str | None:
    """Return the shell command in a shell tool's (canonical) arguments, if there is one.

    Accepts ``{"command": "..."}`` (and ``cmd``/``script``), an argv list such as Codex's
    ``["bash", "-lc", "..."]`` (joined with spaces), or a bare string.
    """
    value: object = arguments
    if isinstance(arguments, Mapping):
        for key in _COMMAND_KEYS:
            if key in arguments:
                value = arguments[key]
                break
        else:
            return None
    if isinstance(value, str):
        return value[:MAX_COMMAND_CHARS]
    if isinstance(value, (list, tuple)) and all(isinstance(part, str) for part in value):
        return " ".join(value)[:MAX_COMMAND_CHARS]
    return None


class Classifier:
    """Answers "is this call tracked?" and "does it make progress?" from the policy's patterns.

    A call mutates when, in this order:

    1. the first word of its ``command`` or ``action`` argument names a mutating operation
       (``mutating_operations``: ``create``, ``str_replace``, ``insert`` ...);
    2. it carries a shell command line (a shell tool by name, or any tool whose ``command``,
       ``cmd`` or ``script`` argument is a string or an argv list) matching ``mutating_commands``;
    3. that first word names a read operation (``read_operations``: ``view``, ``open`` ...): it
       only reads, whatever the tool's name;
    4. the tool's name is in ``mutating_tools``.

    Tool-name answers are cached (bounded); the operation and command checks run per call.
    """

    def __init__(self, policy: Policy) -> None:
        # An empty include list means every tool, as in the plugins (Policy stores it as "*").
        self._include = (
            None if "*" in policy.include or not policy.include else wildcard_union(policy.include)
        )
        # A final-answer tool is never tracked: a user's exclude list adds to them.
        self._exclude = wildcard_union((*policy.exclude, *policy.final_answer_tools))
        self._shell = wildcard_union(policy.shell_tools)
        self._mutating = wildcard_union(policy.mutating_tools)
        self._read_operations = wildcard_union(policy.read_operations)
        self._mutating_operations = wildcard_union(policy.mutating_operations)
        self._exclude_commands = _union(policy.exclude_commands)
        self._mutating_commands = _union(policy.mutating_commands)
        # tool -> (tracked by name, is a shell tool, mutating by name)
        self._cache: dict[str, tuple[bool, bool, bool]] = {}

    def tool_kind(self, tool: str) -> tuple[bool, bool, bool]:
        """Return (tracked by name, shell tool, mutating by name) for ``tool``."""
        kind = self._cache.get(tool)
        if kind is None:
            tracked = (self._include is None or _matches(self._include, tool)) and not _matches(
                self._exclude, tool
            )
            kind = (tracked, _matches(self._shell, tool), _matches(self._mutating, tool))
            if len(self._cache) >= _MAX_CACHED_TOOL_NAMES:
                self._cache.clear()
            self._cache[tool] = kind
        return kind

    def classify(self, tool: str, arguments: object) -> tuple[bool, bool]:
        """Return (tracked, mutating) for a call of ``tool`` with canonical ``arguments``."""
        kind = self._cache.get(tool)
        tracked, shell, mutating = kind if kind is not None else self.tool_kind(tool)
        if not tracked:
            return False, False
        command: str | None = None
        operation: str | None = None
        if isinstance(arguments, Mapping):
            named = arguments.get("command", arguments.get("action"))
            if isinstance(named, str):
                operation = _first_word(named)
            if shell or "command" in arguments or "cmd" in arguments or "script" in arguments:
                command = shell_command(arguments)
        elif shell:
            command = shell_command(arguments)
        if (
            command is not None
            and self._exclude_commands is not None
            and self._exclude_commands.search(command)
        ):
            return False, False
        if operation is not None and _matches(self._mutating_operations, operation):
            return True, True
        if (
            command is not None
            and self._mutating_commands is not None
            and self._mutating_commands.search(command)
        ):
            return True, True
        if operation is not None and _matches(self._read_operations, operation):
            return True, False
        return True, mutating


def _first_word(text: str) -> str:
    """The first word of a ``command``/``action`` value: the operation it names, if any."""
    head = text[:_MAX_OPERATION_CHARS].split(None, 1)
    return head[0] if head else ""


def _matches(union: re.Pattern[str] | None, name: str) -> bool:
    return union is not None and union.fullmatch(name) is not None


class _AnyOf:
    """Patterns that cannot share one regex (global inline flags such as ``(?i)`` must start
    a pattern), searched one after another."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self._patterns = [re.compile(p) for p in patterns]

    def search(self, text: str) -> bool:
        return any(p.search(text) for p in self._patterns)


def _union(patterns: tuple[str, ...]) -> re.Pattern[str] | _AnyOf | None:
    """One regex matching any of ``patterns`` (one scan per command), or, when they cannot be
    joined, a matcher trying each in turn."""
    if not patterns:
        return None
    try:
        return re.compile("|".join(f"(?:{p})" for p in patterns))
    except re.error:
        return _AnyOf(patterns)


class SignatureState:
    """What one session remembers about one signature in the current epoch."""

    __slots__ = (
        "changed",
        "count",
        "failed",
        "last_outcome",
        "looped",
        "novel_seen",
        "refused",
        "same_outcomes",
    )

    def __init__(self) -> None:
        self.count = 0
        self.last_outcome: str | None = None
        self.same_outcomes = 0
        self.changed = False
        self.failed = False  # the last known outcome was a failure
        self.novel_seen = 0  # the session's ``novel`` count at this signature's last attempt
        self.looped = False  # repeated once with nothing new since its previous attempt
        # Attempts refused (they never ran) since last_outcome first came: the no_progress
        # evidence counts them as repeats too (rules.Verdict.refused).
        self.refused = 0


class TrailCall:
    """One remembered call, or a run of the same call repeated back to back: tool, cut
    canonical arguments, args key, how the latest attempt ended (``"ok"``, ``"error"``,
    ``"ran"`` (failure unknown), ``"refused"``, or ``None`` while unknown), the latest cut
    output, the attempts in the run (``times``) and how many of them were refused."""

    __slots__ = ("arguments", "key", "outcome", "output", "refused", "times", "tool")

    def __init__(
        self,
        tool: str,
        arguments: str,
        key: str,
        outcome: str | None,
        output: str | None,
        times: int = 1,
        refused: int = 0,
    ) -> None:
        self.tool = tool
        self.arguments = arguments
        self.key = key
        self.outcome = outcome
        self.output = output
        self.times = times
        self.refused = refused


class Trail:
    """What a session remembers so that an advisor can be asked a real question: the task,
    the latest user message and the latest :data:`MAX_TRAIL_CALLS` calls, every text cut to
    its bound (a session's trail stays under about 17k characters, tool names included)."""

    __slots__ = ("calls", "latest_message", "task")

    def __init__(self) -> None:
        self.calls: deque[TrailCall] = deque(maxlen=MAX_TRAIL_CALLS)  # the oldest falls out
        self.task: str | None = None
        self.latest_message: str | None = None

    def add(
        self,
        tool: str,
        arguments: str,
        key: str,
        outcome: str | None,
        output: str | None,
        times: int = 1,
        refused: int = 0,
    ) -> None:
        """Remember a call: a repeat of the latest one adds to its run (so a loop does not push
        the calls before it out); another starts an entry (the oldest is forgotten beyond the
        bound)."""
        calls = self.calls
        if output is not None:
            output = output[:MAX_TRAIL_OUTPUT_CHARS]
        if calls and calls[-1].key == key:
            last = calls[-1]
            last.times += times
            last.refused += refused if outcome != "refused" else max(refused, 1)
            last.outcome = outcome
            if output is not None:
                last.output = output
            return
        if outcome == "refused":
            refused = max(refused, 1)
        calls.append(
            TrailCall(
                tool, arguments[:MAX_TRAIL_ARGUMENT_CHARS], key, outcome, output, times, refused
            )
        )

    def settle(self, key: str, outcome: str, output: str | None) -> None:
        """Give the latest call of ``key`` still without an outcome its outcome and output."""
        for call in reversed(self.calls):
            if call.key == key and call.outcome is None:
                call.outcome = outcome
                if output is not None:
                    call.output = output[:MAX_TRAIL_OUTPUT_CHARS]
                return

    def latest_output(self, key: str) -> str | None:
        """The output of the latest remembered call of ``key`` that has one."""
        for call in reversed(self.calls):
            if call.key == key and call.output is not None:
                return call.output
        return None

    def user_message(self, text: str) -> None:
        """A user message: the task if none is known yet, else the latest message."""
        text = text[:MAX_TASK_CHARS]
        if self.task is None:
            self.task = text
        else:
            self.latest_message = text

    def new_task(self, text: str) -> None:
        """A run's prompt: the task from now on."""
        self.task = text[:MAX_TASK_CHARS]
        self.latest_message = None

    def to_json(self) -> dict[str, object]:
        return {
            "task": self.task,
            "latest": self.latest_message,
            "calls": [
                [c.tool, c.arguments, c.key, c.outcome, c.output, c.times, c.refused]
                for c in self.calls
            ],
        }

    @classmethod
    def from_json(cls, raw: object) -> Trail:
        """Rebuild from :meth:`to_json` output, within the bounds; raises ``ValueError``."""
        if not isinstance(raw, dict):
            raise ValueError("session state: trail must be an object")
        trail = cls()
        task, latest = raw.get("task"), raw.get("latest")
        trail.task = None if task is None else _text(task, "task")[:MAX_TASK_CHARS]
        trail.latest_message = None if latest is None else _text(latest, "latest")[:MAX_TASK_CHARS]
        for entry in _list(raw.get("calls"), "trail calls")[-MAX_TRAIL_CALLS:]:
            if not (isinstance(entry, list) and len(entry) == 7):
                raise ValueError(f"session state: bad trail entry {entry!r}")
            tool, arguments, key, outcome, output, times, refused = entry
            trail.calls.append(
                TrailCall(
                    _text(tool, "trail tool")[:MAX_TOOL_CHARS],
                    _text(arguments, "trail arguments")[:MAX_TRAIL_ARGUMENT_CHARS],
                    _text(key, "trail key")[:_MAX_KEY_CHARS],
                    _optional_text(outcome, "trail outcome"),
                    None
                    if output is None
                    else _text(output, "trail output")[:MAX_TRAIL_OUTPUT_CHARS],
                    max(1, _count(times, "trail times")),
                    _count(refused, "trail refused"),
                )
            )
        return trail


@dataclass(slots=True)
class Pending:
    """A hook attempt whose outcome has not been reported yet."""

    args_key: str
    blocked: bool
    mutating: bool
    outstanding: int = 1


class SessionState:
    """One session's state: the current epoch's history plus the ladder's bookkeeping.

    Implements :class:`otel_loopguard._rules.History`.
    """

    __slots__ = (
        "advice",
        "denials",
        "epoch",
        "last_key",
        "last_rescue_at",
        "last_seen",
        "mutation",
        "novel",
        "pending",
        "redundant",
        "rescues",
        "run_length",
        "signatures",
        "stopped",
        "stop_threshold",
        "trail",
        "window",
    )

    def __init__(self, now: float) -> None:
        self.epoch = 0
        self.window: list[str] = []
        self.last_key: str | None = None
        self.run_length = 0
        self.redundant = 0
        self.signatures: dict[str, SignatureState] = {}  # least recently used first
        self.denials = 0
        self.stopped = False
        # The threshold of the stop that stopped the session (the later stops show it).
        self.stop_threshold = 0
        self.pending: OrderedDict[str, Pending] | None = None
        self.advice: dict[str, str] | None = None  # args key -> advice, this epoch
        self.rescues = 0
        self.last_rescue_at: float | None = None
        self.last_seen = now
        self.trail: Trail | None = None  # kept only by a guard that can ask an advisor
        # The mutation (args key and outcome) that started this epoch: repeating it is not progress.
        self.mutation: str | None = None
        # Calls this epoch that were new (their signature's first attempt): exploration.
        self.novel = 0

    def signature(self, key: str) -> SignatureState | None:
        return self.signatures.get(key)

    def new_epoch(self, *, clear_stop: bool = False) -> None:
        """Forget the repeat evidence: the agent's world changed."""
        self.epoch += 1
        self.window.clear()
        self.last_key = None
        self.run_length = 0
        self.redundant = 0
        self.signatures = {}
        self.denials = 0
        self.advice = None
        self.mutation = None
        self.novel = 0
        if clear_stop:
            self.stopped = False
            self.stop_threshold = 0

    def mutated(self, key: str, outcome: str | None, policy: Policy) -> bool:
        """A mutating call of ``key`` succeeded with ``outcome``; return whether that is progress.

        1. The same mutation (args key and outcome) as the one that started this epoch changed
           nothing new (the same ``git commit`` thirty times, a ``sed -i`` that changes nothing):
           no new epoch, so its repeats count like any other call's.
        2. Any other mutation starts a new epoch that begins with this call: its signature is
           remembered with one attempt and its outcome, so repeating it is a repeat from the
           first time on.
        """
        mutation = f"{key}:{outcome or ''}"
        if mutation == self.mutation:
            return False
        signature = self.signatures.get(key)
        failed = signature.failed if signature is not None else False
        self.new_epoch()
        self.mutation = mutation
        self.record_attempt(key, policy, blocked=False)
        self.record_outcome(key, outcome, failed=failed)
        return True

    def record_attempt(
        self,
        key: str,
        policy: Policy,
        *,
        blocked: bool,
        explores: bool = True,
        refused: bool = False,
    ) -> bool:
        """Count one tracked attempt of ``key``; return whether it repeats an earlier one.
        ``blocked``: the ladder blocked it (a denial, counted whatever the mode); ``refused``:
        it does not run, so no outcome will come for it. ``explores``: a first attempt of
        ``key`` counts as exploration (a read that runs; not a mutating call, which may fail
        and change nothing, nor a blocked one)."""
        signatures = self.signatures
        signature = signatures.pop(key, None)
        repeated = signature is not None
        if signature is None:
            signature = SignatureState()
            if len(signatures) >= policy.max_signatures_per_session:
                self._prune(policy.max_signatures_per_session)
            if explores and not blocked:
                self.novel += 1
        else:
            self.redundant += 1
            if self.novel == signature.novel_seen:
                signature.looped = True
        self.signatures[key] = signature  # (re)inserted last: least recently used stay first
        signature.count += 1
        signature.novel_seen = self.novel
        if self.last_key == key:
            self.run_length += 1
        else:
            self.last_key = key
            self.run_length = 1
        window = self.window
        window.append(key)
        if len(window) >= policy.window_size:
            del window[0]
        if blocked:
            self.denials += 1
        if refused:
            signature.refused += 1
        return repeated

    def _prune(self, limit: int) -> None:
        """Forget the least recently used quarter of the signatures at once.

        Rebuilding in batches keeps eviction amortised O(1) and the dict compact (deleting from
        the front one entry at a time makes each next(iter(...)) scan more deleted slots).
        Keys still in the window are among the most recent (limit >= window size), so kept.
        """
        keep = limit - max(1, limit // 4)
        items = list(self.signatures.items())
        self.signatures = dict(items[len(items) - keep :])

    def record_outcome(self, key: str, outcome: str | None, *, failed: bool = False) -> None:
        """Add the outcome of a finished attempt of ``key`` (ignored if the signature was evicted);
        ``failed``: the call reported a failure."""
        if outcome is None:
            return
        signature = self.signatures.get(key)
        if signature is None:
            return
        signature.failed = failed
        if outcome == signature.last_outcome:
            signature.same_outcomes += 1
            signature.changed = False
        else:
            signature.changed = signature.last_outcome is not None
            signature.last_outcome = outcome
            signature.same_outcomes = 1
            signature.refused = 0

    def add_pending(self, ref: str, key: str, blocked: bool, mutating: bool) -> None:
        """Remember a hook attempt until its outcome arrives (``ref``: call id, else args key)."""
        table = self.pending
        if table is None:
            table = self.pending = OrderedDict()
        existing = table.get(ref)
        if existing is not None and existing.args_key == key:
            existing.outstanding += 1
            existing.blocked = blocked
            return
        if len(table) >= MAX_PENDING_CALLS:
            table.popitem(last=False)
        table[ref] = Pending(key, blocked, mutating)

    def take_pending(self, ref: str) -> Pending | None:
        """Match a finished call to the hook attempt that counted it (``ref``: call id, else
        args key)."""
        table = self.pending
        if not table:
            return None
        pending = table.get(ref)
        if pending is None:
            return None
        pending.outstanding -= 1
        if pending.outstanding <= 0:
            del table[ref]
            if not table:
                self.pending = None  # an idle session keeps no empty table
        return pending

    def to_bytes(self) -> bytes:
        """The whole state as compact JSON, to keep outside the process (see :meth:`from_bytes`).

        Signatures are listed least recently used first, as kept; the window and the last key
        refer to them by position, so each 128-bit key is written once. The trail (see
        :class:`Trail`) is written only when there is one.
        """
        signatures = self.signatures
        position = {key: index for index, key in enumerate(signatures)}
        last = self.last_key
        extra = {} if self.trail is None else {"trail": self.trail.to_json()}
        return orjson.dumps(
            {
                "v": _SNAPSHOT_VERSION,
                "epoch": self.epoch,
                "sigs": [
                    [
                        key,
                        s.count,
                        s.last_outcome,
                        s.same_outcomes,
                        s.changed,
                        s.failed,
                        s.novel_seen,
                        s.looped,
                        s.refused,
                    ]
                    for key, s in signatures.items()
                ],
                "window": [position.get(key, key) for key in self.window],
                "last": None if last is None else position.get(last, last),
                "run": self.run_length,
                "redundant": self.redundant,
                "denials": self.denials,
                "stopped": self.stopped,
                "stop_at": self.stop_threshold,
                "pending": [
                    [ref, p.args_key, p.blocked, p.mutating, p.outstanding]
                    for ref, p in (self.pending or {}).items()
                ],
                "advice": self.advice,
                "rescues": self.rescues,
                "rescue_at": self.last_rescue_at,
                "seen": self.last_seen,
                "mutation": self.mutation,
                "novel": self.novel,
                **extra,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes, policy: Policy) -> SessionState:
        """Rebuild a state written by :meth:`to_bytes`, within ``policy``'s bounds.

        1. Parse and check every field's type; anything else raises ``ValueError`` (the caller
           decides whether to start afresh).
        2. Keep the most recent ``max_signatures_per_session`` signatures, ``window_size - 1``
           window entries and :data:`MAX_PENDING_CALLS` pending calls, so a state written under
           a larger policy still fits this one.
        """
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"session state: not JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError("session state: expected an object")
        if raw.get("v") != _SNAPSHOT_VERSION:
            raise ValueError(f"session state: unknown version {raw.get('v')!r}")
        state = cls(_number(raw.get("seen"), "seen"))
        state.epoch = _count(raw.get("epoch"), "epoch")
        keys: list[str] = []
        signatures: dict[str, SignatureState] = {}
        for entry in _list(raw.get("sigs"), "sigs"):
            # Five fields in states written before failures and exploration were remembered,
            # eight before refused attempts were.
            if not (isinstance(entry, list) and len(entry) in (5, 8, 9)):
                raise ValueError(f"session state: bad signature entry {entry!r}")
            key, count, last_outcome, same, changed = entry[:5]
            signature = SignatureState()
            if len(entry) >= 8:
                signature.failed = _flag(entry[5], "failed")
                signature.novel_seen = _count(entry[6], "novel seen")
                signature.looped = _flag(entry[7], "looped")
            if len(entry) == 9:
                signature.refused = _count(entry[8], "refused")
            signature.count = _count(count, "count")
            signature.last_outcome = _optional_text(last_outcome, "last outcome")
            signature.same_outcomes = _count(same, "same outcomes")
            signature.changed = _flag(changed, "changed")
            keys.append(_text(key, "signature key"))
            signatures[keys[-1]] = signature

        def resolve(item: object) -> str:
            if isinstance(item, int) and not isinstance(item, bool) and 0 <= item < len(keys):
                return keys[item]
            return _text(item, "window key")

        window = [resolve(item) for item in _list(raw.get("window"), "window")]
        last = raw.get("last")
        state.last_key = None if last is None else resolve(last)
        state.run_length = _count(raw.get("run"), "run")
        state.redundant = _count(raw.get("redundant"), "redundant")
        state.denials = _count(raw.get("denials"), "denials")
        state.stopped = _flag(raw.get("stopped"), "stopped")
        state.stop_threshold = _count(raw.get("stop_at", 0), "stop_at")
        pending: OrderedDict[str, Pending] = OrderedDict()
        for entry in _list(raw.get("pending"), "pending"):
            if not (isinstance(entry, list) and len(entry) == 5):
                raise ValueError(f"session state: bad pending entry {entry!r}")
            ref, key, blocked, mutating, outstanding = entry
            pending[_text(ref, "pending ref")] = Pending(
                _text(key, "pending key"),
                _flag(blocked, "blocked"),
                _flag(mutating, "mutating"),
                max(1, _count(outstanding, "outstanding")),
            )
        advice = raw.get("advice")
        if advice is not None:
            if not isinstance(advice, dict):
                raise ValueError("session state: advice must be an object")
            state.advice = {
                _text(k, "advice key"): _text(v, "advice")
                for k, v in advice.items()
                if k in signatures
            }
        state.mutation = _optional_text(raw.get("mutation"), "mutation")
        state.novel = _count(raw.get("novel", 0), "novel")
        state.rescues = _count(raw.get("rescues"), "rescues")
        rescue_at = raw.get("rescue_at")
        state.last_rescue_at = None if rescue_at is None else _number(rescue_at, "rescue_at")
        limit = policy.max_signatures_per_session
        state.signatures = (
            dict(list(signatures.items())[-limit:]) if len(signatures) > limit else signatures
        )
        state.window = window[-(policy.window_size - 1) :] if policy.window_size > 1 else []
        while len(pending) > MAX_PENDING_CALLS:
            pending.popitem(last=False)
        state.pending = pending or None
        trail = raw.get("trail")
        state.trail = None if trail is None else Trail.from_json(trail)
        return state


def _list(value: object, name: str) -> list[object]:
    if not isinstance(value, list):
        raise ValueError(f"session state: {name} must be a list, got {value!r}")
    return value


def _count(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"session state: {name} must be an integer >= 0, got {value!r}")
    return value


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"session state: {name} must be a finite number, got {value!r}")
    return float(value)


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"session state: {name} must be true or false, got {value!r}")
    return value


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"session state: {name} must be a string, got {value!r}")
    return value


def _optional_text(value: object, name: str) -> str | None:
    return None if value is None else _text(value, name)


class SessionStore:
    """Sessions by key, bounded by count (LRU) and idle time (TTL), on an injected clock.

    A key that is a ``(session, agent)`` pair is also listed under its session
    (:meth:`agent_keys`), so that what happens to a whole session (a user message) can reach
    each of its agents. The index holds only kept keys: an evicted key leaves it at once, so it
    is bounded as the store is.

    Not thread-safe: the owner locks around every call.
    """

    def __init__(
        self,
        max_sessions: int,
        ttl_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[str], None] | None = None,
    ) -> None:
        self._sessions: OrderedDict[object, SessionState] = OrderedDict()
        # session -> its (session, agent) keys kept now, in the order they were added.
        self._agents: dict[object, dict[object, None]] = {}
        self._max = max_sessions
        self._ttl = ttl_seconds
        self._next_expiry = float("-inf")
        self.clock = clock
        self._on_evict = on_evict

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, key: object) -> bool:
        return key in self._sessions

    def get(self, key: object, *, create: bool = True) -> SessionState | None:
        """Return the session for ``key`` (created when missing and ``create``), marking it used."""
        now = self.clock()
        if now >= self._next_expiry:
            self._expire(now)
        sessions = self._sessions
        state = sessions.get(key)
        if state is None:
            if not create:
                return None
            state = SessionState(now)
            sessions[key] = state
            self._index(key)
            if len(sessions) > self._max:
                self._drop_oldest("capacity")
        else:
            sessions.move_to_end(key)
            state.last_seen = now
        return state

    def put(self, key: object, state: SessionState) -> None:
        """Keep ``state`` for ``key`` (replacing any), as the most recently used session.

        For states saved outside the process (:meth:`SessionState.from_bytes`). Its
        ``last_seen`` is kept: a state idle beyond the TTL is forgotten at once (a ``ttl``
        eviction), as if it had stayed here. The least recently used sessions beyond
        ``max_sessions`` are evicted.
        """
        sessions = self._sessions
        if sessions.pop(key, None) is not None:
            self._unindex(key)
        if self.clock() - state.last_seen >= self._ttl:
            if self._on_evict is not None:
                self._on_evict("ttl")
            return
        sessions[key] = state
        self._index(key)
        while len(sessions) > self._max:
            self._drop_oldest("capacity")

    def agent_keys(self, session: object) -> list[object]:
        """The ``(session, agent)`` keys of ``session`` kept now, oldest first (not the
        session's own key; not marked used)."""
        keys = self._agents.get(session)
        return list(keys) if keys else []

    def _index(self, key: object) -> None:
        if type(key) is tuple and len(key) == 2:
            self._agents.setdefault(key[0], {})[key] = None

    def _unindex(self, key: object) -> None:
        if type(key) is tuple and len(key) == 2:
            keys = self._agents.get(key[0])
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._agents[key[0]]

    def _drop_oldest(self, reason: str) -> None:
        key, _ = self._sessions.popitem(last=False)
        self._unindex(key)
        if self._on_evict is not None:
            self._on_evict(reason)

    def _expire(self, now: float) -> None:
        # Sweeping at most once per second keeps TTL eviction off the per-call cost; a session
        # may outlive its TTL by up to that second.
        if now < self._next_expiry:
            return
        self._next_expiry = now + _EXPIRY_INTERVAL_SECONDS
        sessions = self._sessions
        deadline = now - self._ttl
        while sessions:
            oldest = next(iter(sessions.values()))
            if oldest.last_seen > deadline:
                return
            self._drop_oldest("ttl")

    def expire(self) -> None:
        """Drop sessions idle for longer than the TTL now (``get`` does so at most once a
        second)."""
        self._next_expiry = float("-inf")
        self._expire(self.clock())

    def snapshot(self) -> dict[str, object]:
        """Every kept session as plain data, least recently used first: ``{"version": 1,
        "sessions": [{"session", "agent", "state"}, ...]}`` (``agent`` ``None`` for a session's
        own key; ``state`` the object :meth:`SessionState.to_bytes` writes). For
        :meth:`restore` in another process."""
        sessions = []
        for key, state in self._sessions.items():
            session, agent = key if type(key) is tuple else (key, None)
            sessions.append(
                {"session": session, "agent": agent, "state": orjson.loads(state.to_bytes())}
            )
        return {"version": STORE_SNAPSHOT_VERSION, "sessions": sessions}

    def restore(self, data: object, policy: Policy) -> None:
        """Replace the kept sessions with a :meth:`snapshot`'s (each state within ``policy``'s
        bounds, as :meth:`SessionState.from_bytes` reads it; idle ones are kept as they were,
        and expire at the next sweep). Raises ``ValueError`` naming what is wrong (an unknown
        ``version`` names it); the store is then unchanged."""
        if not isinstance(data, Mapping):
            raise ValueError(f"session store snapshot: expected a mapping, got {data!r:.80}")
        version = data.get("version")
        if version != STORE_SNAPSHOT_VERSION:
            raise ValueError(
                f"session store snapshot: unknown version {version!r}"
                f" (this is {STORE_SNAPSHOT_VERSION})"
            )
        sessions: OrderedDict[object, SessionState] = OrderedDict()
        for entry in _list(data.get("sessions"), "sessions"):
            if not isinstance(entry, Mapping):
                raise ValueError(f"session store snapshot: bad session entry {entry!r:.80}")
            session = _text(entry.get("session"), "session")
            agent = _optional_text(entry.get("agent"), "agent")
            state = SessionState.from_bytes(orjson.dumps(entry.get("state")), policy)
            sessions[session if agent is None else (session, agent)] = state
        while len(sessions) > self._max:
            sessions.popitem(last=False)
        self._sessions = sessions
        self._agents = {}
        for key in sessions:
            self._index(key)


#: A reported call: (args key, whether its first report lacked the outcome).
Settled = tuple[str, bool]


class ReportLedger:
    """The calls of each session whose outcome is in, so that a second report of one call (a
    framework hook's and its span's, in either order, with or without the call id) counts once.

    Session key -> {call ref: (args key, awaiting)}, oldest first; ``awaiting``: the first
    report carried no outcome (a span without the result), so the other report may add it;
    bounded by ``max_sessions`` (least recently used dropped) and ``max_calls`` per session
    (oldest dropped). Not thread-safe: the guard calls it under its own lock.
    """

    __slots__ = ("_calls", "_max_calls", "_max_sessions")

    def __init__(self, max_sessions: int, max_calls: int) -> None:
        self._calls: OrderedDict[object, dict[str, Settled]] = OrderedDict()
        self._max_sessions = max_sessions
        self._max_calls = max_calls

    def __bool__(self) -> bool:
        return bool(self._calls)

    def settle(self, store_key: object, ref: str, key: str, awaiting: bool = False) -> None:
        """Remember that the call ``ref`` (arguments ``key``) was reported (``awaiting``: without
        its outcome)."""
        calls = self._calls.get(store_key)
        if calls is None:
            calls = self._calls[store_key] = {}
            if len(self._calls) > self._max_sessions:
                self._calls.popitem(last=False)
        else:
            self._calls.move_to_end(store_key)
        calls[ref] = (key, awaiting)
        if len(calls) > self._max_calls:
            del calls[next(iter(calls))]

    def take(self, store_key: object, ref: str) -> Settled | None:
        """``(args key, awaiting)`` when ``ref`` was reported already; a second report uses it
        up."""
        calls = self._calls.get(store_key)
        return None if calls is None else calls.pop(ref, None)

    def take_by_args(self, store_key: object, key: str) -> Settled | None:
        """Use up the oldest reported call of this session with these arguments, if any."""
        calls = self._calls.get(store_key)
        if not calls:
            return None
        for ref, settled in calls.items():
            if settled[0] == key:
                del calls[ref]
                return settled
        return None

    def take_pending_by_args(
        self, state: SessionState, store_key: object, key: str, awaiting: bool = False
    ) -> Pending | None:
        """The oldest attempt of ``key`` pending under a call id in ``state``, preferring one
        that was allowed to run (a blocked call has no span to report it); settled here."""
        match: str | None = None
        for ref, pending in (state.pending or {}).items():
            if pending.args_key == key:
                if not pending.blocked:
                    match = ref
                    break
                if match is None:
                    match = ref
        if match is None:
            return None
        taken = state.take_pending(match)
        if taken is not None and match not in (state.pending or ()):
            self.settle(store_key, match, key, awaiting and not taken.blocked)
        return taken

    def forget(self, store_key: object) -> None:
        """Drop a session's reported calls (a new run may reuse call ids)."""
        self._calls.pop(store_key, None)

    def snapshot(self) -> list[list[object]]:
        """The reported calls as plain data, least recently used session first: ``[[session,
        agent, [[ref, args key, awaiting], ...]], ...]`` (``agent`` ``None`` for a session's own
        key). For :meth:`restore`."""
        out: list[list[object]] = []
        for store_key, calls in self._calls.items():
            session, agent = store_key if type(store_key) is tuple else (store_key, None)
            out.append(
                [session, agent, [[ref, key, awaiting] for ref, (key, awaiting) in calls.items()]]
            )
        return out

    def restore(self, data: object) -> None:
        """Replace the reported calls with a :meth:`snapshot`'s (within this ledger's bounds).
        Raises ``ValueError`` naming what is wrong; the ledger is then unchanged."""
        restored: OrderedDict[object, dict[str, Settled]] = OrderedDict()
        for entry in _list(data, "reported calls"):
            if not (isinstance(entry, list) and len(entry) == 3):
                raise ValueError(f"session state: bad reported calls entry {entry!r:.80}")
            session = _text(entry[0], "reported session")
            agent = _optional_text(entry[1], "reported agent")
            calls: dict[str, Settled] = {}
            for call in _list(entry[2], "reported calls"):
                if not (isinstance(call, list) and len(call) == 3):
                    raise ValueError(f"session state: bad reported call {call!r:.80}")
                ref, key, awaiting = call
                calls[_text(ref, "reported ref")] = (
                    _text(key, "reported key"),
                    _flag(awaiting, "awaiting"),
                )
            while len(calls) > self._max_calls:
                del calls[next(iter(calls))]
            restored[session if agent is None else (session, agent)] = calls
        while len(restored) > self._max_sessions:
            restored.popitem(last=False)
        self._calls = restored
