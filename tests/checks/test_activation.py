"""Each activation check, failing for a real reason and passing.

Evidence is built from the real shapes: activation reports (sparkit.engines.activation_report),
/server_info bodies and log text parsed by sparkit.checks.evidence, probe results
as the runner measures them.
"""

from __future__ import annotations

import pytest

from sparkit.checks.activation import (
    check_acceptance,
    check_decode_speed,
    check_ignored_settings,
    check_lm_head_dtype,
    check_moe_runner,
    check_resolved_args,
    check_shared_lm_head,
    check_weights,
    compare_args,
    evaluate,
)
from sparkit.checks.evidence import ProbeRequest, ProbeResult, ServerEvidence, parse_server_info
from sparkit.contract.checks import Status
from sparkit.contract.plan import Expectations, LaunchPlan, Provision
from sparkit.engines.activation_report import (
    ActivationReport,
    LmHeadReport,
    ModelReport,
    MoeReport,
    SpeculativeReport,
)
from sparkit.engines.sglang.log import parse_log


def make_plan(engine="sglang", warnings=(), provisions=(), args=None, **expect) -> LaunchPlan:
    """A NEXTN 3/1/4 plan on SGLang; `args`: resolved args it expects besides (or instead of) those."""
    defaults = dict(
        weights="mxfp4", moe_backend="humming", lm_head="fp8", speculative="nextn",
        draft_shares_lm_head=True, min_accept_length=1.5,
    )
    defaults.update(expect)
    defaults["server_args"] = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                               "tp_size": 1, "moe_runner_backend": defaults["moe_backend"],
                               "speculative_algorithm": "EAGLE", **(args or {})}
    return LaunchPlan(
        engine=engine, argv=["sglang", "serve"], env={}, host="127.0.0.1", port=30000,
        model="inclusionAI/Ling-3.0-flash-fp4", served_model_name="ling", recipe_name="ling-spark",
        recipe_path=None, expectations=Expectations(**defaults), provisions=list(provisions), warnings=list(warnings),
    )


def resolved(**over):
    body = {
        "model_path": "inclusionAI/Ling-3.0-flash-fp4", "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
        "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "moe_runner_backend": "humming",
        "tp_size": 1, "ep_size": 1, "enable_fp32_lm_head": False, "version": "0.5.23", "internal_states": [{}],
    }
    body.update(over)
    return parse_server_info(body)


def report(*, head_dtype="float8_e4m3fn", draft=True, shared=True, runner="humming", experts="mxfp4", draft_path=None,
           exact_top_k=None):
    target_head = LmHeadReport(head_dtype, "Fp8LmHeadMethod" if "float8" in head_dtype else "UnquantizedLinearMethod", 111, 5000,
                               exact_top_k=exact_top_k)
    models = {"target": ModelReport("TinyLingForCausalLM", target_head, MoeReport(experts, "EmbeddedExperts", runner))}
    if draft:
        if shared:
            draft_head = LmHeadReport(head_dtype, target_head.quant_method, 111, 5000, shared_with_target=True)
        else:  # its own module, reading the target's storage through a bf16 method: the trap
            draft_head = LmHeadReport("bfloat16", "UnquantizedLinearMethod", 222, 5000, shared_with_target=False)
        models["draft"] = ModelReport("TinyLingForCausalLMNextN", draft_head)
    return ActivationReport(
        engine="embedded", engine_version="0.1.0", device="cpu", models=models,
        speculative=SpeculativeReport("NEXTN", 3, 1, 4, draft_path),
    )


def probe(accept: float | None, tok_s: float = 50.0, n: int = 3) -> ProbeResult:
    requests = []
    for i in range(n):
        tokens = 48
        verify = round(tokens / accept) if accept else None
        requests.append(ProbeRequest(prompt=f"p{i}", completion_tokens=tokens, spec_verify_ct=verify, decode_tok_s=tok_s, latency_s=1.0))
    return ProbeResult(requests=requests)


# -- resolved args -----------------------------------------------------------------------------
def test_resolved_args_pass_names_the_alias_and_the_forced_draft_tokens():
    plan = make_plan(engine="sglang", args={"speculative_algorithm": "NEXTN", "speculative_num_draft_tokens": 6})
    result = check_resolved_args(plan, ServerEvidence("sglang", server_info=resolved()))
    assert result.status == Status.PASS
    text = " ".join(result.evidence)
    assert "NEXTN is an alias of EAGLE" in text
    assert "forces draft tokens to num_steps+1 = 4" in text


