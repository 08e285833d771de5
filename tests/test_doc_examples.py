"""Every example of README.md and docs/*.md runs as written (sybil).

Python blocks (and ``<!-- invisible-code-block: python -->`` setup) run in one namespace per
page, in order. ``sh`` and ``bash`` blocks (and the ``$`` lines of ``console`` blocks) run with
bash in a temporary directory per page (also ``HOME``), the test virtualenv's ``bin`` first on
``PATH``; each must exit 0 within its timeout. A command that serves until stopped
(``otel-loopguard serve``, ``demo --metrics-port``) is started, must print its URL and answer on
it, and is stopped when its block ends. JSON, YAML and TOML blocks are parsed (TOML through the
package's own loader, so a stale field name fails). A block the test cannot run here follows
``<!-- not-run: REASON -->``; that list is pinned below.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from sybil import Document, Example
from sybil.example import NotEvaluated
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
NOT_RUN = re.compile(r"<!-- not-run: (.+?) -->\n(?:\n)?\Z")
SERVES = re.compile(r"otel-loopguard serve\b|--metrics-port\b")
URL = re.compile(r"(https?://[\w.\-]+:\d+)(/metrics)?")
COMMAND_TIMEOUT = 60.0
START_TIMEOUT = 20.0

# Every block that does not run here, by page and reason: none is dropped silently.
EXPECTED_NOT_RUN = [
    (
        "README.md",
        "the quickstart: creates a virtualenv (`.ci/package` smoke-tests install + demo)",
    ),
    ("README.md", "the quickstart's test command: this test runs inside it"),
    ("docs/frameworks.md", "needs the frameworks, installed from the network"),
    ("docs/frameworks.md", "installs google-adk from the network"),
    ("docs/getting-started.md", "the quickstart: creates a virtualenv"),
    ("docs/getting-started.md", "the test command: this test runs inside it"),
    ("docs/serve.md", "installs from the network"),
    ("docs/serve.md", "needs Docker"),
]


def not_run_reason(example: Example) -> str | None:
    match = NOT_RUN.search(example.document.text[: example.start])
    return match.group(1) if match else None


def skip_not_run(example: Example) -> None:
    """Pushed before every other evaluator: a block marked not-run is not evaluated."""
    if not_run_reason(example) is None:
        raise NotEvaluated()


def workdir(example: Example) -> Path:
    """The page's temporary directory (also HOME), made on first use."""
    if "_workdir" not in example.namespace:
        path = Path(tempfile.mkdtemp(prefix="loopguard-docs-"))
        (path / "home").mkdir()
        example.namespace["_workdir"] = path
    directory: Path = example.namespace["_workdir"]
    return directory


