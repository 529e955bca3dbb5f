"""`sparkit ladder` without servers: ladder files, resume rules, what each step bought, published figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkit.bench import ladder as core
from sparkit.errors import RecipeError, UsageError


def sparkit(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARKIT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "sparkit", *args], env=env, capture_output=True, text=True, timeout=300)


def test_every_shipped_ladder_loads_and_every_step_compiles():
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    names = [n for n, _ in core.shipped_ladders()]
    assert {"spark", "tiny", "tiny-sglang"} <= set(names) and core.DEFAULT_LADDER == "spark"
    for name in names:
        ladder = core.load_ladder(name)
        doc = core.new_document(ladder, core.settings_for(ladder))
        for step in doc["steps"]:
            compile_plan(load_recipe(step["recipe"], step["overrides"]))
    spark = core.load_ladder("spark")
    assert [s.recipe for s in spark.spec.steps] == ["ling-3.0-flash/spark-baseline", "ling-3.0-flash/spark-humming",
                                                    "ling-3.0-flash/spark-humming-fp8head", "ling-3.0-flash/spark-optimized"]
    # the study's workload, so the published figures sit beside comparable ones
    assert (spark.spec.bench.input_len, spark.spec.bench.output_len) == (32768, 2048)


def test_the_tiny_sglang_ladder_adds_one_optimisation_per_step():
    from sparkit.recipes.load import load_recipe

    ladder = core.load_ladder("tiny-sglang")
    stacks = [load_recipe(s.recipe, s.set).recipe.stack for s in ladder.spec.steps]
    assert [(s.moe_backend, s.quantization, s.lm_head, s.speculative.method) for s in stacks] == [
        ("triton", None, "bf16", "none"), ("humming", "humming", "bf16", "none"),
        ("humming", "humming", "fp8", "none"), ("humming", "humming", "fp8", "nextn")]


def test_the_spark_ladder_shows_the_published_figures_and_what_each_bought():
    ladder = core.load_ladder("spark")
    steps = [core.StepRecord(i, s.label, s.recipe, []) for i, s in enumerate(ladder.spec.steps)]
    for step in steps:
        step.published = core.published_figure(step.recipe, step.overrides)
    assert [s.published["tok_s"] for s in steps] == [36.09, 39.45, 43.94, 102.88]
    assert steps[3].published["accept"] == 3.90
    rows = core.comparison(steps)
    assert rows[0]["published_vs_previous"] is None
    assert rows[1]["published_vs_previous"] == pytest.approx(39.45 / 36.09)  # +9.3%, the study's Humming step
    assert core.fmt_ratio(rows[1]["published_vs_previous"]) == "+9.3%"
    # an override makes it another configuration: no published figure
    assert core.published_figure("ling-3.0-flash/spark-humming", ["stack.lm_head=bf16"]) is None


def test_what_a_step_bought_is_against_the_previous_measured_step():
    def step(i, status, tpots):
        s = core.StepRecord(i, f"s{i}", "tiny", [], status=status)
        if tpots:
            s.tpot_per_request_ms = tpots
            s.figures = {"tpot_mean_ms": sum(tpots) / len(tpots), "decode_tok_s": 1000 * len(tpots) / sum(tpots)}
        return s

    steps = [step(0, core.DONE, [10.0, 10.2, 9.8]), step(1, core.FAILED, []),
             step(2, core.CHECKS_FAILED, [8.0, 8.1, 7.9]), step(3, core.DONE, [8.0, 8.2, 7.8])]
    rows = core.comparison(steps)
    assert rows[1]["vs_previous"] is None  # a failed step measured nothing
    assert rows[2]["vs_previous"] == pytest.approx(10.0 / 8.0)  # against step 1, over the failed one
    assert rows[2]["vs_first"] == pytest.approx(10.0 / 8.0)
    assert rows[3]["vs_previous"] == pytest.approx(1.0)
    assert rows[3]["vs_previous_noise"] > 0  # the same TPOT within noise


def test_a_bad_ladder_file_names_file_line_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - recipe: tiny\n    lable: oops\n")
    with pytest.raises(RecipeError) as info:
        core.load_ladder(str(bad))
    assert info.value.exit_code == 3 and info.value.line == 3 and info.value.key == "steps.0.lable"
    empty = tmp_path / "empty.yaml"
    empty.write_text("description: nothing\nsteps: []\n")
    with pytest.raises(RecipeError) as info:
        core.load_ladder(str(empty))
    assert info.value.key == "steps" and info.value.line == 2
    with pytest.raises(UsageError):
        core.load_ladder("no-such-ladder")


def test_resume_refuses_another_ladder_or_settings(tmp_path):
    ladder = core.load_ladder("tiny")
    settings = core.settings_for(ladder)
    out = tmp_path / "l.json"
    out.write_text(json.dumps(core.new_document(ladder, settings)))
    with pytest.raises(UsageError) as info:
        core.run_ladder(ladder, settings, out_path=out)  # exists, no resume
    assert "--resume" in info.value.hint
    other = core.settings_for(ladder, num_prompts=9)
    with pytest.raises(UsageError) as info:
        core.run_ladder(ladder, other, out_path=out, resume=True)
    assert "another settings" in info.value.message


@pytest.mark.slow
def test_the_cli_reports_usage_and_file_errors_with_their_exit_codes(tmp_path):
    home = tmp_path / "home"
    missing = sparkit("ladder", "no-such-ladder-or-recipe", home=home)
    assert missing.returncode == 3 and "no-such-ladder-or-recipe" in missing.stderr  # read as a recipe: not found
    both = sparkit("ladder", "tiny", "tiny-sglang", home=home)
    assert both.returncode == 2 and "give one ladder, or recipes" in both.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - recipe: tiny\n    lable: oops\n")
    done = sparkit("ladder", str(bad), home=home)
    assert done.returncode == 3 and "bad.yaml:3" in done.stderr and "steps.0.lable" in done.stderr
    listed = sparkit("ladder", "--list", "--json", home=home)
    assert listed.returncode == 0
    assert [item["name"] for item in json.loads(listed.stdout)][:3] == ["spark", "tiny", "tiny-sglang"]
    resume = sparkit("ladder", "tiny", "--resume", home=home)
    assert resume.returncode == 2 and "--resume found no earlier tiny ladder" in resume.stderr
