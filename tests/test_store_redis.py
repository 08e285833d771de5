"""Sessions in Redis (issue 25): a real ``redis-server`` on loopback, guards in one process and in
many, and every fault the store can have: stopped and restarted (AOF), silent, full, damaged."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard import PRESETS, Action, LoopGuard
from otel_loopguard._core import GuardCore
from otel_loopguard._redis_store import CLOSED_MESSAGE, RETRY_AFTER_SECONDS, RedisCore
from otel_loopguard.config import StoreFailure, load_policy, policy_from_env
from otel_loopguard.metrics import PrometheusRecorder

from .conftest import FakeClock
from .redis_tools import RedisServer, Silent, free_port, redis_server, require_redis_server

__all__ = ["redis_server"]  # the fixture, used by name

# A generous timeout where the test is not about faults (the machine may be busy).
DEFAULT = PRESETS["default"].replace(store_timeout_seconds=5.0)
ROOT = Path(__file__).resolve().parents[1]


def grep(guard: LoopGuard, session: str = "s", **options: Any) -> Any:
    return guard.before_tool("grep", {"pattern": "TODO"}, session=session, **options)


def count_of(guard: LoopGuard, session: str = "s") -> int:
    state = guard.export_session(session)
    assert state is not None
    return sum(signature.count for signature in state.signatures.values())


# -- one process ----------------------------------------------------------------------------


def test_the_default_guard_runs_the_in_memory_core_unchanged() -> None:
    assert type(LoopGuard(DEFAULT)._core) is GuardCore
    assert LoopGuard(DEFAULT).store_errors == {}


def test_two_guards_on_one_redis_decide_as_one_guard(redis_server: RedisServer) -> None:
    one = LoopGuard(DEFAULT)
    a = LoopGuard(DEFAULT, store=redis_server.url)
    b = LoopGuard(DEFAULT, store=redis_server.url)
    assert isinstance(a._core, RedisCore)
    expected, got = [], []
    for i in range(14):
        expected.append(grep(one))
        got.append(grep(a if i % 2 else b))
        for guard in (one, a if i % 2 else b):
            guard.after_tool("grep", {"pattern": "TODO"}, session="s", result="same")
    assert [(d.action, d.count, d.rule) for d in got] == [
        (d.action, d.count, d.rule) for d in expected
    ]
    assert Action.STOP in {d.action for d in got}
    # A user message through either guard starts a new epoch for both.
    a.user_message("s")
    assert grep(b).action is Action.ALLOW and count_of(a) == 1
    assert a.store_errors == {} and b.store_errors == {}


def test_keys_carry_the_prefix_a_hash_tag_and_the_session_ttl(redis_server: RedisServer) -> None:
    policy = DEFAULT.replace(store_prefix="team-a:", session_ttl_seconds=120.0)
    guard = LoopGuard(policy, store=redis_server.url)
    grep(guard, "conv-1")
    guard.before_tool("ls", {}, session="conv-1", agent="coder")
    client: Any = redis_server.client()
    assert client.keys("*") == [b"team-a:{conv-1}"]  # every agent of a session: one key
    assert 110_000 < client.pttl("team-a:{conv-1}") <= 120_000
    value = json.loads(client.get("team-a:{conv-1}"))
    assert value["v"] == 1 and sorted(str(agent) for agent, _, _ in value["agents"]) == [
        "None",
        "coder",
    ]
    other = LoopGuard(DEFAULT.replace(store_prefix="team-b:"), store=redis_server.url)
    assert grep(other, "conv-1").count == 0 and count_of(other, "conv-1") == 1  # not shared


def test_the_store_comes_from_the_policy_the_environment_and_toml(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    from_env = policy_from_env(DEFAULT, {"LOOPGUARD_STORE": redis_server.url})
    assert from_env.store == redis_server.url
    toml = tmp_path / "loopguard.toml"
    toml.write_text(
        f'store = "{redis_server.url}"\nstore_failure = "closed"\nstore_prefix = "x:"\n'
    )
    policy = load_policy(config_path=toml, environ={})
    assert policy.store_failure is StoreFailure.CLOSED
    guard = LoopGuard(policy)
    grep(guard)
    client: Any = redis_server.client()
    assert client.exists("x:{s}") == 1
    with pytest.raises(ValueError, match=r"store: expected a redis://.*'http://u:\*\*\*@h'"):
        LoopGuard(DEFAULT, store="http://u:secret@h")
    with pytest.raises(ValueError, match="store_failure: 'maybe' is not one of open, closed"):
        DEFAULT.replace(store_failure="maybe")
    with pytest.raises(ValueError, match="store_timeout_seconds"):
        DEFAULT.replace(store_timeout_seconds=0)


def test_a_bad_store_url_is_named_without_its_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        policy = policy_from_env(DEFAULT, {"LOOPGUARD_STORE": "ftp://user:hunter2@h"})
    assert policy.store is None  # a bad variable warns and keeps the default
    assert "LOOPGUARD_STORE='ftp://user:***@h' ignored" in caplog.text
    assert "hunter2" not in caplog.text
    with pytest.raises(ValueError) as raised:
        DEFAULT.replace(store="memcached://:hunter2@h")
    assert "hunter2" not in str(raised.value) and "store: expected a redis://" in str(raised.value)
    assert policy_from_env(DEFAULT, {"LOOPGUARD_STORE": "none"}).store is None


def test_a_password_from_a_file(redis_server: RedisServer, tmp_path: Path) -> None:
    client: Any = redis_server.client()
    client.config_set("requirepass", "s3cret word")
    secret = tmp_path / "redis-password"
    secret.write_text("s3cret word\n")
    guard = LoopGuard(DEFAULT.replace(store_password_file=str(secret)), store=redis_server.url)
    grep(guard)
    assert grep(guard).count == 2 and guard.store_errors == {}
    without = LoopGuard(DEFAULT, store=redis_server.url)
    assert grep(without).action is Action.ALLOW and without.store_errors == {"read": 1}
    with pytest.raises(ValueError, match="store_password_file: cannot read"):
        LoopGuard(DEFAULT.replace(store_password_file=str(tmp_path / "nope")), store="redis://h")


def test_a_session_stored_damaged_starts_afresh_with_a_note(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = PrometheusRecorder()
    guard = LoopGuard(DEFAULT, store=redis_server.url, recorder=recorder)
    client: Any = redis_server.client()
    for _ in range(3):
        grep(guard)
    client.set("loopguard:{s}", b"\x00 not json")
    client.set("loopguard:{t}", json.dumps({"v": 99, "agents": []}))
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        assert grep(guard).action is Action.ALLOW
        grep(guard, "t")
    assert count_of(guard) == 1 and count_of(guard, "t") == 1
    assert guard.store_errors == {"decode": 2}
    assert recorder.registry.get_sample_value("loopguard_store_errors_total", {"op": "decode"}) == 2
    notes = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(notes) == 1 and "starts afresh" in notes[0]


def test_a_full_redis_fails_open_then_counts_resume(redis_server: RedisServer) -> None:
    guard = LoopGuard(DEFAULT, store=redis_server.url)
    client: Any = redis_server.client()
    grep(guard)
    grep(guard)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    assert grep(guard).action is Action.ALLOW  # OOM: not counted, not raised
    assert guard.store_errors == {"write": 1}
    client.config_set("maxmemory", "0")
    time.sleep(RETRY_AFTER_SECONDS + 0.05)
    assert grep(guard).count == 3


def test_a_read_only_redis_after_a_failover_fails_open_then_counts_resume(
    redis_server: RedisServer,
) -> None:
    guard = LoopGuard(DEFAULT, store=redis_server.url)
    client: Any = redis_server.client()
    grep(guard)
    grep(guard)
    client.replicaof("127.0.0.1", free_port())  # a replica now: writes answer READONLY
    try:
        assert grep(guard).action is Action.ALLOW
        assert guard.store_errors == {"write": 1}
    finally:
        client.replicaof("NO", "ONE")
    time.sleep(RETRY_AFTER_SECONDS + 0.05)
    assert grep(guard).count == 3
    assert guard.session_count == 0  # the sessions are Redis's


# -- (d) Redis stopped and restarted, with AOF -------------------------------------------------


@pytest.mark.parametrize("failure", list(StoreFailure))
def test_redis_killed_and_restarted_with_aof(
    tmp_path: Path, failure: StoreFailure, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis", aof=True).start()
    recorder = PrometheusRecorder()
    policy = DEFAULT.replace(store_failure=failure)
    try:
        guard = LoopGuard(policy, store=server.url, recorder=recorder)
        before = [grep(guard) for _ in range(4)]
        assert [d.count for d in before[1:]] == [2, 3, 4]
        server.stop(kill=True)  # kill -9: AOF with appendfsync always kept every write
        with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
            during = [grep(guard) for _ in range(5)]
            guard.after_tool("grep", {"pattern": "TODO"}, session="s", result="x")  # no raise
            guard.user_message("s")
        if failure is StoreFailure.OPEN:
            assert all(d.action is Action.ALLOW for d in during)
        else:
            assert all(d.action is Action.DENY and d.message == CLOSED_MESSAGE for d in during)
            assert all(d.blocks for d in during)
        # The first call after the kill fails at its write (the value it wrote last is taken
        # without asking) or its read; later ones are not tried for RETRY_AFTER_SECONDS.
        errors = guard.store_errors
        assert set(errors) <= {"read", "write"} and sum(errors.values()) >= 1
        counted = sum(
            recorder.registry.get_sample_value("loopguard_store_errors_total", {"op": op}) or 0
            for op in ("read", "write")
        )
        assert counted == sum(errors.values())
        logged = [r for r in caplog.records if "failed" in r.getMessage()]
        assert len(logged) == 1 and f"store_failure={failure.value}" in logged[0].getMessage()
        server.start()  # the same port and directory: the AOF is read back
        time.sleep(RETRY_AFTER_SECONDS + 0.05)
        after = [grep(guard) for _ in range(2)]
        # The calls decided during the outage were not counted; the four before were kept.
        assert [d.count for d in after] == [5, 6]
        assert after[1].action is Action.DENY  # the default preset's deny threshold is 6
    finally:
        server.stop()


# -- (e) a Redis that accepts connections and never answers ----------------------------------


@pytest.mark.parametrize("failure", list(StoreFailure))
def test_a_silent_redis_never_holds_a_call_beyond_the_timeout(failure: StoreFailure) -> None:
    require_redis_server()
    silent = Silent()
    timeout = 0.05
    policy = DEFAULT.replace(store_timeout_seconds=timeout, store_failure=failure)
    guard = LoopGuard(policy, store=f"redis://127.0.0.1:{silent.port}/0")
    times: list[float] = []
    actions: set[Action] = set()
    lock = threading.Lock()

    def calls(thread: int) -> None:
        for _ in range(12):
            start = time.perf_counter()
            decision = grep(guard, f"s{thread}")
            guard.after_tool("grep", {"pattern": "TODO"}, session=f"s{thread}", result="r")
            with lock:
                times.append(time.perf_counter() - start)
                actions.add(decision.action)
            time.sleep(0.12)  # 1.4 s in all: the store is tried again after RETRY_AFTER_SECONDS

    try:
        threads = [threading.Thread(target=calls, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(times) == 48
        # One command's timeout, plus the scheduling of four threads on a shared machine (a
        # call that hung, or waited for the client's own retries, would take far longer).
        assert max(times) < timeout + 0.25, sorted(times)[-5:]
        assert sorted(times)[len(times) // 2] < timeout  # most calls do not wait at all
        assert actions == {Action.ALLOW if failure is StoreFailure.OPEN else Action.DENY}
        assert guard.store_errors["read"] >= 2  # tried again after the pause
    finally:
        silent.close()


def test_nothing_listening_fails_at_once() -> None:
    require_redis_server()
    guard = LoopGuard(DEFAULT, store=f"redis://127.0.0.1:{free_port()}/0")
    start = time.perf_counter()
    assert grep(guard).action is Action.ALLOW
    assert time.perf_counter() - start < 0.2
    assert guard.store_errors == {"read": 1}
    assert guard.internal_errors == {}


# -- (a) 8 processes x 2,000 decisions over 50 sessions ----------------------------------------

WORKER = """
import json, sys
from otel_loopguard import PRESETS, LoopGuard
url, index, processes, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
guard = LoopGuard(PRESETS["default"].replace(store_timeout_seconds=5.0), store=url)
out = []
sys.stdin.readline()  # start together
for i in range(index, total, processes):
    k = i % 50
    agent = f"a{k % 3}" if k % 5 == 0 else None
    d = guard.before_tool("grep", {"k": k % 7}, session=f"s{k}", agent=agent)
    out.append([f"s{k}", d.action.value, d.count])
