"""Generate ``dashboards/loopguard.json``, the otel-loopguard Grafana dashboard.

    python dashboards/generate.py           # rewrite loopguard.json
    python dashboards/generate.py --check   # exit 1 if loopguard.json is not what this generates

Built with Grafana's own ``grafana-foundation-sdk`` (types generated from Grafana's schema),
pinned to its Grafana 11.6 release, :data:`SDK_VERSION` (``pip install -e '.[test]'`` installs
it; it is a dev tool, never a dependency of the package). The JSON targets Grafana
:data:`GRAFANA_VERSION` or later (schemaVersion 41).

Data source, both ways Grafana loads a dashboard:

- **UI import** (Dashboards > New > Import): ``__inputs`` asks for a Prometheus data source
  (``DS_PROMETHEUS``) and Grafana writes its uid wherever ``${DS_PROMETHEUS}`` appears: only in
  the default value of the ``datasource`` variable.
- **File provisioning**: nothing is substituted; the ``datasource`` variable (type datasource,
  Prometheus) falls back to a Prometheus data source of the instance.

Every panel and query reads ``${datasource}``, so switching the variable works after either.
Metric names come from ``otel_loopguard.metrics`` (their one declaration);
``tests/test_dashboards.py`` checks that the committed JSON is this script's output and that it
loads into the SDK's models unchanged, and ``tests/test_prometheus_e2e.py`` runs every query
against a real Prometheus after the demo the README describes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from otel_loopguard.metrics import (
    AVOIDED_COST,
    DECISION_REPEATS,
    DECISIONS,
    INTERNAL_ERRORS,
    LOOP_COST,
    LOOP_TOKENS,
    MODEL_COST,
    MODEL_TOKENS,
    REPEATED_CALL_SECONDS,
    REPEATED_CALLS,
    RESCUES,
    SESSIONS,
    SESSIONS_EVICTED,
    STOPPED_RUNS,
    TOOL_CALLS,
    UNPRICED_MODEL_CALLS,
    WASTED_SECONDS,
)

OUTPUT = Path(__file__).resolve().parent / "loopguard.json"
#: The grafana-foundation-sdk release this script is written against (pyproject's ``test`` extra).
SDK_VERSION = "1769699379!11.6.0"
#: The Grafana release that SDK release is generated from: the oldest this dashboard targets.
GRAFANA_VERSION = "11.6.0"
UID = "otel-loopguard"
#: The import input; Grafana substitutes ``${DS_PROMETHEUS}`` with the data source picked.
INPUT = "DS_PROMETHEUS"
#: The data-source variable every panel reads.
VARIABLE = "datasource"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${" + VARIABLE + "}")
#: The agent and tool filter every per-call series takes (histograms have neither label).
FILTER = '{agent=~"$agent", tool=~"$tool"}'
#: The filter of the per-agent cost series (model calls and loop spend have no tool).
AGENT_FILTER = '{agent=~"$agent"}'
BLOCKING = 'action=~"deny|rescue|stop"'

CALLS = TOOL_CALLS.prometheus_name
REPEATS = REPEATED_CALLS.prometheus_name
DECIDED = DECISIONS.prometheus_name
WASTED = WASTED_SECONDS.prometheus_name
STOPPED = STOPPED_RUNS.prometheus_name
SPENT = MODEL_COST.prometheus_name + AGENT_FILTER
LOOP_SPENT = LOOP_COST.prometheus_name + AGENT_FILTER
AVOIDED = AVOIDED_COST.prometheus_name + AGENT_FILTER
USD = "currencyUSD"


def _filtered(extra: str = "") -> str:
    return FILTER[:-1] + (f", {extra}" if extra else "") + "}"


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL query of a panel: an instant one for stat and bar panels, else a range;
    ``exemplar``: Grafana also asks Prometheus for the exemplars of the series the query reads
    (each the trace id and span id of a call counted), drawn as points linked to the trace."""

    expr: str
    legend: str = "__auto"
    instant: bool = False
    exemplar: bool = False


def _target(query: Query, ref_id: str) -> pb.Dataquery:
    target = (
        pb.Dataquery()
        .expr(query.expr)
        .legend_format(query.legend)
        .ref_id(ref_id)
        .datasource(DATASOURCE)
    )
    if query.exemplar:
        target = target.exemplar(True)
    return target.instant() if query.instant else target.range()


Builder = stat.Panel | bargauge.Panel | timeseries.Panel | table.Panel


