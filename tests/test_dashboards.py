"""The Grafana dashboard and the alert rules: generated, importable, provisionable, tested."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
from typing import Any

import pytest

from otel_loopguard.metrics import DECISION_REPEATS, METRICS, MetricKind

from .prometheus_tools import DASHBOARDS, dashboard_queries, load_generator, require_tool

COMMITTED = DASHBOARDS / "loopguard.json"
ALERTS = DASHBOARDS / "alerts.yml"


def declared_series() -> set[str]:
    names = set()
    for spec in METRICS:
        names.add(spec.prometheus_name)
        if spec.kind is MetricKind.HISTOGRAM:
            names.update(f"{spec.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    return names


def test_committed_dashboard_is_what_the_generator_writes() -> None:
    generator = load_generator()
    assert COMMITTED.read_text() == generator.render(), (
        "dashboards/loopguard.json is stale: run python dashboards/generate.py"
    )
    assert generator.main(["--check"]) == 0


def test_generator_uses_the_pinned_sdk() -> None:
    """The SDK release named in the generator is the one installed and the one pyproject pins."""
    generator = load_generator()
    assert importlib.metadata.version("grafana-foundation-sdk") == generator.SDK_VERSION
    assert (
        f'"grafana-foundation-sdk=={generator.SDK_VERSION}"'
        in (DASHBOARDS.parent / "pyproject.toml").read_text()
    )
    assert generator.SDK_VERSION.endswith("!" + generator.GRAFANA_VERSION)


def test_committed_dashboard_loads_into_the_sdk_models_unchanged() -> None:
    """Every key the JSON carries is a field of Grafana's schema, with its type (the SDK's
    models drop unknown keys and fail on wrong types): loading and dumping changes nothing."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    committed = json.loads(COMMITTED.read_text())
    modelled = {k: v for k, v in committed.items() if k not in ("__inputs", "__requires")}
    loaded = Dashboard.from_json(modelled)
    assert json.loads(json.dumps(loaded, cls=JSONEncoder)) == modelled
    assert committed["schemaVersion"] == 41
    requires = {r["id"]: r["version"] for r in committed["__requires"]}
    assert requires["grafana"] == load_generator().GRAFANA_VERSION
    assert set(requires) == {"grafana", "prometheus"} | {p["type"] for p in committed["panels"]}


def test_dashboard_imports_and_provisions_as_is() -> None:
    dashboard = json.loads(COMMITTED.read_text())
    source = {"type": "prometheus", "uid": "${datasource}"}
    # Import: Grafana asks for the data source named by __inputs and writes its uid wherever
    # ${DS_PROMETHEUS} appears: only as the default of the data-source variable, so the
    # variable keeps working after an import.
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    text = COMMITTED.read_text()
    assert text.count("${DS_PROMETHEUS}") == 2
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == "${DS_PROMETHEUS}"
    # File provisioning: nothing is substituted; the variable picks a Prometheus data source.
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("agent", "tool"):
        assert variables[name]["type"] == "query"
        assert variables[name]["includeAll"] and variables[name]["multi"]
        assert variables[name]["datasource"] == source
    assert "id" not in dashboard and dashboard["uid"] == "otel-loopguard"
    for panel in dashboard["panels"]:
        assert panel["datasource"] == source
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs) and all(refs)
        for target in panel["targets"]:
            assert target["datasource"] == source


def test_repeat_counts_are_shown_as_whole_counts() -> None:
    """Quantiles of whole counts are rounded up inside one-count buckets: never 2.5 for 3."""
    panels = {p["title"]: p for p in json.loads(COMMITTED.read_text())["panels"]}
    panel = panels["Repeat count at decisions"]
    assert panel["fieldConfig"]["defaults"]["decimals"] == 0
    for target in panel["targets"]:
        assert target["expr"].startswith("ceil(histogram_quantile(")
    assert set(range(1, 21)) <= set(DECISION_REPEATS.buckets)


def test_dashboard_has_the_panels_the_issue_asks_for() -> None:
    titles = {p["title"] for p in json.loads(COMMITTED.read_text())["panels"]}
    assert {
        "Loops over time by rule and action (/min)",
        "Top looping agents",
        "Top looping tools",
        "Repeated calls by tool (/min)",
        "Wasted seconds by tool (s/min)",
        "Share of calls that are repeats (%)",
        "Rescues by outcome (/min)",
        "Tracked sessions, and evictions (/min)",
        "Internal errors (/min)",
        # issue 24: what loops cost
        "Model spend",
        "Spend in loops",
        "Share of spend in loops",
        "Avoided by stops (estimate)",
        "Spend, all and in loops ($/h)",
        "Top agents by loop cost",
        "Unpriced models",
    } <= titles


def test_the_avoided_cost_is_labelled_an_estimate_wherever_it_shows() -> None:
    for panel in json.loads(COMMITTED.read_text())["panels"]:
        for target in panel["targets"]:
            if "loopguard_avoided_" in target["expr"]:
                shown = panel["title"] if len(panel["targets"]) == 1 else target["legendFormat"]
                assert "estimate" in shown, (panel["title"], target["legendFormat"])
                assert "estimate" in panel["description"], panel["title"]


def test_money_panels_are_in_dollars_and_the_loop_share_is_a_share() -> None:
    panels = {p["title"]: p for p in json.loads(COMMITTED.read_text())["panels"]}
    for panel in panels.values():
        if any("_usd_total" in target["expr"] for target in panel["targets"]):
            unit = panel["fieldConfig"]["defaults"]["unit"]
            expected = (
                "percentunit" if panel["title"] == "Share of spend in loops" else "currencyUSD"
            )
            assert unit == expected, panel["title"]
    (target,) = panels["Share of spend in loops"]["targets"]
    numerator, denominator = target["expr"].split(" / ")
    assert "loopguard_loop_cost_usd_total" in numerator
    assert "loopguard_model_cost_usd_total" in denominator


