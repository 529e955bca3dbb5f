"""Compiling recipes to LaunchPlans, checked against the installed sglang 0.5.23's own parser."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path

import pytest

from sparkit.contract.plan import LaunchPlan
from sparkit.errors import RecipeError
from sparkit.paths import cache_dir
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe, shipped_recipes

SHIPPED = [name for name, _ in shipped_recipes()]
SGLANG_RECIPES = [n for n in SHIPPED if load_recipe(n).recipe.engine == "sglang"]


def _prepare_server_args(args: list[str]):
    from sglang.srt.server_args import prepare_server_args

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return prepare_server_args(args)
    finally:  # prepare_server_args reconfigures root logging (force=True): put it back
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_recipe_plans(name):
    plan = compile_plan(load_recipe(name))
    assert plan.argv[0] == sys.executable and plan.recipe_name == name
    assert LaunchPlan.from_dict(json.loads(plan.to_json())) == plan
    assert plan.command_line().endswith(plan.argv[-1])


def test_sglang_recipes_are_the_ling_ladder_and_tiny_ling_on_sglang():
    assert sorted(SGLANG_RECIPES) == sorted([f"ling-3.0-flash/{n}" for n in (
        "spark-baseline", "spark-humming", "spark-humming-fp8head", "spark-optimized",
        "tp4-baseline", "tp4-nextn", "tp4-dspark", "tp4-nextn-h200")] + [f"tiny/tiny-sglang{n}" for n in (
        "", "-baseline", "-unshared-head", "-wrong-draft", "-humming", "-tp2", "-fp8", "-mxfp4", "-damaged-scale")] + [
        f"tiny/tiny-v3-sglang{n}" for n in ("", "-baseline", "-fp8", "-dspark", "-dspark-random-draft")])


def test_tiny_sglang_serves_the_hf_export_of_the_shipped_build():
    from sparkit.models.tiny_ling.family import SHIPPED_DIR

    plan = compile_plan(load_recipe("tiny/tiny-sglang"), port=30555)
    export = str(cache_dir() / "models" / "tiny-ling-s0-hf-bfloat16")
    args = plan.argv[plan.argv.index("sglang.launch_server") + 1:]
    assert args[:2] == ["--model-path", export] and "--trust-remote-code" in args
    assert plan.model_builds == [{"name": "tiny-ling", "seed": 0, "dir": str(SHIPPED_DIR / "tiny-ling-s0"),
                                  "export_hf": {"dtype": "bfloat16", "weights": "bf16", "damaged_scale": False,
                                                "dir": export}}]
    assert "--disable-prefill-cuda-graph" in args and args[args.index("--cuda-graph-max-bs-decode") + 1] == "4"
    assert plan.env["SPARKIT_SGLANG_PLUGIN"] == "1" and plan.env["SGLANG_PLUGINS"] == "sparkit"
    assert plan.expectations.draft_shares_lm_head is True and plan.expectations.min_accept_length == 1.5
    assert plan.expectations.server_args["moe_runner_backend"] == "triton"
    assert not plan.warnings


def test_tiny_sglang_trap_and_wrong_draft_plans():
    trap = compile_plan(load_recipe("tiny/tiny-sglang-unshared-head"))
    assert trap.env["SPARKIT_SHARE_LM_HEAD"] == "0" and trap.expectations.draft_shares_lm_head is True
    assert any("shared-head trap" in w for w in trap.warnings)
    wrong = compile_plan(load_recipe("tiny/tiny-sglang-wrong-draft"))
    draft = str(cache_dir() / "models" / "tiny-ling-s1-n40-hf-bfloat16")
    assert wrong.argv[wrong.argv.index("--speculative-draft-model-path") + 1] == draft
    assert wrong.expectations.draft_model == draft
    assert [(b["seed"], b.get("steps"), b["export_hf"]["dir"]) for b in wrong.model_builds][1] == (1, 40, draft)


@pytest.mark.parametrize("name", SGLANG_RECIPES)
def test_sglang_argv_accepted_by_prepare_server_args(name):
    loaded = load_recipe(name)
    r = loaded.recipe
    plan = compile_plan(loaded, port=31234)
    assert plan.argv[1:3] == ["-m", "sglang.launch_server"]
    parsed = _prepare_server_args(plan.argv[3:])
    spec = r.stack.speculative
    # What the recipe asked for, read back from sglang's own parse; a built-in model is served
    # as its Hugging Face export, planned as a build.
    from sparkit.engines.builtin_models import parse_builtin_ref

    def served(path):
        ref = parse_builtin_ref(path) if path else None
        if ref is None:
            return path
        return next(b["dir"] if b.get("kind") == "dspark" else b["export_hf"]["dir"] for b in plan.model_builds
                    if (b["name"], b["seed"], b.get("steps")) == (ref.name, ref.seed, ref.steps)
                    and (b.get("kind") == "dspark"  # a DSpark draft's build is SGLang's layout already
                         or (b["export_hf"]["weights"], b["export_hf"]["damaged_scale"]) == (ref.weights or "bf16",
                                                                                             ref.damaged_scale)))

    assert parsed.model_path == served(r.model.path)
    assert parsed.port == 31234 and parsed.host == r.server.host
    assert parsed.tp_size == r.stack.tp and parsed.ep_size == r.stack.ep
    assert parsed.moe_runner_backend == r.stack.moe_backend
    assert parsed.enable_fp32_lm_head == (r.stack.lm_head == "fp32")
    assert parsed.attention_backend == r.stack.attention_backend
    assert parsed.mem_fraction_static == r.server.mem_fraction_static
    assert parsed.quantization == r.stack.quantization  # None: the checkpoints carry their quantisation
    assert parsed.speculative_algorithm == ({"nextn": "NEXTN", "dspark": "DSPARK"}.get(spec.method))
    assert parsed.speculative_num_steps == spec.num_steps
    assert parsed.speculative_eagle_topk == spec.eagle_topk
    assert parsed.speculative_num_draft_tokens == spec.num_draft_tokens
    assert parsed.speculative_draft_model_path == served(spec.draft_model)
    # The expectations the startup checks read match the parse (NEXTN resolves to EAGLE; DSpark's
    # step and topk to 1 and its draft tokens to the block + 1, where _handle_dspark reads the draft).
    alias = {"NEXTN": "EAGLE"}
    dspark = {"speculative_num_steps": 1, "speculative_eagle_topk": 1,
              "speculative_num_draft_tokens": (plan.expectations.draft_block_size or 0) + 1} if spec.method == "dspark" else {}
    for key, want in plan.expectations.server_args.items():
        got = dspark.get(key, getattr(parsed, key))
        assert alias.get(got, got) == want, key


def test_spark_optimized_expectations_and_fp8_head_via_plugin():
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized"))
    e = plan.expectations
    args = e.server_args
    assert (e.speculative, args["speculative_algorithm"], args["speculative_num_steps"], args["speculative_eagle_topk"],
            args["speculative_num_draft_tokens"]) == ("nextn", "EAGLE", 3, 1, 4)
    assert e.lm_head == "fp8" and e.draft_shares_lm_head is True and e.moe_backend == "humming"
    assert e.min_accept_length == 2.0 and args["mem_fraction_static"] == 0.68 and e.weights == "mxfp4"
    # sglang 0.5.23 has no SGLANG_ENABLE_FP8_LM_HEAD: sparkit's plugin provides it.
    # The plugin re-scores the FP8 head's top candidates from the kept bf16 weight (default 4).
    assert plan.env == {"SPARKIT_SGLANG_PLUGIN": "1", "SGLANG_PLUGINS": "sparkit",
                        "SPARKIT_FP8_LM_HEAD_EXACT_TOP_K": "4"}
    assert e.lm_head_exact_top_k == 4
    fp8 = [p for p in plan.provisions if p.optimisation == "lm_head=fp8"]
    assert fp8 and fp8[0].provider == "sparkit-plugin"
    assert "--enable-fp32-lm-head" not in plan.argv


def test_exact_top_k_reaches_the_plugin_and_zero_turns_it_off():
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized", overrides=["stack.lm_head_exact_top_k=0"]))
    assert plan.env["SPARKIT_FP8_LM_HEAD_EXACT_TOP_K"] == "0" and plan.expectations.lm_head_exact_top_k == 0
    bf16 = compile_plan(load_recipe("ling-3.0-flash/spark-baseline"))
    assert "SPARKIT_FP8_LM_HEAD_EXACT_TOP_K" not in bf16.env and bf16.expectations.lm_head_exact_top_k is None


def test_fp8_head_uses_the_engine_env_when_the_registry_has_it(monkeypatch):
    from sparkit.engines.sglang import adapter

    real = adapter.env_registry()
    monkeypatch.setattr(adapter, "env_registry", lambda: real | {"SGLANG_ENABLE_FP8_LM_HEAD"})
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized"))
    assert plan.env == {"SGLANG_ENABLE_FP8_LM_HEAD": "1"}
    assert [p.provider for p in plan.provisions if p.optimisation == "lm_head=fp8"] == ["sglang-env"]
    # SGLang's own FP8 head has no exact re-scoring: the plan says so and the check does not expect it.
    assert plan.expectations.lm_head_exact_top_k is None
    assert any("lm_head_exact_top_k" in w and "not applied" in w for w in plan.warnings)


def test_baseline_has_no_speculative_expectations():
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-baseline"))
    e = plan.expectations
    assert e.speculative is None and e.min_accept_length is None and e.draft_shares_lm_head is None
    assert e.lm_head == "fp32" and "--enable-fp32-lm-head" in plan.argv and plan.env == {}


def test_env_registry_warns_about_ignored_variables():
    plan = compile_plan(load_recipe("ling-3.0-flash/tp4-nextn"))
    ignored = [w for w in plan.warnings if "ignores" in w]
    assert len(ignored) == 1 and "SGLANG_ENABLE_FUSED_VERIFY_EXTEND_GRAPH" in ignored[0]
    assert plan.env["SGLANG_ENABLE_METADATA_GLUE_GRAPH"] == "1"  # known: passed, no warning
    assert compile_plan(load_recipe("ling-3.0-flash/tp4-dspark")).warnings == []


def _recipe(tmp_path: Path, body: str) -> Path:
    path = (tmp_path / "r.yaml").resolve()
    path.write_text("model:\n  path: org/model\n" + textwrap.dedent(body).lstrip("\n"))
    return path


def test_flag_removed_from_installed_sglang_is_an_error_quoting_the_parser(tmp_path):
    path = _recipe(tmp_path, """
    server:
      extra_args: ["--disable-radix-cache", "--cuda-graph-max-bs", "8"]
    """)
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe(path))
    msg = str(info.value)
    assert msg.startswith(f"{path}:4:41 server.extra_args.1: sglang 0.5.23 rejects '--cuda-graph-max-bs'")
    assert "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill" in msg
    # The replacement flag is accepted.
    plan = compile_plan(load_recipe(path, ["server.extra_args=[--cuda-graph-bs-decode, '1']"]))
    assert plan.argv[-2:] == ["--cuda-graph-bs-decode", "1"]


def test_unknown_passthrough_flag(tmp_path):
    path = _recipe(tmp_path, "server:\n  extra_args: [--no-such-flag]\n")
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe(path))
    assert "server.extra_args.0: sglang 0.5.23 rejects '--no-such-flag'" in str(info.value)
    assert "unrecognized arguments: --no-such-flag" in str(info.value)


def test_passthrough_flag_managed_by_a_recipe_key(tmp_path):
    path = _recipe(tmp_path, "server:\n  extra_args: [--tp, '2']\n")
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe(path))
    assert "server.extra_args.0: --tp is set from the recipe key stack.tp" in str(info.value)
    assert info.value.hint == "set stack.tp instead of passing the flag"


def test_deprecated_passthrough_flag_warns(tmp_path):
    plan = compile_plan(load_recipe(_recipe(tmp_path, "server:\n  extra_args: [--disable-cuda-graph]\n")))
    assert any("deprecated" in w and "--cuda-graph-backend" in w for w in plan.warnings)


def test_backend_not_in_installed_sglang(tmp_path):
    path = _recipe(tmp_path, "stack:\n  attention_backend: flashinfer_v9\n")
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe(path))
    assert str(info.value).startswith(f"{path}:4:22 stack.attention_backend: 'flashinfer_v9' is not one of triton,")


def test_cuda_graph_and_metrics_settings(tmp_path):
    path = _recipe(tmp_path, "server:\n  cuda_graph: {enabled: false, max_bs_decode: 4}\n  enable_metrics: false\n")
    plan = compile_plan(load_recipe(path))
    parsed = _prepare_server_args(plan.argv[3:])
    assert parsed.cuda_graph_max_bs_decode == 4 and parsed.enable_metrics is False
    assert "--cuda-graph-backend-decode" in plan.argv and "--disable-cuda-graph" not in plan.argv


# ---------------------------------------------------------------- embedded


def test_tiny_compiles_to_the_embedded_engine():
    from sparkit.models.tiny_ling.family import SHIPPED_DIR

    plan = compile_plan(load_recipe("tiny"), port=30555)
    model_dir = str(SHIPPED_DIR / "tiny-ling-s0")  # the build that ships with the package
    assert plan.engine == "embedded"
    assert plan.argv[:6] == [sys.executable, "-P", "-m", "sparkit.engines.embedded", "--model-path", model_dir]
    args = plan.argv[3:]

    def value(flag):
        return args[args.index(flag) + 1]

    assert value("--port") == "30555" and value("--expert-weights") == "fp8" and value("--lm-head-dtype") == "fp8"
    assert value("--speculative-algorithm") == "NEXTN" and value("--speculative-num-steps") == "3"
    assert value("--speculative-eagle-topk") == "1" and value("--speculative-num-draft-tokens") == "4"
    assert value("--device") == "auto"
    assert plan.model_builds == [{"name": "tiny-ling", "seed": 0, "dir": model_dir}]
    e = plan.expectations
    assert e.server_args["speculative_algorithm"] == "NEXTN" and e.draft_shares_lm_head is True
    assert e.min_accept_length == 1.5 and e.server_args["speculative_num_steps"] == 3
    assert plan.served_model_name == "tiny-ling"


def test_tiny_baseline_and_wrong_draft():
    base = compile_plan(load_recipe("tiny/tiny-baseline"))
    assert "--speculative-algorithm" not in base.argv and base.expectations.min_accept_length is None
    assert base.argv[base.argv.index("--lm-head-dtype") + 1] == "bf16"
    wrong = compile_plan(load_recipe("tiny/tiny-wrong-draft"))
    draft_dir = str(cache_dir() / "models" / "tiny-ling-s1-n40")  # not shipped: built before launch
    assert wrong.argv[wrong.argv.index("--speculative-draft-model-path") + 1] == draft_dir
    assert [(b["seed"], b.get("steps")) for b in wrong.model_builds] == [(0, None), (1, 40)]
    assert wrong.expectations.draft_model == draft_dir


def test_tiny_dspark_and_its_untrained_draft_plan():
    """The shipped draft is loaded in place (nothing to build); the untrained one is built before the
    launch (its initialisation: seconds). Both share the FP8 head and the embedding, blocks of 8 from
    the draft's config, SGLang's resolution of the numbers, the DSpark floor."""
    from sparkit.models.dspark.builder import SHIPPED_DIR

    plan = compile_plan(load_recipe("tiny/tiny-dspark"))
    args = plan.argv
    shipped = str(SHIPPED_DIR / "tiny-ling-dspark-s0")
    assert args[args.index("--speculative-algorithm") + 1] == "DSPARK"
    assert args[args.index("--speculative-draft-model-path") + 1] == shipped
    assert "--speculative-num-steps" not in args and "--speculative-dspark-block-size" not in args
    e = plan.expectations
    assert (e.speculative, e.server_args["speculative_algorithm"], e.draft_shares_lm_head, e.draft_shares_embedding) == (
        "dspark", "DSPARK", True, True)
    assert (e.block_size, e.draft_block_size, e.min_accept_length) == (None, 8, 2.0)
    assert {k: e.server_args[k] for k in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                                         "speculative_dspark_block_size")} == {
        "speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 9,
        "speculative_dspark_block_size": 8}
    assert {"speculative=dspark", "draft_lm_head=shared"} <= {p.optimisation for p in plan.provisions}
    assert [b.get("kind") for b in plan.model_builds] == [None, "dspark"]
    random = compile_plan(load_recipe("tiny/tiny-dspark-random-draft"))
    untrained = str(cache_dir() / "models" / "tiny-ling-dspark-s0-n0")
    assert random.argv[random.argv.index("--speculative-draft-model-path") + 1] == untrained
    assert random.model_builds[1] == {"name": "tiny-ling-dspark", "seed": 0, "kind": "dspark", "steps": 0, "dir": untrained}
    assert random.expectations.draft_block_size == 8  # the builder's layout, before the build exists
    block = compile_plan(load_recipe("tiny/tiny-dspark", ["stack.speculative.block_size=6"]))
    assert block.argv[block.argv.index("--speculative-dspark-block-size") + 1] == "6"
    assert block.expectations.server_args["speculative_num_draft_tokens"] == 7


def test_a_dspark_draft_is_not_a_model_to_serve_and_tiny_ling_takes_steps():
    with pytest.raises(RecipeError, match="is a DSpark draft, not a model to serve"):
        compile_plan(load_recipe("tiny", ["model.path=sparkit:tiny-ling-dspark"]))
    with pytest.raises(RecipeError, match="takes at least one training step"):
        compile_plan(load_recipe("tiny/tiny-wrong-draft", ["stack.speculative.draft_model=sparkit:tiny-ling:seed=1:steps=0"]))
    with pytest.raises(RecipeError, match="no weights layouts"):
        compile_plan(load_recipe("tiny/tiny-dspark", ["stack.speculative.draft_model=sparkit:tiny-ling-dspark@fp8"]))


def test_tiny_unshared_head_passes_the_flag_and_warns():
    plan = compile_plan(load_recipe("tiny/tiny-unshared-head"))
    assert plan.argv[-2:] == ["--draft-lm-head-sharing", "tensor"]
    assert plan.expectations.draft_shares_lm_head is True  # the check is expected to catch it
    assert any("shared-head trap" in w for w in plan.warnings)


def test_embedded_passthrough_flags_are_validated():
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("tiny", ["server.extra_args=[--draft-lm-head-sharing, bogus]"]))
    assert "embedded engine rejects the pass-through flags" in str(info.value) and "bogus" in str(info.value)
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("tiny", ["server.extra_args=[--no-such-flag]"]))
    assert "server.extra_args" in str(info.value)
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("tiny", ["server.extra_args=[--lm-head-dtype, bf16]"]))
    assert "--lm-head-dtype is set from the recipe" in str(info.value)


def test_embedded_unknown_builtin_model():
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("tiny", ["model.path=sparkit:huge-ling"]))
    assert "model.path: unknown built-in model 'sparkit:huge-ling'" in str(info.value)


def test_api_key_env_is_recorded_never_the_key():
    plan = compile_plan(load_recipe("tiny", ["server.api_key_env=MY_SPARKIT_KEY"]))
    assert plan.api_key_env == "MY_SPARKIT_KEY" and "--api-key" not in plan.argv


def test_passthrough_value_starting_with_dash_is_a_value(tmp_path):
    plan = compile_plan(load_recipe(_recipe(tmp_path, "server:\n  extra_args: [--random-seed, '-1']\n")))
    assert plan.argv[-2:] == ["--random-seed", "-1"]
    assert _prepare_server_args(plan.argv[3:]).random_seed == -1


def test_a_reference_perplexity_set_before_the_model_says_so_when_it_fails(tmp_path):
    """The known answer belongs to one checkpoint. When --set or a child recipe sets model.path
    after the reference was stated, the check still runs (the path may name the same checkpoint,
    or a damaged copy), and the plan carries where both came from for a failure to say; a recipe
    that restates both in one layer, or keeps the model, carries no such note."""
    from sparkit.recipes.load import load_recipe

    assert compile_plan(load_recipe("tiny")).expectations.reference_model_note is None
    assert compile_plan(load_recipe("tiny/tiny-broken-kernel")).expectations.reference_model_note is None

    other = compile_plan(load_recipe("tiny", ["model.path=sparkit:tiny-ling:seed=3:steps=30"])).expectations
    assert other.reference_perplexity == 1.461
    assert "tiny.yaml:" in other.reference_model_note and "sparkit:tiny-ling:seed=3:steps=30 by --set" in other.reference_model_note

    child = tmp_path / "child.yaml"
    child.write_text("extends: tiny\nmodel: {path: 'sparkit:tiny-ling:seed=5:steps=30'}\n")
    assert "child.yaml: if that is another model" in compile_plan(load_recipe(child)).expectations.reference_model_note
    child.write_text("extends: tiny\nmodel: {path: 'sparkit:tiny-ling:seed=5:steps=30'}\nchecks: {reference_perplexity: 9.5}\n")
    restated = compile_plan(load_recipe(child)).expectations
    assert restated.reference_perplexity == 9.5 and restated.reference_model_note is None
    skipped = compile_plan(load_recipe("tiny", ["model.path=x", "checks.reference_perplexity=null"])).expectations
    assert skipped.reference_perplexity is None and skipped.reference_model_note is None


def test_the_quantised_tiny_sglang_recipes_serve_their_exports():
    from sparkit.models.tiny_ling.family import SHIPPED_DIR

    models = cache_dir() / "models"
    for name, weights, backend, export in (
            ("tiny/tiny-sglang-fp8", "fp8", "triton", "tiny-ling-s0-hf-fp8"),
            ("tiny/tiny-sglang-mxfp4", "mxfp4", "humming", "tiny-ling-s0-hf-mxfp4"),
            ("tiny/tiny-sglang-damaged-scale", "fp8", "triton", "tiny-ling-s0-hf-fp8-damaged-scale")):
        plan = compile_plan(load_recipe(name))
        args = plan.argv[plan.argv.index("sglang.launch_server") + 1:]
        assert args[:2] == ["--model-path", str(models / export)] and "--trust-remote-code" in args, name
        assert "--quantization" not in args  # SGLang reads it from the checkpoint's quantization_config
        assert args[args.index("--moe-runner-backend") + 1] == backend
        assert plan.model_builds == [{"name": "tiny-ling", "seed": 0, "dir": str(SHIPPED_DIR / "tiny-ling-s0"),
                                      "export_hf": {"dtype": "bfloat16", "weights": weights,
                                                    "damaged_scale": name.endswith("damaged-scale"),
                                                    "dir": str(models / export)}}]
        assert plan.expectations.weights == weights and plan.expectations.moe_backend == backend
        assert plan.env["SPARKIT_SGLANG_PLUGIN"] == "1" and plan.expectations.speculative == "nextn"
        assert plan.expectations.reference_perplexity is not None


def test_the_embedded_engine_serves_a_named_export_and_the_layout_must_be_the_weights():
    plan = compile_plan(load_recipe("tiny", ["model.path=sparkit:tiny-ling@mxfp4", "stack.weights=mxfp4"]))
    assert plan.argv[plan.argv.index("--model-path") + 1] == str(cache_dir() / "models" / "tiny-ling-s0-hf-mxfp4")
    assert plan.argv[plan.argv.index("--expert-weights") + 1] == "mxfp4"
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("tiny", ["model.path=sparkit:tiny-ling@mxfp4"]))  # tiny says weights: fp8
    assert "stack.weights" in str(info.value) and "is the mxfp4 export, but stack.weights is fp8" in str(info.value)
    with pytest.raises(RecipeError, match=r"\+damaged-scale damages a quantisation scale"):
        compile_plan(load_recipe("tiny/tiny-sglang", ["model.path=sparkit:tiny-ling@bf16+damaged-scale"]))
    with pytest.raises(RecipeError, match="unknown built-in model 'sparkit:tiny-ling@int4'"):
        compile_plan(load_recipe("tiny/tiny-sglang", ["model.path=sparkit:tiny-ling@int4"]))


def test_a_build_whose_widths_the_layout_cannot_tile_is_refused_at_plan_time(sparkit_home):
    import json as _json

    from sparkit.models.tiny_ling.model import TinyLingConfig

    build = cache_dir() / "models" / "tiny-ling-s5-n30"  # a build of another seed, already made, 192 wide
    build.mkdir(parents=True)
    TinyLingConfig(moe_intermediate_size=192, shared_expert_intermediate_size=192).save(build)
    assert _json.loads((build / "config.json").read_text())["moe_intermediate_size"] == 192
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("tiny/tiny-sglang-fp8", ["model.path=sparkit:tiny-ling:seed=5:steps=30@fp8"]))
    message = str(info.value)
    assert "model.path" in message and "moe_intermediate_size 192" in message
    assert "model.layers.0.mlp.experts.0.gate_proj.weight [192, 128]: rows 192 not a multiple of the FP8 block 128" in message


def test_tiny_v3_dspark_recipes_serve_the_v3_target_with_its_draft():
    """The embedded recipe and the SGLang one: tiny-ling-v3 (its BailingMoeV3 export for SGLang, which
    captures layers for DSpark) with sparkit:tiny-ling-v3-dspark, no launch-would-fail warning; the
    random-draft recipe builds the untrained V3 draft."""
    from sparkit.models.dspark.builder import builtin_draft_dir

    draft = str(builtin_draft_dir("tiny-ling-v3-dspark"))
    for name in ("tiny/tiny-v3-dspark", "tiny/tiny-v3-sglang-dspark"):
        plan = compile_plan(load_recipe(name), port=30556)
        assert plan.argv[plan.argv.index("--speculative-algorithm") + 1] == "DSPARK"
        assert plan.argv[plan.argv.index("--speculative-draft-model-path") + 1] == draft
        assert [(b["name"], b.get("kind")) for b in plan.model_builds] == [("tiny-ling-v3", None),
                                                                         ("tiny-ling-v3-dspark", "dspark")]
        assert plan.expectations.reference_perplexity == 1.469 and plan.expectations.min_accept_length == 2.0
        assert not [w for w in plan.warnings if "launch will fail" in w]
        if name == "tiny/tiny-v3-sglang-dspark":  # SGLang loads the target's BailingMoeV3 export
            assert plan.model_builds[0]["export_hf"]["weights"] == "bf16"
    random = compile_plan(load_recipe("tiny/tiny-v3-dspark-random-draft"))
    untrained = str(cache_dir() / "models" / "tiny-ling-v3-dspark-s0-n0")
    assert random.model_builds[1] == {"name": "tiny-ling-v3-dspark", "seed": 0, "kind": "dspark", "steps": 0, "dir": untrained}
