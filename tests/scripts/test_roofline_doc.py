"""docs/roofline.md is generated from the roofline model and the measured figures: it must be current."""

from __future__ import annotations

import subprocess
import sys

import pytest

from _shared import REPO_DIR


@pytest.mark.slow
def test_the_roofline_doc_is_up_to_date():
    proc = subprocess.run([sys.executable, str(REPO_DIR / "scripts" / "gen_roofline_table.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_doc_compares_every_published_figure():
    from sparkit.roofline.published import PUBLISHED

    text = (REPO_DIR / "docs" / "roofline.md").read_text()
    for figure in PUBLISHED:
        row = next((line for line in text.splitlines()
                    if line.startswith(f"| `{figure.recipe}` | {figure.workload} ({figure.context:,})")), None)
        assert row is not None, figure
        assert "**" in row  # the fraction of the limit
