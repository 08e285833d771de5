"""End to end: a looping agent's spans, our /metrics, a real Prometheus, every dashboard query.

The scenario runs through a real TracerProvider with the span processor attached, against a
guard with the Prometheus recorder serving on loopback. A real Prometheus (Debian's package,
installed by ``.ci/run``) scrapes it every second; every query of the dashboard, with Grafana's
variables substituted, must be accepted by its HTTP API, and the panels that should show the
scenario must return data. In CI a missing ``prometheus`` fails the test; elsewhere it skips.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.parser import text_string_to_metric_families

from otel_loopguard import PRESETS, LoopGuard, LoopGuardSpanProcessor
from otel_loopguard._demo import DEMO_AGENT
from otel_loopguard.metrics import PrometheusRecorder

from .prometheus_tools import DASHBOARDS, dashboard_queries, load_generator, require_tool

SCRAPE_INTERVAL = "1s"
#: What Grafana would put for the variables at this scrape interval and a short time range.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "5m", "$agent": ".*", "$tool": ".*"}
WAIT_SECONDS = 60.0
CALL_SECONDS = 1.5
#: A small store, so the scenario's extra traces evict sessions.
MAX_SESSIONS = 3
#: The loop: the same call this many times in one agent run.
LOOP_CALLS = 12
#: Panels that read nothing the scenario does (zeros are expected there).
QUIET_PANELS = {"Internal errors (/min)"}


@dataclass
class PrometheusServer:
    url: str
    process: subprocess.Popen[bytes]

    def get(self, path: str, **params: str) -> dict[str, Any]:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                return dict(json.load(response))
        except urllib.error.HTTPError as error:  # 400/422 carry the reason as JSON
            return dict(json.load(error))

    def query(self, expr: str) -> dict[str, Any]:
        return self.get("/api/v1/query", query=expr)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(what: str, check: Callable[[], bool], timeout: float = WAIT_SECONDS) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def values(result: dict[str, Any]) -> list[float]:
    assert result["status"] == "success", result
    data = result["data"]
    if data["resultType"] == "scalar":
        return [float(data["result"][1])]
    return [float(item["value"][1]) for item in data["result"]]


def substitute(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace("${" + variable[1:] + "}", value).replace(variable, value)
    assert "$" not in expr, expr
    return expr


@pytest.fixture
def target() -> Iterator[tuple[LoopGuard, PrometheusRecorder, str]]:
    recorder = PrometheusRecorder()
    # The rescue preset never stops by itself: stop after six refusals, so every panel (stopped
    # runs too) has something to show.
    policy = PRESETS["rescue"].replace(
        remind_thresholds=(2,), stall_threshold=10, max_sessions=MAX_SESSIONS, stop_after_denials=6
    )
    guard = LoopGuard(policy, recorder=recorder, advisor=lambda request: "read the error first")
    server = guard.serve_metrics(0)
    try:
        yield guard, recorder, f"{server.host}:{server.port}"
    finally:
        server.close()
        guard.close()


@contextlib.contextmanager
def running_prometheus(tmp_path: Path, address: str) -> Iterator[PrometheusServer]:
    """A real Prometheus scraping ``address`` every SCRAPE_INTERVAL, with the alert rules."""
    binary = require_tool("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {  # JSON is YAML
                "global": {
                    "scrape_interval": SCRAPE_INTERVAL,
                    "evaluation_interval": SCRAPE_INTERVAL,
                },
                "rule_files": [str(DASHBOARDS / "alerts.yml")],
                "scrape_configs": [
                    {
                        "job_name": "loopguard",
                        "scrape_interval": SCRAPE_INTERVAL,
                        "static_configs": [{"targets": [address]}],
                    }
                ],
            }
        )
    )
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            # as the compose stack runs it: the exemplars (trace ids) of what we count are kept
            "--enable-feature=exemplar-storage",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    server = PrometheusServer(f"http://127.0.0.1:{port}", process)

    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_for("prometheus to be ready", ready)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)
        log.close()


@pytest.fixture
def prometheus(
    tmp_path: Path,
    target: tuple[LoopGuard, PrometheusRecorder, str],
) -> Iterator[PrometheusServer]:
    with running_prometheus(tmp_path, target[2]) as server:
        yield server


#: The usage each model turn of the scenario reports (GenAI semantic conventions): 1,000 input
#: tokens of which 400 read from the cache, and 100 output tokens.
TURN_USAGE = {
    "gen_ai.usage.input_tokens": 1000,
    "gen_ai.usage.cache_read.input_tokens": 400,
    "gen_ai.usage.output_tokens": 100,
}
#: A model genai-prices knows, and one nobody has a price for.
PRICED_MODEL = "gpt-4o"
UNPRICED_MODEL = "in-house-7b"


class Agent:
    """Emits GenAI-semconv spans: an agent run with tool calls, each taking CALL_SECONDS, and,
    when it runs a ``model``, the model turn that asked for each call (with its usage)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("e2e-agent")
        self.trace_ids: set[str] = set()
        self.span_ids: set[str] = set()
        self.call_ids: set[str] = set()

    def turn(self, model: str) -> None:
        """A model call of ``model`` reporting :data:`TURN_USAGE`."""
        with self.tracer.start_as_current_span(
            f"chat {model}",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": model,
                **TURN_USAGE,
            },
        ):
            pass

    def run(
        self,
        agent: str,
        calls: list[tuple[str, dict[str, Any], str]],
        *,
        model: str | None = None,
        final_model: str | None = None,
    ) -> str:
        """Run the calls in one agent span, each asked for by a turn of ``model`` (if any),
        then a final turn of ``final_model`` (if any); its trace id (hex)."""
        with self.tracer.start_as_current_span(
            f"invoke_agent {agent}",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent,
                "gen_ai.conversation.id": f"conversation-{uuid.uuid4()}",
            },
        ) as run:
            self.trace_ids.add(format(run.get_span_context().trace_id, "032x"))
            for tool, arguments, result in calls:
                if model is not None:
                    self.turn(model)
                call_id = f"call_{uuid.uuid4().hex[:24]}"
                self.call_ids.add(call_id)
                started = time.time_ns()
                span = self.tracer.start_span(
                    f"execute_tool {tool}",
                    start_time=started,
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": tool,
                        "gen_ai.tool.call.id": call_id,
                        "gen_ai.tool.call.arguments": json.dumps(arguments),
                    },
                )
                self.span_ids.add(format(span.get_span_context().span_id, "016x"))
                span.set_attribute("gen_ai.tool.call.result", result)
                span.end(end_time=started + int(CALL_SECONDS * 1e9))
            if final_model is not None:
                self.turn(final_model)
        return format(run.get_span_context().trace_id, "032x")


