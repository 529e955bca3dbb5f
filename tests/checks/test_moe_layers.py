"""The weights and MoE-runner checks judge every MoE layer from the activation report.

Reports of schema /1 (the real H200 runs in tests/fixtures/sglang-0.5.23-h200/, one summary per
model) still parse and are judged as one entry per model; schema /2 reports list each layer with
the quant method, expert format and runner it really runs, written by sparkit.engines.sglang.report
from the model's modules (here: modules carrying SGLang 0.5.23's own get_moe_runner_backend
methods, exec'd from the installed source).
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from sparkit.checks.activation import check_moe_runner, check_weights
from sparkit.checks.evidence import ServerEvidence, parse_server_info
from sparkit.contract.checks import Status
from sparkit.engines.activation_report import SCHEMA, ActivationReport, load_reports
from sparkit.engines.sglang.log import parse_log
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe

from _shared import REPO_DIR

FIXTURES = REPO_DIR / "tests" / "fixtures" / "sglang-0.5.23-h200"
torch = pytest.importorskip("torch")
sys.path.insert(0, str(REPO_DIR / "tests" / "sglang_plugin"))


def _real_run(name: str) -> ServerEvidence:
    run = FIXTURES / name
    return ServerEvidence("sglang", server_info=parse_server_info(json.loads((run / "server_info.json").read_text())),
                          log=parse_log((run / "server.log").read_text(errors="replace")), reports=load_reports(run))


def _plan(recipe: str, *sets: str):
    return compile_plan(load_recipe(recipe, list(sets)))


MXFP4_HUMMING = "tiny/tiny-sglang-mxfp4"  # the shipped recipe asking for MXFP4 experts through humming


def test_the_schema_1_reports_of_the_real_runs_still_parse_as_one_entry_per_model():
    for path in (FIXTURES / "sparkit-main" / "activation-tp0.json", FIXTURES / "bailing-nextn-nograph.activation-tp0.json",
                 FIXTURES / "v3-nextn-nograph.activation-tp0.json"):
        data = json.loads(path.read_text())
        assert data["schema"] == "sparkit.activation/1" and "layers" not in data["models"]["target"]["moe"]
        rep = ActivationReport.from_dict(data)
        moe = rep.target.moe
        assert moe.layers == [] and len(moe.per_layer()) == 1
        assert moe.per_layer()[0].quant_method == data["models"]["target"]["moe"]["quant_method"]
        assert ActivationReport.from_dict(rep.to_dict()).schema == SCHEMA  # written back as /2


def test_the_real_tiny_sglang_run_passes_both_checks_and_the_same_evidence_fails_a_humming_recipe():
    ev = _real_run("sparkit-main")  # tiny/tiny-sglang on the H200: bf16 experts, Triton, every check passed
    plan = _plan("tiny/tiny-sglang")
    weights, runner = check_weights(plan, ev), check_moe_runner(plan, ev)
    assert weights.status == Status.PASS and "hold bf16 experts" in weights.detail
    assert runner.status == Status.PASS and "triton is in use on all 2 MoE layer(s)" in runner.detail  # target + draft
    # the same server judged against a recipe that asks for humming MXFP4 experts
    humming = _plan(MXFP4_HUMMING)
    weights, runner = check_weights(humming, ev), check_moe_runner(humming, ev)
    assert weights.status == Status.FAIL and "do not hold mxfp4 experts" in weights.detail
    assert runner.status == Status.FAIL
    assert "requested humming, but 2 of 2 MoE layer(s) run another runner" in runner.detail
    assert "UnquantizedFusedMoEMethod, bf16 experts, runner triton" in runner.detail
    assert "unquantised" in runner.cause and "Mxfp4HummingMoEMethod" in runner.cause
    assert "sparkit:tiny-ling@mxfp4" in runner.fix


# ------------------------------------------------------------------ schema /2 from live modules


def _sglang_methods():
    """Quant method classes of SGLang 0.5.23 as the report sees them: the class names, and their
    installed get_moe_runner_backend (exec'd from the source)."""
    from _sglang_source import bind_method

    fp8 = type("Fp8MoEMethod", (), {"get_moe_runner_backend": bind_method(
        "sglang.srt.layers.quantization.fp8", "Fp8MoEMethod", "get_moe_runner_backend", {})})
    humming = type("Mxfp4HummingMoEMethod", (), {"get_moe_runner_backend": bind_method(
        "sglang.srt.layers.quantization.mxfp4_humming_moe", "Mxfp4HummingMoEMethod", "get_moe_runner_backend", {})})
    return fp8, humming


def _backend(value: str):
    return types.SimpleNamespace(value=value)


def _model(layers: list) -> torch.nn.Module:
    """A model whose MoE layers (FusedMoE modules under model.layers.i.mlp.experts) hold the given
    quant methods."""
    FusedMoE = type("FusedMoE", (torch.nn.Module,), {})
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList()
    for method in layers:
        block = torch.nn.Module()
        block.mlp = torch.nn.Module()
        block.mlp.experts = FusedMoE()
        block.mlp.experts.quant_method = method
        block.mlp.experts.moe_runner_config = types.SimpleNamespace(runner_backend=None)
        model.model.layers.append(block)
    return model


def _fp8_method(fp8_cls, runner: str, fp4: bool = False):
    method = fp8_cls()
    method.runner = types.SimpleNamespace(runner_backend=_backend(runner))
    method.is_fp4_expert = fp4
    return method


def _humming_method(humming_cls, fp8_cls):
    method = humming_cls()
    method.runner = types.SimpleNamespace(runner_backend=_backend("humming"))
    method._fp8 = _fp8_method(fp8_cls, "triton", fp4=True)
    return method


def _report(target, draft) -> ActivationReport:
    from sparkit.engines.sglang.report import build_report

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float8_e4m3fn), requires_grad=False)
            self.quant_method = type("SparkitFp8LmHeadMethod", (), {})()

    target.lm_head = Head()
    draft.lm_head = target.lm_head
    return ActivationReport.from_dict(json.loads(json.dumps(build_report(target, draft, runner_backend="humming").to_dict())))