def _common(
    panel: Builder,
    title: str,
    description: str,
    queries: list[Query],
    grid: tuple[int, int, int, int],
    unit: str,
    decimals: int | None,
) -> Builder:
    x, y, w, h = grid
    panel = (
        panel.title(title)
        .description(description)
        .datasource(DATASOURCE)
        .grid_pos(dm.GridPos(x=x, y=y, w=w, h=h))
        .unit(unit)
        .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.PALETTE_CLASSIC))
    )
    for index, query in enumerate(queries):
        panel = panel.with_target(_target(query, chr(ord("A") + index)))
    return panel.decimals(decimals) if decimals is not None else panel


def _reduce_last() -> cb.ReduceDataOptions:
    return cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def stat_panel(
    title: str,
    description: str,
    query: Query,
    grid: tuple[int, int, int, int],
    *,
    unit: str = "short",
    decimals: int | None = None,
) -> Builder:
    panel = (
        stat.Panel()
        .reduce_options(_reduce_last())
        .color_mode(cm.BigValueColorMode.VALUE)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .text_mode(cm.BigValueTextMode.VALUE)
    )
    return _common(panel, title, description, [query], grid, unit, decimals)


def bar_panel(
    title: str,
    description: str,
    query: Query,
    grid: tuple[int, int, int, int],
    *,
    unit: str = "short",
    decimals: int | None = 0,
) -> Builder:
    panel = (
        bargauge.Panel()
        .reduce_options(_reduce_last())
        .orientation(cm.VizOrientation.HORIZONTAL)
        .display_mode(cm.BarGaugeDisplayMode.GRADIENT)
        .show_unfilled(True)
    )
    return _common(panel, title, description, [query], grid, unit, decimals)


def time_panel(
    title: str,
    description: str,
    queries: list[Query],
    grid: tuple[int, int, int, int],
    *,
    unit: str = "short",
    stacked: bool = False,
    legend_table: bool = False,
    decimals: int | None = None,
) -> Builder:
    panel = (
        timeseries.Panel()
        .line_width(1)
        .fill_opacity(40 if stacked else 10)
        .show_points(cm.VisibilityMode.NEVER)
        .span_nulls(False)
        .tooltip(
            cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)
        )
    )
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))
    if legend_table:
        panel = panel.legend(
            cb.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.RIGHT)
            .show_legend(True)
            .calcs(["sum"])
        )
    return _common(panel, title, description, queries, grid, unit, decimals)


def recent_loops_panel(grid: tuple[int, int, int, int]) -> Builder:
    """The latest denials, rescues and stops, one row per call with its agent, tool, rule and
    trace id: the exemplars of ``loopguard_decisions_total`` (the query's own series are empty:
    ``< 0`` keeps none, while Prometheus returns the exemplars of every series the selector
    reads). A click on the trace id opens the trace (the data source's exemplar link)."""
    query = Query(f"{DECIDED}{_filtered(BLOCKING)} < 0", "{{action}}", exemplar=True)
    organize: dict[str, Any] = {
        "excludeByName": {"Value": True, "__name__": True, "job": True, "instance": True},
        "indexByName": {
            "Time": 0,
            "agent": 1,
            "tool": 2,
            "action": 3,
            "rule": 4,
            "trace_id": 5,
            "span_id": 6,
        },
        "renameByName": {"Time": "when"},
    }
    panel = (
        table.Panel()
        .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(dm.DataTransformerConfig(id_val="organize", options=organize))
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="sortBy", options={"sort": [{"field": "when", "desc": True}]}
            )
        )
        .with_transformation(dm.DataTransformerConfig(id_val="limit", options={"limitField": 50}))
    )
    return _common(
        panel,
        "Recent loops",
        "The latest calls denied, rescued or stopped, newest first, with the trace of each"
        " (from the exemplars of loopguard_decisions_total; Prometheus keeps them with"
        " --enable-feature=exemplar-storage and scrapes them in OpenMetrics). Click a trace"
        " id to open the looping run.",
        [query],
        grid,
        "short",
        None,
    )


def _repeat_count(quantile: str) -> str:
    """The repeat count at decisions at ``quantile``, exact: counts are whole and the
    histogram has one bucket per count (see DECISION_REPEAT_BUCKETS), so rounding the
    interpolated estimate up gives the count itself, not 2.5 for a reminder at 3."""
    return (
        f"ceil(histogram_quantile({quantile}, sum by (le, action)"
        f" (rate({DECISION_REPEATS.name}_bucket[$__rate_interval]))))"
    )


