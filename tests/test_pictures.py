"""The docs' pictures are made from what they show: when an input changed since a picture was
made (the demo's output, the dashboard JSON, the replay report's input or its HTML code), this
fails naming the picture and the command that makes it again. No chromium needed: the inputs'
hashes are recomputed the way ``docs/pictures.py`` recorded them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pictures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pictures", ROOT / "docs" / "pictures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("pictures", module)
    spec.loader.exec_module(module)
    return module


PICTURES = _pictures()
RECORD: dict[str, dict[str, object]] = json.loads(PICTURES.RECORD.read_text())


def test_every_picture_is_recorded_with_its_command() -> None:
    assert sorted(RECORD) == sorted(f"{name}.png" for name in PICTURES.PICTURES)
    for name, entry in RECORD.items():
        assert entry["command"] == f"python docs/pictures.py {name.removesuffix('.png')}"


@pytest.mark.parametrize("picture", PICTURES.PICTURES)
def test_picture_was_made_from_the_inputs_of_today(picture: str) -> None:
    problem = PICTURES.stale(picture, RECORD[f"{picture}.png"])
    assert problem is None, problem


@pytest.mark.parametrize("picture", PICTURES.PICTURES)
def test_a_changed_input_names_the_picture_and_the_command(picture: str) -> None:
    entry = RECORD[f"{picture}.png"]
    inputs = entry["inputs"]
    assert isinstance(inputs, dict) and inputs
    name = sorted(inputs)[0]
    changed = {**entry, "inputs": {**inputs, name: "0" * 64}}
    assert PICTURES.stale(picture, changed) == (
        f"docs/images/{picture}.png is stale: {name} changed since it was made;"
        f" run python docs/pictures.py {picture}"
    )
    replaced = {**entry, "sha256": "0" * 64}
    problem = PICTURES.stale(picture, replaced)
    assert problem is not None and f"run python docs/pictures.py {picture}" in problem
