"""The public state seams (issue 22): ``LoopGuard.snapshot()``/``restore()``,
``SessionStore.snapshot()``/``restore()``, the ``serve --state-dir`` snapshot built from them as
plain data in a data-only format (issue 23: nothing ``pickle`` reads), a snapshot committed from
this version (``tests/data/state/v2``) that a real ``serve`` still loads, its counts going on,
and the pickled state of the release before (``tests/data/state/v1``), which ``serve`` refuses
with a message that says how to start fresh."""

from __future__ import annotations

import ast
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson
import pytest

from otel_loopguard import LoopGuard, Policy
from otel_loopguard._session_store import SessionStore
from otel_loopguard.service import _durable, _state_codec, _state_files
from otel_loopguard.service._durable import MAX_PLAIN_DEPTH, layout, plain_dumps, plain_loads

STATE = Path(__file__).resolve().parent / "data" / "state"
DATA = STATE / "v2"
PICKLED = STATE / "v1"


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


def test_plain_data_round_trips_exactly() -> None:
    data = {
        "version": 1,
        "ids": [1 << 100, -(1 << 100), (1 << 63) - 1, -(1 << 63), 1 << 63, 0, -1],
        "raw": b"\x00\xff",
        "pair": ("a", None, ("nested", [True, False])),
        "x": 1.5,
        "inf": float("inf"),
        (1, "k"): "a tuple key",
        7: "an int key",
        "text": "é \u2603 \x00",
        "again": ["text", "version", "text"],
        "flat": {"a": 1, "b": "x", "c": None, "d": -0.0},  # written as JSON
        "lone": {"s": "\ud800"},  # JSON cannot write it: as a dict
        "odd": {"nan": float("inf"), "big": 1 << 64},
    }
    back = plain_loads(plain_dumps(data))
    assert back == data
    assert type(back["pair"]) is tuple and type(back["ids"]) is list


def test_only_plain_data_is_written() -> None:
    with pytest.raises(ValueError, match=r"snapshot\['held'\]: OrderedDict is not plain data"):
        plain_dumps({"held": OrderedDict()})
    with pytest.raises(ValueError, match=r"snapshot\[0\]: set is not plain data"):
        plain_dumps([{1}])
    deep: list[object] = []
    for _ in range(MAX_PLAIN_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ValueError, match="nested more than"):
        plain_dumps(deep)


def test_plain_loads_reads_no_pickle_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class _Runs:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    for payload in (pickle.dumps(_Runs()), pickle.dumps(_Runs(), protocol=0)):
        with pytest.raises(ValueError, match="unknown tag"):
            plain_loads(payload)
    assert not marker.exists()
    # The modules that read a state directory import no reader that can run code.
    for module in (_durable, _state_codec, _state_files):
        tree = ast.parse(Path(module.__file__ or "").read_text())
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & {"pickle", "marshal", "shelve", "dill", "cloudpickle"}, module
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        assert not names & {"eval", "exec", "compile", "__import__"}, module


def test_damaged_plain_data_is_a_value_error_never_anything_else() -> None:
    """Every prefix and every one-byte change of a payload: a ValueError or a value, never a
    crash, a hang or a huge allocation (lengths are checked against what is there)."""
    payload = plain_dumps({"a": [1, (2, b"x")], "b": "text", "c": {"text": 1 << 80}})
    for end in range(len(payload)):
        with pytest.raises(ValueError):
            plain_loads(payload[:end])
    for index in range(len(payload)):
        for byte in (0x00, 0x7F, 0xFF, payload[index] ^ 0x01):
            changed = payload[:index] + bytes([byte]) + payload[index + 1 :]
            try:
                plain_loads(changed)
            except ValueError:
                pass
    with pytest.raises(ValueError, match="a length past the end"):
        plain_loads(b"l\xff\xff\xff\xff")
    with pytest.raises(ValueError, match="nested more than"):
        plain_loads(b"l\x01\x00\x00\x00" * 10_000 + b"N")
    with pytest.raises(ValueError, match="not plain data"):
        plain_loads(b"d\x01\x00\x00\x00l\x00\x00\x00\x00N")  # a list as a key
    with pytest.raises(ValueError, match="a reference to text 0 of 0"):
        plain_loads(b"r\x00\x00\x00\x00")


def test_the_committed_layout_is_this_versions() -> None:
    """The layout marker depends on the files' format, the snapshot's version and a recorded
    span's fields only: a change to any sets every state directory aside (add a ``v3/``
    then)."""
    assert (DATA / "layout").read_text(encoding="utf-8").strip() == layout()
    assert layout().startswith("state-2:")
    assert (PICKLED / "layout").read_text(encoding="utf-8").startswith("state-1:")


def test_the_committed_snapshot_is_read_as_plain_data() -> None:
    from otel_loopguard.service._durable import _snapshot_of

    snapshot = _snapshot_of((DATA / "snapshot").read_bytes())
    assert snapshot["version"] == 1 and snapshot["guard"]["version"] == 1
    assert snapshot["buffer"]["version"] == 1
    assert isinstance(snapshot["time"], float)  # the trace buffer's times are relative to it
    sessions = snapshot["guard"]["sessions"]["sessions"]
    assert [(entry["session"], entry["agent"]) for entry in sessions] == [
        ("hook-1", None),
        ("hook-2", "planner"),
    ]


