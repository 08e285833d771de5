"""Replay of recorded traces (span dumps, OTLP JSON lines) gives the span processor's decisions."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import Tracer, TracerProvider

from otel_loopguard import _otlp_json
from otel_loopguard import _traces as traces
from otel_loopguard._conventions import (
    ARGUMENTS_AT_START_CONVENTIONS,
    arguments_available_at_start,
    tool_call_from_span,
)
from otel_loopguard._guard import LoopGuard
from otel_loopguard._policy import Decision
from otel_loopguard.config import PRESETS, Policy
from otel_loopguard.processor import LoopGuardSpanProcessor
from otel_loopguard.replay import (
    CallDecidedAtStart,
    CallObserved,
    OtlpJsonDecoder,
    SpanDumpDecoder,
    _trace_formats,
    detect_format,
    run_replay,
)

from .span_dumps import (
    WITHOUT_ARGUMENTS,
    bare_tool,
    dump_paths,
    load,
    loop_actions,
    rebuild,
)

DEFAULT = PRESETS["default"]
DATA = Path(__file__).parent / "data"
OTLP_SAMPLE = DATA / "otlp_collector_sample.jsonl"

# (tool, action, rule, count) per call, in order, by session label.
Row = tuple[str, str, str | None, int]
Sessions = dict[str, list[Row]]


def _row(tool: str, decision: Decision) -> Row:
    action = decision.action.value
    rule = decision.rule.value if action != "allow" and decision.rule is not None else None
    return (tool, action, rule, decision.count)


# -- the span processor's decisions ------------------------------------------------------------


def processor_sessions(records: list[dict[str, Any]], policy: Policy = DEFAULT) -> Sessions:
    """Rebuild ``records`` through a real TracerProvider with the processor attached and record
    every decision the processor got from the guard, by session label as replay names it."""
    guard = LoopGuard(policy)
    sessions: Sessions = defaultdict(list)
    after, decide = guard.after_tool, guard.decide_at_span_start

    def label(session: str, agent: str | None) -> str:
        return session if agent is None else f"{session}/{agent}"

    def after_tool(tool: str, arguments: object, **kwargs: Any) -> Decision | None:
        decision = after(tool, arguments, **kwargs)
        if decision is not None:
            sessions[label(kwargs["session"], kwargs.get("agent"))].append(_row(tool, decision))
        return decision

    def decide_for_span(
        tool: object, arguments: object, session: str, agent: str | None, call_id: str | None
    ) -> Decision:
        decision = decide(tool, arguments, session, agent, call_id)
        sessions[label(session, agent)].append(_row(str(tool), decision))
        return decision

    guard.after_tool = after_tool  # type: ignore[method-assign]
    guard.decide_at_span_start = decide_for_span  # type: ignore[method-assign]
    provider = TracerProvider()
    provider.add_span_processor(LoopGuardSpanProcessor(guard, tracer_provider=provider))
    rebuild(records, cast(Tracer, provider.get_tracer("fixture")))
    assert guard.internal_errors == {}
    return dict(sessions)


# -- replay's decisions ------------------------------------------------------------------------


def group(rows: Iterable[dict[str, Any]]) -> Sessions:
    sessions: Sessions = defaultdict(list)
    for row in rows:
        assert row["index"] == len(sessions[row["session"]]) + 1
        sessions[row["session"]].append((row["tool"], row["action"], row["rule"], row["count"]))
    return dict(sessions)


def replay_sessions(
    path: Path, format_name: str | None = None, policy: Policy = DEFAULT
) -> Sessions:
    out, err = io.StringIO(), io.StringIO()
    status = run_replay(
        [str(path)], policy, json_output=True, format_name=format_name, stdout=out, stderr=err
    )
    assert (status, err.getvalue()) == (0, "")
    return group(json.loads(line) for line in out.getvalue().splitlines())


def cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}


def cli_sessions(path: Path) -> Sessions:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_loopguard.cli",
            "replay",
            "--preset",
            "default",
            "--json",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert (done.returncode, done.stderr) == (0, "")
    return group(json.loads(line) for line in done.stdout.splitlines())


def same_chains(expected: Sessions, got: Sessions) -> None:
    """The same decisions per session, whatever the sessions are called."""
    assert sorted(got.values()) == sorted(expected.values())


def shape(label: str) -> tuple[bool, str | None]:
    """What a session label says beyond its ids (a rebuilt trace has new ids): whether an agent
    span was found, and the agent's name."""
    trace, _, rest = label.partition("/")
    assert len(trace) == 32
    frame, _, agent = rest.partition("/") if len(rest.partition("/")[0]) == 16 else ("", "", rest)
    return bool(frame), agent or None


