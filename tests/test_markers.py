"""The quick loop (`pytest -m "not slow and not e2e"`, README, Development) leaves out what the
markers say: a marker pyproject does not declare (a typo such as `slwo`) stops the run instead of
leaving its test in the loop."""

from __future__ import annotations

import os
import subprocess
import sys

from _shared import REPO_DIR


def _pytest_on(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_marked.py").write_text(source)
    # pyproject's [tool.pytest.ini_options] on a file of its own; without the installed plugins,
    # which this does not need and which take most of a start
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                           str(REPO_DIR / "pyproject.toml"), "--rootdir", str(tmp_path), *args,
                           str(tmp_path / "test_marked.py")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_misspelt_marker_stops_the_run(tmp_path):
    done = _pytest_on(tmp_path, "import pytest\n\n@pytest.mark.slwo\ndef test_x():\n    pass\n")
    assert done.returncode != 0 and "'slwo' not found in `markers`" in done.stdout, done.stdout + done.stderr