def test_resolved_args_auto_moe_backend_resolution_is_named():
    plan = make_plan(moe_backend="auto")
    result = check_resolved_args(plan, ServerEvidence("sglang", server_info=resolved(moe_runner_backend="flashinfer_mxfp4")))
    assert result.status == Status.PASS
    assert "auto MoE backend resolved to flashinfer_mxfp4" in result.detail


def test_resolved_args_fail_names_each_difference():
    plan = make_plan(args={"tp_size": 4, "attention_backend": "trtllm_mla"})
    ev = ServerEvidence("sglang", server_info=resolved(tp_size=1, attention_backend="flashinfer"))
    result = check_resolved_args(plan, ev)
    assert result.status == Status.FAIL
    assert "tp_size: asked 4, server runs 1" in result.detail
    assert "attention_backend: asked 'trtllm_mla', server runs 'flashinfer'" in result.detail
    assert result.fix


def test_resolved_args_from_the_log_when_server_info_is_unreachable():
    log = parse_log("server_args={'tp_size': 2, 'speculative_algorithm': 'EAGLE', 'speculative_num_steps': 3, "
                    "'speculative_eagle_topk': 1, 'speculative_num_draft_tokens': 4, 'moe_runner_backend': 'humming'}\n")
    result = check_resolved_args(make_plan(), ServerEvidence("sglang", log=log, server_info_error="HTTP 401"))
    assert result.status == Status.FAIL and "tp_size" in result.detail
    assert "source: log server_args=" in result.evidence


# -- MoE runner --------------------------------------------------------------------------------
def test_moe_runner_pass_from_sglang_log_line():
    log = parse_log("[TP0] Using indexed gemm for humming moe\n")
    result = check_moe_runner(make_plan(), ServerEvidence("sglang", server_info=resolved(), log=log))
    assert result.status == Status.PASS
    assert any("Using indexed gemm for humming moe" in e for e in result.evidence)


def test_moe_runner_fail_when_a_model_default_replaced_the_backend():
    log = parse_log("Bailing V3 mixed FP8/MXFP4 checkpoint: moe_runner_backend=flashinfer_mxfp4 for BailingMoeV3ForCausalLM.\n")
    ev = ServerEvidence("sglang", server_info=resolved(moe_runner_backend="flashinfer_mxfp4"), log=log)
    result = check_moe_runner(make_plan(), ev)
    assert result.status == Status.FAIL
    assert result.detail == "requested humming, but flashinfer_mxfp4 is in use"


def test_moe_runner_warns_without_proof_on_sglang():
    result = check_moe_runner(make_plan(), ServerEvidence("sglang", server_info=resolved(moe_runner_backend="auto")))
    assert result.status == Status.WARN


def test_moe_runner_and_weights_embedded_report():
    plan = make_plan(engine="embedded", moe_backend="embedded-torch", weights="fp8")
    assert check_moe_runner(plan, ServerEvidence("embedded", reports=[report(runner="embedded-torch", experts="fp8")])).status == Status.PASS
    assert check_weights(plan, ServerEvidence("embedded", reports=[report(runner="embedded-torch", experts="fp8")])).status == Status.PASS
    failed = check_weights(plan, ServerEvidence("embedded", reports=[report(runner="embedded-torch", experts="bf16")]))
    assert failed.status == Status.FAIL and "do not hold fp8 experts" in failed.detail
    assert check_moe_runner(plan, ServerEvidence("embedded", reports=[report(runner="embedded-torch", experts="bf16")])).status == Status.PASS


# -- lm_head dtype -----------------------------------------------------------------------------
def test_lm_head_fp8_from_report_passes_and_bf16_fails():
    plan = make_plan(engine="embedded")
    assert check_lm_head_dtype(plan, ServerEvidence("embedded", reports=[report()])).status == Status.PASS
    failed = check_lm_head_dtype(plan, ServerEvidence("embedded", reports=[report(head_dtype="bfloat16")]))
    assert failed.status == Status.FAIL
    assert failed.detail == "requested fp8, the lm_head runs in bf16"


