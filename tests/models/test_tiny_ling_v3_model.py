"""tiny-ling-v3 as SGLang 0.5.23's BailingMoeV3: its router is SGLang's biased grouped top-k (the
function itself, read from SGLang's source), its RoPE SGLang's GPT-J rotation, its layers in
Ling-3.0's pattern; the cache continues and rolls back as a fresh forward would compute; the
forward hands out the residual stream of chosen layers (what SGLang captures for a DSpark draft);
its Hugging Face export is a config SGLang parses into BailingHybridConfig and tensors it names,
and loads back with the same numbers."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from typing import Optional

import pytest

torch = pytest.importorskip("torch")

from sparkit.models.tiny_ling_v3.model import (  # noqa: E402
    BailingV3MoE,
    TinyLingV3Config,
    TinyLingV3ForCausalLM,
)

_SGLANG_SPEC = importlib.util.find_spec("sglang")
SGLANG = Path(_SGLANG_SPEC.origin).parent if _SGLANG_SPEC and _SGLANG_SPEC.origin else None


def _sglang_function(relative: str, name: str, namespace: dict):
    """A function of SGLang's source (decorators dropped), compiled into `namespace`."""
    path = SGLANG / relative
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return namespace[name]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyLingV3ForCausalLM(TinyLingV3Config(max_position_embeddings=256)).eval()


def test_layers_follow_ling_3s_pattern(model):
    cfg = model.config
    assert [layer.kda for layer in model.layers] == [True, True, True, False]  # layer_group_size 4
    assert [layer.moe for layer in model.layers] == [False, True, True, True]  # first_k_dense_replace 1
    assert not model.mtp.decoder.kda and model.mtp.decoder.moe  # the NextN layer: MLA + MoE
    assert cfg.n_group == 2 and cfg.topk_group == 1 and cfg.routed_scaling_factor == 2.5


@pytest.mark.skipif(SGLANG is None, reason="needs sglang's source (the test environment has it)")
def test_the_router_is_sglangs_biased_grouped_topk():
    impl = _sglang_function("srt/layers/moe/topk.py", "biased_grouped_topk_impl",
                            {"torch": torch, "Optional": Optional, "_RENORMALIZE_SUM_EPSILON": 1e-20})
    torch.manual_seed(0)
    moe = BailingV3MoE(TinyLingV3Config()).eval()
    with torch.no_grad():
        moe.expert_bias.copy_(torch.randn(8) * 0.3)  # a bias large enough to change the choice
    x = torch.randn(200, 128)
    weights, ids = impl(x, torch.nn.functional.linear(x, moe.gate.weight), moe.expert_bias, 2, True, 2, 1,
                        routed_scaling_factor=2.5, apply_routed_scaling_factor_on_output=True)
    topi, topw = moe.route(x)
    theirs = [sorted(zip(i.tolist(), w.tolist())) for i, w in zip(ids, weights)]
    mine = [sorted(zip(i.tolist(), w.tolist())) for i, w in zip(topi, topw)]
    assert [[e for e, _ in row] for row in mine] == [[e for e, _ in row] for row in theirs]
    assert max(abs(a[1] - b[1]) for r, s in zip(mine, theirs) for a, b in zip(r, s)) < 1e-6
    unbiased = [sorted(row.tolist()) for row in x.matmul(moe.gate.weight.T).sigmoid().topk(2, dim=-1)[1]]
    assert unbiased != [[e for e, _ in row] for row in mine]  # the bias does move tokens


@pytest.mark.skipif(SGLANG is None, reason="needs sglang's source (the test environment has it)")
def test_mla_rope_is_sglangs_gptj_rotation(model):
    rotate_gptj = _sglang_function("srt/layers/rotary_embedding/utils.py", "rotate_gptj", {"torch": torch})
    rope = model.rope
    x = torch.randn(1, 5, rope.cos.shape[1] * 2)
    cos = rope.cos[3:8].repeat_interleave(2, dim=-1)  # SGLang's forward_native for is_neox_style False
    sin = rope.sin[3:8].repeat_interleave(2, dim=-1)
    assert (rope(x, 3) - (x * cos + rotate_gptj(x) * sin)).abs().max() < 1e-6


