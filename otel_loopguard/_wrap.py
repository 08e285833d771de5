"""Plain Python tool functions guarded by a :class:`~otel_loopguard._guard.LoopGuard`
(:meth:`LoopGuard.wrap <otel_loopguard._guard.LoopGuard.wrap>` documents the behaviour)."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol, cast

from ._policy import Action, Decision, LoopDetected

__all__ = ["wrap_tool"]


class _Hooks(Protocol):
    """What a wrapped tool needs of the guard (its hook API): no import of the guard here."""

    def before_tool(
        self, tool: str, arguments: object, *, session: str, agent: str | None = ...
    ) -> Decision: ...

    def after_tool(
        self,
        tool: str,
        arguments: object,
        *,
        session: str,
        agent: str | None = ...,
        error: bool | None = ...,
        result: object = ...,
        duration_seconds: float | None = ...,
    ) -> Decision | None: ...


class _GuardedTool:
    """One wrapped tool: binds a call's arguments, asks the guard before it and reports after."""

    __slots__ = ("agent", "append_reminders", "guard", "name", "on_block", "session", "signature")

    def __init__(
        self,
        guard: _Hooks,
        fn: Callable[..., Any],
        name: str,
        session: str | Callable[[], str],
        agent: str | None,
        on_block: Literal["raise", "return"],
        append_reminders: bool,
    ) -> None:
        self.guard = guard
        self.name = name
        self.session = session
        self.agent = agent
        self.on_block = on_block
        self.append_reminders = append_reminders
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self.signature = None

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        """The call's arguments by name, defaults applied (as given when they do not bind)."""
        if self.signature is None:
            return {"args": list(args), "kwargs": kwargs}
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return {"args": list(args), "kwargs": kwargs}
        bound.apply_defaults()
        return dict(bound.arguments)

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[object, str, Decision]:
        arguments = self.bind(args, kwargs)
        session = self.session
        sid = session() if callable(session) else session
        decision = self.guard.before_tool(self.name, arguments, session=sid, agent=self.agent)
        return arguments, sid, decision

    def blocked(self, decision: Decision) -> Any:
        if self.on_block == "raise":
            raise LoopDetected(decision)
        return decision.message

    def failed(self, arguments: object, sid: str, started: float, exc: BaseException) -> None:
        post = self.guard.after_tool(
            self.name,
            arguments,
            session=sid,
            agent=self.agent,
            error=True,
            result=repr(exc),
            duration_seconds=time.perf_counter() - started,
        )
        if post is not None and post.blocks and self.on_block == "raise":
            # The third identical failure: the run should end, not just see the error.
            raise LoopDetected(post) from exc

    def finish(
        self, decision: Decision, arguments: object, sid: str, started: float, result: Any
    ) -> Any:
        post = self.guard.after_tool(
            self.name,
            arguments,
            session=sid,
            agent=self.agent,
            result=result,
            duration_seconds=time.perf_counter() - started,
        )
        if post is not None and post.blocks:
            # Concluded from this result (a stop after the call ran): the call ran, but the run
            # ends here, as a blocked call would end it.
            return self.blocked(post)
        if post is not None and post.action is Action.REMIND:
            decision = post
        if self.append_reminders and decision.action is Action.REMIND and isinstance(result, str):
            return f"{result}\n\n{decision.message}"
        return result


def wrap_tool(
    guard: _Hooks,
    fn: Callable[..., Any],
    *,
    tool: str | None,
    session: str | Callable[[], str],
    agent: str | None,
    on_block: Literal["raise", "return"],
    append_reminders: bool,
) -> Callable[..., Any]:
    """``fn`` (sync or async) guarded by ``guard``, as :meth:`LoopGuard.wrap` says."""
    name = tool or getattr(fn, "__name__", None) or type(fn).__name__
    guarded = _GuardedTool(guard, fn, name, session, agent, on_block, append_reminders)

    if inspect.iscoroutinefunction(fn):
        async_fn = cast(Callable[..., Awaitable[Any]], fn)

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            arguments, sid, decision = guarded.before(args, kwargs)
            if decision.blocks:
                return guarded.blocked(decision)
            started = time.perf_counter()
            try:
                result = await async_fn(*args, **kwargs)
            except BaseException as exc:
                guarded.failed(arguments, sid, started, exc)
                raise
            return guarded.finish(decision, arguments, sid, started, result)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        arguments, sid, decision = guarded.before(args, kwargs)
        if decision.blocks:
            return guarded.blocked(decision)
        started = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            guarded.failed(arguments, sid, started, exc)
            raise
        return guarded.finish(decision, arguments, sid, started, result)

    return wrapper
