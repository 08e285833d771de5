"""Draw the dashboard's panels from a real Prometheus after a real demo run, as a page.

    python docs/pictures.py dashboard [--seconds 100]   # docs/images/dashboard.png, recorded
    python dashboards/render_picture.py [--seconds 100] # the same

Grafana is not needed (nor installed here): the picture is drawn from the same queries.

1. Runs ``python -m otel_loopguard demo --metrics-port PORT`` (the README's "To watch it fill")
   and Debian's ``prometheus`` scraping it every second, for ``seconds``.
2. Asks Prometheus for every panel query of ``generate.dashboard()``, with Grafana's variables
   filled in (``$__range``: the run; ``$__rate_interval``: :data:`RATE_INTERVAL`): stat and
   bar panels as instant queries at the end, time series as ``query_range`` over the run.
3. Returns an HTML page laid out on the dashboard's grid: numbers, bars, and inline SVG line
   charts drawn from the results (no JavaScript, no network); ``docs/pictures.py``
   screenshots it with headless chromium.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate  # noqa: E402  (the dashboard's one definition)

ROOT = Path(__file__).resolve().parents[1]
#: What Grafana would put for ``$__rate_interval`` with a 1 s scrape and this short a range.
RATE_INTERVAL = "20s"
STEP_SECONDS = 2
COLORS = (
    "#7eb26d",
    "#eab839",
    "#6ed0e0",
    "#ef843c",
    "#e24d42",
    "#1f78c1",
    "#ba43a9",
    "#705da0",
    "#508642",
    "#cca300",
)
CELL = 56  # pixels per grid column (24 columns)
ROW = 30  # pixels per grid row unit


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, path: str, **params: str) -> Any:
    with urllib.request.urlopen(
        f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=30
    ) as response:
        return json.load(response)


def _fill(expr: str, range_seconds: int) -> str:
    for name, value in (
        ("$__rate_interval", RATE_INTERVAL),
        ("$__range", f"{range_seconds}s"),
        ("$agent", ".*"),
        ("$tool", ".*"),
    ):
        expr = expr.replace(name, value)
    return expr


def _legend(template: str, metric: dict[str, str]) -> str:
    if template == "__auto":
        return ", ".join(f"{k}={v}" for k, v in metric.items()) or "value"
    return re.sub(r"\{\{(\w+)\}\}", lambda m: metric.get(m[1], ""), template)


def _number(value: float, unit: str, decimals: int | None = None) -> str:
    """As Grafana shows it: the panel's ``decimals`` when set."""
    if math.isnan(value):
        return "–"
    if unit == "percentunit":
        return f"{value * 100:.0f}%"
    if unit == "currencyUSD":
        return f"${value:.{2 if decimals is None else decimals}f}"
    if decimals is not None:
        return f"{value:.{decimals}f}" + (" s" if unit == "s" else "")
    if unit == "s":
        return f"{value:.1f} s"
    return f"{value:.0f}" if value == int(value) else f"{value:.2f}"


