"""The fast inference path (model.FastDecoderLayer: fused projections, complex RoPE, per-expert
MoE for a few tokens, dense MoE for many) computes what the modules compute, and the fp8
lm_head's CPU path (a dequantised copy cached next to the fp8 weight) gives the reference numbers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _model(untrained_model_dir, experts: str):
    from sparkit.models import checkpoint

    _, model = checkpoint.load_checkpoint(untrained_model_dir)
    for module in model.modules():
        if type(module).__name__ == "MoE":
            module.quantize_experts(experts, torch.float32)
            for holder in (module.experts_gate_up, module.experts_down):
                holder.cache_decoded()
    return model.eval()


@pytest.fixture(scope="module")
def narrow_experts_model_dir(tmp_path_factory):
    """Routed experts narrower than the shared expert (each width a config key of its own), top-1."""
    import json

    from sparkit.models.checkpoint import MARKER, save_checkpoint
    from sparkit.models.tiny_ling.model import TinyLingConfig, TinyLingForCausalLM
    from sparkit.models.tiny_ling.tokenizer import save_tokenizer

    directory = tmp_path_factory.mktemp("tiny-narrow")
    torch.manual_seed(99)
    save_checkpoint(TinyLingForCausalLM(TinyLingConfig(max_position_embeddings=512, moe_intermediate_size=64,
                                                       shared_expert_intermediate_size=160, num_experts=4,
                                                       num_experts_per_tok=1)), directory)
    save_tokenizer(directory)
    (directory / MARKER).write_text(json.dumps({"seed": 99}))
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("experts", ["fp32", "fp8", "mxfp4"])
def test_fast_path_matches_the_modules_for_prefill_decode_and_verify(untrained_model_dir, experts):
    _check_fast_path_matches(_model(untrained_model_dir, experts))


def test_fast_path_matches_with_top1_routing_and_a_shared_expert_wider_than_the_routed_ones(narrow_experts_model_dir):
    model = _model(narrow_experts_model_dir, "fp8")
    assert model.layers[0].mlp.shared_expert.down_proj.weight.shape[1] == 160 and model.layers[0].mlp.experts_inter_size() == 64
    _check_fast_path_matches(model)


def _check_fast_path_matches(model):
    torch.manual_seed(0)
    prompt = torch.randint(0, 256, (1, 20))
    steps = [torch.randint(0, 256, (1, t)) for t in (1, 4, 1, 3, 2)]

    def run(fast: bool):
        model._fast = None
        if fast:
            assert model.prepare_inference()
        cache = model.new_cache(64)
        outs = [model.forward_hidden(prompt, cache, 0)]
        pos = prompt.shape[1]
        for ids in steps:
            outs.append(model.forward_hidden(ids, cache, pos))
            pos += ids.shape[1]
        return outs

    with torch.inference_mode():
        reference, fast = run(False), run(True)
    for want, got in zip(reference, fast):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # and the result is a real difference from an unrelated input, not a constant
    assert not torch.allclose(fast[1], fast[3])


def test_fast_nextn_layer_matches_the_module_including_last_only(untrained_model_dir):
    from sparkit.models.tiny_ling.model import TinyLingForCausalLMNextN

    model = _model(untrained_model_dir, "fp8")
    draft = TinyLingForCausalLMNextN(model.mtp, model.embed_tokens, model.lm_head, model.rope, model.config)
    torch.manual_seed(1)
    hidden = torch.randn(1, 6, model.config.hidden_size)
    ids = torch.randint(0, 256, (1, 6))

    def run(fast: bool):
        model.mtp._fast = None
        if fast:
            assert model.mtp.prepare_inference()
        cache = draft.new_cache(32, torch.float32, "cpu")
        first = draft.forward_hidden(hidden[:, :5], ids[:, :5], cache, 0, last_only=True)
        step = draft.forward_hidden(first, ids[:, 5:], cache, 5)
        return first, step

    with torch.inference_mode():
        for want, got in zip(run(False), run(True)):
            assert got.shape == want.shape == (1, 1, model.config.hidden_size)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_engine_uses_the_fast_path_only_where_experts_are_decoded_once(untrained_model_dir, make_engine):
    at_load = make_engine(untrained_model_dir, expert_weights="fp8", speculative_algorithm="NEXTN")
    per_forward = make_engine(untrained_model_dir, expert_weights="fp8", expert_dequant="forward")
    assert at_load.model._fast is not None and at_load.model.mtp._fast is not None
    assert per_forward.model._fast is None  # decodes from the fp8 bytes in every forward, as asked
    # the report still describes the real modules
    report = at_load.activation_report()
    assert report.models["target"].moe.expert_weight_format == "fp8"
    assert report.models["draft"].lm_head.shared_with_target is True


def test_subnormal_activations_are_flushed_without_changing_the_result(untrained_model_dir):
    """A very negative gate and a small up give float32 subnormals (slow in the CPU matmul); the
    dense path zeroes such activations, which changes the output by far less than rounding."""
    model = _model(untrained_model_dir, "fp32")
    with torch.inference_mode():
        layer = model.layers[0]
        H = model.config.hidden_size
        shared_inter = model.config.shared_expert_intermediate_size
        layer.mlp.shared_expert.gate_up_proj.weight[:shared_inter] = -87.0 / H  # shared gates -87 on a flat input
        layer.mlp.shared_expert.gate_up_proj.weight[shared_inter:] = 1e-3 / H  # shared ups 1e-3
        layer.post_attention_layernorm.weight.fill_(1.0)
        model.prepare_inference()
        act = torch.nn.functional.silu(torch.tensor(-87.0)) * 1e-3
        assert 0 < abs(float(act)) < torch.finfo(torch.float32).tiny  # the precondition: subnormals
        x = torch.full((1, 12, H), 0.02)  # a prefill: the dense path, over every expert
        cache_a, cache_b = model.new_cache(16), model.new_cache(16)
        fast = model._fast[0](x[0], model.rope, cache_a, 0, 0)
        reference = layer(x, model.rope, cache_b, 0, 0)[0]
    torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-6)


def test_fp8_linear_cpu_cache_gives_the_reference_numbers_and_follows_in_place_updates():
    from sparkit.kernels import fp8_linear as fl

    torch.manual_seed(0)
    weight = torch.randn(300, 64)
    q, scale = fl.quantize_fp8_per_row(weight)
    x = torch.randn(3, 64)
    exact = x @ (q.to(torch.float32) * scale[:, None]).T
    first = fl.fp8_linear(x, q, scale, out_dtype=torch.float32)
    torch.testing.assert_close(first, exact, rtol=1e-5, atol=1e-5)
    assert fl._cached_dequantised_t(q, scale) is fl._cached_dequantised_t(q, scale)  # decoded once
    scale.mul_(2)  # an in-place update must not be served from the stale copy
    torch.testing.assert_close(fl.fp8_linear(x, q, scale, out_dtype=torch.float32), 2 * exact, rtol=1e-5, atol=1e-5)
    other_q, other_scale = fl.quantize_fp8_per_row(torch.randn(300, 64))
    assert not torch.allclose(fl.fp8_linear(x, other_q, other_scale), first)
