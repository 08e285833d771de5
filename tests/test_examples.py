"""``examples/``: the generated policy file matches the Policy declaration and loads back into
the default preset; the processor-with-metrics snippet runs and serves real metrics, and says in
one line when its port is taken."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest
import tomllib

from otel_loopguard.config import PRESETS, Policy, env_var, load_policy, validate_field

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
POLICY_FILE = EXAMPLES / "loopguard.toml"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("examples_generate", EXAMPLES / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clean_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}


# -- examples/loopguard.toml ------------------------------------------------------------------


def test_committed_policy_file_is_what_the_generator_writes() -> None:
    assert POLICY_FILE.read_text(encoding="utf-8") == load_generator().render(), (
        "examples/loopguard.toml is stale: run python examples/generate.py"
    )


def test_generator_check_mode_agrees() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "generate.py"), "--check"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_policy_file_loads_back_into_the_default_preset(tmp_path: Path) -> None:
    text = load_generator().render()
    path = tmp_path / "loopguard.toml"
    path.write_text(text, encoding="utf-8")
    assert load_policy(config_path=path, environ={}) == PRESETS["default"]


def test_every_field_is_there_once_with_its_doc_and_variable() -> None:
    text = load_generator().render()
    for spec in dataclasses.fields(Policy):
        keys = re.findall(rf"^(?:# )?{spec.name} = ", text, flags=re.MULTILINE)
        assert len(keys) == 1, spec.name
        block = text[: text.index(keys[0])].rsplit("\n\n", 1)[-1]
        assert f"# env: {env_var(spec.name)}" in block
        first_words = " ".join(spec.metadata["doc"].split()[:4])
        assert first_words in " ".join(line.lstrip("# ") for line in block.splitlines()), spec.name


def test_fields_without_a_default_are_commented_out_with_valid_examples(tmp_path: Path) -> None:
    text = load_generator().render()
    unset = [
        spec.name
        for spec in dataclasses.fields(Policy)
        if getattr(PRESETS["default"], spec.name) is None
    ]
    assert unset  # advisor_command, trip_log_path, ...
    as_false = text
    for name in unset:
        line = re.search(rf"^# {name} = (.*)$", text, flags=re.MULTILINE)
        assert line is not None, name
        example = tomllib.loads(f"value = {line.group(1)}")["value"]
        validate_field(name, example)  # uncommented, the example is a value the field takes
        as_false = as_false.replace(line.group(0), f"{name} = false")
    # "false keeps it off": each of them set to false loads to the default too.
    path = tmp_path / "as_false.toml"
    path.write_text(as_false, encoding="utf-8")
    assert load_policy(config_path=path, environ={}) == PRESETS["default"]


def test_strings_round_trip_through_toml() -> None:
    generator = load_generator()
    for text in (
        "plain",
        r"\bsed\s+-i",
        "it's",
        "both ' and \\",
        'a "quote"',
        "tab\there",
        "ünïcode",
        "\x7f",
    ):
        assert tomllib.loads(f"v = {generator.toml_string(text)}")["v"] == text


# -- examples/processor_with_metrics.py ------------------------------------------------------


@pytest.mark.slow
def test_processor_with_metrics_example_serves_the_loop() -> None:
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "processor_with_metrics.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_environment(),
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("metrics: http://127.0.0.1:"), line
        url = line.split(" ", 1)[1].strip()
        with urllib.request.urlopen(url, timeout=30) as response:
            metrics = response.read().decode()
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    labels = 'agent="researcher",tool="search"'
    assert f"loopguard_tool_calls_total{{{labels}}} 6.0" in metrics
    deny = PRESETS["default"].no_progress_threshold
    assert deny is not None
    denied = 6 - deny + 1
    assert (
        f'loopguard_decisions_total{{action="deny",agent="researcher",rule="no_progress",'
        f'tool="search"}} {float(denied)}'
    ) in metrics


@pytest.mark.slow
def test_processor_with_metrics_example_on_a_busy_port_says_so_in_one_line() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, str(EXAMPLES / "processor_with_metrics.py"), "--port", str(port)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_environment(),
        )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0], lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_processor_with_metrics_example_refuses_a_port_out_of_range_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "processor_with_metrics.py"), "--port", "70000"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_environment(),
    )
    assert result.returncode == 2, result.stderr
    assert "error: --port 70000: a port is 0 to 65535" in result.stderr
    assert "Traceback" not in result.stderr


def test_processor_with_metrics_example_handles_sigterm_before_it_prints_the_url() -> None:
    # The URL line tells a caller the example is up, and a caller may send SIGTERM the moment it
    # reads it (test_processor_with_metrics_example_serves_the_loop does): the handler must already be there, or SIGTERM kills the
    # process (CI once saw exit -15). The window is microseconds, so the order is checked in the
    # source rather than raced.
    source = (EXAMPLES / "processor_with_metrics.py").read_text(encoding="utf-8")
    handler = source.index("signal.signal(signal.SIGTERM")
    announced = source.index('print(f"metrics: {server.url}"')
    assert handler < announced
