"""Every ``LOOPGUARD_*`` environment variable, declared once.

A bad value in one of them logs a warning naming the variable and keeps the default (the policy
fields); the variables below say what they hold, the unit and the default.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "LOOPGUARD_HOOK_STORE",
    "LOOPGUARD_PRESET",
    "LOOPGUARD_SERVE_TOKEN",
    "POLICY_PREFIX",
    "policy_variable",
]

POLICY_PREFIX: Final = "LOOPGUARD_"
"""``LOOPGUARD_<FIELD>`` overrides the policy field ``<field>`` (``LOOPGUARD_DENY_THRESHOLD=6``);
comma-separated lists for list fields; a bad value warns and keeps the default."""

LOOPGUARD_PRESET: Final = "LOOPGUARD_PRESET"
"""The policy preset the overrides apply to (``default``, ``reminder``, ``brake``, ``rescue``);
default ``default``; an unknown name warns and keeps ``default``."""

LOOPGUARD_HOOK_STORE: Final = "LOOPGUARD_HOOK_STORE"
"""Path of the SQLite state file shared by ``otel-loopguard hook`` processes when ``--store`` is
not given; default: a file under the user's state directory."""

LOOPGUARD_SERVE_TOKEN: Final = "LOOPGUARD_SERVE_TOKEN"
"""Bearer token of ``otel-loopguard serve`` and of ``hook --server`` when ``--token`` (or
``serve --token-file``) is not given; default: none. Set but empty, it is refused by both (an
error, not a warning keeping the default: it is a security setting, and an empty token would
turn authentication off)."""


def policy_variable(field_name: str) -> str:
    """The environment variable that overrides the policy field ``field_name``."""
    return POLICY_PREFIX + field_name.upper()
