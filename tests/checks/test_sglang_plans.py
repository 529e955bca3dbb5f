"""The checks read the keys SGLang 0.5.23 really reports, for every shipped SGLang recipe.

Each plan's argv is parsed by sglang's own parser; the /server_info body is that
ServerArgs' resolved_dict() with what resolution does on a GPU box applied
(NEXTN reported as EAGLE, auto MoE backend resolved, DSpark's step and topk set to 1). The resolved-args check must
then pass with those differences named, and fail when the server runs otherwise.
"""

from __future__ import annotations

import pytest

from sparkit.checks.activation import check_ignored_settings, check_resolved_args
from sparkit.checks.evidence import ServerEvidence, parse_server_info
from sparkit.contract.checks import Status
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe, shipped_recipes

SGLANG_RECIPES = []
for name, _path in shipped_recipes():
    try:
        if compile_plan(load_recipe(name)).engine == "sglang":
            SGLANG_RECIPES.append(name)
    except Exception:  # a recipe that does not compile here is the recipes' tests' business
        continue


@pytest.fixture(scope="module")
def prepare_server_args():
    module = pytest.importorskip("sglang.srt.server_args")
    return module.prepare_server_args


def server_info_for(plan, prepare_server_args, **resolution):
    argv = plan.argv[plan.argv.index("sglang.launch_server") + 1:] if "sglang.launch_server" in plan.argv else plan.argv[2:]
    args = prepare_server_args(list(argv))
    body = dict(args.resolved_dict())
    if str(body.get("speculative_algorithm") or "").upper() == "NEXTN":
        body["speculative_algorithm"] = "EAGLE"
    if body.get("moe_runner_backend") == "auto":
        body["moe_runner_backend"] = "flashinfer_mxfp4"
    if str(body.get("speculative_algorithm") or "").upper() == "DSPARK":
        # speculative_hook._handle_dspark (it reads the draft's config, so it runs only where that is)
        body.update(speculative_num_steps=1, speculative_eagle_topk=1)
        if plan.expectations.draft_block_size:
            body["speculative_num_draft_tokens"] = plan.expectations.draft_block_size + 1
    body.update(resolution)
    body.update({"version": "0.5.23", "launch_command": " ".join(plan.argv), "internal_states": [{}]})
    return parse_server_info(body)


def test_there_are_sglang_recipes_to_check():
    assert SGLANG_RECIPES


@pytest.mark.parametrize("recipe", SGLANG_RECIPES)
def test_resolved_args_pass_on_the_real_sglang_shape(recipe, prepare_server_args):
    plan = compile_plan(load_recipe(recipe))
    info = server_info_for(plan, prepare_server_args)
    result = check_resolved_args(plan, ServerEvidence("sglang", server_info=info))
    assert result.status == Status.PASS, result.to_dict()


@pytest.mark.parametrize("recipe", SGLANG_RECIPES)
def test_resolved_args_fail_when_the_server_runs_something_else(recipe, prepare_server_args):
    plan = compile_plan(load_recipe(recipe))
    wrong = {"tp_size": plan.expectations.server_args["tp_size"] * 2}
    if plan.expectations.server_args.get("mem_fraction_static") is not None:
        wrong["mem_fraction_static"] = 0.5
    info = server_info_for(plan, prepare_server_args, **wrong)
    result = check_resolved_args(plan, ServerEvidence("sglang", server_info=info))
    assert result.status == Status.FAIL
    for key in wrong:
        assert key in result.detail


def test_unknown_env_var_of_a_shipped_recipe_is_reported(prepare_server_args):
    plans = [compile_plan(load_recipe(r)) for r in SGLANG_RECIPES]
    with_warning = [p for p in plans if any("SGLANG_ENABLE_FUSED_VERIFY_EXTEND_GRAPH" in w for w in p.warnings)]
    if not with_warning:
        pytest.skip("no shipped recipe sets an env var the installed sglang ignores")
    plan = with_warning[0]
    result = check_ignored_settings(plan, ServerEvidence("sglang", server_info=server_info_for(plan, prepare_server_args)))
    assert result.status == Status.WARN
    assert "SGLANG_ENABLE_FUSED_VERIFY_EXTEND_GRAPH" in result.data["ignored_env"]
