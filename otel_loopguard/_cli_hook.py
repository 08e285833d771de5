"""``otel-loopguard hook``'s ordinary command line, read without argparse.

A host starts the hook once per event, twice per tool call, so importing argparse and building
its parser is paid on every call. :func:`hook_arguments` reads the command lines a host is
configured with (the host, then options spelt in full, each given once) and answers ``None`` for
anything else: ``--help``, an abbreviated or unknown option, a bad value. The caller then parses
the words with argparse as before, so help and error output are argparse's own. Standard
library only; imports nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final

__all__ = [
    "HOOK_HOSTS",
    "HookArguments",
    "hook_arguments",
    "non_negative_seconds_or_problem",
    "run_hook",
    "stop_quietly",
]

#: The hosts of ``hook``: the names of ``otel_loopguard.hooks.HOSTS`` (a test keeps them equal),
#: listed here so that reading the command line does not import the hooks.
HOOK_HOSTS: Final = ("claude-code", "gemini-cli", "codex")

#: What :class:`HookArguments` holds.
_FIELDS: Final = (
    "host",
    "store",
    "preset",
    "config",
    "plugin_config",
    "server",
    "token",
    "token_file",
    "timeout_seconds",
    "fail_closed",
)

#: ``hook``'s options that take a value, and the keyword of ``hooks.run`` each one fills.
_VALUED: Final = {
    "--store": "store",
    "--preset": "preset",
    "--config": "config",
    "--plugin-config": "plugin_config",
    "--server": "server",
    "--token": "token",
    "--token-file": "token_file",
    "--timeout": "timeout_seconds",
}


class HookArguments:
    """``hook``'s command line, read (by :func:`hook_arguments` or by argparse). A plain class:
    a NamedTuple or a dataclass costs the hook's every start more than this module's reading."""

    __slots__ = _FIELDS

    def __init__(
        self,
        host: str,
        *,
        store: str | None = None,
        preset: str | None = None,
        config: str | None = None,
        plugin_config: str | None = None,
        server: str | None = None,
        token: str | None = None,
        token_file: str | None = None,
        timeout_seconds: float | None = None,
        fail_closed: bool = False,
    ) -> None:
        self.host = host
        self.store = store
        self.preset = preset
        self.config = config
        self.plugin_config = plugin_config
        self.server = server
        self.token = token
        self.token_file = token_file
        self.timeout_seconds = timeout_seconds
        self.fail_closed = fail_closed

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HookArguments):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        return f"HookArguments({shown})"


def run_hook(arguments: HookArguments) -> int:
    """Answer the hook event on stdin as ``arguments`` say (``otel_loopguard.hooks.run``)."""
    from otel_loopguard.hooks import run

    return run(
        arguments.host,
        store=arguments.store,
        preset=arguments.preset,
        config=arguments.config,
        fail_closed=arguments.fail_closed,
        server=arguments.server,
        token=arguments.token,
        token_file=arguments.token_file,
        timeout_seconds=arguments.timeout_seconds,
        plugin_config=arguments.plugin_config,
    )


def non_negative_seconds_or_problem(text: str) -> float | str:
    """``text`` as a finite number of seconds >= 0, or the message saying why it is not."""
    try:
        value = float(text)
    except ValueError:
        return f"expected a number of seconds, got {text!r}"
    if not value >= 0 or value == float("inf"):  # also rejects NaN
        return f"expected a finite number >= 0, got {text!r}"
    return value


def hook_arguments(words: Sequence[str]) -> HookArguments | None:
    """``hook``'s command line from ``words`` (what follows ``hook``), or ``None`` when
    argparse must read them (help, a mistake, a rare spelling)."""
    found: dict[str, Any] = {"host": None}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("-"):
            if found["host"] is not None or word not in HOOK_HOSTS:
                return None
            found["host"] = word
            continue
        if word == "--fail-closed":
            if "fail_closed" in found:
                return None
            found["fail_closed"] = True
            continue
        name, equals, value = word.partition("=")
        key = _VALUED.get(name)
        if key is None or key in found:
            return None
        if not equals:
            if index == len(words) or words[index].startswith("-"):
                return None
            value = words[index]
            index += 1
        found[key] = value
    if found["host"] is None or ("token" in found and "token_file" in found):
        return None
    if "timeout_seconds" in found:
        seconds = non_negative_seconds_or_problem(found["timeout_seconds"])
        if isinstance(seconds, str):
            return None
        found["timeout_seconds"] = seconds
    return HookArguments(**found)


def stop_quietly(run: Callable[[], int]) -> int:
    """``run()``'s exit status; 130 when interrupted, 0 when stdout's reader went away."""
    try:
        return run()
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python's exit flush
        # from failing again on the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
