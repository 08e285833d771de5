"""The span processor and Prometheus metrics together, on a real TracerProvider.

    python examples/processor_with_metrics.py            # metrics on 127.0.0.1:9464 until Ctrl-C
    python examples/processor_with_metrics.py --port 0   # any free port (printed)

A scripted agent runs the same tool call six times, traced with the OpenTelemetry GenAI
conventions as an instrumented framework would trace it. The processor feeds each tool span to
the guard when the span ends; each decision other than allow becomes a short
``loopguard.decision`` span beside the tool span (a child of the agent span), started through the
provider the tool span belongs to, so it reaches that provider's exporters (this example adds
none). The guard's metrics are served for Prometheus: ``curl`` the printed URL and look for
``loopguard_decisions_total``. In your agent, only the four lines marked "setup" are needed;
add your exporter's span processor to the same provider as usual. A port already in use ends
the example with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer

from otel_loopguard import LoopGuard, LoopGuardSpanProcessor


def looping_agent(tracer: Tracer, calls: int = 6) -> None:
    """An agent run that greps for the same thing ``calls`` times, learning nothing."""
    with tracer.start_as_current_span(
        "invoke_agent researcher",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "researcher"},
    ):
        for _ in range(calls):
            with tracer.start_as_current_span(
                "execute_tool search",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search",
                    "gen_ai.tool.call.arguments": json.dumps({"query": "TODO", "path": "src"}),
                    "gen_ai.tool.call.result": "no match",
                },
            ):
                pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=9464, help="metrics port (0: any free one)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: a port is 0 to 65535")  # one line, exit 2

    guard = LoopGuard()  # setup: the "default" preset
    try:
        server = guard.serve_metrics(args.port)  # setup: before any call is counted
    except OSError as exc:
        reason = exc.strerror or str(exc)
        print(f"cannot serve metrics on 127.0.0.1:{args.port}: {reason}", file=sys.stderr)
        return 2
    provider = TracerProvider()  # setup: or the provider you have
    provider.add_span_processor(LoopGuardSpanProcessor(guard))  # setup

    looping_agent(provider.get_tracer("example-agent"))
    stopped = threading.Event()
    # Before the URL is printed: a caller that reads it may send SIGTERM at once.
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    print(f"metrics: {server.url}", flush=True)
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        provider.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
