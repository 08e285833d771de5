"""The ``otel-loopguard`` command line.

Subcommands: ``demo`` (a scripted looping agent meeting the guard), ``replay`` (recorded tool
calls through the guard), ``hook`` (a coding agent's command hook), ``serve`` (OTLP receiver
and decision API; its command line is :mod:`._cli_serve`, what every subcommand shares
:mod:`._cli_common`) and ``memory`` (the dead ends remembered across runs: :mod:`._cli_memory`).
Each subcommand's module is imported only when that subcommand runs, so ``import
otel_loopguard.cli`` stays light; an ordinary ``hook`` command line is read without argparse
(:mod:`._cli_hook`), every other one by the parsers of :mod:`._cli_parser`.

Exit status: 0 success; 1 the command ran but some input was bad (replay: unreadable lines);
2 usage error (unknown option, missing file, bad preset or config), with a one-line message on
stderr and no traceback; 130 interrupted. ``hook`` is the exception: it always exits 0 with a
JSON answer, even for a bad command line (the hosts read any other status as "allow", and the
answer is what they act on).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._cli_hook import hook_arguments, run_hook, stop_quietly

if TYPE_CHECKING:
    import argparse

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Never raises for a user mistake: usage errors print one line on stderr and return 2.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    hook = hook_arguments(words[1:]) if words[:1] == ["hook"] else None
    if hook is not None:
        return stop_quietly(lambda: run_hook(hook))
    from ._cli_parser import run_words

    return run_words(words)


def build_parser(*, hook_only: bool = False) -> argparse.ArgumentParser:
    """The argument parser of ``otel-loopguard`` (:func:`._cli_parser.build_parser`)."""
    from ._cli_parser import build_parser

    return build_parser(hook_only=hook_only)


if __name__ == "__main__":
    sys.exit(main())