def test_lm_head_exact_rescoring_must_be_what_the_recipe_asks():
    plan = make_plan(engine="embedded", lm_head_exact_top_k=4)
    ok = check_lm_head_dtype(plan, ServerEvidence("embedded", reports=[report(exact_top_k=4)]))
    assert ok.status == Status.PASS and "top 4 candidates re-scored exactly" in ok.detail
    # The engine runs the FP8 head without re-scoring: near-ties will pick other tokens than bf16.
    off = check_lm_head_dtype(plan, ServerEvidence("embedded", reports=[report(exact_top_k=0)]))
    assert off.status == Status.FAIL and "top-0" in off.detail and "near-ties" in off.cause
    # An engine that does not report it (older plugin) is not failed on it.
    assert check_lm_head_dtype(plan, ServerEvidence("embedded", reports=[report()])).status == Status.PASS


def test_lm_head_on_sglang_reads_the_log_line():
    base = "Load weight end. elapsed=38.21 s, type=BailingMoeV3ForCausalLM, quant=fp8, avail mem=54.77 GB, mem usage=64.73 GB.\n"
    with_line = parse_log("Online FP8 quantization enabled for lm_head.\n" + base)
    assert check_lm_head_dtype(make_plan(), ServerEvidence("sglang", log=with_line)).status == Status.PASS
    # Upstream 0.5.23 ignores SGLANG_ENABLE_FP8_LM_HEAD: no line, the head stays BF16.
    failed = check_lm_head_dtype(make_plan(), ServerEvidence("sglang", log=parse_log(base)))
    assert failed.status == Status.FAIL and "plugin" in failed.fix


def test_lm_head_fp32_from_resolved_args():
    plan = make_plan(lm_head="fp32")
    ev = ServerEvidence("sglang", server_info=resolved(enable_fp32_lm_head=True), log=parse_log(""))
    assert check_lm_head_dtype(plan, ev).status == Status.PASS


# -- shared lm_head ----------------------------------------------------------------------------
def test_shared_head_pass_and_fail():
    plan = make_plan(engine="embedded")
    assert check_shared_lm_head(plan, ServerEvidence("embedded", reports=[report()])).status == Status.PASS
    failed = check_shared_lm_head(plan, ServerEvidence("embedded", reports=[report(shared=False)]))
    assert failed.status == Status.FAIL
    assert "BF16 method" in failed.cause


def test_shared_head_without_report_is_not_proven():
    result = check_shared_lm_head(make_plan(), ServerEvidence("sglang", server_info=resolved()))
    assert result.status == Status.WARN


def test_shared_head_skipped_without_speculation():
    plan = make_plan(speculative=None, draft_shares_lm_head=None)
    assert check_shared_lm_head(plan, ServerEvidence("sglang")).status == Status.SKIP


# -- acceptance --------------------------------------------------------------------------------
def test_acceptance_pass():
    result = check_acceptance(make_plan(), ServerEvidence("embedded", probe=probe(3.0)))
    assert result.status == Status.PASS
    assert result.data["accept_length"] == pytest.approx(3.0)


def test_acceptance_near_one_names_the_likely_causes():
    ev = ServerEvidence("embedded", probe=probe(1.0), reports=[report(shared=False)])
    result = check_acceptance(make_plan(), ev)
    assert result.status == Status.FAIL
    assert "~1" in result.detail
    assert "does not share the target's lm_head" in result.cause
    ev = ServerEvidence("embedded", probe=probe(1.02), reports=[report(draft_path="/models/other")])
    assert "wrong draft" in check_acceptance(make_plan(), ev).cause


def test_a_wrong_draft_is_named_once_when_the_report_and_the_recipe_both_name_it():
    ev = ServerEvidence("embedded", probe=probe(1.0), reports=[report(draft_path="sparkit:tiny-ling:seed=1")])
    cause = check_acceptance(make_plan(draft_model="sparkit:tiny-ling:seed=1"), ev).cause
    assert cause == "likely: the draft model sparkit:tiny-ling:seed=1 may not belong to this target (wrong draft)"
    ev = ServerEvidence("embedded", probe=probe(1.0), reports=[report(draft_path="/cache/models/tiny-ling-s1/")])
    cause = check_acceptance(make_plan(draft_model="/cache/models/tiny-ling-s1"), ev).cause
    assert cause == "likely: the draft model /cache/models/tiny-ling-s1/ may not belong to this target (wrong draft)"
    # The recipe alone (no activation report) names it too, once.
    cause = check_acceptance(make_plan(draft_model="/models/d"), ServerEvidence("embedded", probe=probe(1.0))).cause
    assert cause == "likely: the draft model /models/d may not belong to this target (wrong draft)"
    # A loaded draft other than the one asked for: both named, in one sentence.
    ev = ServerEvidence("embedded", probe=probe(1.0), reports=[report(draft_path="/models/other")])
    cause = check_acceptance(make_plan(draft_model="/models/d"), ev).cause
    assert cause == "likely: the draft model /models/other (the recipe asks for /models/d) may not belong to this target (wrong draft)"


