"""Capture the demo as a picture: ``python docs/capture_demo.py`` runs ``python -m otel_loopguard
demo`` (no network, no keys), colours its guard lines as a terminal would, and screenshots the
page with headless Chromium (Debian's ``chromium`` package) into ``docs/images/demo.png``.

The text is the demo's real output, unedited; only colours are added.
"""

from __future__ import annotations

import argparse
import html
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLOURS = {"REMIND": "#e5c07b", "DENY": "#e06c75", "STOP": "#c678dd", "allow": "#98c379"}


def page(text: str) -> str:
    lines = []
    for line in text.splitlines():
        escaped = html.escape(line)
        for word, colour in COLOURS.items():
            marker = f"guard: {word}"
            if marker in line:
                escaped = escaped.replace(marker, f'guard: <b style="color:{colour}">{word}</b>', 1)
        lines.append(escaped)
    body = "\n".join(lines)
    return (
        "<!doctype html><meta charset='utf-8'><style>body{margin:0;background:#1e2127}"
        "pre{margin:0;padding:16px 20px;color:#dcdfe4;white-space:pre-wrap;"
        "font:13px/1.35 'DejaVu Sans Mono',monospace}"
        f"</style><pre>{body}</pre>"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "demo.png")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        print("needs Debian's chromium package", file=sys.stderr)
        return 2
    text = subprocess.run(
        [sys.executable, "-m", "otel_loopguard", "demo"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    height = 32 + 18 * (text.count("\n") + 1)
    with tempfile.TemporaryDirectory() as work:
        source = Path(work) / "demo.html"
        source.write_text(page(text))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--screenshot={args.out.resolve()}",
                f"--window-size=980,{height}",
                source.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
