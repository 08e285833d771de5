"""Session state and the bounded store (engine.py)."""

from __future__ import annotations

from otel_loopguard import PRESETS
from otel_loopguard._classifier import Classifier, shell_command
from otel_loopguard._engine import MAX_PENDING_CALLS, SessionState
from otel_loopguard._session_store import SessionStore

from .conftest import FakeClock

POLICY = PRESETS["default"]


def test_store_evicts_least_recently_used_beyond_capacity(clock: FakeClock) -> None:
    evicted: list[str] = []
    store = SessionStore(max_sessions=2, ttl_seconds=60, clock=clock, on_evict=evicted.append)
    store.get("a")
    store.get("b")
    store.get("a")  # a is now the most recent
    store.get("c")
    assert "b" not in store and "a" in store and "c" in store
    assert evicted == ["capacity"]


def test_store_expires_idle_sessions_on_the_injected_clock(clock: FakeClock) -> None:
    evicted: list[str] = []
    store = SessionStore(max_sessions=10, ttl_seconds=60, clock=clock, on_evict=evicted.append)
    store.get("a")
    clock.advance(30)
    store.get("b")
    clock.advance(30)  # a idle for 60s: gone at the next access; b idle for 30s: kept
    store.get("b")
    assert "a" not in store and "b" in store
    assert evicted == ["ttl"]
    assert store.get("x", create=False) is None and len(store) == 1


def test_signatures_per_session_are_bounded_lru() -> None:
    policy = POLICY.replace(max_signatures_per_session=4, window_size=2)
    state = SessionState(0.0)
    for key in ["a", "b", "c", "d", "a", "e"]:
        state.record_attempt(key, policy, blocked=False)
    assert list(state.signatures) == ["c", "d", "a", "e"]  # b was least recently used
    assert state.signatures["a"].count == 2
    big = POLICY.replace(max_signatures_per_session=40, window_size=20)
    for n in range(1000):
        state.record_attempt(f"k{n}", big, blocked=False)
    assert len(state.signatures) <= 40 and "k999" in state.signatures


def test_window_is_bounded_and_epoch_clears_evidence() -> None:
    state = SessionState(0.0)
    for n in range(100):
        state.record_attempt(str(n % 7), POLICY, blocked=n % 2 == 0)
    assert len(state.window) == POLICY.window_size - 1
    assert state.redundant == 93 and state.denials == 50
    state.stopped = True
    state.new_epoch()
    assert (state.window, state.signatures, state.redundant, state.denials) == ([], {}, 0, 0)
    assert state.stopped and state.epoch == 1
    state.new_epoch(clear_stop=True)
    assert not state.stopped


def test_pending_calls_are_bounded_and_matched_once() -> None:
    state = SessionState(0.0)
    for n in range(MAX_PENDING_CALLS + 10):
        state.add_pending(f"id{n}", "k", blocked=False, mutating=False)
    assert state.pending is not None and len(state.pending) == MAX_PENDING_CALLS
    assert state.take_pending("id0") is None  # the oldest were forgotten
    last = f"id{MAX_PENDING_CALLS + 9}"
    assert state.take_pending(last) is not None
    assert state.take_pending(last) is None


def test_outcomes_feed_the_signature() -> None:
    state = SessionState(0.0)
    state.record_attempt("k", POLICY, blocked=False)
    state.record_outcome("k", "r1")
    state.record_outcome("k", "r1")
    sig = state.signatures["k"]
    assert (sig.last_outcome, sig.same_outcomes, sig.changed) == ("r1", 2, False)
    state.record_outcome("k", "r2")
    state.record_outcome("gone", "r1")  # unknown signature: ignored
    assert (sig.last_outcome, sig.same_outcomes, sig.changed) == ("r2", 1, True)
    state.record_outcome("k", None)  # unknown outcome: nothing learnt
    assert (sig.last_outcome, sig.same_outcomes) == ("r2", 1)


def test_shell_command_shapes() -> None:
    assert shell_command({"command": "ls"}) == "ls"
    assert shell_command({"command": ["bash", "-lc", "ls -la"]}) == "bash -lc ls -la"
    assert shell_command({"path": "x"}) is None
    assert shell_command("echo hi") == "echo hi"