def test_a_cached_forward_with_a_rolled_back_verify_step_is_a_fresh_forward(model):
    ids = torch.randint(0, 264, (1, 48))
    with torch.no_grad():
        whole = model.forward_hidden(ids)
        cache = model.new_cache(128)
        prefill = model.forward_hidden(ids[:, :30], cache, 0)
        cache.length = 30
        verify = model.forward_hidden(ids[:, 30:35], cache, 30)  # x_m and four drafts
        cache.length = 33  # two drafts accepted, plus the bonus token
        rest = model.forward_hidden(ids[:, 33:], cache, 33)
    assert (torch.cat((prefill, verify[:, :3], rest), 1) - whole).abs().max() < 1e-4
    with pytest.raises(ValueError, match="cannot roll the linear-attention state back"):
        cache.length = 20  # before the last forward: its state is gone
    with torch.no_grad():  # a verify window longer than a KDA chunk rolls back as well
        cache.length = 0  # a new sequence
        model.forward_hidden(ids[:, :10], cache, 0)
        cache.length = 10
        model.forward_hidden(ids[:, 10:40], cache, 10)
        cache.length = 25
        again = model.forward_hidden(ids[:, 25:], cache, 25)
    assert (again - whole[:, 25:]).abs().max() < 1e-4


def test_the_forward_hands_out_the_residual_stream_of_chosen_layers(model):
    ids = torch.randint(0, 264, (1, 12))
    with torch.no_grad():
        hidden, captured = model.forward_hidden(ids, capture=[1, 3])
        x = model.embed_tokens(ids)
        streams = []
        for layer in model.layers:
            x = layer(x, model.rope)
            streams.append(x)
    assert torch.equal(captured, torch.cat((streams[1], streams[3]), dim=-1))  # in the order asked for
    assert torch.equal(hidden, model.norm(streams[3]))  # the last layer's stream before the final norm


def test_greedy_speculation_rolls_back_the_draft_cache_too(model):
    """The draft's cache (one MLA layer) is positional: truncate drops what a rejected chain wrote."""
    draft = model.nextn_draft(model.mtp, model.lm_head)
    cache = draft.new_cache(64, torch.float32, "cpu")
    hidden = torch.randn(1, 10, 128)
    ids = torch.randint(0, 264, (1, 10))
    with torch.no_grad():
        whole = draft.forward_hidden(hidden, ids)
        draft.forward_hidden(hidden[:, :6], ids[:, :6], cache, 0)
        cache.length = 6
        draft.forward_hidden(torch.randn(1, 3, 128), torch.randint(0, 264, (1, 3)), cache, 6)  # a chain, then rejected
        cache.truncate(6)
        rest = draft.forward_hidden(hidden[:, 6:], ids[:, 6:], cache, 6)
    assert (rest - whole[:, 6:]).abs().max() < 1e-5


def test_a_training_step_updates_the_expert_bias_towards_balance():
    from sparkit.models.tiny_ling_v3.model import after_step, training_loss

    torch.manual_seed(2)
    model = TinyLingV3ForCausalLM(TinyLingV3Config())
    loss, main, mtp = training_loss(model, torch.randint(0, 264, (2, 33)))
    loss.backward()
    moe = model.layers[1].mlp
    load = moe.load.clone()
    after_step(model)
    moved = moe.expert_bias
    assert torch.equal(moved > 0, load < load.mean()) and torch.equal(moved < 0, load > load.mean())


def test_config_json_round_trips(tmp_path, model):
    model.config.save(tmp_path)
    again = TinyLingV3Config.from_dict(json.loads((tmp_path / "config.json").read_text()))
    assert again == model.config