def test_acceptance_below_the_recipe_minimum_fails():
    result = check_acceptance(make_plan(min_accept_length=2.5), ServerEvidence("embedded", probe=probe(2.0)))
    assert result.status == Status.FAIL and "2.50" in result.detail


def test_acceptance_falls_back_to_server_info():
    ev = ServerEvidence("sglang", server_info=resolved(internal_states=[{"avg_spec_accept_length": 3.1}]), probe=probe(None))
    result = check_acceptance(make_plan(), ev)
    assert result.status == Status.PASS and result.data["source"].startswith("/server_info")


# -- decode speed ------------------------------------------------------------------------------
def test_decode_speed_reported_and_compared_with_the_floor():
    passed = check_decode_speed(make_plan(min_decode_tok_s=40.0), ServerEvidence("embedded", probe=probe(3.0, tok_s=55.0)))
    assert passed.status == Status.PASS and passed.data["decode_tok_s"] == pytest.approx(55.0)
    failed = check_decode_speed(make_plan(min_decode_tok_s=40.0), ServerEvidence("embedded", probe=probe(1.0, tok_s=24.0)))
    assert failed.status == Status.FAIL and "below the recipe's floor" in failed.detail
    no_floor = check_decode_speed(make_plan(), ServerEvidence("embedded", probe=probe(3.0, tok_s=24.0)))
    assert no_floor.status == Status.PASS


# -- ignored settings --------------------------------------------------------------------------
def test_ignored_settings_pass_warn_fail():
    clean = check_ignored_settings(make_plan(), ServerEvidence("sglang", server_info=resolved()))
    assert clean.status == Status.PASS
    warn = check_ignored_settings(
        make_plan(warnings=["SGLANG_ENABLE_FUSED_VERIFY_EXTEND_GRAPH is not known to sglang 0.5.23 and will be ignored"]),
        ServerEvidence("sglang", server_info=resolved()),
    )
    assert warn.status == Status.WARN and warn.data["ignored_env"] == ["SGLANG_ENABLE_FUSED_VERIFY_EXTEND_GRAPH"]
    rewritten = check_ignored_settings(make_plan(args={"speculative_num_draft_tokens": 6}), ServerEvidence("sglang", server_info=resolved()))
    assert rewritten.status == Status.WARN and "speculative_num_draft_tokens" in rewritten.evidence[0]
    relied = check_ignored_settings(
        make_plan(
            warnings=["SGLANG_ENABLE_FP8_LM_HEAD is not known to sglang 0.5.23 and will be ignored"],
            provisions=[Provision("lm_head=fp8", "sglang-env", "SGLANG_ENABLE_FP8_LM_HEAD=1")],
        ),
        ServerEvidence("sglang", server_info=resolved()),
    )
    assert relied.status == Status.FAIL and "lm_head=fp8" in relied.detail


def test_evaluate_runs_every_check_once():
    results = evaluate(make_plan(engine="embedded"), ServerEvidence("embedded", server_info=resolved(), reports=[report()], probe=probe(3.0)))
    assert [r.name for r in results] == [
        "resolved_args", "weights", "moe_runner", "lm_head_dtype", "shared_lm_head", "shared_embedding", "block_size",
        "acceptance", "decode_speed", "known_answer", "ignored_settings", "engine_switches", "tool_calls",
    ]
    assert all(r.status in (Status.PASS, Status.SKIP) for r in results), [r.to_dict() for r in results]


def test_compare_args_reports_nothing_when_equal():
    assert compare_args(make_plan(), resolved().args) == []


def _rank(rep: ActivationReport, rank: int, size: int) -> ActivationReport:
    import dataclasses

    return dataclasses.replace(rep, tp_rank=rank, tp_size=size)


