"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a missing page in
the nav or an API reference that no longer resolves is an error), as CI builds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        # Material prints a banner about MkDocs 2 that names itself a WARNING; it is not one
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr  # strict fails on one; say which
    for page in ("index.html", "reference/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