def test_classifier_tracks_and_detects_mutation() -> None:
    classifier = Classifier(POLICY.replace(exclude=("todo*",), exclude_commands=(r"^docker ps",)))
    assert classifier.classify("TodoWrite", {}) == (False, False)
    assert classifier.classify("Bash", {"command": "docker ps -a"}) == (False, False)
    assert classifier.classify("Edit", {"file_path": "a"}) == (True, True)
    for command in [
        "sed -i 's/a/b/' f",
        "echo x > out.txt",
        "git commit -m x",
        "pip install y",
        "rm -rf build",
        "cat a | tee b",
        "patch -p1 < fix.diff",
        "npm install",
    ]:
        assert classifier.classify("bash", {"command": command}) == (True, True), command
    for command in [
        "cat a.txt",
        "grep -r x .",
        "ls > /dev/null",
        "echo x >&2",
        "git status",
        "pytest -q 2>&1",
        "cargo clippy",
    ]:
        assert classifier.classify("bash", {"command": command}) == (True, False), command


# -- leaving the process and coming back (to_bytes / from_bytes / put) -----------------------


def _busy_state() -> SessionState:
    state = SessionState(now=123.5)
    for key in ["a" * 32, "b" * 32, "a" * 32, "c" * 32, "a" * 32]:
        state.record_attempt(key, POLICY, blocked=key == "c" * 32)
    state.record_outcome("a" * 32, "o1")
    state.record_outcome("a" * 32, "o1")
    state.record_outcome("b" * 32, "o2")
    state.add_pending("toolu_1", "a" * 32, False, True)
    state.add_pending("b" * 32, "b" * 32, True, False)
    state.add_pending("b" * 32, "b" * 32, True, False)
    state.stopped = True
    state.advice = {"a" * 32: "try the other file"}
    state.rescues = 1
    state.last_rescue_at = 100.25
    return state


def _fields(state: SessionState) -> dict[str, object]:
    return {
        "epoch": state.epoch,
        "window": list(state.window),
        "last_key": state.last_key,
        "run_length": state.run_length,
        "redundant": state.redundant,
        "signatures": [
            (k, s.count, s.last_outcome, s.same_outcomes, s.changed)
            for k, s in state.signatures.items()
        ],
        "denials": state.denials,
        "stopped": state.stopped,
        "pending": [
            (r, p.args_key, p.blocked, p.mutating, p.outstanding)
            for r, p in (state.pending or {}).items()
        ],
        "advice": state.advice,
        "rescues": state.rescues,
        "last_rescue_at": state.last_rescue_at,
        "last_seen": state.last_seen,
    }


def test_state_survives_bytes_round_trip_field_for_field() -> None:
    state = _busy_state()
    restored = SessionState.from_bytes(state.to_bytes(), POLICY)
    assert _fields(restored) == _fields(state)
    assert _fields(restored)["pending"] == [
        ("toolu_1", "a" * 32, False, True, 1),
        ("b" * 32, "b" * 32, True, False, 2),
    ]
    # Each 128-bit key is written once: the window refers to signatures by position.
    assert state.to_bytes().count(b"a" * 32) == 3  # signature, pending key, advice key


def test_fresh_state_round_trips() -> None:
    state = SessionState(now=7.0)
    assert _fields(SessionState.from_bytes(state.to_bytes(), POLICY)) == _fields(state)


def test_restore_trims_to_a_smaller_policy() -> None:
    state = SessionState(now=1.0)
    for index in range(POLICY.window_size + 10):
        state.record_attempt(f"{index:032x}", POLICY, blocked=False)
        state.add_pending(f"call-{index}", f"{index:032x}", False, False)
    for index in range(MAX_PENDING_CALLS + 5):
        state.add_pending(f"more-{index}", "f" * 32, False, False)
    small = POLICY.replace(window_size=4, max_signatures_per_session=8)
    restored = SessionState.from_bytes(state.to_bytes(), small)
    assert len(restored.window) == small.window_size - 1
    assert restored.window == state.window[-(small.window_size - 1) :]
    assert list(restored.signatures) == list(state.signatures)[-small.max_signatures_per_session :]
    assert restored.pending is not None and len(restored.pending) == MAX_PENDING_CALLS
    assert list(restored.pending)[-1] == f"more-{MAX_PENDING_CALLS + 4}"


