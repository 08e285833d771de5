"""Sessions in Redis through the other entrances (issue 25, item 3, in process): the span
processor of two processes on one Redis counts one conversation as one process does, and a
call reported by one process's hook and another's span counts once."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from otel_loopguard import PRESETS, LoopGuard, Mode
from otel_loopguard.processor import LoopGuardSpanProcessor

from .redis_tools import RedisServer, redis_server
from .test_processor_keys import strands_tool

__all__ = ["redis_server"]  # the fixture, used by name

OBSERVE = PRESETS["default"].replace(mode=Mode.OBSERVE, store_timeout_seconds=5.0)


def process(url: str) -> tuple[LoopGuard, trace.Tracer]:
    """One agent process: its own guard (on Redis) and tracer provider with the processor."""
    guard = LoopGuard(OBSERVE, store=url)
    provider = TracerProvider()
    provider.add_span_processor(
        LoopGuardSpanProcessor(guard, key_by="conversation", tracer_provider=provider)
    )
    return guard, provider.get_tracer("t")


def total(guard: LoopGuard, session: str) -> int:
    state = guard.export_session(session)
    assert state is not None
    return sum(signature.count for signature in state.signatures.values())


def test_spans_of_one_conversation_in_two_processes_count_as_one(
    redis_server: RedisServer,
) -> None:
    (a, tracer_a), (b, tracer_b) = process(redis_server.url), process(redis_server.url)
    conversation: dict[str, Any] = {"gen_ai.conversation.id": "conv-1"}
    for n in range(9):
        strands_tool(tracer_a if n % 3 else tracer_b, "search", {"q": "x"}, f"c{n}", **conversation)
    assert total(a, "conv-1") == 9 and total(b, "conv-1") == 9
    assert a.store_errors == {} and b.store_errors == {}


def test_a_hook_in_one_process_and_a_span_in_another_count_one_call_once(
    redis_server: RedisServer,
) -> None:
    (hooks, _), (_, tracer) = process(redis_server.url), process(redis_server.url)
    conversation: dict[str, Any] = {"gen_ai.conversation.id": "conv-2"}
    for n in range(4):
        hooks.before_tool("search", {"q": "x"}, session="conv-2", call_id=f"c{n}")
        strands_tool(tracer, "search", {"q": "x"}, f"c{n}", **conversation)
    for n in range(4, 6):  # calls only the spans show
        strands_tool(tracer, "search", {"q": "x"}, f"c{n}", **conversation)
    # Shared: 4 calls reported twice and 2 once (not 10, counted twice; not 4, unshared).
    assert total(hooks, "conv-2") == 6
