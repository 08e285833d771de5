"""The policy: one frozen, validated configuration object, its presets, and its environment.

Three error zones (STYLE.md): a bad value given in code or in a config file raises ``ValueError``
naming the field and the value; a bad ``LOOPGUARD_*`` environment value logs a warning naming the
variable and keeps the value it would have replaced. A name nothing reads (a typo: a field name,
a ``LOOPGUARD_*`` variable, a plugin key) is refused, or for a variable warned about, with the
closest known names ("did you mean ...?").

Every field is declared once, on :class:`Policy`; its environment variable is
``LOOPGUARD_`` + the field name in upper case (see :func:`env_var`), and its TOML key is the field
name. Private: :mod:`otel_loopguard.config` is the public face, and it adds the loading of a
command-line entrance's policy (:func:`~otel_loopguard.config.load_policy`), which reads plugin
configurations (:mod:`otel_loopguard._plugins`, which builds on this module).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from ._env import DECLARED, LOOPGUARD_PRESET, POLICY_PREFIX, policy_variable

__all__ = [
    "FIELD_NAMES",
    "AdvisorInput",
    "DEFAULT_FINAL_ANSWER_TOOLS",
    "DEFAULT_IGNORED_ARGS",
    "DEFAULT_MUTATING_COMMANDS",
    "DEFAULT_MUTATING_OPERATIONS",
    "DEFAULT_MUTATING_TOOLS",
    "DEFAULT_READ_OPERATIONS",
    "DEFAULT_SHELL_TOOLS",
    "ENV_PREFIX",
    "KNOWN_VARIABLES",
    "Mode",
    "PRESETS",
    "Policy",
    "RESCUE_PLUGIN_EXCLUDE",
    "RESCUE_PLUGIN_IGNORED_ARGS",
    "RESCUE_PLUGIN_MUTATING_TOOLS",
    "Rule",
    "STORE_SCHEMES",
    "StoreFailure",
    "close_names",
    "redact_url",
    "env_var",
    "unknown_message",
    "policy_from_env",
    "policy_from_mapping",
    "unknown_variables",
    "validate_field",
    "wildcard_regex",
    "wildcard_union",
]

_log = logging.getLogger("otel_loopguard")

ENV_PREFIX: Final = POLICY_PREFIX


class Mode(str, Enum):
    """What the guard does with a decision."""

    #: Metrics and events only: decisions are computed, every hook is answered ``allow``.
    OBSERVE = "observe"
    #: Reminders only: blocking actions are given as (detailed) reminders.
    ADVISE = "advise"
    #: The whole ladder: remind, deny, rescue, stop.
    ENFORCE = "enforce"


class AdvisorInput(str, Enum):
    """How a command advisor is given the question."""

    #: The question as one extra argv element; nothing on stdin (the rescue plugin's contract).
    ARGV = "argv"
    #: The whole request as one JSON object on stdin, the question included; no extra argv.
    STDIN_JSON = "stdin_json"


class StoreFailure(str, Enum):
    """What the guard decides when the shared session store (Redis) fails."""

    #: Allow the call (uncounted): an outage never stops an agent.
    OPEN = "open"
    #: Deny the call: nothing runs that the guard could not count.
    CLOSED = "closed"


#: URL schemes a ``store`` may have (redis-py's): plain, TLS, a Unix socket.
STORE_SCHEMES: Final = ("redis", "rediss", "unix")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    return re.sub(r"(://[^/@]*:)[^/@]*@", r"\1***@", url)


class Rule(str, Enum):
    """The detection rules of DESIGN §4; values are the wire strings used in events and metrics."""

    CONSECUTIVE = "consecutive"
    WINDOW = "window"
    NO_PROGRESS = "no_progress"
    STALL = "stall"


#: Top-level argument fields that only narrate a call and never change what it does.
DEFAULT_IGNORED_ARGS: Final = frozenset(
    {"description", "explanation", "reasoning", "thought", "comment", "task_progress"}
)

#: Tools that hand the run's final answer back (``*`` wildcards, case-insensitive): never tracked,
#: so that a stopped agent can still answer. smolagents' ``final_answer`` (its ToolCallingAgent
#: ends only through it, and it is traced as a tool), Pydantic AI's output tool ``final_result``.
DEFAULT_FINAL_ANSWER_TOOLS: Final = ("final_answer", "final_result")

#: File and code editing tools (the first part of DEFAULT_MUTATING_TOOLS).
_SEED_MUTATING_TOOLS: Final = (
    "write",
    "write_file",
    "edit",
    "edit_file",
    "multiedit",
    "multi_edit",
    "create_file",
    "delete_file",
    "apply_patch",
    "str_replace*",
    "replace",
    "notebookedit",
    "insert",
)

#: Tool names (``*`` wildcards, case-insensitive) whose successful call changes the agent's world.
DEFAULT_MUTATING_TOOLS: Final = (
    *_SEED_MUTATING_TOOLS,
    "create",
    # Structured tools named for what they change (a booking, a patch, a record).
    "write_*",
    "create_*",
    "delete_*",
    "remove_*",
    "update_*",
    "cancel_*",
    "book_*",
    "send_*",
)

#: Operation names (``*`` wildcards, case-insensitive) that, as the first word of a call's
#: ``command`` or ``action`` argument, make the call only read, whatever the tool (OpenHands'
#: ``str_replace_editor`` with ``command: view``; SWE-agent's ``open``).
DEFAULT_READ_OPERATIONS: Final = (
    "view",
    "read",
    "open",
    "show",
    "list",
    "get",
    "search",
    "find_file",
    "search_file",
    "search_dir",
    "goto",
    "scroll_up",
    "scroll_down",
)

#: Operation names that, as the first word of a call's ``command`` or ``action`` argument, make
#: the call mutating, whatever the tool (``create``, ``str_replace``, ``insert``, ``edit`` ...).
DEFAULT_MUTATING_OPERATIONS: Final = (
    "create",
    "write",
    "edit",
    "str_replace",
    "insert",
    "append",
    "replace",
    "delete",
    "remove",
    "rename",
    "move",
    "undo_edit",
    "apply_patch",
)

#: Tool names whose bare string or argv-list argument is a shell command (checked against the
#: command regexes). A tool of any name whose ``command``/``cmd``/``script`` argument holds a
#: command line is a shell tool too.
DEFAULT_SHELL_TOOLS: Final = (
    "bash",
    "shell",
    "sh",
    "run_shell_command",
    "exec_command",
    "local_shell",
    "execute_command",
    "run_terminal_cmd",
    "terminal",
    "container.exec",
    "execute_bash",
    "run_command",
    "run_bash",
)

#: Regexes over a shell command; a successful match starts a new progress epoch.
DEFAULT_MUTATING_COMMANDS: Final = (
    r"\bsed\s+(-[a-zA-Z]*\s+)*-[a-zA-Z]*i",  # sed -i, sed -Ei, sed -n -i ...
    r"\bperl\s+(-[a-zA-Z]*\s+)*-[a-zA-Z]*i",
    r"(^|[^0-9&<>|])>>?\s*(?!&|/dev/null\b)[^\s|&;<>]",  # > file, >> file (not >&2, not /dev/null)
    r"\btee\b",
    r"\bgit\s+(commit|apply|checkout|switch|restore|reset|merge|rebase|cherry-pick|stash|am|pull|rm|mv)\b",
    r"\b(pip3?|uv\s+pip|npm|pnpm|yarn|poetry|cargo|gem|apt(-get)?|brew)\s+(install|add|remove|uninstall)\b",
    r"(^|[;&|(]\s*|\bsudo\s+)(rm|mv|cp|mkdir|rmdir|touch|ln|chmod|chown|truncate|patch|unzip|tar\s+-?x)\b",
)


#: ``env_var(field_name)``: the environment variable that overrides the policy field
#: ``field_name`` (``LOOPGUARD_`` + the name in upper case), declared in :mod:`otel_loopguard._env`.
env_var: Final = policy_variable


def close_names(word: str, names: Iterable[str]) -> list[str]:
    """The names in ``names`` closest to ``word`` (a typo's likely meaning), best first: up to
    three by :func:`difflib.get_close_matches`, and of those only the ones nearly as close as
    the best (``deny_treshold`` gives ``deny_threshold`` alone, not every ``*_threshold``).
    Empty when none is close."""
    names = list(names)
    close = difflib.get_close_matches(word, names, n=3, cutoff=0.6)
    if not close:
        return []
    ratios = [difflib.SequenceMatcher(None, word, name).ratio() for name in close]
    return [name for name, ratio in zip(close, ratios) if ratio >= ratios[0] - 0.1]


def unknown_message(what: str, names: Iterable[str], known: Iterable[str]) -> str:
    """``unknown <what>: a (did you mean b?), c``: each unknown name with its closest known
    ones (:func:`close_names`; ``what`` takes an ``s`` for several)."""
    names, known = sorted(names), sorted(known)
    listed = []
    for name in names:
        close = close_names(name, known)
        listed.append(name + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    return f"unknown {what}{'s' if len(names) > 1 else ''}: {', '.join(listed)}"


def _wildcard_text(pattern: str) -> str:
    return ".*".join(re.escape(part) for part in pattern.split("*"))


def wildcard_regex(pattern: str) -> re.Pattern[str]:
    """Compile a tool-name pattern: ``*`` matches any run of characters, everything else is
    literal (regex metacharacters included); matching is whole-name and case-insensitive."""
    return re.compile(_wildcard_text(pattern), re.IGNORECASE)


def wildcard_union(patterns: Iterable[str]) -> re.Pattern[str] | None:
    """One regex whose ``fullmatch`` accepts a name when any of the tool-name ``patterns``
    (as :func:`wildcard_regex`) does, or ``None`` when there are none. One compile for a list:
    compiling is the largest part of a hook process's start (it builds a guard per call)."""
    texts = [f"(?:{_wildcard_text(pattern)})" for pattern in patterns]
    return re.compile("|".join(texts), re.IGNORECASE) if texts else None


class _Kind(Enum):
    """What a policy field holds: how it is validated, read from TOML and from the environment.
    Each field declares its kind once, in its metadata; everything else derives from it."""

    CHOICE = "choice"  # a member of the Enum in the field's metadata ("choices")
    RULES = "rules"  # a set of Rule
    THRESHOLDS = "thresholds"  # sorted distinct integers >= 2
    THRESHOLD = "threshold"  # an integer >= minimum
    OPTIONAL_THRESHOLD = "optional threshold"  # an integer >= minimum, or None (off)
    COUNT = "count"  # an integer >= 1
    BUDGET = "budget"  # an integer >= 0
    SECONDS = "seconds"  # a finite number >= 0
    POSITIVE_SECONDS = "positive seconds"  # a finite number > 0
    PATTERNS = "patterns"  # tool-name patterns (* wildcard)
    REGEXES = "regexes"  # regular expressions that must compile
    NAMES = "names"  # a set of strings
    COMMAND = "command"  # a command line, or None
    PATH = "path"  # a non-empty file path, or None (a leading ~ is expanded where it is used)
    TEXT = "text"  # a non-empty string, or None
    URL = "url"  # a Redis URL (a scheme of STORE_SCHEMES), or None
    FLAG = "flag"  # true or false


_OPTIONAL_KINDS: Final = frozenset(
    {_Kind.OPTIONAL_THRESHOLD, _Kind.COMMAND, _Kind.PATH, _Kind.TEXT, _Kind.URL}
)
_LIST_KINDS: Final = frozenset({_Kind.THRESHOLDS, _Kind.PATTERNS, _Kind.REGEXES})
_SET_KINDS: Final = frozenset({_Kind.RULES, _Kind.NAMES})


def _doc(
    text: str, kind: _Kind, minimum: int = 2, choices: type[Enum] | None = None
) -> dict[str, object]:
    return {"doc": text, "kind": kind, "minimum": minimum, "choices": choices}


@dataclass(frozen=True, slots=True)
class Policy:
    """Everything that decides what the guard detects and what it does about it.

    Counts are attempts of one signature (tool + canonical arguments) in the current progress
    epoch, including the attempt being decided, as measured by the strongest enabled rule.
    """

    mode: Mode = field(
        default=Mode.ENFORCE,
        metadata=_doc("observe, advise or enforce", _Kind.CHOICE, choices=Mode),
    )
    rules: frozenset[Rule] = field(
        default=frozenset(Rule),
        metadata=_doc("enabled rules: consecutive, window, no_progress, stall", _Kind.RULES),
    )
    window_size: int = field(
        default=36, metadata=_doc("tracked calls the window rule looks back over", _Kind.COUNT)
    )
    remind_thresholds: tuple[int, ...] = field(
        default=(3, 5),
        metadata=_doc(
            "counts at which to remind: gentle text at the first, detailed at later ones,"
            " and on every call past the last one (see remind_past_thresholds)",
            _Kind.THRESHOLDS,
        ),
    )
    remind_past_thresholds: bool = field(
        default=True,
        metadata=_doc(
            "remind on every call past the last remind threshold too (false: only at the"
            " thresholds, as the reminder plugin)",
            _Kind.FLAG,
        ),
    )
    deny_threshold: int | None = field(
        default=6,
        metadata=_doc(
            "count from which a call without progress is denied (none: never)",
            _Kind.OPTIONAL_THRESHOLD,
        ),
    )
    no_progress_threshold: int | None = field(
        default=4,
        metadata=_doc(
            "count from which a call whose outcome came back the same each time is denied"
            " (no_progress rule; none: only deny_threshold blocks)",
            _Kind.OPTIONAL_THRESHOLD,
        ),
    )
    rescue_threshold: int | None = field(
        default=8,
        metadata=_doc(
            "count from which a denial carries advice from the advisor; the last denial"
            " before a stop carries it too (none: never)",
            _Kind.OPTIONAL_THRESHOLD,
        ),
    )
    poll_limit: int | None = field(
        default=12,
        metadata=_doc(
            "count from which a call whose outcome keeps changing is denied too"
            " (none: outcomes never spare a call)",
            _Kind.OPTIONAL_THRESHOLD,
        ),
    )
    stop_after_denials: int | None = field(
        default=3,
        metadata=_doc(
            "denied attempts in an epoch after which the agent is stopped",
            _Kind.OPTIONAL_THRESHOLD,
            minimum=1,
        ),
    )
    stall_threshold: int = field(
        default=40,
        metadata=_doc(
            "redundant calls in one epoch that stop the agent (stall rule)", _Kind.THRESHOLD
        ),
    )
    rescue_on_stall: bool = field(
        default=False,
        metadata=_doc(
            "on stall, deny the redundant call with advice (a rescue) instead of stopping the"
            " run, as the rescue plugin",
            _Kind.FLAG,
        ),
    )
    arguments_preview_chars: int = field(
        default=200,
        metadata=_doc("characters of canonical arguments shown in detailed texts", _Kind.COUNT),
    )
    ignored_args: frozenset[str] = field(
        default=DEFAULT_IGNORED_ARGS,
        metadata=_doc("top-level argument fields ignored in keys", _Kind.NAMES),
    )
    include: tuple[str, ...] = field(
        default=("*",),
        metadata=_doc(
            "tool-name patterns that are tracked (* wildcard; empty: every tool)", _Kind.PATTERNS
        ),
    )
    exclude: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "tool-name patterns that are never tracked (* wildcard), besides final_answer_tools",
            _Kind.PATTERNS,
        ),
    )
    final_answer_tools: tuple[str, ...] = field(
        default=DEFAULT_FINAL_ANSWER_TOOLS,
        metadata=_doc(
            "tool-name patterns of the tools that give the run's final answer (smolagents'"
            " final_answer, Pydantic AI's final_result): never tracked, whatever exclude says,"
            " so a stopped agent can still answer (empty: tracked like any tool)",
            _Kind.PATTERNS,
        ),
    )
    count_calls_without_arguments: bool = field(
        default=False,
        metadata=_doc(
            "count a recognised tool span that carries no arguments (content capture off, or an"
            " instrumentation that publishes none: AutoGen, the MCP SDK's server spans) as a"
            " call of its tool without arguments, so repeats are counted by tool name (false:"
            " such spans are skipped)",
            _Kind.FLAG,
        ),
    )
    exclude_commands: tuple[str, ...] = field(
        default=(),
        metadata=_doc("regexes over a shell command that make the call untracked", _Kind.REGEXES),
    )
    shell_tools: tuple[str, ...] = field(
        default=DEFAULT_SHELL_TOOLS,
        metadata=_doc("tool-name patterns whose `command` is shell", _Kind.PATTERNS),
    )
    mutating_tools: tuple[str, ...] = field(
        default=DEFAULT_MUTATING_TOOLS,
        metadata=_doc(
            "tool-name patterns whose successful call starts a new epoch", _Kind.PATTERNS
        ),
    )
    mutating_commands: tuple[str, ...] = field(
        default=DEFAULT_MUTATING_COMMANDS,
        metadata=_doc(
            "regexes over a shell command whose successful run starts a new epoch", _Kind.REGEXES
        ),
    )
    read_operations: tuple[str, ...] = field(
        default=DEFAULT_READ_OPERATIONS,
        metadata=_doc(
            "operation names (first word of a `command`/`action` argument) that only read",
            _Kind.PATTERNS,
        ),
    )
    mutating_operations: tuple[str, ...] = field(
        default=DEFAULT_MUTATING_OPERATIONS,
        metadata=_doc(
            "operation names (first word of a `command`/`action` argument) that write",
            _Kind.PATTERNS,
        ),
    )
    failure_stop_threshold: int | None = field(
        default=3,
        metadata=_doc(
            "identical failures of one call in an epoch after which the run is stopped, decided"
            " after the call ran (none: never)",
            _Kind.OPTIONAL_THRESHOLD,
        ),
    )
    max_rescues: int = field(default=3, metadata=_doc("advisor asks per session", _Kind.BUDGET))
    cooldown_seconds: float = field(
        default=60.0,
        metadata=_doc("minimum seconds between two advisor asks in one session", _Kind.SECONDS),
    )
    advisor_timeout_seconds: float = field(
        default=30.0,
        metadata=_doc(
            "longest wait for advice; a command is killed after it", _Kind.POSITIVE_SECONDS
        ),
    )
    advisor_command: str | None = field(
        default=None,
        metadata=_doc("advisor command line (advice on stdout, exit 0)", _Kind.COMMAND),
    )
    advisor_input: AdvisorInput = field(
        default=AdvisorInput.ARGV,
        metadata=_doc(
            "how advisor_command gets the question: argv (one extra argument, nothing on stdin)"
            " or stdin_json (the request as JSON on stdin)",
            _Kind.CHOICE,
            choices=AdvisorInput,
        ),
    )
    advisor_model: str | None = field(
        default=None,
        metadata=_doc(
            "model name handed to the advisor (AdviceRequest.model; a command gets it in"
            " LOOPGUARD_ADVISOR_MODEL)",
            _Kind.TEXT,
        ),
    )
    trip_log_path: str | None = field(
        default=None,
        metadata=_doc("file to append one JSON line per non-allow decision to", _Kind.PATH),
    )
    trip_log_arguments: bool = field(
        default=False,
        metadata=_doc("include the (cut) canonical arguments in trip lines", _Kind.FLAG),
    )
    max_sessions: int = field(
        default=10_000, metadata=_doc("sessions kept (LRU eviction)", _Kind.COUNT)
    )
    session_ttl_seconds: float = field(
        default=3600.0,
        metadata=_doc("idle seconds after which a session is forgotten", _Kind.POSITIVE_SECONDS),
    )
    max_signatures_per_session: int = field(
        default=256,
        metadata=_doc("distinct signatures remembered per session and epoch", _Kind.COUNT),
    )
    store: str | None = field(
        default=None,
        metadata=_doc(
            "where sessions are kept: none (this process's memory) or a Redis URL"
            " (redis://host:6379/0, rediss:// for TLS, unix:///path), shared by every process"
            " that uses it (needs otel-loopguard[redis])",
            _Kind.URL,
        ),
    )
    store_prefix: str = field(
        default="loopguard:",
        metadata=_doc(
            "start of every Redis key of this deployment (several can share one Redis)",
            _Kind.TEXT,
        ),
    )
    store_password_file: str | None = field(
        default=None,
        metadata=_doc(
            "file holding the Redis password (its first line), instead of one in the URL",
            _Kind.PATH,
        ),
    )
    store_timeout_seconds: float = field(
        default=0.05,
        metadata=_doc(
            "longest wait for one Redis command (connecting included) before the store counts"
            " as failed",
            _Kind.POSITIVE_SECONDS,
        ),
    )
    store_failure: StoreFailure = field(
        default=StoreFailure.OPEN,
        metadata=_doc(
            "what a call gets when the Redis store fails: open (allowed, not counted) or closed"
            " (denied)",
            _Kind.CHOICE,
            choices=StoreFailure,
        ),
    )

    def __post_init__(self) -> None:
        """Normalise collections and validate; raises ``ValueError`` naming field and value."""
        for spec in _SPECS:
            value = getattr(self, spec.name)
            valid = _valid(spec.name, value, spec.metadata)
            if valid is not value:
                object.__setattr__(self, spec.name, valid)
        if not self.include:
            object.__setattr__(self, "include", ("*",))  # empty means every tool, as the plugins

        deny = self.deny_threshold
        if deny is not None and self.remind_thresholds and self.remind_thresholds[-1] >= deny:
            raise ValueError(
                f"remind_thresholds: every reminder must come before deny_threshold={deny},"
                f" got {list(self.remind_thresholds)!r}"
            )
        if self.rescue_threshold is not None:
            if deny is None:
                raise ValueError(
                    f"rescue_threshold: {self.rescue_threshold!r} needs a deny_threshold"
                    " (a rescue is a denial with advice)"
                )
            if self.rescue_threshold < deny:
                raise ValueError(
                    f"rescue_threshold: {self.rescue_threshold!r} must not be below"
                    f" deny_threshold={deny}"
                )
        if self.poll_limit is not None and deny is not None and self.poll_limit <= deny:
            raise ValueError(
                f"poll_limit: {self.poll_limit!r} must be above deny_threshold={deny}"
                " (polling is spared up to it)"
            )
        if self.max_signatures_per_session < 2 * self.window_size:
            # The rules rely on every key in the window being remembered as a signature, and
            # pruning drops a quarter of the signatures at once.
            raise ValueError(
                f"max_signatures_per_session: {self.max_signatures_per_session!r} must be at least"
                f" twice window_size={self.window_size}"
            )
        if Rule.WINDOW in self.rules and self.window_size < 2:
            raise ValueError(
                f"window_size: must be >= 2 for the window rule, got {self.window_size!r}"
            )

    def replace(self, **changes: Any) -> Policy:
        """Return a copy with ``changes`` applied (validated like a new policy)."""
        unknown = set(changes) - FIELD_NAMES
        if unknown:
            raise ValueError(unknown_message("policy field", unknown, FIELD_NAMES))
        return dataclasses.replace(self, **changes)


