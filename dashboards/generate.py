"""Generate ``dashboards/loopguard.json``, the otel-loopguard Grafana dashboard.

    python dashboards/generate.py           # rewrite loopguard.json
    python dashboards/generate.py --check   # exit 1 if loopguard.json is not what this generates

Plain Python (no dashboard SDK): the classic JSON model, which Grafana 10 and 11 both read. The
dashboard imports as is (``__inputs`` asks for a Prometheus data source, ``DS_PROMETHEUS``) and
provisions from a file as is (a data-source variable of the same name). Metric names come from
``otel_loopguard.metrics`` (their one declaration); ``tests/test_dashboards.py`` checks that the
committed JSON is this script's output, and ``tests/test_prometheus_e2e.py`` runs every query
against a real Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from otel_loopguard.metrics import (
    DECISION_REPEATS,
    DECISIONS,
    INTERNAL_ERRORS,
    REPEATED_CALL_SECONDS,
    REPEATED_CALLS,
    RESCUES,
    SESSIONS,
    SESSIONS_EVICTED,
    TOOL_CALLS,
    WASTED_SECONDS,
)

OUTPUT = Path(__file__).resolve().parent / "loopguard.json"
UID = "otel-loopguard"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
#: The agent and tool filter every per-call series takes (histograms have neither label).
FILTER = '{agent=~"$agent", tool=~"$tool"}'
BLOCKING = 'action=~"deny|rescue|stop"'

CALLS = TOOL_CALLS.prometheus_name
REPEATS = REPEATED_CALLS.prometheus_name
DECIDED = DECISIONS.prometheus_name
WASTED = WASTED_SECONDS.prometheus_name


def _filtered(extra: str = "") -> str:
    return FILTER[:-1] + (f", {extra}" if extra else "") + "}"


def target(expr: str, legend: str = "", *, instant: bool = False) -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend or "__auto",
            "range": not instant, "instant": instant, "refId": ""}


def panel(kind: str, title: str, description: str, targets: list[dict[str, Any]],
          grid: tuple[int, int, int, int], *, unit: str = "short",
          options: dict[str, Any] | None = None, custom: dict[str, Any] | None = None,
          decimals: int | None = None) -> dict[str, Any]:
    x, y, w, h = grid
    for index, item in enumerate(targets):
        item["refId"] = chr(ord("A") + index)
    defaults: dict[str, Any] = {"unit": unit, "color": {"mode": "palette-classic"}}
    if custom is not None:
        defaults["custom"] = custom
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options or {},
    }


_LINES = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
          "spanNulls": False}
_STACKED = {**_LINES, "stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 40}
_LEGEND = {"legend": {"displayMode": "table", "placement": "right", "showLegend": True,
                      "calcs": ["sum"]}, "tooltip": {"mode": "multi", "sort": "desc"}}
_STAT = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
         "colorMode": "value", "graphMode": "none", "textMode": "value", "justifyMode": "auto"}
_BARS = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
         "orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True}


def panels() -> list[dict[str, Any]]:
    """Every panel, top to bottom; each query reads series of the metrics' one declaration."""
    blocked = _filtered(BLOCKING)
    stops = _filtered('action="stop"')
    stats = [
        panel("stat", "Tool calls", "Tracked tool-call attempts in the time range.",
              [target(f"sum(increase({CALLS}{FILTER}[$__range]))", instant=True)],
              (0, 0, 4, 4), decimals=0),
        panel("stat", "Repeat share", "Share of the calls in the time range whose arguments"
              " had already been seen in the progress epoch.",
              [target(f"sum(increase({REPEATS}{FILTER}[$__range]))"
                      f" / sum(increase({CALLS}{FILTER}[$__range]))", instant=True)],
              (4, 0, 4, 4), unit="percentunit"),
        panel("stat", "Blocked calls", "Calls denied, rescued or stopped in the time range"
              " (as detected: in observe or advise mode they still ran).",
              [target(f"sum(increase({DECIDED}{blocked}[$__range]))", instant=True)],
              (8, 0, 4, 4), decimals=0),
        panel("stat", "Stops", "Stop decisions in the time range: runs that should have ended.",
              [target(f"sum(increase({DECIDED}{stops}[$__range]))", instant=True)],
              (12, 0, 4, 4), decimals=0),
        panel("stat", "Wasted time", "Seconds spent running repeated calls in the time range.",
              [target(f"sum(increase({WASTED}{FILTER}[$__range]))", instant=True)],
              (16, 0, 4, 4), unit="s"),
        panel("stat", "Tracked sessions", "Sessions the guards hold now.",
              [target(f"sum({SESSIONS.prometheus_name})", instant=True)], (20, 0, 4, 4),
              decimals=0),
    ]
    return stats + [
        panel("timeseries", "Loops over time by rule and action",
              "Non-allow decisions per minute, by the rule that fired and the action detected.",
              [target(f"sum by (rule, action) (rate({DECIDED}{FILTER}[$__rate_interval])) * 60",
                      "{{rule}} / {{action}}")],
              (0, 4, 12, 8), unit="short", custom=_STACKED, options=_LEGEND),
        panel("timeseries", "Share of calls that are repeats",
              "Repeated calls / tracked calls. A healthy agent re-reads a little; a looping one"
              " climbs towards 1.",
              [target(f"sum(rate({REPEATS}{FILTER}[$__rate_interval]))"
                      f" / sum(rate({CALLS}{FILTER}[$__rate_interval]))", "repeat share")],
              (12, 4, 12, 8), unit="percentunit", custom=_LINES),
        panel("bargauge", "Top looping agents", "Agents by decisions other than allow in the"
              " time range (agent \"none\": calls reported without an agent); only those that"
              " looped.",
              [target(f"topk(10, sum by (agent) (increase({DECIDED}{FILTER}[$__range])) > 0)",
                      "{{agent}}", instant=True)],
              (0, 12, 12, 8), options=_BARS, decimals=0),
        panel("bargauge", "Top looping tools", "Tools by decisions other than allow in the time"
              " range.",
              [target(f"topk(10, sum by (tool) (increase({DECIDED}{FILTER}[$__range])) > 0)",
                      "{{tool}}", instant=True)],
              (12, 12, 12, 8), options=_BARS, decimals=0),
        panel("timeseries", "Repeated calls by tool",
              "Calls per minute whose arguments were already seen in the progress epoch.",
              [target(f"sum by (tool) (rate({REPEATS}{FILTER}[$__rate_interval])) * 60",
                      "{{tool}}")],
              (0, 20, 12, 8), custom=_LINES, options=_LEGEND),
        panel("timeseries", "Wasted seconds by tool",
              "Seconds per minute spent running repeated calls.",
              [target(f"sum by (tool) (rate({WASTED}{FILTER}[$__rate_interval])) * 60",
                      "{{tool}}")],
              (12, 20, 12, 8), unit="s", custom=_LINES, options=_LEGEND),
        panel("timeseries", "Repeat count at decisions",
              "How many times a call had been made when the guard reminded, denied or stopped"
              " (median and 90th percentile, all agents and tools).",
              [target("histogram_quantile(0.5, sum by (le, action)"
                      f" (rate({DECISION_REPEATS.name}_bucket[$__rate_interval])))",
                      "p50 {{action}}"),
               target("histogram_quantile(0.9, sum by (le, action)"
                      f" (rate({DECISION_REPEATS.name}_bucket[$__rate_interval])))",
                      "p90 {{action}}")],
              (0, 28, 12, 8), custom=_LINES),
        panel("timeseries", "Duration of repeated calls",
              "How long each repeated call ran (median and 90th percentile, all agents and"
              " tools).",
              [target("histogram_quantile(0.5, sum by (le)"
                      f" (rate({REPEATED_CALL_SECONDS.name}_bucket[$__rate_interval])))", "p50"),
               target("histogram_quantile(0.9, sum by (le)"
                      f" (rate({REPEATED_CALL_SECONDS.name}_bucket[$__rate_interval])))", "p90")],
              (12, 28, 12, 8), unit="s", custom=_LINES),
        panel("timeseries", "Rescues by outcome",
              "Rescues per minute: advice bought, cached advice reused, failed asks, and asks"
              " refused by the budget or the cooldown.",
              [target(f"sum by (outcome) (rate({RESCUES.prometheus_name}[$__rate_interval]))"
                      " * 60", "{{outcome}}")],
              (0, 36, 8, 8), custom=_STACKED),
        panel("timeseries", "Tracked sessions and evictions",
              "Sessions held now, and sessions forgotten per minute (ttl: idle too long;"
              " capacity: max_sessions reached).",
              [target(f"sum({SESSIONS.prometheus_name})", "tracked"),
               target(f"sum by (reason) (rate({SESSIONS_EVICTED.prometheus_name}"
                      "[$__rate_interval])) * 60", "evicted: {{reason}}")],
              (8, 36, 8, 8), custom=_LINES),
        panel("timeseries", "Internal errors",
              "Exceptions the guard caught per minute, by where (the call was allowed)."
              " Should stay at zero.",
              [target(f"sum by (where) (rate({INTERNAL_ERRORS.prometheus_name}"
                      "[$__rate_interval])) * 60", "{{where}}")],
              (16, 36, 8, 8), custom=_LINES),
    ]


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable", "qryType": 1},
        "refresh": 2,
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "hide": 0,
    }