print(json.dumps({"decisions": out, "errors": dict(guard.store_errors)}))
"""


def test_eight_processes_give_the_counts_and_actions_of_one(redis_server: RedisServer) -> None:
    processes, total = 8, 16_000
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, redis_server.url, str(i), str(processes), str(total)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        for i in range(processes)
    ]
    time.sleep(1.0)  # imported, waiting
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write(b"go\n")
        worker.stdin.flush()
    results = [json.loads(worker.communicate(timeout=300)[0]) for worker in workers]
    assert all(worker.returncode == 0 for worker in workers)
    got: dict[str, Counter[tuple[str, int]]] = {}
    for result in results:
        assert result["errors"] == {}
        for session, action, count in result["decisions"]:
            got.setdefault(session, Counter())[(action, count)] += 1
    one = LoopGuard(PRESETS["default"])
    expected: dict[str, Counter[tuple[str, int]]] = {}
    for i in range(total):
        k = i % 50
        agent = f"a{k % 3}" if k % 5 == 0 else None
        d = one.before_tool("grep", {"k": k % 7}, session=f"s{k}", agent=agent)
        expected.setdefault(f"s{k}", Counter())[(d.action.value, d.count)] += 1
    assert got == expected
    # Every count from 2 to 320 was given once per session: no update lost, none twice.
    assert got["s1"][("stop", 320)] == 1 and sum(got["s1"].values()) == 320


# -- the advisor's answer reaches the session in Redis ---------------------------------------


@pytest.mark.parametrize("fails", [False, True])
def test_advice_is_cached_and_a_failed_ask_refunded_in_redis(
    redis_server: RedisServer, fails: bool
) -> None:
    asked: list[str] = []

    def advisor(request: Any) -> str:
        asked.append(request.session)
        if fails:
            raise RuntimeError("model down")
        return "Read the file instead of searching it again."

    policy = PRESETS["rescue"].replace(store_timeout_seconds=5.0)
    memory_clock, redis_clock = FakeClock(), FakeClock()
    memory = LoopGuard(policy, advisor=advisor, clock=memory_clock)
    shared = [
        LoopGuard(policy, advisor=advisor, clock=redis_clock, store=redis_server.url)
        for _ in range(2)
    ]
    expected, got = [], []
    for i in range(10):
        expected.append(grep(memory))
        memory.close(wait=True)  # the answer is settled before the next call
        got.append(grep(shared[i % 2]))
        shared[i % 2].close(wait=True)
        memory_clock.advance(7)
        redis_clock.advance(7)
    assert got == expected
    assert sum(d.blocks for d in got) >= 5
    advised = [d for d in got if "Read the file" in d.message]
    assert len(advised) == (0 if fails else sum(d.action is Action.RESCUE for d in got))
    assert fails or len(advised) >= 5
    # Asked as often with two processes on Redis as with one in memory: once when the advice
    # is kept; when every ask fails, as often as the refunded budget and the cooldown allow.
    assert len(asked) % 2 == 0 and len(asked) >= 2
    kept = shared[0].export_session("s")
    mine = memory.export_session("s")
    assert kept is not None and mine is not None
    assert kept.to_bytes() == mine.to_bytes()
    assert (kept.advice is None) is fails and kept.rescues == (0 if fails else 1)


def test_rediss_with_tls_and_a_password(tmp_path: Path) -> None:
    from .service_tools import self_signed

    binary = require_redis_server()
    cert, key = self_signed(tmp_path)
    port = free_port()
    server = subprocess.Popen(
        [
            binary,
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
            "--tls-auth-clients",
            "no",
            "--requirepass",
            "tls secret",
            "--save",
            "",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:  # listening?
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis-server with TLS did not start"
                time.sleep(0.05)
        url = f"rediss://:tls%20secret@127.0.0.1:{port}/0?ssl_ca_certs={cert}"
        guard = LoopGuard(DEFAULT, store=url)
        assert [grep(guard).count for _ in range(3)] == [0, 2, 3]
        assert guard.store_errors == {}
        plain = LoopGuard(DEFAULT, store=f"redis://127.0.0.1:{port}/0")  # no TLS: refused
        assert grep(plain).action is Action.ALLOW and sum(plain.store_errors.values()) == 1
    finally:
        server.terminate()
        server.wait(10)
