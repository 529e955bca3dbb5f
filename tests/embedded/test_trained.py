"""The trained tiny-ling: it has learned its corpus, its MTP drafts are usually right (accept length
well above 1.5), and the two traps sparkit must catch really cost the speculation: a wrong draft
(another seed's NextN layer) and the shared-head bug with an fp8 lm_head (accept length ~1.0).
Also the activation report, built by inspecting the live modules."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from sparkit.engines.embedded.api import SamplingParams  # noqa: E402


def accept_length(engine, prompts=12, max_new_tokens=48) -> float:
    from sparkit.models.tiny_ling.corpus import prompt_ids, sample_prompts

    committed = verify_steps = 0
    for prompt in sample_prompts(prompts, seed=11):
        ids = prompt_ids(engine.tokenizer, prompt)
        for step in engine.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens), lambda: False):
            if step.verify_step:
                verify_steps += 1
                committed += len(step.token_ids)
    return committed / verify_steps


def test_the_model_has_learned_its_corpus(tiny_model_dir):
    from sparkit.models.checkpoint import load_checkpoint
    from sparkit.models.tiny_ling.corpus import documents, encode_document

    _, model = load_checkpoint(tiny_model_dir)
    docs = documents(seed=999)  # unseen documents of the same distribution
    ids = torch.tensor([sum((encode_document(next(docs)) for _ in range(6)), [])[:256]])
    with torch.inference_mode():
        logits = model.logits(model.forward_hidden(ids[:, :-1]))
        nll = torch.nn.functional.cross_entropy(logits[0], ids[0, 1:]).item()
    assert nll < 1.2, f"held-out loss {nll:.2f} nats/token (uniform would be {math.log(262):.2f})"


@pytest.mark.slow
def test_trained_draft_gives_accept_length_well_above_1_5(tiny_model_dir, make_engine):
    engine = make_engine(tiny_model_dir, speculative_algorithm="NEXTN", speculative_num_steps=3, lm_head_dtype="fp8")
    assert accept_length(engine) > 2.0


@pytest.mark.slow
def test_a_wrong_draft_gives_accept_length_near_one(tiny_model_dir, wrong_draft_model_dir, make_engine):
    engine = make_engine(
        tiny_model_dir, speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_draft_model_path=str(wrong_draft_model_dir)
    )
    assert accept_length(engine) < 1.2


@pytest.mark.slow
def test_tensor_sharing_of_an_fp8_head_gives_accept_length_near_one(tiny_model_dir, make_engine):
    engine = make_engine(
        tiny_model_dir, speculative_algorithm="NEXTN", speculative_num_steps=3, lm_head_dtype="fp8", draft_lm_head_sharing="tensor"
    )
    assert accept_length(engine) < 1.2


def test_tensor_sharing_of_a_bf16_head_is_harmless(tiny_model_dir, make_engine):
    engine = make_engine(tiny_model_dir, speculative_algorithm="NEXTN", speculative_num_steps=3, lm_head_dtype="bf16", draft_lm_head_sharing="tensor")
    assert accept_length(engine, prompts=6) > 2.0


def test_activation_report_shows_the_shared_fp8_head_and_expert_format(tiny_model_dir, make_engine, tmp_path):
    from sparkit.engines.activation_report import load_reports

    engine = make_engine(tiny_model_dir, speculative_algorithm="NEXTN", speculative_num_steps=3, lm_head_dtype="fp8", expert_weights="mxfp4")
    report = engine.activation_report()
    target, draft = report.target, report.draft
    assert report.engine == "embedded" and report.device == "cpu"
    assert target.model_class == "TinyLingForCausalLM" and draft.model_class == "TinyLingForCausalLMNextN"
    assert target.lm_head.weight_dtype == "float8_e4m3fn" and target.lm_head.quant_method == "Fp8LmHeadMethod"
    assert draft.lm_head.shared_with_target is True
    assert draft.lm_head.module_id == target.lm_head.module_id and draft.lm_head.storage_ptr == target.lm_head.storage_ptr
    assert target.moe.expert_weight_format == "mxfp4" and target.moe.quant_method == "EmbeddedMxfp4Experts"
    assert target.moe.runner == "embedded-torch" and draft.moe.expert_weight_format == "mxfp4"
    assert report.speculative.algorithm == "NEXTN" and report.speculative.num_draft_tokens == 4
    assert "Online FP8 quantization enabled for lm_head." in report.notes
    report.write(tmp_path)
    assert load_reports(tmp_path)[0].draft.lm_head.shared_with_target is True


def test_activation_report_exposes_the_tensor_sharing_trap(tiny_model_dir, make_engine):
    engine = make_engine(tiny_model_dir, speculative_algorithm="NEXTN", lm_head_dtype="fp8", draft_lm_head_sharing="tensor")
    report = engine.activation_report()
    assert report.draft.lm_head.shared_with_target is False
    assert report.draft.lm_head.module_id != report.target.lm_head.module_id
    assert report.draft.lm_head.quant_method == "UnquantizedLinearMethod"
    assert report.draft.lm_head.weight_dtype != "float8_e4m3fn"


def test_without_speculation_there_is_no_draft_and_server_args_use_sglang_names(tiny_model_dir, make_engine):
    engine = make_engine(tiny_model_dir, expert_weights="fp8", lm_head_dtype="fp32")
    report = engine.activation_report()
    assert report.draft is None and report.speculative.algorithm is None
    assert report.target.lm_head.weight_dtype == "float32" and report.target.moe.expert_weight_format == "fp8"
    args = engine.server_args()
    assert args["speculative_algorithm"] is None and args["quantization"] == "fp8"
    assert args["enable_fp32_lm_head"] is True and args["moe_runner_backend"] == "embedded-torch"
    assert args["tp_size"] == 1 and args["device"] == "cpu" and args["context_length"] == engine.context_length
    spec = make_engine(tiny_model_dir, speculative_algorithm="EAGLE", speculative_num_steps=2).server_args()
    assert (spec["speculative_algorithm"], spec["speculative_num_steps"], spec["speculative_eagle_topk"], spec["speculative_num_draft_tokens"]) == ("EAGLE", 2, 1, 3)
