"""The `engine_switches` startup check: a recipe's SGLANG_* switches (server.env) must be what the
engine process runs (issue 38, item 3). Plans are compiled from shipped recipes by sparkit's own
compile (checked by SGLang 0.5.23's parser); the engine's side is what sparkit's plugin reports
from inside it, produced here by the plugin's own function against SGLang's real registry with
the engine's environment set as it would be."""

from __future__ import annotations

import os

import pytest

from sparkit.checks.activation import check_engine_switches, evaluate
from sparkit.checks.evidence import ServerEvidence, parse_server_info
from sparkit.contract.checks import Status
from sparkit.engines.activation_report import ActivationReport, LmHeadReport, ModelReport
from sparkit.engines.sglang import plugin

pytest.importorskip("sglang")

GLUE = "SGLANG_ENABLE_METADATA_GLUE_GRAPH"
KDA = "SGLANG_OPT_FUSED_KDA_VERIFY"


def plan_with(env: dict[str, str], recipe: str = "tiny/tiny-sglang-baseline"):
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe

    body = ", ".join(f"{k}: '{v}'" for k, v in env.items())
    return compile_plan(load_recipe(recipe, [f"server.env={{{body}}}"] if env else []))


def engine_report(monkeypatch, engine_env: dict[str, str]) -> ActivationReport:
    """The report sparkit's plugin writes in an engine process whose environment is `engine_env`."""
    from sparkit.engines.sglang.report import engine_switches

    for name in [n for n in os.environ if n.startswith("SGLANG_")]:
        monkeypatch.delenv(name)
    for name, value in engine_env.items():
        monkeypatch.setenv(name, value)
    head = LmHeadReport("bfloat16", "UnquantizedEmbeddingMethod", 1, 2)
    return ActivationReport("sglang", "0.5.23", "cuda:0", {"target": ModelReport("BailingMoeV3ForCausalLM", head)},
                            engine_env=engine_switches())


def test_the_plan_has_the_plugin_report_a_recipes_switches():
    plan = plan_with({GLUE: "1", KDA: "1"})
    assert plan.env[plugin.ENABLE_ENV] == "1" and plan.env[plugin.PLUGINS_ENV] == "sparkit"
    assert plan.env[plugin.FP8_ENV] == "0"  # for the report alone: the recipe's bf16 head stays bf16
    (provision,) = [p for p in plan.provisions if p.optimisation == "engine_switches=reported"]
    assert provision.provider == "sparkit-plugin" and GLUE in provision.detail and KDA in provision.detail
    # a recipe without switches keeps stock SGLang untouched
    bare = plan_with({})
    assert plugin.ENABLE_ENV not in bare.env
    assert not any(p.optimisation == "engine_switches=reported" for p in bare.provisions)
    # with the FP8 head the plugin is on anyway and converts it
    fp8 = plan_with({GLUE: "1"}, "tiny/tiny-sglang")
    assert plugin.FP8_ENV not in fp8.env and any(p.optimisation == "engine_switches=reported" for p in fp8.provisions)


def test_switches_the_engine_runs_as_asked_pass(monkeypatch):
    plan = plan_with({GLUE: "1", KDA: "true"})
    rep = engine_report(monkeypatch, {GLUE: "1", KDA: "true"})
    result = check_engine_switches(plan, ServerEvidence("sglang", reports=[rep]))
    assert result.status is Status.PASS, result.to_dict()
    assert result.detail == "2 switch(es) shown in effect by the engine itself"
    assert f"the activation report (TP rank 0): {GLUE}=1 -> True (default False)" in result.evidence


def test_a_value_the_engine_cannot_read_fails(monkeypatch):
    """'on' is not one of SGLang's boolean spellings: it warns in its log and runs the default (off)."""
    plan = plan_with({GLUE: "on"})
    result = check_engine_switches(plan, ServerEvidence("sglang", reports=[engine_report(monkeypatch, {GLUE: "on"})]))
    assert result.status is Status.FAIL
    assert "the engine cannot read it" in result.detail and "runs its default False" in result.detail
    assert "1/0, true/false" in result.fix


def test_a_switch_missing_from_the_engines_environment_fails(monkeypatch):
    plan = plan_with({GLUE: "1", KDA: "1"})
    result = check_engine_switches(plan, ServerEvidence("sglang", reports=[engine_report(monkeypatch, {GLUE: "1"})]))
    assert result.status is Status.FAIL
    assert result.detail == f"1 of 2 switch(es) are not what the recipe asks: {KDA}=1: the engine's environment has no {KDA}"


def test_a_switch_the_engine_process_has_another_value_of_fails(monkeypatch):
    plan = plan_with({GLUE: "1"})
    result = check_engine_switches(plan, ServerEvidence("sglang", reports=[engine_report(monkeypatch, {GLUE: "0"})]))
    assert result.status is Status.FAIL and "the recipe passes '1', the engine process has '0'" in result.detail


def test_a_switch_this_sglang_does_not_have_warns(monkeypatch):
    name = "SGLANG_ENABLE_FUSED_VERIFY_EXTEND_GRAPH"  # the TP4 study's, from a development branch
    plan = plan_with({name: "1"})
    result = check_engine_switches(plan, ServerEvidence("sglang", reports=[engine_report(monkeypatch, {name: "1"})]))
    assert result.status is Status.WARN and "the installed engine has no such variable" in result.detail


def test_a_switch_set_outside_the_recipe_warns(monkeypatch):
    """Inherited from the shell that ran sparkit: it changes what an A/B measures."""
    plan = plan_with({GLUE: "1"})
    rep = engine_report(monkeypatch, {GLUE: "1", KDA: "1", "SGLANG_OPT_GATE_GEMV_MODE": "1"})  # the last at its default
    result = check_engine_switches(plan, ServerEvidence("sglang", reports=[rep]))
    assert result.status is Status.WARN and result.detail == f"set outside the recipe: {KDA}"
    assert result.data["not_from_recipe"] == [KDA]


def test_server_info_env_vars_stand_in_for_a_report():
    plan = plan_with({GLUE: "1"})
    info = parse_server_info({"internal_states": [{"env_vars": {GLUE: "1", "SGLANG_PLUGINS": "sparkit"}}]})
    result = check_engine_switches(plan, ServerEvidence("sglang", server_info=info))
    assert result.status is Status.PASS and result.data["source"] == "/server_info env_vars"
    dropped = parse_server_info({"internal_states": [{"env_vars": {}}]})
    assert check_engine_switches(plan, ServerEvidence("sglang", server_info=dropped)).status is Status.FAIL


def test_without_any_report_it_cannot_prove_them():
    result = check_engine_switches(plan_with({GLUE: "1"}), ServerEvidence("sglang", server_info=parse_server_info({})))
    assert result.status is Status.WARN and "engine_switches=reported" in result.fix


def test_a_recipe_without_switches_skips_and_evaluate_runs_it():
    plan = plan_with({})
    assert check_engine_switches(plan, ServerEvidence("sglang")).status is Status.SKIP
    assert "engine_switches" in [r.name for r in evaluate(plan, ServerEvidence("sglang"))]
