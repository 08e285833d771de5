"""Model usage from a coding agent's transcript: what is new since the last hook call, read
within a bound, each model response charged once.

The hosts' hook events carry no token counts, but Claude Code's carry ``transcript_path``, the
session's JSON-lines transcript, whose ``assistant`` lines hold each model response's
``message.usage``. Each hook call reads only what was appended since the last one, from the
byte offset kept per session and agent (:class:`Mark`, saved by the caller in the hooks' store):

- At most :data:`MAX_READ_BYTES` per call. A longer backlog (a hook installed in the middle of a
  long session, a resumed one) is read from its last :data:`MAX_READ_BYTES` only, from the first
  whole line there: the turns before it are not charged (:attr:`Reading.skipped_bytes`), so the
  newest turn is charged before the tool call it requested.
- A partial last line (the host is still writing it) is left for the next call.
- A file that is shorter than the offset, or another file at the same path (truncated, rotated,
  replaced), is read again from its start; message ids already charged are still skipped.
- Claude Code writes one model response over several lines (one per content block, and a
  streaming snapshot), all with the same ``message.id``; their input and cache counts repeat
  and the output count grows. A response is charged once, at the first call that sees it, with
  the counts of its last line read then; the last :data:`MAX_REMEMBERED_IDS` ids charged are
  kept in the mark, so a line of an id already charged (the same response, written again) adds
  nothing. Output tokens written in a line after that call are not added.
- A line that does not read (not JSON, a count that is not a whole number from 0 to 10^9) is a
  counted skip (:attr:`Reading.skipped`, by field), never an exception; a file that cannot be
  read is said (:attr:`Reading.problem`), one that does not exist yet is nothing new.

Which lines are a host's model responses is :data:`TRANSCRIPT_TURNS` (by host name); a host
not there is not read. Pure but for the one bounded read of the file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

import orjson

from .._prices import ModelUsage, Price, Pricer
from .._record import FrozenRecord, Record
from ._hosts import HookEvent

__all__ = [
    "KnownPrices",
    "MAX_READ_BYTES",
    "MAX_REMEMBERED_IDS",
    "PRICES_SUFFIX",
    "TRANSCRIPT_TURNS",
    "Mark",
    "Reading",
    "Turn",
    "charge_transcript",
    "claude_code_turn",
    "codex_turn",
    "mark_after",
    "read_transcript",
    "read_new_turns",
]

#: Bytes of a transcript read per hook call at most (a longer backlog: its end only).
MAX_READ_BYTES: Final = 4 << 20
#: Message ids charged that a mark remembers (newest kept), so a response written again later
#: is not charged twice.
MAX_REMEMBERED_IDS: Final = 64
#: The layout of :meth:`Mark.to_bytes`.
_MARK_VERSION: Final = 1


class Mark(FrozenRecord):
    """Where the last read of a transcript stopped: the file (path, device and inode), the byte
    offset of the first line not read yet, and the message ids charged last (oldest first)."""

    __slots__ = ("path", "device", "inode", "offset", "ids")

    path: str
    device: int
    inode: int
    offset: int
    ids: tuple[str, ...]

    def __init__(
        self,
        path: str,
        device: int,
        inode: int,
        offset: int,
        ids: tuple[str, ...] = (),
    ) -> None:
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "inode", inode)
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "ids", ids)

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            [_MARK_VERSION, self.path, self.device, self.inode, self.offset, list(self.ids)]
        )

    @classmethod
    def from_bytes(cls, data: bytes | None) -> Mark | None:
        """The mark :meth:`to_bytes` wrote; ``None`` for none or one that does not read (the
        transcript is then read as new)."""
        if not data:
            return None
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not (isinstance(raw, list) and len(raw) == 6 and raw[0] == _MARK_VERSION):
            return None
        _, path, device, inode, offset, ids = raw
        if not (
            isinstance(path, str)
            and all(_whole(n) for n in (device, inode, offset))
            and isinstance(ids, list)
            and all(isinstance(i, str) for i in ids)
        ):
            return None
        return cls(path, device, inode, offset, tuple(ids[-MAX_REMEMBERED_IDS:]))


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Turn(FrozenRecord):
    """One model response read from a transcript: its id, the agent whose line it is (``None``:
    the main agent), its usage."""

    __slots__ = ("id", "agent", "usage")

    id: str
    agent: str | None
    usage: ModelUsage

    def __init__(
        self,
        id: str,
        agent: str | None,
        usage: ModelUsage,
    ) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "agent", agent)
        object.__setattr__(self, "usage", usage)


class Reading(Record):
    """What one read gave: the new turns of the agent asked for (in the transcript's order), the
    mark to keep for the next read, lines skipped by reason, bytes of backlog not read, and why
    the file could not be read (``None``: it could)."""

    __slots__ = ("turns", "mark", "skipped", "skipped_bytes", "problem", "start")

    turns: list[Turn]
    mark: Mark | None
    skipped: dict[str, int]
    skipped_bytes: int
    problem: str | None
    #: The offset of the first whole line read.
    start: int

    def __init__(
        self,
        turns: list[Turn],
        mark: Mark | None,
        skipped: dict[str, int] | None = None,
        skipped_bytes: int = 0,
        problem: str | None = None,
        start: int = 0,
    ) -> None:
        self.turns = turns
        self.mark = mark
        self.skipped = {} if skipped is None else skipped
        self.skipped_bytes = skipped_bytes
        self.problem = problem
        self.start = start


#: A host's reader of one transcript line: ``None`` for a line that is no model response;
#: a :class:`Turn`; ``ValueError`` naming the bad field for a response whose usage does not read.
TurnReader = Callable[[Mapping[str, object]], "Turn | None"]


def claude_code_turn(record: Mapping[str, object]) -> Turn | None:
    """A Claude Code ``assistant`` line's model response: ``message.id``, ``message.model``,
    ``message.usage`` (``input_tokens`` without the cached ones, ``cache_read_input_tokens``,
    ``cache_creation_input_tokens``, ``output_tokens``); a sub-agent's line (``isSidechain``)
    is its ``agentId``'s. Claude Code's own placeholder for a failed request (model
    ``<synthetic>``) is no model call."""
    if record.get("type") != "assistant":
        return None
    message = record.get("message")
    if not isinstance(message, dict):
        raise ValueError("message: not an object")
    usage = message.get("usage")
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise ValueError("usage: not an object")
    model = message.get("model")
    if model == "<synthetic>":
        return None
    message_id = message.get("id")
    if not isinstance(message_id, str) or not message_id:
        raise ValueError("message.id: missing")
    fresh = usage.get("input_tokens", 0)
    read = usage.get("cache_read_input_tokens") or 0
    written = usage.get("cache_creation_input_tokens") or 0
    for name, value in (
        ("input_tokens", fresh),
        ("cache_read_tokens", read),
        ("cache_write_tokens", written),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}: expected a whole number of tokens, got {value!r}")
    agent = None
    if record.get("isSidechain") is True:
        agent_id = record.get("agentId")
        agent = agent_id if isinstance(agent_id, str) and agent_id else "sidechain"
    return Turn(
        message_id,
        agent,
        ModelUsage.checked(
            model if isinstance(model, str) and model else None,
            "anthropic",
            # Anthropic's input_tokens leave the cached ones out; ModelUsage's include them.
            input_tokens=fresh + read + written,
            output_tokens=usage.get("output_tokens", 0),
            cache_read_tokens=read,
            cache_write_tokens=written,
        ),
    )


def codex_turn(record: Mapping[str, object]) -> Turn | None:
    """A Codex rollout line's model response: an ``event_msg`` whose payload is a
    ``token_count`` with ``info.last_token_usage`` (``input_tokens`` with the cached ones,
    ``cached_input_tokens``, ``output_tokens`` with the reasoning ones, as the Responses API
    counts them). Codex writes a ``token_count`` again without a new response (rate-limit
    updates): the id is the session's running total (``info.total_token_usage.total_tokens``),
    so a line that repeats it adds nothing. The model is the hook event's (``model``)."""
    if record.get("type") != "event_msg":
        return None
    payload = record.get("payload")
    if not isinstance(payload, dict) or payload.get("type") != "token_count":
        return None
    info = payload.get("info")
    if info is None:
        return None  # rate limits only
    if not isinstance(info, dict):
        raise ValueError("info: not an object")
    last, total = info.get("last_token_usage"), info.get("total_token_usage")
    if not isinstance(last, dict) or not isinstance(total, dict):
        raise ValueError("last_token_usage: not an object")
    running = total.get("total_tokens")
    if isinstance(running, bool) or not isinstance(running, int):
        raise ValueError(f"total_tokens: expected a whole number, got {running!r}")
    return Turn(
        f"total:{running}",
        None,
        ModelUsage.checked(
            None,
            "openai",
            input_tokens=last.get("input_tokens", 0),
            output_tokens=last.get("output_tokens", 0),
            cache_read_tokens=last.get("cached_input_tokens") or 0,
        ),
    )


#: The hosts whose transcripts carry model usage, by host name, and how their lines read.
TRANSCRIPT_TURNS: Final[Mapping[str, TurnReader]] = {
    "claude-code": claude_code_turn,
    "codex": codex_turn,
}
#: Lines without this are not parsed (tool results can be large and carry none): Claude Code's
#: ``"usage"``, Codex's ``"last_token_usage"``.
_USAGE_KEY: Final = b'usage"'


def read_new_turns(
    path: str,
    mark: Mark | None,
    *,
    agent: str | None,
    turn_of: TurnReader = claude_code_turn,
    max_bytes: int = MAX_READ_BYTES,
) -> Reading:
    """The turns of ``agent`` appended to the transcript at ``path`` since ``mark``, and the mark
    for the next read (see the module's docstring). Never raises."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return Reading([], mark)  # not written yet (a session's first prompt): nothing new
    except OSError as exc:
        return Reading([], mark, problem=f"transcript {path!r}: {exc.strerror or exc}")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return Reading([], mark, problem=f"transcript {path!r}: not a regular file")
        same = (
            mark is not None
            and mark.path == path
            and (mark.device, mark.inode) == (info.st_dev, info.st_ino)
            and mark.offset <= info.st_size
        )
        ids = mark.ids if mark is not None and mark.path == path else ()
        start = mark.offset if same and mark is not None else 0
        size = info.st_size
        skipped_bytes = 0
        if size - start > max_bytes:
            skipped_bytes = size - max_bytes - start
            start = size - max_bytes
        data = os.pread(fd, size - start, start) if size > start else b""
    except OSError as exc:
        return Reading([], mark, problem=f"transcript {path!r}: {exc.strerror or exc}")
    finally:
        os.close(fd)
    reading = Reading([], None, skipped_bytes=skipped_bytes, start=start)
    end = data.rfind(b"\n") + 1  # 0: no whole line yet
    if skipped_bytes:
        # Started inside a line: what comes before the first newline is its tail.
        first = data.find(b"\n") + 1
        if first == 0 or first >= end:
            first = end = len(data)  # one line longer than the bound: passed over
            reading.skipped["line longer than the read bound"] = 1
        reading.skipped_bytes += first
        reading.start = start + first
        lines = data[first:end]
    else:
        lines = data[:end]
    reading.mark = Mark(path, info.st_dev, info.st_ino, start + end, ids)
    if lines:
        reading.turns = _turns(lines, ids, agent, turn_of, reading.skipped)
        if reading.turns:
            charged = ids + tuple(turn.id for turn in reading.turns)
            reading.mark = Mark(
                path, info.st_dev, info.st_ino, start + end, charged[-MAX_REMEMBERED_IDS:]
            )
    return reading


def _turns(
    lines: bytes,
    charged: tuple[str, ...],
    agent: str | None,
    turn_of: TurnReader,
    skipped: dict[str, int],
) -> list[Turn]:
    """The new turns of ``agent`` in whole ``lines``: one per message id (the counts of its last
    line), in the order of their first line, without the ids already ``charged``."""
    found: dict[str, Turn] = {}
    for line in lines.split(b"\n"):
        if _USAGE_KEY not in line:
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            skipped["not JSON"] = skipped.get("not JSON", 0) + 1
            continue
        if not isinstance(record, dict):
            continue
        try:
            turn = turn_of(record)
        except ValueError as exc:
            reason = str(exc).split(":", 1)[0]
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        if turn is None or turn.agent != agent or turn.id in charged:
            continue
        found[turn.id] = turn  # a later line of the same response: its counts, first place kept
    return list(found.values())


def read_transcript(
    host: str,
    event: HookEvent,
    saved: bytes | None,
    skip: Callable[[str, int], None],
    note: Callable[[str], None],
) -> Reading | None:
    """The new turns of ``event``'s transcript (``host``'s lines, the event's agent) since the
    mark ``saved``; lines that do not read go to ``skip`` (reason, count), a file that cannot be
    read or a backlog passed over to ``note``. ``None`` when nothing was read (no transcript,
    a host whose lines are not known, a file not there or unreadable). Never raises."""
    turn_of = TRANSCRIPT_TURNS.get(host)
    path = event.transcript_path
    if turn_of is None or path is None:
        return None
    reading = read_new_turns(path, Mark.from_bytes(saved), agent=event.agent, turn_of=turn_of)
    if event.model is not None:  # lines that do not name their model (Codex's): the event's
        reading.turns = [
            t if t.usage.model else Turn(t.id, t.agent, replace(t.usage, model=event.model))
            for t in reading.turns
        ]
    if reading.problem is not None:
        note(f"{reading.problem}; no model usage read")
    if reading.mark is None:
        return None
    for reason, count in reading.skipped.items():
        skip(reason, count)
    if reading.skipped_bytes:
        note(
            f"transcript {path!r}: {reading.skipped_bytes:,} bytes not read (more than"
            f" {MAX_READ_BYTES:,} new at once); their model usage is not counted"
        )
    return reading


def mark_after(reading: Reading, saved: bytes | None, charged: int) -> bytes | None:
    """The mark to save once ``charged`` of the reading's turns were charged (the rest are read
    again next time, those charged remembered), or ``None`` to leave ``saved`` as it is."""
    mark = reading.mark
    assert mark is not None
    old = Mark.from_bytes(saved)
    if charged < len(reading.turns):
        known = old.ids if old is not None and old.path == mark.path else ()
        ids = known + tuple(t.id for t in reading.turns[:charged])
        mark = Mark(mark.path, mark.device, mark.inode, reading.start, ids[-MAX_REMEMBERED_IDS:])
    return None if mark == old else mark.to_bytes()


def charge_transcript(
    host: str,
    event: HookEvent,
    saved: bytes | None,
    charge: Callable[[ModelUsage], bool],
    skip: Callable[[str, int], None],
    note: Callable[[str], None],
) -> bytes | None:
    """:func:`read_transcript`, then each new turn to ``charge`` (``False``: it could not be
    charged, and the rest waits for the next call); the mark to save (:func:`mark_after`).
    Never raises but what ``charge`` raises."""
    reading = read_transcript(host, event, saved, skip, note)
    if reading is None:
        return None
    charged = 0
    for turn in reading.turns:
        if not charge(turn.usage):
            break
        charged += 1
    return mark_after(reading, saved, charged)


# -- prices kept between hook processes ---------------------------------------------------------

#: The name of the :class:`KnownPrices` file: the hooks' store's, with this added.
PRICES_SUFFIX: Final = ".prices.json"
#: Models whose rates a :class:`KnownPrices` file keeps at most.
MAX_KNOWN_PRICES: Final = 256
#: Tokens of each kind a probe prices (well below any tier's start).
_PROBE_TOKENS: Final = 1000
#: The largest input a kept rate is checked up to.
_PROBE_LIMIT: Final = 10**9


class KnownPrices:
    """genai-prices' rates of the models the transcripts named, kept in a JSON file (``path``,
    beside the hooks' store) so that a hook process prices a turn without importing genai-prices
    (about 0.2 to 0.5 s, in a process that otherwise takes about 0.1 s).

    Per model: its rates per million tokens as genai-prices gives them for a small call, and
    the input tokens up to which they give genai-prices' own figure (a model whose price
    changes past an input tier keeps its base rates and that bound; a call past it, or a model
    the database lacks, is left to genai-prices itself). Found once per model and snapshot of
    genai-prices (the file is keyed by its data file's size and time), with the guard's own
    :class:`~otel_loopguard._prices.Pricer`; used as price table entries after the user's own
    (which win). Never raises: a file that cannot be read or written is only a slower call."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def table(self, turns: Sequence[Turn]) -> tuple[tuple[str, Price], ...]:
        """Price table entries for the models of ``turns`` whose every turn is within the
        kept rates' bound (probing genai-prices for a model not kept yet)."""
        snapshot = _snapshot_key()
        if snapshot is None or not turns:
            return ()
        kept = self._load(snapshot)
        entries: list[tuple[str, Price]] = []
        changed = False
        largest: dict[tuple[str, str | None], int] = {}
        for turn in turns:
            usage = turn.usage
            if usage.model and "*" not in usage.model:
                key = (usage.model, usage.provider)
                largest[key] = max(largest.get(key, 0), usage.input_tokens)
        for (model, provider), tokens in largest.items():
            name = f"{provider or ''}\t{model}"
            if name not in kept and len(kept) < MAX_KNOWN_PRICES:
                kept[name] = _probe(model, provider)
                changed = True
            found = kept.get(name)
            if found is not None and tokens <= found[4]:
                entries.append((model, Price(*found[:4])))
        if changed:
            self._save(snapshot, kept)
        return tuple(entries)

    def _load(self, snapshot: str) -> dict[str, list[float] | None]:
        try:
            data = orjson.loads(self.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        if not isinstance(data, dict) or data.get("snapshot") != snapshot:
            return {}
        models = data.get("models")
        if not isinstance(models, dict):
            return {}
        return {
            name: value
            for name, value in models.items()
            if value is None
            or (
                isinstance(value, list)
                and len(value) == 5
                and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                    for v in value
                )
            )
        }

    def _save(self, snapshot: str, kept: Mapping[str, list[float] | None]) -> None:
        part = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            # Private, as the store beside it is (model names say what the user runs).
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(orjson.dumps({"snapshot": snapshot, "models": kept}))
            os.replace(part, self.path)
        except OSError:
            try:
                part.unlink()
            except OSError:
                pass


def _snapshot_key() -> str | None:
    """Which genai-prices snapshot is installed (its data file's size and time), found without
    importing it; ``None`` when it is not installed."""
    import importlib.util  # here: only a transcript with model usage needs it

    try:
        spec = importlib.util.find_spec("genai_prices")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    try:
        info = os.stat(Path(spec.origin).with_name("data_snapshot.py"))
    except OSError:
        return None
    return f"{info.st_size}:{info.st_mtime_ns}"


def _probe(model: str, provider: str | None) -> list[float] | None:
    """The model's rates per million tokens (input, output, cache read, cache write) and the
    input tokens up to which they give the database's own cost; ``None`` when the database
    has no price for it or its rates are not linear even for a small call."""
    pricer = Pricer()
    pricer.log_unpriced = False
    small = _PROBE_TOKENS

    def cost(fresh: int, output: int = 0, read: int = 0, written: int = 0) -> float | None:
        usage = ModelUsage(model, provider, fresh + read + written, output, read, written)
        return pricer.cost(usage).usd

    found = [cost(small), cost(0, small), cost(0, 0, small), cost(0, 0, 0, small)]
    rates = [c * 1e6 / small for c in found if c is not None]
    if len(rates) != 4:
        return None
    price = Price(*rates)

    def agrees(tokens: int) -> bool:
        usage = ModelUsage(model, provider, tokens, small, tokens // 4, tokens // 4)
        want = pricer.cost(usage).usd
        return want is not None and abs(price.cost(usage) - want) <= 1e-9 * max(want, 1e-12)

    if not agrees(small):
        return None
    low, high = small, _PROBE_LIMIT
    if agrees(high):
        return [*rates, float(high)]
    while high - low > 1:  # the last input the rates hold for (a cliff tier past it)
        middle = (low + high) // 2
        low, high = (middle, high) if agrees(middle) else (low, middle)
    return [*rates, float(low)]
