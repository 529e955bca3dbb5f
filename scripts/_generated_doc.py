"""The shared tail of the scripts that generate a doc: write it, or with --check say it is stale.

Imported by its siblings (`python scripts/NAME.py` puts this directory first on sys.path)."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(output: Path, text: str, argv: list[str], *, repo: Path, script: str) -> int:
    """--check: exit 1 naming `script` when `output` differs from `text`; else write it."""
    if "--check" in argv:
        current = output.read_text() if output.exists() else ""
        if current != text:
            print(f"{output.relative_to(repo)} is out of date: run python scripts/{script}", file=sys.stderr)
            return 1
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    print(f"wrote {output.relative_to(repo)}")
    return 0
