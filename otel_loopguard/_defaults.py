"""The policy's vocabulary: its enums (:class:`Mode`, :class:`Rule`, ...), the default tool,
operation and command lists, the seed plugins' lists, and the name helpers (wildcard patterns,
"did you mean" for a misspelt name). Imported by :mod:`._settings`, which declares the policy
itself."""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import Enum
from typing import Final

from ._env import POLICY_PREFIX, policy_variable

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
    """The detection rules of DESIGN §4, and the budget rule; values are the wire strings used
    in events and metrics."""

    CONSECUTIVE = "consecutive"
    WINDOW = "window"
    NO_PROGRESS = "no_progress"
    STALL = "stall"
    #: A loop or a run that has cost more than the policy's budget (``max_loop_cost_usd``,
    #: ``max_loop_tokens``, ``max_run_cost_usd``, ``max_run_tokens``): on whenever a budget is
    #: set, never listed in the policy's ``rules``.
    BUDGET = "budget"
    #: A call an earlier run of the same scope was stopped or denied for, repeated with the same
    #: outcome (``memory``): on whenever memory is, never listed in the policy's ``rules``.
    MEMORY = "memory"


#: The rules the policy's ``rules`` field enables (every rule but the budget rule, which its
#: budgets enable, and the memory rule, which memory enables).
DETECTION_RULES: Final = frozenset(rule for rule in Rule if rule not in (Rule.BUDGET, Rule.MEMORY))


class CostUnit(str, Enum):
    """What the texts and the decisions say a loop cost in."""

    #: Tokens and US dollars (the provider's figure, else computed at API prices).
    USD = "usd"
    #: Tokens only, for users on a subscription (who pay no per-token price): no money figure
    #: in the texts or the decisions, and no dollar budget.
    TOKENS = "tokens"


class MemoryScope(str, Enum):
    """Which later runs a dead end is remembered for (the policy's ``memory_scope``)."""

    #: Runs in the same repository: the git root (else the working directory) the command
    #: hooks receive; an in-process guard's own working directory.
    REPOSITORY = "repository"
    #: Runs of the same agent (its name).
    AGENT = "agent"
    #: Every run that uses the same memory.
    GLOBAL = "global"


#: Top-level argument fields that only narrate a call and never change what it does.
DEFAULT_IGNORED_ARGS: Final = frozenset(
    {"description", "explanation", "reasoning", "thought", "comment", "task_progress"}
)

#: Phrases that announce a change of approach in a model's text (:mod:`otel_loopguard._intent`),
#: lower case, one space between words: English, and a few French, German and Spanish ones.
DEFAULT_INTENT_PHRASES: Final = frozenset(
    {
        # English
        "let me try a different",
        "let me try another",
        "let me try something else",
        "let me take a different",
        "let me change",
        "let me rethink",
        "i'll try a different",
        "i will try a different",
        "i'll try another",
        "i will try another",
        "try a different approach",
        "try something different",
        "a different approach",
        "another approach",
        "an alternative approach",
        "a new approach",
        "a different strategy",
        "a different method",
        "change my approach",
        "change approach",
        "instead, i will",
        "instead, i'll",
        "instead i will",
        "instead i'll",
        "instead, let me",
        "instead let me",
        # French
        "une autre approche",
        "une approche différente",
        "essayons autre chose",
        "je vais essayer autrement",
        # German
        "einen anderen ansatz",
        "anders versuchen",
        "eine andere methode",
        # Spanish
        "otro enfoque",
        "un enfoque diferente",
        "probemos otra",
        "intentaré otra",
    }
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
    import difflib  # here: only a mistake needs it, not every hook process

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
