"""The demo's picture page: ``python -m otel_loopguard demo``'s output with its guard lines
coloured as a terminal would; the text is the demo's real output, unedited.

``python docs/capture_demo.py`` makes ``docs/images/demo.png`` (the same as
``python docs/pictures.py demo``, which makes every picture and records its inputs).
"""

from __future__ import annotations

import html
import sys
from pathlib import Path

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


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import pictures

    sys.exit(pictures.main(["demo"]))
