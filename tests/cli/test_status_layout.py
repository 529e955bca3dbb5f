"""`sparkit status` stays readable where a newcomer first runs it: an 80-column terminal, and
piped into a file or another program. Real `sparkit` processes; the terminal is a real pty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sparkit.runs import Run, RunState

from _shared import run_in_pty

# The longest shipped recipe name makes the longest run id: the case that used to be cut.
LONG_ID = "ling-3.0-flash-spark-humming-fp8head-20261129-171746-04c8"
RUNS = [
    (LONG_ID, "ling-3.0-flash/spark-humming-fp8head", 30000, "stopped"),
    ("tiny-20261129-171800-a1b2", "tiny", 30001, "failed"),
]


def write_runs(home: Path) -> None:
    for run_id, recipe, port, state in RUNS:
        run = Run(id=run_id, recipe_name=recipe, recipe_path=None, engine="embedded",
                  url=f"http://127.0.0.1:{port}", host="127.0.0.1", port=port,
                  started_at="2026-11-29T17:17:46+00:00", state=RunState(state), root=home / "runs")
        run.save()
        run.write_json("probe.json", {"decode_tok_s": 102.88, "accept_length": 3.9})


def env_for(home: Path, columns: int) -> dict[str, str]:
    return {**os.environ, "SPARKIT_HOME": str(home), "COLUMNS": str(columns), "TERM": "xterm-256color"}


def test_piped_status_is_one_plain_line_per_run_with_every_value_whole(sparkit_home):
    write_runs(sparkit_home)
    # COLUMNS=80 is what rich assumes for a pipe: nothing may be cut to fit it.
    done = subprocess.run([sys.executable, "-m", "sparkit", "status", "--all"], env=env_for(sparkit_home, 80),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "\x1b" not in done.stdout and "─" not in done.stdout  # no colour, no box
    header, *rows = lines
    columns = header.split()
    assert columns == ["run", "recipe", "engine", "url", "pid", "state", "uptime", "health", "tok/s", "accept", "checks"]
    assert len(rows) == len(RUNS)
    for line, (run_id, recipe, port, state) in zip(rows, RUNS):
        fields = dict(zip(columns, line.split()))
        assert len(line.split()) == len(columns), line
        assert fields["run"] == run_id and fields["recipe"] == recipe
        assert fields["url"] == f"http://127.0.0.1:{port}" and fields["state"] == state
        assert fields["tok/s"] == "102.9" and fields["accept"] == "3.90"


def test_status_on_an_80_column_terminal_keeps_run_ids_and_urls_unbroken(sparkit_home):
    write_runs(sparkit_home)
    screen = run_in_pty([sys.executable, "-m", "sparkit", "status", "--all"], env_for(sparkit_home, 80), 80)
    lines = screen.splitlines()
    assert all(len(line) <= 80 for line in lines), screen
    for run_id, recipe, port, state in RUNS:
        # The id and the address each sit whole on one line, and every figure is shown.
        assert any(run_id in line for line in lines), screen
        assert any(f"127.0.0.1:{port}" in line for line in lines), screen
        assert recipe in screen and state in screen
    assert screen.count("102.9") == 2 and screen.count("3.90") == 2


def test_status_on_a_wide_terminal_is_a_table(sparkit_home):
    write_runs(sparkit_home)
    screen = run_in_pty([sys.executable, "-m", "sparkit", "status", "--all"], env_for(sparkit_home, 200), 200)
    header = next(line for line in screen.splitlines() if line.startswith("run "))
    assert header.split() == ["run", "recipe", "engine", "url", "pid", "state", "uptime", "health", "tok/s", "accept", "checks"]
    assert any(line.startswith(LONG_ID) and "127.0.0.1:30000" in line for line in screen.splitlines())
