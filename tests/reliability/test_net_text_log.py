"""Issue 23, item 8: the text log escapes control characters in every field.

Round two: ``\\n``, ``\\r``, ANSI escapes and NUL in session ids and tool names passed raw into
the text log, so a client could write a line of its own (``... INFO otel_loopguard.serve: api
decision: allow session=FORGED`` appeared). Now the text formatter escapes every control
character (C0, DEL, C1, U+2028/U+2029) in the whole line, and a decision's field with a space,
``=`` or ``"`` in it is written as a JSON string.

A real ``serve`` process; its stderr is read line by line (universal newlines, so a raw ``\\r``
would split a line too).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.service_tools import ServeProcess, request, require_serve_prerequisites, wait_for

require_serve_prerequisites()

pytestmark = pytest.mark.slow

_FORGED = "\n2026-01-01 00:00:00,000 INFO otel_loopguard.serve: api decision: allow session=FORGED"
_LINE_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ otel_loopguard")


@pytest.mark.parametrize(
    "field",
    ["session", "tool", "agent"],
)
def test_forged_lines_in_decision_fields_stay_inside_their_own_line(field: str) -> None:
    hostile = {
        "session": "s",
        "tool": "grep",
        "agent": "coder",
        field: f"x{_FORGED}\r\x1b[2K\x1b]0;title\x07\x00\x7f\x85\u2028\u2029 tail",
    }
    server = ServeProcess("--log-level", "debug")
    try:
        for n in range(6):
            body = json.dumps({**hostile, "arguments": {"q": 1}, "call_id": f"c{n}"}).encode()
            answer = request(
                server.port,
                "POST",
                "/v1/decisions/before",
                body,
                {"Content-Type": "application/json"},
            )
            assert answer.status == 200, answer.body
        assert wait_for(lambda: sum("api decision:" in line for line in server.lines) >= 6, 10)
    finally:
        assert server.stop(30) == 0
        server.close()
    lines = [line.rstrip("\n") for line in server.lines]
    decided = [line for line in lines if "api decision:" in line]
    print(decided[-1])
    assert len(decided) == 6
    for line in lines:
        assert _LINE_START.match(line) or line.startswith("    "), repr(line)
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in line), repr(line)
        assert "\u2028" not in line and "\u2029" not in line
    for line in decided:
        assert line.count(" api decision: ") == 2  # ours, and the forged one inside a value
        # escaped: by the value's JSON quoting (\u001b), else by the formatter (\x85, \u2028)
        assert "\\n2026-01-01" in line and "\\u001b[2K" in line and "\\u0000" in line
        assert "\\x85" in line and "\\u2028" in line
        assert f'{field}="x' in line  # quoted: the value cannot pass for further fields
