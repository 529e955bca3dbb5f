"""Declared layouts: what a decode step reads for models whose checkpoints are not on this machine.

The shipped Ling recipes name hub ids. Without a local copy of the checkpoint, the roofline is
computed from a *declared* tensor inventory: every tensor name, dtype and shape of the checkpoint,
generated from the model's documented configuration, then classified exactly like real headers
(sparkit.roofline.layout). A local checkpoint (a directory, or the hub id in the Hugging Face
cache) always wins over a declared profile.

Ling-3.0-flash, as declared here. Sources: transformers' BailingHybridConfig (its defaults are
the `inclusionAI/Ling-3.0-Flash` checkpoint's: hidden 2560, 42 layers, 32 heads, vocab 157184,
512 experts top-8 in 8 groups (4 used), moe_intermediate_size 768, dense intermediate 6144,
first 2 layers dense, MLA kv_lora_rank 512 with qk_rope 64 / qk_nope 128 / v 128 and no q LoRA,
KDA head_dim 128 with a kernel-4 short convolution, a 6-layer group whose last layer is MLA),
its modeling code and checkpoint renames (`attention.{q,k,v,f,g,b}_proj`, `{q,k,v}_conv1d`,
`A_log`, `dt_bias`, `dense`; MLA `q_proj`, `kv_a_proj_with_mqa`, `kv_b_proj`, head-wise `g_proj`;
per-expert `mlp.experts.E.{gate,up,down}_proj`, `mlp.shared_experts.*`), SGLang 0.5.23's loader
(one NextN layer stored as layer 42: `eh_proj`, `enorm`, `hnorm`, `final_layernorm`, an MLA
attention and a MoE; the router in fp32 unless the config says otherwise), and the published
quantisation layouts (-fp8: block-128 FP8 linear weights with float32 `weight_scale_inv`; -fp4:
MXFP4 routed experts, e2m1 packed two per byte with one e8m0 scale per 32 values, FP8
elsewhere; embeddings, lm_head, norms and routers unquantised).

Cross-checks (sparkit/roofline tests and docs/roofline.md): 124B parameters in the target layers
(the published total), 5.1B active per token excluding the embedding (published: 5.1B), the
bf16 checkpoint at 255 GB with the NextN layer, the -fp4 target weights at 64.0 GiB (SGLang's
load log on a DGX Spark: "mem usage=64.88 GB"), MLA KV at 8064 bytes per token (the same log:
1,912,896 tokens in 14.37 GB), 94 MB of bf16 experts per MoE layer per token (the TP4 study:
"each MoE layer reads ~94 MB of activated expert weights per step") and a 2.6 MB bf16 router.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sparkit.checkpoint import DTYPE_BITS, TensorInfo
from sparkit.weight_formats import LAYOUTS, linear_tensors

# The documented configuration of Ling-3.0-flash (see the module docstring for the sources).
LING3_FLASH_CONFIG: dict[str, Any] = {
    "architectures": ["BailingMoeV3ForCausalLM"],
    "model_type": "bailing_hybrid",
    "vocab_size": 157184,
    "hidden_size": 2560,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "moe_shared_expert_intermediate_size": 768,
    "num_hidden_layers": 42,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "num_experts": 512,
    "num_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "first_k_dense_replace": 2,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "short_conv_kernel_size": 4,
    "no_kda_lora": True,
    "layer_group_size": 6,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 262144,
    "router_dtype": "fp32",
    "torch_dtype": "bfloat16",
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
    (bf16 | fp8 | mxfp4), NextN layer included."""
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
    for i in range(n + c["num_nextn_predict_layers"]):
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
    from sparkit.roofline.layout import layout_from_tensors

    suffix, layout = VARIANTS[weights]
    name = f"{profile.title}{suffix} ({layout})"
    return layout_from_tensors(
        tensor_infos(profile.tensors(weights)), profile.config, name=name, source="declared profile",
        source_detail=f"sparkit's declared profile of {name} (sparkit/roofline/profiles.py): documented shapes, "
                      "no local checkpoint read",
    )


__all__ = ["LING3_FLASH_CONFIG", "DeclaredProfile", "PROFILES", "find_profile", "ling3_flash_tensors",
           "declared_layout", "tensor_infos", "VARIANTS"]
