"""Quantised weight layouts, declared once: the numbers of the formats, which tensors each
published Ling checkpoint variant quantises, the tensors a quantised linear weight is stored as,
and the `quantization_config` SGLang 0.5.23 reads for each variant.

Used by the roofline's declared profiles (sparkit.roofline.profiles), the recipe rules, the memory
fit, the embedded engine's quantisers (sparkit.models.tiny_ling.quant) and the tiny-ling exporter
(sparkit.models.tiny_ling.hf_quantized). Importable without torch.

The formats (the published Ling-3.0-flash -fp8 and -fp4 checkpoints):
- fp8: block FP8. e4m3 values; one float32 `weight_scale_inv` per 128 x 128 block of the weight
  [N, K], shape [ceil(N/128), ceil(K/128)]: weight ~= e4m3 value x the block's weight_scale_inv
  (scale = max |block| / 448, the largest e4m3 value).
- mxfp4: OCP microscaling FP4. e2m1 values packed two per byte (element 2i in the low nibble,
  2i+1 in the high one), stored as U8 [N, K/2]; one e8m0 scale (a biased power of two) per 32
  consecutive values along K, stored as F8_E8M0 [N, K/32] under the same name `weight_scale_inv`.

Which tensors (LAYOUTS): -fp8 quantises every linear weight to block FP8; -fp4 stores the routed
experts as MXFP4 and the other linear weights as block FP8. Embeddings, the lm_head, norms and the
router stay unquantised in both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

FP8_BLOCK = 128  # block FP8: one scale per FP8_BLOCK x FP8_BLOCK block
MX_BLOCK = 32  # MXFP4: one e8m0 scale per MX_BLOCK values along the input dimension
FP8_E4M3_MAX = 448.0  # the largest finite e4m3 value
E8M0_BIAS = 127  # e8m0 code c is 2^(c - 127); 255 is NaN
E8M0_NAN = 255
SCALE_NAME = "weight_scale_inv"  # the scale's name beside `weight`, in both formats (SGLang's loader names)

WEIGHT_FORMATS = ("bf16", "fp8", "mxfp4")  # what `stack.weights` and `export-hf --weights` take
# The roles (sparkit.roofline.layout) whose linear weights the quantised variants store as
# `Layout.other_linear`; the routed experts have their own format.
OTHER_LINEAR_ROLES = ("attention", "shared_expert", "dense_mlp", "mtp_proj")


@dataclass(frozen=True)
class Layout:
    """What one checkpoint variant stores its linear weights as."""

    weights: str  # the variant's name: bf16 | fp8 | mxfp4
    routed_experts: str  # bf16 | fp8 | mxfp4
    other_linear: str  # attention, shared experts, dense MLPs, the NextN eh_proj: bf16 | fp8
    title: str

    @property
    def quantised(self) -> bool:
        return self.weights != "bf16"

    def format_of(self, role: str) -> str | None:
        """The format a linear weight of this role (sparkit.roofline.layout's roles) is stored in;
        None for what no variant quantises (embeddings, lm_head, norms, router)."""
        if role == "routed_experts":
            return self.routed_experts
        if role in OTHER_LINEAR_ROLES:
            return self.other_linear
        return None


LAYOUTS: dict[str, Layout] = {
    "bf16": Layout("bf16", "bf16", "bf16", "bf16"),
    "fp8": Layout("fp8", "fp8", "fp8", "block-128 FP8 linear weights"),
    "mxfp4": Layout("mxfp4", "mxfp4", "fp8", "MXFP4 routed experts, FP8 elsewhere"),
}


def linear_tensors(name: str, rows: int, cols: int, fmt: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors (safetensors dtype, shape) a linear weight [rows, cols] named `name` (without
    `.weight`) is stored as in `fmt`."""
    if fmt == "bf16":
        return {f"{name}.weight": ("BF16", (rows, cols))}
    if fmt == "fp8":
        return {f"{name}.weight": ("F8_E4M3", (rows, cols)),
                f"{name}.{SCALE_NAME}": ("F32", (math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK)))}
    if fmt == "mxfp4":
        return {f"{name}.weight": ("U8", (rows, cols // 2)),
                f"{name}.{SCALE_NAME}": ("F8_E8M0", (rows, cols // MX_BLOCK))}
    raise ValueError(f"unknown weight format {fmt!r} (one of {', '.join(WEIGHT_FORMATS)})")


def tiling_problem(rows: int, cols: int, fmt: str, *, expert_width: int | None = None,
                   ragged_rows: bool = False) -> str | None:
    """Why a [rows, cols] linear weight cannot be stored exactly in `fmt` (None: it can).

    Block FP8 needs both dimensions to be whole blocks (SGLang refuses an FP8 block-quant layer
    whose output partition is not a multiple of the block; a ragged input block would need
    padding a real checkpoint does not have). `ragged_rows`: the layer is one SGLang neither
    splits nor merges by partition, so its last block of rows may be ragged, as in DeepSeek's and
    Ling's published -fp8 checkpoints (MLA's kv_a_proj_with_mqa, kv_lora_rank + qk_rope_head_dim
    = 576 rows: SGLang appends it whole to a whole-block q_a_proj, so the scales line up). MXFP4 needs the input dimension in whole groups, and
    SGLang 0.5.23 reads MXFP4 experts through its block-FP8 MoE method, which checks the expert
    width (rows of gate/up, columns of down: `expert_width`, for a routed expert) against the
    block too."""
    if fmt == "fp8":
        bad = [f"{what} {n}" for what, n in (("rows", 0 if ragged_rows else rows), ("columns", cols)) if n % FP8_BLOCK]
        return f"{' and '.join(bad)} not a multiple of the FP8 block {FP8_BLOCK}" if bad else None
    if fmt == "mxfp4":
        if cols % MX_BLOCK:
            return f"columns {cols} not a multiple of the MXFP4 group {MX_BLOCK}"
        if expert_width is not None and expert_width % FP8_BLOCK:
            return (f"expert width {expert_width} not a multiple of {FP8_BLOCK} (SGLang's MoE method for "
                    f"MXFP4 experts checks it against the checkpoint's weight_block_size)")
        return None
    return None


def format_of_dtypes(dtypes: set[str] | frozenset[str]) -> str:
    """How a group of tensors (one role of a checkpoint) is stored, from their safetensors dtypes:
    mxfp4 (U8 values with F8_E8M0 scales), fp8 (F8_E4M3 values), else unquantised."""
    if "U8" in dtypes and "F8_E8M0" in dtypes:
        return "mxfp4"
    if "F8_E4M3" in dtypes:
        return "fp8"
    return "unquantised"


# The keys Fp8Config.from_config reads (quant_method, activation_scheme, weight_block_size,
# ignored_layers / modules_to_not_convert), `fmt` as published checkpoints carry it, and the key
# ModelConfig reads to mark the routed experts MXFP4 (is_fp4_experts).
def sglang_quantization_config(weights: str) -> dict[str, Any] | None:
    """The config.json `quantization_config` of a checkpoint in variant `weights` (None for bf16)."""
    layout = LAYOUTS[weights]
    if not layout.quantised:
        return None
    config: dict[str, Any] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        # The head stays bf16 in the checkpoint (sparkit's plugin quantises it online when a recipe
        # asks); SGLang never quantises embeddings, so this only says it for other readers.
        "modules_to_not_convert": ["lm_head"],
    }
    if layout.routed_experts == "mxfp4":
        config["routed_experts_quant_method"] = "mxfp4"
        config["routed_experts_group_size"] = MX_BLOCK
    return config


def weights_of_quantization_config(config: dict[str, Any] | None) -> str | None:
    """The variant a `quantization_config` describes (bf16 when there is none), None when it is
    not one of the variants above."""
    if not config:
        return "bf16"
    if config.get("quant_method") != "fp8" or list(config.get("weight_block_size") or []) != [FP8_BLOCK, FP8_BLOCK]:
        return None
    if config.get("routed_experts_quant_method") == "mxfp4":
        return "mxfp4" if int(config.get("routed_experts_group_size", MX_BLOCK)) == MX_BLOCK else None
    return "fp8"


__all__ = ["FP8_BLOCK", "MX_BLOCK", "FP8_E4M3_MAX", "E8M0_BIAS", "E8M0_NAN", "SCALE_NAME", "WEIGHT_FORMATS",
           "OTHER_LINEAR_ROLES", "Layout", "LAYOUTS", "linear_tensors", "tiling_problem", "format_of_dtypes",
           "sglang_quantization_config", "weights_of_quantization_config"]
