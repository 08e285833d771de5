"""Metrics: one declaration, a Prometheus recorder and an OpenTelemetry one, bounded labels."""

from __future__ import annotations

import asyncio
import gc
import io
import math
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from otel_loopguard import PRESETS, Action, Decision, LoopGuard
from otel_loopguard.metrics import (
    ACTIONS,
    DEFAULT_MAX_LABEL_VALUES,
    ERROR_PLACES,
    EVICTION_REASONS,
    MAX_LABEL_CHARS,
    METRICS,
    OTHER,
    RESCUE_OUTCOMES,
    RULES,
    STORE_OPS,
    MetricKind,
    NoopRecorder,
    OpenTelemetryRecorder,
    PrometheusRecorder,
)

from .conftest import Call, FakeClock, run
from .prometheus_tools import require_tool

DEFAULT = PRESETS["default"]


def sample(recorder: PrometheusRecorder, name: str, **labels: str) -> float:
    value = recorder.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def label_values(exposition: bytes) -> dict[str, set[str]]:
    """Every label value in an exposition, by label name."""
    values: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition.decode()):
        for s in family.samples:
            for name, value in s.labels.items():
                values.setdefault(name, set()).add(value)
    return values


def looping_guard(recorder: PrometheusRecorder, **options: Any) -> tuple[LoopGuard, list[Decision]]:
    guard = LoopGuard(DEFAULT.replace(**options) if options else DEFAULT, recorder=recorder)
    transcript = run(
        guard, [Call("grep", {"pattern": "TODO"}, result="nothing") for _ in range(12)]
    )
    return guard, transcript.decisions


def test_one_declaration_names_every_metric_of_the_design() -> None:
    assert {spec.prometheus_name for spec in METRICS} >= {
        "loopguard_tool_calls_total",
        "loopguard_repeated_calls_total",
        "loopguard_decisions_total",
        "loopguard_wasted_seconds_total",
        "loopguard_rescues_total",
        "loopguard_sessions",
        "loopguard_sessions_evicted_total",
        "loopguard_internal_errors_total",
    }
    families = {
        f.name: f
        for f in text_string_to_metric_families(PrometheusRecorder().exposition().decode())
    }
    for spec in METRICS:
        # the parser strips _total from counter family names
        family = families[spec.name]
        assert family.type == spec.kind.value
        assert family.documentation == spec.description


def test_series_exist_at_zero_before_anything_happens() -> None:
    recorder = PrometheusRecorder()
    for outcome in RESCUE_OUTCOMES:
        assert (
            recorder.registry.get_sample_value("loopguard_rescues_total", {"outcome": outcome}) == 0
        )
    for reason in EVICTION_REASONS:
        assert (
            recorder.registry.get_sample_value(
                "loopguard_sessions_evicted_total", {"reason": reason}
            )
            == 0
        )
    for where in ERROR_PLACES:
        assert (
            recorder.registry.get_sample_value("loopguard_internal_errors_total", {"where": where})
            == 0
        )
    for action in ACTIONS:
        assert (
            recorder.registry.get_sample_value(
                "loopguard_decision_repeats_count", {"action": action}
            )
            == 0
        )
    assert recorder.registry.get_sample_value("loopguard_sessions", {}) == 0


def test_first_call_of_a_tool_creates_every_rule_and_action_at_zero() -> None:
    recorder = PrometheusRecorder()
    LoopGuard(DEFAULT, recorder=recorder).before_tool("ls", {}, session="s", agent="coder")
    for rule in RULES:
        for action in ACTIONS:
            assert (
                recorder.registry.get_sample_value(
                    "loopguard_decisions_total",
                    {"agent": "coder", "tool": "ls", "rule": rule, "action": action},
                )
                == 0
            )
    assert sample(recorder, "loopguard_tool_calls_total", agent="coder", tool="ls") == 1
    assert (
        recorder.registry.get_sample_value(
            "loopguard_repeated_calls_total", {"agent": "coder", "tool": "ls"}
        )
        == 0
    )


