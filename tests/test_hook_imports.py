"""The command hook imports only what it needs (issue 29 item 1).

A host starts ``otel-loopguard hook HOST`` once per event, twice per tool call, so every module
the process imports is paid on every call. The real command runs in a subprocess (one
PreToolUse, as Claude Code sends it) through a small wrapper that prints the modules the command
added to ``sys.modules``; the package's own modules and the third-party packages are compared to
the sets written here, so a new import on the path fails the test. No timing is asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .service_tools import require_serve_prerequisites, serve_process
from .test_hooks import claude_pre, clean_env

TOKEN = "hook-imports-token"

#: Prints, on stderr, the modules the command added to ``sys.modules`` (what the interpreter
#: and ``site`` imported before it does not count: it differs between installations).
WRAPPER = """\
import io, json, sys
before = set(sys.modules)
from otel_loopguard.cli import main
sys.stdin = io.TextIOWrapper(io.BytesIO(sys.argv[1].encode()))
code = main(sys.argv[2:])
added = sorted(set(sys.modules) - before)
print(json.dumps({"code": code, "added": added}), file=sys.stderr)
"""

#: The package modules every hook process imports: the command line, the hooks' protocol (its
#: events and answers), the policy and its settings, and what they name.
COMMON = {
    "otel_loopguard",
    "otel_loopguard._calls",
    "otel_loopguard._cli_hook",
    "otel_loopguard._decision",
    "otel_loopguard._defaults",
    "otel_loopguard._engine",
    "otel_loopguard._env",
    "otel_loopguard._lazy",
    "otel_loopguard._memory",
    "otel_loopguard._memory_records",
    "otel_loopguard._memory_sqlite",
    "otel_loopguard._plain",
    "otel_loopguard._policy",
    "otel_loopguard._policy_fields",
    "otel_loopguard._policy_texts",
    "otel_loopguard._prices",
    "otel_loopguard._record",
    "otel_loopguard._rules",
    "otel_loopguard._settings",
    "otel_loopguard._spend",
    "otel_loopguard._token",
    "otel_loopguard._trail",
    "otel_loopguard._validation",
    "otel_loopguard.cli",
    "otel_loopguard.config",
    "otel_loopguard.hooks",
    "otel_loopguard.hooks._answers",
    "otel_loopguard.hooks._hosts",
    "otel_loopguard.hooks._runner",
    "otel_loopguard.hooks._store",
    "otel_loopguard.hooks._transcript",
}

#: With the SQLite store: the guard, without its advisor, metrics backends or span machinery.
LOCAL = COMMON | {
    "otel_loopguard._asks",
    "otel_loopguard._classifier",
    "otel_loopguard._core",
    "otel_loopguard._core_memory",
    "otel_loopguard._core_records",
    "otel_loopguard._core_spend",
    "otel_loopguard._early",
    "otel_loopguard._guard",
    "otel_loopguard._intent",
    "otel_loopguard._ledger",
    "otel_loopguard._reporter",
    "otel_loopguard._session_store",
    "otel_loopguard._triplog",
    "otel_loopguard._upkeep",
    "otel_loopguard.metrics",
    "otel_loopguard.metrics._labels",
    "otel_loopguard.metrics._spec",
}

#: With ``--server``: the request (one POST on a plain socket) instead of the guard.
SERVER = COMMON | {"otel_loopguard.hooks._remote", "otel_loopguard.hooks._wire"}

#: The third-party packages (top-level names) either path imports.
THIRD_PARTY = {"orjson", "xxhash"}

#: Standard-library modules neither path needs on an ordinary call: the advisor's process runner
#: and thread pool (a rescue imports them), what serve uses, argparse (an ordinary hook command
#: line is read without it), json (orjson reads and writes; json only reads what orjson
#: cannot) and logging (the package's logger, ``_lazy.logger()``, imports it on the first message).
NOT_STDLIB = {
    "argparse",
    "asyncio",
    "concurrent.futures",
    "json",
    "logging",
    "shutil",
    "subprocess",
    "tomllib",
}


def added_modules(event: dict[str, object], *args: str, env: dict[str, str]) -> list[str]:
    """The modules ``otel-loopguard hook claude-code ARGS`` added, answering ``event``."""
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, json.dumps(event), "hook", "claude-code", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {}  # the call was allowed: the ordinary path
    report = json.loads(proc.stderr.splitlines()[-1])
    assert report["code"] == 0
    added: list[str] = report["added"]
    return added


def check(added: list[str], package: set[str]) -> None:
    ours = {m for m in added if m == "otel_loopguard" or m.startswith("otel_loopguard.")}
    assert ours == package, (
        f"imported and not listed: {sorted(ours - package)};"
        f" listed and not imported: {sorted(package - ours)}"
    )
    tops = {m.split(".")[0] for m in added} - set(sys.stdlib_module_names) - {"otel_loopguard"}
    assert tops == THIRD_PARTY
    assert NOT_STDLIB.isdisjoint(added), sorted(NOT_STDLIB & set(added))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    require_serve_prerequisites()
    with serve_process(env=clean_env(LOOPGUARD_SERVE_TOKEN=TOKEN)) as url:
        yield url


def test_the_sqlite_hook_imports_the_guard_and_nothing_else(tmp_path: Path) -> None:
    event = claude_pre("Bash", {"command": "ls"}, "toolu_1", session="imports-local")
    added = added_modules(event, "--store", str(tmp_path / "s.sqlite3"), env=clean_env())
    check(added, LOCAL)
    # Named so that a failure says which: none of these is on the list above.
    for heavy in (
        "otel_loopguard._memory_file",  # the other memory stores
        "otel_loopguard._memory_redis",
        "otel_loopguard._advice",
        "otel_loopguard._wrap",  # guard.wrap, for plain tool functions
        "otel_loopguard._attributes",  # a trip line's fields: only with a trip log
        "otel_loopguard._exemplars",
        "contextvars",
        "otel_loopguard.metrics._exposition",  # serving /metrics
        "otel_loopguard.metrics.prometheus",
        "otel_loopguard.metrics.otel",
        "otel_loopguard.replay",
        "otel_loopguard._conventions",
        "otel_loopguard.processor",
        "otel_loopguard.service",
        "genai_prices",
        "opentelemetry",
        "prometheus_client",
        "grpc",
        "google.protobuf",
    ):
        assert heavy not in added, heavy


def test_the_server_hook_imports_no_guard(server: str) -> None:
    event = claude_pre("Bash", {"command": "ls"}, "toolu_1", session="imports-server")
    added = added_modules(event, "--server", server, env=clean_env(LOOPGUARD_SERVE_TOKEN=TOKEN))
    check(added, SERVER)
    assert "socket" in added  # it did ask the server: on a plain socket, not with http.client
    assert "http.client" not in added and "ssl" not in added and "email" not in added
    assert "otel_loopguard._guard" not in added and "otel_loopguard._core" not in added
