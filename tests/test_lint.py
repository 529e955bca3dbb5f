"""The tree is clean under pyproject's [tool.ruff]: `ruff check sparkit tests benchmarks scripts`
finds nothing (README, Development). Most findings are repaired by `ruff check --fix`."""

from __future__ import annotations

import subprocess
import sys

from _shared import REPO_DIR

LINTED = ("sparkit", "tests", "benchmarks", "scripts")


def ruff(*args: str, cwd=REPO_DIR) -> subprocess.CompletedProcess:
    # ruff is in the test extra and pinned in constraints.txt: missing, this fails rather than skips
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_ruff_finds_nothing_in_the_tree():
    done = ruff("check", "--no-cache", *LINTED)
    assert done.returncode == 0, (
        f"ruff check {' '.join(LINTED)} found problems (most are fixed by `ruff check --fix`):\n"
        f"{done.stdout}{done.stderr}")


def test_the_configuration_catches_what_it_is_there_for(tmp_path):
    """The project's configuration, on a file with an unused import, imports out of order, an unused
    variable and an Optional[...] annotation: each is reported under its rule, so the clean tree
    above is clean because of the code, not because nothing is checked."""
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\nfrom typing import Optional\n\n\n"
                   "def f(x: Optional[int]) -> int:\n    unused = 1\n    return os.sep.count(str(x))\n")
    done = ruff("check", "--no-cache", "--config", str(REPO_DIR / "pyproject.toml"), "--output-format",
                "concise", str(bad), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    for rule in ("F401", "I001", "F841", "UP045"):
        assert rule in done.stdout, (rule, done.stdout)
