"""collector/otelcol-filter.yaml: the ``filter`` processor that keeps from serve the spans that
cannot change a decision. No Collector runs here: its OTTL condition is parsed and evaluated in
Python (the subset it uses), on every recorded span dump of tests/data/spans and on the same
dumps with the HTTP and database client spans a real service adds under its model and tool
spans; each dump is replayed through serve's trace buffer and a guard with and without the
spans it drops, and the events and decisions must be the same. The condition's list of what
marks a tool, agent or model span is checked against the conventions tables."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_loopguard import LoopGuard
from otel_loopguard import _conventions as conventions
from otel_loopguard._otlp_json import RecordedSpan
from otel_loopguard._spans import KeyBy
from otel_loopguard._trace_events import feed
from otel_loopguard._traces import TraceBuffer

from .span_dumps import dump_id, dump_paths, load

try:
    import yaml
except ImportError:  # pragma: no cover - the test extra installs it
    if os.environ.get("CI"):
        raise
    pytest.skip("PyYAML is not installed", allow_module_level=True)

CONFIG = Path(__file__).resolve().parents[1] / "collector" / "otelcol-filter.yaml"

Record = dict[str, Any]


# -- the OTTL subset the condition uses ---------------------------------------------------------

_TOKEN = re.compile(
    r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*")|(?P<op>==|!=)|(?P<punct>[()\[\],])'
    r"|(?P<hex>0x[0-9a-fA-F]+)|(?P<word>[A-Za-z_][A-Za-z0-9_]*))"
)


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    at = 0
    text = text.strip()
    while at < len(text):
        match = _TOKEN.match(text, at)
        assert match is not None, f"not in the OTTL subset read here: {text[at : at + 40]!r}"
        tokens.append(match.group(match.lastgroup or "word"))
        at = match.end()
    return tokens


Node = tuple[Any, ...]


class _Parser:
    """``or``/``and``/``not``, parentheses, ``IsMatch(name, "re")`` and comparisons of
    ``name``, ``kind``, ``parent_span_id`` or ``attributes["key"]`` with a string, ``nil``, a
    ``SPAN_KIND_*`` constant or ``SpanID(0x...)``."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.at = 0

    def parse(self) -> Node:
        node = self.either()
        assert self.at == len(self.tokens), self.tokens[self.at :]
        return node

    def take(self, expected: str | None = None) -> str:
        token = self.tokens[self.at]
        assert expected is None or token == expected, (token, expected)
        self.at += 1
        return token

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def either(self) -> Node:
        nodes = [self.both()]
        while self.peek() == "or":
            self.take()
            nodes.append(self.both())
        return nodes[0] if len(nodes) == 1 else ("or", *nodes)

    def both(self) -> Node:
        nodes = [self.negated()]
        while self.peek() == "and":
            self.take()
            nodes.append(self.negated())
        return nodes[0] if len(nodes) == 1 else ("and", *nodes)

    def negated(self) -> Node:
        if self.peek() == "not":
            self.take()
            return ("not", self.negated())
        return self.primary()

    def primary(self) -> Node:
        token = self.take()
        if token == "(":
            node = self.either()
            self.take(")")
            return node
        if token == "IsMatch":
            self.take("(")
            self.take("name")
            self.take(",")
            pattern = self.string(self.take())
            self.take(")")
            return ("match", pattern)
        if token == "attributes":
            self.take("[")
            path: tuple[str, ...] = ("attribute", self.string(self.take()))
            self.take("]")
        else:
            assert token in ("name", "kind", "parent_span_id"), token
            path = (token,)
        op = self.take()
        assert op in ("==", "!="), op
        value = self.take()
        literal: str | None
        if value == "nil":
            literal = None
        elif value.startswith("SPAN_KIND_"):
            literal = value
        elif value == "SpanID":  # the id's 16 hex digits, as dumps write it
            self.take("(")
            digits = self.take()
            self.take(")")
            assert re.fullmatch(r"0x[0-9a-fA-F]{16}", digits), digits
            literal = digits[2:].lower()
        else:
            literal = self.string(value)
        return ("compare", path, op, literal)

    @staticmethod
    def string(token: str) -> str:
        assert token.startswith('"') and token.endswith('"'), token
        return re.sub(r"\\(.)", r"\1", token[1:-1])


