"""``otel-loopguard serve``'s command line: its options and the run (the service itself is
:mod:`otel_loopguard.service`, imported when the command runs)."""

from __future__ import annotations

import argparse
import sys

from ._cli_common import (
    PROG,
    CommandParser,
    UsageError,
    load_cli_policy,
    non_negative_seconds,
    policy_options,
    port_number,
)

__all__ = ["add_serve", "run_serve_command", "serve_token"]


# -- serve -------------------------------------------------------------------------------------


def add_serve(commands: argparse._SubParsersAction[CommandParser]) -> None:
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
        type=port_number,
        default=DEFAULT_HTTP_PORT,
        help="OTLP/HTTP, decisions, /metrics, /healthz (default: %(default)s; 0: any free port)",
    )
    parser.add_argument(
        "--grpc-port",
        metavar="PORT",
        type=port_number,
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
    policy_options(parser, None, mode=True)
    parser.add_argument(
        "--hold-seconds",
        metavar="SECONDS",
        type=non_negative_seconds,
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
        type=non_negative_seconds,
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
    parser.set_defaults(handler=run_serve_command)


def run_serve_command(args: argparse.Namespace) -> int:
    try:
        from otel_loopguard.service import TOKEN_ENV, ServeOptions, run_serve
    except ImportError as exc:
        raise UsageError(
            "serve needs the serve extra: from a checkout of the repository,"
            f" pip install '.[serve]' ({exc})"
        ) from None
    from otel_loopguard.config import Mode

    policy = load_cli_policy(args)
    if args.mode:
        policy = policy.replace(mode=Mode(args.mode))
    token = serve_token(args, TOKEN_ENV)
    if args.state_dir is not None and (args.store is not None or policy.store is not None):
        given = "--store" if args.store is not None else "the policy's store"
        raise UsageError(
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
        raise UsageError(str(exc)) from None
    try:
        return run_serve(options, policy, log_level=args.log_level, log_format=args.log_format)
    except OSError as exc:  # the message names the address and port
        raise UsageError(str(exc.strerror or exc)) from None
    except ValueError as exc:  # a TLS certificate or key, or a state directory, that cannot be used
        raise UsageError(str(exc)) from None


def serve_token(args: argparse.Namespace, variable: str) -> str | None:
    """The token from --token (with a warning: ps shows it), --token-file or the variable
    (:func:`otel_loopguard._token.read_token`). An empty one is refused wherever it comes from:
    it would turn authentication off."""
    from otel_loopguard._token import EmptyToken, read_token

    try:
        found = read_token(args.token, args.token_file, variable=variable)
    except EmptyToken as exc:
        raise UsageError(
            f"{exc}, which would turn authentication off; give a token, or unset it to serve"
            " without one"
        ) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.token is not None:
        print(
            f"{PROG} serve: warning: --token can be read by other users in ps; use --token-file"
            f" or {variable}",
            file=sys.stderr,
        )
    return None if found is None else found[0]