def same_sessions(expected: Sessions, got: Sessions) -> None:
    """The same decisions per session, and the same agent frames and names."""
    assert sorted((shape(label), rows) for label, rows in got.items()) == sorted(
        (shape(label), rows) for label, rows in expected.items()
    )


# -- OTLP JSON, as the Collector's file exporter writes it --------------------------------------

_KINDS = {"INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}
_STATUS = {"UNSET": 0, "OK": 1, "ERROR": 2}


def any_value(value: object) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}  # 64-bit integers are decimal strings in OTLP JSON
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [any_value(item) for item in value]}}
    raise TypeError(f"no OTLP value for {value!r}")


def key_values(attributes: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": any_value(value)} for key, value in attributes.items()]


def hex_id(text: str) -> str:
    return text


def base64_id(text: str) -> str:
    return base64.b64encode(bytes.fromhex(text)).decode()


def otlp_span(record: dict[str, Any], ids: Callable[[str], str]) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": ids(record["trace_id"]),
        "spanId": ids(record["span_id"]),
        "parentSpanId": ids(record["parent_span_id"]) if record["parent_span_id"] else "",
        "flags": 0x100,  # the parent context is known to be local
        "name": record["name"],
        "kind": _KINDS[record["kind"]],
        "startTimeUnixNano": str(record["start_time_ns"]),
        "endTimeUnixNano": str(record["end_time_ns"]),
        "attributes": key_values(record["attributes"]),
        "events": [
            {
                "timeUnixNano": str(event["timestamp_ns"]),
                "name": event["name"],
                "attributes": key_values(event["attributes"]),
            }
            for event in record["events"]
        ],
        "status": {},
    }
    code = _STATUS[record["status"]["code"]]
    if code:
        span["status"] = {"code": code, "message": record["status"].get("description") or ""}
    return span


def to_otlp(
    records: list[dict[str, Any]], *, batch: int = 7, ids: Callable[[str], str] = hex_id
) -> list[str]:
    """One ExportTraceServiceRequest line per ``batch`` spans (in the dump's order, the order
    they ended), grouped by scope as the Collector groups them."""
    lines = []
    for start in range(0, len(records), batch):
        scopes: dict[str, list[dict[str, Any]]] = {}
        for record in records[start : start + batch]:
            scopes.setdefault(record["scope"], []).append(otlp_span(record, ids))
        lines.append(
            json.dumps(
                {
                    "resourceSpans": [
                        {
                            "resource": {"attributes": key_values({"service.name": "agent"})},
                            "scopeSpans": [
                                {"scope": {"name": scope, "version": "1.0"}, "spans": spans}
                                for scope, spans in scopes.items()
                            ],
                            "schemaUrl": "",
                        }
                    ]
                }
            )
        )
    return lines