_SPECS: Final = dataclasses.fields(Policy)
_FIELDS: Final = {f.name: f for f in _SPECS}
FIELD_NAMES: Final = frozenset(_FIELDS)

#: Every ``LOOPGUARD_*`` variable something reads: one per policy field (:func:`env_var`) and
#: those :mod:`otel_loopguard._env` declares. Any other is a typo (:func:`unknown_variables`).
KNOWN_VARIABLES: Final = frozenset(map(env_var, _FIELDS)) | DECLARED
_KNOWN_SUFFIXES: Final = {name[len(ENV_PREFIX) :]: name for name in KNOWN_VARIABLES}
#: Unknown variables already warned about in this process (each is warned about once).
_WARNED_VARIABLES: set[str] = set()


def _kind(name: str) -> _Kind:
    kind: _Kind = _FIELDS[name].metadata["kind"]
    return kind


def validate_field(name: str, value: object, *, label: str | None = None) -> object:
    """Validate ``value`` for the policy field ``name`` by the field's kind and return it
    normalised (lists as tuples, sets as frozensets, sorted thresholds, enum members).

    Raises ``ValueError`` naming ``label`` (default: the field) and the value; for an unknown
    field, naming the field. Cross-field rules (deny before rescue, ...) are checked by
    :class:`Policy` itself.
    """
    spec = _FIELDS.get(name)
    if spec is None:
        raise ValueError(unknown_message("policy field", [name], FIELD_NAMES))
    return _valid(label or name, value, spec.metadata)