def evaluate(node: Node, span: Record) -> bool:
    """``node`` on a dumped span (``name``, ``kind``, ``parent_span_id``, ``attributes``), as
    OTTL's span context reads it."""
    kind = node[0]
    if kind == "or":
        return any(evaluate(child, span) for child in node[1:])
    if kind == "and":
        return all(evaluate(child, span) for child in node[1:])
    if kind == "not":
        return not evaluate(node[1], span)
    if kind == "match":
        return re.search(node[1], span["name"]) is not None
    _, path, op, literal = node
    if path[0] == "attribute":
        value = span["attributes"].get(path[1])
    elif path[0] == "kind":
        value = f"SPAN_KIND_{span['kind']}"
    elif path[0] == "parent_span_id":  # no parent: the empty (all-zero) id
        value = (span["parent_span_id"] or "0" * 16).lower()
    else:
        value = span["name"]
    if literal is None:
        equal = value is None
    else:  # a string compared with a value of another type is not equal
        equal = isinstance(value, str) and value == literal
    return equal if op == "==" else not equal


def conditions() -> list[str]:
    config = yaml.safe_load(CONFIG.read_text())
    spans = config["processors"]["filter/loopguard"]["traces"]["span"]
    assert isinstance(spans, list) and spans
    return [str(condition) for condition in spans]


def dropped_by(condition_nodes: list[Node]) -> Callable[[Record], bool]:
    """The filter: a span is dropped when any condition holds (the processor ORs them)."""
    return lambda span: any(evaluate(node, span) for node in condition_nodes)


FILTER = dropped_by([_Parser(text).parse() for text in conditions()])


# -- what the conventions tables mark ------------------------------------------------------------


def table_marks() -> tuple[set[str], set[str], set[str]]:
    """The span names, name prefixes and attribute keys of every gate of the tool and agent
    tables (the first condition of each entry, which every span of it passes), and the keys of
    a model call's usage: what the filter must never drop."""
    names: set[str] = set()
    prefixes: set[str] = set()
    keys: set[str] = set(conventions.MODEL_SPAN_KEYS)
    on = conventions.On
    entries: list[conventions.ToolConvention | conventions.AgentConvention] = [
        *conventions.TOOL_CONVENTIONS,
        *conventions.AGENT_CONVENTIONS,
    ]
    for entry in entries:
        gate = entry.when[0]
        if gate.on is on.SPAN_NAME:
            names.update(gate.keys)
        elif gate.on is on.SPAN_NAME_PREFIX:
            prefixes.update(gate.keys)
        else:
            assert gate.on is on.ATTRIBUTE, entry
            keys.update(gate.keys)
    return names, prefixes, keys


def _walk(node: Node) -> Iterator[Node]:
    yield node
    if node[0] in ("or", "and", "not"):
        for child in node[1:]:
            yield from _walk(child)


def test_the_condition_keeps_every_mark_of_the_tables() -> None:
    """The ``not (...)`` clause names exactly the tables' gate names, prefixes and attribute
    keys and the model-usage keys, each as something the span has (a change to the tables
    fails here until the file follows)."""
    (text,) = conditions()
    node = _Parser(text).parse()
    assert node[0] == "and"
    (kept,) = [child[1] for child in node[1:] if child[0] == "not" and child[1][0] == "or"]
    names = {n[3] for n in _walk(kept) if n[0] == "compare" and n[1] == ("name",)}
    patterns = {n[1] for n in _walk(kept) if n[0] == "match"}
    keys = {
        n[1][1]
        for n in _walk(kept)
        if n[0] == "compare" and n[1][0] == "attribute" and n[2:] == ("!=", None)
    }
    want_names, want_prefixes, want_keys = table_marks()
    assert all(re.escape(prefix) == prefix.replace(" ", "\\ ") for prefix in want_prefixes)
    assert names == want_names
    assert patterns == {f"^{prefix}" for prefix in want_prefixes}
    assert keys == want_keys
    assert ("compare", ("parent_span_id",), "!=", "0" * 16) in node[1:]  # roots are kept