def variables() -> list[dict[str, Any]]:
    return [
        {"type": "datasource", "name": "DS_PROMETHEUS", "label": "Data source",
         "query": "prometheus", "current": {}, "options": [], "regex": "", "refresh": 1,
         "hide": 0},
        _variable("agent", "Agent", f"label_values({CALLS}, agent)"),
        _variable("tool", "Tool", f'label_values({CALLS}{{agent=~"$agent"}}, tool)'),
    ]


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    items = panels()
    for number, item in enumerate(items, start=1):
        item["id"] = number
    kinds = sorted({item["type"] for item in items})
    names = {"bargauge": "Bar gauge", "stat": "Stat", "timeseries": "Time series"}
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "description": "",
                      "type": "datasource", "pluginId": "prometheus",
                      "pluginName": "Prometheus"}],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            *({"type": "panel", "id": kind, "name": names[kind], "version": ""}
              for kind in kinds),
        ],
        "annotations": {"list": []},
        "description": "otel-loopguard: AI agents repeating tool calls, and what the guard"
                       " did about it.",
        "editable": True,
        "graphTooltip": 1,
        "id": None,
        "links": [],
        "panels": items,
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": ["otel-loopguard", "ai-agents"],
        "templating": {"list": variables()},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": "otel-loopguard",
        "uid": UID,
        "version": 1,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the committed JSON differs from the generated one")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is out of date: run python dashboards/generate.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
