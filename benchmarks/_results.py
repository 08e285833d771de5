"""Headline figures of a benchmark, for ``benchmarks/compare.py``.

A benchmark calls :func:`record` once for each figure it reports (a median time, a rate, a
ratio). When the environment variable ``LOOPGUARD_BENCH_RESULTS`` names a file, each call
appends one JSON line to it: ``{"bench": ..., "name": ..., "value": ..., "unit": ...,
"better": "lower" | "higher"}``; otherwise nothing happens, and the benchmark prints its own
tables as before.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

__all__ = ["record"]

ENV = "LOOPGUARD_BENCH_RESULTS"


def record(name: str, value: float, unit: str, *, better: str = "lower") -> None:
    """Append one figure (``name`` unique within the benchmark) to the results file, if any."""
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', not {better!r}")
    target = os.environ.get(ENV)
    if not target:
        return
    bench = Path(sys.argv[0]).stem
    line = {"bench": bench, "name": name, "value": float(value), "unit": unit, "better": better}
    with open(target, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
