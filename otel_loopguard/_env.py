"""Every ``LOOPGUARD_*`` environment variable, declared once.

A bad value in one of them logs a warning naming the variable and keeps the default (the policy
fields); the variables below say what they hold, the unit and the default. A ``LOOPGUARD_*``
variable that is neither a policy field's nor declared here is a typo: it warns too, with the
closest names (:func:`otel_loopguard.config.unknown_variables`), so every name anything in the
repository reads, test and CI scripts included, is declared here (:data:`DECLARED`).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DECLARED",
    "LOOPGUARD_BENCH_RESULTS",
    "LOOPGUARD_CI_PYTHON",
    "LOOPGUARD_CI_VENV",
    "LOOPGUARD_DOCS_DATA",
    "LOOPGUARD_ENDPOINT",
    "LOOPGUARD_FRAMEWORK_TESTS",
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


LOOPGUARD_ENDPOINT: Final = "LOOPGUARD_ENDPOINT"
"""Not read by this package: the Collector configurations in ``collector/`` send traces to
``otel-loopguard serve`` at this URL; default ``http://loopguard:4318``."""

LOOPGUARD_FRAMEWORK_TESTS: Final = "LOOPGUARD_FRAMEWORK_TESTS"
"""Tests only: the framework test modules to run (comma-separated names, as ``.ci/frameworks``
sets it); default: those whose framework imports (none in CI)."""

LOOPGUARD_DOCS_DATA: Final = "LOOPGUARD_DOCS_DATA"
"""Tests only: the folder of sample files the documentation's shell examples copy from, as
``tests/test_doc_examples.py`` runs them (``tests/data``); no default."""

LOOPGUARD_CI_VENV: Final = "LOOPGUARD_CI_VENV"
"""CI scripts only (``.ci/``): the virtualenv the checks run in; default ``.venv-ci`` in the
checkout."""

LOOPGUARD_CI_PYTHON: Final = "LOOPGUARD_CI_PYTHON"
"""CI scripts only (``.ci/install``): the Python that makes the virtualenv; default
``python3``."""

LOOPGUARD_BENCH_RESULTS: Final = "LOOPGUARD_BENCH_RESULTS"
"""Benchmarks only (``benchmarks/_results.py``): the file each benchmark appends its headline
figures to, one JSON line each, for ``benchmarks/compare.py``; default: none (nothing written)."""

#: The names declared above (policy fields' variables are derived from the fields instead:
#: :func:`policy_variable`). Read from this module's own declarations, never listed twice.
DECLARED: Final = frozenset(
    value
    for name, value in dict(globals()).items()
    if name.startswith(POLICY_PREFIX) and value == name
)


def policy_variable(field_name: str) -> str:
    """The environment variable that overrides the policy field ``field_name``."""
    return POLICY_PREFIX + field_name.upper()
