"""Make every picture the docs show, from what it shows, with one command::

    python docs/pictures.py                       # all three (the dashboard takes ~2 minutes)
    python docs/pictures.py demo report           # only these
    python docs/pictures.py dashboard --seconds 100

- ``docs/images/demo.png``: ``python -m otel_loopguard demo``'s real output, coloured as a
  terminal would (:func:`capture_demo.page`).
- ``docs/images/dashboard.png``: the dashboard's panels drawn from a real Prometheus after the
  demo served its metrics (``dashboards/render_picture.py``; Debian's ``prometheus``).
- ``docs/images/report.png``: the HTML report of ``otel-loopguard replay --html`` on
  :data:`REPORT_INPUT`.

Each page is screenshot by Debian's headless ``chromium`` with a fresh profile. Then
``docs/images/pictures.json`` records, per picture, the sha256 of its inputs (:func:`inputs`)
and of the picture; ``tests/test_pictures.py`` recomputes the inputs without chromium and names
the picture to make again when one changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
RECORD = IMAGES / "pictures.json"
CHROMIUM = "/usr/bin/chromium"
PROMETHEUS = "/usr/bin/prometheus"
COMMAND = "python docs/pictures.py"
#: The recorded session the report picture shows (a Claude Code transcript with a sub-agent).
REPORT_INPUT = ROOT / "tests" / "data" / "claude_code_session.jsonl"
#: The code that writes the report page: a change there changes the picture.
REPORT_CODE = ROOT / "otel_loopguard" / "replay" / "_html.py"
DASHBOARD_JSON = ROOT / "dashboards" / "loopguard.json"
PICTURES = ("demo", "dashboard", "report")
WIDTH = {"demo": 980, "dashboard": 0, "report": 1200}  # 0: the dashboard grid's own width

sys.path.insert(0, str(ROOT / "docs"))
sys.path.insert(0, str(ROOT / "dashboards"))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _environment() -> dict[str, str]:
    """This environment without LOOPGUARD_* settings (meant for a real agent, not a picture)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}


def demo_text() -> str:
    """What ``python -m otel_loopguard demo`` prints (not on a terminal: no pauses, no colour)."""
    return subprocess.run(
        [sys.executable, "-m", "otel_loopguard", "demo"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=ROOT,
        env=_environment(),
    ).stdout


def inputs(picture: str) -> dict[str, str]:
    """The sha256 of each input of ``picture``, by a name a person can follow."""
    if picture == "demo":
        return {"demo output": _sha256(demo_text().encode())}
    if picture == "dashboard":
        return {str(DASHBOARD_JSON.relative_to(ROOT)): _sha256(DASHBOARD_JSON.read_bytes())}
    if picture == "report":
        return {
            str(path.relative_to(ROOT)): _sha256(path.read_bytes())
            for path in (REPORT_INPUT, REPORT_CODE)
        }
    raise ValueError(f"picture: {picture!r} is not one of {', '.join(PICTURES)}")


def image(picture: str) -> Path:
    return IMAGES / f"{picture}.png"


def stale(picture: str, entry: Mapping[str, object]) -> str | None:
    """Why ``picture`` must be made again, given its :data:`RECORD` ``entry`` (``None``: it
    is up to date): the image is not the one recorded, or an input changed since."""
    command = f"{COMMAND} {picture}"
    name = f"docs/images/{picture}.png"
    if _sha256(image(picture).read_bytes()) != entry.get("sha256"):
        return f"{name} is not the picture recorded in {RECORD.name}: run {command}"
    recorded = entry.get("inputs")
    recorded = recorded if isinstance(recorded, dict) else {}
    now = inputs(picture)
    changed = sorted(k for k in now.keys() | recorded.keys() if now.get(k) != recorded.get(k))
    if changed:
        return f"{name} is stale: {', '.join(changed)} changed since it was made; run {command}"
    return None


def _chromium(profile: Path, *args: str) -> list[str]:
    return [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
    ]


_MARK = "pictures-page-height="


def _height(page: Path, width: int, work: Path) -> int:
    """The page's full height at ``width``, as chromium lays it out."""
    probe = page.with_name(f"height-{page.name}")
    probe.write_text(
        page.read_text(encoding="utf-8") + f"<script>document.title = '{_MARK}' + Math.max("
        "document.documentElement.scrollHeight, document.body.scrollHeight)</script>",
        encoding="utf-8",
    )
    with tempfile.TemporaryDirectory(dir=work) as profile:
        dom = subprocess.run(
            _chromium(Path(profile), f"--window-size={width},800", "--dump-dom", probe.as_uri()),
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
    match = re.search(_MARK + r"(\d+)", dom)
    if match is None:
        raise RuntimeError(f"chromium did not lay out {page.name}")
    return int(match.group(1))


def screenshot(page: Path, out: Path, width: int, work: Path) -> None:
    """``page`` as a PNG ``width`` pixels wide and as tall as the page, by headless chromium
    with a fresh profile."""
    height = _height(page, width, work)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as profile:
        subprocess.run(
            _chromium(
                Path(profile),
                f"--screenshot={out.resolve()}",
                f"--window-size={width},{height}",
                page.as_uri(),
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )


def _demo_page(work: Path, seconds: int) -> tuple[str, int]:
    import capture_demo

    return capture_demo.page(demo_text()), WIDTH["demo"]


def _dashboard_page(work: Path, seconds: int) -> tuple[str, int]:
    import render_picture

    return render_picture.dashboard_page(seconds, PROMETHEUS), render_picture.page_width()


def _report_page(work: Path, seconds: int) -> tuple[str, int]:
    report = work / "report.html"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_loopguard",
            "replay",
            "--html",
            str(report),
            str(REPORT_INPUT.relative_to(ROOT)),  # the page names its input: not this machine's
        ],
        capture_output=True,
        check=True,
        timeout=120,
        cwd=ROOT,
        env=_environment(),
    )
    return report.read_text(encoding="utf-8"), WIDTH["report"]


PAGES: Mapping[str, Callable[[Path, int], tuple[str, int]]] = {
    "demo": _demo_page,
    "dashboard": _dashboard_page,
    "report": _report_page,
}


def make(pictures: Sequence[str], seconds: int) -> None:
    """Make ``pictures`` and record their inputs in :data:`RECORD` (other entries kept)."""
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for picture in pictures:
            # Inputs first: a picture is never recorded as made from inputs newer than it.
            hashes = inputs(picture)
            text, width = PAGES[picture](work, seconds)
            page = work / f"{picture}.html"
            page.write_text(text, encoding="utf-8")
            screenshot(page, image(picture), width, work)
            record[f"{picture}.png"] = {
                "command": f"{COMMAND} {picture}",
                "inputs": hashes,
                "sha256": _sha256(image(picture).read_bytes()),
            }
            # Recorded at once: a later picture that fails leaves this one's record right.
            RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            print(f"wrote {image(picture).relative_to(ROOT)} and its inputs in {RECORD.name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("pictures", nargs="*", help=f"of {', '.join(PICTURES)} (default: all)")
    parser.add_argument(
        "--seconds", type=int, default=100, help="how long the demo feeds the dashboard"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.pictures) - set(PICTURES))
    if unknown:
        parser.error(f"no picture {', '.join(unknown)}: pictures are {', '.join(PICTURES)}")
    needed = [CHROMIUM] + ([PROMETHEUS] if "dashboard" in (args.pictures or PICTURES) else [])
    missing = [path for path in needed if not Path(path).exists()]
    if missing:
        print(f"needs {', '.join(missing)} (Debian's packages)", file=sys.stderr)
        return 1
    make(args.pictures or list(PICTURES), args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
