"""The MCP Python SDK (2.x): a server middleware that asks the guard before each tool runs.

::

    from mcp.server.mcpserver import MCPServer
    from otel_loopguard.integrations.mcp import LoopGuardMiddleware

    server = MCPServer("weather", middleware=[LoopGuardMiddleware(guard)])

The SDK's ``ServerMiddleware`` sees every request before the handler; for a ``tools/call`` the
middleware asks the guard with the tool name and the client's arguments. A blocked call is
answered with an error result (``CallToolResult(is_error=True)``, the message as its text)
without running the tool: the client, and the model behind it, reads the message as the tool
result. After a call the result is reported (``isError`` is the outcome) and a reminder is added
to the result as one more text block. The server cannot end the client's run: a stop is answered
like a denial, with the stop text (which tells the model to end the run), and the guard keeps
denying the call until a new run. A stop the guard concludes from a call's result (``phase``
post, e.g. the same call failing the same way again) adds the stop text to that result.

Sessions: the server sees no conversation, and no model call id. The SDK's client puts the W3C
trace context of the current span in each request's ``_meta``: the agent run's trace is then the
session (unless ``session=`` is given), and with ``processor=`` (on the provider the server's
spans go to) the middleware asks with the processor's keys, which are that trace's: when the
host's agent span is on that provider too (host and server in one process), that trace and the
host's agent, the keys the processor gives the server's ``tools/call`` span (its parent, the
client's span, comes from ``_meta``), so the two are one chain. A request
without trace context (a client without tracing, or another SDK) is grouped by its connection:
``session=``, else the HTTP transport's ``mcp-session-id``, else one session for the process (a
stdio server has one client); such a session sees no new run, so a host that keeps one
connection across conversations should send its trace context or pass ``session=``. No call id
is given to the guard (the JSON-RPC request id is the wire's, numbered per connection, not the
model's): a call is matched to its result by its arguments.

The SDK's spans carry no arguments, so they report nothing to the processor unless
``capture_content=True`` puts the arguments and the result on the ``tools/call`` span
(``gen_ai.tool.call.arguments``, ``gen_ai.tool.call.result``: opt-in GenAI attributes, they may
hold secrets; only for a request with trace context, whose span belongs to the agent run); then
the span reports each call too, after the middleware (the span ends last), and each call counts
once. The middleware runs on the server's event loop and never raises.

The client side has no hook in the SDK: a host asks the guard itself before ``call_tool``
(:meth:`~otel_loopguard.LoopGuard.before_tool`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import propagate, trace

from .._guard import LoopGuard
from .._policy import Decision
from ._hook import DEFAULT_SESSION, Ticket, ToolHook, missing_framework

try:
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from mcp_types import CallToolResult, TextContent
except ImportError as exc:  # pragma: no cover - exercised by tests/integrations/test_imports.py
    raise missing_framework("mcp", "the MCP Python SDK (2.x)", "mcp") from exc

if TYPE_CHECKING:
    from ..processor import LoopGuardSpanProcessor

__all__ = ["LoopGuardMiddleware"]

TOOLS_CALL: Final = "tools/call"
#: The streamable HTTP transport's session header.
_SESSION_HEADER: Final = "mcp-session-id"
#: GenAI semantic-convention keys set with ``capture_content`` (opt-in attributes).
_ARGUMENTS_KEY: Final = "gen_ai.tool.call.arguments"
_RESULT_KEY: Final = "gen_ai.tool.call.result"


def _client_trace(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The trace the client's request belongs to (its agent run), from the W3C trace context
    the SDK's client puts in the request's ``_meta``; ``None`` when it sent none."""
    meta = ctx.meta
    if not isinstance(meta, Mapping) or not meta:
        return None
    context = trace.get_current_span(propagate.extract(meta)).get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None


