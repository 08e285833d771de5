"""The public state seams (issue 22): ``LoopGuard.snapshot()``/``restore()``,
``SessionStore.snapshot()``/``restore()``, the ``serve --state-dir`` snapshot built from them as
plain data, and a snapshot committed from this version (``tests/data/state/v1``) that a real
``serve`` still loads, its counts going on."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson
import pytest

from otel_loopguard import LoopGuard, Policy
from otel_loopguard._engine import SessionStore
from otel_loopguard.service._durable import layout, plain_dumps, plain_loads

DATA = Path(__file__).resolve().parent / "data" / "state" / "v1"


def _loop(guard: LoopGuard, session: str, times: int, **extra: Any) -> list[int]:
    counts = []
    for _ in range(times):
        decision = guard.before_tool("grep", {"q": "x"}, session=session, **extra)
        counts.append(decision.count)
        guard.after_tool("grep", {"q": "x"}, session=session, result="same", **extra)
    return counts


def test_a_guard_snapshot_is_plain_data_and_a_new_guard_goes_on_from_it() -> None:
    first = LoopGuard(Policy())
    assert _loop(first, "s", 3) == [0, 2, 3]
    _loop(first, "s", 1, agent="planner")
    data = first.snapshot()
    # Plain data: JSON round-trips it unchanged.
    assert orjson.loads(orjson.dumps(data)) == data
    assert data["version"] == 1

    second = LoopGuard(Policy())
    second.restore(orjson.loads(orjson.dumps(data)))
    assert _loop(second, "s", 1) == [4]
    assert _loop(second, "s", 1, agent="planner") == [2]
    # A new run of the session reaches the agent kept in the restored store too.
    second.new_run("s")
    assert _loop(second, "s", 1, agent="planner") == [0]


def test_a_second_report_of_a_restored_call_still_counts_once() -> None:
    first = LoopGuard(Policy())
    first.before_tool("read", {"p": 1}, session="s", call_id="c1")
    first.after_tool("read", {"p": 1}, session="s", call_id="c1", result="r")
    second = LoopGuard(Policy())
    second.restore(first.snapshot())
    # The span's echo of the call the hook reported: matched in the restored ledger.
    assert second.after_tool("read", {"p": 1}, session="s", call_id="c1", result="r") is None
    assert second.before_tool("read", {"p": 1}, session="s").count == 2


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_restore_refuses_an_unknown_version_naming_it(version: object) -> None:
    guard = LoopGuard(Policy())
    _loop(guard, "s", 2)
    data = guard.snapshot()
    with pytest.raises(ValueError, match=f"guard snapshot: unknown version {version!r}"):
        guard.restore({**data, "version": version})
    store = SessionStore(10, 60.0)
    with pytest.raises(ValueError, match=f"session store snapshot: unknown version {version!r}"):
        store.restore({**data["sessions"], "version": version}, Policy())
    # Refused: the guard is unchanged.
    assert _loop(guard, "s", 1) == [3]


def test_a_malformed_snapshot_leaves_the_guard_unchanged() -> None:
    guard = LoopGuard(Policy())
    _loop(guard, "s", 2)
    data = guard.snapshot()
    with pytest.raises(ValueError, match="bad reported calls entry"):
        guard.restore({**data, "sessions": {"version": 1, "sessions": []}, "reported": [1]})
    assert _loop(guard, "s", 1) == [3]


def test_the_store_keeps_its_bounds_and_order_when_restored() -> None:
    guard = LoopGuard(Policy())
    for name in ("a", "b", "c"):
        _loop(guard, name, 1)
    data = guard.snapshot()["sessions"]
    assert [entry["session"] for entry in data["sessions"]] == ["a", "b", "c"]
    store = SessionStore(2, 3600.0)
    store.restore(data, Policy())
    # Beyond max_sessions, the least recently used are left out.
    assert len(store) == 2 and "a" not in store and "c" in store


def test_plain_loads_refuses_any_pickle_that_names_a_class_or_function() -> None:
    data = {"version": 1, "ids": [1 << 100], "raw": b"\x00", "pair": ("a", None), "x": 1.5}
    assert plain_loads(plain_dumps(data)) == data
    with pytest.raises(ValueError, match="OrderedDict is not plain data"):
        plain_dumps({"held": OrderedDict()})
    with pytest.raises(ValueError, match="names collections.OrderedDict"):
        plain_loads(pickle.dumps(OrderedDict()))

    class _Runs:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("echo pwned",))

    with pytest.raises(ValueError, match="names (posix|os).system"):
        plain_loads(pickle.dumps(_Runs()))
    with pytest.raises(ValueError, match="not a plain-data pickle"):
        plain_loads(b"garbage")


def test_the_committed_layout_is_this_versions() -> None:
    """The layout marker depends on the snapshot's version and a recorded span's fields only:
    a change to either sets every state directory aside (add a ``v2/`` then)."""
    assert (DATA / "layout").read_text(encoding="utf-8").strip() == layout()


def test_the_committed_snapshot_is_read_as_plain_data() -> None:
    from otel_loopguard.service._durable import _read_snapshot

    snapshot = _read_snapshot(DATA / "snapshot")
    assert snapshot["version"] == 1 and snapshot["guard"]["version"] == 1
    assert snapshot["buffer"]["version"] == 1
    sessions = snapshot["guard"]["sessions"]["sessions"]
    assert [(entry["session"], entry["agent"]) for entry in sessions] == [
        ("hook-1", None),
        ("hook-2", "planner"),
    ]


def test_serve_loads_a_snapshot_written_by_this_version_and_counts_go_on(
    tmp_path: Path,
) -> None:
    """``tests/data/state/v1/snapshot`` (see the README there): two looping ``grep`` calls of
    ``hook-1`` and one ``read`` of ``hook-2``/``planner`` still pending under call id ``c1``."""
    from tests.service_tools import ServeProcess, request, require_serve_prerequisites

    require_serve_prerequisites()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    for name in ("snapshot", "layout"):
        shutil.copy(DATA / name, state / name)
        os.chmod(state / name, 0o600)

    def decide(port: int, endpoint: str, **body: Any) -> Any:
        answer = request(
            port,
            "POST",
            f"/v1/decisions/{endpoint}",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        assert answer.status == 200, answer.body
        return answer.json()

    # The sessions were last seen when the snapshot was written: keep them however long ago.
    env = {**os.environ, "LOOPGUARD_SESSION_TTL_SECONDS": str(100 * 365 * 86400)}
    server = ServeProcess("--state-dir", str(state), env=env)
    try:
        assert any("loaded a snapshot" in line for line in server.lines), server.lines
        hook = decide(server.port, "before", session="hook-1", tool="grep", arguments={"q": "x"})
        assert hook["decision"]["count"] == 3
        # The pending call's report ends it (counted once), and the next one counts 2.
        decide(
            server.port,
            "after",
            session="hook-2",
            agent="planner",
            tool="read",
            arguments={"path": "a.txt"},
            call_id="c1",
            result="text",
        )
        again = decide(
            server.port,
            "before",
            session="hook-2",
            agent="planner",
            tool="read",
            arguments={"path": "a.txt"},
        )
        assert again["decision"]["count"] == 2
        assert server.stop() == 0
    finally:
        server.close()


def test_a_logged_batch_is_plain_data_and_comes_back_equal() -> None:
    from otel_loopguard._traces import OtlpSpans, RecordedSpan
    from otel_loopguard.service._durable import batch_of, batch_payload

    span = RecordedSpan(
        (1 << 127) + 5,
        7,
        None,
        "execute_tool grep",
        {"gen_ai.tool.name": "grep", "tags": ("a", "b"), "raw": b"\x01", "n": 2.5},
        (("event", {"k": 1}),),
        True,
        10,
        20,
        parent_remote=True,
    )
    read = OtlpSpans([span], ["spans[1]: bad"], 1, [((1 << 100), 3, None, False)])
    back = batch_of(batch_payload(read))
    assert back == read
    # The payload names no class: the plain unpickler reads it.
    assert plain_loads(batch_payload(read))[0][0][0] == (1 << 127) + 5
    with pytest.raises(ValueError, match="not a logged batch"):
        batch_of(pickle.dumps(read))
