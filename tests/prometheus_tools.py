"""Helpers for tests that need Prometheus' own tools (Debian's ``prometheus`` package)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "dashboards"


def load_generator() -> ModuleType:
    """``dashboards/generate.py`` as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("loopguard_dashboard", DASHBOARDS / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["loopguard_dashboard"] = module
    spec.loader.exec_module(module)
    return module


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, ref id, PromQL expression) of every panel query."""
    return [
        (panel["title"], target["refId"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
    ]
