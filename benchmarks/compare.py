"""Every benchmark side by side with a git ref: the regression harness (issue 29 item 6).

    python benchmarks/compare.py REF [--rounds N] [--only bench_engine,bench_hook] [--quick]
                                     [--markdown] [--corpus DIR] [--tolerance PCT]

REF (a commit, branch or tag of this repository) is checked out with ``git worktree add
--detach`` into a temporary directory, removed at the end (also on Ctrl-C, SIGTERM or an error).
For each benchmark, each round runs this tree's benchmark script twice: once importing this
tree's package and once REF's (``PYTHONPATH`` names the tree; the virtualenv's editable install
comes after it), alternating which goes first from round to round, each run with
``LOOPGUARD_BENCH_RESULTS`` naming a fresh file for the figures the script records
(``benchmarks/_results.py``). Then one table: benchmark, figure, unit, REF's median, this
tree's median, the ratio (this tree / REF) and a verdict from the figure's ``better``:
"better", "worse" or "same (within x%)", where x is --tolerance or, when larger, the spread of
the rounds (half the range over the median, the larger side); a figure that is the same in
every round on both sides (a count on the corpus, a preset's decisions) is compared exactly.
Then the machine (CPU model, cores, load average at the start and the end, Python) and the
command.

A benchmark that fails on one side (a non-zero exit, or a timeout) shows "failed: <its last
stderr line>" there, and the others go on. The corpus benchmarks (detection, cost, memory,
intent) measure detection, not speed; they run only with ``--corpus DIR`` (the folder holding
``trajectories/`` and ``sequences/``), and are left out with a line saying so otherwise.

Exit status 0 whenever the comparison ran (regressions are reported, not failed: machines are
noisy); 2 for a usage error or a REF that is not a commit of the repository.

Each benchmark has a default argument set and a --quick one (a smoke check, not a
measurement: one round, no spread). On the project's 2-core machine kind, with --corpus
(2026-12-03), the default run took 8.6 minutes (6.8 minutes of CPU) at a load average falling
from 5 to 1.5, and --quick 1.9 minutes (1 minute of CPU) at a load average of 5-6; at a load
average of 10 expect about twice that. Each run is timed (wall and CPU) and the totals
per benchmark are printed under the table. --repo and --bench-dir point the harness at another repository and
folder of scripts (the tests use them); scripts there named ``bench_*.py`` that the table below
does not know run without arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS_ENV = "LOOPGUARD_BENCH_RESULTS"  # read by _results.record()


@dataclass(frozen=True)
class Bench:
    """A benchmark script, the arguments of each mode, and the corpus folder it reads."""

    name: str
    default: str  # arguments, as a shell would split them
    quick: str
    corpus: str | None = None  # the subfolder of --corpus passed as its --corpus
    timeout: float = 600.0  # seconds per run


BENCHMARKS: tuple[Bench, ...] = (
    Bench(
        "bench_engine",
        "--repeat 3 --pairs 10000 --sessions 2000",
        "--repeat 1 --pairs 4000 --sessions 500",
    ),
    Bench("bench_hook", "--runs 30 --warm 3", "--runs 30 --warm 1"),  # at least 30 runs
    Bench("bench_processor", "--rounds 100 --warmup 10", "--rounds 30 --warmup 5"),
    Bench(
        "bench_exporter",  # the paced rounds drop 2, the busy ones --warmup: 2 left at least
        "--rounds 40 --warmup 3 --busy-rounds 5 --busy-spans 512 --paced-rounds 4"
        " --paced-spans 256 --batches 4 --repeat 1",
        "--rounds 20 --warmup 2 --busy-rounds 4 --busy-spans 512 --paced-rounds 4"
        " --paced-spans 128 --batches 2 --repeat 1",
    ),
    Bench(
        "bench_serve",
        "--workloads mixed --batches 40 --repeat 1 --decisions 300",
        "--workloads mixed --batches 10 --repeat 1 --decisions 100",
    ),
    Bench(
        "bench_store",
        "--pairs 600 --processes 1,4 --repeat 1 --decisions 100",
        "--pairs 500 --processes 1 --repeat 1 --decisions 0",
    ),
    Bench("bench_conventions", "--repeat 5 --min-seconds 0.05", "--repeat 2 --min-seconds 0.02"),
    Bench("preset_scenarios", "", ""),
    Bench("bench_detection", "--in-process", "--in-process --presets default", "trajectories"),
    Bench("bench_cost", "", "", corpus="trajectories"),
    Bench("bench_memory", "", "", corpus="sequences"),
    Bench("bench_intent", "", "", corpus="trajectories"),
)


class UsageError(Exception):
    """A bad argument or REF: one message, exit status 2."""


# -- git ---------------------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise UsageError(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def resolve(repo: Path, ref: str) -> str:
    """The commit REF names, or a UsageError naming REF."""
    found = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0 or not found.stdout.strip():
        raise UsageError(f"REF {ref!r} is not a commit of the repository {repo}")
    return found.stdout.strip()


def describe(repo: Path, commit: str) -> str:
    return git(repo, "log", "-1", "--format=%h %s", commit)[:90]


def current_state(repo: Path) -> str:
    head = git(repo, "log", "-1", "--format=%h %s", "HEAD")[:90]
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no")
    return head + (" + uncommitted changes" if dirty else "")


# -- running one benchmark ---------------------------------------------------------------------


@dataclass
class Figure:
    unit: str
    better: str
    values: dict[str, list[float]] = field(default_factory=lambda: {"ref": [], "current": []})


@dataclass
class Outcome:
    """One benchmark's figures over the rounds, and why a side failed (if it did)."""

    bench: str
    figures: dict[str, Figure] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # side -> message
    seconds: dict[str, list[float]] = field(default_factory=lambda: {"ref": [], "current": []})
    cpu: list[float] = field(default_factory=list)  # CPU seconds of each run, both sides


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output on stderr)"


