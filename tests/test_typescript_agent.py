"""A TypeScript agent through a real ``serve``: the Vercel AI SDK (``ai`` from npm, its mock
language model, ``experimental_telemetry``) loops on one tool in Node, and the OpenTelemetry
Node SDK exports its spans over OTLP/HTTP to ``otel-loopguard serve`` in a subprocess. Its
``ai.toolCall`` spans (the ``vercel_ai`` convention) are the calls, the enclosing
``ai.generateText`` / ``ai.streamText`` span the agent; serve's decisions show in its metrics.

The npm project is ``tests/typescript`` (exact versions in package.json, the lock file
committed); ``npm ci`` installs it into a temporary directory. Node and npm come from
``.ci/install``; without them the tests skip, and fail in CI (``CI`` set)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_loopguard import PRESETS, Action, LoopGuard

from .service_tools import ServeProcess, request, require_serve_prerequisites, wait_for

PROJECT = Path(__file__).resolve().parent / "typescript"
#: What the agent's telemetry names the function (its ai.telemetry.functionId): the agent label.
AGENT = "weather-agent"
TOOL = "search"
ARGUMENTS = {"query": "weather in Paris"}
RESULT = "results for 'weather in Paris': nothing useful"
FAILURE = "search backend unavailable"
#: Calls of the looping agent: past the default preset's stop.
CALLS = 8

pytestmark = pytest.mark.slow


def _require(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        reason = f"{program} is not installed (bash .ci/install installs Node and npm)"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def agent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The npm project installed from its lock file (``npm ci``) in a temporary directory."""
    node, npm = _require("node"), _require("npm")
    assert node and npm
    require_serve_prerequisites()
    directory = tmp_path_factory.mktemp("typescript-agent")
    for name in ("package.json", "package-lock.json", "agent.mjs"):
        shutil.copy(PROJECT / name, directory / name)
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
        cwd=directory,
        check=True,
        timeout=600,
        capture_output=True,
    )
    return directory


#: The OpenTelemetry Node SDK's OTLP/HTTP exporter always streams its body (chunked transfer
#: encoding, no Content-Length: otlp-exporter-base's http transport pipes it); serve reads it.
PROTOCOLS = ["http", "grpc"]


@pytest.fixture
def serve() -> Iterator[ServeProcess]:
    server = ServeProcess(grpc=True)
    try:
        yield server
    finally:
        server.close()


def run_agent(
    directory: Path, serve: ServeProcess, mode: str, protocol: str, calls: int = CALLS
) -> dict[str, object]:
    """The agent once (``mode``: generate, stream or fail; ``protocol``: http or grpc); what it
    printed."""
    url = f"{serve.url}/v1/traces" if protocol == "http" else f"http://127.0.0.1:{serve.grpc_port}"
    done = subprocess.run(
        ["node", "agent.mjs", url, str(calls), mode, protocol],
        cwd=directory,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    printed: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return printed


def samples(serve: ServeProcess, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of metric ``name`` on serve's /metrics, by their sorted labels."""
    text = request(serve.port, "GET", "/metrics").body.decode()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def calls_counted(serve: ServeProcess) -> float:
    return sum(
        value
        for labels, value in samples(serve, "loopguard_tool_calls_total").items()
        if ("tool", TOOL) in labels
    )


def expected_decisions(calls: int, failing: bool = False) -> dict[str, int]:
    """(action -> how many) the default preset decides for ``calls`` identical calls seen only
    after they ran (spans: nothing stops them), through the plain hook API."""
    guard = LoopGuard(PRESETS["default"])
    actions: dict[str, int] = {}
    for n in range(calls):
        decision = guard.after_tool(
            TOOL,
            ARGUMENTS,
            session="reference",
            call_id=f"call-{n + 1}",
            error=failing,
            result=FAILURE if failing else RESULT,
        )
        if decision is not None and decision.action is not Action.ALLOW:
            actions[decision.action.value] = actions.get(decision.action.value, 0) + 1
    return actions


def decisions_shown(serve: ServeProcess) -> dict[str, int]:
    shown: dict[str, int] = {}
    for labels, value in samples(serve, "loopguard_decisions_total").items():
        row = dict(labels)
        if row.get("tool") == TOOL and value:
            assert row["agent"] == AGENT, row
            shown[row["action"]] = shown.get(row["action"], 0) + int(value)
    return shown


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mode", ["generate", "stream"])
def test_a_looping_typescript_agent_is_caught_by_serve(
    agent_dir: Path, serve: ServeProcess, mode: str, protocol: str
) -> None:
    printed = run_agent(agent_dir, serve, mode, protocol)
    # the agent ran its loop to the end (nothing enforces from spans alone)
    assert printed["runs"] == CALLS and printed["steps"] == CALLS + 1
    assert wait_for(lambda: calls_counted(serve) == CALLS, 30), samples(
        serve, "loopguard_tool_calls_total"
    )
    expected = expected_decisions(CALLS)
    assert {"remind", "deny", "stop"} <= set(expected)
    assert wait_for(lambda: decisions_shown(serve) == expected, 10), decisions_shown(serve)
    stopped = samples(serve, "loopguard_stopped_runs_total")
    assert sum(stopped.values()) == 1 and (("agent", AGENT) in next(iter(stopped)))


def test_a_typescript_tool_failing_the_same_way_is_stopped(
    agent_dir: Path, serve: ServeProcess
) -> None:
    # the tool throws: the AI SDK marks its ai.toolCall span failed (status, exception event)
    calls = 4
    printed = run_agent(agent_dir, serve, "fail", "grpc", calls)
    assert printed["runs"] == calls
    assert wait_for(lambda: calls_counted(serve) == calls, 30)
    expected = expected_decisions(calls, failing=True)
    assert "stop" in expected
    assert wait_for(lambda: decisions_shown(serve) == expected, 10), decisions_shown(serve)
