"""collector/: the Collector configs and the demo stack, checked structurally (no Collector binary
runs here): current component names, every pipeline's components defined, endpoints that match
serve's defaults, and files the compose stack mounts that exist."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

try:
    import yaml
except ImportError:  # pragma: no cover - the test extra installs it
    if os.environ.get("CI"):
        raise
    pytest.skip("PyYAML is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
COLLECTOR = ROOT / "collector"
CONFIGS = (
    "otelcol-fanout.yaml",
    "otelcol-filter.yaml",
    "otelcol-sharded.yaml",
    "otelcol-sharded-conversation.yaml",
    "otelcol-replicas-redis.yaml",
)
#: The pipelines of each config: logs (coding agents' tool events) only where one serve, or
#: any replica, may take every record (the sharded files route by trace id, which they lack).
PIPELINES = {
    "otelcol-fanout.yaml": {"traces", "logs"},
    "otelcol-filter.yaml": {"traces/backend", "traces/loopguard", "logs"},
    "otelcol-sharded.yaml": {"traces"},
    "otelcol-sharded-conversation.yaml": {"traces"},
    "otelcol-replicas-redis.yaml": {"traces"},
}
#: Configs the README's table does not name yet (its row is documentation work in progress).
NOT_IN_README: tuple[str, ...] = ()

# serve's defaults, read from the code rather than copied (imported lazily: the serve extra).
HTTP_PORT = 4318
GRPC_PORT = 4317

#: Component types these configs may use, by kind: current (snake_case) names only.
KNOWN = {
    "receivers": {"otlp"},
    "processors": {"batch", "memory_limiter", "filter"},
    "exporters": {"otlp_grpc", "otlp_http", "load_balancing", "debug", "file"},
}
#: Older names the Collector keeps as deprecated aliases: never in our files.
DEPRECATED = {"otlphttp", "loadbalancing", "spanmetrics", "logging"}


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((COLLECTOR / name).read_text())
    assert isinstance(data, dict)
    return data


def component_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def test_serve_defaults_are_the_ones_checked_here() -> None:
    from otel_loopguard.service import DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT

    assert (DEFAULT_HTTP_PORT, DEFAULT_GRPC_PORT) == (HTTP_PORT, GRPC_PORT)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_is_well_formed(name: str) -> None:
    config = load(name)
    assert set(config) <= {
        "receivers",
        "processors",
        "exporters",
        "connectors",
        "extensions",
        "service",
    }
    for kind, allowed in KNOWN.items():
        for component_id in config.get(kind) or {}:
            kind_name = component_type(component_id)
            assert kind_name not in DEPRECATED, (name, component_id)
            assert kind_name in allowed, (name, kind, component_id)
            assert re.fullmatch(r"[a-z][a-z0-9_]*(/[a-z0-9_.-]+)?", component_id), component_id
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == PIPELINES[name]
    used: set[tuple[str, str]] = set()
    for pipeline in pipelines.values():
        assert pipeline.get("receivers") and pipeline.get("exporters")
        for kind in ("receivers", "processors", "exporters"):
            for component_id in pipeline.get(kind) or []:
                assert component_id in (config.get(kind) or {}), (name, kind, component_id)
                used.add((kind, component_id))
    defined = {(kind, cid) for kind in KNOWN for cid in (config.get(kind) or {})}
    assert defined == used, f"{name}: defined but unused: {defined - used}"
    receiver = config["receivers"]["otlp"]["protocols"]
    assert receiver["grpc"]["endpoint"].endswith(f":{GRPC_PORT}")
    assert receiver["http"]["endpoint"].endswith(f":{HTTP_PORT}")


def test_fanout_sends_coding_agents_logs_to_serve_only() -> None:
    """The logs pipeline (Claude Code, Gemini CLI, Codex tool events) ends at serve's OTLP/HTTP
    exporter, whose endpoint gets ``/v1/logs`` appended: the path serve reads them on."""
    config = load("otelcol-fanout.yaml")
    logs = config["service"]["pipelines"]["logs"]
    assert logs["receivers"] == ["otlp"]
    assert logs["exporters"] == ["otlp_http/loopguard"]  # a tracing backend takes no logs
    assert "logs_endpoint" not in config["exporters"]["otlp_http/loopguard"]
    readme = (COLLECTOR / "README.md").read_text()
    section = readme.split("## Watch a team's coding agents", 1)[1].split("\n## ", 1)[0]
    for setting in (
        "CLAUDE_CODE_ENABLE_TELEMETRY=1",
        "OTEL_LOGS_EXPORTER=otlp",
        "OTEL_LOG_TOOL_DETAILS=1",
        "GEMINI_TELEMETRY_ENABLED=true",
        "GEMINI_TELEMETRY_OTLP_PROTOCOL=http",
        "[otel]",
        'endpoint = "http://loopguard.example:4318/v1/logs"',
        "loopguard.json",
    ):
        assert setting in section, setting


def test_fanout_sends_to_the_backend_and_to_serves_http_port() -> None:
    config = load("otelcol-fanout.yaml")
    exporters = config["exporters"]
    assert config["service"]["pipelines"]["traces"]["exporters"] == [
        "otlp_grpc/backend",
        "otlp_http/loopguard",
    ]
    loopguard = exporters["otlp_http/loopguard"]
    assert loopguard["endpoint"].endswith(f":{HTTP_PORT}}}")  # ${env:...:-http://loopguard:4318}
    assert loopguard["headers"]["authorization"] == "Bearer ${env:LOOPGUARD_SERVE_TOKEN}"
    assert "compression" not in loopguard or loopguard["compression"] == "gzip"


def test_filter_is_on_serves_branch_only() -> None:
    """otelcol-filter.yaml: the backend's pipeline gets every span; serve's runs the filter
    (its condition is tests/test_collector_filter.py's) before batching, to the same exporter
    as the fan-out's; the logs go to serve unfiltered."""
    config = load("otelcol-filter.yaml")
    fanout = load("otelcol-fanout.yaml")
    pipelines = config["service"]["pipelines"]
    assert pipelines["traces/backend"] == fanout["service"]["pipelines"]["traces"] | {
        "exporters": ["otlp_grpc/backend"]
    }
    assert pipelines["traces/loopguard"] == {
        "receivers": ["otlp"],
        "processors": ["filter/loopguard", "batch"],
        "exporters": ["otlp_http/loopguard"],
    }
    assert pipelines["logs"] == fanout["service"]["pipelines"]["logs"]
    assert config["exporters"] == fanout["exporters"]
    flt = config["processors"]["filter/loopguard"]
    assert flt["error_mode"] == "ignore"  # a condition that cannot be evaluated keeps the span
    assert set(flt) == {"error_mode", "traces"} and set(flt["traces"]) == {"span"}


@pytest.mark.parametrize(
    ("name", "routing"),
    [
        ("otelcol-sharded.yaml", "traceID"),
        ("otelcol-sharded-conversation.yaml", "attributes"),
        ("otelcol-replicas-redis.yaml", "traceID"),
    ],
)
def test_sharded_routes_to_serve_replicas_over_grpc(name: str, routing: str) -> None:
    balancer = load(name)["exporters"]["load_balancing"]
    assert balancer["routing_key"] == routing
    if routing == "attributes":
        assert balancer["routing_attributes"] == ["gen_ai.conversation.id"]
    else:
        assert "routing_attributes" not in balancer
    assert set(balancer["protocol"]) == {"otlp"}  # load_balancing speaks OTLP/gRPC only
    otlp = balancer["protocol"]["otlp"]
    assert "endpoint" not in otlp  # the resolver gives the endpoints
    assert otlp["headers"]["authorization"] == "Bearer ${env:LOOPGUARD_SERVE_TOKEN}"
    hostnames = balancer["resolver"]["static"]["hostnames"]
    assert len(hostnames) >= 2 and all(h.endswith(f":{GRPC_PORT}") for h in hostnames)


def test_replicas_on_redis_say_how_the_replicas_are_started() -> None:
    """The replicas' own settings are not in the Collector's file: its comment says them."""
    text = (COLLECTOR / "otelcol-replicas-redis.yaml").read_text()
    comment = " ".join(
        line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")
    )
    assert "serve --store redis://" in comment
    assert "appendfsync always" in comment
    assert "--state-dir" in comment
    assert "any replica" in comment


def test_compose_stack_mounts_what_exists_and_agrees_on_the_token() -> None:
    compose = load("docker-compose.yml")
    services = compose["services"]
    assert set(services) == {"collector", "loopguard", "jaeger", "prometheus", "grafana"}
    named = set(compose.get("volumes") or {})
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert source in named or (COLLECTOR / source).exists(), source
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), port  # the demo publishes on loopback only
    collector = services["collector"]
    assert "./otelcol-fanout.yaml:/etc/otelcol/config.yaml:ro" in collector["volumes"]
    environment = collector["environment"]
    assert environment["LOOPGUARD_ENDPOINT"] == f"http://loopguard:{HTTP_PORT}"
    assert environment["TRACING_BACKEND_ENDPOINT"] == f"jaeger:{GRPC_PORT}"
    token = environment["LOOPGUARD_SERVE_TOKEN"]
    assert services["loopguard"]["environment"]["LOOPGUARD_SERVE_TOKEN"] == token
    default = re.fullmatch(r"\$\{LOOPGUARD_SERVE_TOKEN:-(.+)\}", token)
    assert default is not None
    build = services["loopguard"]["build"]
    assert (COLLECTOR / build["context"] / build["dockerfile"]).is_file()
    command = services["loopguard"]["command"]
    assert command[:2] == ["--host", "0.0.0.0"]  # with the token from the environment
    # serve's own parser takes the command; its state directory is a named volume, made
    # nobody's and 0700 in the image (serve refuses a directory others could write).
    from otel_loopguard.cli import build_parser

    serve = build_parser().parse_args(["serve", *command])
    assert serve.state_dir == "/var/lib/otel-loopguard"
    assert f"loopguard-state:{serve.state_dir}" in services["loopguard"]["volumes"]
    assert "loopguard-state" in named
    dockerfile = (COLLECTOR / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["otel-loopguard", "serve"]' in dockerfile and "[serve]" in dockerfile
    assert f"RUN install -d -o nobody -m 700 {serve.state_dir}" in dockerfile
    assert "USER nobody" in dockerfile

    prometheus = yaml.safe_load((COLLECTOR / "prometheus.yml").read_text())
    assert prometheus["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert (
        "../dashboards/alerts.yml:/etc/prometheus/alerts.yml:ro"
        in (services["prometheus"]["volumes"])
    )
    (job,) = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"loopguard:{HTTP_PORT}"]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "/prometheus/serve-token"}
    assert services["prometheus"]["environment"]["LOOPGUARD_SERVE_TOKEN"] == token

    provisioning = COLLECTOR / "grafana" / "provisioning"
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert datasource["datasources"][0]["type"] == "prometheus"
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    dashboards = yaml.safe_load((provisioning / "dashboards" / "loopguard.yaml").read_text())
    path = dashboards["providers"][0]["options"]["path"]
    assert any(
        volume.endswith(f"{path}/loopguard.json:ro") for volume in services["grafana"]["volumes"]
    )


