"""`tune` end to end on tiny-ling over NEXTN num_steps 1..4 (real servers via recipes + runs)."""

from __future__ import annotations

import json

import pytest

from sparkit.bench.runner import BenchConfig
from sparkit.bench.tune import run_tune
from sparkit.recipes.load import load_recipe
from sparkit.runs import pid_alive, select_run

pytestmark = pytest.mark.e2e


def test_tune_sweeps_depth_ranks_it_and_writes_a_new_recipe(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = BenchConfig(input_len=64, output_len=64, num_prompts=4, warmup=1)
    out = tmp_path / "sweep.json"
    doc = run_tune("tiny", ["speculative.num_steps=1,2,3,4"], config, out_path=out,
                   base_overrides=[f"model.path={tiny_model_dir}"], write_recipe_dir=tmp_path)

    points = doc["points"]
    assert [p["values"]["speculative.num_steps"] for p in points] == ["1", "2", "3", "4"]
    assert all(p["status"] == "done" for p in points), [p["error"] for p in points]
    accept = [p["figures"]["accept_length_mean"] for p in points]
    assert accept[3] > accept[0] > 1.0  # deeper drafts commit more tokens per step
    for p in points:  # each point's own bench result is on disk
        bench = json.loads(open(p["bench_file"]).read())
        assert bench["server"]["server_args"]["speculative_num_steps"] == int(p["values"]["speculative.num_steps"])

    ranking = doc["ranking"]
    assert sorted(ranking["order"]) == [0, 1, 2, 3]
    # Either a depth is measurably better than num_steps 1, or the sweep says honestly that none is.
    if ranking["measurably_better"]:
        assert "is measurably better than num_steps=1" in ranking["verdict"]
        assert ranking["tpot_gain_ms"] > ranking["noise_ms"]
    else:
        assert "measurably better" in ranking["verdict"] and ranking["verdict"].startswith(("no point", "none of", "num_steps"))

    best = points[ranking["best"]]
    tuned = load_recipe(doc["best_recipe"])
    assert tuned.recipe.stack.speculative.num_steps == int(best["values"]["speculative.num_steps"])
    assert json.loads(out.read_text())["complete"] is True
    for p in points:  # every server it started is gone
        run_id = json.loads(open(p["bench_file"]).read())["server"]["run_id"]
        assert not pid_alive(select_run(run_id).pid)

    # Re-running the same sweep keeps what was measured and starts nothing.
    again = run_tune("tiny", ["speculative.num_steps=1,2,3,4"], config, out_path=out,
                     base_overrides=[f"model.path={tiny_model_dir}"], write_recipe_dir=tmp_path)
    assert [p["figures"] for p in again["points"]] == [p["figures"] for p in points]
    assert again["best_recipe"] != doc["best_recipe"]  # a new file again, never an overwrite


def test_tune_cli_writes_a_shipped_recipes_tuning_to_the_current_directory_and_says_where(tiny_model_dir, tmp_path):
    import os
    import subprocess
    import sys

    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "SPARKIT_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "sparkit", "tune", "tiny", "--param", "speculative.num_steps=1,2",
         "--set", f"model.path={tiny_model_dir}", "--input-len", "16", "--output-len", "16", "--num-prompts", "2",
         "--warmup", "0", "--out", str(tmp_path / "sweep.json"), "--json"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    written = [p for p in work.iterdir() if p.suffix == ".yaml"]
    assert len(written) == 1 and written[0].name.startswith("tiny-tuned-num_steps")
    assert doc["best_recipe"] == str(written[0]) and doc["best_recipe_where"] == "the current directory: tiny is a shipped recipe"
    assert f"best recipe written to {written[0]} (the current directory: tiny is a shipped recipe)" in done.stderr


def test_tune_ranks_settings_on_a_kind_of_real_text(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = BenchConfig(input_len=32, output_len=16, num_prompts=2, warmup=0, dataset="profile:math")
    doc = run_tune("tiny", ["speculative.num_steps=1,3"], config, out_path=tmp_path / "m.json",
                   base_overrides=[f"model.path={tiny_model_dir}"], write_recipe=False)
    assert all(p["status"] == "done" for p in doc["points"]), [p["error"] for p in doc["points"]]
    for p in doc["points"]:
        bench = json.loads(open(p["bench_file"]).read())
        assert bench["workload"]["kind"] == "math"
        assert [r["prompt_tokens"] for r in bench["repeats"][0]["requests"]] == [32, 32]
    assert doc["ranking"]["best"] in (0, 1)


def test_a_switch_that_changes_greedy_outputs_is_rejected_as_a_loss(tiny_model_dir, tmp_path, monkeypatch):
    """The embedded engine's --debug-corrupt-expert-dequant (two FP8 experts decoded from each
    other's weights: fluent, accepted drafts, wrong numbers) stands in for an engine switch that
    buys speed by computing something else. With the known answer off, only the output gate can
    catch it: its greedy outputs differ from the baseline's, and it is rejected, named as such,
    whatever it measured. One server at a time, A/B/A."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = BenchConfig(input_len=16, output_len=16, num_prompts=2, warmup=0)
    doc = run_tune("tiny", ["flag.--debug-corrupt-expert-dequant"], config, out_path=tmp_path / "sweep.json",
                   base_overrides=[f"model.path={tiny_model_dir}", "checks.reference_perplexity=null"],
                   write_recipe_dir=tmp_path)
    off, on = doc["points"]
    assert off["status"] == on["status"] == "done", [off["error"], on["error"]]
    assert doc["run_order"] == ["--debug-corrupt-expert-dequant=off", "--debug-corrupt-expert-dequant=on",
                                "--debug-corrupt-expert-dequant=off (baseline again)"]
    assert not on["startup_failed"]  # every startup check passed: only the outputs give it away
    assert on["output_change"] and "greedy 48-token outputs differ from --debug-corrupt-expert-dequant=off's" in on["output_change"]
    ranking = doc["ranking"]
    assert ranking["best"] == 0 and ranking["order"] == [0]
    assert ranking["rejected"]["--debug-corrupt-expert-dequant=on"].startswith("changes greedy outputs: ")
    assert ranking["drift_ms"] is not None and doc["baseline_again"]["greedy"] == off["greedy"]
    written = load_recipe(doc["best_recipe"])
    assert "--debug-corrupt-expert-dequant" not in written.recipe.server.extra_args


def test_an_env_switch_is_swept_and_the_written_recipe_names_it_and_its_checks_show_it_on(tiny_model_dir, tmp_path,
                                                                                           monkeypatch):
    """SPARKIT_FP8_TUNE (the FP8 head kernel's tuning switch; tiny-ling's head is below the size it
    tunes) changes nothing it computes: both points pass the output gate, the winner is written as
    a recipe setting the variable, that recipe plans with it, and its startup checks find it in the
    engine's environment."""
    from sparkit import runs
    from sparkit.planning.compile import compile_plan

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = BenchConfig(input_len=16, output_len=16, num_prompts=2, warmup=0)
    doc = run_tune("tiny", ["env.SPARKIT_FP8_TUNE=0,1"], config, out_path=tmp_path / "sweep.json",
                   base_overrides=[f"model.path={tiny_model_dir}"], write_recipe_dir=tmp_path)
    assert all(p["status"] == "done" and not p["output_change"] and not p["output_note"] for p in doc["points"]), doc["points"]
    assert doc["points"][1]["greedy"] == doc["points"][0]["greedy"]
    best = doc["points"][doc["ranking"]["best"]]
    value = best["values"]["env.SPARKIT_FP8_TUNE"]
    text = open(doc["best_recipe"]).read()
    assert f"# env.SPARKIT_FP8_TUNE={value}: TPOT " in text  # the switch, with the figure that earned it
    plan = compile_plan(load_recipe(doc["best_recipe"]))
    assert plan.env["SPARKIT_FP8_TUNE"] == value
    with runs.transient_server(plan, checks=True) as started:
        switches = next(c for c in started.checks if c.name == "engine_switches")
    assert switches.status.value == "pass", switches.to_dict()
    assert f"env SPARKIT_FP8_TUNE={value}: in the engine's environment" in switches.evidence