def _transport_session(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The streamable HTTP transport's session id, when the request came with one."""
    headers = getattr(getattr(ctx, "request", None), "headers", None)
    session = headers.get(_SESSION_HEADER) if isinstance(headers, Mapping) else None
    return f"mcp:{session}" if isinstance(session, str) and session else None


def _result_text(result: HandlerResult) -> tuple[str | None, bool | None]:
    """The text blocks of a ``tools/call`` result joined, and whether it is an error (None:
    not a tool result)."""
    if isinstance(result, CallToolResult):
        error: object = result.is_error
        texts = [block.text for block in result.content if isinstance(block, TextContent)]
    elif isinstance(result, dict):
        blocks = result.get("content")
        error = result.get("isError", result.get("is_error"))
        texts = [
            block["text"]
            for block in (blocks if isinstance(blocks, list) else ())
            if isinstance(block, dict) and isinstance(block.get("text"), str)
        ]
    else:
        return None, None
    return ("\n".join(texts) if texts else None), bool(error)


def _with_text(result: HandlerResult, text: str) -> HandlerResult:
    """``result`` with one more text block."""
    if isinstance(result, CallToolResult):
        block = TextContent(type="text", text=text)
        return result.model_copy(update={"content": [*result.content, block]})
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        return {**result, "content": [*result["content"], {"type": "text", "text": text}]}
    return result


class LoopGuardMiddleware:
    """A ``ServerMiddleware`` for ``MCPServer(middleware=[...])`` (or ``server.middleware``)
    that enforces the guard's decisions on ``tools/call`` requests and passes everything else
    through. Options as in :mod:`otel_loopguard.integrations` (no ``on_stop``: see the module),
    plus ``capture_content``."""

    def __init__(
        self,
        guard: LoopGuard | None = None,
        *,
        processor: LoopGuardSpanProcessor | None = None,
        session: str | Callable[[], str] | None = None,
        agent: str | None = None,
        append_reminders: bool = True,
        capture_content: bool = False,
    ) -> None:
        # a server cannot end its client's run: a stop is answered as a message
        self.hook = ToolHook(
            guard,
            processor=processor,
            session=session,
            agent=agent,
            append_reminders=append_reminders,
            on_stop="message",
        )
        self.guard = self.hook.guard
        self.capture_content = bool(capture_content)
        self._session = session
        self._agent = agent

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        params = ctx.params
        if ctx.method != TOOLS_CALL or not params or not isinstance(params.get("name"), str):
            return await call_next(ctx)
        ticket = self._before(ctx, params["name"], params.get("arguments") or {})
        if ticket is None:
            return await call_next(ctx)
        decision = ticket.decision
        if decision.blocks:
            return CallToolResult(
                content=[TextContent(type="text", text=decision.message)], is_error=True
            )
        try:
            result = await call_next(ctx)
        except Exception as error:
            self.hook.after(ticket, result=str(error), error=True)
            raise
        return self._after(ticket, result)

    def _before(
        self, ctx: ServerRequestContext[Any, Any], tool: str, arguments: object
    ) -> Ticket | None:
        """Ask the guard (never raises: ``None`` lets the call through unjudged)."""
        try:
            client_trace = _client_trace(ctx)
            if client_trace is None:
                # No agent run to key by: the server span is a trace of its own (the processor's
                # key would be one session per request), so the connection is the session and
                # the span gets no content (it would be counted again, alone in its trace).
                session = self._session_option() or _transport_session(ctx) or DEFAULT_SESSION
                return self.hook.before(tool, arguments, None, (session, self._agent))
            span = trace.get_current_span()
            if self.capture_content and span.is_recording():
                span.set_attribute(_ARGUMENTS_KEY, json.dumps(arguments, default=str))
            return self.hook.before(tool, arguments, None, self.hook.keys(client_trace))
        except Exception as exc:
            self.guard.report_internal_error("integration.mcp.before", exc)
            return None

    def _session_option(self) -> str | None:
        session = self._session
        try:
            return session() if callable(session) else session
        except Exception as exc:
            self.guard.report_internal_error("integration.session", exc)
            return None

    def _after(self, ticket: Ticket, result: HandlerResult) -> HandlerResult:
        try:
            text, error = _result_text(result)
            span = trace.get_current_span()
            if self.capture_content and text is not None and span.is_recording():
                if _ARGUMENTS_KEY in (getattr(span, "attributes", None) or {}):
                    span.set_attribute(_RESULT_KEY, text)
            post: Decision | None = self.hook.after(ticket, result=text, error=error)
            reminder = self.hook.reminder(ticket, post)
            return result if reminder is None else _with_text(result, reminder)
        except Exception as exc:
            self.guard.report_internal_error("integration.mcp.after", exc)
            return result