def _valid(name: str, value: object, metadata: Mapping[str, Any]) -> Any:
    """Validate one field value by its kind; return it normalised (the same object when
    nothing changes). Raises ``ValueError`` naming ``name`` and the value."""
    kind: _Kind = metadata["kind"]
    if kind in _OPTIONAL_KINDS and value is None:
        return value
    if kind is _Kind.CHOICE:
        return _enum(metadata["choices"], name, value)
    if kind in _COLLECTION_KINDS:
        return _valid_collection(kind, name, value, metadata["minimum"])
    _check_single(kind, name, value, metadata["minimum"])
    return value


_COLLECTION_KINDS: Final = frozenset(
    {_Kind.RULES, _Kind.THRESHOLDS, _Kind.PATTERNS, _Kind.REGEXES, _Kind.NAMES}
)


def _valid_collection(kind: _Kind, name: str, value: object, minimum: int) -> Any:
    """:func:`_valid` for a kind of :data:`_COLLECTION_KINDS`: a tuple or set, normalised."""
    if kind is _Kind.RULES:
        return frozenset(_enum(Rule, name, item) for item in _as_tuple(name, value))
    if kind is _Kind.THRESHOLDS:
        items = _as_tuple(name, value)
        for item in items:
            _threshold(name, item, minimum)
        if len(set(items)) != len(items):
            raise ValueError(f"{name}: duplicate thresholds in {list(items)!r}")
        return tuple(sorted(items))
    if kind is _Kind.PATTERNS:
        # Literal apart from *, tool-name patterns always compile.
        return _str_tuple(name, value)
    if kind is _Kind.REGEXES:
        patterns = _str_tuple(name, value)
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{name}: pattern {pattern!r} does not compile: {exc}") from None
        return patterns
    return frozenset(_str_tuple(name, value))  # _Kind.NAMES


