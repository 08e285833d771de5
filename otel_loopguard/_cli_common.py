"""What every ``otel-loopguard`` subcommand's command line shares: the usage error (exit status
2), the argument types, the policy options and their loading, and the subcommand parser that
names its own unknown options."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from ._cli_hook import non_negative_seconds_or_problem

if TYPE_CHECKING:
    from otel_loopguard.config import Policy

__all__ = [
    "PROG",
    "CommandParser",
    "ParseError",
    "UsageError",
    "load_cli_policy",
    "non_negative_seconds",
    "policy_options",
    "port_number",
]

#: The command's name, as its messages and usage say it.
PROG = "otel-loopguard"


class UsageError(Exception):
    """A command line that cannot be carried out; exit status 2."""


def non_negative_seconds(text: str) -> float:
    value = non_negative_seconds_or_problem(text)
    if isinstance(value, str):
        raise argparse.ArgumentTypeError(value)
    return value


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return value


def policy_options(
    parser: argparse.ArgumentParser,
    preset_default: str | None,
    *,
    plugin_config: bool = True,
    mode: bool = False,
) -> None:
    """``--preset``, ``--config``, ``--plugin-config`` (unless ``plugin_config`` is false)
    and, with ``mode``, ``--mode`` (the policy's mode overridden)."""
    from otel_loopguard.config import PRESETS

    names = ", ".join(PRESETS)
    parser.add_argument(
        "--preset",
        metavar="NAME",
        default=preset_default,
        help=f"policy preset: {names} (default: %(default)s)"
        if preset_default
        else f"policy preset: {names} (default: LOOPGUARD_PRESET, else default)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML policy file (top-level keys or a [loopguard] table); overrides the preset",
    )
    if plugin_config:
        parser.add_argument(
            "--plugin-config",
            metavar="[NAME=]FILE",
            help="the configuration of the repeat-tool-reminder, loop-brake or loop-rescue"
            " plugin, as is (YAML, JSON or TOML: its entry with id and config, or"
            " NAME=FILE for a bare config); its preset is the base instead of --preset,"
            " and --config still applies on top",
        )
    if mode:
        parser.add_argument(
            "--mode",
            choices=("observe", "advise", "enforce"),
            help="override the policy's mode (default: the policy's own)",
        )


def load_cli_policy(args: argparse.Namespace, *, use_environment: bool = True) -> Policy:
    """The policy from ``--preset`` and ``--config`` (and ``LOOPGUARD_*`` unless
    ``use_environment`` is false); a bad one is a usage error."""
    from otel_loopguard.config import load_policy

    try:
        return load_policy(
            args.preset,
            args.config,
            None if use_environment else {},
            getattr(args, "plugin_config", None),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


class ParseError(SystemExit):
    """A subcommand's command line could not be parsed: exit status 2, with the error's text
    fit to show a user (unknown words that are not options, perhaps a token, left out)."""

    def __init__(self, shown: str) -> None:
        super().__init__(2)
        self.shown = shown


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: an unknown option is its own error, with its own usage and the
    closest option it has (argparse would hand it to the top-level parser, whose usage names
    no option of the subcommand)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            options = [word.split("=", 1)[0] for word in extras if word.startswith("-")]
            suggestion = self._suggestion(extras)
            self._shown = f"unrecognized arguments: {' '.join(options) or '…'}{suggestion}"
            self.error(f"unrecognized arguments: {' '.join(extras)}{suggestion}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        """Print the usage and the error as argparse does, and raise :class:`ParseError`."""
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        # the value the user gave is left out (it may be a token); the choices are kept
        shown = getattr(self, "_shown", None) or re.sub(r"(got |: )'[^']*'", r"\1…", message)
        raise ParseError(shown)

    def _suggestion(self, extras: list[str]) -> str:
        import difflib

        known = [
            option
            for action in self._actions
            for option in action.option_strings
            if option.startswith("--")
        ]
        for word in extras:
            if word.startswith("--"):
                close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""
