"""Which calls the guard tracks and which make progress, from the policy's patterns
(:class:`Classifier`); the shell command in a shell tool's arguments (:func:`shell_command`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from .config import Policy, wildcard_union

__all__ = ["MAX_COMMAND_CHARS", "Classifier", "shell_command"]

#: Shell commands longer than this are matched on their first this-many characters only.
MAX_COMMAND_CHARS: Final = 4096
_COMMAND_KEYS: Final = ("command", "cmd", "script", "commands")
#: Arguments that can make a call of a tool that is no shell tool anything but what its name
#: says (an operation, a command line): a plain mapping without them is answered by name.
_NAMED_KEYS: Final = frozenset({"command", "action", "cmd", "script"})
_MAX_CACHED_TOOL_NAMES: Final = 1024
#: Characters of a ``command``/``action`` value searched for its first word (an operation name).
_MAX_OPERATION_CHARS: Final = 64


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
        self._policy = policy
        # An empty include list means every tool, as in the plugins (Policy stores it as "*").
        self._include = (
            None if "*" in policy.include or not policy.include else _names(policy.include)
        )
        # A final-answer tool is never tracked: a user's exclude list adds to them.
        self._exclude = _names((*policy.exclude, *policy.final_answer_tools))
        self._shell = _names(policy.shell_tools)
        self._mutating = _names(policy.mutating_tools)
        self._read_operations = _names(policy.read_operations)
        self._mutating_operations = _names(policy.mutating_operations)
        # The command patterns are compiled when a call first carries a command line.
        self._commands_compiled = False
        self._exclude_commands: re.Pattern[str] | _AnyOf | None = None
        self._mutating_commands: re.Pattern[str] | _AnyOf | None = None
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
        if not shell and type(arguments) is dict and _NAMED_KEYS.isdisjoint(arguments):
            return True, mutating  # the common case: no operation, no command line
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
        if command is not None and not self._commands_compiled:
            self._exclude_commands = _union(self._policy.exclude_commands)
            self._mutating_commands = _union(self._policy.mutating_commands)
            self._commands_compiled = True
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


def _matches(names: _Names | None, name: str) -> bool:
    return names is not None and names.matches(name)


class _Names:
    """Tool-name patterns matched as :func:`~otel_loopguard._defaults.wildcard_union`'s regex
    would match them (whole name, ``*`` any run of characters, case-insensitive), without
    compiling it for an ASCII name against ASCII patterns: compiling is most of a hook
    process's start (it builds a guard per call). Other names go to the regex, compiled then.
    """

    __slots__ = ("_exact", "_globs", "_patterns", "_regex", "_ascii")

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self._patterns = patterns
        self._regex: re.Pattern[str] | None = None
        self._ascii = all(p.isascii() for p in patterns)
        self._exact = frozenset(p.lower() for p in patterns if "*" not in p)
        self._globs = tuple(tuple(p.lower().split("*")) for p in patterns if "*" in p)

    def matches(self, name: str) -> bool:
        if self._ascii and name.isascii() and "\n" not in name:
            folded = name.lower()
            return folded in self._exact or any(_glob(parts, folded) for parts in self._globs)
        if self._regex is None:
            self._regex = wildcard_union(self._patterns)
        return self._regex is not None and self._regex.fullmatch(name) is not None


def _glob(parts: tuple[str, ...], name: str) -> bool:
    """``name`` is ``parts`` joined by runs of any characters (a pattern split at ``*``)."""
    first, last = parts[0], parts[-1]
    if len(name) < len(first) + len(last) or not name.startswith(first):
        return False
    end = len(name) - len(last)
    if not name.endswith(last):
        return False
    at = len(first)
    for part in parts[1:-1]:
        found = name.find(part, at, end)
        if found < 0:
            return False
        at = found + len(part)
    return True


def _names(patterns: tuple[str, ...]) -> _Names | None:
    """The matcher of ``patterns``, or ``None`` when there are none (as ``wildcard_union``)."""
    return _Names(tuple(patterns)) if patterns else None


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
