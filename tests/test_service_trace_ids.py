"""serve's decisions name their trace: the decision API takes a call's ``trace_id`` and
``span_id`` from its body, else from a W3C ``traceparent`` header, and its log line and the
exemplars of what it counted carry them; ids that cannot be used are dropped (counted), never an
error. ``/metrics`` answers OpenMetrics when asked for it, the text format otherwise."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from .service_tools import request, require_serve_prerequisites

require_serve_prerequisites()

from otel_loopguard._exemplars import DROPPED  # noqa: E402
from otel_loopguard.config import PRESETS  # noqa: E402
from otel_loopguard.service import ServeOptions, Service  # noqa: E402
from otel_loopguard.service._logs import install, uninstall  # noqa: E402

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
TOKEN = "s3cret"


@pytest.fixture
def served() -> Iterator[tuple[Service, io.StringIO]]:
    stream = io.StringIO()
    handler = install("info", "json", stream)
    service = Service(
        ServeOptions(http_port=0, grpc_port=None, token=TOKEN), policy=PRESETS["default"]
    ).start()
    try:
        yield service, stream
    finally:
        service.close()
        uninstall(handler)


def _before(
    service: Service, session: str, extra: dict[str, Any], headers: dict[str, str] | None = None
) -> list[Any]:
    """Calls of one looping session until it is denied: every answer's decision."""
    decisions = []
    for n in range(12):
        body = {"session": session, "tool": "grep", "arguments": {"q": "x"}, **extra}
        answer = request(
            service.http_port,
            "POST",
            "/v1/decisions/before",
            json.dumps(body).encode(),
            {"Authorization": f"Bearer {TOKEN}", **(headers or {})},
        )
        assert answer.status == 200, answer.body
        after = {**body, "call_id": f"c{n}", "result": "same"}
        request(
            service.http_port,
            "POST",
            "/v1/decisions/after",
            json.dumps(after).encode(),
            {"Authorization": f"Bearer {TOKEN}", **(headers or {})},
        )
        decisions.append(answer.json()["decision"])
        if decisions[-1]["action"] == "deny":
            break
    assert decisions[-1]["action"] == "deny"
    return decisions


def _lines(stream: io.StringIO, session: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [line for line in lines if line.get("session") == session]


def _openmetrics(service: Service) -> str:
    page = request(
        service.http_port,
        "GET",
        "/metrics",
        headers={"Authorization": f"Bearer {TOKEN}", "Accept": "application/openmetrics-text"},
    )
    assert page.status == 200
    assert page.headers["content-type"].startswith("application/openmetrics-text")
    return page.body.decode()


def test_body_ids_reach_the_log_line_and_the_exemplar(
    served: tuple[Service, io.StringIO],
) -> None:
    service, stream = served
    _before(service, "body", {"trace_id": TRACE, "span_id": SPAN})
    lines = _lines(stream, "body")
    assert lines and all(line["trace_id"] == TRACE and line["span_id"] == SPAN for line in lines)
    denials = [
        line
        for line in _openmetrics(service).splitlines()
        if line.startswith("loopguard_decisions_total{") and 'action="deny"' in line
    ]
    assert any(f'trace_id="{TRACE}"' in line and f'span_id="{SPAN}"' in line for line in denials)


def test_a_traceparent_header_names_the_call(served: tuple[Service, io.StringIO]) -> None:
    service, stream = served
    _before(service, "header", {}, {"traceparent": f"00-{TRACE}-{SPAN}-01"})
    lines = _lines(stream, "header")
    assert lines and {(line["trace_id"], line["span_id"]) for line in lines} == {(TRACE, SPAN)}


@pytest.mark.parametrize(
    ("extra", "headers"),
    [
        ({"trace_id": "0" * 32, "span_id": SPAN}, {}),  # all zero
        ({"trace_id": TRACE[:-1] + "g", "span_id": SPAN}, {}),  # not hex
        ({"trace_id": "0x" + TRACE[2:], "span_id": SPAN}, {}),  # a prefix
        ({"trace_id": TRACE * 5, "span_id": SPAN}, {}),  # too long (over the exemplar limit)
        ({"trace_id": TRACE}, {}),  # half of it
        ({"trace_id": 7, "span_id": SPAN}, {}),  # not a string
        ({}, {"traceparent": "garbage"}),
        ({}, {"traceparent": f"ff-{TRACE}-{SPAN}-01"}),  # the version W3C forbids
    ],
)
def test_unusable_ids_are_dropped_and_counted(
    served: tuple[Service, io.StringIO], extra: dict[str, Any], headers: dict[str, str]
) -> None:
    service, stream = served
    dropped = DROPPED.count
    plain = _before(service, "plain", {})
    odd = _before(service, "odd", extra, headers)
    assert [d["action"] for d in odd] == [d["action"] for d in plain]  # the same decisions
    assert DROPPED.count > dropped
    assert all("trace_id" not in line for line in _lines(stream, "odd"))
    assert 'trace_id="' not in _openmetrics(service)


def test_metrics_without_openmetrics_is_the_text_format(
    served: tuple[Service, io.StringIO],
) -> None:
    service, _ = served
    _before(service, "body", {"trace_id": TRACE, "span_id": SPAN})
    denied = request(service.http_port, "GET", "/metrics", headers={"Accept": "*/*"})
    assert denied.status == 401  # the token still guards it, in either format
    page = request(
        service.http_port, "GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert page.status == 200
    assert page.headers["content-type"].startswith("text/plain")
    assert "# EOF" not in page.body.decode() and TRACE not in page.body.decode()
    assert "loopguard_decisions_total{" in page.body.decode()