def test_tp_every_rank_must_share_its_own_head_shard():
    """TP2: each rank converts its vocabulary shard and its draft must share that rank's module;
    one unshared rank fails the check naming it, a missing rank's report is a warning."""
    plan = make_plan(args={"tp_size": 2})
    both = ServerEvidence(engine="sglang", reports=[_rank(report(), 0, 2), _rank(report(), 1, 2)])
    result = check_shared_lm_head(plan, both)
    assert result.status == Status.PASS and "all 2 TP ranks" in result.detail
    one_bad = ServerEvidence(engine="sglang", reports=[_rank(report(), 0, 2), _rank(report(shared=False), 1, 2)])
    result = check_shared_lm_head(plan, one_bad)
    assert result.status == Status.FAIL and "on TP rank(s) [1]" in result.detail
    assert result.data["unshared_ranks"] == [1]
    rank0_only = ServerEvidence(engine="sglang", reports=[_rank(report(), 0, 2)])
    result = check_shared_lm_head(plan, rank0_only)
    assert result.status == Status.WARN and "TP rank(s) [1] wrote no report" in result.detail


def test_tp4_reads_all_four_ranks():
    """TP4 (the H200 x4 session): every rank's report counts; the one rank whose draft kept the
    target's weight tensor is named, and a rank that wrote nothing is a warning, not a pass."""
    plan = make_plan(args={"tp_size": 4})
    ranks = [_rank(report(), r, 4) for r in range(4)]
    assert check_shared_lm_head(plan, ServerEvidence(engine="sglang", reports=ranks)).status == Status.PASS
    bad = ranks[:3] + [_rank(report(shared=False), 3, 4)]
    result = check_shared_lm_head(plan, ServerEvidence(engine="sglang", reports=bad))
    assert result.status == Status.FAIL and result.data["unshared_ranks"] == [3]
    missing = [ranks[0], ranks[1], ranks[3]]
    result = check_shared_lm_head(plan, ServerEvidence(engine="sglang", reports=missing))
    assert result.status == Status.WARN and "TP rank(s) [2] wrote no report" in result.detail
    mixed = ranks[:2] + [_rank(report(head_dtype="bfloat16"), 2, 4), ranks[3]]
    result = check_lm_head_dtype(plan, ServerEvidence(engine="sglang", reports=mixed))
    assert result.status == Status.FAIL and "rank 2: bfloat16" in result.detail


def test_tp_lm_head_shards_in_different_dtypes_fail():
    plan = make_plan(args={"tp_size": 2})
    mixed = ServerEvidence(engine="sglang", reports=[_rank(report(), 0, 2), _rank(report(head_dtype="bfloat16"), 1, 2)])
    result = check_lm_head_dtype(plan, mixed)
    assert result.status == Status.FAIL and "rank 1: bfloat16" in result.detail
    same = ServerEvidence(engine="sglang", reports=[_rank(report(), 0, 2), _rank(report(), 1, 2)])
    assert check_lm_head_dtype(plan, same).status == Status.PASS


# -- engine switches ---------------------------------------------------------------------------
def test_engine_switches_are_shown_on_or_named_where_they_did_not_arrive():
    from sparkit.checks.activation import check_engine_switches, passed_flags

    assert passed_flags(["--a", "--b", "4", "--c=x", "--d"]) == [("--a", None), ("--b", "4"), ("--c", "x"), ("--d", None)]
    plan = make_plan()
    plan.env = {"SGLANG_ENABLE_METADATA_GLUE_GRAPH": "1"}
    plan.recipe = {"server": {"extra_args": ["--disable-overlap-schedule", "--num-continuous-decode-steps", "4"]}}
    args = resolved(disable_overlap_schedule=True, num_continuous_decode_steps=4).args
    on = check_engine_switches(plan, ServerEvidence("sglang", server_info=parse_server_info(args),
                                                    engine_environ={"SGLANG_ENABLE_METADATA_GLUE_GRAPH": "1", "HOME": "/h"}))
    assert on.status == Status.PASS, on.to_dict()
    assert "env SGLANG_ENABLE_METADATA_GLUE_GRAPH=1: in the engine's environment" in on.evidence
    assert "flag --num-continuous-decode-steps 4: the server reports num_continuous_decode_steps=4" in on.evidence
    lost = check_engine_switches(plan, ServerEvidence("sglang", server_info=parse_server_info(args), engine_environ={}))
    assert lost.status == Status.FAIL and "SGLANG_ENABLE_METADATA_GLUE_GRAPH" in lost.detail and "unset" in lost.detail
    rewritten = check_engine_switches(plan, ServerEvidence("sglang", engine_environ=plan.env, server_info=parse_server_info(
        {**args, "num_continuous_decode_steps": 1})))
    assert rewritten.status == Status.WARN and "num_continuous_decode_steps=1" in rewritten.detail
    plan.env, plan.recipe = {}, {"server": {"extra_args": []}}
    assert check_engine_switches(plan, ServerEvidence("sglang")).status == Status.SKIP