def test_declared_tools_exist_at_zero_before_their_first_call() -> None:
    recorder = PrometheusRecorder()
    recorder.declare_tools(["ls", "grep"], agent="coder")
    recorder.declare_tools(["ls"])  # no agent: "none"
    for agent, tool in (("coder", "ls"), ("coder", "grep"), ("none", "ls")):
        labels = {"agent": agent, "tool": tool}
        for name in (
            "loopguard_tool_calls_total",
            "loopguard_repeated_calls_total",
            "loopguard_wasted_seconds_total",
        ):
            assert recorder.registry.get_sample_value(name, labels) == 0, (name, labels)
        for rule in RULES:
            for action in ACTIONS:
                assert (
                    recorder.registry.get_sample_value(
                        "loopguard_decisions_total", {**labels, "rule": rule, "action": action}
                    )
                    == 0
                )
    # The first call then counts from zero, on the same series.
    LoopGuard(DEFAULT, recorder=recorder).before_tool("ls", {}, session="s", agent="coder")
    assert sample(recorder, "loopguard_tool_calls_total", agent="coder", tool="ls") == 1
    assert label_values(recorder.exposition())["tool"] == {"ls", "grep"}


def test_declared_tools_are_bounded_and_never_raise() -> None:
    recorder = PrometheusRecorder(max_label_values=1)
    recorder.declare_tools(["a", "b", "4bf92f3577b34da6a3ce929d0e0e4736"], agent="coder")
    assert label_values(recorder.exposition())["tool"] == {"a", OTHER}
    recorder.declare_tools(None)  # type: ignore[arg-type]
    assert recorder.failures.count == 1


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 7, 12, 20])
def test_repeat_count_quantiles_are_whole_counts(count: int) -> None:
    """A count n is observed in the bucket (n-1, n]: ceil of any interpolated quantile is n."""
    spec = {spec.name: spec for spec in METRICS}["loopguard_decision_repeats"]
    bounds = (0.0, *spec.buckets)
    assert count in spec.buckets
    upper = bounds.index(float(count))
    for q in (0.01, 0.5, 0.9, 1.0):  # Prometheus' linear interpolation inside the bucket
        estimate = bounds[upper - 1] + (bounds[upper] - bounds[upper - 1]) * q
        assert math.ceil(estimate) == count


def test_counts_follow_the_guards_decisions() -> None:
    recorder = PrometheusRecorder()
    guard, decisions = looping_guard(recorder)
    assert sample(recorder, "loopguard_tool_calls_total", agent="none", tool="grep") == 12
    assert sample(recorder, "loopguard_repeated_calls_total", agent="none", tool="grep") == 11
    expected = Counter(
        (d.rule.value if d.rule else "none", d.detected.value)
        for d in decisions
        if d.detected is not Action.ALLOW
    )
    assert expected and any(action == "stop" for _, action in expected)
    for (rule, action), n in expected.items():
        assert (
            sample(
                recorder,
                "loopguard_decisions_total",
                agent="none",
                tool="grep",
                rule=rule,
                action=action,
            )
            == n
        )
    total = sum(expected.values())
    assert (
        sum(sample(recorder, "loopguard_decision_repeats_count", action=a) for a in ACTIONS)
        == total
    )
    counts = sum(d.count for d in decisions if d.detected is not Action.ALLOW)
    assert (
        sum(sample(recorder, "loopguard_decision_repeats_sum", action=a) for a in ACTIONS) == counts
    )
    assert sample(recorder, "loopguard_sessions") == guard.session_count == 1


def test_observe_mode_still_counts_what_was_detected() -> None:
    from otel_loopguard import Mode

    recorder = PrometheusRecorder()
    _, decisions = looping_guard(recorder, mode=Mode.OBSERVE)
    assert all(d.action is Action.ALLOW for d in decisions)
    assert (
        sample(
            recorder,
            "loopguard_decisions_total",
            agent="none",
            tool="grep",
            rule="no_progress",
            action="deny",
        )
        >= 1
    )


def test_wasted_seconds_counts_repeated_calls_that_ran() -> None:
    recorder = PrometheusRecorder()
    guard = LoopGuard(DEFAULT, recorder=recorder)
    for n in range(3):  # the 2nd and 3rd repeat the 1st; all run
        assert not guard.before_tool("build", {}, session="s").blocks
        guard.after_tool("build", {}, session="s", result=f"out {n}", duration_seconds=1.5)
    assert sample(recorder, "loopguard_wasted_seconds_total", agent="none", tool="build") == 3.0
    assert sample(recorder, "loopguard_repeated_call_seconds_count") == 2
    assert sample(recorder, "loopguard_repeated_call_seconds_bucket", le="2.5") == 2
    assert sample(recorder, "loopguard_repeated_call_seconds_bucket", le="1.0") == 0