def test_the_condition_drops_http_and_database_client_spans_only() -> None:
    def span(kind: str, parent: str = "ab", **attributes: object) -> Record:
        return {"name": "x", "kind": kind, "parent_span_id": parent, "attributes": attributes}

    assert FILTER(span("CLIENT", **{"http.request.method": "GET"}))
    assert FILTER(span("CLIENT", **{"http.method": "POST"}))
    assert FILTER(span("CLIENT", **{"db.system.name": "postgresql"}))
    assert FILTER(span("CLIENT", **{"db.system": "redis"}))
    assert not FILTER(span("CLIENT", "", **{"http.request.method": "GET"}))  # a root
    assert not FILTER(span("SERVER", **{"http.request.method": "GET"}))
    assert not FILTER(span("INTERNAL", **{"db.system.name": "sqlite"}))
    assert not FILTER(span("CLIENT", **{"mcp.method.name": "tools/call"}))  # MCP's client span
    for marks in (
        {"gen_ai.operation.name": "chat"},
        {"gen_ai.usage.input_tokens": 12},
        {"openinference.span.kind": "LLM"},
    ):
        assert not FILTER(span("CLIENT", **{"http.request.method": "POST"}, **marks))
    assert not FILTER(
        {
            "name": "execute_tool fetch",
            "kind": "CLIENT",
            "parent_span_id": "ab",
            "attributes": {"http.request.method": "GET"},
        }
    )


# -- replaying the dumps with and without what it drops ------------------------------------------


def _plain(value: object) -> object:
    return tuple(_plain(item) for item in value) if isinstance(value, list) else value


def _attributes(raw: dict[str, Any]) -> dict[str, object]:
    return {key: _plain(value) for key, value in raw.items() if value is not None}


def recorded(record: Record) -> RecordedSpan:
    """A dumped span as serve decodes it from OTLP (final name and attributes only)."""
    parent = record["parent_span_id"]
    return RecordedSpan(
        int(record["trace_id"], 16),
        int(record["span_id"], 16),
        int(parent, 16) if parent else None,
        record["name"],
        _attributes(record["attributes"]),
        tuple((e["name"], _attributes(e["attributes"])) for e in record["events"]),
        record["status"]["code"] == "ERROR",
        record["start_time_ns"],
        record["end_time_ns"],
    )


def replay(records: list[Record], key_by: KeyBy) -> list[tuple[object, ...]]:
    """Every event serve's trace buffer gives for ``records`` (received one by one, in the
    order they ended), and the guard's decision on it."""
    guard = LoopGuard()
    buffer = TraceBuffer(key_by=key_by)
    seen: list[tuple[object, ...]] = []

    def judge(events: list[Any]) -> None:
        for event in events:
            decision = feed(guard, event)
            said = (
                None
                if decision is None
                else (decision.action, decision.detected, decision.rule, decision.count)
            )
            seen.append((event, said))

    for record in records:
        buffer.add(recorded(record))
        judge(buffer.take_ready())
    judge(buffer.finish())
    return seen


def _is_call(record: Record) -> tuple[bool, bool]:
    """(tool span, model span) as the conventions read the dumped span."""
    attributes = _attributes(record["attributes"])
    events = tuple((e["name"], _attributes(e["attributes"])) for e in record["events"])
    error = record["status"]["code"] == "ERROR"
    tool = conventions.tool_call_from_span(record["name"], attributes, events, error) is not None
    model = conventions.model_call_from_span(record["name"], attributes) is not None
    return tool, model


