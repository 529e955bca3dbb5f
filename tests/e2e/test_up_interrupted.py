"""Issue 29, item 8 (runs): a `sparkit up` killed during its startup checks left a run that
`status` showed as `exited`, no failure recorded. The checks are part of the start: a run whose
`up` ends there failed, and its record says when and why (SIGKILL, found later by `status`; SIGTERM,
said at once), and its engine is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "SPARKIT_HOME": str(home), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _meta_in_checks(home: Path, proc: subprocess.Popen, timeout: float = 300) -> dict:
    """The run's record once it says the startup checks are running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for meta in (home / "runs").glob("*/meta.json"):
            try:
                record = json.loads(meta.read_text())
            except (OSError, ValueError):
                continue
            if record.get("phase") == "startup checks":
                return record
        time.sleep(0.01)
    raise AssertionError(f"the startup checks never began (up exited {proc.poll()})")


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("detach", [True, False], ids=["detached", "foreground"])
def test_up_killed_during_its_checks_is_a_failed_start(sparkit_home, detach):
    argv = [sys.executable, "-m", "sparkit", "up", "tiny", "--port", "auto", *(["--detach"] if detach else [])]
    proc = subprocess.Popen(argv, env=_env(sparkit_home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    record = _meta_in_checks(sparkit_home, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    status = subprocess.run([sys.executable, "-m", "sparkit", "status", "--all", "--json"], env=_env(sparkit_home),
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    (run,) = json.loads(status.stdout)["runs"]
    assert run["state"] == "failed"
    assert run["failure"] == f"`sparkit up` (pid {proc.pid}) ended while running the startup checks"
    assert _gone(record["pid"]), "the engine of a start that never finished is still running"


def test_up_terminated_during_its_checks_records_the_interruption(sparkit_home):
    proc = subprocess.Popen([sys.executable, "-m", "sparkit", "up", "tiny", "--port", "auto", "--detach"],
                            env=_env(sparkit_home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    record = _meta_in_checks(sparkit_home, proc)
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    meta = json.loads((sparkit_home / "runs" / record["id"] / "meta.json").read_text())
    assert meta["state"] == "failed" and meta["failure"] == "interrupted during the startup checks"
    assert meta["phase"] is None
    assert _gone(record["pid"])