def check_exemplars(
    prometheus: PrometheusServer,
    queries: list[tuple[str, str, str]],
    looping: str,
    trace_ids: set[str],
) -> None:
    """The exemplars-only panels' queries find the looping run's trace on its denials and its
    stop, through Prometheus's exemplar API, and no trace that is not one of the agent's."""
    for title, _, expr in queries:
        if not expr.endswith(" < 0"):
            continue
        found: dict[str, set[str]] = {}

        def exemplars_in(expr: str = expr, found: dict[str, set[str]] = found) -> bool:
            found.clear()
            result = prometheus.get(
                "/api/v1/query_exemplars",
                query=substitute(expr),
                start=str(time.time() - 600),
                end=str(time.time() + 60),
            )
            assert result["status"] == "success", result
            for series in result["data"]:
                action = series["seriesLabels"]["action"]
                for exemplar in series["exemplars"]:
                    found.setdefault(action, set()).add(exemplar["labels"]["trace_id"])
            return {"deny", "stop"} <= set(found)

        wait_for(f"the exemplars of {title!r}", exemplars_in)
        assert found["stop"] == {looping} and found["deny"] == {looping}, (found, looping)
        assert set().union(*found.values()) <= trace_ids


@pytest.mark.slow
def test_dashboard_queries_against_a_real_prometheus(
    target: tuple[LoopGuard, PrometheusRecorder, str], prometheus: PrometheusServer
) -> None:
    guard, recorder, address = target
    provider = TracerProvider()
    provider.add_span_processor(LoopGuardSpanProcessor(guard))
    agent = Agent(provider)

    def scraped(expr: str, expected: float) -> Callable[[], bool]:
        return lambda: values(prometheus.query(expr)) == [expected]

    # 1. Prometheus has scraped us once: every series created up front is recorded at zero.
    wait_for("the first scrape", scraped(f'up{{instance="{address}"}}', 1.0))
    # 2. Healthy work: distinct calls in several runs (more runs than MAX_SESSIONS: evictions),
    # each call asked for by a model turn reporting usage, each run's answer by a model nobody
    # has a price for.
    for n in range(MAX_SESSIONS + 1):
        agent.run(
            "coder",
            [
                ("grep", {"pattern": f"TODO{n}", "path": "src"}, f"{n} matches"),
                ("read_file", {"path": f"src/mod{n}.py"}, f"contents {n}"),
            ],
            model=PRICED_MODEL,
            final_model=UNPRICED_MODEL,
        )
    healthy_calls = recorder.registry.get_sample_value(
        "loopguard_tool_calls_total", {"agent": "coder", "tool": "grep"}
    )
    wait_for(
        "the healthy calls to be scraped",
        scraped('sum(loopguard_tool_calls_total{tool="grep"})', healthy_calls),
    )
    # 2b. A host that refuses what the guard stops (the hook API, as the coding-agent hooks and
    # the framework adapters call it): its looping run is stopped and the calls it keeps making
    # are refused, so the stop avoided something (an estimate; a span only reports a call that
    # already ran, so through the processor a stop avoids nothing).
    usage = {
        "model": PRICED_MODEL,
        "provider": "openai",
        "input_tokens": TURN_USAGE["gen_ai.usage.input_tokens"],
        "cache_read_tokens": TURN_USAGE["gen_ai.usage.cache_read.input_tokens"],
        "output_tokens": TURN_USAGE["gen_ai.usage.output_tokens"],
    }
    refused = 0
    for n in range(LOOP_CALLS):
        guard.model_call(usage, session="hooked-run", agent="coder")
        arguments = {"pattern": "stuck", "path": "lib"}
        decision = guard.before_tool(
            "grep", arguments, session="hooked-run", agent="coder", call_id=f"hooked-{n}"
        )
        if decision.action.value == "stop":
            refused += 1
            continue
        guard.after_tool(
            "grep",
            arguments,
            session="hooked-run",
            agent="coder",
            call_id=f"hooked-{n}",
            result="no matches",
        )
    assert refused >= 1
    # 3. The loop: one run repeats the same call, the same answer each time.
    looping = agent.run(
        "coder",
        [("grep", {"pattern": "flaky", "path": "tests"}, "no matches")] * LOOP_CALLS,
        model=PRICED_MODEL,
        # Its answer too (a series that first appears at N shows no increase() of those N:
        # the unpriced model's calls are seen from the second scrape that finds them).
        final_model=UNPRICED_MODEL,
    )
    wait_for(
        "the rescue advice to be recorded",
        lambda: (
            (
                recorder.registry.get_sample_value("loopguard_rescues_total", {"outcome": "advice"})
                or 0
            )
            >= 1
        ),
    )
    total = sum(
        s.value
        for f in text_string_to_metric_families(recorder.exposition().decode())
        if f.name == "loopguard_decisions"
        for s in f.samples
        if s.name.endswith("_total")
    )
    assert total >= LOOP_CALLS - 2
    wait_for("the loop to be scraped", scraped("sum(loopguard_decisions_total)", total))
    advice = recorder.registry.get_sample_value("loopguard_rescues_total", {"outcome": "advice"})
    wait_for(
        "the rescues to be scraped",
        scraped('sum(loopguard_rescues_total{outcome="advice"})', advice or 0.0),
    )
    # The loop's spend, and the estimate of what its stop avoided, as the recorder holds them.
    spent = {
        name: recorder.registry.get_sample_value(name, {"agent": "coder"})
        for name in (
            "loopguard_loop_cost_usd_total",
            "loopguard_loop_tokens_total",
            "loopguard_avoided_cost_usd_total",
        )
    }
    assert all(number and number > 0 for number in spent.values()), spent
    for name, number in spent.items():
        wait_for(f"{name} to be scraped", scraped(f"sum({name})", number or 0.0))

    # 4. Every dashboard query, as Grafana would send it.
    dashboard = load_generator().dashboard()
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 15
    empty = []
    for title, ref, expr in queries:
        result = prometheus.query(substitute(expr))
        assert result["status"] == "success", (title, ref, expr, result)
        numbers = [v for v in values(result) if not math.isnan(v)]
        if expr.endswith(" < 0"):
            # an exemplars-only panel ("Recent loops"): its series are empty by design
            assert numbers == [], (title, ref, numbers)
        elif title in QUIET_PANELS:
            assert numbers and set(numbers) == {0.0}, (title, ref, numbers)
        elif not numbers or max(numbers) <= 0:
            empty.append((title, ref, substitute(expr), numbers))
    assert not empty, empty

    # The exemplars: Prometheus scraped OpenMetrics and kept the looping run's trace on the
    # denials and the stop (and on the "Recent loops" table's query), never a healthy run's.
    check_exemplars(prometheus, queries, looping, agent.trace_ids)

    # The variables' queries, through the label-values API Grafana uses for them.
    for variable in dashboard["templating"]["list"][1:]:
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
        assert match, variable["query"]
        result = prometheus.get(
            f"/api/v1/label/{match[2]}/values", **{"match[]": substitute(match[1])}
        )
        assert result["status"] == "success", result
        assert set(result["data"]) == ({"coder"} if match[2] == "agent" else {"grep", "read_file"})

    # Specific figures the panels show for this scenario.
    blocked = values(
        prometheus.query(
            substitute(
                'sum(increase(loopguard_decisions_total{action=~"deny|rescue|stop"}[$__range]))'
            )
        )
    )
    assert blocked and blocked[0] > 0
    assert values(prometheus.query("sum(loopguard_sessions)")) == [float(guard.session_count)]
    assert (
        values(prometheus.query('sum(loopguard_sessions_evicted_total{reason="capacity"})'))[0] >= 2
    )
    # What the cost panels read: every model turn's tokens by kind, the priced model's cost at
    # genai-prices' gpt-4o prices ($2.50 input, $1.25 cached input, $10 output per million),
    # the unpriced model's calls, and the loop's share of the spend.
    turns = 2 * (MAX_SESSIONS + 1) + 2 * LOOP_CALLS  # the span runs' and the hooked run's
    kinds = {
        kind: values(
            prometheus.query(
                f'sum(loopguard_model_tokens_total{{model="{PRICED_MODEL}", kind="{kind}"}})'
            )
        )
        for kind in ("input", "cache_read", "output", "cache_write")
    }
    assert kinds == {
        "input": [turns * 600.0],
        "cache_read": [turns * 400.0],
        "output": [turns * 100.0],
        "cache_write": [0.0],
    }
    (computed,) = values(prometheus.query('sum(loopguard_model_cost_usd_total{source="computed"})'))
    assert computed == pytest.approx(turns * (600 * 2.5 + 400 * 1.25 + 100 * 10) / 1e6)
    assert values(prometheus.query("sum(loopguard_unpriced_model_calls_total)")) == [
        float(MAX_SESSIONS + 2)
    ]
    (share,) = values(
        prometheus.query(substitute(dict((t, e) for t, _, e in queries)["Share of spend in loops"]))
    )
    assert 0 < share < 1

    # The alert rules loaded into the real server evaluate without errors.
    rules = prometheus.get("/api/v1/rules")["data"]["groups"][0]["rules"]
    assert {rule["name"] for rule in rules} == {
        "LoopGuardLoopStorm",
        "LoopGuardAgentKeepsStopping",
        "LoopGuardLoopSpend",
        "LoopGuardInternalErrors",
    }
    wait_for(
        "the alert rules to be evaluated",
        lambda: all(
            r["health"] == "ok"
            for r in prometheus.get("/api/v1/rules")["data"]["groups"][0]["rules"]
        ),
    )

    # 5. The exposition: lint-clean, and no label carries an id or an argument.
    exposition = recorder.exposition()
    lint = subprocess.run(
        [require_tool("promtool"), "check", "metrics"],
        input=exposition,
        capture_output=True,
        timeout=60,
    )
    assert lint.returncode == 0, (lint.stdout + lint.stderr).decode()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition.decode()):
        for sample in family.samples:
            for name, value in sample.labels.items():
                labels.setdefault(name, set()).add(value)
    everything = set().union(*labels.values())
    secrets = agent.trace_ids | agent.span_ids | agent.call_ids | {"TODO0", "flaky", "src/mod0.py"}
    assert not {value for value in everything for secret in secrets if secret in value}
    assert not any(value.startswith("conversation-") for value in everything)
    assert labels["agent"] == {"coder"} and labels["tool"] == {"grep", "read_file"}
    assert labels["model"] == {PRICED_MODEL, UNPRICED_MODEL}
    provider.shutdown()