def panels() -> list[Builder]:
    """Every panel, top to bottom; each query reads series of the metrics' one declaration."""
    blocked = _filtered(BLOCKING)
    durations = REPEATED_CALL_SECONDS.name
    return [
        stat_panel(
            "Tool calls",
            "Tracked tool-call attempts in the time range.",
            Query(f"sum(increase({CALLS}{FILTER}[$__range]))", instant=True),
            (0, 0, 4, 4),
            decimals=0,
        ),
        stat_panel(
            "Repeat share",
            "Share of the calls in the time range whose arguments had"
            " already been seen in the progress epoch.",
            Query(
                f"sum(increase({REPEATS}{FILTER}[$__range]))"
                f" / sum(increase({CALLS}{FILTER}[$__range]))",
                instant=True,
            ),
            (4, 0, 4, 4),
            unit="percentunit",
        ),
        stat_panel(
            "Blocked calls",
            "Calls denied, rescued or stopped in the time range (as"
            " detected: in observe or advise mode they still ran).",
            Query(f"sum(increase({DECIDED}{blocked}[$__range]))", instant=True),
            (8, 0, 4, 4),
            decimals=0,
        ),
        stat_panel(
            "Stopped runs",
            "Runs stopped in the time range, each counted once (in observe mode every later"
            " call of a stopped run is another stop decision; this counts the run).",
            Query(f"sum(increase({STOPPED}{FILTER}[$__range]))", instant=True),
            (12, 0, 4, 4),
            decimals=0,
        ),
        stat_panel(
            "Wasted time",
            "Seconds spent running repeated calls in the time range.",
            Query(f"sum(increase({WASTED}{FILTER}[$__range]))", instant=True),
            (16, 0, 4, 4),
            unit="s",
        ),
        stat_panel(
            "Tracked sessions",
            "Sessions the guards hold now.",
            Query(f"sum({SESSIONS.prometheus_name})", instant=True),
            (20, 0, 4, 4),
            decimals=0,
        ),
        time_panel(
            "Loops over time by rule and action (/min)",
            "Non-allow decisions per minute, by the rule that fired and the action detected.",
            [
                Query(
                    f"sum by (rule, action) (rate({DECIDED}{FILTER}[$__rate_interval])) * 60",
                    "{{rule}} / {{action}}",
                    exemplar=True,
                )
            ],
            (0, 4, 12, 8),
            stacked=True,
            legend_table=True,
        ),
        time_panel(
            "Share of calls that are repeats (%)",
            "Repeated calls / tracked calls. A healthy agent re-reads a little; a looping"
            " one climbs towards 1.",
            [
                Query(
                    f"sum(rate({REPEATS}{FILTER}[$__rate_interval]))"
                    f" / sum(rate({CALLS}{FILTER}[$__rate_interval]))",
                    "repeat share",
                )
            ],
            (12, 4, 12, 8),
            unit="percentunit",
        ),
        bar_panel(
            "Top looping agents",
            "Agents by decisions other than allow in the time range"
            ' (agent "none": calls reported without an agent); only those that looped.',
            Query(
                f"topk(10, sum by (agent) (increase({DECIDED}{FILTER}[$__range])) > 0)",
                "{{agent}}",
                instant=True,
            ),
            (0, 12, 12, 8),
        ),
        bar_panel(
            "Top looping tools",
            "Tools by decisions other than allow in the time range.",
            Query(
                f"topk(10, sum by (tool) (increase({DECIDED}{FILTER}[$__range])) > 0)",
                "{{tool}}",
                instant=True,
            ),
            (12, 12, 12, 8),
        ),
        time_panel(
            "Repeated calls by tool (/min)",
            "Calls per minute whose arguments were already seen in the progress epoch.",
            [
                Query(
                    f"sum by (tool) (rate({REPEATS}{FILTER}[$__rate_interval])) * 60",
                    "{{tool}}",
                    exemplar=True,
                )
            ],
            (0, 20, 12, 8),
            legend_table=True,
        ),
        time_panel(
            "Wasted seconds by tool (s/min)",
            "Seconds per minute spent running repeated calls.",
            [Query(f"sum by (tool) (rate({WASTED}{FILTER}[$__rate_interval])) * 60", "{{tool}}")],
            (12, 20, 12, 8),
            unit="s",
            legend_table=True,
        ),
        time_panel(
            "Repeat count at decisions",
            "How many times a call had been made when the guard reminded, denied or"
            " stopped (median and 90th percentile, all agents and tools). Exact whole"
            " counts up to 20; above, the histogram's bucket bound.",
            [
                Query(_repeat_count("0.5"), "p50 {{action}}"),
                Query(_repeat_count("0.9"), "p90 {{action}}"),
            ],
            (0, 28, 12, 8),
            decimals=0,
        ),
        time_panel(
            "Duration of repeated calls (s)",
            "How long each repeated call ran: the mean (exact) and the 90th percentile"
            " (estimated within the histogram's buckets), all agents and tools.",
            [
                Query(
                    f"sum(rate({durations}_sum[$__rate_interval]))"
                    f" / sum(rate({durations}_count[$__rate_interval]))",
                    "mean",
                ),
                Query(
                    "histogram_quantile(0.9, sum by (le)"
                    f" (rate({durations}_bucket[$__rate_interval])))",
                    "p90",
                    exemplar=True,
                ),
            ],
            (12, 28, 12, 8),
            unit="s",
        ),
        time_panel(
            "Rescues by outcome (/min)",
            "Rescues per minute: advice bought, cached advice reused, failed asks, and"
            " asks refused by the budget or the cooldown.",
            [
                Query(
                    f"sum by (outcome) (rate({RESCUES.prometheus_name}[$__rate_interval])) * 60",
                    "{{outcome}}",
                )
            ],
            (0, 36, 8, 8),
            stacked=True,
        ),
        time_panel(
            "Tracked sessions, and evictions (/min)",
            "Sessions held now, and sessions forgotten per minute (ttl: idle too long;"
            " capacity: max_sessions reached).",
            [
                Query(f"sum({SESSIONS.prometheus_name})", "tracked"),
                Query(
                    f"sum by (reason) (rate({SESSIONS_EVICTED.prometheus_name}"
                    "[$__rate_interval])) * 60",
                    "evicted: {{reason}}",
                ),
            ],
            (8, 36, 8, 8),
        ),
        time_panel(
            "Internal errors (/min)",
            "Exceptions the guard caught per minute, by where (the call was allowed)."
            " Should stay at zero.",
            [
                Query(
                    f"sum by (where) (rate({INTERNAL_ERRORS.prometheus_name}"
                    "[$__rate_interval])) * 60",
                    "{{where}}",
                )
            ],
            (16, 36, 8, 8),
        ),
        time_panel(
            "Stopped runs by agent (/h)",
            "Runs stopped per hour, by agent; each point of the exemplars is one stopped run,"
            " linked to its trace.",
            [
                Query(
                    f"sum by (agent) (rate({STOPPED}{FILTER}[$__rate_interval])) * 3600",
                    "{{agent}}",
                    exemplar=True,
                )
            ],
            (0, 44, 8, 8),
        ),
        recent_loops_panel((8, 44, 16, 8)),
        *cost_panels(52),
    ]