def test_the_report_lists_every_layer_with_its_method_format_runner_and_humming_schema():
    fp8, humming = _sglang_methods()
    target = _model([_humming_method(humming, fp8) for _ in range(4)])
    for block in target.model.layers:  # what prepare_humming_moe_layer leaves on a pre-quantised layer
        schema = types.SimpleNamespace(b_dtype="float4e2m1", bs_dtype="float8e8m0", weight_scale_group_size=32)
        block.mlp.experts.weight_schemas = {"w13": schema, "w2": schema}
    draft = _model([_humming_method(humming, fp8)])
    rep = _report(target, draft)
    layers = rep.target.moe.layers
    assert [layer.name for layer in layers] == [f"model.layers.{i}.mlp.experts" for i in range(4)]
    assert {(layer.quant_method, layer.expert_weight_format, layer.runner) for layer in layers} == {("Mxfp4HummingMoEMethod", "mxfp4", "humming")}
    assert layers[0].weight_schema == "b_dtype=float4e2m1 bs_dtype=float8e8m0 group=32; b_dtype=float4e2m1 bs_dtype=float8e8m0 group=32"
    assert rep.draft.moe.layers[0].weight_schema is None  # the draft's layer had not been prepared
    plan = _plan(MXFP4_HUMMING)
    ev = ServerEvidence("sglang", reports=[rep])
    assert check_weights(plan, ev).status == Status.PASS
    runner = check_moe_runner(plan, ev)
    assert runner.status == Status.PASS and "humming is in use on all 5 MoE layer(s)" in runner.detail


def test_a_humming_recipe_whose_fp8_layers_run_triton_fails_naming_the_layers_the_reason_and_the_fix():
    fp8, _ = _sglang_methods()
    rep = _report(_model([_fp8_method(fp8, "triton") for _ in range(4)]), _model([_fp8_method(fp8, "triton")]))
    plan = _plan(MXFP4_HUMMING)
    ev = ServerEvidence("sglang", reports=[rep], server_info=parse_server_info({"moe_runner_backend": "humming", "quantization": "fp8"}))
    weights = check_weights(plan, ev)
    assert weights.status == Status.FAIL and "5 of 5 MoE layer(s) do not hold mxfp4 experts" in weights.detail
    assert "target model.layers.0.mlp.experts, model.layers.1.mlp.experts, model.layers.2.mlp.experts, ... (4 layers)" in weights.detail
    runner = check_moe_runner(plan, ev)
    assert runner.status == Status.FAIL
    assert "Fp8MoEMethod, fp8 experts, runner triton" in runner.detail and "draft model.layers.0.mlp.experts" in runner.detail
    assert "hands humming only MXFP4 experts" in runner.cause and "routed_experts_quant_method: mxfp4" in runner.cause
    assert "sparkit:tiny-ling@mxfp4" in runner.fix


def test_one_layer_off_the_requested_runner_fails_alone():
    fp8, humming = _sglang_methods()
    target = _model([_humming_method(humming, fp8) for _ in range(4)])
    draft = _model([_fp8_method(fp8, "triton", fp4=True)])  # MXFP4 experts left on the plain method
    ev = ServerEvidence("sglang", reports=[_report(target, draft)],
                        server_info=parse_server_info({"moe_runner_backend": "triton"}))
    plan = _plan(MXFP4_HUMMING)
    assert check_weights(plan, ev).status == Status.PASS  # every layer holds MXFP4 experts
    runner = check_moe_runner(plan, ev)
    assert runner.status == Status.FAIL and "1 of 5 MoE layer(s)" in runner.detail
    assert runner.detail.endswith("draft model.layers.0.mlp.experts: Fp8MoEMethod, mxfp4 experts, runner triton")
    assert "resolved moe_runner_backend is 'triton'" in runner.cause


def test_without_a_report_the_weights_check_reads_the_resolved_quantization():
    plan = _plan("tiny/tiny-sglang-fp8")
    fp8 = check_weights(plan, ServerEvidence("sglang", server_info=parse_server_info({"quantization": "fp8"})))
    assert fp8.status == Status.PASS and "not judged layer by layer" in fp8.detail
    bf16 = check_weights(plan, ServerEvidence("sglang", server_info=parse_server_info({"quantization": None})))
    assert bf16.status == Status.WARN
    assert check_weights(plan, ServerEvidence("sglang")).status == Status.WARN


def test_the_embedded_engine_reports_every_layer(quant_model_dir):
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    engine = EmbeddedEngine(EngineConfig(model_path=str(quant_model_dir), expert_weights="mxfp4",
                                         speculative_algorithm="NEXTN"))
    rep = engine.activation_report()
    assert [layer.name for layer in rep.target.moe.layers] == ["layers.0.mlp", "layers.1.mlp", "layers.2.mlp", "layers.3.mlp"]
    assert {(layer.quant_method, layer.expert_weight_format) for layer in rep.target.moe.layers + rep.draft.moe.layers} == {
        ("EmbeddedMxfp4Experts", "mxfp4")}
    plan = _plan("tiny", "stack.weights=mxfp4")
    ev = ServerEvidence("embedded", reports=[rep])
    assert check_weights(plan, ev).status == Status.PASS and check_moe_runner(plan, ev).status == Status.PASS
    assert check_weights(_plan("tiny"), ev).status == Status.FAIL  # the recipe says fp8
