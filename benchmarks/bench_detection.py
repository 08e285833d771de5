"""Detection on real agent runs: every preset through the corpus evaluator, beside the baselines.

    python benchmarks/bench_detection.py                       # ../shared/corpus/trajectories
    python benchmarks/bench_detection.py --corpus DIR          # another labelled corpus folder
    python benchmarks/bench_detection.py --presets default,rescue --no-baselines --markdown
    python benchmarks/bench_detection.py --in-process          # same adapter, no subprocess per file

The evaluator (``DIR/../eval/evaluate.py`` unless ``--evaluator``) replays each labelled run
through each detector and prints recall, calls cut and false blocks side by side. The project
runs as an external detector, one command per preset: this script with ``--adapter PRESET``.
The adapter goes through the real ``replay`` path (``otel-loopguard replay --json --format
transcript --preset PRESET -``), not a re-implementation:

1. Evaluator lines (``{"seq", "tool", "arguments", "is_error", "result"}`` and
   ``{"type": "user_message"}``) become transcript lines (``session``, ``tool``, ``arguments``,
   ``error``, ``result``); ``result`` is an opaque token there, compared for equality only.
2. ``replay --json`` answers one line per call with a 1-based ``index`` per session (one session
   here), and a second line with ``"phase": "post"`` when the guard concluded after the call ran.
3. Each answer goes back as ``{"seq": index - 1, "action": ..., "phase": ...}``.

A failed replay (a bad line, an exception) exits non-zero; the evaluator then reports the file
and exits 3, and so does this script. Without the corpus folder the script says so in one line
and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from _results import ENV as RESULTS_ENV
from _results import record

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = Path("..") / "shared" / "corpus" / "trajectories"
SESSION = "run"


def to_transcript(lines: list[str]) -> tuple[str, list[int]]:
    """Evaluator lines -> transcript lines, and the evaluator ``seq`` of each call in order."""
    out: list[str] = []
    seqs: list[int] = []
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("type") == "user_message":
            out.append(json.dumps({"type": "user_message", "session": SESSION}))
            continue
        seqs.append(record["seq"])
        out.append(
            json.dumps(
                {
                    "session": SESSION,
                    "tool": record["tool"] or "<unnamed>",
                    "arguments": record.get("arguments"),
                    "error": record.get("is_error"),
                    "result": record.get("result"),
                },
                ensure_ascii=False,
            )
        )
    return "".join(f"{line}\n" for line in out), seqs


def from_replay(text: str, seqs: list[int]) -> str:
    """``replay --json`` lines -> evaluator decision lines (index is 1-based, seq 0-based)."""
    out: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        seq = seqs[record["index"] - 1]
        answer = {"seq": seq, "action": record["action"]}
        if record.get("phase") == "post":
            answer["phase"] = "post"
        out.append(json.dumps(answer))
    return "".join(f"{line}\n" for line in out)


def adapt(lines: list[str], preset: str) -> tuple[int, str, str]:
    """Run one evaluator file through ``replay``; return (exit status, decision lines, stderr)."""
    from otel_loopguard.cli import main as cli_main

    transcript, seqs = to_transcript(lines)
    stdin = io.TextIOWrapper(io.BytesIO(transcript.encode("utf-8")), encoding="utf-8")
    stdout, stderr = io.StringIO(), io.StringIO()
    saved = sys.stdin
    sys.stdin = stdin
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = cli_main(
                ["replay", "--json", "--format", "transcript", "--preset", preset, "-"]
            )
    finally:
        sys.stdin = saved
    if status != 0:
        return status, "", stderr.getvalue()
    return 0, from_replay(stdout.getvalue(), seqs), stderr.getvalue()


def _serve_adapter(preset: str) -> int:
    status, answer, errors = adapt(sys.stdin.read().splitlines(), preset)
    sys.stdout.write(answer)
    sys.stderr.write(errors)
    return status


def _load_evaluator(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("evaluate", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["evaluate"] = module
    spec.loader.exec_module(module)
    return module


def record_detectors(detectors: dict[str, Any]) -> None:
    """Each preset's headline figures from the evaluator's metrics (for compare.py): stuck runs
    blocked, the repeats cut in them, false blocks on productive and on no-repetition runs."""
    for name, result in detectors.items():
        if not name.startswith("loopguard-"):
            continue  # a baseline detector: not this package
        preset = name.removeprefix("loopguard-")
        metrics = result["metrics"]
        stuck = metrics["stuck"]
        record(f"{preset}: stuck runs blocked", stuck["hits_block"], "runs", better="higher")
        record(
            f"{preset}: repeats cut in stuck runs", stuck["cut_repeats"], "calls", better="higher"
        )
        for group in ("productive-repetition", "no-repetition"):
            record(f"{preset}: false blocks, {group}", metrics[group]["block_files"], "runs")


def _in_process(evaluator: Path, corpus: Path, presets: list[str], markdown: bool) -> int:
    """The same adapter and the evaluator's own scoring, without a process per file (for tuning)."""
    ev = _load_evaluator(evaluator)
    trajectories = ev.load_corpus(corpus, corpus / "labels.json")
    results: dict[str, dict[str, Any]] = {}
    failed = 0
    for preset in presets:
        files = {}
        for traj in trajectories:
            status, answer, errors = adapt(ev.deployment_view(traj).splitlines(), preset)
            problems: list[str] = []
            if status != 0:
                failed += 1
                print(
                    f"error: {preset}: {traj.name}: exit {status}: {errors[-300:]}", file=sys.stderr
                )
            files[traj.name] = ev.score_file(
                traj, ev.parse_decisions(answer, len(traj.calls), problems)
            )
        results[f"loopguard-{preset}"] = {
            "metrics": ev.aggregate(files),
            "stuck_by_source": ev.by_source(trajectories, files),
        }
    print(ev.tables(results, markdown, False))
    record_detectors(results)
    return 3 if failed else 0