def test_rescues_and_evictions_by_reason() -> None:
    recorder = PrometheusRecorder()
    clock = FakeClock()
    policy = PRESETS["rescue"].replace(max_sessions=2)
    guard = LoopGuard(policy, recorder=recorder, clock=clock, advisor=lambda request: "try X")
    for _ in range(8):
        guard.before_tool("grep", {"q": 1}, session="a")
    assert sample(recorder, "loopguard_rescues_total", outcome="advice") >= 1
    assert sample(recorder, "loopguard_rescues_total", outcome="cached") >= 1
    guard.close()
    for session in ("b", "c"):
        guard.before_tool("ls", {}, session=session)
    assert sample(recorder, "loopguard_sessions_evicted_total", reason="capacity") == 1
    clock.advance(policy.session_ttl_seconds + 5)
    guard.before_tool("ls", {}, session="d")
    assert sample(recorder, "loopguard_sessions_evicted_total", reason="ttl") == 2
    assert sample(recorder, "loopguard_sessions") == 1


def test_internal_errors_are_counted_by_place() -> None:
    recorder = PrometheusRecorder()
    guard = LoopGuard(DEFAULT, recorder=recorder)
    guard.report_internal_error("before_tool", RuntimeError("boom"))
    guard.report_internal_error("somewhere new", RuntimeError("boom"))
    assert sample(recorder, "loopguard_internal_errors_total", where="before_tool") == 1
    assert sample(recorder, "loopguard_internal_errors_total", where="somewhere new") == 1


@pytest.mark.parametrize(
    "agent, expected",
    [
        (None, "none"),
        ("coder", "coder"),
        ("4bf92f3577b34da6a3ce929d0e0e4736", OTHER),  # a trace id
        ("run-00f067aa0ba902b7", OTHER),  # a span id inside a name
        ("123e4567-e89b-12d3-a456-426614174000", OTHER),  # a UUID
        ("x" * (MAX_LABEL_CHARS + 1), OTHER),
        ("", OTHER),
    ],
)
def test_agent_labels_are_names_never_ids(agent: str | None, expected: str) -> None:
    recorder = PrometheusRecorder()
    recorder.tool_call(agent, "ls", False)
    assert sample(recorder, "loopguard_tool_calls_total", agent=expected, tool="ls") == 1


def test_label_values_are_bounded() -> None:
    recorder = PrometheusRecorder(max_label_values=2)
    for n in range(50):
        recorder.tool_call(f"agent{n}", f"tool{n}", False)
        recorder.decision(f"agent{n}", f"tool{n}", "consecutive", "deny", 4)
    values = label_values(recorder.exposition())
    assert values["agent"] == {"agent0", "agent1", OTHER}
    assert values["tool"] == {"tool0", "tool1", OTHER}
    assert sample(recorder, "loopguard_tool_calls_total", agent=OTHER, tool=OTHER) == 48
    recorder.decision("a", "t", "made-up rule", "explode", 3)
    values = label_values(recorder.exposition())
    assert values["rule"] == set(RULES) | {"none", OTHER}
    assert values["action"] == set(ACTIONS) | {OTHER}


def test_counts_are_exact_under_concurrency() -> None:
    import threading

    recorder = PrometheusRecorder(max_label_values=3)
    threads, calls = 8, 10_000

    def work(n: int) -> None:
        for i in range(calls):
            recorder.tool_call(f"agent{n % 4}", f"tool{i % 5}", i % 2 == 0)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    exposition = recorder.exposition().decode()
    total = repeated = 0.0
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if s.name == "loopguard_tool_calls_total":
                total += s.value
            elif s.name == "loopguard_repeated_calls_total":
                repeated += s.value
    assert total == threads * calls and repeated == threads * calls // 2
    assert (
        sample(recorder, "loopguard_tool_calls_total", agent=OTHER, tool=OTHER) == 2 * calls * 2 / 5
    )


def test_bad_max_label_values_fails_loudly() -> None:
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ValueError, match="max_label_values"):
            PrometheusRecorder(max_label_values=bad)  # type: ignore[arg-type]
    assert PrometheusRecorder().max_label_values == DEFAULT_MAX_LABEL_VALUES


