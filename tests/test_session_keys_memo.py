"""session_for formats each (trace, agent span) key once (issue 29 item 3): the text is the same
as formatting it every time, and the memo stays bounded."""

from __future__ import annotations

from otel_loopguard import _spans
from otel_loopguard._conventions import SpanAgent, SpanModelCall
from otel_loopguard._spans import AgentFrame, KeyBy, session_for

CALL = SpanModelCall("m", None, 1, 1, 0, 0, None, None, "own-label", None, "genai")


def test_session_text_is_the_formatted_ids_and_the_memo_is_bounded() -> None:
    agent = SpanAgent(agent_id=None, agent_name="researcher", conversation_id=None)
    count = _spans._MAX_SESSIONS + 50
    for n in range(count):
        trace_id = (n * 0x9E3779B97F4A7C15) % 2**128 or 1
        frame = AgentFrame(n * 7 + 1, agent) if n % 2 else None
        for _ in range(2):  # the second answer comes from the memo
            session, label = session_for(CALL, trace_id, frame, KeyBy.TRACE)
            expected = f"{trace_id:032x}" + (f"/{frame.span_id:016x}" if frame else "")
            assert session == expected
            assert label == ("researcher" if frame else "own-label")
        assert len(_spans._SESSIONS) <= _spans._MAX_SESSIONS


def test_keyed_by_conversation_the_memo_is_not_asked() -> None:
    call = SpanModelCall("m", None, 1, 1, 0, 0, None, None, None, "conv-1", "genai")
    assert session_for(call, 5, None, KeyBy.CONVERSATION) == ("conv-1", None)
