"""``otel-loopguard memory``: the dead ends remembered across runs (issue 28), seen and managed.

``list`` (one line per dead end, most recent first), ``show SIGNATURE`` (everything kept of the
dead ends whose signature starts so), ``forget SIGNATURE`` and ``clear``; each with ``--scope``.
Which memory: ``--memory`` (a file or a Redis URL), ``--state-dir`` (``serve``'s), ``--store``
(the command hooks' state file), else the policy's ``memory`` where it names one, the policy's
Redis store, or the hooks' default state file. :mod:`otel_loopguard._memory` is imported when
the command runs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._cli_common import CommandParser, UsageError, load_cli_policy, policy_options

__all__ = ["add_memory"]

#: Shortest signature prefix ``forget`` accepts (a shorter one would match too much by chance).
_MIN_PREFIX = 6


def add_memory(commands: argparse._SubParsersAction[CommandParser]) -> None:
    parser = commands.add_parser(
        "memory",
        help="list, show, forget or clear the dead ends remembered across runs",
        description=(
            "The dead ends the guard remembers across runs: calls a run was denied or stopped"
            " for, with their outcome, so that a later run of the same scope is reminded at"
            " the first repeat. Exit status 0; 1 when forget or show matched nothing; 2 for"
            " usage errors."
        ),
    )
    parser.add_argument("action", choices=("list", "show", "forget", "clear"))
    parser.add_argument(
        "signature",
        nargs="?",
        help="show, forget: the dead end's signature (its first hex characters, at least 6)",
    )
    parser.add_argument(
        "--scope",
        metavar="SCOPE",
        help="only this scope: global, agent:NAME, repository:PATH, or a directory (its git"
        " root's repository scope); default: every scope",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--memory", metavar="WHERE", help="a memory file or a Redis URL")
    where.add_argument("--state-dir", metavar="DIR", help="serve's --state-dir")
    where.add_argument("--store", metavar="PATH", help="the command hooks' SQLite state file")
    parser.add_argument("--json", action="store_true", help="one JSON object per dead end")
    policy_options(parser, None, plugin_config=False)
    parser.set_defaults(handler=run_memory)


def _scope(text: str | None) -> str | None:
    if text is None:
        return None
    if text == "global" or text.startswith(("agent:", "repository:")):
        return text
    from pathlib import Path

    from ._memory import repository_root

    if not Path(text).is_dir():
        raise UsageError(
            f"--scope: {text!r} is not global, agent:NAME, repository:PATH or a directory"
        )
    return f"repository:{repository_root(text)}"


def _open(args: argparse.Namespace) -> Any:
    from pathlib import Path

    from ._memory import MEMORY_FILE_NAME, open_memory
    from .hooks._store import StoreError, default_store_path

    policy = load_cli_policy(args)
    if args.memory is not None:
        policy = policy.replace(memory=args.memory)
    elif args.state_dir is not None:
        policy = policy.replace(memory=str(Path(args.state_dir) / MEMORY_FILE_NAME))
    elif args.store is not None:
        policy = policy.replace(memory=args.store)
    elif policy.memory is True:
        if policy.store is not None:
            policy = policy.replace(memory=policy.store)
        else:
            try:
                policy = policy.replace(memory=str(default_store_path()))
            except StoreError as exc:
                raise UsageError(str(exc)) from None
    try:
        memory = open_memory(policy)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if memory is None:
        raise UsageError("memory is off (memory = false): name one with --memory")
    return memory


def _when(seconds: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def run_memory(args: argparse.Namespace) -> int:
    import json

    action = args.action
    signature = (args.signature or "").lower()
    if action in ("show", "forget"):
        if len(signature) < _MIN_PREFIX or any(c not in "0123456789abcdef" for c in signature):
            raise UsageError(f"{action}: give a signature of at least {_MIN_PREFIX} hex characters")
    elif args.signature is not None:
        raise UsageError(f"{action} takes no signature (use --scope to narrow it)")
    scope = _scope(args.scope)
    memory = _open(args)
    out = sys.stdout
    if action == "clear":
        dropped = memory.clear(scope)
        out.write(f"forgot {dropped} dead end{'s' if dropped != 1 else ''} ({memory.where})\n")
        return 0
    if action == "forget":
        dropped = memory.forget(scope, signature)
        out.write(f"forgot {dropped} dead end{'s' if dropped != 1 else ''} ({memory.where})\n")
        return 0 if dropped else 1
    entries = memory.entries(scope)
    if action == "show":
        entries = [entry for entry in entries if entry.key.startswith(signature)]
        if not entries:
            sys.stderr.write(f"no dead end with signature {signature} in {memory.where}\n")
            return 1
    for entry in entries:
        if args.json:
            out.write(json.dumps(entry.to_plain(), sort_keys=True) + "\n")
        elif action == "list":
            runs = f"{entry.runs} run{'s' if entry.runs != 1 else ''}"
            out.write(
                f"{entry.key[:12]}  {entry.tool}  {entry.rule}  {runs}, last {_when(entry.last)},"
                f" {entry.count} attempts  {entry.scope}\n"
            )
        else:
            out.write(
                f"signature  {entry.key}\ntool       {entry.tool}\nscope      {entry.scope}\n"
                f"outcome    {entry.outcome or 'unknown (no result reported)'}\n"
                f"rule       {entry.rule}\nruns       {entry.runs}\n"
                f"attempts   {entry.count} (in the last run)\n"
                f"first      {_when(entry.first)}\nlast       {_when(entry.last)}\n"
                + (f"arguments  {entry.arguments}\n" if entry.arguments is not None else "")
                + "\n"
            )
    if not entries and action == "list" and not args.json:
        out.write(f"no dead ends remembered ({memory.where})\n")
    return 0