def test_injected_registry_and_double_registration() -> None:
    registry = CollectorRegistry()
    recorder = PrometheusRecorder(registry)
    assert recorder.registry is registry
    recorder.tool_call("a", "t", True)
    assert (
        registry.get_sample_value("loopguard_repeated_calls_total", {"agent": "a", "tool": "t"})
        == 1
    )
    with pytest.raises(ValueError):
        PrometheusRecorder(registry)


def test_a_failing_recorder_never_changes_a_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = PrometheusRecorder()
    quiet = LoopGuard(DEFAULT)
    guard = LoopGuard(DEFAULT, recorder=recorder)

    def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("registry on fire")

    monkeypatch.setattr(recorder._decisions, "labels", explode)
    monkeypatch.setattr(recorder._wasted, "labels", explode)
    calls = [Call("grep", {"p": 1}, result="same") for _ in range(8)]
    assert run(guard, calls).actions == run(quiet, calls).actions
    assert guard.internal_errors == {}
    assert recorder.failures.count > 0


def test_sessions_gauge_is_read_at_collection_and_does_not_keep_the_guard() -> None:
    recorder = PrometheusRecorder()
    guard = LoopGuard(DEFAULT, recorder=recorder)
    for n in range(3):
        guard.before_tool("ls", {}, session=f"s{n}")
    assert sample(recorder, "loopguard_sessions") == 3
    del guard
    gc.collect()
    assert sample(recorder, "loopguard_sessions") == 0


def test_serve_metrics_binds_loopback_and_serves_the_registry() -> None:
    guard = LoopGuard(DEFAULT)
    assert isinstance(guard.recorder, NoopRecorder)
    server = guard.serve_metrics(0)
    try:
        assert isinstance(guard.recorder, PrometheusRecorder)
        assert server.host == "127.0.0.1" and server.port > 0
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        guard.before_tool("ls", {}, session="s", agent="coder")
        with urllib.request.urlopen(server.url, timeout=10) as response:
            body = response.read().decode()
        assert 'loopguard_tool_calls_total{agent="coder",tool="ls"} 1.0' in body
        assert "loopguard_sessions 1.0" in body
    finally:
        server.close()
    with pytest.raises(ValueError, match="port"):
        guard.serve_metrics(70000)


def test_serve_metrics_needs_a_prometheus_recorder() -> None:
    class Mine(NoopRecorder):
        pass

    with pytest.raises(ValueError, match="recorder"):
        LoopGuard(DEFAULT, recorder=Mine()).serve_metrics(0)


def test_wsgi_app() -> None:
    guard = LoopGuard(DEFAULT)
    app = guard.metrics_wsgi_app()
    guard.before_tool("ls", {}, session="s")
    status: list[str] = []
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/metrics",
        "QUERY_STRING": "",
        "wsgi.input": io.BytesIO(),
        "SERVER_NAME": "x",
        "SERVER_PORT": "80",
    }
    body = b"".join(app(environ, lambda s, headers: status.append(s)))
    assert status == ["200 OK"]
    assert b'loopguard_tool_calls_total{agent="none",tool="ls"} 1.0' in body


def test_asgi_app() -> None:
    guard = LoopGuard(DEFAULT)
    app = guard.metrics_asgi_app()
    guard.before_tool("ls", {}, session="s")
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/metrics",
        "query_string": b"",
        "headers": [],
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert b'loopguard_tool_calls_total{agent="none",tool="ls"} 1.0' in body