def children_cpu() -> float:
    """CPU seconds of the processes waited for so far (and of those they waited for)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_once(
    script: Path, args: list[str], tree: Path, workdir: Path, results: Path, timeout: float
) -> tuple[list[dict[str, object]], str | None, float]:
    """Run ``script`` importing the package of ``tree``; (figures, failure or None, seconds)."""
    env = dict(os.environ)
    env.pop(RESULTS_ENV, None)
    env[RESULTS_ENV] = str(results)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    results.unlink(missing_ok=True)
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(script), *args],
            cwd=workdir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [], f"timed out after {timeout:.0f} s", time.perf_counter() - started
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        return [], f"exit {done.returncode}: {last_line(done.stderr)}", seconds
    figures: list[dict[str, object]] = []
    if results.is_file():
        for line in results.read_text(encoding="utf-8").splitlines():
            if line.strip():
                figures.append(json.loads(line))
    return figures, None, seconds


def run_bench(
    bench: Bench,
    script: Path,
    args: list[str],
    trees: dict[str, Path],
    scratch: Path,
    rounds: int,
) -> Outcome:
    outcome = Outcome(bench.name)
    for round_ in range(rounds):
        order = ["current", "ref"] if round_ % 2 == 0 else ["ref", "current"]
        for side in order:
            if side in outcome.failed:
                continue
            results = scratch / f"{bench.name}-{side}-{round_}.jsonl"
            cpu = children_cpu()
            figures, failure, seconds = run_once(
                script, args, trees[side], trees["current"], results, bench.timeout
            )
            outcome.seconds[side].append(seconds)
            outcome.cpu.append(children_cpu() - cpu)
            label = "REF" if side == "ref" else "current"
            print(
                f"  {bench.name} round {round_ + 1}/{rounds}, {label}: {seconds:.1f} s"
                + (f", failed: {failure}" if failure else f", {len(figures)} figures"),
                file=sys.stderr,
                flush=True,
            )
            if failure is not None:
                outcome.failed[side] = failure
                continue
            for item in figures:
                name = str(item["name"])
                figure = outcome.figures.setdefault(
                    name, Figure(str(item["unit"]), str(item["better"]))
                )
                figure.values[side].append(float(item["value"]))  # type: ignore[arg-type]
    return outcome


# -- the table ---------------------------------------------------------------------------------


def spread(values: list[float]) -> float:
    """Half the range over the median (0 for one value or a zero median)."""
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    return (max(values) - min(values)) / 2 / abs(middle) if middle else 0.0


def verdict(figure: Figure, tolerance: float) -> tuple[str, str]:
    """(ratio text, verdict) for a figure measured on both sides."""
    ref, cur = figure.values["ref"], figure.values["current"]
    before, after = statistics.median(ref), statistics.median(cur)
    exact = len(set(ref)) == 1 and len(set(cur)) == 1 and len(ref) > 1 and len(cur) > 1
    limit = 0.0 if exact else max(tolerance, spread(ref), spread(cur))
    if before == 0:
        ratio_text = "-"
        change = 0.0 if after == 0 else math.copysign(math.inf, after)
    else:
        ratio = after / before
        ratio_text = f"{ratio:.3f}"
        change = ratio - 1 if before > 0 else 1 - ratio
    if change == 0:
        return ratio_text, "same"
    if abs(change) <= limit:
        return ratio_text, f"same (within {limit:.0%})"
    improved = (change < 0) == (figure.better == "lower")
    return ratio_text, "better" if improved else "worse"


def number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    return f"{value:.4g}"


def rows(outcomes: list[Outcome], tolerance: float) -> list[list[str]]:
    table: list[list[str]] = []
    for outcome in outcomes:
        if not outcome.figures:
            cells = []
            for side in ("ref", "current"):
                if side in outcome.failed:
                    cells.append(f"failed: {outcome.failed[side]}")
                else:
                    cells.append("no figures recorded")
            table.append([outcome.bench, "-", "-", *cells, "-", "-"])
            continue
        for name, figure in outcome.figures.items():
            cells = []
            for side in ("ref", "current"):
                if side in outcome.failed:
                    cells.append(f"failed: {outcome.failed[side]}")
                elif figure.values[side]:
                    cells.append(number(statistics.median(figure.values[side])))
                else:
                    cells.append("not recorded")
            if all(figure.values[side] for side in ("ref", "current")) and not outcome.failed:
                ratio, word = verdict(figure, tolerance)
            else:
                ratio, word = "-", "-"
            unit = f"{figure.unit} ({figure.better} is better)"
            table.append([outcome.bench, name, unit, *cells, ratio, word])
    return table


HEADER = ["benchmark", "figure", "unit", "REF median", "current median", "current / REF", "verdict"]


def render(table: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = [
            "| " + " | ".join(HEADER) + " |",
            "| " + " | ".join(["---"] * 3 + ["---:"] * 3 + ["---"]) + " |",
        ]
        lines += [
            "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table
        ]
        return "\n".join(lines)
    # a failure's message overflows its column rather than widening it for every row
    widths = [
        max(len(row[i]) for row in [HEADER, *table] if i < 3 or not row[i].startswith("failed"))
        for i in range(len(HEADER))
    ]
    out = []
    for row in [HEADER, ["-" * w for w in widths], *table]:
        cells = [
            c.rjust(w) if 3 <= i <= 5 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


# -- main --------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="compare.py", description=__doc__.split("\n", 1)[0] if __doc__ else None
    )
    parser.add_argument("ref", metavar="REF", help="the git commit, branch or tag to compare with")
    parser.add_argument("--rounds", type=int, help="rounds per benchmark (default 3; --quick 1)")
    parser.add_argument("--only", help="comma-separated benchmark names (default: all)")
    parser.add_argument("--quick", action="store_true", help="small argument sets: a smoke check")
    parser.add_argument("--markdown", action="store_true", help="the table as Markdown")
    parser.add_argument(
        "--corpus", type=Path, help="folder holding the labelled corpus (trajectories/, sequences/)"
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=5.0,
        help="a change within this many percent is 'same' (default 5)",
    )
    parser.add_argument(
        "--repo", type=Path, default=HERE.parent, help="the git repository (default: this one)"
    )
    parser.add_argument(
        "--bench-dir", type=Path, help="the benchmark scripts (default: REPO/benchmarks)"
    )
    options = parser.parse_args(argv)
    if options.rounds is not None and options.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {options.rounds}")
    if options.rounds is None:
        options.rounds = 1 if options.quick else 3
    if options.tolerance < 0:
        parser.error(f"--tolerance must be at least 0, not {options.tolerance}")
    return options


def select(options: argparse.Namespace, bench_dir: Path) -> tuple[list[Bench], list[str]]:
    """The benchmarks to run, and lines about those left out."""
    known = {b.name: b for b in BENCHMARKS}
    extra = sorted(p.stem for p in bench_dir.glob("bench_*.py") if p.stem not in known)
    available = [b for b in BENCHMARKS if (bench_dir / f"{b.name}.py").is_file()]
    available += [Bench(name, "", "") for name in extra]
    if options.only:
        wanted = [n.strip().removesuffix(".py") for n in options.only.split(",") if n.strip()]
        names = {b.name for b in available}
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise UsageError(
                f"--only: no benchmark {', '.join(unknown)} in {bench_dir}"
                f" (known: {', '.join(sorted(names))})"
            )
        available = [b for b in available if b.name in wanted]
    chosen: list[Bench] = []
    notes: list[str] = []
    for bench in available:
        if bench.corpus is not None:
            folder = options.corpus / bench.corpus if options.corpus else None
            if folder is None or not folder.is_dir():
                where = f"no {folder}" if folder else "no --corpus"
                notes.append(f"{bench.name}: left out ({where}; it reads the labelled corpus)")
                continue
        chosen.append(bench)
    return chosen, notes


def arguments(bench: Bench, options: argparse.Namespace) -> list[str]:
    args = shlex.split(bench.quick if options.quick else bench.default)
    if bench.corpus is not None:
        args += ["--corpus", str((options.corpus / bench.corpus).resolve())]
    return args


def compare(options: argparse.Namespace) -> int:
    repo = options.repo.resolve()
    bench_dir = (options.bench_dir or repo / "benchmarks").resolve()
    if not bench_dir.is_dir():
        raise UsageError(f"--bench-dir {bench_dir}: no such folder")
    git(repo, "rev-parse", "--git-dir")
    commit = resolve(repo, options.ref)
    chosen, notes = select(options, bench_dir)
    started = datetime.datetime.now(datetime.timezone.utc)
    current = current_state(repo)  # at the start: others may commit while it runs
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="loopguard-compare-") as scratch:
        tree = Path(scratch) / "ref"
        git(repo, "worktree", "add", "--detach", "--quiet", str(tree), commit)
        try:
            trees = {"current": repo, "ref": tree}
            outcomes = []
            for bench in chosen:
                print(f"{bench.name}: {shlex.join(arguments(bench, options))}", file=sys.stderr)
                outcomes.append(
                    run_bench(
                        bench,
                        bench_dir / f"{bench.name}.py",
                        arguments(bench, options),
                        trees,
                        Path(scratch),
                        options.rounds,
                    )
                )
        finally:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
                check=False,
            )
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "prune"], capture_output=True, check=False
            )
    ended = datetime.datetime.now(datetime.timezone.utc)
    print(f"REF: {describe(repo, commit)}")
    print(f"current: {current} (at the start)")
    mode = "quick" if options.quick else "default"
    if options.rounds == 1:
        print(f"1 round, {mode} arguments: no spread measured, verdicts on --tolerance alone")
    else:
        print(f"{options.rounds} rounds, {mode} arguments; medians over the rounds")
    print()
    print(render(rows(outcomes, options.tolerance / 100), options.markdown))
    print()
    for note in notes:
        print(note)
    for outcome in outcomes:
        seconds = outcome.seconds["current"] + outcome.seconds["ref"]
        if seconds:
            print(
                f"{outcome.bench}: {sum(seconds):.0f} s over {len(seconds)} runs"
                f" ({sum(outcome.cpu):.0f} s of CPU)"
            )
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} cores; load average (1, 5, 15 min)"
        f" {load_start} at the start, {load_average()} at the end;"
        f" {started:%Y-%m-%d %H:%M}–{ended:%H:%M} UTC"
    )
    print(
        f"python: {platform.python_implementation()} {platform.python_version()} ({sys.executable})"
    )
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    # SIGTERM unwinds like Ctrl-C, so the worktree is removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return compare(options)
    except UsageError as exc:
        print(f"compare.py: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("compare.py: interrupted (the worktree is removed)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
