"""Declared layouts: what a decode step reads for models whose checkpoints are not on this machine.

The shipped Ling recipes name hub ids. Without a local copy of the checkpoint, the roofline is
computed from a *declared* tensor inventory: every tensor name, dtype and shape of the checkpoint,
generated from the model's documented configuration, then classified exactly like real headers
(sparkit.roofline.layout). A local checkpoint (a directory, or the hub id in the Hugging Face
cache) always wins over a declared profile; a local directory with a config.json and no weight
files (what SGLang serves with `--load-format dummy`) is sized from its own config.json through the
same generator (`config_only_tensors`).

This module is THE declaration of Ling-3.0-flash in sparkit: `LING3_FLASH_SHAPES` gives every
shape value with what settles it. The roofline's profile, the memory fit's config-only path,
scripts/make_sparse_ling.py (sparse safetensors headers of the model at any layer count, in bf16,
FP8 block or MXFP4 experts) and the Ling-width configs served on the H200 (`ling3_flash_config`)
all derive from it.

Sources: transformers' BailingHybridConfig (transformers 5.24, models/bailing_hybrid, documented
with `checkpoint="inclusionAI/Ling-3.0-Flash"`: its defaults are that checkpoint's values) and its
modeling code (KDA's full-rank `f_proj`/`g_proj`, MLA's single `q_proj` when q_lora_rank is unset,
the fp32 router); the checkpoint renames SGLang 0.5.23's loader expects (`attention.{q,k,v,f,g,b}_proj`,
`{q,k,v}_conv1d`, `A_log`, `dt_bias`, `dense`; MLA `q_proj`, `kv_a_proj_with_mqa`, `kv_b_proj`,
head-wise `g_proj`; per-expert `mlp.experts.E.{gate,up,down}_proj`, `mlp.shared_experts.*`; one
NextN layer stored as layer 42: `eh_proj`, `enorm`, `hnorm`, `final_layernorm`, an MLA attention
and a MoE), and the published quantisation layouts (-fp8: block-128 FP8 linear weights with
float32 `weight_scale_inv`; -fp4: MXFP4 routed experts, e2m1 packed two per byte with one e8m0
scale per 32 values, FP8 elsewhere; embeddings, lm_head, norms and routers unquantised).

Cross-checks (sparkit/roofline tests and docs/roofline.md): 124B parameters in the target layers
(the published total), 5.1B active per token excluding the embedding (published: 5.1B), the
bf16 checkpoint at 255 GB with the NextN layer, the -fp4 target weights at 64.0 GiB (SGLang's
load log on a DGX Spark: "mem usage=64.88 GB"), MLA KV at 8064 bytes per token (the same log:
1,912,896 tokens in 14.37 GB), 94 MB of bf16 experts per MoE layer per token (the TP4 study:
"each MoE layer reads ~94 MB of activated expert weights per step") and a 2.6 MB bf16 router.
Two values no published total can settle, because they move the totals by less than their
rounding: the dense layers' intermediate_size (6144, not 9216: +47M parameters, 0.04% of 124B)
and q_lora_rank (none, not 1536: -17M). For those the transformers config is the only source, and
scripts/make_sparse_ling.py, which once assumed 9216 and 1536, now derives from this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sparkit.checkpoint_headers import DTYPE_BITS, TensorInfo, read_config
from sparkit.errors import DataError
from sparkit.roofline.layout import layout_from_tensors
from sparkit.weight_formats import LAYOUTS, linear_tensors, sglang_quantization_config

_HF = "transformers BailingHybridConfig default (checkpoint inclusionAI/Ling-3.0-Flash)"

# Every shape of Ling-3.0-flash: (value, what settles it). The published figures are in
# docs/sglang-facts.md sections 6 and 9 and in docs/roofline.md's cross-check table.
LING3_FLASH_SHAPES: dict[str, tuple[Any, str]] = {
    "vocab_size": (157184, f"{_HF}; published vocabulary; the 805 MB bf16 lm_head (157184 x 2560 x 2 B)"),
    "hidden_size": (2560, f"{_HF}; the 805 MB lm_head and the 2.6 MB bf16 router (512 x 2560 x 2 B, TP4 study)"),
    "num_hidden_layers": (42, f"{_HF}; published: 42 layers, 35 KDA + 7 MLA"),
    "layer_group_size": (6, f"{_HF}; every 6th layer MLA gives the published 7 MLA layers, and with kv_lora_rank "
                            "+ qk_rope_head_dim the 8064 B/token KV of SGLang's Spark log"),
    "num_attention_heads": (32, f"{_HF}; with head_dim 128, KDA's six 4096 x 2560 projections make 2.2B of the "
                                "published 5.1B active parameters (16 heads would give about 4.0B)"),
    "num_key_value_heads": (32, f"{_HF} (MLA caches one latent: no KV-head count enters a size)"),
    "head_dim": (128, f"{_HF}; the 5.1B active parameters (see num_attention_heads)"),
    "intermediate_size": (6144, f"{_HF} only: the two dense layers at 9216 would add 47M parameters, 0.04% of "
                                "124B, below every published total's rounding"),
    "moe_intermediate_size": (768, f"{_HF}; ~94 MB of bf16 experts read per MoE layer per token (TP4 study: "
                                   "8 x 3 x 768 x 2560 x 2 B = 94.4 MB); SGLang's block-128 TP4 split error (768 / 4)"),
    "moe_shared_expert_intermediate_size": (768, f"{_HF} (shared expert as wide as a routed one: SGLang fuses it "
                                                 "as expert 513)"),
    "num_experts": (512, f"{_HF}; published: 512 routed experts (their 121B are most of the 124B total)"),
    "num_shared_experts": (1, f"{_HF}; published: + 1 shared expert"),
    "num_experts_per_tok": (8, f"{_HF}; published top-8; the ~94 MB per MoE layer per token"),
    "n_group": (8, f"{_HF} (grouped routing; no size depends on it)"),
    "topk_group": (4, f"{_HF} (grouped routing; no size depends on it)"),
    "first_k_dense_replace": (2, f"{_HF}; published: the first 2 layers dense"),
    "kv_lora_rank": (512, f"{_HF}; MLA KV 8064 B/token = 7 layers x (512 + 64) x 2 B (SGLang's Spark log: "
                          "1,912,896 tokens in 14.37 GB)"),
    "q_lora_rank": (None, f"{_HF} only (\"when unset, queries use a single projection\"): a 1536 q LoRA changes the "
                          "total by 17M parameters, below its rounding"),
    "qk_rope_head_dim": (64, f"{_HF}; the 8064 B/token MLA KV (see kv_lora_rank)"),
    "qk_nope_head_dim": (128, f"{_HF}"),
    "v_head_dim": (128, f"{_HF}"),
    "short_conv_kernel_size": (4, f"{_HF} (KDA's short convolution: the conv state per request)"),
    "no_kda_lora": (True, "transformers' modeling: KDA's f_proj and g_proj are full-rank 4096 x 2560 (SGLang's "
                          "no_kda_lora path)"),
    "num_nextn_predict_layers": (1, f"{_HF} num_mtp_layers; published: one MTP layer"),
    "max_position_embeddings": (262144, f"{_HF}; published 256K context"),
    "router_dtype": ("fp32", "transformers' BailingHybridTopkRouter keeps its weight in float32"),
}

# The documented configuration of Ling-3.0-flash, derived from the declaration above.
LING3_FLASH_CONFIG: dict[str, Any] = {
    "architectures": ["BailingMoeV3ForCausalLM"],
    "model_type": "bailing_hybrid",
    **{key: value for key, (value, _source) in LING3_FLASH_SHAPES.items()},
    "torch_dtype": "bfloat16",
}

# What SGLang 0.5.23's BailingMoeV3 code reads besides the shapes, with transformers'
# BailingHybridConfig defaults where it has them (rope_theta 6e6, rms_norm_eps 1e-6, routed
# scaling 2.5, renormalised top-k, KDA's safe gate at -5, pad/eos ids); the key set is the one
# the tiny BailingMoeV3 served on the H200 used (../shared/gpu/sglang-h200/make_tiny_v3.py).
LING3_FLASH_SERVING_KEYS: dict[str, Any] = {
    "dtype": "bfloat16", "hidden_act": "silu", "rms_norm_eps": 1e-6, "use_bias": False, "use_qkv_bias": False,
    "use_qk_norm": True, "embedding_dropout": 0.0, "attention_dropout": 0.0, "output_dropout": 0.0,
    "initializer_range": 0.02, "use_cache": True, "rope_theta": 6000000, "partial_rotary_factor": 0.5,
    "rotary_dim": 64, "rope_parameters": {"partial_rotary_factor": 0.5, "rope_theta": 6000000, "rope_type": "default"},
    "rope_interleave": True, "use_kda_lora": False, "kda_safe_gate": True, "kda_lower_bound": -5,
    "linear_silu": True, "group_norm_size": 1, "qk_head_dim": 192, "use_mla_nope": False,
    "gated_attention_proj_granularity_type": "head_wise", "norm_topk_prob": True, "score_function": "sigmoid",
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_router_enable_expert_bias": True,
    "routed_scaling_factor": 2.5, "output_router_logits": False, "expert_swiglu_limit_list": None,
    "share_expert_swiglu_limit_list": None, "mtp_loss_scaling_factor": 0, "mtp_use_kda": False,
    "tie_word_embeddings": False, "pad_token_id": 156892, "eos_token_id": 156895,
}

# Checkpoint variants, by what `stack.weights` says the checkpoint's experts hold: the hub id's
# suffix (the layouts themselves are sparkit.weight_formats.LAYOUTS).
VARIANTS = {weights: (suffix, LAYOUTS[weights].title) for weights, suffix in (("bf16", ""), ("fp8", "-fp8"), ("mxfp4", "-fp4"))}


@dataclass(frozen=True)
class DeclaredProfile:
    """A model family whose layout sparkit declares (matched by the hub id's name)."""

    family: str  # what the hub id must contain (case-insensitive), e.g. "ling-3.0-flash"
    title: str
    config: dict[str, Any]

    def matches(self, model_path: str) -> bool:
        name = model_path.rstrip("/").split("/")[-1].lower()
        return name.startswith(self.family) and not name.startswith(self.family + "-dspark")

    def tensors(self, weights: str) -> dict[str, tuple[str, tuple[int, ...]]]:
        return ling3_flash_tensors(weights, self.config)


PROFILES = (DeclaredProfile("ling-3.0-flash", "Ling-3.0-flash", LING3_FLASH_CONFIG),)


def find_profile(model_path: str) -> DeclaredProfile | None:
    return next((p for p in PROFILES if p.matches(model_path)), None)


def _linear(out: dict, name: str, rows: int, cols: int, fmt: str) -> None:
    """A linear weight [rows, cols] stored as `fmt` (sparkit.weight_formats.linear_tensors)."""
    out.update(linear_tensors(name, rows, cols, fmt))


def _kda(out: dict, p: str, c: dict, fmt: str) -> None:
    hidden, heads, head_dim = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    inner = heads * head_dim
    for proj in ("q_proj", "k_proj", "v_proj", "f_proj", "g_proj"):
        _linear(out, f"{p}.attention.{proj}", inner, hidden, fmt)
    _linear(out, f"{p}.attention.b_proj", heads, hidden, "bf16")  # 32 rows: too small to quantise
    _linear(out, f"{p}.attention.dense", hidden, inner, fmt)
    for conv in ("q_conv1d", "k_conv1d", "v_conv1d"):
        out[f"{p}.attention.{conv}.weight"] = ("BF16", (inner, 1, c["short_conv_kernel_size"]))
    out[f"{p}.attention.A_log"] = ("F32", (heads,))
    out[f"{p}.attention.dt_bias"] = ("F32", (inner,))
    out[f"{p}.attention.o_norm.weight"] = ("BF16", (head_dim,))


def _mla(out: dict, p: str, c: dict, fmt: str) -> None:
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    q_lora = c.get("q_lora_rank")
    if q_lora:  # a low-rank query (DeepSeek's q_a_proj / q_b_proj); Ling-3.0-flash has none
        _linear(out, f"{p}.attention.q_a_proj", q_lora, hidden, fmt)
        out[f"{p}.attention.q_a_layernorm.weight"] = ("BF16", (q_lora,))
        _linear(out, f"{p}.attention.q_b_proj", heads * qk, q_lora, fmt)
    else:
        _linear(out, f"{p}.attention.q_proj", heads * qk, hidden, fmt)
    _linear(out, f"{p}.attention.kv_a_proj_with_mqa", c["kv_lora_rank"] + c["qk_rope_head_dim"], hidden, fmt)
    out[f"{p}.attention.kv_a_layernorm.weight"] = ("BF16", (c["kv_lora_rank"],))
    _linear(out, f"{p}.attention.kv_b_proj", heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"], fmt)
    _linear(out, f"{p}.attention.dense", hidden, heads * c["v_head_dim"], fmt)
    _linear(out, f"{p}.attention.g_proj", heads, hidden, "bf16")  # the head-wise output gate


def _mlp(out: dict, p: str, hidden: int, inner: int, fmt: str) -> None:
    _linear(out, f"{p}.gate_proj", inner, hidden, fmt)
    _linear(out, f"{p}.up_proj", inner, hidden, fmt)
    _linear(out, f"{p}.down_proj", hidden, inner, fmt)


def _moe(out: dict, p: str, c: dict, expert_fmt: str, dense_fmt: str) -> None:
    hidden, experts = c["hidden_size"], c["num_experts"]
    out[f"{p}.mlp.gate.weight"] = ("F32", (experts, hidden))
    out[f"{p}.mlp.gate.expert_bias"] = ("F32", (experts,))
    _mlp(out, f"{p}.mlp.shared_experts", hidden, c["moe_shared_expert_intermediate_size"], dense_fmt)
    for e in range(experts):
        _mlp(out, f"{p}.mlp.experts.{e}", hidden, c["moe_intermediate_size"], expert_fmt)


def ling3_flash_tensors(weights: str, config: dict[str, Any] | None = None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (dtype, shape)} of a Ling-3.0-flash checkpoint whose experts hold `weights`
    (bf16 | fp8 | mxfp4), NextN layer included; `config` (default: the declaration) may change
    the widths and the layer count (a Ling-width model of N layers)."""
    if weights not in VARIANTS:
        raise ValueError(f"unknown Ling-3.0-flash variant {weights!r}")
    c = dict(config or LING3_FLASH_CONFIG)
    dense_fmt, expert_fmt = LAYOUTS[weights].other_linear, LAYOUTS[weights].routed_experts
    hidden = c["hidden_size"]
    out: dict[str, tuple[str, tuple[int, ...]]] = {
        "model.word_embeddings.weight": ("BF16", (c["vocab_size"], hidden)),
        "lm_head.weight": ("BF16", (c["vocab_size"], hidden)),
        "model.norm.weight": ("BF16", (hidden,)),
    }
    n = c["num_hidden_layers"]
    for i in range(n + (c.get("num_nextn_predict_layers") or 0)):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = ("BF16", (hidden,))
        out[f"{p}.post_attention_layernorm.weight"] = ("BF16", (hidden,))
        if i < n and (i + 1) % c["layer_group_size"] != 0:
            _kda(out, p, c, dense_fmt)
        else:
            _mla(out, p, c, dense_fmt)  # every 6th layer, and the NextN layer
        if i < c["first_k_dense_replace"]:
            _mlp(out, f"{p}.mlp", hidden, c["intermediate_size"], dense_fmt)
        else:
            _moe(out, p, c, expert_fmt, dense_fmt)
        if i >= n:  # the NextN layer's own projection and norms
            _linear(out, f"{p}.eh_proj", hidden, 2 * hidden, dense_fmt)
            for norm in ("enorm", "hnorm", "final_layernorm"):
                out[f"{p}.{norm}.weight"] = ("BF16", (hidden,))
    return out


def tensor_infos(tensors: dict[str, tuple[str, tuple[int, ...]]], file: str = "(declared)") -> dict[str, TensorInfo]:
    """Declared tensors as TensorInfo, sized as safetensors stores them."""
    infos = {}
    for name, (dtype, shape) in tensors.items():
        nbytes = math.ceil(math.prod(shape) * DTYPE_BITS[dtype] / 8)
        infos[name] = TensorInfo(name=name, dtype=dtype, shape=tuple(shape), nbytes=nbytes, file=file)
    return infos


def declared_layout(profile: DeclaredProfile, weights: str):
    """The declared profile's layout for the checkpoint variant `weights`."""
    suffix, layout = VARIANTS[weights]
    name = f"{profile.title}{suffix} ({layout})"
    return layout_from_tensors(
        tensor_infos(profile.tensors(weights)), profile.config, name=name, source="declared profile",
        source_detail=f"sparkit's declared profile of {name} (sparkit/roofline/profiles.py): documented shapes, "
                      "no local checkpoint read",
    )


# ----------------------------------------------------------------------------- configs and dummy checkpoints

def quantization_config(weights: str) -> dict[str, Any] | None:
    """config.json's quantization_config for a checkpoint whose experts hold `weights` (declared
    once, in sparkit.weight_formats, for the exporter and the Ling profile alike)."""
    return sglang_quantization_config(weights)


def weights_of_config(config: dict[str, Any]) -> str:
    """What a Bailing V3 config.json says its experts hold: bf16 | fp8 | mxfp4."""
    quant = config.get("quantization_config") or {}
    if not quant:
        return "bf16"
    if quant.get("quant_method") != "fp8":
        raise UnsupportedLayout(f"quantization_config.quant_method {quant.get('quant_method')!r}: sparkit declares "
                                "the bf16, -fp8 and -fp4 layouts only")
    return "mxfp4" if quant.get("routed_experts_quant_method") == "mxfp4" else "fp8"


def ling3_flash_config(weights: str = "bf16", layers: int | None = None, *, nextn: bool = True) -> dict[str, Any]:
    """A config.json SGLang 0.5.23 serves as Ling-3.0-flash (with `--load-format dummy`, no weights):
    the declaration's shapes, the keys its model code reads, and the quantization_config of
    `weights`. `layers` keeps Ling's widths with fewer layers (the first two dense, every 6th MLA)."""
    if weights not in VARIANTS:
        raise ValueError(f"unknown Ling-3.0-flash variant {weights!r}")
    config = {**LING3_FLASH_CONFIG, **LING3_FLASH_SERVING_KEYS}
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be at least 1, not {layers}")
        config["num_hidden_layers"] = layers
    config["max_window_layers"] = config["num_hidden_layers"]
    if not nextn:
        config["num_nextn_predict_layers"] = 0
    quant = quantization_config(weights)
    if quant:
        config["quantization_config"] = quant
    return config


def config_only_layout(directory: Any, *, name: str | None = None):
    """The layout of a directory with a config.json and no weight files, from its config through
    the declared generator (DataError when sparkit declares nothing for it)."""
    from pathlib import Path

    directory = Path(directory)
    config = read_config(directory)
    try:
        tensors, why = config_only_tensors(config)
    except UnsupportedLayout as exc:
        raise DataError(f"{directory}: no .safetensors files, and its config.json cannot be sized without them "
                        f"({exc})") from None
    return layout_from_tensors(tensors, config, name=name or directory.name, source="config-only checkpoint",
                               source_detail=f"{directory}: {why}")


class UnsupportedLayout(ValueError):
    """A config.json sparkit cannot size without its weight files (the message says why)."""


# What the declared generator reads from a config.json (each must be there to size it).
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
             "num_attention_heads", "head_dim", "num_experts", "first_k_dense_replace", "kv_lora_rank",
             "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "short_conv_kernel_size", "layer_group_size")


def config_only_tensors(config: dict[str, Any], file: str = "(config.json)") -> tuple[dict[str, TensorInfo], str]:
    """The tensors of a checkpoint that has a config.json and no weight files (what SGLang serves
    with `--load-format dummy`), generated from that config through Ling-3.0-flash's declared
    layout, and a sentence saying so. Raises UnsupportedLayout naming what does not fit."""
    arch = (config.get("architectures") or ["?"])[0]
    if arch != "BailingMoeV3ForCausalLM":
        raise UnsupportedLayout(f"architecture {arch}: sparkit declares a layout for BailingMoeV3ForCausalLM "
                                "(Ling-3.0) only")
    missing = [key for key in _REQUIRED if not isinstance(config.get(key), int) or isinstance(config.get(key), bool)]
    if missing:
        raise UnsupportedLayout(f"config.json has no integer {missing[0]}")
    if config.get("no_kda_lora") is False:
        raise UnsupportedLayout("no_kda_lora is false: the KDA gate LoRA is not in the declared layout")
    weights = weights_of_config(config)
    merged = {**config, "moe_shared_expert_intermediate_size": config.get("moe_shared_expert_intermediate_size")
              or config["moe_intermediate_size"]}
    tensors = tensor_infos(ling3_flash_tensors(weights, merged), file=file)
    why = (f"no .safetensors files (a config-only checkpoint, as --load-format dummy serves): the weights are "
           f"sized from config.json through sparkit's declared BailingMoeV3 layout ({VARIANTS[weights][1]}, "
           f"{config['num_hidden_layers']} layers)")
    return tensors, why


__all__ = ["LING3_FLASH_CONFIG", "LING3_FLASH_SHAPES", "LING3_FLASH_SERVING_KEYS", "DeclaredProfile", "PROFILES",
           "find_profile", "ling3_flash_tensors", "ling3_flash_config", "config_only_tensors", "config_only_layout",
           "quantization_config",
           "weights_of_config", "UnsupportedLayout", "declared_layout", "tensor_infos", "VARIANTS"]
