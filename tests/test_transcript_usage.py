"""Model usage from Claude Code's transcript (issue 24, item 1): the hook reads what is new
since its last call, within a bound, and charges each model response once.

The transcripts here have the shape of Claude Code's (``tests/data/claude_code_session.jsonl``,
and what public reports of real transcripts show: one model response written over several lines,
one per content block, with the same ``message.id``; input and cache counts repeated, the output
count growing to its final value on the last line; e.g. titeya/dms-claudecode#52,
vibe-cafe/vibe-usage#63, getagentseal/codeburn#201). The hook runs as the hosts run it: the
real command, one process per event.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard._engine import SessionState
from otel_loopguard._prices import ModelUsage, Pricer
from otel_loopguard._spend import Spend
from otel_loopguard.hooks._transcript import (
    MAX_REMEMBERED_IDS,
    Mark,
    claude_code_turn,
    read_new_turns,
)

from .test_hooks import BASH_RESULT, BASH_TESTS, claude, claude_post, claude_pre, clean_env, hook

DEFAULT = PRESETS["default"]
SESSION = "5b0c7d2e-8f41-4a6b-9c3d-2e1f0a9b8c7d"
MODEL = "claude-sonnet-4-5-20250929"


def assistant(
    message_id: str,
    *,
    output: int = 96,
    fresh: int = 4,
    cache_read: int = 18523,
    cache_write: int = 312,
    content: str = "tool_use",
    agent: str | None = None,
    model: str = MODEL,
    usage: Any = None,
) -> dict[str, Any]:
    """One transcript line of a model response, as Claude Code writes it."""
    block: dict[str, Any] = (
        {"type": "tool_use", "id": f"toolu_{message_id}", "name": "Bash", "input": BASH_TESTS}
        if content == "tool_use"
        else {"type": "text", "text": "Let me run the tests."}
    )
    return {
        "parentUuid": None,
        "isSidechain": agent is not None,
        **({"agentId": agent} if agent is not None else {}),
        "userType": "external",
        "cwd": "/home/dev/durations",
        "sessionId": SESSION,
        "version": "2.1.59",
        "type": "assistant",
        "uuid": f"uuid-{message_id}-{output}",
        "timestamp": "2026-03-14T09:26:56.523Z",
        "requestId": f"req_{message_id}",
        "message": {
            "model": model,
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "content": [block],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage
            if usage is not None
            else {
                "input_tokens": fresh,
                "cache_creation_input_tokens": cache_write,
                "cache_read_input_tokens": cache_read,
                "output_tokens": output,
                "service_tier": "standard",
            },
        },
    }


def tool_result(call: str, text: str = "1 failed") -> dict[str, Any]:
    """A user line with a tool's result: large, and never model usage."""
    return {
        "type": "user",
        "sessionId": SESSION,
        "isSidechain": False,
        "message": {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call, "content": text}],
        },
    }


def write(path: Path, *records: dict[str, Any], partial: bytes = b"") -> None:
    with path.open("ab") as handle:
        for record in records:
            handle.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
        handle.write(partial)


def usage_of(
    fresh: int = 4, cache_read: int = 18523, cache_write: int = 312, output: int = 96
) -> ModelUsage:
    return ModelUsage.checked(
        MODEL,
        "anthropic",
        input_tokens=fresh + cache_read + cache_write,
        output_tokens=output,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )


# -- the reader --------------------------------------------------------------------------------