def _scrape_sum(url: str, name: str, **labels: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


@pytest.mark.slow
def test_the_readme_demo_fills_the_dashboard(tmp_path: Path) -> None:
    """docs/metrics.md, "Watch the demo fill it": run ``otel-loopguard demo --metrics-port PORT``, point
    Prometheus at it, open the dashboard. Every panel that page names must show the demo's
    first play, its first calls included (its series exist at zero before the first call and
    the story starts at the first scrape)."""
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "otel_loopguard", "demo", "--metrics-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert demo.stdout is not None
    stdout = demo.stdout

    def pump() -> None:
        for line in stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with running_prometheus(tmp_path, f"127.0.0.1:{port}") as prometheus:
            # The first play ends with the line telling how to stop the demo.
            deadline = time.monotonic() + WAIT_SECONDS
            while "Ctrl-C" not in lines.get(timeout=max(1.0, deadline - time.monotonic())):
                assert time.monotonic() < deadline, "the demo never printed its Ctrl-C line"
            calls = _scrape_sum(url, "loopguard_tool_calls_total")
            # One run stopped (its stop decisions: after the failing result, and the call after).
            stops = _scrape_sum(url, "loopguard_stopped_runs_total")
            assert calls > 0 and stops == 1
            wait_for(
                "the first play to be scraped",
                lambda: values(prometheus.query("sum(loopguard_tool_calls_total)")) == [calls],
            )
            at = str(time.time())

            def panel(expr: str) -> list[float]:
                result = prometheus.get("/api/v1/query", query=substitute(expr), time=at)
                return [v for v in values(result) if not math.isnan(v)]

            dashboard = load_generator().dashboard()
            shown: dict[str, list[float]] = {}
            for title, _ref, expr in dashboard_queries(dashboard):
                shown.setdefault(title, []).extend(panel(expr))
            # Nothing of the first play is lost to the first scrape: increase() sees every call.
            assert shown["Tool calls"] and shown["Tool calls"][0] >= calls
            assert shown["Stopped runs"] and shown["Stopped runs"][0] >= 1
            # The panels docs/metrics.md lists, filled by the demo (it has no advisor, evicts no
            # session and raises nothing: those panels show zeros).
            for title in (
                "Repeat share",
                "Blocked calls",
                "Wasted time",
                "Tracked sessions",
                "Loops over time by rule and action (/min)",
                "Share of calls that are repeats (%)",
                "Top looping agents",
                "Top looping tools",
                "Repeated calls by tool (/min)",
                "Wasted seconds by tool (s/min)",
                "Repeat count at decisions",
                "Duration of repeated calls (s)",
                "Tracked sessions, and evictions (/min)",
            ):
                assert shown[title] and max(shown[title]) > 0, (title, shown[title])
            for title in ("Rescues by outcome (/min)", "Internal errors (/min)"):
                assert shown[title] and set(shown[title]) == {0.0}, (title, shown[title])
            # Whole repeat counts: the default preset reminds first at 3, never "2.5".
            counts = shown["Repeat count at decisions"]
            assert all(count == int(count) for count in counts), counts
            queries = {title: expr for title, _ref, expr in dashboard_queries(dashboard)}
            agents = prometheus.get(
                "/api/v1/query", query=substitute(queries["Top looping agents"]), time=at
            )["data"]["result"]
            assert [agent["metric"]["agent"] for agent in agents] == [DEMO_AGENT]
    finally:
        demo.terminate()
        demo.wait(timeout=30)


@pytest.mark.slow
def test_serve_exemplars_reach_a_real_prometheus(tmp_path: Path) -> None:
    """A real ``serve`` receives a looping run's spans through the real OTLP/HTTP exporter and is
    scraped by a real Prometheus (OpenMetrics, exemplar storage): the exemplars of its stop and
    denials name the looping trace; its decision log lines carry the same trace; a scrape that
    does not ask for OpenMetrics gets the text format."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from .service_tools import ServeProcess, request, require_serve_prerequisites

    require_serve_prerequisites()
    serve = ServeProcess("--hold-seconds", "0.2", "--log-format", "json")
    try:
        with running_prometheus(tmp_path, f"127.0.0.1:{serve.port}") as prometheus:
            wait_for(
                "the first scrape of serve",
                lambda: (
                    values(prometheus.query(f'up{{instance="127.0.0.1:{serve.port}"}}')) == [1.0]
                ),
            )
            provider = TracerProvider()
            provider.add_span_processor(
                SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{serve.url}/v1/traces"))
            )
            agent = Agent(provider)
            agent.run("coder", [("read_file", {"path": f"src/{n}.py"}, f"{n}") for n in range(3)])
            looping = agent.run(
                "coder", [("grep", {"pattern": "flaky", "path": "tests"}, "no matches")] * 9
            )
            provider.shutdown()

            found: dict[str, set[str]] = {}

            def exemplars() -> bool:
                found.clear()
                for expr in (
                    'loopguard_decisions_total{action=~"deny|stop"}',
                    "loopguard_stopped_runs_total",
                ):
                    result = prometheus.get(
                        "/api/v1/query_exemplars",
                        query=expr,
                        start=str(time.time() - 600),
                        end=str(time.time() + 60),
                    )
                    assert result["status"] == "success", result
                    for series in result["data"]:
                        labels = series["seriesLabels"]
                        what = labels.get("action", labels["__name__"])
                        for exemplar in series["exemplars"]:
                            found.setdefault(what, set()).add(exemplar["labels"]["trace_id"])
                return {"deny", "stop", "loopguard_stopped_runs_total"} <= set(found)

            wait_for("serve's exemplars in Prometheus", exemplars)
            assert found == {
                "deny": {looping},
                "stop": {looping},
                "loopguard_stopped_runs_total": {looping},
            }, (found, looping)

            plain = request(serve.port, "GET", "/metrics")
            assert plain.status == 200
            assert plain.headers["content-type"].startswith("text/plain")
            assert b"# EOF" not in plain.body and looping.encode() not in plain.body
            assert any(
                f.name == "loopguard_stopped_runs"
                for f in text_string_to_metric_families(plain.body.decode())
            )
            rich = request(
                serve.port, "GET", "/metrics", headers={"Accept": "application/openmetrics-text"}
            )
            assert rich.headers["content-type"].startswith("application/openmetrics-text")
            assert rich.body.endswith(b"# EOF\n") and f'trace_id="{looping}"'.encode() in rich.body
    finally:
        assert serve.stop() == 0
        serve.close()
    decisions = [
        json.loads(line)
        for line in serve.lines
        if line.startswith("{") and json.loads(line).get("source") == "span"
    ]
    blocking = [line for line in decisions if line.get("action") in ("deny", "stop")]
    assert blocking, serve.lines
    assert {line["trace_id"] for line in blocking} == {looping}
    assert all(line["span_id"] in agent.span_ids for line in blocking)
