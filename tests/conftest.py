"""Test-wide setup.

- SPARKIT_HOME points at a per-session temporary directory, so runs, caches and
  histories never touch the developer's real ones; the Hugging Face cache and home too, offline.
- GSM8K_DIR is the GSM8K copy shipped with sparkit (sparkit/evals/data/gsm8k).
- Engine fixtures (a built tiny model, real embedded-server processes) live in
  tests/_engine_fixtures.py and are re-exported here.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _shared import GSM8K_DIR, REPO_DIR, SHARED_DIR  # noqa: E402,F401

_session_home = tempfile.mkdtemp(prefix="sparkit-test-home-")
os.environ["SPARKIT_HOME"] = _session_home
# The hub is never asked (the pull tests start their own, tests/hub_server.py, and say so), and
# nothing the developer downloaded or logged into changes a result: an empty Hugging Face cache
# and home, offline.
os.environ["HF_HOME"] = os.path.join(_session_home, "hf")
os.environ["HF_HUB_CACHE"] = os.path.join(_session_home, "hf", "hub")
os.environ["HF_HUB_OFFLINE"] = "1"
for _name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT"):
    os.environ.pop(_name, None)

try:  # engine fixtures appear once the embedded engine lands
    from _engine_fixtures import *  # noqa: F401,F403,E402
except ImportError as exc:  # pragma: no cover - only while bootstrapping
    if "_engine_fixtures" not in str(exc):
        raise


@pytest.fixture
def sparkit_home(tmp_path, monkeypatch) -> Path:
    """A fresh SPARKIT_HOME for one test (runs, caches, histories isolated)."""
    monkeypatch.setenv("SPARKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def pytest_configure(config):
    """A pytest-xdist worker ignores SIGINT, and a child process inherits an ignored signal: every
    `sparkit` the tests start would then ignore the Ctrl-C the tests send it. The default handler
    here, so that children start with SIGINT as a terminal gives it."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