def _check_single(kind: _Kind, name: str, value: object, minimum: int) -> None:
    """:func:`_valid` for a single value (a number, a string, a flag): kept as given."""
    if kind in (_Kind.THRESHOLD, _Kind.OPTIONAL_THRESHOLD):
        _threshold(name, value, minimum)
    elif kind is _Kind.COUNT:
        _positive_int(name, value)
    elif kind is _Kind.BUDGET:
        _non_negative_int(name, value)
    elif kind is _Kind.SECONDS:
        _non_negative_float(name, value)
    elif kind is _Kind.POSITIVE_SECONDS:
        _positive_float(name, value)
    elif kind is _Kind.COMMAND:
        if not isinstance(value, str):
            raise ValueError(f"{name}: expected a string, got {value!r}")
    elif kind in (_Kind.PATH, _Kind.TEXT):
        if not isinstance(value, str) or not value:
            what = "a file path" if kind is _Kind.PATH else "a non-empty string"
            raise ValueError(f"{name}: expected {what}, got {value!r}")
    elif kind is _Kind.URL:
        if not isinstance(value, str) or value.partition("://")[0].lower() not in STORE_SCHEMES:
            shown = redact_url(value) if isinstance(value, str) else value
            raise ValueError(
                f"{name}: expected a redis://, rediss:// or unix:// URL, got {shown!r}"
            )
    elif kind is _Kind.FLAG and not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {value!r}")


