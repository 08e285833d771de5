"""``replay`` shows what model calls cost (issue 24, item 6): each session's spend (tokens, cost
and where the cost came from), its spend in loops and the estimate of what a stop avoided, in the
text, JSON and HTML reports; read from the corpus's line format, tool-call transcripts, Claude
Code sessions and recorded traces. Sessions whose input reports no usage show nothing new."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard import PRESETS, LoopGuard
from otel_loopguard._prices import ModelUsage, Pricer
from otel_loopguard.replay import detect_format, run_replay

DATA = Path(__file__).parent / "data"
CORPUS = DATA / "corpus"
PROVIDER_RUN = CORPUS / "mini__pydata__xarray-6721.jsonl"  # OpenRouter's cost on every turn
TOKENS_RUN = CORPUS / "mini__django__django-13012.jsonl"  # tokens only
DEFAULT = PRESETS["default"]


def replay(paths: list[Path], *args: str, **options: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_replay(
        [str(p) for p in paths], DEFAULT, stdout=out, stderr=err, progress=False, **options
    )
    return status, out.getvalue(), err.getvalue()


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def session_of(path: Path) -> str:
    return str(lines_of(path)[0]["source"])


def spends(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """Each session's ``spend`` in ``--summary --json``."""
    status, out, err = replay(paths, summary=True, json_output=True)
    assert status == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    return {row["session"]: row["spend"] for row in rows if "spend" in row}


# -- the corpus's line format ------------------------------------------------------------------


def test_the_corpus_format_is_detected_and_every_call_replayed() -> None:
    assert detect_format(lines_of(PROVIDER_RUN)).name == "corpus"
    status, out, err = replay([PROVIDER_RUN], json_output=True)
    assert status == 0 and err == ""
    calls = [json.loads(line) for line in out.splitlines()]
    recorded = [r for r in lines_of(PROVIDER_RUN) if r.get("type") != "user_message"]
    assert [c["index"] for c in calls] == list(range(1, len(recorded) + 1))
    assert {c["session"] for c in calls} == {session_of(PROVIDER_RUN)}


def test_the_providers_cost_is_the_sessions_cost_with_its_source() -> None:
    spend = spends([PROVIDER_RUN])[session_of(PROVIDER_RUN)]
    usages = [r["usage"] for r in lines_of(PROVIDER_RUN) if r.get("usage")]
    assert spend["model_calls"] == len(usages)
    assert spend["tokens"] == sum(u["input_tokens"] + u["output_tokens"] for u in usages)
    assert spend["cache_read_tokens"] == sum(u["cache_read_input_tokens"] for u in usages)
    assert spend["cost_usd"] == pytest.approx(sum(u["reported_cost_usd"] for u in usages))
    assert spend["cost_source"] == "provider" and spend["computed_usd"] == 0
    # Two of its calls repeat one of their epoch: the turns that asked for them are loop spend.
    assert spend["loop"]["turns"] == 2 and 0 < spend["loop"]["tokens"] < spend["tokens"]
    assert spend["avoided_estimate"] == {"tokens": 0, "cost_usd": 0.0, "refused_calls": 0}


def test_without_the_providers_figure_the_cost_is_computed_at_api_prices() -> None:
    spend = spends([TOKENS_RUN])[session_of(TOKENS_RUN)]
    pricer = Pricer()
    want = 0.0
    for record in lines_of(TOKENS_RUN):
        usage = record.get("usage")
        if usage:
            cost = pricer.cost(
                ModelUsage.checked(
                    usage["model"],
                    input_tokens=usage["input_tokens"],
                    output_tokens=usage["output_tokens"],
                    cache_read_tokens=usage["cache_read_input_tokens"],
                )
            )
            assert cost.usd is not None
            want += cost.usd
    assert spend["cost_source"] == "computed" and spend["provider_usd"] == 0
    assert spend["cost_usd"] == pytest.approx(want) and want > 0
    _, text, _ = replay([TOKENS_RUN])
    assert f"about ${want:,.2f} at API prices" in text


