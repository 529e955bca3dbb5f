"""Paths every test may need. Import as `from _shared import GSM8K_DIR` (tests/ is on sys.path;
`from _shared import` is ambiguous once sub-folders have their own conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
SHARED_DIR = Path(os.environ.get("SPARKIT_SHARED_DIR", REPO_DIR.parent / "shared"))
GSM8K_DIR = SHARED_DIR / "data" / "gsm8k"