def test_opentelemetry_recorder_records_the_same_names() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    recorder = OpenTelemetryRecorder(provider.get_meter("otel_loopguard"), max_label_values=5)
    guard = LoopGuard(DEFAULT, recorder=recorder)
    decisions = run(guard, [Call("grep", {"p": 1}, result="same") for _ in range(8)]).decisions
    for _ in range(2):  # reported only when it ended; the second repeats the first
        guard.after_tool(
            "grep",
            {"p": 2},
            session="s",
            agent="4bf92f3577b34da6a3ce929d0e0e4736",
            result="r",
            duration_seconds=0.5,
        )
    guard.model_call({"model": "gpt-4o", "input_tokens": 100, "output_tokens": 10}, session="s")
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)
    assert set(points) == {spec.name for spec in METRICS}
    calls = {p.attributes["agent"]: p.value for p in points["loopguard_tool_calls"]}
    assert calls == {"none": 8, OTHER: 2}
    blocked = sum(
        p.value for p in points["loopguard_decisions"] if p.attributes["action"] in ("deny", "stop")
    )
    assert blocked == sum(1 for d in decisions if d.detected in (Action.DENY, Action.STOP))
    stopped = sum(p.value for p in points["loopguard_stopped_runs"])
    assert stopped == 1 and any(d.detected is Action.STOP for d in decisions)
    assert [p.value for p in points["loopguard_sessions"]] == [2]
    histogram = {spec.name: spec for spec in METRICS}["loopguard_decision_repeats"]
    assert histogram.kind is MetricKind.HISTOGRAM
    assert all(
        tuple(p.explicit_bounds) == histogram.buckets for p in points["loopguard_decision_repeats"]
    )
    assert {p.attributes["outcome"] for p in points["loopguard_rescues"]} == set(RESCUE_OUTCOMES)
    assert [p.sum for p in points["loopguard_repeated_call_seconds"]] == [0.5]
    tokens = {p.attributes["kind"]: p.value for p in points["loopguard_model_tokens"]}
    assert tokens == {"input": 100, "output": 10, "cache_read": 0, "cache_write": 0}
    provider.shutdown()


def test_opentelemetry_recorder_rejects_a_non_meter() -> None:
    with pytest.raises(ValueError, match="meter"):
        OpenTelemetryRecorder("meter")  # type: ignore[arg-type]


def test_importing_the_package_loads_no_metrics_library() -> None:
    code = (
        "import sys, otel_loopguard; otel_loopguard.LoopGuard().before_tool('ls', {}, "
        "session='s'); print(sorted(m for m in sys.modules if m.startswith("
        "('prometheus_client', 'opentelemetry'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.fixture
def promtool() -> Iterator[str]:
    yield require_tool("promtool")


def test_promtool_accepts_our_exposition(promtool: str) -> None:
    recorder = PrometheusRecorder()
    looping_guard(recorder)
    recorder.wasted("coder", "grep", 2.0)
    recorder.rescue("failed")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=recorder.exposition(), capture_output=True, timeout=60
    )
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


def stopped_runs(recorder: PrometheusRecorder, agent: str = "none", tool: str = "grep") -> float:
    return sum(
        sample(recorder, "loopguard_stopped_runs_total", agent=agent, tool=tool, rule=rule)
        for rule in RULES
    )


def stop_decisions(recorder: PrometheusRecorder, agent: str = "none", tool: str = "grep") -> float:
    return sum(
        sample(
            recorder, "loopguard_decisions_total", agent=agent, tool=tool, rule=rule, action="stop"
        )
        for rule in (*RULES, "none")
    )


def test_a_stopped_run_counts_once_however_many_calls_follow_the_stop() -> None:
    from otel_loopguard import Mode

    # Watch-only mode: every call after the stop is decided stop again (and still runs).
    recorder = PrometheusRecorder()
    guard = LoopGuard(DEFAULT.replace(mode=Mode.OBSERVE), recorder=recorder)
    loop = [Call("grep", {"pattern": "TODO"}, result="nothing") for _ in range(20)]
    decisions = run(guard, loop).decisions
    stops = sum(1 for d in decisions if d.detected is Action.STOP)
    assert stops >= 10 and stop_decisions(recorder) == stops
    assert stopped_runs(recorder) == 1
    # A run ends at a user message, at a new run, or with its session: each next stop counts.
    guard.user_message("s")
    run(guard, loop)
    assert stopped_runs(recorder) == 2
    guard.new_run("s")
    run(guard, loop)
    assert stopped_runs(recorder) == 3
    run(
        guard, [Call("grep", {"pattern": "TODO"}, result="nothing", session="t") for _ in range(20)]
    )
    assert stopped_runs(recorder) == 4
    assert (
        sample(
            recorder, "loopguard_stopped_runs_total", agent="none", tool="grep", rule="no_progress"
        )
        == 4
    )


def test_a_run_stopped_after_a_call_counts_once_with_the_stops_after_it() -> None:
    # The third identical failure stops the run after the call (a post-call stop decision); the
    # next attempt is stopped before it runs (another stop decision): one stopped run.
    recorder = PrometheusRecorder()
    guard = LoopGuard(DEFAULT, recorder=recorder)
    assert DEFAULT.failure_stop_threshold is not None
    failing = Call("run_tests", {"path": "t.py"}, result="FAILED", error=True)
    run(guard, [failing] * (DEFAULT.failure_stop_threshold + 2))
    assert stop_decisions(recorder, tool="run_tests") >= 2
    assert stopped_runs(recorder, tool="run_tests") == 1