def shell_env(directory: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPGUARD_", "OTEL_"))}
    env.pop("XDG_STATE_HOME", None)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(directory / "home")
    env["LOOPGUARD_DOCS_DATA"] = str(ROOT / "tests" / "data")
    return env


def commands(source: str) -> list[str]:
    """The block's lines, continuation lines joined; blank lines and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", source)
    return [
        line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def start_server(
    line: str, directory: Path, env: dict[str, str], exports: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start a command that serves until stopped; return once it answers on its URL."""
    line = re.sub(r"\s*&\s*(#.*)?$", "", line)
    log = directory / f"server-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "-c", "\n".join([*exports, line])],
            cwd=directory,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        match = URL.search(log.read_text(errors="replace"))
        if match:
            path = "/metrics" if match.group(2) else "/healthz"
            with urllib.request.urlopen(match.group(1) + path, timeout=5) as answer:
                assert answer.status == 200
            return process
        if process.poll() is not None:
            break
        time.sleep(0.05)
    stop(process)
    raise AssertionError(f"{line!r} did not come up:\n{log.read_text(errors='replace')}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def run_console(example: Example) -> None:
    """A console block: its `$ ` lines are the commands (the rest is their output)."""
    lines = str(example.parsed).splitlines()
    run_shell(example, "\n".join(line[2:] for line in lines if line.startswith("$ ")))


def run_shell(example: Example, source: str | None = None) -> None:
    """Run a sh block: runs of ordinary commands as one bash script (set -e), servers aside."""
    source = str(example.parsed) if source is None else source
    directory = workdir(example)
    env = shell_env(directory)
    servers: list[subprocess.Popen[bytes]] = []
    script: list[str] = []
    exports: list[str] = []  # the block's `export` lines reach every later command

    def flush() -> None:
        if not script:
            return
        text = "\n".join(["set -euo pipefail", *exports, *script])
        script.clear()
        done = subprocess.run(
            ["bash", "-c", text],
            cwd=directory,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=COMMAND_TIMEOUT,
        )
        assert done.returncode == 0, (
            f"{example.path}:{example.line}: exit {done.returncode}\n{text}\n"
            f"{done.stdout.decode(errors='replace')[-2000:]}\n{done.stderr.decode(errors='replace')[-2000:]}"
        )

    try:
        if "<<" in source:  # a heredoc: the block is one script
            script.append(source)
        else:
            for line in commands(source):
                if SERVES.search(line):
                    flush()
                    servers.append(start_server(line, directory, env, tuple(exports)))
                elif line.startswith("export "):
                    exports.append(line)
                else:
                    script.append(line)
        flush()
    finally:
        for server in servers:
            stop(server)


def parse_json(example: Example) -> None:
    json.loads(str(example.parsed))


def parse_yaml(example: Example) -> None:
    assert yaml.safe_load(str(example.parsed)) is not None


def parse_toml(example: Example) -> None:
    from otel_loopguard import load_policy

    path = workdir(example) / "example.toml"
    path.write_text(str(example.parsed))
    load_policy(config_path=path, environ={})


PARSERS: list[Any] = [
    PythonCodeBlockParser(),
    CodeBlockParser("sh", run_shell),
    CodeBlockParser("bash", run_shell),
    CodeBlockParser("console", run_console),
    CodeBlockParser("json", parse_json),
    CodeBlockParser("yaml", parse_yaml),
    CodeBlockParser("toml", parse_toml),
]


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_example_of_the_page_runs(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in [v for v in os.environ if v.startswith("LOOPGUARD_")]:
        monkeypatch.delenv(variable)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # Python examples write their files where the shell ones do
    document = Document.parse(str(page), *PARSERS)
    document.namespace["_workdir"] = tmp_path
    document.push_evaluator(skip_not_run)
    try:
        for example in document:
            example.evaluate()
    finally:
        document.namespace.clear()


def test_every_code_block_has_a_known_language_and_not_run_blocks_are_the_expected_ones() -> None:
    runnable = {"python", "sh", "bash", "console", "json", "yaml", "toml"}
    not_run = []
    for page in PAGES:
        text = page.read_text()
        for fence in re.finditer(r"^```(\w*)\n", text, re.M):
            if text.count("\n```", 0, fence.start()) % 2:  # a closing fence
                continue
            # plain text blocks (diagrams) only in the design notes, which another issue owns
            plain = {"text", ""} if page.name == "DESIGN.md" else {"text"}
            assert fence.group(1) in runnable | plain, (name(page), fence.group(0))
        for reason in re.findall(r"<!-- not-run: (.+?) -->\n\n?```", text):
            not_run.append((name(page), reason))
        # a not-run comment is always directly before a block
        assert len(re.findall(r"<!-- not-run:", text)) == len(
            re.findall(r"<!-- not-run: .+? -->\n\n?```", text)
        ), name(page)
    assert not_run == EXPECTED_NOT_RUN


@pytest.mark.slow
def test_a_started_server_answers_and_is_gone_once_stopped() -> None:
    """The helper behind serve and demo --metrics-port: up on its URL, then stopped for good."""
    directory = Path(tempfile.mkdtemp(prefix="loopguard-docs-"))
    env = shell_env(directory)
    process = start_server("otel-loopguard serve --no-grpc --http-port 0 &", directory, env)
    (log,) = directory.glob("server-*.log")
    match = URL.search(log.read_text())
    assert match is not None
    stop(process)
    assert process.returncode is not None
    with pytest.raises(OSError):
        urllib.request.urlopen(match.group(1) + "/healthz", timeout=2)
