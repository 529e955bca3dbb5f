"""`python -m sglang.bench_serving --backend sglang`, unmodified, against a real embedded server.

The bench client is the installed sglang's own (scripts/test installs the pure-Python packages its
import needs, beside sglang's --no-deps install). One import is stood in for: torchvision, whose
only wheels on the package index are CUDA builds that cannot load beside a CPU torch; bench_serving
imports it without using it for a text benchmark (tests/e2e/standins/torchvision says where). A
real torchvision that imports is used instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

STANDINS = Path(__file__).resolve().parent / "standins"


def bench_env() -> dict[str, str]:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"  # the random-ids dataset needs no download; nothing may try one
    real = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, env=env).returncode == 0
    if not real:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(STANDINS)) if p)
    return env


def run_bench(server, tiny_model_dir: Path, out: Path, *extra: str) -> dict:
    argv = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", server.url,
            "--dataset-name", "random-ids", "--random-input-len", "32", "--random-output-len", "16",
            "--random-range-ratio", "1", "--num-prompts", "4", "--tokenizer", str(tiny_model_dir),
            "--request-rate", "inf", "--max-concurrency", "1", "--disable-tqdm", "--output-file", str(out), *extra]
    done = subprocess.run(argv, capture_output=True, text=True, env=bench_env(), timeout=600)
    assert done.returncode == 0, f"bench_serving failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert "Serving Benchmark Result" in done.stdout
    return json.loads(out.read_text().splitlines()[-1])


def test_bench_serving_runs_unmodified(embedded_server, tiny_model_dir, tmp_path):
    result = run_bench(embedded_server, tiny_model_dir, tmp_path / "bench.jsonl")
    assert result["completed"] == 4 and result["total_output_tokens"] == 4 * 16
    assert result["accept_length"] > 1.0  # read from meta_info's spec_verify_ct of a NEXTN server
    assert result["server_info"]["speculative_algorithm"] == "NEXTN"
    assert result["mean_ttft_ms"] > 0 and result["mean_tpot_ms"] > 0


def test_bench_serving_with_logprobs(embedded_server, tiny_model_dir, tmp_path):
    result = run_bench(embedded_server, tiny_model_dir, tmp_path / "bench.jsonl",
                       "--return-logprob", "--logprob-start-len", "0", "--top-logprobs-num", "2")
    assert result["completed"] == 4
