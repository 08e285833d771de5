"""Plain slotted records that behave as the dataclasses they replace, without building one.

``@dataclass`` generates and compiles each class's methods when its module is imported: about a
millisecond a class, paid by every command hook process (one per tool call). A private record on
that path is a slotted class with a hand-written ``__init__`` on one of these bases instead; they
give what ``@dataclass(slots=True)`` (:class:`Record`) and ``@dataclass(frozen=True, slots=True)``
(:class:`FrozenRecord`) give: equality with an instance of the same class field by field (else
``NotImplemented``), ``repr`` as ``Name(field=value, ...)``, unhashable when mutable, hashed by
its fields and :class:`dataclasses.FrozenInstanceError` on assignment when frozen (and copied or
pickled as the frozen dataclass is). The fields are the class's ``__slots__``, in order.

A public dataclass on that path stays one (``dataclasses.fields``, ``replace``, ``asdict`` work)
without the generated methods: ``@dataclass(frozen=True, slots=True, init=False, repr=False,
eq=False)`` on :class:`FrozenRecord` with a hand-written ``__init__`` generates only
``__setattr__`` and ``__delattr__``; ``repr``, equality and hash come from the base as above.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

__all__ = ["FrozenRecord", "Record", "slot_setters"]


def slot_setters(cls: type) -> tuple[Callable[[Any, Any], None], ...]:
    """The setters of ``cls``'s own fields (its ``__slots__``), in order: a frozen record built on
    the hot path (a decision, a step) calls them in its ``__init__``, at half the cost of
    ``object.__setattr__``, which looks the field up by name each time."""
    return tuple(cls.__dict__[name].__set__ for name in cls.__dict__["__slots__"])


class Record:
    """The base of a mutable record (``@dataclass(slots=True)``)."""

    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls) -> None:
        if "__slots__" in cls.__dict__:  # a dataclass's: once it has added them
            type.__setattr__(cls, "__match_args__", cls.__dict__["__slots__"])

    def _fields(self) -> tuple[str, ...]:
        fields: tuple[str, ...] = self.__slots__
        return fields

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self._fields()])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    __hash__: ClassVar[None] = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields())
        return f"{self.__class__.__qualname__}({fields})"


class FrozenRecord(Record):
    """The base of an immutable record (``@dataclass(frozen=True, slots=True)``): its
    ``__init__`` sets each field with ``object.__setattr__``."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        from dataclasses import FrozenInstanceError  # only on a mistake

        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        from dataclasses import FrozenInstanceError  # only on a mistake

        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self._values())

    def __getstate__(self) -> list[Any]:
        return list(self._values())

    def __setstate__(self, state: list[Any]) -> None:
        for name, value in zip(self._fields(), state, strict=False):
            object.__setattr__(self, name, value)