def test_the_prometheus_entrypoint_writes_the_token_the_scrape_reads(tmp_path: Path) -> None:
    """Run the compose file's Prometheus command with sh, its paths moved into tmp_path and
    Prometheus replaced by a stand-in: the file prometheus.yml names holds the environment's token
    (compose's ``$$`` is a literal ``$``), readable by its owner only."""
    prometheus = load("docker-compose.yml")["services"]["prometheus"]
    assert prometheus["entrypoint"] == ["/bin/sh", "-c"]
    (script,) = prometheus["command"]
    script = script.replace("$$", "$").replace("/prometheus/", f"{tmp_path}/")
    script = script.replace("exec /bin/prometheus", "exec true")
    token = "a token with spaces, $dollars and 'quotes'"
    subprocess.run(
        ["/bin/sh", "-c", script],
        env={"LOOPGUARD_SERVE_TOKEN": token, "PATH": "/usr/bin:/bin"},
        check=True,
        timeout=30,
    )
    written = tmp_path / "serve-token"
    assert written.read_text() == token  # no newline: Prometheus sends the file as it is
    assert written.stat().st_mode & 0o077 == 0
    job = yaml.safe_load((COLLECTOR / "prometheus.yml").read_text())["scrape_configs"][0]
    assert job["authorization"]["credentials_file"] == "/prometheus/serve-token"


def test_readme_names_every_file() -> None:
    readme = (COLLECTOR / "README.md").read_text()
    for name in (*CONFIGS, "docker-compose.yml", "Dockerfile"):
        if name not in NOT_IN_README:
            assert f"`{name}`" in readme, name


def test_exemplars_link_to_a_defined_trace_data_source() -> None:
    """Prometheus keeps exemplars (the feature flag), and Grafana's Prometheus data source turns
    an exemplar's ``trace_id`` into a link to a data source the provisioning defines."""
    compose = load("docker-compose.yml")
    (script,) = compose["services"]["prometheus"]["command"]
    assert "--enable-feature=exemplar-storage" in script
    provisioning = COLLECTOR / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
    sources = yaml.safe_load(provisioning.read_text())["datasources"]
    uids = {source["uid"]: source for source in sources}
    (prometheus,) = [s for s in sources if s["type"] == "prometheus"]
    destinations = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert [d["name"] for d in destinations] == ["trace_id"]  # the label our exemplars carry
    for destination in destinations:
        target = uids[destination["datasourceUid"]]
        assert target["type"] == "jaeger"
        assert target["url"] == f"http://jaeger:{16686}"
    assert "jaeger" in compose["services"]
