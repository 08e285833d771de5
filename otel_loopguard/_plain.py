"""Readers of plain data coming back into the process (a session's state from a hooks file, a
snapshot): each returns the value when it has the expected type and raises ``ValueError``
naming the field otherwise."""

from __future__ import annotations

import math

__all__ = [
    "read_count",
    "read_flag",
    "read_list",
    "read_number",
    "read_optional_text",
    "read_text",
]


def read_list(value: object, name: str) -> list[object]:
    if not isinstance(value, list):
        raise ValueError(f"session state: {name} must be a list, got {value!r}")
    return value


def read_count(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"session state: {name} must be an integer >= 0, got {value!r}")
    return value


def read_number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"session state: {name} must be a finite number, got {value!r}")
    return float(value)


def read_flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"session state: {name} must be true or false, got {value!r}")
    return value


def read_text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"session state: {name} must be a string, got {value!r}")
    return value


def read_optional_text(value: object, name: str) -> str | None:
    return None if value is None else read_text(value, name)
