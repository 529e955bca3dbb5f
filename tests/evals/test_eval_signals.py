"""Issue 29, item 8 (eval): SIGTERM and SIGHUP to `sparkit eval` gave no resume hint (SIGINT did).
Now each signal keeps the finished answers, says the exact command that resumes the run, exits
130; that command, run as printed, finishes the run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from _shared import GSM8K_DIR

pytestmark = pytest.mark.e2e

LIMIT = 8


def _results_in(path) -> int:
    try:
        return path.read_text().count('"type": "result"')
    except OSError:
        return 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_mid_run_says_how_to_resume_and_the_command_finishes_it(embedded_server, tmp_path, sig):
    if not (GSM8K_DIR / "test.jsonl").exists():
        pytest.skip(f"no GSM8K data at {GSM8K_DIR}")
    out = tmp_path / "r.jsonl"
    args = ["eval", "gsm8k", "--url", embedded_server.url, "--data", str(GSM8K_DIR / "test.jsonl"), "--limit", str(LIMIT),
            "--shots", "1", "--greedy", "--max-tokens", "12", "--out", str(out)]
    env = {**os.environ, "SPARKIT_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "sparkit", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    while _results_in(out) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    os.kill(proc.pid, sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    said = " ".join(stderr.split())
    assert f"interrupted; finished questions are saved in {out}" in said
    command = said.split("resume with: ", 1)[1].strip()
    argv = shlex.split(command)
    assert argv[:3] == ["sparkit", "eval", "gsm8k"] and argv[-1] == "--resume" and argv[argv.index("--out") + 1] == str(out)
    saved = _results_in(out)
    assert 2 <= saved < LIMIT
    resumed = subprocess.run([sys.executable, "-m", "sparkit", *argv[1:], "--json"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["n"] == LIMIT and _results_in(out) == LIMIT
