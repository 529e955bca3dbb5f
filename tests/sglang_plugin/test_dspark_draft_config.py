"""The shipped DSpark draft as SGLang 0.5.23 reads it: its config.json through SGLang's own parsers
(dflash_utils.parse_dflash_draft_config, dspark_config.parse_dspark_draft_config and
resolve_runtime_config, the server-args hook's gamma), its tensors through SGLang's own
load_weights (DFlashDraftModel's name mapping, DSparkDraftMixin's routing), exec'd from the
installed source (those modules do not import on a CPU machine)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from numbers import Integral
from typing import Any, Optional

import pytest

from _sglang_source import bind_method, exec_functions

pytest.importorskip("sglang")


@pytest.fixture(scope="module")
def sglang_parsers():
    import msgspec

    ns: dict[str, Any] = {"dataclass": dataclass, "Integral": Integral, "Any": Any, "List": list,
                          "Optional": Optional, "msgspec": msgspec, "logger": __import__("logging").getLogger("t")}
    exec_functions("sglang.srt.speculative.dflash_utils",
                   ["DEFAULT_DFLASH_MASK_TOKEN", "_cfg_get", "_get_text_config", "_get_dflash_config",
                    "_parse_optional_int", "DFlashDraftConfig", "build_target_layer_ids", "parse_dflash_draft_config"], ns)
    exec_functions("sglang.srt.speculative.dspark_components.dspark_config",
                   ["SUPPORTED_DSPARK_MARKOV_HEAD_TYPES", "DSparkDraftConfig", "DSparkRuntimeConfig",
                    "dspark_gamma_from_num_draft_tokens", "resolve_runtime_config", "_get_nested_config",
                    "_get_dspark_config", "parse_dspark_draft_config", "get_dspark_sample_from_anchor"], ns)
    return ns


@pytest.fixture(scope="module")
def draft_config(dspark_draft_dir) -> dict:
    return json.loads((dspark_draft_dir / "config.json").read_text())


def test_sglangs_parsers_read_the_block_the_layers_and_the_mask_sparkit_wrote(sglang_parsers, draft_config):
    from sparkit.models.dspark.config import DSparkConfig

    ours = DSparkConfig.from_hf_dict(draft_config)
    dflash = sglang_parsers["parse_dflash_draft_config"](draft_hf_config=draft_config)
    assert dflash.block_size == ours.block_size == 8
    assert dflash.resolve_target_layer_ids(target_num_layers=4, draft_num_layers=ours.num_hidden_layers) == [1, 3]
    dspark = sglang_parsers["parse_dspark_draft_config"](draft_hf_config=draft_config)
    assert (dspark.gamma, dspark.markov_rank, dspark.markov_head_type, dspark.mask_token_id) == (8, 16, "vanilla", 263)
    assert sglang_parsers["get_dspark_sample_from_anchor"](draft_config) is True  # the anchor row drafts token 1
    runtime = sglang_parsers["resolve_runtime_config"](draft_hf_config=draft_config, speculative_num_draft_tokens=None,
                                                       target_vocab_size=ours.vocab_size)
    assert (runtime.gamma, runtime.verify_num_draft_tokens, runtime.mask_token_id) == (8, 9, 263)


def test_sglang_refuses_a_draft_whose_mask_token_is_outside_the_target_vocabulary(sglang_parsers, draft_config):
    """What DSparkConfig.problems() refuses too, for the same reason."""
    from sparkit.models.dspark.config import DSparkConfig

    bad = {**draft_config, "mask_token_id": 264, "dspark_config": {**draft_config["dspark_config"], "mask_token_id": 264},
           "dflash_config": {**draft_config["dflash_config"], "mask_token_id": 264}}
    with pytest.raises(ValueError, match="outside the target vocab size 264"):
        sglang_parsers["resolve_runtime_config"](draft_hf_config=bad, speculative_num_draft_tokens=None, target_vocab_size=264)
    assert any("mask_token_id 264 is outside" in p for p in DSparkConfig.from_hf_dict(bad).problems())


class _Param:
    def __init__(self, name: str, shape: tuple):
        self.name, self.shape, self.loads = name, shape, []


def _sglang_draft_parameters(cfg) -> dict[str, _Param]:
    """The parameters of SGLang's DSparkDraftModel for this config, by the attribute names of
    models/dflash.py (DFlashAttention: qkv_proj, o_proj, q_norm, k_norm; DFlashMLP: gate_up_proj,
    down_proj; DFlashDecoderLayer: input_layernorm, post_attention_layernorm; DFlashDraftModel:
    layers, norm, fc, hidden_norm) and models/dspark.py (markov_head.markov_w1/w2,
    confidence_head.proj); the embedding and lm_head are attached, not parameters."""
    H, D, I = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size  # noqa: E741
    q, kv = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
    shapes = {"fc.weight": (H, H * len(cfg.target_layer_ids)), "hidden_norm.weight": (H,), "norm.weight": (H,),
              "markov_head.markov_w1.weight": (cfg.vocab_size, cfg.markov_rank),
              "markov_head.markov_w2.weight": (cfg.vocab_size, cfg.markov_rank),
              "confidence_head.proj.weight": (1, H + cfg.markov_rank), "confidence_head.proj.bias": (1,)}
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}"
        shapes.update({f"{p}.self_attn.qkv_proj.weight": (q + 2 * kv, H), f"{p}.self_attn.o_proj.weight": (H, q),
                       f"{p}.self_attn.q_norm.weight": (D,), f"{p}.self_attn.k_norm.weight": (D,),
                       f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,),
                       f"{p}.mlp.gate_up_proj.weight": (2 * I, H), f"{p}.mlp.down_proj.weight": (H, I)})
    return {name: _Param(name, shape) for name, shape in shapes.items()}


def test_sglangs_own_load_weights_loads_every_draft_parameter_from_the_shipped_tensors(dspark_draft_dir):
    """DSparkDraftMixin.load_weights routes markov_head.* and confidence_head.* to their heads and
    the rest to DFlashDraftModel.load_weights, which stacks q/k/v into qkv_proj and gate/up into
    gate_up_proj: every parameter gets exactly its shards, nothing is left over."""
    from safetensors.torch import load_file

    from sparkit.models.dspark.checkpoint import load_config

    cfg = load_config(dspark_draft_dir)
    params = _sglang_draft_parameters(cfg)

    def loader(param, weight, shard=None):
        param.loads.append((shard, tuple(weight.shape)))

    ns = {"default_weight_loader": loader, "Optional": Optional, "_DSPARK_SKIPPED_WEIGHT_PREFIXES": ("lm_head.", "rotary_emb.")}
    dflash_load = bind_method("sglang.srt.models.dflash", "DFlashDraftModel", "load_weights", ns)
    dspark_load = bind_method("sglang.srt.models.dspark", "DSparkDraftMixin", "load_weights", ns)

    class Draft:
        projector_type = None
        is_nemotron_35_draft = False
        num_context_features = len(cfg.target_layer_ids)
        config = cfg
        confidence_head = object()

        def named_parameters(self):
            return params.items()

        def _load_confidence_weights(self, *, confidence_weights, params_dict):
            for name, weight in confidence_weights:
                loader(params_dict[name], weight)

    class Parent:
        @staticmethod
        def load_weights(weights):
            dflash_load(Draft(), weights)

    ns["super"] = lambda: Parent  # DSparkDraftMixin's super().load_weights(backbone_weights)
    dspark_load.__globals__["super"] = ns["super"]
    dspark_load(Draft(), list(load_file(str(dspark_draft_dir / "model.safetensors")).items()))
    unloaded = [name for name, p in params.items() if not p.loads]
    assert unloaded == []
    for name, p in params.items():
        if name.endswith("qkv_proj.weight"):
            assert sorted(s for s, _ in p.loads) == ["k", "q", "v"]
        elif name.endswith("gate_up_proj.weight"):
            assert sorted(s for s, _ in p.loads) == [0, 1]
        else:
            assert p.loads == [(None, p.shape)], name