def _enum(kind: type[Enum], name: str, value: object) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in kind)
        raise ValueError(f"{name}: {value!r} is not one of {choices}") from None


def _as_tuple(name: str, value: object) -> tuple[Any, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{name}: expected a list, got {value!r}")
    return tuple(value)


def _str_tuple(name: str, value: object) -> tuple[str, ...]:
    items = _as_tuple(name, value)
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{name}: expected strings, got {item!r}")
    return items


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _threshold(name: str, value: object, minimum: int = 2) -> None:
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        raise ValueError(f"{name}: thresholds must be integers >= {minimum}, got {value!r}")


def _positive_int(name: str, value: object) -> None:
    if not _is_int(value) or value < 1:  # type: ignore[operator]
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def _non_negative_int(name: str, value: object) -> None:
    if not _is_int(value) or value < 0:  # type: ignore[operator]
        raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


def _non_negative_float(name: str, value: object) -> None:
    if _number(name, value) < 0:
        raise ValueError(f"{name}: expected a number >= 0, got {value!r}")


def _positive_float(name: str, value: object) -> None:
    if _number(name, value) <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {value!r}")


#: The rescue plugin's defaults (its README's configuration block): tools it never tracks,
#: argument fields it strips, tools whose successful call is progress.
RESCUE_PLUGIN_EXCLUDE: Final = ("todo_write", "ask_user", "mcp__claude__*")
RESCUE_PLUGIN_IGNORED_ARGS: Final = frozenset(
    {"description", "explanation", "reasoning", "thought", "comment"}
)
RESCUE_PLUGIN_MUTATING_TOOLS: Final = (
    "edit",
    "write",
    "multi_edit",
    "str_replace_editor",
    "apply_patch",
    "create_file",
    "notebook_edit",
)

#: What the seed presets keep from their plugins: no operation table, no stop after identical
#: failures (each preset names its plugin's own mutating tools).
_SEED_PROGRESS: Final[Mapping[str, Any]] = {
    "read_operations": (),
    "mutating_operations": (),
    "failure_stop_threshold": None,
}

PRESETS: Final[Mapping[str, Policy]] = {
    # Ours: window + outcome awareness; see README "Choosing thresholds" for the scenarios.
    "default": Policy(),
    # The repeat-tool-reminder plugin: consecutive identical calls (arguments compared whole,
    # no epochs), advisory reminders at exactly 3, 5 and 8, arguments quoted up to 500 chars.
    "reminder": Policy(
        mode=Mode.ADVISE,
        rules=frozenset({Rule.CONSECUTIVE}),
        remind_thresholds=(3, 5, 8),
        remind_past_thresholds=False,
        deny_threshold=None,
        rescue_threshold=None,
        poll_limit=None,
        stop_after_denials=None,
        arguments_preview_chars=500,
        ignored_args=frozenset(),
        mutating_tools=(),
        mutating_commands=(),
        **_SEED_PROGRESS,
    ),
    # The loop-brake plugin (maxRepeats 3): deny the 4th consecutive identical call, whatever
    # its outcome, arguments compared whole; never reminds, never stops.
    "brake": Policy(
        rules=frozenset({Rule.CONSECUTIVE}),
        remind_thresholds=(),
        deny_threshold=4,
        rescue_threshold=None,
        poll_limit=None,
        stop_after_denials=None,
        ignored_args=frozenset(),
        mutating_tools=(),
        mutating_commands=(),
        **_SEED_PROGRESS,
    ),
    # The loop-rescue plugin: 12-call window, deny the 3rd occurrence (nudgeAt), rescue from the
    # 5th (rescueAt), a rescue at 40 redundant calls in an epoch (stallAt); never stops. Its
    # advisor command and trip log are not set here (a preset runs no program and writes no
    # file): LoopGuard.from_plugin_config fills the plugin's own defaults for those.
    "rescue": Policy(
        rules=frozenset({Rule.WINDOW, Rule.STALL}),
        window_size=12,
        remind_thresholds=(),
        deny_threshold=3,
        rescue_threshold=5,
        poll_limit=None,
        stop_after_denials=None,
        stall_threshold=40,
        rescue_on_stall=True,
        exclude=RESCUE_PLUGIN_EXCLUDE,
        ignored_args=RESCUE_PLUGIN_IGNORED_ARGS,
        mutating_tools=RESCUE_PLUGIN_MUTATING_TOOLS,
        mutating_commands=(),
        max_rescues=3,
        cooldown_seconds=45.0,
        advisor_timeout_seconds=90.0,
        **_SEED_PROGRESS,
    ),
}


def _coerce(name: str, value: object) -> object:
    """Bring a TOML or environment value into the field's type (validation happens in Policy)."""
    kind = _kind(name)
    if kind in _LIST_KINDS:
        return tuple(_as_tuple(name, value))
    if kind in _SET_KINDS:
        return frozenset(_as_tuple(name, value))
    return value


def policy_from_mapping(values: Mapping[str, object], base: Policy | None = None) -> Policy:
    """Apply ``values`` (field name -> value, as in a TOML file) to ``base``.

    ``preset`` selects the base when given. Unknown keys raise ``ValueError`` naming them.
    ``false`` turns off an optional threshold (deny, rescue, poll limit, stop after denials).
    """
    values = dict(values)
    preset = values.pop("preset", None)
    if preset is not None:
        if not isinstance(preset, str) or preset not in PRESETS:
            raise ValueError(f"preset: {preset!r} is not one of {', '.join(PRESETS)}")
        base = PRESETS[preset]
    base = base if base is not None else PRESETS["default"]
    unknown = set(values) - FIELD_NAMES
    if unknown:
        raise ValueError(unknown_message("policy field", unknown, FIELD_NAMES | {"preset"}))
    changes: dict[str, object] = {}
    for name, value in values.items():
        if value is False and _kind(name) in _OPTIONAL_KINDS:
            value = None  # TOML has no null
        changes[name] = _coerce(name, value)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _parse_env(name: str, text: str) -> object:
    """Parse one environment value for field ``name``; raises ``ValueError`` when unparsable."""
    text = text.strip()
    kind = _kind(name)
    if kind in _OPTIONAL_KINDS and text.lower() in ("", "none", "off", "false"):
        return None
    if kind is _Kind.THRESHOLDS:
        return tuple(int(part) for part in text.split(",") if part.strip())
    if kind in _SET_KINDS:
        return frozenset(part.strip() for part in text.split(",") if part.strip())
    if kind in _LIST_KINDS:
        # Regexes may contain commas; they are separated by newlines or ';;'.
        separator = "\n" if "\n" in text else ";;" if kind is _Kind.REGEXES else ","
        return tuple(part.strip() for part in text.split(separator) if part.strip())
    if kind is _Kind.CHOICE:
        return text.lower()
    if kind in (_Kind.COMMAND, _Kind.PATH, _Kind.TEXT, _Kind.URL):
        return text
    if kind is _Kind.FLAG:
        lowered = text.lower()
        if lowered not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ValueError(f"expected true or false, got {text!r}")
        return lowered in ("1", "true", "yes", "on")
    if kind in (_Kind.SECONDS, _Kind.POSITIVE_SECONDS):
        return float(text)
    return int(text)


def unknown_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``LOOPGUARD_*`` variables in ``environ`` (default: ``os.environ``) that nothing reads
    (not in :data:`KNOWN_VARIABLES`), sorted, each with its warning: the name (never the value,
    which may be a secret) and the closest known names, ``<name> ignored: no such variable
    (did you mean LOOPGUARD_DENY_THRESHOLD?)`` for a misspelt ``deny_threshold``."""
    env = os.environ if environ is None else environ
    found: dict[str, str] = {}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in KNOWN_VARIABLES:
            continue
        # Compared without the prefix every name shares (it would make every name look close).
        close = close_names(name[len(ENV_PREFIX) :].upper(), _KNOWN_SUFFIXES)
        hint = f" (did you mean {' or '.join(_KNOWN_SUFFIXES[c] for c in close)}?)" if close else ""
        found[name] = f"{name} ignored: no such variable{hint}"
    return found


def policy_from_env(base: Policy | None = None, environ: Mapping[str, str] | None = None) -> Policy:
    """Apply ``LOOPGUARD_*`` overrides to ``base`` (default: the ``LOOPGUARD_PRESET`` preset).

    A bad value (unparsable, or one the policy rejects) logs a warning naming the variable and the
    value, and keeps the value it would have replaced. A variable nothing reads (a typo) logs a
    warning naming it and the closest known names, once per name per process. Never raises.
    """
    env = os.environ if environ is None else environ
    for name, warning in unknown_variables(env).items():
        if name not in _WARNED_VARIABLES:
            _WARNED_VARIABLES.add(name)
            _log.warning("%s", warning)
    if base is None:
        preset = env.get(LOOPGUARD_PRESET, "default").strip() or "default"
        if preset not in PRESETS:
            _log.warning(
                "%s=%r is not one of %s; using the default preset",
                LOOPGUARD_PRESET,
                preset,
                ", ".join(PRESETS),
            )
            preset = "default"
        base = PRESETS[preset]
    changes: dict[str, object] = {}
    for name in _FIELDS:
        variable = env_var(name)
        text = env.get(variable)
        if text is None:
            continue
        try:
            changes[name] = _parse_env(name, text)
        except (ValueError, TypeError) as exc:
            _log.warning("%s=%r ignored: %s", variable, text, exc)
    if not changes:
        return base
    try:
        # All together first: overrides that only make sense jointly (deny and rescue) apply.
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        pass
    policy = base
    for name, value in changes.items():
        try:
            policy = dataclasses.replace(policy, **{name: value})  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            shown = env[env_var(name)]
            if _kind(name) is _Kind.URL:
                shown = redact_url(shown)  # a URL may carry a password
            _log.warning("%s=%r ignored: %s", env_var(name), shown, exc)
    return policy