def test_rate_panels_say_their_unit_in_the_title() -> None:
    """A query that computes a rate says per what: "* 60" is per minute; a rate of seconds is
    seconds per minute; a ratio of rates is a share."""
    for panel in json.loads(COMMITTED.read_text())["panels"]:
        exprs = [target["expr"] for target in panel["targets"]]
        title = panel["title"]
        if any("[$__rate_interval])) * 60" in expr for expr in exprs):
            unit = "(s/min)" if panel["fieldConfig"]["defaults"].get("unit") == "s" else "/min)"
            assert title.endswith(unit), title
        elif any(" / sum(rate(" in expr for expr in exprs):
            assert title.endswith(("(%)", "(s)")), title


def test_panels_do_not_overlap_and_ids_are_unique() -> None:
    panels = json.loads(COMMITTED.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, panel["title"]
        cells |= area


def test_every_query_reads_declared_metrics_and_filters_by_agent_and_tool() -> None:
    dashboard = json.loads(COMMITTED.read_text())
    declared = declared_series()
    by_tool = {spec.prometheus_name for spec in METRICS if {"agent", "tool"} <= set(spec.labels)}
    by_agent = {spec.prometheus_name for spec in METRICS if "agent" in spec.labels} - by_tool
    assert "loopguard_loop_cost_usd_total" in by_agent
    for title, ref, expr in dashboard_queries(dashboard):
        used = set(re.findall(r"\bloopguard_[a-z_]+", expr))
        assert used and used <= declared, (title, ref, used - declared)
        for name in used & by_tool:
            assert re.search(name + r'\{agent=~"\$agent", tool=~"\$tool"', expr), (title, name)
        for name in used & by_agent:  # model calls have no tool: filtered by agent alone
            assert re.search(name + r'\{agent=~"\$agent"\}', expr), (title, name)
    for variable in dashboard["templating"]["list"][1:]:
        assert set(re.findall(r"\bloopguard_[a-z_]+", variable["query"]["query"])) <= declared


def test_alert_rules_read_declared_metrics() -> None:
    used = set(re.findall(r"\bloopguard_[a-z_]+", ALERTS.read_text()))
    assert used and used <= declared_series()


@pytest.mark.parametrize(
    "command", [["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]]
)
def test_promtool_checks_the_alert_rules(command: list[str]) -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, *command], cwd=DASHBOARDS, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _panel(dashboard: dict[str, object], title: str) -> dict[str, Any]:
    (panel,) = [p for p in dashboard["panels"] if p["title"] == title]  # type: ignore[attr-defined]
    return panel  # type: ignore[no-any-return]


def test_decision_stop_and_repeat_panels_ask_for_exemplars() -> None:
    """The panels a spike shows on carry the exemplars (the trace of each call counted)."""
    dashboard = json.loads(COMMITTED.read_text())
    for title, metric in (
        ("Loops over time by rule and action (/min)", "loopguard_decisions_total"),
        ("Stopped runs by agent (/h)", "loopguard_stopped_runs_total"),
        ("Repeated calls by tool (/min)", "loopguard_repeated_calls_total"),
        ("Duration of repeated calls (s)", "loopguard_repeated_call_seconds_bucket"),
    ):
        targets = [t for t in _panel(dashboard, title)["targets"] if metric in t["expr"]]
        assert targets and all(t.get("exemplar") is True for t in targets), title
    plain = _panel(dashboard, "Top looping agents")["targets"]
    assert not any(t.get("exemplar") for t in plain)  # an instant bar needs none


def test_recent_loops_lists_the_exemplars_of_blocking_decisions() -> None:
    """The table reads exemplars only: its expression keeps no series (``< 0``) while its
    selector names every denial, rescue and stop of the filtered agents and tools."""
    panel = _panel(json.loads(COMMITTED.read_text()), "Recent loops")
    assert panel["type"] == "table"
    (target,) = panel["targets"]
    assert target["exemplar"] is True
    assert target["expr"] == (
        'loopguard_decisions_total{agent=~"$agent", tool=~"$tool", action=~"deny|rescue|stop"} < 0'
    )
    organize = next(t for t in panel["transformations"] if t["id"] == "organize")
    assert {"trace_id", "span_id", "agent", "tool", "action"} <= set(
        organize["options"]["indexByName"]
    )
    sort = next(t for t in panel["transformations"] if t["id"] == "sortBy")
    assert sort["options"]["sort"] == [{"field": "when", "desc": True}]  # newest first


def test_alert_dashboard_links_open_this_dashboard_filtered() -> None:
    """Each alert's ``dashboard`` annotation names this dashboard's uid, and every variable it
    sets is one of the dashboard's filters."""
    import yaml

    dashboard = json.loads(COMMITTED.read_text())
    names = {v["name"] for v in dashboard["templating"]["list"]}
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    linked = {}
    for rule in rules:
        link = rule["annotations"].get("dashboard")
        if link is None:
            continue
        path, _, query = link.partition("?")
        assert path == f"/d/{dashboard['uid']}/otel-loopguard", link
        for pair in filter(None, query.split("&")):
            assert pair.split("=", 1)[0].removeprefix("var-") in names, link
        linked[rule["alert"]] = link
    assert "var-agent={{ $labels.agent }}" in linked["LoopGuardAgentKeepsStopping"]
    assert "var-agent={{ $labels.agent }}" in linked["LoopGuardLoopSpend"]
    assert "LoopGuardLoopStorm" in linked
