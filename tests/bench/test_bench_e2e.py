"""`sparkit bench` against a real embedded server: its counts agree with the server's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from sparkit.client import parse_prometheus

pytestmark = pytest.mark.e2e


def server_counters(url: str) -> dict:
    metrics = parse_prometheus(httpx.get(f"{url}/metrics", timeout=10).text)
    info = httpx.get(f"{url}/server_info", timeout=10).json()
    return {
        "generated": metrics["sglang:generation_tokens_total"],
        "verify": metrics.get("sglang:spec_verify_calls_total"),
        "avg_accept": info["internal_states"][0].get("avg_spec_accept_length"),
    }


def test_bench_counts_agree_with_the_servers_counters_within_2_percent(start_embedded_server, tmp_path):
    server = start_embedded_server(
        speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1,
        speculative_num_draft_tokens=4, lm_head_dtype="fp8",
    )
    before = server_counters(server.url)
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "sparkit", "bench", "--url", server.url, "--input-len", "96", "--output-len", "48",
         "--num-prompts", "4", "--warmup", "0", "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    after = server_counters(server.url)
    doc = json.loads(done.stdout)
    assert json.loads(out.read_text())["complete"] is True  # the saved file is the same finished document
    metrics = doc["repeats"][0]["metrics"]

    served_tokens = after["generated"] - before["generated"]
    assert metrics["total_output_tokens"] == 4 * 48  # ignore_eos: exactly what was asked
    assert metrics["total_output_tokens"] == pytest.approx(served_tokens, rel=0.02)

    server_accept = served_tokens / (after["verify"] - before["verify"])
    assert metrics["accept_length_mean"] > 1.0  # the draft is right often enough to matter
    assert metrics["accept_length_total"] == pytest.approx(server_accept, rel=0.02)
    # the server's average is tokens / verify steps over every request it served (these four):
    # the ratio of sums, not the mean of the per-request ratios (which weighs short requests more)
    assert metrics["accept_length_total"] == pytest.approx(after["avg_accept"], rel=0.02)
    assert doc["summary"]["figures"]["server_accept_length"] == pytest.approx(server_accept, rel=0.02)

    # The record says what was measured and where.
    assert doc["workload"]["synthetic"] is True and doc["workload"]["input_len"] == 96
    assert doc["server"]["server_args"]["speculative_num_steps"] == 3
    assert doc["versions"]["sparkit"] and doc["host"]["hostname"]
    figures = doc["summary"]["figures"]
    assert figures["step_time_estimate_ms"] == pytest.approx(figures["tpot_mean_ms"] * figures["accept_length_mean"])


def test_bench_without_speculation_reports_no_accept_length(start_embedded_server, tmp_path):
    server = start_embedded_server()
    done = subprocess.run(
        [sys.executable, "-m", "sparkit", "bench", "--url", server.url, "--input-len", "32", "--output-len", "16",
         "--num-prompts", "2", "--warmup", "1", "--out", str(tmp_path / "b.json"), "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)["summary"]["figures"]
    assert figures["accept_length_mean"] is None
    assert figures["step_time_estimate_ms"] == pytest.approx(figures["tpot_mean_ms"])  # accept length 1


def bench_cli(url: str, out, *extra: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "sparkit", "bench", "--url", url, "--out", str(out), "--json", *extra],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_finished_run_is_kept_and_rerunning_resumes_instead_of_measuring_again(embedded_server, tmp_path):
    out = tmp_path / "r.json"
    args = ("--input-len", "32", "--output-len", "16", "--num-prompts", "2", "--repeats", "2", "--warmup", "0")
    first = bench_cli(embedded_server.url, out, *args)
    assert first["summary"]["repeats"] == 2 and len(first["summary"]["per_repeat"]["tpot_mean_ms"]) == 2
    before = server_counters(embedded_server.url)
    again = bench_cli(embedded_server.url, out, *args)
    assert server_counters(embedded_server.url)["generated"] == before["generated"]  # nothing re-measured
    assert again["repeats"] == first["repeats"]
    # A different setting is a different benchmark: measured afresh.
    third = bench_cli(embedded_server.url, out, "--input-len", "32", "--output-len", "8", "--num-prompts", "1", "--warmup", "0")
    assert third["repeats"][0]["metrics"]["total_output_tokens"] == 8


def test_prompts_from_a_file_are_sent_as_text(embedded_server, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hello there, "}) + "\n" + json.dumps({"prompt": "The sea is "}) + "\n")
    doc = bench_cli(embedded_server.url, tmp_path / "f.json", "--dataset", str(prompts), "--output-len", "12",
                    "--num-prompts", "3", "--warmup", "0")
    assert doc["workload"]["synthetic"] is False
    requests = doc["repeats"][0]["requests"]
    assert len(requests) == 3 and all(r["output_tokens"] == 12 for r in requests)
    assert requests[0]["prompt_tokens"] == len("Hello there, ")  # tiny-ling's byte tokenizer


def test_bench_a_run_by_id_records_its_recipe(tiny_model_dir, tmp_path, monkeypatch):
    from sparkit import runs
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    plan = compile_plan(load_recipe("tiny", [f"model.path={tiny_model_dir}"]), port=runs.free_port())
    run = runs.launch(plan, timeout=180)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sparkit", "bench", run.id, "--input-len", "16", "--output-len", "8",
             "--num-prompts", "1", "--warmup", "0", "--out", str(tmp_path / "run.json"), "--json"],
            capture_output=True, text=True, timeout=120,
        )
    finally:
        runs.stop(run)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["server"]["run_id"] == run.id and doc["server"]["url"] == plan.url
    assert doc["recipe"]["stack"]["lm_head"] == "fp8"
    assert doc["recipe"]["stack"]["speculative"]["num_steps"] == 3


def test_gsm8k_workload_is_labelled_as_such(embedded_server, tmp_path):
    from _shared import GSM8K_DIR

    if not (GSM8K_DIR / "test.jsonl").exists():
        pytest.skip("GSM8K data not present")
    env_file = str(GSM8K_DIR / "test.jsonl")
    done = subprocess.run(
        [sys.executable, "-m", "sparkit", "bench", "--url", embedded_server.url, "--dataset", "gsm8k", "--output-len", "8",
         "--num-prompts", "2", "--warmup", "0", "--out", str(tmp_path / "g.json"), "--json"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "SPARKIT_GSM8K": env_file},
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["workload"]["dataset"] == "gsm8k" and doc["workload"]["synthetic"] is False
    assert doc["repeats"][0]["metrics"]["total_output_tokens"] == 16


def test_bench_says_loudly_when_other_servers_are_up_beside_the_one_it_measures(embedded_server, tiny_model_dir,
                                                                                  tmp_path, monkeypatch):
    """At batch 1 servers up side by side share the host's time between steps (issue 38): the
    result records the others, `bench` warns on stderr and `bench compare` warns first."""
    from sparkit import runs
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    args = ("--input-len", "16", "--output-len", "8", "--num-prompts", "1", "--warmup", "0")
    alone_out = tmp_path / "alone.json"
    alone = subprocess.run([sys.executable, "-m", "sparkit", "bench", "--url", embedded_server.url, "--out", str(alone_out),
                            "--json", *args], capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["side_by_side"] is None and "warning:" not in alone.stderr
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    plan = compile_plan(load_recipe("tiny", [f"model.path={tiny_model_dir}"]), port=runs.free_port())
    run = runs.launch(plan, timeout=180)
    try:
        beside_out = tmp_path / "beside.json"
        beside = subprocess.run([sys.executable, "-m", "sparkit", "bench", "--url", embedded_server.url, "--out",
                                 str(beside_out), "--json", *args], capture_output=True, text=True, timeout=120)
    finally:
        runs.stop(run)
    assert beside.returncode == 0, beside.stderr
    record = json.loads(beside.stdout)["side_by_side"]
    assert [s["run"] for s in record["servers"]] == [run.id] and record["servers"][0]["url"] == plan.url
    assert "warning: measured while 1 other server(s) were up on this machine" in beside.stderr
    assert run.id in beside.stderr
    compared = subprocess.run([sys.executable, "-m", "sparkit", "bench", "compare", str(alone_out), str(beside_out)],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert compared.returncode == 0, compared.stderr
    assert "warning: beside.json: measured while 1 other server(s) were up" in " ".join(compared.stdout.split())