def test_the_text_report_gives_spend_loop_spend_and_totals() -> None:
    status, text, _ = replay([PROVIDER_RUN, TOKENS_RUN])
    assert status == 0
    block = text.split(f"session {session_of(PROVIDER_RUN)}\n", 1)[1].split("\n\n", 1)[0]
    assert (
        "  spend: 33 model calls, 512,137 tokens (501,429 input, 419,252 of them cache reads;"
        in block
    )
    assert "reported by the provider" in block
    assert "  in loops: 2 turns, 42,342 tokens, $0.01 (4% of the cost)" in block
    total = text.splitlines()[-1]
    assert total.startswith("spend: 59 model calls, 741,440 tokens, $0.58 ($0.38 reported by")
    assert "about $0.21 at API prices); in loops 42,342 tokens, $0.01" in total


def test_summary_lines_carry_the_spend() -> None:
    _, text, _ = replay([PROVIDER_RUN], summary=True)
    assert "; spend 512,137 tokens, $0.38 reported by the provider, in loops 42,342 tokens" in text
    _, out, _ = replay([PROVIDER_RUN], summary=True, json_output=True)
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert row["spend"]["model_calls"] == 33 and row["spend"]["cost_source"] == "provider"


# -- a loop, a stop and the estimate ------------------------------------------------------------


