"""Checkpoint files for tests, written here independently of sparkit's reader.

`write_safetensors` writes a valid safetensors file (8-byte header length, JSON header, 8-byte
aligned data region) whose data region is left sparse: Ling-3.0-flash's 66,000 tensors cost a few
megabytes of header and no disk for the weights.

`ling3_flash_fp4_tensors` spells out the tensor inventory of inclusionAI/Ling-3.0-flash-fp4 with
the literal shapes of its documented configuration (hidden 2560, 42 layers of which every 6th is
MLA and the others KDA, 32 heads of 128, 512 experts of width 768 with top-8, two dense layers
of width 6144, MLA kv_lora_rank 512 / rope 64 / nope 128 / v 128, one NextN layer stored as
layer 42), in the -fp4 layout: routed experts MXFP4 (U8 [out, in/2] + F8_E8M0 [out, in/32]),
other linear weights block-128 FP8 (F8_E4M3 + F32 weight_scale_inv), the rest BF16 / F32.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

BITS = {"BF16": 16, "F16": 16, "F32": 32, "F8_E4M3": 8, "F8_E8M0": 8, "U8": 8, "I64": 64}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], *, pad_to: int = 8) -> None:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.ceil(math.prod(shape) * BITS[dtype] / 8)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % pad_to)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        handle.truncate(8 + len(raw) + offset)


def write_sharded(directory: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], shards: int) -> None:
    """Split `tensors` over `shards` files named like Hugging Face's, with the index file."""
    directory.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    per = math.ceil(len(names) / shards)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per:(s + 1) * per]}
        write_safetensors(directory / file, part)
        weight_map.update({n: file for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


LING3_CONFIG = {
    "architectures": ["BailingMoeV3ForCausalLM"], "model_type": "bailing_hybrid", "vocab_size": 157184,
    "hidden_size": 2560, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "moe_shared_expert_intermediate_size": 768, "num_hidden_layers": 42, "num_attention_heads": 32,
    "num_key_value_heads": 32, "head_dim": 128, "num_experts": 512, "num_experts_per_tok": 8,
    "first_k_dense_replace": 2, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128, "v_head_dim": 128, "short_conv_kernel_size": 4, "layer_group_size": 6,
    "num_nextn_predict_layers": 1, "max_position_embeddings": 262144,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "routed_experts_quant_method": "mxfp4"},
}


def _fp8(out: dict, name: str, rows: int, cols: int) -> None:
    out[name + ".weight"] = ("F8_E4M3", (rows, cols))
    out[name + ".weight_scale_inv"] = ("F32", (-(-rows // 128), -(-cols // 128)))


def ling3_flash_fp4_tensors() -> dict[str, tuple[str, tuple[int, ...]]]:
    t: dict[str, tuple[str, tuple[int, ...]]] = {
        "model.word_embeddings.weight": ("BF16", (157184, 2560)),
        "lm_head.weight": ("BF16", (157184, 2560)),
        "model.norm.weight": ("BF16", (2560,)),
    }
    for i in range(43):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = ("BF16", (2560,))
        t[f"{p}.post_attention_layernorm.weight"] = ("BF16", (2560,))
        if i < 42 and i % 6 != 5:  # KDA
            for proj in ("q_proj", "k_proj", "v_proj", "f_proj", "g_proj"):
                _fp8(t, f"{p}.attention.{proj}", 4096, 2560)
            _fp8(t, f"{p}.attention.dense", 2560, 4096)
            t[f"{p}.attention.b_proj.weight"] = ("BF16", (32, 2560))
            for conv in ("q_conv1d", "k_conv1d", "v_conv1d"):
                t[f"{p}.attention.{conv}.weight"] = ("BF16", (4096, 1, 4))
            t[f"{p}.attention.A_log"] = ("F32", (32,))
            t[f"{p}.attention.dt_bias"] = ("F32", (4096,))
            t[f"{p}.attention.o_norm.weight"] = ("BF16", (128,))
        else:  # MLA (layers 5, 11, ..., 41 and the NextN layer 42)
            _fp8(t, f"{p}.attention.q_proj", 6144, 2560)
            _fp8(t, f"{p}.attention.kv_a_proj_with_mqa", 576, 2560)
            t[f"{p}.attention.kv_a_layernorm.weight"] = ("BF16", (512,))
            _fp8(t, f"{p}.attention.kv_b_proj", 8192, 512)
            _fp8(t, f"{p}.attention.dense", 2560, 4096)
            t[f"{p}.attention.g_proj.weight"] = ("BF16", (32, 2560))
        if i < 2:
            _fp8(t, f"{p}.mlp.gate_proj", 6144, 2560)
            _fp8(t, f"{p}.mlp.up_proj", 6144, 2560)
            _fp8(t, f"{p}.mlp.down_proj", 2560, 6144)
        else:
            t[f"{p}.mlp.gate.weight"] = ("F32", (512, 2560))
            t[f"{p}.mlp.gate.expert_bias"] = ("F32", (512,))
            _fp8(t, f"{p}.mlp.shared_experts.gate_proj", 768, 2560)
            _fp8(t, f"{p}.mlp.shared_experts.up_proj", 768, 2560)
            _fp8(t, f"{p}.mlp.shared_experts.down_proj", 2560, 768)
            for e in range(512):
                q = f"{p}.mlp.experts.{e}"
                for proj, rows, cols in (("gate_proj", 768, 2560), ("up_proj", 768, 2560), ("down_proj", 2560, 768)):
                    t[f"{q}.{proj}.weight"] = ("U8", (rows, cols // 2))
                    t[f"{q}.{proj}.weight_scale_inv"] = ("F8_E8M0", (rows, cols // 32))
        if i == 42:
            _fp8(t, f"{p}.eh_proj", 2560, 5120)
            for norm in ("enorm", "hnorm", "final_layernorm"):
                t[f"{p}.{norm}.weight"] = ("BF16", (2560,))
            t[f"{p}.shared_head.head.weight"] = ("BF16", (157184, 2560))  # the target's head, shared
    return t


def write_ling3_flash_fp4(directory: Path, shards: int = 6) -> Path:
    write_sharded(directory, ling3_flash_fp4_tensors(), shards)
    (directory / "config.json").write_text(json.dumps(LING3_CONFIG))
    return directory