def test_restore_refuses_what_it_did_not_write() -> None:
    import orjson
    import pytest

    good = orjson.loads(_busy_state().to_bytes())
    bad_inputs = [
        b"\x00garbage",
        b"[]",
        orjson.dumps({**good, "v": 99}),
        orjson.dumps({**good, "epoch": -1}),
        orjson.dumps({**good, "stopped": "yes"}),
        orjson.dumps({**good, "sigs": [["k", 1, None, 0]]}),
        # the current layout with one field of the wrong type (read field by field, named)
        orjson.dumps({**good, "sigs": [["k", True, None, 0, False, False, 0, False, 0]]}),
        orjson.dumps({**good, "sigs": [["k", 1, None, 0, False, False, -1, False, 0]]}),
        orjson.dumps({**good, "sigs": [["k", 1, 7, 0, False, False, 0, False, 0]]}),
        orjson.dumps({**good, "sigs": [[1, 1, None, 0, False, False, 0, False, 0]]}),
        orjson.dumps({**good, "window": [None]}),
        orjson.dumps({**good, "seen": "now"}),
        orjson.dumps({**good, "pending": [["r", "k", False, False, True]]}),
    ]
    for data in bad_inputs:
        with pytest.raises(ValueError, match="session state"):
            SessionState.from_bytes(data, POLICY)


def test_put_keeps_last_seen_so_a_stale_state_expires(clock: FakeClock) -> None:
    evicted: list[str] = []
    store = SessionStore(max_sessions=2, ttl_seconds=60, clock=clock, on_evict=evicted.append)
    fresh = SessionState(now=clock.now - 10)
    stale = SessionState(now=clock.now - 61)
    store.put("fresh", fresh)
    store.put("stale", stale)
    assert evicted == ["ttl"]
    assert store.get("fresh", create=False) is fresh
    assert store.get("stale", create=False) is None and len(store) == 1


def test_put_evicts_least_recently_used_beyond_capacity(clock: FakeClock) -> None:
    evicted: list[str] = []
    store = SessionStore(max_sessions=2, ttl_seconds=60, clock=clock, on_evict=evicted.append)
    store.get("a")
    store.get("b")
    replacement = SessionState(clock.now)
    store.put("a", replacement)  # replaces a, now the most recent
    store.put("c", SessionState(clock.now))
    assert "b" not in store and store.get("a", create=False) is replacement and "c" in store
    assert evicted == ["capacity"]


def test_command_patterns_with_inline_flags_still_combine() -> None:
    policy = POLICY.replace(
        exclude_commands=(r"(?i)^DOCKER PS", r"^kubectl get"),
        mutating_commands=(r"(?i)make install", r"^cp "),
    )
    classifier = Classifier(policy)
    assert classifier.classify("bash", {"command": "docker ps -a"}) == (False, False)
    assert classifier.classify("bash", {"command": "kubectl get pods"}) == (False, False)
    assert classifier.classify("bash", {"command": "MAKE INSTALL"}) == (True, True)
    assert classifier.classify("bash", {"command": "ls"}) == (True, False)


def test_store_lists_a_sessions_agent_keys_and_forgets_evicted_ones(clock: FakeClock) -> None:
    evicted: list[str] = []
    store = SessionStore(max_sessions=3, ttl_seconds=60, clock=clock, on_evict=evicted.append)
    store.get(("s", "coder"))
    store.get(("s", "reviewer"))
    store.get("s")  # the session's own key is not an agent key
    assert store.agent_keys("s") == [("s", "coder"), ("s", "reviewer")]
    assert store.agent_keys("other") == []
    store.get(("t", "coder"))  # capacity: ("s", "coder") is the least recently used
    assert evicted == ["capacity"]
    assert store.agent_keys("s") == [("s", "reviewer")]
    clock.advance(61)
    store.expire()  # ttl: everything goes, and the index with it
    assert store.agent_keys("s") == store.agent_keys("t") == [] and len(store) == 0
    store.put(("s", "coder"), SessionState(clock.now))
    assert store.agent_keys("s") == [("s", "coder")]
    store.put(("s", "coder"), SessionState(clock.now - 61))  # replaced by a stale state: gone
    assert store.agent_keys("s") == []
    # Bounded as the store is: never more agent keys listed than sessions kept.
    for n in range(10):
        store.get(("u", f"agent{n}"))
    assert len(store.agent_keys("u")) == len(store) == 3