def _svg(
    series: list[tuple[str, list[tuple[float, float]]]],
    width: int,
    height: int,
    start: float,
    end: float,
    unit: str,
) -> str:
    points = [v for _, values in series for _, v in values if not math.isnan(v)]
    top = max(points, default=1.0) or 1.0
    top *= 1.1
    left, bottom = 44, 18
    plot_w, plot_h = width - left - 6, height - bottom - 6

    def xy(t: float, v: float) -> str:
        x = left + (t - start) / max(end - start, 1) * plot_w
        y = 6 + plot_h - v / top * plot_h
        return f"{x:.1f},{y:.1f}"

    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">']
    for i in range(5):
        value = top * i / 4
        y = 6 + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{left}" x2="{width - 6}" y1="{y:.1f}" y2="{y:.1f}" stroke="#2c3235"/>'
        )
        parts.append(
            f'<text x="{left - 4}" y="{y + 3:.1f}" text-anchor="end">'
            f"{html.escape(_number(round(value, 2), unit))}</text>"
        )
    minutes = (end - start) / 60
    parts.append(
        f'<text x="{left}" y="{height - 3}">-{minutes:.1f} min</text>'
        f'<text x="{width - 6}" y="{height - 3}" text-anchor="end">now</text>'
    )
    for index, (_, values) in enumerate(series):
        color = COLORS[index % len(COLORS)]
        runs: list[list[str]] = [[]]
        for t, v in values:
            if math.isnan(v):
                runs.append([])
            else:
                runs[-1].append(xy(t, v))
        for run in runs:
            if len(run) > 1:
                parts.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="1.6"'
                    f' points="{" ".join(run)}"/>'
                )
            elif run:
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"/>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(prometheus: str, dashboard: dict[str, Any], start: float, end: float) -> str:
    range_seconds = int(end - start)
    boxes = []
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        unit = panel["fieldConfig"]["defaults"].get("unit", "short")
        decimals = panel["fieldConfig"]["defaults"].get("decimals")
        width, height = grid["w"] * CELL - 8, grid["h"] * ROW - 8
        body = ""
        if panel["type"] in ("stat", "bargauge"):
            target = panel["targets"][0]
            result = _get(
                prometheus,
                "/api/v1/query",
                query=_fill(target["expr"], range_seconds),
                time=str(end),
            )["data"]["result"]
            if panel["type"] == "stat":
                value = float(result[0]["value"][1]) if result else math.nan
                body = f'<div class="stat">{html.escape(_number(value, unit, decimals))}</div>'
            else:
                rows = [
                    (_legend(target["legendFormat"], r["metric"]), float(r["value"][1]))
                    for r in result
                ]
                top = max((v for _, v in rows), default=1.0) or 1.0
                body = (
                    "".join(
                        f'<div class="bar"><span>{html.escape(name)}</span><div style="width:'
                        f'{v / top * (width - 190):.0f}px;background:{COLORS[i % len(COLORS)]}">'
                        f"</div><b>{_number(v, unit, decimals)}</b></div>"
                        for i, (name, v) in enumerate(rows)
                    )
                    or '<div class="none">no data</div>'
                )
        else:
            series: list[tuple[str, list[tuple[float, float]]]] = []
            for target in panel["targets"]:
                result = _get(
                    prometheus,
                    "/api/v1/query_range",
                    query=_fill(target["expr"], range_seconds),
                    start=str(start),
                    end=str(end),
                    step=str(STEP_SECONDS),
                )["data"]["result"]
                for item in result:
                    values = [(float(t), float(v)) for t, v in item["values"]]
                    if any(v for _, v in values if not math.isnan(v)):  # zero series: left out
                        series.append((_legend(target["legendFormat"], item["metric"]), values))
            legend = "" if series else '<span class="none">every series at zero</span>'
            legend += "".join(
                f'<span><i style="background:{COLORS[i % len(COLORS)]}"></i>'
                f"{html.escape(name)}</span>"
                for i, (name, _) in enumerate(series)
            )
            body = (
                _svg(series, width - 12, height - 58, start, end, unit)
                + f'<div class="legend">{legend}</div>'
            )
        boxes.append(
            f'<div class="panel" style="left:{grid["x"] * CELL}px;top:{grid["y"] * ROW}px;'
            f'width:{width}px;height:{height}px"><h3>{html.escape(panel["title"])}</h3>'
            f"{body}</div>"
        )
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"]) * ROW
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ background:#111217; color:#ccccdc; font:12px sans-serif; margin:8px; }}
header {{ font-size:15px; margin:0 0 8px 0; }} header small {{ color:#8e8e9e; }}
.grid {{ position:relative; height:{bottom}px; width:{24 * CELL}px; }}
.panel {{ position:absolute; background:#181b1f; border:1px solid #2c3235; border-radius:3px;
  padding:4px 6px; overflow:hidden; }}
h3 {{ font-size:12px; margin:0 0 4px 0; color:#d8d9da; }}
.stat {{ font-size:34px; color:#73bf69; text-align:center; margin-top:14px; }}
.bar {{ display:flex; align-items:center; margin:6px 0; }} .bar span {{ width:110px; }}
.bar div {{ height:18px; margin:0 6px; }} .none {{ color:#8e8e9e; }}
svg text {{ fill:#8e8e9e; font-size:10px; }}
.legend span {{ margin-right:10px; white-space:nowrap; }}
.legend i {{ display:inline-block; width:10px; height:3px; margin-right:3px;
  vertical-align:middle; }}
</style></head><body><header>otel-loopguard dashboard <small>— drawn from a real Prometheus
after <code>otel-loopguard demo --metrics-port</code> ran {range_seconds} s (same queries as
dashboards/loopguard.json; series at zero left out; not a Grafana screenshot)</small></header>
<div class="grid">{"".join(boxes)}</div></body></html>"""


def page_width() -> int:
    """The page's width in pixels: the dashboard's 24 grid columns and the margins."""
    return 24 * CELL + 16


def dashboard_page(seconds: int, prometheus_bin: str) -> str:
    """Run the demo with its metrics and ``prometheus_bin`` scraping them for ``seconds``;
    return the page drawn from the dashboard's queries."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        demo_port, prom_port = _free_port(), _free_port()
        (work / "prometheus.yml").write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": "loopguard",
                            "static_configs": [{"targets": [f"127.0.0.1:{demo_port}"]}],
                        }
                    ],
                }
            )
        )
        prometheus = subprocess.Popen(
            [
                prometheus_bin,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        environment = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}
        demo = subprocess.Popen(
            [sys.executable, "-m", "otel_loopguard", "demo", "--metrics-port", str(demo_port)],
            stdout=subprocess.DEVNULL,
            cwd=ROOT,
            env=environment,
        )
        url = f"http://127.0.0.1:{prom_port}"
        try:
            start = time.time()
            time.sleep(seconds)
            end = time.time()
            time.sleep(2)  # the last scrape
            return render_html(url, generate.dashboard(), start, end)
        finally:
            demo.terminate()
            prometheus.terminate()
            demo.wait(timeout=30)
            prometheus.wait(timeout=30)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "docs"))
    import pictures

    sys.exit(pictures.main(["dashboard", *sys.argv[1:]]))
