"""``POST /v1/decisions/model_call``: a model turn's usage through serve's decision API, charged
as ``LoopGuard.model_call`` charges it (issue 24, item 2), on a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .service_tools import require_serve_prerequisites

require_serve_prerequisites()

from otel_loopguard._guard import LoopGuard  # noqa: E402
from otel_loopguard.config import PRESETS  # noqa: E402
from otel_loopguard.service import ServeOptions, Service  # noqa: E402
from otel_loopguard.service._decisions import MODEL_CALL_FIELDS  # noqa: E402

from .service_tools import request  # noqa: E402

JSON = {"Content-Type": "application/json"}
#: The corpus's turn (mini-swe-agent, Gemini 3 Pro Preview through OpenRouter): OpenRouter
#: reported $0.009176 for it.
TURN = {"model": "google/gemini-3-pro-preview", "input_tokens": 2704, "output_tokens": 314}


def _start(tmp_path: Path, **options: Any) -> Service:
    settings: dict[str, Any] = {"http_port": 0, "grpc_port": None, "hold_seconds": 60.0}
    settings.update(options)
    if "state_dir" in settings:  # the service makes its own guard then
        return Service(ServeOptions(**settings), policy=PRESETS["default"]).start()
    return Service(ServeOptions(**settings), guard=LoopGuard(PRESETS["default"])).start()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = _start(tmp_path)
    yield svc
    svc.close(timeout=10)


def _post(port: int, endpoint: str, body: object) -> Any:
    return request(port, "POST", f"/v1/decisions/{endpoint}", json.dumps(body).encode(), JSON)


def test_a_model_call_is_charged_as_the_hook_api_charges_it(service: Service) -> None:
    port = service.http_port
    reference = LoopGuard(PRESETS["default"])
    turns = [
        {**TURN, "session": "s", "agent": "coder"},
        {**TURN, "session": "s", "agent": "coder", "reported_cost_usd": 0.5},
        {
            "session": "s",
            "agent": "coder",
            "model": "no-such-model-x",
            "input_tokens": 100,
            "cache_read_tokens": 60,
            "output_tokens": 7,
        },
    ]
    answers = []
    for turn in turns:
        answer = _post(port, "model_call", turn)
        assert answer.status == 200, answer.body
        answers.append(answer.json())
        usage = {k: v for k, v in turn.items() if k not in ("session", "agent")}
        reference.model_call(usage, session="s", agent="coder")
    assert answers[0]["charged"] is True
    assert answers[0]["cost_source"] == "computed"
    assert answers[0]["cost_usd"] == pytest.approx(0.009176, rel=1e-3)
    assert answers[1] == {"charged": True, "cost_usd": 0.5, "cost_source": "provider"}
    assert answers[2] == {"charged": True, "cost_usd": None, "cost_source": "unpriced"}
    got, want = service.guard.spend("s", agent="coder"), reference.spend("s", agent="coder")
    assert got is not None and want is not None
    assert got.to_plain() == want.to_plain()
    assert got.calls == 3 and got.unpriced_calls == 1 and got.cache_read_tokens == 60
    assert service.guard.spend("s") is None  # the agent's, not the session's main agent


def test_a_repeat_after_a_reported_turn_is_loop_spend(service: Service) -> None:
    port = service.http_port
    call = {"session": "loop", "tool": "grep", "arguments": {"q": "x"}}
    for _ in range(3):
        assert _post(port, "model_call", {**TURN, "session": "loop"}).status == 200
        assert _post(port, "before", call).status == 200
    spend = service.guard.spend("loop")
    assert spend is not None
    # The first turn asked for a new call; the next two for repeats.
    assert (spend.calls, spend.loop_turns, spend.loop_tokens) == (3, 2, 2 * 3018)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({**TURN}, "missing field 'session'"),
        ({**TURN, "session": "s", "input_tokens": -1}, "'input_tokens'"),
        ({**TURN, "session": "s", "output_tokens": "many"}, "'output_tokens'"),
        ({**TURN, "session": "s", "output_tokens": 2 * 10**9}, "'output_tokens'"),
        ({**TURN, "session": "s", "cache_read_tokens": 5000}, "more than input_tokens"),
        ({**TURN, "session": "s", "reported_cost_usd": -0.1}, "'reported_cost_usd'"),
        ({**TURN, "session": "s", "reported_cost_usd": "free"}, "'reported_cost_usd'"),
        ({**TURN, "session": "s", "model": 3}, "'model' must be"),
        ({**TURN, "session": "s", "provider": ""}, "'provider' must be"),
        ({**TURN, "session": "s", "agent": 1}, "'agent' must be"),
    ],
)
def test_bad_usage_is_a_400_naming_the_field_and_charges_nothing(
    service: Service, body: dict[str, object], fragment: str
) -> None:
    answer = _post(service.http_port, "model_call", body)
    assert answer.status == 400
    assert fragment in answer.json()["error"]
    assert service.guard.spend("s") is None
    assert service.guard.skipped_model_calls == {}  # refused before the guard saw it


def test_the_fields_are_the_hook_apis() -> None:
    from otel_loopguard._guard import _USAGE_FIELDS

    assert set(MODEL_CALL_FIELDS) == set(_USAGE_FIELDS)


def test_model_calls_survive_a_restart_with_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    first = _start(tmp_path, state_dir=str(state))
    try:
        assert _post(first.http_port, "model_call", {**TURN, "session": "d"}).status == 200
    finally:
        first.close(timeout=10)
    second = _start(tmp_path, state_dir=str(state))
    try:
        spend = second.guard.spend("d")
        assert spend is not None and (spend.calls, spend.tokens) == (1, 3018)
    finally:
        second.close(timeout=10)
