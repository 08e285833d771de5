"""The Grafana dashboard and the alert rules: generated, importable, provisionable, tested."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from otel_loopguard.metrics import METRICS, MetricKind

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
        "dashboards/loopguard.json is stale: run python dashboards/generate.py")
    assert generator.main(["--check"]) == 0


def test_dashboard_imports_and_provisions_as_is() -> None:
    dashboard = json.loads(COMMITTED.read_text())
    # Import: Grafana asks for the data source named by __inputs and substitutes it.
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    # File provisioning: no import step, so the same name must resolve as a variable.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("agent", "tool"):
        assert variables[name]["type"] == "query"
        assert variables[name]["includeAll"] and variables[name]["multi"]
        assert variables[name]["datasource"]["uid"] == "${DS_PROMETHEUS}"
    assert dashboard["id"] is None and dashboard["uid"] == "otel-loopguard"
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs) and all(refs)
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]


def test_dashboard_has_the_panels_the_issue_asks_for() -> None:
    titles = {p["title"] for p in json.loads(COMMITTED.read_text())["panels"]}
    assert {"Loops over time by rule and action", "Top looping agents", "Top looping tools",
            "Repeated calls by tool", "Wasted seconds by tool", "Share of calls that are repeats",
            "Rescues by outcome", "Tracked sessions and evictions", "Internal errors"} <= titles


def test_panels_do_not_overlap_and_ids_are_unique() -> None:
    panels = json.loads(COMMITTED.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24
        area = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not area & cells, panel["title"]
        cells |= area


def test_every_query_reads_declared_metrics_and_filters_by_agent_and_tool() -> None:
    dashboard = json.loads(COMMITTED.read_text())
    declared = declared_series()
    labelled = {spec.prometheus_name for spec in METRICS if "agent" in spec.labels}
    for title, ref, expr in dashboard_queries(dashboard):
        used = set(re.findall(r"\bloopguard_[a-z_]+", expr))
        assert used and used <= declared, (title, ref, used - declared)
        for name in used & labelled:
            assert re.search(name + r'\{agent=~"\$agent", tool=~"\$tool"', expr), (title, name)
    for variable in dashboard["templating"]["list"][1:]:
        assert set(re.findall(r"\bloopguard_[a-z_]+", variable["definition"])) <= declared


def test_alert_rules_read_declared_metrics() -> None:
    used = set(re.findall(r"\bloopguard_[a-z_]+", ALERTS.read_text()))
    assert used and used <= declared_series()


@pytest.mark.parametrize("command", [["check", "rules", "alerts.yml"],
                                     ["test", "rules", "alerts_test.yml"]])
def test_promtool_checks_the_alert_rules(command: list[str]) -> None:
    promtool = require_tool("promtool")
    result = subprocess.run([promtool, *command], cwd=DASHBOARDS, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
