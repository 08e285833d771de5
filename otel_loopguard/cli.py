"""The ``otel-loopguard`` command line.

Subcommands: ``demo`` (a scripted looping agent meeting the guard), ``replay`` (recorded tool
calls through the guard), ``hook`` (a coding agent's command hook) and ``serve`` (OTLP receiver
and decision API). Each subcommand's module is imported only when that subcommand runs, so
``import otel_loopguard.cli`` stays light.

Exit status: 0 success; 1 the command ran but some input was bad (replay: unreadable lines);
2 usage error (unknown option, missing file, bad preset or config), with a one-line message on
stderr and no traceback; 130 interrupted. ``hook`` is the exception: it always exits 0 with a
JSON answer, even for a bad command line (the hosts read any other status as "allow", and the
answer is what they act on).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, NoReturn

if TYPE_CHECKING:
    from otel_loopguard.config import Policy

__all__ = ["main"]

PROG = "otel-loopguard"

Handler = Callable[[argparse.Namespace], int]


class _UsageError(Exception):
    """A command line that cannot be carried out; exit status 2."""


def _non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):  # also rejects NaN
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return value


def _policy_options(
    parser: argparse.ArgumentParser, preset_default: str | None, *, plugin_config: bool = True
) -> None:
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


def _load_policy(args: argparse.Namespace, *, use_environment: bool = True) -> Policy:
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
        raise _UsageError(str(exc)) from None


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


def _add_replay(commands: argparse._SubParsersAction[_CommandParser]) -> None:
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
    _policy_options(parser, None)
    parser.add_argument(
        "--mode",
        choices=("observe", "advise", "enforce"),
        help="override the policy's mode (default: the policy's own)",
    )
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
    from otel_loopguard.replay import UsageError, run_replay

    policy = _load_policy(args)
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
    except UsageError as exc:
        raise _UsageError(str(exc)) from None


# -- demo --------------------------------------------------------------------------------------


def _add_demo(commands: argparse._SubParsersAction[_CommandParser]) -> None:
    parser = commands.add_parser(
        "demo",
        help="watch a scripted looping agent meet the guard (no network, no keys)",
        description=(
            "Run a scripted agent that gets stuck re-running the same tool call, through a real"
            " LoopGuard, and show each call with the guard's live decision: reminders, the"
            " denial the model would get, and the stop. LOOPGUARD_* settings do not apply."
        ),
    )
    _policy_options(parser, "default", plugin_config=False)
    parser.add_argument(
        "--delay",
        metavar="SECONDS",
        type=_non_negative_seconds,
        default=None,
        help="pause between steps (default: a short pause when stdout is a terminal, else 0)",
    )
    parser.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=_port,
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
    policy = _load_policy(args, use_environment=False)
    try:
        return run_demo(
            policy,
            preset=args.preset if not args.config else None,
            delay=args.delay,
            metrics_port=args.metrics_port,
            metrics_addr=args.metrics_addr,
        )
    except MetricsServeError as exc:
        raise _UsageError(str(exc)) from None


# -- hook --------------------------------------------------------------------------------------

#: The hosts of ``hook``: the names of ``otel_loopguard.hooks.HOSTS`` (a test keeps them equal),
#: listed here so that building the parser does not import the hooks.
_HOOK_HOSTS: Final = ("claude-code", "gemini-cli", "codex")


def _add_hook(commands: argparse._SubParsersAction[_CommandParser]) -> None:
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
    parser.add_argument("host", choices=_HOOK_HOSTS, help="the coding agent that runs the hook")
    parser.add_argument(
        "--store",
        metavar="PATH",
        help="SQLite state file shared by all hook calls (default: $LOOPGUARD_HOOK_STORE, else"
        " $XDG_STATE_HOME/otel-loopguard/hooks.sqlite3, else"
        " ~/.local/state/otel-loopguard/hooks.sqlite3)",
    )
    _policy_options(parser, None)
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
        type=_non_negative_seconds,
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


def _run_hook(args: argparse.Namespace) -> int:
    from otel_loopguard.hooks import run

    return run(
        args.host,
        store=args.store,
        preset=args.preset,
        config=args.config,
        fail_closed=args.fail_closed,
        server=args.server,
        token=args.token,
        token_file=args.token_file,
        timeout_seconds=args.timeout,
        plugin_config=args.plugin_config,
    )


# -- serve -------------------------------------------------------------------------------------


def _add_serve(commands: argparse._SubParsersAction[_CommandParser]) -> None:
    from otel_loopguard._serve_defaults import (
        DEFAULT_GRPC_PORT,
        DEFAULT_HOLD_SECONDS,
        DEFAULT_HTTP_PORT,
        DEFAULT_MAX_BODY_BYTES,
        DEFAULT_MAX_CONNECTIONS,
        DEFAULT_MAX_INFLIGHT_BYTES,
        DEFAULT_MAX_QUEUED_SPANS,
        DEFAULT_REQUEST_TIMEOUT_SECONDS,
    )

    parser = commands.add_parser(
        "serve",
        help="receive OTLP traces, detect loops, answer decisions over HTTP (any language)",
        description=(
            "Receive OpenTelemetry traces over OTLP (HTTP protobuf and JSON, gzip, on the HTTP"
            " port; gRPC on the gRPC port), feed their tool spans through the guard as the"
            " in-process span processor does, and answer decisions for hooks in other processes"
            " (POST /v1/decisions/before, /after, /user_message, /new_run). Also serves"
            " /metrics and /healthz. Binds 127.0.0.1 unless told otherwise; a non-loopback"
            " address needs a token (or --insecure). Stops on SIGINT/SIGTERM after feeding every"
            " accepted span. Logs one line per decision (--log-level, --log-format). Needs the"
            " serve extra: pip install '.[serve]' from a checkout of the repository."
        ),
    )
    parser.add_argument(
        "--host",
        metavar="ADDR",
        default="127.0.0.1",
        help="address to bind both ports on (default: %(default)s)",
    )
    parser.add_argument(
        "--http-port",
        metavar="PORT",
        type=_port,
        default=DEFAULT_HTTP_PORT,
        help="OTLP/HTTP, decisions, /metrics, /healthz (default: %(default)s; 0: any free port)",
    )
    parser.add_argument(
        "--grpc-port",
        metavar="PORT",
        type=_port,
        default=DEFAULT_GRPC_PORT,
        help="OTLP/gRPC (default: %(default)s; 0: any free port)",
    )
    parser.add_argument("--no-grpc", action="store_true", help="do not serve OTLP/gRPC")
    token = parser.add_mutually_exclusive_group()
    token.add_argument(
        "--token",
        metavar="TOKEN",
        help="require 'Authorization: Bearer TOKEN' on every endpoint but /healthz (default:"
        " $LOOPGUARD_SERVE_TOKEN, else none); other users can read it in ps: prefer"
        " --token-file or the variable",
    )
    token.add_argument(
        "--token-file",
        metavar="PATH",
        help="read the token from this file (surrounding white space ignored)",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="serve HTTPS on the HTTP port with this certificate (chain) file; needs --tls-key",
    )
    parser.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="keep a write-ahead log and snapshots in DIR (made if missing; one serve at a time):"
        " after a crash and a restart on the same DIR no span answered 200 is lost and every"
        " loop count goes on where it was (default: state lives in memory only)",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        help="keep the sessions in this Redis (redis://HOST:6379/0, rediss:// for TLS,"
        " unix://PATH), shared by every serve on it: replicas behind any load balancer decide"
        " as one; Redis keeps them, so not with --state-dir (default: the policy's store, else"
        " memory)",
    )
    parser.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host without a token"
    )
    _policy_options(parser, None)
    parser.add_argument(
        "--mode",
        choices=("observe", "advise", "enforce"),
        help="override the policy's mode (default: the policy's own)",
    )
    parser.add_argument(
        "--hold-seconds",
        metavar="SECONDS",
        type=_non_negative_seconds,
        default=DEFAULT_HOLD_SECONDS,
        help="how long a tool span waits for its trace's root span before it is judged with"
        " the ancestors known so far; above the exporters' batch delay (5 s by default),"
        " else runs lose their agent (default: %(default)s)",
    )
    parser.add_argument(
        "--key-by",
        choices=("trace", "conversation"),
        default="trace",
        help="session state per trace and agent (default), or per conversation id"
        " (gen_ai.conversation.id, session.id, thread id; a new agent run then starts a new"
        " progress epoch), as the Collector's conversation routing expects",
    )
    parser.add_argument(
        "--max-queued-spans",
        metavar="N",
        type=int,
        default=DEFAULT_MAX_QUEUED_SPANS,
        help="accepted spans waiting for the guard before clients get 429 /"
        " RESOURCE_EXHAUSTED (default: %(default)s)",
    )
    parser.add_argument(
        "--max-body-bytes",
        metavar="N",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body, after gzip (default: %(default)s)",
    )
    parser.add_argument(
        "--max-inflight-bytes",
        metavar="N",
        type=int,
        default=DEFAULT_MAX_INFLIGHT_BYTES,
        help="request body bytes being read, inflated or decoded at once, HTTP and gRPC together,"
        " before clients get 429 / RESOURCE_EXHAUSTED with a retry delay; decision bodies have"
        " a budget of their own, an eighth of this (default: %(default)s)",
    )
    parser.add_argument(
        "--max-connections",
        metavar="N",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="open HTTP connections, TLS handshakes included; the last eighth serve only"
        " decisions and /healthz, and when all are taken a new connection replaces the oldest"
        " one there still waiting for a request, else it is closed at once"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--request-timeout",
        metavar="SECONDS",
        type=_non_negative_seconds,
        default=DEFAULT_REQUEST_TIMEOUT_SECONDS,
        help="seconds to receive a whole HTTP request (TLS handshake, headers and body; a slower"
        " one gets 408 and is closed), for a client to read its answers (else closed) and for"
        " a gRPC call's message to arrive (else DEADLINE_EXCEEDED) (default: %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="info: one line per decision where something was detected (reminder, denial,"
        " rescue, stop, also in observe mode); debug: every decision and request too"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="json: one JSON object per line, a decision's fields as keys (default: %(default)s)",
    )
    parser.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    try:
        from otel_loopguard.service import TOKEN_ENV, ServeOptions, run_serve
    except ImportError as exc:
        raise _UsageError(
            "serve needs the serve extra: from a checkout of the repository,"
            f" pip install '.[serve]' ({exc})"
        ) from None
    from otel_loopguard.config import Mode

    policy = _load_policy(args)
    if args.mode:
        policy = policy.replace(mode=Mode(args.mode))
    token = _serve_token(args, TOKEN_ENV)
    if args.state_dir is not None and (args.store is not None or policy.store is not None):
        given = "--store" if args.store is not None else "the policy's store"
        raise _UsageError(
            f"--state-dir cannot be combined with {given}: with a Redis store the sessions and"
            " their durability are Redis's (run it with appendonly yes, appendfsync always)"
        )
    try:
        options = ServeOptions(
            host=args.host,
            http_port=args.http_port,
            grpc_port=None if args.no_grpc else args.grpc_port,
            token=token,
            insecure=args.insecure,
            max_body_bytes=args.max_body_bytes,
            max_queued_spans=args.max_queued_spans,
            hold_seconds=args.hold_seconds,
            key_by=args.key_by,
            max_inflight_bytes=args.max_inflight_bytes,
            max_connections=args.max_connections,
            request_timeout_seconds=args.request_timeout,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            state_dir=args.state_dir,
            store=args.store,
        )
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    try:
        return run_serve(options, policy, log_level=args.log_level, log_format=args.log_format)
    except OSError as exc:  # the message names the address and port
        raise _UsageError(str(exc.strerror or exc)) from None
    except ValueError as exc:  # a TLS certificate or key, or a state directory, that cannot be used
        raise _UsageError(str(exc)) from None


def _serve_token(args: argparse.Namespace, variable: str) -> str | None:
    """The token from --token (with a warning: ps shows it), --token-file or the variable
    (:func:`otel_loopguard._token.read_token`). An empty one is refused wherever it comes from:
    it would turn authentication off."""
    from otel_loopguard._token import EmptyToken, read_token

    try:
        found = read_token(args.token, args.token_file, variable=variable)
    except EmptyToken as exc:
        raise _UsageError(
            f"{exc}, which would turn authentication off; give a token, or unset it to serve"
            " without one"
        ) from None
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    if args.token is not None:
        print(
            f"{PROG} serve: warning: --token can be read by other users in ps; use --token-file"
            f" or {variable}",
            file=sys.stderr,
        )
    return None if found is None else found[0]


# -- main --------------------------------------------------------------------------------------


def _version() -> str:
    from otel_loopguard import __version__

    return __version__


class _ParseError(SystemExit):
    """A subcommand's command line could not be parsed: exit status 2, with the error's text
    fit to show a user (unknown words that are not options, perhaps a token, left out)."""

    def __init__(self, shown: str) -> None:
        super().__init__(2)
        self.shown = shown


class _CommandParser(argparse.ArgumentParser):
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
        """Print the usage and the error as argparse does, and raise :class:`_ParseError`."""
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        # the value the user gave is left out (it may be a token); the choices are kept
        shown = getattr(self, "_shown", None) or re.sub(r"(got |: )'[^']*'", r"\1…", message)
        raise _ParseError(shown)

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


#: Each adds one subcommand; its handler imports its module.
_SUBCOMMANDS: Final = (_add_demo, _add_replay, _add_hook, _add_serve)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``otel-loopguard`` (subcommands ``demo``, ``replay``, ``hook``,
    ``serve``)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Catch AI agents stuck repeating tool calls.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    for add in _SUBCOMMANDS:
        add(commands)
    parser.set_defaults(handler=None, command_names=tuple(commands.choices))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Never raises for a user mistake: usage errors print one line on stderr and return 2.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits for --help, --version and bad options
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        words = list(sys.argv[1:] if argv is None else argv)
        if code != 0 and words[:1] == ["hook"]:
            from otel_loopguard.hooks import answer_usage_error

            shown = exc.shown if isinstance(exc, _ParseError) else "see its usage: hook --help"
            return answer_usage_error(words[1:], shown)
        return code
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_usage(sys.stderr)
        names = ", ".join(args.command_names)
        sys.stderr.write(f"{PROG}: error: a command is required ({names})\n")
        return 2
    try:
        return handler(args)
    except _UsageError as exc:
        sys.stderr.write(f"{PROG} {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python's exit flush
        # from failing again on the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
