"""`sparkit eval` through the real CLI process: user mistakes give a clear message and exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _shared import GSM8K_DIR


def sparkit(*args: str, home) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARKIT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_bad_data_path_exits_8_with_a_clear_message(tmp_path):
    done = sparkit("eval", "gsm8k", "--url", "http://127.0.0.1:9", "--data", str(tmp_path / "missing.jsonl"), home=tmp_path)
    assert done.returncode == 8
    assert "GSM8K data file not found" in done.stderr and "missing.jsonl" in done.stderr
    assert "Traceback" not in done.stderr


def test_greedy_and_explicit_sampling_flags_conflict(tmp_path):
    done = sparkit("eval", "gsm8k", "--url", "http://127.0.0.1:9", "--greedy", "--temperature", "0.6", home=tmp_path)
    assert done.returncode == 2 and "--greedy cannot be combined" in done.stderr


def test_unreachable_server_is_an_engine_error_and_keeps_the_header(tmp_path):
    out = tmp_path / "r.jsonl"
    done = sparkit("eval", "gsm8k", "--url", "http://127.0.0.1:9", "--data", str(GSM8K_DIR / "test.jsonl"),
                   "--limit", "2", "--out", str(out), home=tmp_path)
    assert done.returncode == 7, done.stderr
    assert "127.0.0.1:9" in done.stderr and "Traceback" not in done.stderr
    assert json.loads(out.read_text().splitlines()[0])["type"] == "header"


@pytest.mark.slow
def test_resume_into_a_file_made_with_other_settings_is_refused(tmp_path):
    out = tmp_path / "r.jsonl"
    sparkit("eval", "gsm8k", "--url", "http://127.0.0.1:9", "--data", str(GSM8K_DIR / "test.jsonl"),
            "--limit", "2", "--greedy", "--out", str(out), home=tmp_path)
    base = ("eval", "gsm8k", "--url", "http://127.0.0.1:9", "--data", str(GSM8K_DIR / "test.jsonl"), "--out", str(out))
    again = sparkit(*base, "--greedy", home=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr and "--resume" in again.stderr
    other = sparkit(*base, "--temperature", "0.6", "--resume", home=tmp_path)
    assert other.returncode == 2
    assert "different settings" in other.stderr and "temperature: 0.0 -> 0.6" in other.stderr
    # Same settings: the check passes and the run proceeds (to the unreachable server: exit 7).
    same = sparkit(*base, "--greedy", "--resume", "--limit", "5", home=tmp_path)
    assert same.returncode == 7, same.stderr


def test_compare_of_missing_results_is_a_data_error(tmp_path):
    done = sparkit("eval", "compare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), home=tmp_path)
    assert done.returncode == 8 and "results file not found" in done.stderr
