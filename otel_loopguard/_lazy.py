"""Names a module imports on first use (PEP 562): the one loader of the package root,
``metrics``, ``hooks`` and ``_memory``, so that importing them imports nothing they only name;
and the package's logger (:func:`logger`), with :mod:`logging` imported when the first message
is logged. Standard library only; imports nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import logging

__all__ = ["LOGGER_NAME", "lazy_names", "logger"]

#: The name every module of the package logs under.
LOGGER_NAME = "otel_loopguard"


def logger() -> logging.Logger:
    """The package's logger (``logging.getLogger(LOGGER_NAME)``, the same object each time),
    :mod:`logging` imported here: a command hook process that logs nothing does not import it.
    Called at the call site (``logger().warning(...)``), so that the record names that line."""
    import logging

    return logging.getLogger(LOGGER_NAME)


def lazy_names(
    module: str,
    package: str,
    sources: Mapping[str, str],
    namespace: dict[str, Any],
    public: Iterable[str] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``module``: a name of ``sources`` is imported
    from the module ``sources[name]`` of ``package`` when first asked for, then kept in
    ``namespace`` (the module's globals); ``__dir__`` lists ``namespace`` and ``public``."""
    listed = tuple(public)

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(f".{source}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *listed})

    return __getattr__, __dir__
