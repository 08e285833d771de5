"""``@otel_loopguard.enforce``: a tool function that obeys the decision made for its call from
spans alone.

With :class:`~otel_loopguard.processor.LoopGuardSpanProcessor` on the provider, the decision for
a tool call is made before the tool runs: at its span's start when the span carries the
arguments (Pydantic AI), else at the end of the model span that requested the call (issue 27).
Inside the tool's span, :func:`~otel_loopguard.processor.current_decision` returns it; this
decorator acts on it, with one line per tool and no framework adapter::

    @otel_loopguard.enforce
    def search(query: str) -> str: ...

A blocking decision raises :class:`~otel_loopguard.LoopDetected` (``on_block="raise"``, the
default) or returns its message as the tool's result (``on_block="return"``); a reminder is
appended to a string result (``append_reminders``). Without a decision (no span, no processor,
a call the model's request did not announce) the tool runs as is. The call is counted by the
spans, never here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar, cast, overload

from ._policy import Action, Decision, LoopDetected

__all__ = ["enforce"]

F = TypeVar("F", bound=Callable[..., Any])


def _decision() -> Decision | None:
    from .processor import current_decision  # opentelemetry: imported on the first call

    return current_decision()


def _blocked(decision: Decision, on_block: str) -> Any:
    if on_block == "raise":
        raise LoopDetected(decision)
    return decision.message


def _with_reminder(decision: Decision | None, result: Any, append: bool) -> Any:
    if (
        append
        and decision is not None
        and decision.action is Action.REMIND
        and decision.message
        and isinstance(result, str)
    ):
        return f"{result}\n\n{decision.message}"
    return result


@overload
def enforce(
    fn: F,
    *,
    on_block: Literal["raise", "return"] = ...,
    append_reminders: bool = ...,
) -> F: ...


@overload
def enforce(
    fn: None = ...,
    *,
    on_block: Literal["raise", "return"] = ...,
    append_reminders: bool = ...,
) -> Callable[[F], F]: ...


def enforce(
    fn: F | None = None,
    *,
    on_block: Literal["raise", "return"] = "raise",
    append_reminders: bool = True,
) -> F | Callable[[F], F]:
    """Make a tool function (sync or async) obey the decision made for its call from spans:
    see the module's documentation. Raises ``ValueError`` for a bad ``on_block`` or a ``fn``
    that is not callable."""
    if on_block not in ("raise", "return"):
        raise ValueError(f"on_block: expected 'raise' or 'return', got {on_block!r}")
    if fn is None:
        return lambda f: enforce(f, on_block=on_block, append_reminders=append_reminders)
    if not callable(fn):
        raise ValueError(f"fn: expected a callable, got {type(fn).__name__}")
    append = bool(append_reminders)

    if inspect.iscoroutinefunction(fn):
        async_fn = cast(Callable[..., Awaitable[Any]], fn)

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            decision = _decision()
            if decision is not None and decision.blocks:
                return _blocked(decision, on_block)
            return _with_reminder(decision, await async_fn(*args, **kwargs), append)

        return cast(F, async_wrapper)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        decision = _decision()
        if decision is not None and decision.blocks:
            return _blocked(decision, on_block)
        return _with_reminder(decision, fn(*args, **kwargs), append)

    return cast(F, wrapper)