def test_a_response_written_over_several_lines_is_one_turn_with_its_last_counts(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.jsonl"
    write(
        path,
        assistant("msg_a", output=1, content="text"),  # the streaming snapshot
        assistant("msg_a", output=1),
        assistant("msg_a", output=211),  # the final count
        tool_result("toolu_msg_a", "x" * 10_000),
        assistant("msg_b", output=40),
    )
    reading = read_new_turns(str(path), None, agent=None)
    assert [(t.id, t.usage) for t in reading.turns] == [
        ("msg_a", usage_of(output=211)),
        ("msg_b", usage_of(output=40)),
    ]
    assert reading.skipped == {} and reading.problem is None and reading.skipped_bytes == 0
    assert reading.mark is not None and reading.mark.offset == path.stat().st_size
    assert reading.mark.ids == ("msg_a", "msg_b")
    # Nothing new: nothing charged, the same mark.
    again = read_new_turns(str(path), reading.mark, agent=None)
    assert again.turns == [] and again.mark == reading.mark


def test_an_id_already_charged_is_not_charged_again(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write(path, assistant("msg_a", output=1))
    first = read_new_turns(str(path), None, agent=None)
    assert [t.usage.output_tokens for t in first.turns] == [1]
    write(path, assistant("msg_a", output=211), assistant("msg_c"))  # msg_a's later lines
    second = read_new_turns(str(path), first.mark, agent=None)
    assert [t.id for t in second.turns] == ["msg_c"]


def test_a_partial_last_line_waits_for_the_next_call(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    line = json.dumps(assistant("msg_a"), separators=(",", ":")).encode()
    write(path, partial=line[:100])
    first = read_new_turns(str(path), None, agent=None)
    assert first.turns == [] and first.mark is not None and first.mark.offset == 0
    write(path, partial=line[100:] + b"\n")
    second = read_new_turns(str(path), first.mark, agent=None)
    assert [t.id for t in second.turns] == ["msg_a"] and second.skipped == {}


def test_a_truncated_or_replaced_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write(path, assistant("msg_a"), tool_result("toolu_msg_a", "y" * 5000), assistant("msg_b"))
    first = read_new_turns(str(path), None, agent=None)
    assert first.mark is not None
    path.write_bytes(b"")  # truncated in place (same inode)
    write(path, assistant("msg_b"), assistant("msg_c"))
    assert path.stat().st_size < first.mark.offset
    second = read_new_turns(str(path), first.mark, agent=None)
    assert [t.id for t in second.turns] == ["msg_c"]  # msg_b was charged already
    replacement = tmp_path / "new.jsonl"
    write(replacement, assistant("msg_c"), assistant("msg_d"), assistant("msg_e"))
    os.replace(replacement, path)  # another file at the same path, longer than the offset
    third = read_new_turns(str(path), second.mark, agent=None)
    assert [t.id for t in third.turns] == ["msg_d", "msg_e"]


def test_a_backlog_over_the_bound_is_read_from_its_end(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    for n in range(200):
        write(path, assistant(f"msg_{n:03d}"), tool_result(f"toolu_{n}", "z" * 2000))
    size = path.stat().st_size
    reading = read_new_turns(str(path), None, agent=None, max_bytes=20_000)
    assert 0 < len(reading.turns) < 20
    assert reading.turns[-1].id == "msg_199"  # the newest is charged before its call
    assert size - 20_000 <= reading.skipped_bytes < size
    assert reading.skipped == {}  # the cut line is passed over, not a bad line
    assert reading.mark is not None and reading.mark.offset == size


def test_a_line_longer_than_the_bound_is_passed_over(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write(path, tool_result("toolu_1", "w" * 50_000))
    reading = read_new_turns(str(path), None, agent=None, max_bytes=10_000)
    assert reading.turns == [] and reading.skipped == {"line longer than the read bound": 1}
    assert reading.mark is not None and reading.mark.offset == path.stat().st_size


def test_each_agent_reads_its_own_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write(path, assistant("msg_main"), assistant("msg_sub", agent="a3f9c2e1"))
    main = read_new_turns(str(path), None, agent=None)
    sub = read_new_turns(str(path), None, agent="a3f9c2e1")
    assert [t.id for t in main.turns] == ["msg_main"]
    assert [(t.id, t.agent) for t in sub.turns] == [("msg_sub", "a3f9c2e1")]


def test_bad_lines_are_counted_skips_never_exceptions(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write(
        path,
        assistant("msg_neg", usage={"input_tokens": -1, "output_tokens": 3}),
        assistant("msg_text", usage={"input_tokens": 4, "output_tokens": "many"}),
        assistant("msg_huge", usage={"input_tokens": 4, "output_tokens": 2 * 10**9}),
        assistant("msg_float", usage={"input_tokens": 1.5, "output_tokens": 3}),
        assistant("msg_list", usage=[1, 2]),
        assistant("msg_synthetic", model="<synthetic>"),  # Claude Code's failed-request line
        assistant("msg_ok"),
    )
    write(path, partial=b'{"type":"assistant","message":{"usage": \xff oops\n[1, "usage"]\n')
    reading = read_new_turns(str(path), None, agent=None)
    assert [t.id for t in reading.turns] == ["msg_ok"]
    assert reading.skipped == {
        "input_tokens": 2,
        "output_tokens": 2,
        "usage": 1,
        "not JSON": 1,
    }


def test_a_mark_reads_back_and_a_bad_one_is_none() -> None:
    ids = tuple(f"msg_{n}" for n in range(MAX_REMEMBERED_IDS + 5))
    mark = Mark("/t.jsonl", 1, 2, 300, ids)
    back = Mark.from_bytes(mark.to_bytes())
    assert back is not None and back.offset == 300 and back.ids == ids[-MAX_REMEMBERED_IDS:]
    for bad in (
        None,
        b"",
        b"nope",
        b"[1, 2]",
        b'[1, "/t", 1, 2, -3, []]',
        b'[9, "/t", 1, 2, 3, []]',
    ):
        assert Mark.from_bytes(bad) is None


def test_a_missing_file_is_nothing_new_and_an_unreadable_one_is_said(tmp_path: Path) -> None:
    missing = read_new_turns(str(tmp_path / "none.jsonl"), None, agent=None)
    assert missing.turns == [] and missing.problem is None
    directory = read_new_turns(str(tmp_path), None, agent=None)
    assert directory.turns == [] and directory.problem is not None
    assert "not a regular file" in directory.problem


def test_claude_code_turn_counts_cached_input_in_the_input() -> None:
    turn = claude_code_turn(assistant("msg_a", fresh=4, cache_read=100, cache_write=10))
    assert turn is not None
    assert (turn.usage.input_tokens, turn.usage.cache_read_tokens) == (114, 100)
    assert turn.usage.cache_write_tokens == 10 and turn.usage.provider == "anthropic"
    assert claude_code_turn(tool_result("x")) is None


# -- the hook, as Claude Code runs it ------------------------------------------------------------


def _spend(store: Path, session: str, agent: str | None = None) -> Spend:
    key = json.dumps(["claude-code", session, agent], separators=(",", ":"))
    with sqlite3.connect(store) as db:
        (state,) = db.execute("SELECT state FROM sessions WHERE key = ?", (key,)).fetchone()
    spend = SessionState.from_bytes(state, DEFAULT).spend
    assert spend is not None
    return spend


def test_the_hook_charges_each_new_turn_before_its_call_and_loop_spend_follows(
    tmp_path: Path,
) -> None:
    store, transcript = tmp_path / "hooks.sqlite3", tmp_path / "session.jsonl"
    env = clean_env()
    fields = {"session": SESSION, "transcript_path": str(transcript)}
    prompt = claude("UserPromptSubmit", prompt="fix the test", **fields)
    assert hook("claude-code", prompt, store, env=env).err == ""  # no transcript yet: silent
    reference = LoopGuard(DEFAULT)
    calls = 4
    for n in range(calls):
        # The response that asks for the call is written (over two lines) before its hook runs.
        write(transcript, assistant(f"msg_{n}", output=1), assistant(f"msg_{n}", output=96 + n))
        reply = hook("claude-code", claude_pre("Bash", BASH_TESTS, f"toolu_{n}", **fields), store)
        assert reply.code == 0 and reply.err == ""
        usage = usage_of(output=96 + n)
        reference.model_call(usage, session=SESSION)
        decision = reference.before_tool("Bash", BASH_TESTS, session=SESSION, call_id=f"toolu_{n}")
        if decision.blocks:
            continue
        write(transcript, tool_result(f"toolu_{n}", json.dumps(BASH_RESULT)))
        post = claude_post("Bash", BASH_TESTS, f"toolu_{n}", BASH_RESULT, **fields)
        assert hook("claude-code", post, store).code == 0
        reference.after_tool(
            "Bash", BASH_TESTS, session=SESSION, call_id=f"toolu_{n}", result=BASH_RESULT
        )
    spend = _spend(store, SESSION)
    want = reference.spend(SESSION)
    assert want is not None
    assert spend.to_plain() == want.to_plain()
    assert spend.calls == calls and spend.output_tokens == sum(96 + n for n in range(calls))
    assert spend.loop_turns == calls - 1  # every turn after the first asked for a repeat
    priced = Pricer().cost(usage_of())
    assert priced.usd is not None and spend.computed_usd > 0  # genai-prices knows the model


def test_a_sub_agents_turns_are_its_own(tmp_path: Path) -> None:
    store, transcript = tmp_path / "hooks.sqlite3", tmp_path / "session.jsonl"
    write(transcript, assistant("msg_main"), assistant("msg_sub", agent="a3f9c2e1", output=7))
    fields = {"session": SESSION, "transcript_path": str(transcript)}
    hook("claude-code", claude_pre("Bash", BASH_TESTS, "toolu_1", **fields), store)
    event = claude_pre("Grep", {"pattern": "x"}, "toolu_2", agent_id="a3f9c2e1", **fields)
    hook("claude-code", event, store)
    main, sub = _spend(store, SESSION), _spend(store, SESSION, "a3f9c2e1")
    assert (main.calls, main.output_tokens) == (1, 96)
    assert (sub.calls, sub.output_tokens) == (1, 7)


def test_bad_lines_never_block_a_call(tmp_path: Path) -> None:
    store, transcript = tmp_path / "hooks.sqlite3", tmp_path / "session.jsonl"
    write(
        transcript,
        assistant("msg_bad", usage={"input_tokens": -5, "output_tokens": 1}),
        assistant("msg_ok"),
    )
    write(transcript, partial=b'{"usage": not json\n')
    fields = {"session": SESSION, "transcript_path": str(transcript)}
    reply = hook("claude-code", claude_pre("Bash", BASH_TESTS, "toolu_1", **fields), store)
    assert reply.code == 0 and reply.out == {}
    assert "transcript: 1 model usage line(s) skipped (input_tokens)" in reply.err
    assert "transcript: 1 model usage line(s) skipped (not JSON)" in reply.err
    assert _spend(store, SESSION).calls == 1


def test_a_directory_as_transcript_is_said_and_the_call_still_decided(tmp_path: Path) -> None:
    store = tmp_path / "hooks.sqlite3"
    fields = {"session": SESSION, "transcript_path": str(tmp_path)}
    reply = hook("claude-code", claude_pre("Bash", BASH_TESTS, "toolu_1", **fields), store)
    assert reply.code == 0 and reply.out == {}
    assert "not a regular file; no model usage read" in reply.err


# -- the hook with --server: usage through the decision API -------------------------------------


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Any]:
    from .service_tools import require_serve_prerequisites

    require_serve_prerequisites()
    from otel_loopguard.service import ServeOptions, Service

    svc = Service(
        ServeOptions(http_port=0, grpc_port=None, hold_seconds=60.0), guard=LoopGuard(DEFAULT)
    ).start()
    yield svc
    svc.close(timeout=10)


def test_with_server_the_turns_go_to_the_decision_api_once(tmp_path: Path, service: Any) -> None:
    transcript, marks = tmp_path / "session.jsonl", tmp_path / "marks.sqlite3"
    url = f"http://127.0.0.1:{service.http_port}"
    env = clean_env(LOOPGUARD_HOOK_STORE=str(marks))
    fields = {"session": SESSION, "transcript_path": str(transcript)}
    for n in range(3):
        write(transcript, assistant(f"msg_{n}", output=1), assistant(f"msg_{n}", output=50))
        pre = claude_pre("Bash", BASH_TESTS, f"toolu_{n}", **fields)
        reply = hook("claude-code", pre, None, "--server", url, env=env)
        assert reply.code == 0 and reply.err == ""
    # A post-tool event with nothing new sends nothing more.
    post = claude_post("Bash", BASH_TESTS, "toolu_2", BASH_RESULT, **fields)
    assert hook("claude-code", post, None, "--server", url, env=env).code == 0
    spend = service.guard.spend(SESSION)
    assert spend is not None
    assert (spend.calls, spend.output_tokens, spend.loop_turns) == (3, 150, 2)
    assert marks.exists()


def test_with_a_server_down_the_turns_are_sent_at_the_next_call(
    tmp_path: Path, service: Any
) -> None:
    transcript, marks = tmp_path / "session.jsonl", tmp_path / "marks.sqlite3"
    env = clean_env(LOOPGUARD_HOOK_STORE=str(marks))
    fields = {"session": SESSION, "transcript_path": str(transcript)}
    write(transcript, assistant("msg_0"))
    pre = claude_pre("Bash", BASH_TESTS, "toolu_0", **fields)
    down = hook("claude-code", pre, None, "--server", "http://127.0.0.1:9", env=env)
    assert down.code == 0 and down.out == {}
    assert "model usage sent again at the next call" in down.err
    url = f"http://127.0.0.1:{service.http_port}"
    write(transcript, assistant("msg_1"))
    assert hook("claude-code", pre, None, "--server", url, env=env).err == ""
    spend = service.guard.spend(SESSION)
    assert spend is not None and spend.calls == 2


# -- prices kept between hook processes ---------------------------------------------------------


def test_kept_prices_give_genai_prices_own_figures_and_respect_its_tiers(tmp_path: Path) -> None:
    from otel_loopguard.hooks._transcript import KnownPrices, Turn

    known = KnownPrices(tmp_path / "hooks.sqlite3.prices.json")
    small = Turn("msg_a", None, usage_of())
    entries = known.table([small])
    assert [name for name, _ in entries] == [MODEL]
    data = json.loads(known.path.read_text())
    rates = data["models"][f"anthropic\t{MODEL}"]
    # Sonnet 4.5's prices change past 200k input tokens in genai-prices: kept up to there.
    assert rates[4] == 200_000
    table_pricer, database = Pricer(dict(entries)), Pricer()
    for usage in (usage_of(), usage_of(fresh=50_000, cache_read=100_000, output=4000)):
        assert table_pricer.cost(usage).usd == pytest.approx(database.cost(usage).usd, rel=1e-12)
    # A turn past the bound: no entry, so genai-prices itself prices it (its tier).
    big = Turn("msg_b", None, usage_of(fresh=150_000, cache_read=100_000))
    assert known.table([small, big]) == ()
    # Read back from the file, not found again (a file changed by hand shows it).
    rates[0] = 99.0
    known.path.write_text(json.dumps(data))
    assert known.table([small])[0][1].input == 99.0
    known.path.write_text("not json")
    assert [name for name, _ in known.table([small])] == [MODEL]  # found again


def test_the_hook_keeps_prices_and_charges_what_genai_prices_charges(tmp_path: Path) -> None:
    store, transcript = tmp_path / "hooks.sqlite3", tmp_path / "session.jsonl"
    fields = {"session": SESSION, "transcript_path": str(transcript)}
    reference = LoopGuard(DEFAULT)
    for n in range(3):
        write(transcript, assistant(f"msg_{n}", output=100 + n))
        event = claude_pre("Read", {"file_path": f"f{n}"}, f"toolu_{n}", **fields)
        assert hook("claude-code", event, store).err == ""
        reference.model_call(usage_of(output=100 + n), session=SESSION)
    assert (tmp_path / "hooks.sqlite3.prices.json").exists()
    got, want = _spend(store, SESSION), reference.spend(SESSION)
    assert want is not None
    assert got.computed_usd == pytest.approx(want.computed_usd, rel=1e-12)
    assert got.computed_usd > 0


# -- Codex's rollout file ------------------------------------------------------------------------


def token_count(total: int, fresh: int, cached: int, output: int) -> dict[str, Any]:
    """A Codex rollout line with one response's usage (``last_token_usage``), as Codex writes
    it (``codex-rs/protocol``: ``TokenUsageInfo``)."""
    usage = {
        "input_tokens": fresh,
        "cached_input_tokens": cached,
        "output_tokens": output,
        "reasoning_output_tokens": output // 2,
        "total_tokens": fresh + output,
    }
    return {
        "timestamp": "2026-03-14T09:26:56.523Z",
        "type": "event_msg",
        "payload": {
            "type": "token_count",
            "info": {
                "total_token_usage": {**usage, "total_tokens": total},
                "last_token_usage": usage,
                "model_context_window": 272000,
            },
            "rate_limits": {"primary": {"used_percent": 7.0, "window_minutes": 300}},
        },
    }


def test_codex_turns_come_from_token_count_lines_once_each(tmp_path: Path) -> None:
    from otel_loopguard.hooks._transcript import codex_turn

    from .test_hooks import codex

    store, rollout = tmp_path / "hooks.sqlite3", tmp_path / "rollout.jsonl"
    rate_limits_only = token_count(0, 0, 0, 0)
    rate_limits_only["payload"]["info"] = None
    write(
        rollout,
        {"type": "turn_context", "payload": {"model": "gpt-5-codex", "cwd": "/w"}},
        rate_limits_only,
        token_count(5200, 5000, 4000, 200),
        token_count(5200, 5000, 4000, 200),  # written again (a rate-limit update): no new turn
        {"type": "response_item", "payload": {"type": "function_call", "name": "shell"}},
    )
    event = codex(
        "PreToolUse",
        session_id="cx",
        transcript_path=str(rollout),
        tool_name="Bash",
        tool_input={"command": "ls"},
        tool_use_id="call_1",
    )
    assert hook("codex", event, store).err == ""
    write(rollout, token_count(10500, 5100, 5000, 200))
    assert hook("codex", {**event, "tool_use_id": "call_2"}, store).err == ""
    key = json.dumps(["codex", "cx", None], separators=(",", ":"))
    with sqlite3.connect(store) as db:
        (state,) = db.execute("SELECT state FROM sessions WHERE key = ?", (key,)).fetchone()
    spend = SessionState.from_bytes(state, DEFAULT).spend
    assert spend is not None
    assert (spend.calls, spend.input_tokens, spend.cache_read_tokens) == (2, 10100, 9000)
    assert spend.output_tokens == 400 and spend.loop_turns == 1  # `ls` again
    assert spend.computed_usd > 0  # priced as the event's model, gpt-5-codex
    turn = codex_turn(token_count(5200, 5000, 4000, 200))
    assert turn is not None and turn.usage.model is None and turn.usage.provider == "openai"
    with pytest.raises(ValueError, match="total_tokens"):
        codex_turn(
            {
                **token_count(1, 1, 0, 0),
                "payload": {
                    "type": "token_count",
                    "info": {"last_token_usage": {}, "total_token_usage": {"total_tokens": "x"}},
                },
            }
        )


def test_the_kept_prices_file_is_private(tmp_path: Path) -> None:
    from otel_loopguard.hooks._transcript import KnownPrices, Turn

    known = KnownPrices(tmp_path / "p.json")
    assert known.table([Turn("m", None, usage_of())])
    assert known.path.stat().st_mode & 0o777 == 0o600
    assert list(tmp_path.iterdir()) == [known.path]  # no temporary file left
