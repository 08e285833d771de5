"""Helpers for tests that need Prometheus' own tools (Debian's ``prometheus`` package)."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str) -> str:
    """The path of ``name`` (``prometheus``, ``promtool``); a failure in CI when missing, a skip
    elsewhere (``.ci/run`` installs them: ``apt-get install prometheus``)."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must install it (.ci/run)")
        pytest.skip(message)
    return path