def _leaf(parent: Record, n: int, name: str, attributes: dict[str, object]) -> Record:
    start, end = parent["start_time_ns"], parent["end_time_ns"]
    step = max((end - start) // 16, 1)
    return {
        "name": name,
        "kind": "CLIENT",
        "trace_id": parent["trace_id"],
        "span_id": f"{(int(parent['span_id'], 16) * 31 + n + 1) % 2**64 or 1:016x}",
        "parent_span_id": parent["span_id"],
        "scope": "bench",
        "start_time_ns": start + n * step,
        "end_time_ns": min(start + (n + 1) * step, end),
        "attributes": attributes,
        "events": [],
        "status": {"code": "UNSET"},
    }


def with_service_spans(records: list[Record]) -> list[Record]:
    """The dump as a real service would export it: under each model span its HTTP POST to
    the model's API, under each tool span a Redis GET, four PostgreSQL queries and two HTTP
    GETs (bench_serve.py's "mixed" workload), each ending before its parent."""
    http: dict[str, object] = {
        "http.request.method": "POST",
        "url.full": "https://api.example/v1/chat",
    }
    http_get: dict[str, object] = {
        "http.request.method": "GET",
        "url.full": "https://search.internal/q",
    }
    postgres: dict[str, object] = {
        "db.system.name": "postgresql",
        "db.query.text": "SELECT 1",
        "server.port": 5432,
    }
    redis: dict[str, object] = {"db.system": "redis", "db.statement": "GET k"}
    out: list[Record] = []
    for record in records:
        tool, model = _is_call(record)
        leaves: list[tuple[str, dict[str, object]]] = []
        if model:
            leaves.append(("POST", http))
        if tool:
            leaves += [("GET cache", redis)] + [("SELECT documents", postgres)] * 4
            leaves += [("GET", http_get)] * 2
        out += [_leaf(record, n, name, attrs) for n, (name, attrs) in enumerate(leaves)]
        out.append(record)
    return out


def _ids(path: Path) -> str:
    return dump_id(path)


@pytest.mark.parametrize("key_by", [KeyBy.TRACE, KeyBy.CONVERSATION])
@pytest.mark.parametrize("path", dump_paths(), ids=_ids)
def test_no_decision_changes_on_the_recorded_dumps(path: Path, key_by: KeyBy) -> None:
    records = load(path)
    kept = [record for record in records if not FILTER(record)]
    baseline = replay(records, key_by)
    assert baseline, "a dump that gives no event compares nothing"
    assert replay(kept, key_by) == baseline

    served = with_service_spans(records)
    original = {record["span_id"] for record in records}
    added = [record for record in served if record["span_id"] not in original]
    assert len(added) == len(served) - len(records) > 0  # new span ids ...
    assert len({record["span_id"] for record in added}) == len(added)  # ... none repeated
    assert all(FILTER(record) for record in added)
    served_kept = [record for record in served if not FILTER(record)]
    assert replay(served_kept, key_by) == baseline
    assert replay(served, key_by) == baseline


def test_a_filter_that_drops_the_parents_too_would_change_decisions() -> None:
    """The replay sees ancestry: keeping only the spans with a mark of the tables (and the
    roots) changes the events of Haystack's and Semantic Kernel's dumps (a tool span's parent
    is a span without one, so it no longer finds its agent), which is why the filter keeps
    every span it cannot tell is a leaf."""
    names, prefixes, keys = table_marks()

    def marked(record: Record) -> bool:
        attributes = record["attributes"]
        return (
            not record["parent_span_id"]
            or record["name"] in names
            or record["name"].startswith(tuple(prefixes))
            or any(attributes.get(key) is not None for key in keys)
        )

    changed = [
        dump_id(path)
        for path in dump_paths()
        if replay([r for r in load(path) if marked(r)], KeyBy.TRACE)
        != replay(load(path), KeyBy.TRACE)
    ]
    assert {"haystack/spans.jsonl", "semantic_kernel/spans.jsonl"} <= set(changed)


def dropped_shares() -> dict[str, tuple[float, float]]:
    """Per dump: the share of its spans the filter drops, as recorded and with the service's
    HTTP and database spans (for collector/README.md)."""
    shares = {}
    for path in dump_paths():
        records = load(path)
        served = with_service_spans(records)
        shares[dump_id(path)] = (
            sum(map(FILTER, records)) / len(records),
            sum(map(FILTER, served)) / len(served),
        )
    return shares


def test_dropped_shares_are_the_readmes() -> None:
    """collector/README.md's table of what the filter drops is this test's figures."""
    readme = (CONFIG.parent / "README.md").read_text()
    for dump, (recorded_share, served_share) in dropped_shares().items():
        row = f"| `{dump}` | {recorded_share:.0%} | {served_share:.0%} |"
        assert row in readme, row
