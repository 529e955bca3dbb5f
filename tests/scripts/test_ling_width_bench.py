"""benchmarks/ling_width.py's own logic, on the CPU: the recipes it serves compile to the launch
the H200 run needs (checked by SGLang's own argument parser in compile_plan), and the line it fits
through the layer counts."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe

from _shared import REPO_DIR


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("ling_width_bench", REPO_DIR / "benchmarks" / "ling_width.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ling_width_bench"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_every_variant_compiles_to_the_launch_it_means(bench, tmp_path):
    pytest.importorskip("sglang")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    for v in bench.VARIANTS:
        path = tmp_path / f"{v.name}.yaml"
        path.write_text(bench.recipe_text(v, model, rehearse=False))
        plan = compile_plan(load_recipe(str(path), []))
        argv = plan.argv
        assert argv[argv.index("--load-format") + 1] == "dummy"
        assert argv[argv.index("--mem-fraction-static") + 1] == str(v.fraction)
        assert ("--max-mamba-cache-size" in argv) is (not v.auto_pools), v.name
        assert ("--speculative-algorithm" in argv) is v.speculative, v.name
        assert plan.recipe["stack"]["lm_head"] == v.head and plan.recipe["stack"]["weights"] == v.experts
        assert plan.recipe["checks"]["reference_perplexity"] is None
    # phases: the default pair holds both layer counts of the bf16 line, FP8 and bf16 heads
    base_l12 = [v for v in bench.VARIANTS if v.phase in ("base", "l12") and not v.speculative and not v.expect_refusal]
    assert {(v.layers, v.head) for v in base_l12} == {(6, "fp8"), (6, "bf16"), (12, "fp8"), (12, "bf16")}


def test_the_line_through_the_layer_counts(bench):
    assert bench.line_fit([(6, 2.0), (12, 3.5)]) == pytest.approx((0.5, 0.25))
    fixed, per_layer = bench.line_fit([(6, 2.0), (12, 3.5), (18, 5.0)])
    assert (fixed, per_layer) == pytest.approx((0.5, 0.25))
    assert fixed + per_layer * 42 == pytest.approx(11.0)
    assert bench.line_fit([(6, 2.0), (6, 2.2)]) is None
