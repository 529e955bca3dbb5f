"""`sparkit plan` shows the bandwidth roofline: a few lines by default, the arithmetic in --json
and --verbose, from a declared profile without a checkpoint and from real headers with one."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sparkit.cli.main import app

from _checkpoints import write_ling3_flash_fp4, write_safetensors

runner = CliRunner()


@pytest.fixture(scope="module")
def ling_dir(tmp_path_factory):
    return write_ling3_flash_fp4(tmp_path_factory.mktemp("ling3-fp4"))


def plan_json(*args: str) -> dict:
    result = runner.invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["roofline"]


def test_plan_says_what_a_step_reads_the_bandwidth_the_limit_and_where_mtp_pays():
    result = runner.invoke(app, ["plan", "ling-3.0-flash/spark-optimized"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "expected decode speed (bandwidth roofline, batch 1)" in out
    assert "declared profile (no local checkpoint)" in out
    assert "a decode step reads 4.60 GB" in out and "routed experts 1.00 GB" in out
    assert "273 GB/s" in out and "NVIDIA GB10" in out
    assert "31.3 of 512 experts per layer instead of 8" in out
    assert "MTP pays above accept" in out


def test_plan_json_carries_the_arithmetic():
    roofline = plan_json("ling-3.0-flash/spark-optimized")
    assert roofline["layout"]["source"] == "declared profile"
    assert roofline["context_tokens"] == 8192
    parts = roofline["step_bytes_by_component"]
    assert sum(parts.values()) == pytest.approx(roofline["step_bytes"])
    assert parts["lm_head"] == pytest.approx(157184 * 2560 + 157184 * 4)  # FP8 head + per-row scales
    assert roofline["limit_tok_s"] == pytest.approx(273e9 / roofline["step_bytes"])
    spec = roofline["speculative"]
    assert spec["label"] == "NEXTN 3/1/4" and spec["verify_tokens"] == 4
    by_accept = {g["accept_length"]: g for g in spec["by_accept_length"]}
    assert by_accept[4.0]["limit_tok_s"] == pytest.approx(4 * 273e9 / by_accept[4.0]["cycle_bytes"])
    even = spec["break_even_accept_length"]
    assert by_accept[1.5]["limit_tok_s"] < roofline["limit_tok_s"] < by_accept[2.5]["limit_tok_s"]
    assert 1.5 < even < 2.5


@pytest.mark.slow
def test_a_local_checkpoint_is_read_from_its_headers(ling_dir):
    declared = plan_json("ling-3.0-flash/spark-optimized")
    local = plan_json("ling-3.0-flash/spark-optimized", "--set", f"model.path={ling_dir}")
    assert local["layout"]["source"] == "checkpoint" and str(ling_dir) in local["layout"]["detail"]
    assert local["step_bytes"] == pytest.approx(declared["step_bytes"], rel=1e-12)


@pytest.mark.slow
def test_the_fp8_head_halves_the_head_and_the_context_grows_the_kv_reads():
    bf16 = plan_json("ling-3.0-flash/spark-humming")  # fp32 head: SGLang reads the bf16 weight
    fp8 = plan_json("ling-3.0-flash/spark-humming-fp8head")
    assert bf16["step_bytes_by_component"]["lm_head"] == pytest.approx(157184 * 2560 * 2)
    assert fp8["step_bytes_by_component"]["lm_head"] < bf16["step_bytes_by_component"]["lm_head"] / 2 + 1e6
    long = plan_json("ling-3.0-flash/spark-humming", "--context", "32768")
    grown = long["step_bytes"] - bf16["step_bytes"]
    assert grown == pytest.approx(7 * (32768 - 8192) * 576 * 2)  # 7 MLA layers, 576 bf16 values per token


def test_verbose_shows_bytes_by_component_and_speed_by_accept_length():
    result = runner.invoke(app, ["plan", "ling-3.0-flash/tp4-nextn", "--verbose"])
    assert result.exit_code == 0, result.output
    assert "bytes per device, by component" in result.output
    assert "NEXTN 5/1/6 by accept length" in result.output
    assert "per GPU (TP4)" in result.output and "B200" in result.output


def test_a_model_nothing_describes_still_plans_and_says_why_there_is_no_roofline(tmp_path):
    result = runner.invoke(app, ["plan", "ling-3.0-flash/spark-baseline", "--set", "model.path=acme/unknown-7b"])
    assert result.exit_code == 0, result.output
    assert "no bandwidth roofline: acme/unknown-7b: not a local checkpoint" in result.output
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"num_hidden_layers": 1}))
    write_safetensors(broken / "model.safetensors", {"w": ("BF16", (64, 64))})
    (broken / "model.safetensors").write_bytes((broken / "model.safetensors").read_bytes()[:-100])
    roofline = plan_json("ling-3.0-flash/spark-baseline", "--set", f"model.path={broken}")
    assert "truncated" in roofline["error"] and str(broken) in roofline["error"]


def test_the_roofline_imports_no_torch_or_sglang():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from sparkit.recipes.load import load_recipe\n"
        "from sparkit.roofline.estimate import roofline_document\n"
        "for name in ('tiny', 'ling-3.0-flash/spark-optimized'):\n"
        "    assert 'error' not in roofline_document(load_recipe(name).recipe)\n"
        "print('HEAVY=' + ','.join(m for m in ('torch', 'sglang', 'numpy') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stdout


@pytest.mark.slow
def test_a_hub_id_in_the_hugging_face_cache_is_read_from_its_headers(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--inclusionAI--Ling-3.0-flash-fp4"
    snapshot = repo / "snapshots" / ("0123abcd" * 5)  # a commit hash, as huggingface_hub names it
    write_ling3_flash_fp4(snapshot, shards=2)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(snapshot.name)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    roofline = plan_json("ling-3.0-flash/spark-optimized")
    assert roofline["layout"]["source"] == "checkpoint" and str(snapshot) in roofline["layout"]["detail"]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert plan_json("ling-3.0-flash/spark-optimized")["layout"]["source"] == "declared profile"


def test_the_measured_host_cost_is_said_beside_an_sglang_bound_and_only_there():
    """The bound counts bytes only; SGLang's fixed host cost a step (issue 38's one-server-at-a-time
    fit on the H200) is said with its share of this recipe's step: about a tenth of a Spark step of
    the -fp4 stack, most of an H200 step, and nothing for the embedded engine."""
    from sparkit.roofline.published import H200_HOST_STEP

    def host_note(recipe: str) -> str | None:
        return next((n for n in plan_json(recipe)["notes"] if "fixed host cost" in n), None)

    spark, h200 = host_note("ling-3.0-flash/spark-humming-fp8head"), host_note("ling-3.0-flash/tp4-nextn-h200")
    assert spark and f"{H200_HOST_STEP.fixed_ms:.2f} ms" in spark and H200_HOST_STEP.source in spark
    share = float(spark.split("% of the step")[0].rsplit(" ", 1)[-1])
    assert 5.0 < share < 15.0, spark
    assert h200 and float(h200.split("% of the step")[0].rsplit(" ", 1)[-1]) > 50.0, h200
    assert host_note("tiny") is None
