"""`sparkit bench` and `sparkit eval gsm8k` show progress in a log or CI (stderr not a terminal):
a line per finished request or question, counted, on stderr; on a terminal, the rich bar.

The e2e tests run real `sparkit` processes against a real embedded server."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

from sparkit.cli.common import ProgressLines

from _shared import GSM8K_DIR, run_in_pty


def test_progress_lines_step_by_count_and_always_show_the_first_and_the_last():
    out = io.StringIO()
    lines = ProgressLines(out)
    for done in range(0, 9):
        lines.update("bench", done, 8)
        lines.update("bench", done, 8)  # a repeated count adds nothing
    assert out.getvalue().splitlines() == [f"bench: {n}/8" for n in range(9)]

    out = io.StringIO()
    lines = ProgressLines(out)
    for done in range(0, 1320):
        lines.update("gsm8k", done, 1319, f"acc {done % 7}%")
    shown = out.getvalue().splitlines()
    assert shown[0] == "gsm8k: 0/1319 acc 0%" and shown[-1] == "gsm8k: 1319/1319 acc 3%"
    assert 90 <= len(shown) <= 102  # every 14th question: a log of a hundred lines, not 1319


def env_for(tmp_path) -> dict[str, str]:
    return {**os.environ, "SPARKIT_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1", "COLUMNS": "100"}


def bench_argv(url: str, out) -> list[str]:
    return [sys.executable, "-m", "sparkit", "bench", "--url", url, "--input-len", "32", "--output-len", "16",
            "--num-prompts", "3", "--warmup", "1", "--out", str(out), "--json"]


@pytest.mark.e2e
def test_bench_in_a_log_prints_a_line_per_finished_request(embedded_server, tmp_path):
    done = subprocess.run(bench_argv(embedded_server.url, tmp_path / "b.json"), env=env_for(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if re.match(r"^(warmup|bench): \d+/\d+$", line)]
    assert progress == ["warmup: 0/1", "warmup: 1/1", "bench: 0/3", "bench: 1/3", "bench: 2/3", "bench: 3/3"]
    assert "\x1b" not in done.stderr and "━" not in done.stderr  # no bar drawn into the log
    assert json.loads(done.stdout)["complete"] is True  # stdout stays one JSON document


@pytest.mark.e2e
def test_bench_on_a_terminal_keeps_the_progress_bar(embedded_server, tmp_path):
    screen = run_in_pty(bench_argv(embedded_server.url, tmp_path / "b.json"), env_for(tmp_path), 100, timeout=300)
    assert "━" in screen and "3/3" in screen  # rich's bar and its count
    assert "bench: 1/3" not in screen


@pytest.mark.e2e
def test_eval_in_a_log_prints_a_line_per_finished_question(embedded_server, tmp_path):
    argv = [sys.executable, "-m", "sparkit", "eval", "gsm8k", "--url", embedded_server.url,
            "--data", str(GSM8K_DIR / "test.jsonl"), "--limit", "3", "--shots", "0", "--greedy",
            "--max-tokens", "8", "--out", str(tmp_path / "e.jsonl"), "--json"]
    done = subprocess.run(argv, env=env_for(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("gsm8k: ")]
    assert [line.split()[1] for line in progress] == ["0/3", "1/3", "2/3", "3/3"]
    assert all(re.fullmatch(r"gsm8k: [1-3]/3 acc \d+\.\d%", line) for line in progress[1:]), progress
    assert "\x1b" not in done.stderr and "━" not in done.stderr
    assert json.loads(done.stdout)["n"] == 3