def write_lines(path: Path, lines: Iterable[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def dump_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


# -- every fixture dump: replay == processor ---------------------------------------------------


@pytest.mark.parametrize("path", dump_paths(), ids=dump_id)
def test_span_dump_replay_gives_the_processors_decisions(path: Path) -> None:
    records = load(path)
    expected = processor_sessions(records)
    got = replay_sessions(path)
    same_chains(expected, got)
    assert got == cli_sessions(path)
    assert detect_format(records).name == "span-dump"
    # The loop is there to be found (the comparison is not between two empty reports).
    calls = [row for rows in got.values() for row in rows]
    tools = [bare_tool(path, tool) for tool, *_ in calls]
    assert tools.count("get_weather") == (0 if dump_id(path) in WITHOUT_ARGUMENTS else 1)
    assert loop_actions(path) <= {action for _, action, _, _ in calls}
    if path.parent.name == "pydantic_ai":
        # The same agent frames too. Elsewhere the processor sees no agent frame while the tools
        # run: OpenInference marks the LangGraph agent span an agent only when it ends, and the
        # rebuild gives Strands' and OpenLLMetry's agent spans their attributes only at end (the
        # dumps do not say when in between they were set). Replay sees the finished trace.
        same_sessions(expected, got)


@pytest.mark.parametrize("path", dump_paths(), ids=dump_id)
def test_otlp_replay_gives_the_processors_decisions(path: Path, tmp_path: Path) -> None:
    records = load(path)
    expected = processor_sessions(records)
    hex_lines = write_lines(tmp_path / "traces.jsonl", to_otlp(records))
    assert detect_format([json.loads(hex_lines.read_text().splitlines()[0])]).name == "otlp-json"
    got = replay_sessions(hex_lines)
    same_chains(expected, got)
    assert got == cli_sessions(hex_lines)
    # protobuf's own JSON (base64 ids), the whole trace in one request
    b64 = write_lines(tmp_path / "b64.jsonl", to_otlp(records, batch=len(records), ids=base64_id))
    assert replay_sessions(b64) == got
    # one span per request, the format forced
    single = write_lines(tmp_path / "single.jsonl", to_otlp(records, batch=1))
    assert replay_sessions(single, "otlp-json") == got


@pytest.mark.parametrize(
    "path", [p for p in dump_paths() if dump_id(p) in WITHOUT_ARGUMENTS], ids=dump_id
)
def test_tool_spans_without_arguments_count_by_tool_name_when_the_policy_says_so(
    path: Path, tmp_path: Path
) -> None:
    # AutoGen, the MCP SDK's server spans, Semantic Kernel without its sensitive setting: the
    # calls are skipped by default (the test above) and counted as calls without arguments with
    # count_calls_without_arguments, so the identical searches are one signature.
    policy = DEFAULT.replace(count_calls_without_arguments=True)
    got = replay_sessions(path, policy=policy)
    otlp = write_lines(tmp_path / "traces.jsonl", to_otlp(load(path)))
    assert replay_sessions(otlp, policy=policy) == got
    same_chains(processor_sessions(load(path), policy), got)
    (rows,) = got.values()
    tools = [bare_tool(path, tool) for tool, *_ in rows]
    if dump_id(path) == "autogen/spans_blocked.jsonl":  # the blocked calls left no span
        assert tools == ["search", "search", "get_weather"]
        return
    assert tools == ["search"] * 6 + ["get_weather", "search"]
    searches = [(action, rule, count) for tool, action, rule, count in rows if "search" in tool]
    if "blocked" in path.name:
        # The MCP middleware's blocks are error results without text on the span: identical
        # failures, so the run is stopped after the third (and stays stopped).
        assert [action for action, *_ in searches[:3]] == ["allow", "allow", "remind"]
        assert ("stop", "no_progress", DEFAULT.failure_stop_threshold) in searches
        assert searches[-1][0] == "stop"
        return
    assert [count for _, _, count in searches] == [0, 2, 3, 4, 5, 6, 7]
    # No result on the span either: a repeat without a known result is denied at deny_threshold.
    deny = DEFAULT.deny_threshold
    assert deny is not None
    assert "deny" not in [action for action, *_ in searches[: deny - 1]]
    assert searches[deny - 1][0] == "deny"


def test_processor_and_replay_agree_on_which_spans_decide_at_start() -> None:
    # OTLP does not say what a span carried at start; replay decides at start for the
    # conventions whose spans start with their arguments. The dumps record both: check them.
    seen = set()
    for path in dump_paths():
        for record in load(path):
            events = [(e["name"], e["attributes"]) for e in record["events"]]
            call = tool_call_from_span(record["name"], record["attributes"], events, False)
            if call is None:
                continue
            at_start = arguments_available_at_start(
                record["name_at_start"], record["attributes_at_start"]
            )
            assert at_start == (call.convention in ARGUMENTS_AT_START_CONVENTIONS), (
                dump_id(path),
                call.convention,
            )
            seen.add((call.convention, at_start))
    assert {at_start for _, at_start in seen} == {True, False}


# -- synthetic traces: sub-agents, overlapping calls, several traces ---------------------------

T0 = 1_767_225_600_000_000_000
MS = 1_000_000


class TraceBuilder:
    """Span-dump records of hand-made traces (in the order spans end)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._next = 1

    def _id(self) -> str:
        self._next += 1
        return f"{self._next:016x}"

    def span(
        self,
        trace: str,
        name: str,
        start: int,
        end: int,
        *,
        parent: str | None = None,
        attributes: dict[str, Any] | None = None,
        at_start: dict[str, Any] | None = None,
        events: list[dict[str, Any]] | None = None,
        error: bool = False,
        span_id: str | None = None,
    ) -> str:
        span_id = span_id or self._id()
        final = dict(at_start or {})
        final.update(attributes or {})
        self.records.append(
            {
                "name": name,
                "kind": "INTERNAL",
                "trace_id": trace,
                "span_id": span_id,
                "parent_span_id": parent,
                "scope": "synthetic",
                "start_time_ns": T0 + start * MS,
                "end_time_ns": T0 + end * MS,
                "attributes": final,
                "events": events or [],
                "status": {"code": "ERROR" if error else "UNSET", "description": None},
                "name_at_start": name,
                "attributes_at_start": dict(at_start or {}),
            }
        )
        return span_id

    def ordered(self) -> list[dict[str, Any]]:
        return sorted(self.records, key=lambda r: r["end_time_ns"])


def agent_attributes(name: str) -> dict[str, Any]:
    return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}


def pydantic_tool(tool: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id,
        "logfire.msg": f"running tool: {tool}",
        "gen_ai.tool.call.arguments": json.dumps(arguments),
    }


def genai_tool(tool: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.call.arguments": json.dumps(arguments),
        "gen_ai.tool.call.result": "same result",
    }


def synthetic_traces() -> list[dict[str, Any]]:
    """Two traces. The first: a parent agent and a sub-agent, each looping on the same call;
    the parent's calls start with their arguments (decided at start) and overlap in pairs (a
    call starts before the previous one ended); the sub-agent's get them at end. The second
    trace repeats the same call, but is another chain."""
    b = TraceBuilder()
    first, second = "1" * 32, "2" * 32
    root = b.span(first, "invoke_agent planner", 0, 1000, at_start=agent_attributes("planner"))
    sub = b.span(
        first,
        "invoke_agent researcher",
        500,
        900,
        parent=root,
        at_start=agent_attributes("researcher"),
    )
    for n in range(8):
        start = 10 + 50 * n
        b.span(
            first,
            "execute_tool search",
            start,
            start + 70,
            parent=root,
            at_start=pydantic_tool("search", {"q": "x"}, f"p{n}"),
            attributes={"gen_ai.tool.call.result": "nothing"},
            error=n == 3,
        )
    for n in range(7):
        start = 510 + 50 * n
        b.span(
            first,
            "execute_tool search",
            start,
            start + 20,
            parent=sub,
            attributes=genai_tool("search", {"q": "x"}, f"s{n}"),
        )
    other = b.span(second, "invoke_agent planner", 0, 600, at_start=agent_attributes("planner"))
    for n in range(6):
        b.span(
            second,
            "execute_tool fetch",
            10 + 60 * n,
            40 + 60 * n,
            parent=other,
            attributes=genai_tool("fetch", {"url": "u"}, f"f{n}"),
        )
    return b.ordered()


def test_sub_agents_overlapping_calls_and_traces_match_the_processor(tmp_path: Path) -> None:
    records = synthetic_traces()
    expected = processor_sessions(records)
    assert len(expected) == 3
    dump = write_lines(tmp_path / "spans.jsonl", (json.dumps(r) for r in records))
    same_sessions(expected, replay_sessions(dump))
    otlp = write_lines(tmp_path / "otlp.jsonl", to_otlp(records, batch=5))
    same_sessions(expected, replay_sessions(otlp))
    assert sorted(shape(label) for label in expected) == [
        (True, "planner"),
        (True, "planner"),
        (True, "researcher"),
    ]
    assert any(action != "allow" for rows in expected.values() for _, action, _, _ in rows)


def test_span_dump_events_in_the_processors_order() -> None:
    """A call decided at start comes out at its start, its end (outcome only) at its end."""
    decoder = SpanDumpDecoder()
    events = [event for record in synthetic_traces() for event in decoder.decode(record)]
    events += list(decoder.finish())
    calls = [e for e in events if isinstance(e, (CallDecidedAtStart, CallObserved))]
    assert len(calls) == len(events)
    planner = [e for e in calls if e.session.startswith("1" * 32) and e.agent == "planner"]
    kinds = [(type(e).__name__, e.call_id) for e in planner]
    assert kinds[:4] == [
        ("CallDecidedAtStart", "p0"),
        ("CallDecidedAtStart", "p1"),
        ("CallObserved", "p0"),
        ("CallDecidedAtStart", "p2"),
    ]
    assert [e.timestamp for e in planner] == sorted(e.timestamp or 0 for e in planner)


def test_a_remote_parent_is_not_an_agent_frame(tmp_path: Path) -> None:
    b = TraceBuilder()
    trace = "3" * 32
    root = b.span(trace, "invoke_agent planner", 0, 100, at_start=agent_attributes("planner"))
    b.span(
        trace,
        "execute_tool fetch",
        10,
        20,
        parent=root,
        attributes=genai_tool("fetch", {"url": "u"}, "c1"),
    )
    lines = to_otlp(b.ordered(), batch=10)
    request = json.loads(lines[0])
    spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
    local = replay_sessions(write_lines(tmp_path / "local.jsonl", [json.dumps(request)]))
    assert list(local) == [f"{trace}/{root}/planner"]
    spans[0]["flags"] = 0x300  # the tool span's parent is in another process
    remote = replay_sessions(write_lines(tmp_path / "remote.jsonl", [json.dumps(request)]))
    assert list(remote) == [trace]


def test_otlp_values_of_every_type_are_read() -> None:
    decoder = OtlpJsonDecoder()
    attributes = [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
        {"key": "gen_ai.tool.name", "value": {"stringValue": "t"}},
        {"key": "gen_ai.tool.call.arguments", "value": {"stringValue": '{"a": 1}'}},
        {"key": "n", "value": {"intValue": "9007199254740993"}},
        {"key": "d", "value": {"doubleValue": "NaN"}},
        {"key": "b", "value": {"boolValue": False}},
        {"key": "raw", "value": {"bytesValue": base64.b64encode(b"\x00\xff").decode()}},
        {"key": "list", "value": {"arrayValue": {"values": [{"intValue": 1}, {}]}}},
        {
            "key": "map",
            "value": {"kvlistValue": {"values": [{"key": "k", "value": {"stringValue": "v"}}]}},
        },
        {"key": "empty", "value": {}},
    ]
    record = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "a" * 32,
                                "spanId": "b" * 16,
                                "startTimeUnixNano": 5,
                                "endTimeUnixNano": "7",
                                "attributes": attributes,
                                "status": {"code": "STATUS_CODE_ERROR"},
                            }
                        ]
                    }
                ]
            }
        ]
    }
    events = list(decoder.decode(record))
    assert len(events) == 1 and isinstance(events[0], CallObserved)
    call = events[0]
    assert (call.tool, call.arguments, call.error, call.session) == ("t", {"a": 1}, True, "a" * 32)
    buffer = traces.TraceBuffer()
    span = _otlp_json._otlp_span(record["resourceSpans"][0]["scopeSpans"][0]["spans"][0])
    buffer.add(span)
    assert span.attributes["n"] == 9007199254740993 and span.attributes["b"] is False
    assert span.attributes["raw"] == b"\x00\xff" and span.attributes["list"] == (1, None)
    assert span.attributes["map"] == {"k": "v"} and "empty" not in span.attributes
    assert span.attributes["d"] != span.attributes["d"]  # NaN


# -- the recorded Collector sample (in tests/data) ------------------------------------------------


def test_collector_file_exporter_sample() -> None:
    """A hand-made file-exporter output: a metrics line, hex and base64 ids, two requests."""
    out = io.StringIO()
    err = io.StringIO()
    assert run_replay([str(OTLP_SAMPLE)], DEFAULT, json_output=True, stdout=out, stderr=err) == 0
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    session = "5b8efff798038103d269b633813fc60c/eee19b7ec3c1b174/planner"
    assert rows == [
        {
            "session": session,
            "index": n,
            "tool": "search",
            "action": action,
            "rule": rule,
            "count": count,
        }
        for n, (action, rule, count) in enumerate(
            [
                ("allow", None, 0),
                ("allow", None, 2),
                ("remind", "consecutive", 3),
                ("deny", "no_progress", 4),
            ],
            start=1,
        )
    ]
    assert err.getvalue() == ""


# -- bad input ---------------------------------------------------------------------------------


def _request(*spans: object) -> str:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]})


def _otlp_tool(span_id: str = "c" * 16, **changes: Any) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": "d" * 32,
        "spanId": span_id,
        "parentSpanId": "",
        "name": "execute_tool t",
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "gen_ai.tool.call.arguments", "value": {"stringValue": "{}"}},
        ],
    }
    span.update(changes)
    return {k: v for k, v in span.items() if v is not None}


def _dump_tool(span_id: str = "c" * 16, **changes: Any) -> str:
    record: dict[str, Any] = {
        "name": "execute_tool t",
        "kind": "INTERNAL",
        "trace_id": "d" * 32,
        "span_id": span_id,
        "parent_span_id": None,
        "start_time_ns": 1,
        "end_time_ns": 2,
        "attributes": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.arguments": "{}"},
        "events": [],
        "status": {"code": "UNSET"},
    }
    record.update(changes)
    return json.dumps({k: v for k, v in record.items() if v != "-"})


OTLP_BAD = [
    (_request(_otlp_tool(traceId="abc")), "'traceId' must be 16 bytes"),
    (_request(_otlp_tool(spanId="c" * 15)), "'spanId' must be 8 bytes"),
    (_request(_otlp_tool(spanId=base64.b64encode(b"123456789").decode())), "'spanId' must be 8"),
    (_request(_otlp_tool(parentSpanId="e" * 18)), "'parentSpanId' must be 8 bytes"),
    (_request(_otlp_tool(traceId="0" * 32)), "'traceId' is all zeros"),
    (_request(_otlp_tool(traceId=None)), "missing field 'traceId'"),
    (_request(_otlp_tool(endTimeUnixNano=None)), "missing field 'endTimeUnixNano'"),
    (_request(_otlp_tool(startTimeUnixNano="soon")), "'startTimeUnixNano' must be an integer"),
    (_request(_otlp_tool(attributes={"a": 1})), "attributes must be a list"),
    (_request(_otlp_tool(attributes=[{"value": {}}])), "attribute 'key' must be a string"),
    (
        _request(_otlp_tool(attributes=[{"key": "a", "value": {"intValue": "1.5"}}])),
        "intValue must be an integer",
    ),
    (
        _request(_otlp_tool(attributes=[{"key": "a", "value": {"bytesValue": "%%"}}])),
        "bytesValue must be base64",
    ),
    (_request(_otlp_tool(events={"name": "x"})), "'events' must be a list"),
    (_request(_otlp_tool(name=7)), "'name' must be a string"),
    (_request("span"), "a span must be an object"),
    (json.dumps({"resourceSpans": {"a": 1}}), "resourceSpans must be a list"),
    (json.dumps({"resourceSpans": [{"scopeSpans": 3}]}), "scopeSpans must be a list"),
    (json.dumps({"traces": []}), "missing field 'resourceSpans'"),
    (json.dumps([1, 2]), "expected a JSON object"),
]

DUMP_BAD = [
    (_dump_tool(span_id="c" * 20), "'span_id' must be 8 bytes: 16 hex digits, got"),
    (_dump_tool(trace_id=base64.b64encode(b"x" * 16).decode()), "'trace_id' must be 16 bytes"),
    (_dump_tool(parent_span_id="zz" * 8), "'parent_span_id' must be 8 bytes"),
    (_dump_tool(start_time_ns="-"), "missing field 'start_time_ns'"),
    (_dump_tool(end_time_ns=-1), "'end_time_ns' must be an integer of nanoseconds >= 0 (64 bits)"),
    (_dump_tool(attributes=[["gen_ai.tool.name", "t"]]), "'attributes' must be an object"),
    (_dump_tool(attributes_at_start="x"), "'attributes_at_start' must be an object"),
    (_dump_tool(events=[{"attributes": {}}]), "missing field 'name'"),
    (_dump_tool(status="ERROR"), "'status' must be an object"),
]


@pytest.mark.parametrize(
    ("line", "reason"), OTLP_BAD + DUMP_BAD, ids=[r for _, r in OTLP_BAD + DUMP_BAD]
)
def test_bad_records_are_bad_lines_naming_file_and_line(
    line: str, reason: str, tmp_path: Path
) -> None:
    otlp = line in dict(OTLP_BAD)
    good = _request(_otlp_tool("f" * 16)) if otlp else _dump_tool("f" * 16)
    path = write_lines(tmp_path / "in.jsonl", [good, line, good.replace("f" * 16, "e" * 16)])
    out, err = io.StringIO(), io.StringIO()
    status = run_replay(
        [str(path)],
        DEFAULT,
        json_output=True,
        format_name="otlp-json" if otlp else "span-dump",
        stdout=out,
        stderr=err,
    )
    assert status == 1
    lines = err.getvalue().splitlines()
    assert lines[0].startswith(f"{path}:2: ") and reason in lines[0], lines
    assert "Traceback" not in err.getvalue()
    assert len(out.getvalue().splitlines()) == 2  # the good lines around it still count


def test_bad_input_through_the_cli_exits_1_without_a_traceback(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "traces.jsonl",
        [
            _request(_otlp_tool("f" * 16)),
            _request(_otlp_tool(spanId="c" * 10), _otlp_tool("e" * 16)),
            "{not json",
        ],
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_loopguard.cli",
            "replay",
            "--preset",
            "default",
            "--json",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert done.returncode == 1
    assert f"{path}:2: resourceSpans[0].scopeSpans[0].spans[0]: 'spanId' must be 8 bytes" in (
        done.stderr
    )
    assert f"{path}:3: not valid JSON" in done.stderr and "Traceback" not in done.stderr
    assert [json.loads(line)["index"] for line in done.stdout.splitlines()] == [1, 2]


def test_a_line_with_many_bad_spans_names_a_few_and_counts_the_rest(tmp_path: Path) -> None:
    bad = [_otlp_tool(spanId=str(n)) for n in range(6)]
    path = write_lines(tmp_path / "t.jsonl", [_request(*bad, _otlp_tool())])
    out, err = io.StringIO(), io.StringIO()
    assert run_replay([str(path)], DEFAULT, json_output=True, stdout=out, stderr=err) == 1
    assert err.getvalue().count(f"{path}:1:") == 1 and "and 3 more bad spans" in err.getvalue()
    assert len(out.getvalue().splitlines()) == 1


def test_other_signals_carry_no_calls(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            json.dumps({"resourceMetrics": []}),
            json.dumps({"resourceLogs": []}),
            _request(_otlp_tool()),
        ],
    )
    out, err = io.StringIO(), io.StringIO()
    assert run_replay([str(path)], DEFAULT, json_output=True, stdout=out, stderr=err) == 0
    assert len(out.getvalue().splitlines()) == 1 and err.getvalue() == ""


def test_buffer_overflow_replays_early_and_reports_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_trace_formats, "MAX_BUFFERED_SPANS", 5)
    # Spans of a trace whose root never comes (it is in another process).
    lines = [
        _dump_tool(f"{n + 1:016x}", parent_span_id="a" * 16, start_time_ns=n, end_time_ns=n + 1)
        for n in range(8)
    ]
    path = write_lines(tmp_path / "t.jsonl", lines)
    out, err = io.StringIO(), io.StringIO()
    assert run_replay([str(path)], DEFAULT, json_output=True, stdout=out, stderr=err) == 1
    assert f"{path}:6: more than 5 spans of unfinished traces buffered: 1 trace replayed" in (
        err.getvalue()
    )
    assert len(out.getvalue().splitlines()) == 8  # nothing lost: replayed early, not dropped


def test_duplicate_spans_count_once(tmp_path: Path) -> None:
    child = _request(_otlp_tool("e" * 16, parentSpanId="a" * 16))
    path = write_lines(tmp_path / "t.jsonl", [child, child, _request(_otlp_tool("a" * 16))])
    assert sum(len(rows) for rows in replay_sessions(path).values()) == 2


def test_sniffing_tells_the_formats_apart() -> None:
    otlp = json.loads(_request(_otlp_tool()))
    dump = json.loads(_dump_tool())
    assert detect_format([otlp]).name == "otlp-json"
    assert detect_format([{"resourceMetrics": []}]).name == "otlp-json"
    assert detect_format([dump]).name == "span-dump"
    assert detect_format([{"session": "s", "tool": "t"}]).name == "transcript"
    assert detect_format([{"type": "user", "sessionId": "S", "message": {}}]).name == "claude-code"
    assert not _trace_formats._claims_span_dump({"session": "s", "tool": "t", "arguments": {}})
    assert not _trace_formats._claims_otlp_json({"type": "user", "sessionId": "S"})


# -- nothing crashes ---------------------------------------------------------------------------

_IDS = (
    st.sampled_from(
        ["a" * 32, "b" * 16, "", "0" * 16, "xyz", base64.b64encode(b"12345678").decode()]
    )
    | st.text(max_size=4)
    | st.integers()
    | st.none()
)
_SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=6) | st.floats()
_ANY = st.recursive(
    st.fixed_dictionaries(
        {},
        optional={
            "stringValue": _SCALARS,
            "intValue": _SCALARS,
            "doubleValue": _SCALARS,
            "boolValue": _SCALARS,
            "bytesValue": _SCALARS,
        },
    ),
    lambda inner: st.fixed_dictionaries(
        {},
        optional={
            "arrayValue": st.fixed_dictionaries(
                {}, optional={"values": st.lists(inner, max_size=3)}
            ),
            "kvlistValue": st.fixed_dictionaries(
                {},
                optional={
                    "values": st.lists(
                        st.fixed_dictionaries({"key": st.text(max_size=3), "value": inner}),
                        max_size=3,
                    )
                },
            ),
        },
    ),
    max_leaves=6,
)
_KVS = (
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "key": st.sampled_from(
                    [
                        "gen_ai.operation.name",
                        "gen_ai.tool.name",
                        "gen_ai.tool.call.arguments",
                        "logfire.msg",
                        "x",
                    ]
                )
                | st.integers(),
                "value": _ANY | _SCALARS,
            },
        ),
        max_size=4,
    )
    | _SCALARS
)
_SPANS = (
    st.fixed_dictionaries(
        {},
        optional={
            "traceId": _IDS,
            "spanId": _IDS,
            "parentSpanId": _IDS,
            "flags": _SCALARS,
            "name": st.sampled_from(["execute_tool t", "running tool", "invoke_agent a"])
            | _SCALARS,
            "startTimeUnixNano": _SCALARS,
            "endTimeUnixNano": _SCALARS,
            "attributes": _KVS,
            "events": st.lists(
                st.fixed_dictionaries({}, optional={"name": _SCALARS, "attributes": _KVS}),
                max_size=2,
            )
            | _SCALARS,
            "status": st.fixed_dictionaries({}, optional={"code": _SCALARS}) | _SCALARS,
        },
    )
    | _SCALARS
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(st.lists(_SPANS, max_size=4), max_size=4),
    forced=st.sampled_from([None, "otlp-json", "span-dump"]),
)
def test_any_trace_input_gives_a_report_never_an_exception(
    requests: list[list[Any]], forced: str | None
) -> None:
    lines = [_request(*spans) for spans in requests] + [json.dumps(s) for r in requests for s in r]
    data = "".join(line + "\n" for line in lines).encode()
    out = io.StringIO()
    status = run_replay(
        ["-"],
        DEFAULT,
        json_output=True,
        format_name=forced,
        stdin=io.BytesIO(data),
        stdout=out,
        stderr=io.StringIO(),
    )
    assert status in (0, 1)
    for row in out.getvalue().splitlines():
        assert list(json.loads(row)) == ["session", "index", "tool", "action", "rule", "count"]


def test_replay_keys_recorded_traces_by_conversation(tmp_path: Path) -> None:
    """Every call in its own trace, one conversation: by trace nothing repeats, by
    conversation the loop is found (as the processor and serve keyed by conversation find it)."""
    lines = []
    for n in range(6):
        lines.append(
            json.dumps(
                {
                    "name": "execute_tool search",
                    "kind": "INTERNAL",
                    "trace_id": f"{n + 1:032x}",
                    "span_id": f"{n + 1:016x}",
                    "parent_span_id": None,
                    "scope": "t",
                    "start_time_ns": 1_000 * n + 1,
                    "end_time_ns": 1_000 * n + 2,
                    "attributes": {
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "search",
                        "gen_ai.tool.call.arguments": '{"q": "x"}',
                        "gen_ai.tool.call.result": "none",
                        "gen_ai.conversation.id": "conv-9",
                    },
                    "events": [],
                    "status": {"code": "UNSET", "description": None},
                    "name_at_start": "execute_tool search",
                    "attributes_at_start": {},
                }
            )
        )
    path = tmp_path / "spans.jsonl"
    path.write_text("\n".join(lines) + "\n")
    by_trace, by_conversation = io.StringIO(), io.StringIO()
    assert (
        run_replay(
            [str(path)], PRESETS["default"], json_output=True, stdout=by_trace, stderr=io.StringIO()
        )
        == 0
    )
    assert (
        run_replay(
            [str(path)],
            PRESETS["default"],
            json_output=True,
            stdout=by_conversation,
            stderr=io.StringIO(),
            key_by="conversation",
        )
        == 0
    )
    trace_rows = [json.loads(line) for line in by_trace.getvalue().splitlines()]
    conversation_rows = [json.loads(line) for line in by_conversation.getvalue().splitlines()]
    assert {row["action"] for row in trace_rows} == {"allow"}
    assert [row["session"] for row in conversation_rows] == ["conv-9"] * 6
    stuck = PRESETS["default"].no_progress_threshold
    assert stuck is not None
    assert conversation_rows[stuck - 1]["action"] == "deny"
