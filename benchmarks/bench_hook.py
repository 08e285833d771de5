"""Hook latency: one ``otel-loopguard hook claude-code`` invocation, process start to exit.

Every tool call of a coding agent waits for this process, twice (before and after the call).
Target (issue 29): median <= 1.5x the bare interpreter's median (``python -c pass``) measured in
the same run, on a warm store.

1. A temporary store is warmed: one prompt and ``--warm`` pre/post pairs of assorted calls, so
   the session holds a realistic state and the SQLite file exists in WAL mode.
2. Each timed run starts the command as a host does (stdin JSON, stdout read to the end) and
   measures wall time from just before the process is started to just after it has exited.
   Runs alternate PreToolUse and PostToolUse of new calls in that session.
3. Between timed runs, the bare interpreter (``python -c pass``, the command's own interpreter)
   is timed the same way, so that machine load shows in both and the hook's own share is their
   difference.
4. With ``--compare DIR`` (a checkout of another version, e.g. ``git worktree add /tmp/base
   REF``), the same command is also run with ``PYTHONPATH=DIR``, so that it imports that
   version's package; the three (hook, the other version's hook, bare interpreter) alternate,
   each on a warm store of its own.
5. With ``--server URL``, the command is ``hook claude-code --server URL`` (a running
   ``otel-loopguard serve``; both versions ask the same one) instead of the SQLite store.

Bytecode is cached as on any installed package (in a temporary ``PYTHONPYCACHEPREFIX``, filled
by the warm-up), even where ``PYTHONDONTWRITEBYTECODE`` is set; ``--no-bytecode-cache`` keeps
that setting (then every process compiles the package from source).

    python benchmarks/bench_hook.py --runs 40
    python benchmarks/bench_hook.py --command "$(command -v otel-loopguard)"   # e.g. a shim
    python benchmarks/bench_hook.py --no-bytecode-cache
    python benchmarks/bench_hook.py --compare /tmp/base   # side by side with another checkout
    python benchmarks/bench_hook.py --server http://127.0.0.1:4318   # hook --server, a running serve
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import record

#: The hook's median at most this many times the bare interpreter's median (issue 29).
TARGET_RATIO = 1.5


def default_command() -> list[str]:
    """The console script installed beside this interpreter (what ``pip install`` makes)."""
    beside = Path(sys.executable).with_name("otel-loopguard")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("otel-loopguard")
    return [found] if found else [sys.executable, "-m", "otel_loopguard"]


def interpreter_of(command: list[str]) -> str:
    """The Python that runs ``command`` (its shebang), for the bare-interpreter baseline."""
    try:
        first = Path(command[0]).read_bytes()[:200].split(b"\n", 1)[0]
    except OSError:
        return sys.executable
    if first.startswith(b"#!") and b"python" in first:
        return shlex.split(first[2:].decode())[0]
    return sys.executable


def event(name: str, call: int, session: str = "bench-session") -> bytes:
    tool_input = {"command": f"grep -rn pattern{call % 7} src/", "description": "search"}
    payload: dict[str, object] = {
        "session_id": session,
        "transcript_path": "/tmp/t.jsonl",
        "cwd": "/work",
        "permission_mode": "default",
        "hook_event_name": name,
    }
    if name == "UserPromptSubmit":
        payload["prompt"] = "find the bug"
    else:
        payload.update(tool_name="Bash", tool_input=tool_input, tool_use_id=f"toolu_{call:06d}")
    if name == "PostToolUse":
        payload.update(
            tool_response={"stdout": f"src/a.py:{call % 7}: pattern", "stderr": ""}, duration_ms=40
        )
    return json.dumps(payload).encode()


def timed(
    argv: list[str],
    data: bytes,
    env: dict[str, str],
    cpu: list[float] | None = None,
    cwd: str | None = None,
) -> float:
    """Wall seconds of one run; its CPU seconds (user + system) are appended to ``cpu``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, input=data, capture_output=True, env=env, cwd=cwd, check=False)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} exited {proc.returncode}: {proc.stderr.decode()[:500]}")
    if cpu is not None:
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return elapsed


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} CPUs ({model}), {platform.system()} {platform.release()},"
        f" CPython {platform.python_version()}"
    )


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=40, help="timed invocations (>= 30)")
    parser.add_argument("--warm", type=int, default=20, help="pre/post pairs before timing")
    parser.add_argument(
        "--command",
        help="the otel-loopguard command to time"
        " (default: the console script beside this interpreter)",
    )
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="leave PYTHONDONTWRITEBYTECODE as set (default: cache bytecode)",
    )
    parser.add_argument(
        "--compare",
        metavar="DIR",
        help="also time the command importing the package of the checkout DIR (PYTHONPATH),"
        " alternating with this one",
    )
    parser.add_argument(
        "--server",
        metavar="URL",
        help="time 'hook claude-code --server URL' (a running otel-loopguard serve, e.g. started"
        " with LOOPGUARD_SERVE_TOKEN unset) instead of the SQLite store",
    )
    args = parser.parse_args()
    if args.runs < 30:
        parser.error("--runs: at least 30")
    command = shlex.split(args.command) if args.command else default_command()
    python = interpreter_of(command)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}
    with tempfile.TemporaryDirectory() as directory:
        if args.no_bytecode_cache:
            bytecode = f"PYTHONDONTWRITEBYTECODE={env.get('PYTHONDONTWRITEBYTECODE', '(unset)')}"
        else:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(directory) / "pycache")
            bytecode = "cached (temporary PYTHONPYCACHEPREFIX)"
        hook = [*command, "hook", "claude-code", "--store", str(Path(directory) / "h.sqlite3")]
        other = [*command, "hook", "claude-code", "--store", str(Path(directory) / "o.sqlite3")]
        if args.server:  # its transcript marks go to the default file: here, a temporary one
            hook = other = [*command, "hook", "claude-code", "--server", args.server]
            env["XDG_STATE_HOME"] = directory
        other_env = dict(env, PYTHONPATH=str(Path(args.compare).resolve())) if args.compare else {}
        for argv, environment in [(hook, env), (other, other_env)]:
            if not environment:
                continue
            timed(argv, event("UserPromptSubmit", 0), environment, cwd=directory)
            for call in range(1, args.warm + 1):
                timed(argv, event("PreToolUse", call), environment, cwd=directory)
                timed(argv, event("PostToolUse", call), environment, cwd=directory)
        load_before = load()
        hook_times: list[float] = []
        other_times: list[float] = []
        bare_times: list[float] = []
        hook_cpu: list[float] = []
        other_cpu: list[float] = []
        bare_cpu: list[float] = []
        for run in range(args.runs):
            call = args.warm + 1 + run // 2
            name = "PreToolUse" if run % 2 == 0 else "PostToolUse"
            hook_times.append(timed(hook, event(name, call), env, hook_cpu, directory))
            if other_env:
                other_times.append(timed(other, event(name, call), other_env, other_cpu, directory))
            bare_times.append(timed([python, "-c", "pass"], b"", env, bare_cpu, directory))
        load_after = load()

    def ms(value: float) -> str:
        return f"{value * 1000:.0f} ms"

    median = statistics.median(hook_times)
    bare = statistics.median(bare_times)
    shown = shlex.join(hook) if args.server else f"{shlex.join(hook[:-2])} --store TMP"
    print(f"command: {shown}")
    print(f"machine: {machine()}; load average {load_before} before, {load_after} after")
    print(
        f"runs: {args.runs} (PreToolUse and PostToolUse alternately), warm store"
        f" ({args.warm} calls in the session); bytecode {bytecode}"
    )
    print(
        f"hook invocation: median {ms(median)}, p90 {ms(percentile(hook_times, 0.9))},"
        f" min {ms(min(hook_times))}"
    )
    print(
        f"bare interpreter ({python} -c pass): median {ms(bare)},"
        f" p90 {ms(percentile(bare_times, 0.9))}, min {ms(min(bare_times))}"
    )
    print(f"hook minus interpreter start (medians): {ms(median - bare)}")
    if other_times:
        print(
            f"the same command importing {args.compare}: median {ms(statistics.median(other_times))},"
            f" p90 {ms(percentile(other_times, 0.9))}, min {ms(min(other_times))};"
            f" CPU median {ms(statistics.median(other_cpu))};"
            f" {statistics.median(other_times) / bare:.2f}x the bare interpreter"
        )
    print(
        f"CPU time (user + system), medians: hook {ms(statistics.median(hook_cpu))},"
        f" bare interpreter {ms(statistics.median(bare_cpu))}"
        " (wall time above it is waiting: for a CPU on a loaded machine, for the disk)"
    )
    ratio = median / bare
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    print(f"hook / bare interpreter (medians): {ratio:.2f}x; target <= {TARGET_RATIO}x: {verdict}")
    path = "server_" if args.server else ""
    record(f"{path}hook_vs_bare", ratio, "x")
    record(
        f"{path}hook_cpu_vs_bare", statistics.median(hook_cpu) / statistics.median(bare_cpu), "x"
    )
    if other_times:
        record(f"{path}compared_hook_vs_bare", statistics.median(other_times) / bare, "x")
        record(
            f"{path}compared_hook_cpu_vs_bare",
            statistics.median(other_cpu) / statistics.median(bare_cpu),
            "x",
        )
        print(
            f"hook / the same command importing {args.compare} (medians):"
            f" wall {median / statistics.median(other_times):.2f}x,"
            f" CPU {statistics.median(hook_cpu) / statistics.median(other_cpu):.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