def _looping_transcript(path: Path, turns: int) -> list[dict[str, Any]]:
    usage = {"model": "gpt-4o-mini", "input_tokens": 1000, "output_tokens": 50}
    records = [
        {
            "session": "loop",
            "tool": "grep",
            "arguments": {"pattern": "TODO"},
            "error": False,
            "result": "no match",
            "usage": {**usage, "input_tokens": 1000 + n},
        }
        for n in range(turns)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_a_stopped_loop_shows_its_spend_and_the_avoided_estimate(tmp_path: Path) -> None:
    path = tmp_path / "loop.jsonl"
    records = _looping_transcript(path, 12)
    reference = LoopGuard(DEFAULT)  # the hook API, as a live host would have fed it
    for record in records:
        reference.model_call(record["usage"], session="loop")
        decision = reference.before_tool("grep", record["arguments"], session="loop")
        reference.after_tool(
            "grep", record["arguments"], session="loop", error=False, result="no match"
        )
    assert decision.action.value == "stop"
    want = reference.spend("loop")
    assert want is not None and want.refused_after_stop > 0
    tokens, usd = want.avoided()
    assert tokens > 0 and usd > 0

    spend = spends([path])["loop"]
    assert spend["loop"] == {
        "turns": want.loop_turns,
        "tokens": want.loop_tokens,
        "cost_usd": pytest.approx(want.loop_usd),
    }
    assert spend["avoided_estimate"] == {
        "tokens": tokens,
        "cost_usd": pytest.approx(usd),
        "refused_calls": want.refused_after_stop,
    }
    _, text, _ = replay([path])
    assert f"a stop avoided about {tokens:,} tokens" in text
    assert "(an estimate: the loop's mean per turn x" in text
    assert "stops avoided about" in text.splitlines()[-1]
    assert "(an estimate)" in text.splitlines()[-1]


def test_the_html_report_shows_spend_and_the_estimate(tmp_path: Path) -> None:
    path = tmp_path / "loop.jsonl"
    _looping_transcript(path, 12)
    html = tmp_path / "report.html"
    replay([path, PROVIDER_RUN], html_path=str(html))
    page = html.read_text()
    assert "Spend: 12 model calls" in page and "Spend: 33 model calls" in page
    assert "In loops: " in page and "a stop avoided about" in page and "an estimate" in page
    assert "reported by the provider" in page and "at API prices" in page


# -- input without usage: nothing new ----------------------------------------------------------


def test_sessions_without_usage_show_no_cost(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl"
    path.write_text(
        "".join(
            json.dumps({"session": "s", "tool": "grep", "arguments": {"q": n % 2}}) + "\n"
            for n in range(8)
        )
    )
    _, text, _ = replay([path])
    assert "spend" not in text and "$" not in text
    _, summary, _ = replay([path], summary=True, json_output=True)
    assert "spend" not in json.loads(summary)
    html = tmp_path / "plain.html"
    replay([path], html_path=str(html))
    assert "Spend" not in html.read_text()


# -- bad usage ---------------------------------------------------------------------------------


def test_bad_usage_is_a_counted_skip_and_the_call_is_still_replayed(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = {"model": "gpt-4o-mini", "input_tokens": 10, "output_tokens": 5}
    rows = [
        {"session": "s", "tool": "ls", "arguments": {}, "usage": "lots"},
        {"session": "s", "tool": "ls", "arguments": {"a": 1}, "usage": {**good, "model": 7}},
        {
            "session": "s",
            "tool": "ls",
            "arguments": {"a": 2},
            "usage": {**good, "input_tokens": -3},
        },
        {
            "session": "s",
            "tool": "ls",
            "arguments": {"a": 3},
            "usage": {**good, "output_tokens": "x"},
        },
        {"session": "s", "tool": "ls", "arguments": {"a": 4}, "usage": good},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    status, text, err = replay([path])
    assert status == 1  # the lines whose usage is not an object of the right shape
    assert f"{path}:1: 'usage' must be an object" in err
    assert f"{path}:2: 'usage.model' must be a string" in err
    assert "  5 calls, 0 repeated" in text  # every call still replayed
    assert "spend: 1 model call, 15 tokens" in text
    assert (
        "2 model calls not counted: their usage did not read (input_tokens 1, output_tokens 1)"
        in text
    )


# -- Claude Code sessions ----------------------------------------------------------------------


def _claude_line(message_id: str, output: int, content: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "assistant",
        "sessionId": "cc",
        "isSidechain": False,
        "timestamp": "2026-03-14T09:26:56.523Z",
        "message": {
            "model": "claude-sonnet-4-5-20250929",
            "id": message_id,
            "role": "assistant",
            "content": [content],
            "usage": {
                "input_tokens": 4,
                "cache_creation_input_tokens": 300,
                "cache_read_input_tokens": 18000,
                "output_tokens": output,
            },
        },
    }


def test_claude_code_responses_are_charged_once_with_their_last_lines_counts(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cc.jsonl"
    records: list[dict[str, Any]] = []
    for n in range(4):
        use = {"type": "tool_use", "id": f"toolu_{n}", "name": "Bash", "input": {"command": "ls"}}
        records += [
            _claude_line(f"msg_{n}", 1, {"type": "text", "text": "Running it."}),
            _claude_line(f"msg_{n}", 1, use),
            _claude_line(f"msg_{n}", 80 + n, use),  # the final counts
            {
                "type": "user",
                "sessionId": "cc",
                "message": {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": "a b"}
                    ],
                },
            },
        ]
    records.append(_claude_line("msg_0", 999, {"type": "text", "text": "again"}))  # resumed
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    status, out, err = replay([path], json_output=True)
    assert status == 0, err
    assert len(out.splitlines()) == 4  # the calls' lines: usage adds none
    spend = spends([path])["cc"]
    assert spend["model_calls"] == 4
    assert spend["output_tokens"] == sum(80 + n for n in range(4))
    assert spend["input_tokens"] == 4 * 18304 and spend["cache_write_tokens"] == 4 * 300
    # Each turn is charged before the call it asked for: the three repeats are loop spend.
    assert spend["loop"]["turns"] == 3
    assert spend["cost_source"] == "computed"


def test_the_claude_code_sample_reports_its_sessions_spend() -> None:
    found = spends([DATA / "claude_code_session.jsonl"])
    assert len(found) == 2  # the main agent and its sub-agent
    assert all(s["model_calls"] > 0 and s["cost_source"] == "computed" for s in found.values())


# -- recorded traces ---------------------------------------------------------------------------


def test_a_trace_with_model_spans_reports_the_spend_the_processor_charged() -> None:
    dump = DATA / "spans" / "pydantic_ai" / "spans.jsonl"
    found = spends([dump])
    assert found, "the pydantic-ai dump's model spans report usage"
    spend = next(iter(found.values()))
    assert spend["model_calls"] > 0 and spend["tokens"] > 0
    assert spend["loop"]["turns"] > 0  # its identical searches
