"""Framework adapters: the guard in each agent framework's own pre-tool hook.

One thin module per framework, each imported only when asked for (``import otel_loopguard`` never
imports a framework); importing one without its framework raises :class:`ImportError` naming the
extra to install:

=================================================  ===============================================
module                                             hook, and how a blocked call reaches the model
=================================================  ===============================================
:mod:`otel_loopguard.integrations.pydantic_ai`      capability: ``before_tool_execute`` raises
                                                   ``SkipToolExecution(message)``
:mod:`otel_loopguard.integrations.openai_agents`    tool input guardrail on every function tool:
                                                   ``reject_content(message)``
:mod:`otel_loopguard.integrations.langgraph`        ``ToolNode(wrap_tool_call=, awrap_tool_call=)``:
                                                   ``ToolMessage(status="error")``, tool not run
:mod:`otel_loopguard.integrations.strands`          ``HookProvider`` on ``BeforeToolCallEvent``:
                                                   ``event.cancel_tool = message``
:mod:`otel_loopguard.integrations.google_adk`       ``before_tool_callback`` returns
                                                   ``{"error": message}``
:mod:`otel_loopguard.integrations.smolagents`       ``guard_agent(agent)`` wraps its
                                                   ``execute_tool_call``: the message is the
                                                   observation
:mod:`otel_loopguard.integrations.llama_index`      ``guard_class(FunctionAgent)``: its
                                                   ``call_tool`` step answers an error
                                                   ``ToolOutput``
:mod:`otel_loopguard.integrations.haystack`         ``Agent(hooks=LoopGuardHooks(guard).hooks())``:
                                                   the call is rejected as Haystack's own
                                                   confirmation hook rejects one
:mod:`otel_loopguard.integrations.mcp`              ``MCPServer(middleware=[LoopGuardMiddleware])``
                                                   answers an error result
:mod:`otel_loopguard.integrations.crewai`           global before/after tool-call hooks; the after
                                                   hook puts the message in the result
:mod:`otel_loopguard.integrations.semantic_kernel`  ``AUTO_FUNCTION_INVOCATION`` filter sets
                                                   ``context.function_result``
:mod:`otel_loopguard.integrations.agno`             ``Agent(tool_hooks=[LoopGuardToolHook])``
                                                   returns the message instead of calling
:mod:`otel_loopguard.integrations.autogen`          ``LoopGuardWorkbench`` (a ``StaticWorkbench``):
                                                   ``call_tool`` answers an error ``ToolResult``
=================================================  ===============================================

Every adapter takes the same options: ``guard`` (default: the processor's guard, else a new one),
``processor`` (a :class:`~otel_loopguard.processor.LoopGuardSpanProcessor` on the provider the
framework's spans go to: the adapter then asks with the processor's session keys, so a call the
hook and the span both report counts once), ``session`` (a string or a callable returning one,
used when no span gives the keys; default: the framework's own run, thread or conversation id),
``append_reminders`` (add reminder texts to the tool result the model reads) and ``on_stop``
(``"end"``: end the run the framework's way; ``"message"``: answer a stop like a denial).

A stop can also come after a call ran, from its result (``phase`` post: the same call failing
the same way ``failure_stop_threshold`` times): the after-call hook then ends the run as a stop
before a call does (with ``on_stop="message"``, the stop text is added to the result instead).
"""

from __future__ import annotations

__all__: list[str] = []
