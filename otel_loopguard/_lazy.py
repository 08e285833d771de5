"""Names a module imports on first use (PEP 562): the one loader of the package root,
``metrics``, ``hooks`` and ``_memory``, so that importing them imports nothing they only name.
Standard library only; imports nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_names"]


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
