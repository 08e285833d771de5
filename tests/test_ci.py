"""The CI script itself: every step fails it (a failing test, a type error, no test at all)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / ".ci"

PYPROJECT = """\
[tool.ruff]
line-length = 100

[tool.pytest.ini_options]
testpaths = ["tests"]

[tool.mypy]
strict = true
files = ["pkg"]
"""


def _project(tmp_path: Path, tests: dict[str, str], module: str = "X: int = 1\n") -> Path:
    """A copy of .ci/ beside a tiny project: pkg/ for mypy, tests/ for pytest."""
    root = tmp_path / "repo"
    shutil.copytree(CI, root / ".ci")
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text(module)
    (root / "tests").mkdir()
    for name, text in tests.items():
        (root / "tests" / name).write_text(text)
    return root


def _run_test_step(root: Path) -> subprocess.CompletedProcess[str]:
    # The test step alone (no installs): the same python that runs this suite runs it.
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        ["bash", ".ci/test"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


PASSING = "def test_ok() -> None:\n    assert 1 + 1 == 2\n"
FAILING = "def test_broken() -> None:\n    assert 1 + 1 == 3\n"


def test_a_failing_test_fails_the_test_step_and_the_type_check_does_not_run(tmp_path: Path) -> None:
    root = _project(tmp_path, {"test_ok.py": PASSING, "test_broken.py": FAILING})
    done = _run_test_step(root)
    assert done.returncode != 0
    assert "1 failed, 1 passed" in done.stdout
    assert "Success: no issues found" not in done.stdout  # mypy never ran


def test_a_collection_error_fails_the_test_step(tmp_path: Path) -> None:
    root = _project(tmp_path, {"test_ok.py": PASSING, "test_syntax.py": "def (:\n"})
    assert _run_test_step(root).returncode != 0


def test_no_test_collected_fails_the_test_step(tmp_path: Path) -> None:
    root = _project(tmp_path, {"helpers.py": "VALUE = 1\n"})
    done = _run_test_step(root)
    assert done.returncode != 0
    assert "no tests ran" in done.stdout


def test_a_type_error_fails_the_test_step(tmp_path: Path) -> None:
    root = _project(tmp_path, {"test_ok.py": PASSING}, module='X: int = "not an int"\n')
    done = _run_test_step(root)
    assert done.returncode != 0
    assert "1 passed" in done.stdout
    assert "error: Incompatible types" in done.stdout


def test_a_lint_error_fails_the_test_step(tmp_path: Path) -> None:
    root = _project(tmp_path, {"test_ok.py": PASSING}, module="import os\n")
    done = _run_test_step(root)
    assert done.returncode != 0
    assert "F401" in done.stdout
    assert "passed" not in done.stdout  # the tests never ran


def test_unformatted_code_fails_the_test_step(tmp_path: Path) -> None:
    root = _project(tmp_path, {"test_ok.py": PASSING}, module="X: int = (1)\n")
    done = _run_test_step(root)
    assert done.returncode != 0
    assert "would be reformatted" in done.stdout + done.stderr


def test_a_clean_project_passes_the_test_step(tmp_path: Path) -> None:
    root = _project(tmp_path, {"test_ok.py": PASSING})
    done = _run_test_step(root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


@pytest.mark.parametrize("script", ["run", "install", "test", "package", "frameworks"])
def test_every_script_fails_on_any_step(script: str) -> None:
    lines = (CI / script).read_text().splitlines()
    assert "set -euo pipefail" in lines
    for line in lines:
        code = line.split("#", 1)[0].strip()
        assert "&&" not in code, line
        # `||` only inside an if's condition, where it decides and never hides a failure
        assert "||" not in code or code.startswith(("if ", "elif ")), line


def test_the_run_script_is_its_steps_in_order() -> None:
    steps = [line for line in (CI / "run").read_text().splitlines() if line.startswith("bash ")]
    assert steps == ["bash .ci/install", "bash .ci/test", "bash .ci/package", "bash .ci/frameworks"]


def test_the_version_is_written_in_one_place() -> None:
    from importlib.metadata import version

    import otel_loopguard

    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject
    assert 'version = { attr = "otel_loopguard.__version__" }' in pyproject
    assert version("otel-loopguard") == otel_loopguard.__version__
    assert f"## {otel_loopguard.__version__}" in (ROOT / "CHANGELOG.md").read_text()