def cost_panels(top: int) -> list[Builder]:
    """What model calls cost, and what of it went into loops, from row ``top`` down. Costs are
    the provider's figures where it reported them, else computed from the tokens at API prices;
    the avoided figure is an estimate (docs/metrics.md gives its method)."""
    tokens = MODEL_TOKENS.prometheus_name + AGENT_FILTER
    unpriced = UNPRICED_MODEL_CALLS.prometheus_name
    return [
        stat_panel(
            "Model spend",
            "US dollars of model calls in the time range: the provider's figure where it"
            " reported one, else computed from the tokens at API prices (on a subscription you"
            " pay no per-token price). Calls of a model with no price add nothing (see"
            ' "Unpriced model calls"). Filtered by agent, not by tool.',
            Query(f"sum(increase({SPENT}[$__range]))", instant=True),
            (0, top, 4, 4),
            unit=USD,
        ),
        stat_panel(
            "Spend in loops",
            "US dollars of the model turns spent in loops in the time range: turns whose first"
            " tool call repeated an earlier call of the progress epoch.",
            Query(f"sum(increase({LOOP_SPENT}[$__range]))", instant=True),
            (4, top, 4, 4),
            unit=USD,
        ),
        stat_panel(
            "Share of spend in loops",
            "Spend in loops / model spend, in the time range.",
            Query(
                f"sum(increase({LOOP_SPENT}[$__range])) / sum(increase({SPENT}[$__range]))",
                instant=True,
            ),
            (8, top, 4, 4),
            unit="percentunit",
        ),
        stat_panel(
            "Avoided by stops (estimate)",
            "An estimate of the US dollars the stops in the time range avoided: each stopped"
            " loop's mean cost per turn times the calls refused because its run was stopped.",
            Query(f"sum(increase({AVOIDED}[$__range]))", instant=True),
            (12, top, 4, 4),
            unit=USD,
        ),
        stat_panel(
            "Tokens in loops",
            "Tokens (input, cached ones included, and output) of the model turns spent in loops"
            " in the time range: the loops' size whether or not their models have a price.",
            Query(
                f"sum(increase({LOOP_TOKENS.prometheus_name}{AGENT_FILTER}[$__range]))",
                instant=True,
            ),
            (16, top, 4, 4),
        ),
        stat_panel(
            "Unpriced model calls",
            "Model calls in the time range whose model has no price: their tokens are counted,"
            " their cost is not (so the dollar panels leave them out).",
            Query(f"sum(increase({unpriced}[$__range]))", instant=True),
            (20, top, 4, 4),
            decimals=0,
        ),
        time_panel(
            "Spend, all and in loops ($/h)",
            "US dollars per hour of all model calls, of the turns spent in loops, and the"
            " estimate of what stops avoided.",
            [
                Query(f"sum(rate({SPENT}[$__rate_interval])) * 3600", "all model calls"),
                Query(f"sum(rate({LOOP_SPENT}[$__rate_interval])) * 3600", "in loops"),
                Query(
                    f"sum(rate({AVOIDED}[$__rate_interval])) * 3600", "avoided by stops (estimate)"
                ),
            ],
            (0, top + 4, 12, 8),
            unit=USD,
        ),
        bar_panel(
            "Top agents by loop cost",
            "Agents by the US dollars their model turns spent in loops in the time range;"
            " only those that spent some.",
            Query(
                f"topk(10, sum by (agent) (increase({LOOP_SPENT}[$__range])) > 0)",
                "{{agent}}",
                instant=True,
            ),
            (12, top + 4, 12, 8),
            unit=USD,
            decimals=None,
        ),
        time_panel(
            "Model tokens by kind (/min)",
            "Tokens of model calls per minute: input read neither from nor into a cache, output,"
            " cache reads and cache writes (the kinds add up to every token).",
            [Query(f"sum by (kind) (rate({tokens}[$__rate_interval])) * 60", "{{kind}}")],
            (0, top + 12, 12, 8),
            stacked=True,
        ),
        bar_panel(
            "Unpriced models",
            "Models whose calls in the time range had no price: give them one in the policy's"
            " prices, or install otel-loopguard[cost] (genai-prices).",
            Query(
                f"topk(10, sum by (model) (increase({unpriced}[$__range])) > 0)",
                "{{model}}",
                instant=True,
            ),
            (12, top + 12, 12, 8),
        ),
    ]


