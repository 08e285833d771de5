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
    # The test step alone (no installs), in the virtualenv that runs this suite (.ci/venv).
    env = {**os.environ, "LOOPGUARD_CI_VENV": sys.prefix}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        ["bash", ".ci/test"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


PASSING = "def test_ok() -> None:\n    assert 1 + 1 == 2\n"
FAILING = "def test_broken() -> None:\n    assert 1 + 1 == 3\n"


@pytest.mark.slow
def test_a_failing_test_fails_the_test_step_and_the_type_check_does_not_run(tmp_path: Path) -> None:
    root = _project(tmp_path, {"test_ok.py": PASSING, "test_broken.py": FAILING})
    done = _run_test_step(root)
    assert done.returncode != 0
    assert "1 failed, 1 passed" in done.stdout
    assert "Success: no issues found" not in done.stdout  # mypy never ran


def test_a_collection_error_fails_the_test_step(tmp_path: Path) -> None:
    root = _project(tmp_path, {"test_ok.py": PASSING, "test_syntax.py": "def (:\n"})
    assert _run_test_step(root).returncode != 0


@pytest.mark.slow
def test_no_test_collected_fails_the_test_step(tmp_path: Path) -> None:
    root = _project(tmp_path, {"helpers.py": "VALUE = 1\n"})
    done = _run_test_step(root)
    assert done.returncode != 0
    assert "no tests ran" in done.stdout


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_clean_project_passes_the_test_step(tmp_path: Path) -> None:
    root = _project(tmp_path, {"test_ok.py": PASSING})
    done = _run_test_step(root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_the_test_step_refuses_to_run_without_the_virtualenv(tmp_path: Path) -> None:
    root = _project(tmp_path, {"test_ok.py": PASSING})
    env = {**os.environ, "LOOPGUARD_CI_VENV": str(tmp_path / "absent")}
    done = subprocess.run(
        ["bash", ".ci/test"], cwd=root, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert f"no virtualenv at {tmp_path / 'absent'}: run bash .ci/install first" in done.stderr
    assert "passed" not in done.stdout


# The machine's Python has a package the project's extras do not install: a test importing it
# must fail the CI steps, because they run in a fresh virtualenv of their own.
MACHINE_ONLY_TEST = (
    "import machine_only\n\n\ndef test_uses_it() -> None:\n    assert machine_only.X == 1\n"
)
TINY_PROJECT = """\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "pkg"
version = "0"

[project.optional-dependencies]
test = ["pytest==9.0.3", "mypy==2.4.1", "ruff==0.17.6"]

[tool.setuptools]
packages = ["pkg"]
"""


def _machine_python(tmp_path: Path) -> Path:
    """A Python standing for the machine's: it has ``machine_only``, which no extra installs."""
    machine = tmp_path / "machine"
    subprocess.run([sys.executable, "-m", "venv", str(machine)], check=True, timeout=120)
    python = machine / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "machine_only.py").write_text("X = 1\n")
    subprocess.run([str(python), "-c", "import machine_only"], check=True, timeout=60)
    return python


@pytest.mark.slow
def test_a_package_only_the_machine_has_fails_the_ci_steps(tmp_path: Path) -> None:
    root = _project(tmp_path, {"test_ok.py": PASSING, "test_machine.py": MACHINE_ONLY_TEST})
    (root / "pyproject.toml").write_text(
        TINY_PROJECT + PYPROJECT.replace("[tool.ruff]", "\n[tool.ruff]")
    )
    machine = _machine_python(tmp_path)
    env = {
        **os.environ,
        "LOOPGUARD_CI_PYTHON": str(machine),
        "LOOPGUARD_CI_VENV": str(tmp_path / "ci-venv"),
        # the machine's Python first on PATH, as `python3` would be on a developer's laptop
        "PATH": str(machine.parent) + os.pathsep + os.environ.get("PATH", ""),
    }
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("VIRTUAL_ENV", None)
    install = subprocess.run(
        ["bash", ".ci/install"], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert install.returncode == 0, install.stdout + install.stderr
    done = subprocess.run(
        ["bash", ".ci/test"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "No module named 'machine_only'" in done.stdout
    # the same test passes on the machine's Python: only the fresh virtualenv tells them apart
    on_machine = subprocess.run(
        [str(machine), "-c", "import machine_only; print(machine_only.X)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert on_machine.stdout.strip() == "1"


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
