"""Every rule, tested failing for its real reason and passing once fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkit.engines.sglang.rules import expert_width
from sparkit.errors import RecipeError
from sparkit.planning.compile import compile_plan
from sparkit.planning.rules import check_rules, every_rule
from sparkit.recipes.load import load_recipe

# The config.json of the tiny-ling-v3 build (builder version 1) that SGLang 0.5.23 failed to serve
MLA_128 = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.23-h200" / "configs" / "tiny-ling-v3-mla128"

# (rule, severity, base recipe, overrides that break it, overrides that satisfy it)
CASES = [
    # the tiny-ling-v3 build whose MLA (128 + 128) died on the H200 (session 12); today's is 512 + 64
    ("sglang-triton-mla-widths", "error", "tiny/tiny-sglang", [f"model.path={MLA_128}"], ["model.path=sparkit:tiny-ling-v3"]),
    ("fp8-head-excludes-fp32-head", "error", "ling-3.0-flash/spark-humming-fp8head",
     ["server.extra_args=[--enable-fp32-lm-head]"], ["server.extra_args=[]"]),
    ("fp8-head-excludes-fp32-head", "error", "ling-3.0-flash/spark-humming",
     ["server.env={SGLANG_ENABLE_FP8_LM_HEAD: '1'}"], ["stack.lm_head=fp8"]),
    ("speculative-numbers-all-or-none", "error", "ling-3.0-flash/spark-humming",
     ["stack.speculative={method: nextn, num_steps: 3}"], ["stack.speculative={method: nextn}"]),
    ("speculative-numbers-all-or-none", "error", "ling-3.0-flash/spark-humming",
     ["stack.speculative={method: nextn, eagle_topk: 1, num_draft_tokens: 4}"],
     ["stack.speculative={method: nextn, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}"]),
    ("topk1-draft-tokens", "error", "ling-3.0-flash/spark-optimized",
     ["stack.speculative.num_draft_tokens=6"], ["stack.speculative.num_draft_tokens=4"]),
    ("dspark-needs-draft-model", "error", "ling-3.0-flash/tp4-baseline",
     ["stack.speculative=dspark"], ["stack.speculative={method: dspark, draft_model: inclusionAI/Ling-3.0-flash-dspark}"]),
    ("dspark-takes-no-step-numbers", "error", "ling-3.0-flash/tp4-dspark",
     ["stack.speculative.num_steps=5"], ["stack.speculative.num_steps=null"]),
    ("dspark-disables-metadata-glue-graph", "warning", "ling-3.0-flash/tp4-dspark",
     ["server.env={SGLANG_ENABLE_METADATA_GLUE_GRAPH: '1'}"], ["server.env={SGLANG_OPT_FUSED_KDA_VERIFY: '1'}"]),
    ("fp8-block-quant-tp-split", "error", "ling-3.0-flash/tp4-baseline",
     ["stack.weights=fp8", "model.path=inclusionAI/Ling-3.0-flash-fp8"],
     ["stack.weights=fp8", "model.path=inclusionAI/Ling-3.0-flash-fp8", "stack.ep=4"]),
    ("no-inline-api-key", "error", "ling-3.0-flash/spark-baseline",
     ["server.extra_args=[--api-key, sk-secret]"], ["server.api_key_env=SPARKIT_KEY"]),
    ("no-inline-api-key", "error", "tiny",  # the embedded engine reads its key from SPARKIT_API_KEY
     ["server.env={SPARKIT_API_KEY: inline-secret}"], ["server.api_key_env=SPARKIT_API_KEY"]),
    ("no-inline-api-key", "error", "ling-3.0-flash/spark-baseline",  # whatever the recipe names
     ["server.api_key_env=MY_SERVER_KEY", "server.env.MY_SERVER_KEY=inline-secret"], ["server.api_key_env=MY_SERVER_KEY"]),
    ("no-secret-in-env", "error", "ling-3.0-flash/spark-baseline",
     ["server.env.HF_TOKEN=hf_inline"], ["server.env.SGLANG_USE_AITER_FP8_PER_TOKEN=1"]),
    ("no-secret-in-env", "error", "tiny", ["server.env.OPENAI_API_KEY=sk-inline"], ["server.env.HF_HUB_OFFLINE=1"]),
    ("gb10-mem-fraction", "warning", "ling-3.0-flash/spark-optimized",
     ["server.mem_fraction_static=0.8"], ["server.mem_fraction_static=0.68"]),
    ("embedded-moe-backend", "error", "tiny",
     ["stack.moe_backend=humming"], ["stack.moe_backend=embedded-torch"]),
    ("sglang-moe-backend", "error", "ling-3.0-flash/spark-baseline",
     ["stack.moe_backend=embedded-torch"], ["stack.moe_backend=triton"]),
    ("dspark-needs-draft-model", "error", "tiny", ["stack.speculative=dspark"],
     ["stack.speculative={method: dspark, draft_model: sparkit:tiny-ling-dspark}"]),
    ("dspark-takes-no-step-numbers", "error", "tiny/tiny-dspark",
     ["stack.speculative.num_draft_tokens=9"], ["stack.speculative.block_size=8"]),
    ("block-size-is-dspark", "error", "tiny", ["stack.speculative.block_size=8"], ["stack.speculative.num_steps=3"]),
    ("embedded-one-device", "error", "tiny", ["stack.tp=2"], ["stack.tp=1"]),
    ("embedded-kv-cache-compute-dtype", "error", "tiny", ["stack.kv_cache_dtype=fp8_e4m3"], ["stack.kv_cache_dtype=auto"]),
    ("embedded-tool-call-parser", "error", "tiny", ["server.tool_call_parser=hermes"], ["server.tool_call_parser=ling3"]),
    ("builtin-layout-is-the-weights", "error", "tiny",
     ["model.path=sparkit:tiny-ling@mxfp4", "stack.weights=fp8"], ["model.path=sparkit:tiny-ling@mxfp4", "stack.weights=mxfp4"]),
    ("code-env-needs-opt-in", "error", "tiny",
     ["server.env.PYTHONPATH=/tmp/x"], ["server.env.PYTHONPATH=/tmp/x", "server.allow_code_env=[PYTHONPATH]"]),
    ("code-env-needs-opt-in", "error", "ling-3.0-flash/spark-baseline",  # issue 40.3's attack: an OpenSSL provider
     ["server.env.OPENSSL_CONF=/tmp/evil.cnf"], ["server.env.NCCL_DEBUG=INFO"]),
    ("code-env-needs-opt-in", "error", "ling-3.0-flash/spark-baseline",  # in SGLang's registry, and an import
     ["server.env.SGLANG_HTTP_SERVER_APP_PATH=evil:app"], ["server.env.SGLANG_ENABLE_METADATA_GLUE_GRAPH=1"]),
    ("code-env-needs-opt-in", "error", "tiny",  # Triton's, and where its compiled kernels are read from
     ["server.env.TRITON_HOME=/tmp/x"], ["server.env.TRITON_PRINT_AUTOTUNING=1"]),
    ("env-names", "error", "tiny", ["server.env={'A=B': '1'}"], ["server.env={A_B: '1'}", "server.allow_code_env=[A_B]"]),
]


def _ids(case):
    return f"{case[0]}-{case[2].rsplit('/', 1)[-1]}-{case[3][0][:30]}"


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_rule_both_ways(case):
    name, severity, base, broken, fixed = case
    rule = next(r for r in every_rule() if r.name == name)
    if severity == "error":
        with pytest.raises(RecipeError) as info:
            compile_plan(load_recipe(base, broken))
        msg = str(info.value)
        assert f"[{name}: {rule.reason}]" in msg, msg
        assert info.value.hint == rule.fix
        assert info.value.key and info.value.file  # located: key path and where it came from
    else:
        plan = compile_plan(load_recipe(base, broken))
        assert any(f"[{name}:" in w for w in plan.warnings), plan.warnings
    plan = compile_plan(load_recipe(base, fixed))
    assert not any(v.rule == name for v in check_rules(load_recipe(base, fixed)))
    assert not any(f"[{name}:" in w for w in plan.warnings)


def test_every_rule_is_tested_and_documented():
    assert {r.name for r in every_rule()} == {c[0] for c in CASES}
    for r in every_rule():
        assert r.reason and r.fix and not r.reason.endswith(".")


def test_rule_error_points_at_the_recipe_line(tmp_path):
    path = (tmp_path / "r.yaml").resolve()
    path.write_text("extends: ling-3.0-flash/spark-optimized\nstack:\n  speculative:\n    num_draft_tokens: 9\n")
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe(path))
    assert str(info.value).startswith(
        f"{path}:4:23 stack.speculative.num_draft_tokens: with eagle_topk 1, num_draft_tokens must be num_steps + 1 = 4, not 9")


def test_several_errors_are_all_named():
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe("tiny", ["stack.moe_backend=humming", "stack.tp=2"]))
    msg = str(info.value)
    assert "embedded-moe-backend" in msg and "also:" in msg and "embedded-one-device" in msg


def test_expert_width_from_local_config(tmp_path):
    (tmp_path / "config.json").write_text('{"moe_intermediate_size": 640}')
    assert expert_width(str(tmp_path)) == 640
    assert expert_width("inclusionAI/Ling-3.0-flash-fp8") == 768
    assert expert_width("org/unknown") is None
    # 640 = 5 x 128: TP2 splits it into 320, not a multiple of 128.
    with pytest.raises(RecipeError, match="fp8-block-quant-tp-split"):
        compile_plan(load_recipe("ling-3.0-flash/tp4-baseline", [f"model.path={tmp_path}", "stack.weights=fp8",
                                                                  "stack.tp=2"]))


@pytest.mark.slow
@pytest.mark.parametrize("where", ["--set", "recipe"])
@pytest.mark.parametrize("name", ["SPARKIT_API_KEY", "MY_SERVER_KEY", "HF_TOKEN"])
def test_a_key_in_server_env_is_refused_and_written_nowhere(sparkit_home, tmp_path, where, name):
    """The attack: the key given through server.env, on the command line or in a recipe file.
    `plan --json` and `up` refuse it (exit 3, located), before any file exists, and the key is in
    no output and no file under SPARKIT_HOME."""
    import os
    import subprocess
    import sys

    secret = "inline-secret-6d1f"
    if where == "--set":
        args = ["tiny", "--set", f"server.env={{{name}: {secret}}}"]
    else:
        recipe = tmp_path / "keyed.yaml"
        recipe.write_text(f"extends: tiny\nserver:\n  api_key_env: MY_SERVER_KEY\n  env:\n    {name}: {secret}\n")
        args = [str(recipe)]
    if name == "MY_SERVER_KEY" and where == "--set":
        args += ["--set", "server.api_key_env=MY_SERVER_KEY"]
    env = {**os.environ, "SPARKIT_HOME": str(sparkit_home), "MY_SERVER_KEY": "k"}
    for command in (["plan", *args, "--json"], ["up", *args, "--port", "auto", "--detach"]):
        result = subprocess.run([sys.executable, "-m", "sparkit", *command], env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 3, result.stderr
        assert f"server.env.{name}" in result.stderr and "hint:" in result.stderr
        assert "--set" in result.stderr if where == "--set" else "keyed.yaml:5:" in result.stderr
        assert secret not in result.stdout + result.stderr
    leaks = [p for p in sparkit_home.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaks == [] and not (sparkit_home / "runs").exists()


def test_the_triton_mla_widths_rule_reads_a_local_config(tmp_path):
    """Ling-3.0's own widths pass (the shipped tiny-ling-v3 has them), 128 + 128 fails, a model without MLA is no concern."""
    import json

    from sparkit.engines.sglang.rules import _triton_mla_widths

    def verdict(config: dict) -> list:
        (tmp_path / "config.json").write_text(json.dumps(config))
        return _triton_mla_widths(load_recipe("tiny/tiny-sglang", [f"model.path={tmp_path}"]))

    assert verdict({"kv_lora_rank": 512, "qk_rope_head_dim": 64}) == []
    assert verdict({"kv_lora_rank": 256, "qk_rope_head_dim": 32}) == []
    assert "= 256," in verdict({"kv_lora_rank": 128, "qk_rope_head_dim": 128})[0][2]
    assert verdict({"moe_intermediate_size": 192}) == []