def test_stopped_runs_exist_at_zero_from_a_tools_first_call_and_per_agent() -> None:
    recorder = PrometheusRecorder()
    guard = LoopGuard(DEFAULT, recorder=recorder)
    guard.before_tool("grep", {"q": 1}, session="s", agent="coder")
    for rule in RULES:
        assert (
            recorder.registry.get_sample_value(
                "loopguard_stopped_runs_total", {"agent": "coder", "tool": "grep", "rule": rule}
            )
            == 0
        )
    for agent in ("coder", "reviewer"):
        for _ in range(12):
            guard.before_tool("grep", {"q": 2}, session="s", agent=agent)
    assert stopped_runs(recorder, "coder") == stopped_runs(recorder, "reviewer") == 1


@pytest.mark.slow
def test_a_global_series_budget_holds_for_150_agents_by_150_tools() -> None:
    from otel_loopguard.metrics import DEFAULT_MAX_SERIES, OTHER
    from otel_loopguard.metrics.prometheus import SERIES_PER_PAIR

    recorder = PrometheusRecorder(max_label_values=200)
    for a in range(150):
        for t in range(150):
            recorder.tool_call(f"agent{a}", f"tool{t}", False)
    pair_metrics = {
        "loopguard_tool_calls",
        "loopguard_repeated_calls",
        "loopguard_wasted_seconds",
        "loopguard_decisions",
        "loopguard_stopped_runs",
    }
    series = [
        s
        for family in recorder.registry.collect()
        if family.name in pair_metrics
        for s in family.samples
        if not s.name.endswith("_created")
    ]
    assert DEFAULT_MAX_SERIES - SERIES_PER_PAIR < len(series) <= DEFAULT_MAX_SERIES
    assert len(recorder.exposition()) < 2_000_000
    calls = {
        (s.labels["agent"], s.labels["tool"]): s.value
        for s in series
        if s.name == "loopguard_tool_calls_total"
    }
    assert sum(calls.values()) == 150 * 150  # every call counted, the overflow as other
    assert calls[(OTHER, OTHER)] == 150 * 150 - (len(calls) - 1)


def test_the_series_budget_boundary() -> None:
    from otel_loopguard.metrics import OTHER
    from otel_loopguard.metrics.prometheus import SERIES_PER_PAIR

    recorder = PrometheusRecorder(max_series=3 * SERIES_PER_PAIR)  # two named pairs + overflow
    for tool in ("a", "b", "c", "d"):
        recorder.tool_call("x", tool, False)
    reg = recorder.registry
    assert reg.get_sample_value("loopguard_tool_calls_total", {"agent": "x", "tool": "b"}) == 1
    assert reg.get_sample_value("loopguard_tool_calls_total", {"agent": "x", "tool": "c"}) is None
    assert reg.get_sample_value("loopguard_tool_calls_total", {"agent": OTHER, "tool": OTHER}) == 2
    with pytest.raises(ValueError, match="max_series"):
        PrometheusRecorder(max_series=2 * SERIES_PER_PAIR - 1)


def test_store_errors_are_counted_by_operation_in_both_recorders() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    recorder = PrometheusRecorder()
    for op in STORE_OPS:
        assert sample(recorder, "loopguard_store_errors_total", op=op) == 0
    recorder.store_error("read")
    recorder.store_error("read")
    recorder.store_error("4bf92f3577b34da6a3ce929d0e0e4736")  # not a known op: other
    assert sample(recorder, "loopguard_store_errors_total", op="read") == 2
    assert sample(recorder, "loopguard_store_errors_total", op=OTHER) == 1
    NoopRecorder().store_error("read")

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    otel = OpenTelemetryRecorder(provider.get_meter("otel_loopguard"))
    otel.store_error("decode")
    data = reader.get_metrics_data()
    assert data is not None
    found: list[Any] = [
        p
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "loopguard_store_errors"
        for p in metric.data.data_points
    ]
    points = {p.attributes["op"]: p.value for p in found}
    assert points == {**{op: 0 for op in STORE_OPS}, "decode": 1}
    provider.shutdown()
