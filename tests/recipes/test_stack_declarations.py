"""Each stack setting declared once (its schema field, its row in each engine's settings table), and
every list that names settings derived from those declarations: tune's --param keys, verify's
rounding-changing keys, the chat's server panel, the GSM8K summary's server arguments, the plan's
provisions and the startup checks' expectations. `stack.kv_cache_dtype` was added through them alone.
"""

from __future__ import annotations

import json

import pytest

from sparkit.bench.tune_params import recipe_key
from sparkit.bench.verify import ROUNDING_KEYS, rounding_changes
from sparkit.checks.activation import expected_server_args
from sparkit.contract.plan import LaunchPlan
from sparkit.engines.base import shown_args
from sparkit.errors import RecipeError
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe
from sparkit.recipes.schema import recipe_keys

from _shared import REPO_DIR

LEGACY = json.loads((REPO_DIR / "tests" / "fixtures" / "plan-expectations-before-one-path.json").read_text())


def test_every_recipe_key_is_reachable_from_tune_param():
    """`sparkit tune --param KEY=...` takes every key of the schema, a stack key also without its
    `stack.` section (the drift that left `lm_head_exact_top_k=...` unexpanded): a field added later
    is reached with no list to update."""
    keys = list(recipe_keys())
    assert "stack.lm_head_exact_top_k" in keys and "stack.kv_cache_dtype" in keys
    for key in keys:
        assert recipe_key(key) == key
        if key.startswith("stack."):
            assert recipe_key(key.removeprefix("stack.")) == key, key


def test_verify_reads_the_rounding_marks_of_the_schema():
    """A key whose field says it changes rounding is judged by token agreement: exact re-scoring of
    the FP8 head, the FP8 KV cache (their fields carry the mark; verify keeps no list of its own)."""
    assert {"stack.lm_head_exact_top_k", "stack.kv_cache_dtype", "stack.lm_head"} <= set(ROUNDING_KEYS)
    assert "server.port" not in ROUNDING_KEYS
    base = {"engine": "sglang", "stack": {"lm_head_exact_top_k": 4, "kv_cache_dtype": "auto", "lm_head": "fp8"}}
    fp8_only = {"engine": "sglang", "stack": {"lm_head_exact_top_k": 0, "kv_cache_dtype": "auto", "lm_head": "fp8"}}
    fp8_kv = {"engine": "sglang", "stack": {"lm_head_exact_top_k": 4, "kv_cache_dtype": "fp8_e4m3", "lm_head": "fp8"}}
    assert rounding_changes(base, fp8_only) == ["stack.lm_head_exact_top_k: 4 -> 0"]
    assert rounding_changes(base, fp8_kv) == ["stack.kv_cache_dtype: auto -> fp8_e4m3"]
    assert rounding_changes(base, base) == []


def test_the_chat_panel_and_the_gsm8k_summary_show_the_labelled_rows():
    """What screens and result files name comes from the rows' labels, in the order a recipe states
    the keys that set them: the KV cache row, added later, is among them."""
    shown = shown_args()
    assert shown["lm_head_exact_top_k"] == "exact top-k" and shown["speculative_num_steps"] == "spec steps"
    assert shown["lm_head_dtype"] == "lm_head" and shown["enable_fp32_lm_head"] == "fp32 lm_head"
    assert shown["kv_cache_dtype"] == "KV cache"
    order = list(shown)
    assert order.index("model_path") < order.index("lm_head_exact_top_k") < order.index("kv_cache_dtype") < order.index("tp_size")

    from sparkit.evals.gsm8k.results_file import ResultsFile
    from sparkit.evals.gsm8k.summary import summarize
    from sparkit.tui.server_summary import summarize_server_info

    info = {"attention_backend": "fa3", "lm_head_exact_top_k": 4, "kv_cache_dtype": "fp8_e4m3", "port": 1}
    facts = dict(summarize_server_info(info).facts)
    assert facts["attention"] == "fa3" and facts["exact top-k"] == "4" and facts["KV cache"] == "fp8_e4m3"
    assert "port" not in str(facts)
    header = {"server_args": {"lm_head_exact_top_k": 4, "kv_cache_dtype": "fp8_e4m3", "port": 1}}
    results = ResultsFile(path=REPO_DIR / "r.jsonl", header=header, headers=[header], results={}, valid_bytes=0)
    assert summarize(results)["server_args"] == {"lm_head_exact_top_k": 4, "kv_cache_dtype": "fp8_e4m3"}


def test_kv_cache_dtype_compiles_to_sglangs_flag_and_is_expected_back():
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized", ["stack.kv_cache_dtype=fp8_e4m3"]))
    argv = plan.argv
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert plan.expectations.server_args["kv_cache_dtype"] == "fp8_e4m3"
    assert ("kv_cache_dtype=fp8_e4m3", "sglang-flag", "--kv-cache-dtype fp8_e4m3") in [
        (p.optimisation, p.provider, p.detail) for p in plan.provisions]
    default = compile_plan(load_recipe("ling-3.0-flash/spark-optimized"))
    assert "--kv-cache-dtype" not in default.argv and "kv_cache_dtype" not in default.expectations.server_args


def test_kv_cache_dtype_halves_the_kv_cache_of_the_memory_fit():
    from sparkit.memory.fit import compute_fit

    def kv(*sets):
        fit = compute_fit(compile_plan(load_recipe("ling-3.0-flash/spark-optimized", list(sets))), None)
        return next(t.bytes for t in fit.terms if t.group == "kv" and t.name.startswith("KV cache"))

    assert kv("stack.kv_cache_dtype=fp8_e4m3") * 2 == kv()


def test_a_kv_cache_dtype_sglang_does_not_have_names_the_key_and_the_choices():
    from sparkit.engines.sglang.adapter import parser_unavailable

    if parser_unavailable():
        pytest.skip(parser_unavailable())
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("ling-3.0-flash/spark-optimized", ["stack.kv_cache_dtype=fp16"]))
    assert info.value.key == "stack.kv_cache_dtype" and "fp8_e4m3" in str(info.value)


def test_a_pass_through_kv_cache_flag_is_refused_naming_the_key():
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("ling-3.0-flash/spark-optimized",
                                 ["server.extra_args=[--kv-cache-dtype, fp8_e4m3]"]))
    assert "stack.kv_cache_dtype" in str(info.value)


def test_the_embedded_engine_refuses_an_fp8_kv_cache_by_rule():
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("tiny", ["stack.kv_cache_dtype=fp8_e4m3"]))
    assert info.value.key == "stack.kv_cache_dtype" and "embedded-kv-cache-compute-dtype" in str(info.value)


@pytest.mark.parametrize("recorded", LEGACY["plans"], ids=lambda r: r["case"])
def test_a_plan_json_written_before_still_checks_the_same_args(recorded):
    """A run started before the resolved args were stated once keeps its plan.json: `sparkit check`
    loads it and asks the server for what it asked then, in the same order."""
    plan = LaunchPlan.from_dict({"engine": "sglang", "argv": [], "env": {}, "host": "127.0.0.1", "port": 1, "model": "m",
                                 "served_model_name": "m", "recipe_name": "r", "recipe_path": None,
                                 "expectations": recorded["expectations"]})
    assert [[k, v] for k, v in expected_server_args(plan).items()] == recorded["checked_args"]