def main(argv: list[str] | None = None) -> int:
    from otel_loopguard import PRESETS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--corpus",
        type=Path,
        default=DEFAULT_CORPUS,
        help="labelled trajectories folder (default: %(default)s)",
    )
    parser.add_argument(
        "--evaluator",
        type=Path,
        default=None,
        help="evaluate.py (default: CORPUS/../eval/evaluate.py)",
    )
    parser.add_argument(
        "--presets", default=",".join(PRESETS), help="comma-separated presets (default: all)"
    )
    parser.add_argument("--no-baselines", action="store_true", help="only the presets")
    parser.add_argument("--markdown", action="store_true", help="Markdown tables")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the adapter in this process (fast; no baselines)",
    )
    parser.add_argument(
        "--adapter",
        metavar="PRESET",
        help="act as the evaluator's external detector for PRESET (stdin -> stdout)",
    )
    args = parser.parse_args(argv)
    if args.adapter:
        return _serve_adapter(args.adapter)
    corpus: Path = args.corpus
    if not (corpus / "labels.json").is_file():
        print(
            f"bench_detection: skipped, no labelled corpus at {corpus}: the corpus is not part of"
            " the repository; give a folder of labelled runs (labels.json beside the runs) with"
            " --corpus DIR"
        )
        return 0
    evaluator = args.evaluator or corpus.parent / "eval" / "evaluate.py"
    if not evaluator.is_file():
        print(f"bench_detection: skipped, no evaluator at {evaluator} (see --evaluator)")
        return 0
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        parser.error(f"unknown preset(s): {', '.join(unknown)}")
    if args.in_process:
        return _in_process(evaluator, corpus.resolve(), presets, args.markdown)
    command = [sys.executable, str(evaluator), "--trajectories", str(corpus)]
    scratch = tempfile.TemporaryDirectory(prefix="bench-detection-")
    figures = Path(scratch.name) / "results.json"
    # the evaluator's JSON only when the figures are recorded (compare.py), in a scratch folder
    command += ["--json", str(figures)] if os.environ.get(RESULTS_ENV) else ["--no-json"]
    if args.no_baselines:
        command.append("--no-baselines")
    if args.markdown:
        command.append("--markdown")
    me = shlex.quote(str(Path(__file__).resolve()))
    for preset in presets:
        command += [
            "--external",
            f"{shlex.quote(sys.executable)} {me} --adapter {preset}",
            "--external-name",
            f"loopguard-{preset}",
        ]
    env = dict(os.environ)
    # this checkout's package, unless PYTHONPATH names another one (compare.py does)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT)]))
    with scratch:
        status = subprocess.run(command, env=env, check=False).returncode
        if figures.is_file():
            record_detectors(json.loads(figures.read_text(encoding="utf-8"))["detectors"])
    if status != 0:
        print(
            f"bench_detection: the evaluator exited {status}"
            + (" (an external detector failed on some file)" if status == 3 else ""),
            file=sys.stderr,
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