def test_serve_loads_a_snapshot_written_by_this_version_and_counts_go_on(
    tmp_path: Path,
) -> None:
    """``tests/data/state/v2/snapshot`` (see the README there): two looping ``grep`` calls of
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
    from otel_loopguard._otlp_json import OtlpSpans, RecordedSpan
    from otel_loopguard.service._durable import batch_of, batch_payload

    def span(span_id: int, **attributes: object) -> RecordedSpan:
        return RecordedSpan(
            (1 << 127) + 5,
            span_id,
            None,
            "execute_tool grep",
            {"gen_ai.tool.name": "grep", **attributes},
            (("event", {"k": 1}), ("other", {"tags": ("x",), "raw": b"\x02"})),
            True,
            10,
            20,
            start_name="execute_tool grep",
            start_attributes={"gen_ai.tool.name": "grep", "n": -(1 << 63)},
            parent_remote=True,
        )

    plain = span(7, tags=("a", "b"), n=2.5, flag=False, empty=None, big=(1 << 63) - 1)
    unusual = span(8, raw=b"\x01", nan=float("nan"), inf=float("-inf"), nested={"a": ("b",)})
    unusual_list = span(9, listed=["a"], huge=1 << 70)
    read = OtlpSpans(
        [plain, unusual, unusual_list], ["spans[1]: bad"], 1, [((1 << 100), 3, None, False)]
    )
    payload = batch_payload(read)
    assert payload[:1] == b"J"  # JSON: 128-bit ids in hex, attribute maps JSON keeps as they are
    rows = orjson.loads(payload[1:])[0]
    assert rows[0][0] == f"{(1 << 127) + 5:x}" and rows[0][4]["tags"] == ["a", "b"]
    assert isinstance(rows[1][4], str)  # bytes, nan: in the plain format (Base64)
    back = batch_of(payload)
    assert back.spans[0] == plain and back.spans[2] == unusual_list
    assert str(back.spans[1]) == str(unusual)  # nan != nan: compared as text
    assert type(back.spans[0].attributes["tags"]) is tuple
    assert type(back.spans[2].attributes["listed"]) is list
    assert (back.problems, back.bad_spans, back.links) == (read.problems, 1, read.links)
    # Text JSON cannot write (a lone surrogate): the whole batch in the plain format.
    odd = OtlpSpans([span(10, text="\ud800")], [], 0, [])
    assert batch_payload(odd)[:1] == b"P" and batch_of(batch_payload(odd)) == odd
    for bad in (pickle.dumps(read), b"J[1]", b"Jnot json", b"P" + pickle.dumps(read), b""):
        with pytest.raises(ValueError, match="not a logged batch"):
            batch_of(bad)


def test_the_pickled_state_of_the_last_release_is_refused_saying_how_to_start_fresh(
    tmp_path: Path,
) -> None:
    """``tests/data/state/v1`` (pickled): ``serve`` reads none of it (no pickle is loaded) and
    refuses to start (status 2), saying to move or delete the directory; the files stay as they
    were. Moved away, a new directory starts."""
    from tests.service_tools import ServeProcess, require_serve_prerequisites

    require_serve_prerequisites()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    for name in ("snapshot", "layout"):
        shutil.copy(PICKLED / name, state / name)
        os.chmod(state / name, 0o600)
    refused = subprocess.run(
        [sys.executable, "-m", "otel_loopguard", "serve", "--http-port", "0", "--no-grpc"]
        + ["--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    assert "pickled format" in refused.stderr and "move it away or delete it" in refused.stderr
    assert f"mv {str(state)!r} {str(state) + '.old'!r}" in refused.stderr
    for name in ("snapshot", "layout"):
        assert (state / name).read_bytes() == (PICKLED / name).read_bytes()
    state.rename(tmp_path / "state.old")
    server = ServeProcess("--state-dir", str(state))
    try:
        assert server.stop() == 0
    finally:
        server.close()


def test_frames_a_later_log_file_starts_again_are_not_replayed(tmp_path: Path) -> None:
    """After a write that could not be cut off, the next file is named after the failed group's
    first frame: whatever the earlier file holds from there was never answered, and a restart
    reads those sequence numbers from the later file only."""
    from otel_loopguard.service._durable import DECISION, StateDir

    state = tmp_path / "state"
    first = StateDir(str(state))
    first.recover()
    first.open_log(1)
    for n in range(1, 6):
        assert first.wait(first.append(DECISION, float(n), f"old {n}".encode()))
    first.close()
    second = StateDir(str(state))
    assert [r.payload for r in second.recover().records][-1] == b"old 5"
    second.open_log(4)  # as after a failed group 4-5
    for n in range(4, 7):
        assert second.wait(second.append(DECISION, float(n), f"new {n}".encode()))
    second.close()
    third = StateDir(str(state))
    records = third.recover().records
    third.close()
    assert [(r.seq, r.payload) for r in records] == [
        (1, b"old 1"),
        (2, b"old 2"),
        (3, b"old 3"),
        (4, b"new 4"),
        (5, b"new 5"),
        (6, b"new 6"),
    ]
