"""benchmarks/compare.py, run for real: a scratch git repository with two commits of a tiny
package and tiny benchmark scripts that record figures through benchmarks/_results.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPARE = ROOT / "benchmarks" / "compare.py"

BENCH_SPEED = """\
import tinypkg
from _results import record

record("speed", tinypkg.SPEED, "ops/s", better="higher")
record("latency", tinypkg.LATENCY, "ms")
"""

# needs a name only the second commit's package has: fails on the first
BENCH_NEW = """\
import tinypkg
from _results import record

record("new thing", tinypkg.NEW_THING, "calls")
"""

# a name compare.py knows as a corpus benchmark: runs only with --corpus, given CORPUS/sequences
BENCH_MEMORY = """\
import sys
from pathlib import Path
from _results import record

corpus = Path(sys.argv[sys.argv.index("--corpus") + 1])
record("runs in the corpus", len(list(corpus.glob("*.jsonl"))), "runs", better="higher")
"""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two commits: REF (tag ``first``) and the current one; the scripts are the current ones."""
    root = tmp_path_factory.mktemp("compare-repo")
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "bench@example.invalid")
    git(root, "config", "user.name", "bench")
    package = root / "tinypkg"
    package.mkdir()
    (package / "__init__.py").write_text("SPEED = 1000.0\nLATENCY = 5.0\n")
    benchmarks = root / "benchmarks"
    benchmarks.mkdir()
    shutil.copy(ROOT / "benchmarks" / "_results.py", benchmarks / "_results.py")
    (benchmarks / "bench_speed.py").write_text(BENCH_SPEED)
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    git(root, "tag", "first")
    (package / "__init__.py").write_text("SPEED = 2500.0\nLATENCY = 5.0\nNEW_THING = 3\n")
    (benchmarks / "bench_new.py").write_text(BENCH_NEW)
    (benchmarks / "bench_memory.py").write_text(BENCH_MEMORY)
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "second")
    return root


def compare(repo: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOOPGUARD_BENCH_RESULTS")
    }
    env["TMPDIR"] = str(tmp)  # where the worktree goes: checked empty afterwards
    return subprocess.run(
        [sys.executable, str(COMPARE), *args, "--repo", str(repo)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def table_rows(stdout: str) -> dict[tuple[str, str], list[str]]:
    """The Markdown table's rows by (benchmark, figure)."""
    rows: dict[tuple[str, str], list[str]] = {}
    for line in stdout.splitlines():
        if line.startswith("| bench"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            rows[(cells[0], cells[1])] = cells
    return rows


def test_the_table_gives_each_figure_side_by_side_with_ratio_and_verdict(
    repo: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus" / "sequences"
    corpus.mkdir(parents=True)
    for name in ("a", "b"):
        (corpus / f"{name}.jsonl").write_text("{}\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = compare(
        repo, scratch, "first", "--rounds", "2", "--markdown", "--corpus", str(corpus.parent)
    )
    assert done.returncode == 0, done.stderr
    rows = table_rows(done.stdout)
    # speed: 2500 now against 1000 at REF, higher is better; the same in every round: exact
    assert rows[("bench_speed", "speed")][2:] == [
        "ops/s (higher is better)",
        "1,000",
        "2,500",
        "2.500",
        "better",
    ]
    assert rows[("bench_speed", "latency")][3:] == ["5", "5", "1.000", "same"]
    # a script that fails on REF only: its last stderr line there, the figure now, no verdict
    new = rows[("bench_new", "new thing")]
    assert new[3] == "failed: exit 1: AttributeError: module 'tinypkg' has no attribute 'NEW_THING'"
    assert new[4:] == ["3", "-", "-"]
    # the corpus benchmark got CORPUS/sequences
    assert rows[("bench_memory", "runs in the corpus")][3:] == ["2", "2", "1.000", "same"]
    # each script ran twice per round (this tree's package and REF's), alternating the order
    progress = [line for line in done.stderr.splitlines() if "bench_speed round" in line]
    assert [line.split(":")[0].strip() for line in progress] == [
        "bench_speed round 1/2, current",
        "bench_speed round 1/2, REF",
        "bench_speed round 2/2, REF",
        "bench_speed round 2/2, current",
    ]
    assert "machine: " in done.stdout and "load average" in done.stdout
    assert "command: " in done.stdout and "first" in done.stdout
    # the worktree is gone: from git's list and from the disk
    assert git(repo, "worktree", "list").count("\n") == 1
    assert list(scratch.iterdir()) == []


def test_the_corpus_benchmarks_are_left_out_without_a_corpus(repo: Path, tmp_path: Path) -> None:
    done = compare(repo, tmp_path, "first", "--rounds", "1", "--only", "bench_speed,bench_memory")
    assert done.returncode == 0, done.stderr
    assert "bench_memory: left out (no --corpus; it reads the labelled corpus)" in done.stdout
    lines = [line for line in done.stdout.splitlines() if line.startswith("bench_")]
    assert any(line.startswith("bench_speed ") and "2.500" in line for line in lines), lines
    assert not any("bench_new" in line for line in lines)  # not in --only


def test_a_bad_ref_exits_non_zero_naming_it(repo: Path, tmp_path: Path) -> None:
    done = compare(repo, tmp_path, "no-such-ref-29")
    assert done.returncode == 2
    assert "'no-such-ref-29' is not a commit" in done.stderr
    assert git(repo, "worktree", "list").count("\n") == 1


def test_an_unknown_benchmark_in_only_is_a_usage_error(repo: Path, tmp_path: Path) -> None:
    done = compare(repo, tmp_path, "first", "--only", "bench_speed,bench_nope")
    assert done.returncode == 2
    assert "bench_nope" in done.stderr
    assert git(repo, "worktree", "list").count("\n") == 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_comparison_removes_its_worktree(
    repo: Path, tmp_path: Path, signum: int
) -> None:
    """Ctrl-C (SIGINT) or SIGTERM while a benchmark runs: the run stops, the worktree goes."""
    benchmarks = tmp_path / "benchmarks"
    benchmarks.mkdir()
    shutil.copy(ROOT / "benchmarks" / "_results.py", benchmarks / "_results.py")
    (benchmarks / "bench_sleep.py").write_text("import time\n\ntime.sleep(60)\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TMPDIR"] = str(scratch)
    command = [sys.executable, str(COMPARE), "first", "--repo", str(repo)]
    process = subprocess.Popen(
        [*command, "--bench-dir", str(benchmarks)], stderr=subprocess.PIPE, text=True, env=env
    )
    assert process.stderr is not None
    first = process.stderr.readline()  # printed once the worktree is there, as the script starts
    assert first.startswith("bench_sleep:"), first
    assert git(repo, "worktree", "list").count("\n") == 2
    time.sleep(0.5)
    process.send_signal(signum)
    status = process.wait(timeout=30)
    assert status == (130 if signum == signal.SIGINT else 128 + signum)
    assert git(repo, "worktree", "list").count("\n") == 1
    assert list(scratch.iterdir()) == []
