"""The bench/compare/tune/verify commands through the CLI entry point (no servers)."""

from __future__ import annotations

import json
import subprocess
import sys

from sparkit.bench.runner import BENCH_KIND, summarise


def sparkit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkit", *args], capture_output=True, text=True, timeout=60)


def write_result(path, tpots, accept=2.0):
    repeats = [{"complete": True, "figures": {"tpot_mean_ms": t, "step_time_estimate_ms": t * accept}} for t in tpots]
    cfg = {"dataset": "random", "input_len": 64, "output_len": 32, "concurrency": 1, "temperature": 0.0, "ignore_eos": True, "seed": 0}
    path.write_text(json.dumps({"kind": BENCH_KIND, "config": cfg, "repeats": repeats, "summary": summarise(repeats)}))
    return path


def test_compare_json_reports_ratio_and_noise(tmp_path):
    a = write_result(tmp_path / "a.json", [10.0, 10.1, 9.9])
    b = write_result(tmp_path / "b.json", [5.0, 5.1, 4.9])
    done = sparkit("bench", "compare", str(a), str(b), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    tpot = next(f for f in doc["figures"] if f["key"] == "tpot_mean_ms")
    assert abs(tpot["ratio"] - 0.5) < 1e-9 and tpot["verdict"] == "better"
    assert any("3 (A) and 3 (B) repeats" in n for n in doc["notes"])


def test_compare_table_names_the_repeats(tmp_path):
    a = write_result(tmp_path / "a.json", [10.0])
    done = sparkit("bench", "compare", str(a), str(a))
    assert done.returncode == 0, done.stderr
    assert "noise unknown" in done.stdout


def test_compare_rejects_a_file_that_is_not_a_bench_result(tmp_path):
    other = tmp_path / "x.json"
    other.write_text('{"hello": 1}')
    done = sparkit("bench", "compare", str(other), str(other))
    assert done.returncode == 8
    assert "not a sparkit bench result" in done.stderr and "Traceback" not in done.stderr


def test_bench_against_nothing_listening_is_a_clear_engine_error(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = sparkit("bench", "--url", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "r.json"))
    assert done.returncode == 7, done.stderr
    assert "no server answered at http://127.0.0.1:" in done.stderr and "Traceback" not in done.stderr


def test_tune_rejects_a_malformed_param_before_starting_anything():
    done = sparkit("tune", "tiny", "--param", "speculative.num_steps")
    assert done.returncode == 2
    assert "KEY=VALUE" in done.stderr


def test_bench_takes_options_after_the_run_and_refuses_extra_arguments():
    done = sparkit("bench", "no-such-run", "--num-prompts", "1")
    assert done.returncode == 2 and "no run matches 'no-such-run'" in done.stderr
    done = sparkit("bench", "a", "b")
    assert done.returncode == 2 and "unexpected argument" in done.stderr