def _filter_variable(name: str, label: str, query: str) -> db.QueryVariable:
    return (
        db.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": f"{name}-variable", "qryType": 1})
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .allow_custom_value(False)
        .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
    )


def variables() -> list[db.DatasourceVariable | db.QueryVariable]:
    source = "${" + INPUT + "}"
    return [
        db.DatasourceVariable(VARIABLE)
        .label("Data source")
        .type("prometheus")
        .current(dm.VariableOption(selected=True, text=source, value=source)),
        _filter_variable("agent", "Agent", f"label_values({CALLS}, agent)"),
        _filter_variable("tool", "Tool", f'label_values({CALLS}{{agent=~"$agent"}}, tool)'),
    ]


def build() -> dm.Dashboard:
    """The dashboard as the SDK's model."""
    dashboard = (
        db.Dashboard("otel-loopguard")
        .uid(UID)
        .description(
            "otel-loopguard: AI agents repeating tool calls, and what the guard did about it."
        )
        .tags(["otel-loopguard", "ai-agents"])
        .editable()
        .timezone("")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .version(1)
    )
    for variable in variables():
        dashboard = dashboard.with_variable(variable)
    for number, panel in enumerate(panels(), start=1):
        dashboard = dashboard.with_panel(panel.id(number))
    return dashboard.build()


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model: the SDK's, plus what a shared dashboard carries
    for import (``__inputs``, ``__requires``), which the SDK's schema does not model."""
    model: dict[str, Any] = json.loads(json.dumps(build(), cls=JSONEncoder))
    kinds = sorted({panel["type"] for panel in model["panels"]})
    names = {"bargauge": "Bar gauge", "stat": "Stat", "table": "Table", "timeseries": "Time series"}
    shared: dict[str, Any] = {
        "__inputs": [
            {
                "name": INPUT,
                "label": "Prometheus",
                "description": "",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_VERSION},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            *({"type": "panel", "id": kind, "name": names[kind], "version": ""} for kind in kinds),
        ],
    }
    return {**shared, **model}


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the committed JSON differs from the generated one",
    )
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
