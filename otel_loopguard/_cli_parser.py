"""The ``otel-loopguard`` command line read by argparse: every subcommand's parser, and the
run of what it parsed (:func:`run_words`). :mod:`otel_loopguard.cli` imports it for every
command line but an ordinary ``hook`` one (:mod:`._cli_hook`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Final

from ._cli_common import (
    PROG,
    CommandParser,
    ParseError,
    UsageError,
    load_cli_policy,
    non_negative_seconds,
    policy_options,
    port_number,
)
from ._cli_hook import HOOK_HOSTS, HookArguments, run_hook, stop_quietly

__all__ = ["build_parser", "hook_arguments_of", "run_words"]


Handler = Callable[[argparse.Namespace], int]


# -- replay ------------------------------------------------------------------------------------

#: Stands for the list of input formats in ``replay --help``, filled in when help is shown.
_INPUT_FORMATS_EPILOG: Final = "\0input formats\0"


class _ReplayHelpFormatter(argparse.HelpFormatter):
    """Lists the registered input formats, read from the format registry only when help is
    shown: building the parser must not import the replay package (hooks build it per call)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text != _INPUT_FORMATS_EPILOG:
            return super()._fill_text(text, width, indent)
        import textwrap

        from otel_loopguard.replay import FORMATS

        lines = ["input formats (detected from a file's first records; --format NAME forces one):"]
        name_width = max(len(fmt.name) for fmt in FORMATS) + 2
        for fmt in FORMATS:
            lines.extend(
                textwrap.wrap(
                    fmt.description,
                    width=max(width, name_width + 20),
                    initial_indent=f"{indent}  {fmt.name:<{name_width}}",
                    subsequent_indent=f"{indent}  {'':<{name_width}}",
                )
            )
        return "\n".join(lines)


def _add_replay(commands: argparse._SubParsersAction[CommandParser]) -> None:
    parser = commands.add_parser(
        "replay",
        help="replay recorded tool calls through the guard; report what would have tripped",
        description=(
            "Feed recorded tool calls through the guard and report, per session, every reminder,"
            " denial and stop it would have given, and what a deny would have saved. Input is"
            " JSON lines in one of the input formats below, detected automatically. A large"
            " input shows a progress bar on stderr when it is a terminal (not with --json)."
            " Exit status 0 when all input was read, 1 when some lines were bad, 2 for usage"
            " errors."
        ),
        epilog=_INPUT_FORMATS_EPILOG,
        formatter_class=_ReplayHelpFormatter,
    )
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="JSON-lines file, '-' for stdin, or a directory (its *.jsonl files)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print one JSON line per call: {"session", "index", "tool", "action", "rule",'
        ' "count"}, nothing else on stdout ("detected" too where the mode softened the'
        ' action; "phase": "post" on a second line for a call decided after it ran)',
    )
    parser.add_argument(
        "--summary",
        action="store_true",
        help="print only each session's totals and trips, one line per session (with --json:"
        ' one JSON line per session: {"session", "calls", "repeated", "actions", "detected",'
        ' "first", "saved_calls", "saved_seconds"})',
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        dest="html_path",
        help="also write a self-contained HTML report to FILE: per session a timeline of its"
        " calls, repeats, reminders, denials, stops and user messages, for tuning a policy",
    )
    policy_options(parser, None, mode=True)
    parser.add_argument(
        "--format",
        metavar="NAME",
        dest="input_format",
        help="read every file in this format instead of detecting it (see input formats below)",
    )
    parser.add_argument(
        "--key-by",
        choices=("trace", "conversation"),
        default="trace",
        help="recorded traces: session state per trace and agent (default, as the span"
        " processor) or per conversation id (as serve --key-by conversation)",
    )
    parser.set_defaults(handler=_run_replay)


def _run_replay(args: argparse.Namespace) -> int:
    from otel_loopguard.config import Mode
    from otel_loopguard.replay import UsageError as ReplayUsageError
    from otel_loopguard.replay import run_replay

    policy = load_cli_policy(args)
    try:
        return run_replay(
            args.files,
            policy,
            json_output=args.json,
            format_name=args.input_format,
            mode=Mode(args.mode) if args.mode else None,
            key_by=args.key_by,
            html_path=args.html_path,
            summary=args.summary,
        )
    except ReplayUsageError as exc:
        raise UsageError(str(exc)) from None


# -- demo --------------------------------------------------------------------------------------


def _add_demo(commands: argparse._SubParsersAction[CommandParser]) -> None:
    parser = commands.add_parser(
        "demo",
        help="watch a scripted looping agent meet the guard (no network, no keys)",
        description=(
            "Run a scripted agent that gets stuck re-running the same tool call, through a real"
            " LoopGuard, and show each call with the guard's live decision: reminders, the"
            " denial the model would get, and the stop. LOOPGUARD_* settings do not apply."
        ),
    )
    policy_options(parser, "default", plugin_config=False)
    parser.add_argument(
        "--delay",
        metavar="SECONDS",
        type=non_negative_seconds,
        default=None,
        help="pause between steps (default: a short pause when stdout is a terminal, else 0)",
    )
    parser.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=port_number,
        default=None,
        help="serve the guard's Prometheus metrics on this port (0: any free one) and keep"
        " serving after the story until interrupted",
    )
    parser.add_argument(
        "--metrics-addr",
        metavar="ADDR",
        default="127.0.0.1",
        help="address to serve metrics on (default: %(default)s; 0.0.0.0 for other machines)",
    )
    parser.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from otel_loopguard._demo import MetricsServeError, run_demo

    # The demo is self-contained: LOOPGUARD_* settings meant for a real agent do not apply.
    policy = load_cli_policy(args, use_environment=False)
    try:
        return run_demo(
            policy,
            preset=args.preset if not args.config else None,
            delay=args.delay,
            metrics_port=args.metrics_port,
            metrics_addr=args.metrics_addr,
        )
    except MetricsServeError as exc:
        raise UsageError(str(exc)) from None


# -- hook --------------------------------------------------------------------------------------


def _add_hook(commands: argparse._SubParsersAction[CommandParser]) -> None:
    parser = commands.add_parser(
        "hook",
        help="answer a coding agent's command hook (Claude Code, Gemini CLI, Codex)",
        description=(
            "Read one hook event of the host as JSON on stdin (before or after a tool call, or a"
            " user prompt), decide with the guard on the session's state kept in a SQLite file"
            " (or ask a running otel-loopguard serve with --server), and print the JSON answer"
            " the host expects: a denial with the reason for the model, a reminder, or stop."
            " Always exits 0 with a JSON object. When the policy, the state file or the server"
            " cannot be used it says so on stderr and allows the call, or denies it with"
            " --fail-closed. Install it for the pre-tool, post-tool and prompt events."
        ),
    )
    parser.add_argument("host", choices=HOOK_HOSTS, help="the coding agent that runs the hook")
    parser.add_argument(
        "--store",
        metavar="PATH",
        help="SQLite state file shared by all hook calls (default: $LOOPGUARD_HOOK_STORE, else"
        " $XDG_STATE_HOME/otel-loopguard/hooks.sqlite3, else"
        " ~/.local/state/otel-loopguard/hooks.sqlite3)",
    )
    policy_options(parser, None)
    parser.add_argument(
        "--server",
        metavar="URL",
        help="ask the otel-loopguard serve at URL (its HTTP port, e.g. http://127.0.0.1:4318)"
        " instead: it keeps the sessions and applies its own policy (no --store, --preset,"
        " --config or --plugin-config)",
    )
    hook_token = parser.add_mutually_exclusive_group()
    hook_token.add_argument(
        "--token",
        metavar="TOKEN",
        help="bearer token for --server (default: $LOOPGUARD_SERVE_TOKEN, else none); other"
        " users can read it in ps: prefer --token-file or the variable",
    )
    hook_token.add_argument(
        "--token-file",
        metavar="PATH",
        help="read the bearer token for --server from this file (surrounding white space"
        " ignored; an empty or unreadable file is a failure: fail-open, or --fail-closed)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=non_negative_seconds,
        default=None,
        help="with --server: seconds to wait to connect, and for each read of the answer"
        " (default: 2; raise it above the server's advisor_timeout_seconds when it has an"
        " advisor)",
    )
    parser.add_argument(
        "--fail-closed",
        action="store_true",
        help="deny the tool call when the policy, the state file or the server cannot be used"
        " (default: allow it)",
    )
    parser.set_defaults(handler=_run_hook)


def hook_arguments_of(args: argparse.Namespace) -> HookArguments:
    """``hook``'s command line as argparse read it."""
    return HookArguments(
        args.host,
        store=args.store,
        preset=args.preset,
        config=args.config,
        plugin_config=args.plugin_config,
        server=args.server,
        token=args.token,
        token_file=args.token_file,
        timeout_seconds=args.timeout,
        fail_closed=args.fail_closed,
    )


def _run_hook(args: argparse.Namespace) -> int:
    return run_hook(hook_arguments_of(args))


# -- main --------------------------------------------------------------------------------------


def _version() -> str:
    from otel_loopguard import __version__

    return __version__


def _add_serve(commands: argparse._SubParsersAction[CommandParser]) -> None:
    from ._cli_serve import add_serve

    add_serve(commands)


def _add_memory(commands: argparse._SubParsersAction[CommandParser]) -> None:
    from ._cli_memory import add_memory

    add_memory(commands)


#: Each adds one subcommand; its handler imports its module.
_SUBCOMMANDS: Final = (_add_demo, _add_replay, _add_hook, _add_serve, _add_memory)


def build_parser(*, hook_only: bool = False) -> argparse.ArgumentParser:
    """The argument parser of ``otel-loopguard`` (subcommands ``demo``, ``replay``, ``hook``,
    ``serve``, ``memory``); with ``hook_only``, of ``hook`` alone (a hook process, per tool
    call, builds no other subcommand's parser)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Catch AI agents stuck repeating tool calls.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for add in (_add_hook,) if hook_only else _SUBCOMMANDS:
        add(commands)
    parser.set_defaults(handler=None, command_names=tuple(commands.choices))
    return parser


def run_words(words: list[str]) -> int:
    """Parse ``words`` with argparse and run the subcommand they name (:func:`cli.main`'s
    path for everything but an ordinary ``hook`` command line)."""
    parser = build_parser(hook_only=words[:1] == ["hook"])
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # argparse exits for --help, --version and bad options
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        if code != 0 and words[:1] == ["hook"]:
            from otel_loopguard.hooks import answer_usage_error

            shown = exc.shown if isinstance(exc, ParseError) else "see its usage: hook --help"
            return answer_usage_error(words[1:], shown)
        return code
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_usage(sys.stderr)
        names = ", ".join(args.command_names)
        sys.stderr.write(f"{PROG}: error: a command is required ({names})\n")
        return 2
    try:
        return stop_quietly(lambda: handler(args))
    except UsageError as exc:
        sys.stderr.write(f"{PROG} {args.command}: error: {exc}\n")
        return 2
