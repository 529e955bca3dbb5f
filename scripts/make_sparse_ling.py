#!/usr/bin/env python3
"""Write a sparse Ling-3.0-flash checkpoint: config.json, the safetensors index and shard files
whose headers hold every tensor's name, dtype and shape, and whose data is a hole (no disk used,
no weights). sparkit's memory fit reads only headers, so a recipe pointed at this directory
(`--set model.path=DIR`) shows the real arithmetic on a machine without the 65-250 GB download.

    scripts/make_sparse_ling.py DIR [--variant fp4|bf16]

Shapes: what sglang-facts.md section 6 and the two source studies publish (42 layers, 35 KDA
+ 7 MLA, hidden 2560, vocab 157184, 512 routed experts top-8 + 1 shared, moe_intermediate_size
768, 2 dense layers, one NextN layer, 256K context). Not published, assumed here: 32 attention
heads of 128, q_lora_rank 1536, kv_lora_rank 512 (qk_rope 64, qk_nope 128, v 128), dense
intermediate 9216, KDA gate rank 128. Tensor names follow sglang 0.5.23's BailingMoeV3 loader
(models/bailing_moe_v3.py, bailing_moe_nextn.py). The fp4 variant is the -fp4 layout: routed
experts MXFP4 (U8 e2m1 pairs + U8 e8m0 scales per 32), other matrices FP8 e4m3 with float32
128x128 block scales, embeddings, lm_head, norms and the router bf16. These give 124B
parameters (127B with the NextN layer), a -fp4 checkpoint of 69.6 GB and bf16 of 254 GB (63.5
GB per TP4 rank, as the TP4 study reports).
"""

from __future__ import annotations

import argparse
import json
import math
import struct
from pathlib import Path

LING = dict(vocab=157184, hidden=2560, layers=42, layer_group_size=6, heads=32, head_dim=128, experts=512,
            top_k=8, moe_inter=768, dense_inter=9216, first_dense=2, nextn=1, q_lora=1536, kv_lora=512,
            rope=64, nope=128, v_head=128, gate_rank=128, conv=4, context=262144)
SHARD_BYTES = 5 * 10**9
BLOCK = 128


def config(variant: str) -> dict:
    c = LING
    cfg = {
        "architectures": ["BailingMoeV3ForCausalLM"], "model_type": "bailing_hybrid", "torch_dtype": "bfloat16",
        "vocab_size": c["vocab"], "hidden_size": c["hidden"], "intermediate_size": c["dense_inter"],
        "num_hidden_layers": c["layers"], "layer_group_size": c["layer_group_size"],
        "num_attention_heads": c["heads"], "num_key_value_heads": c["heads"], "head_dim": c["head_dim"],
        "max_position_embeddings": c["context"], "rope_theta": 6000000, "rms_norm_eps": 1e-6,
        "short_conv_kernel_size": c["conv"], "no_kda_lora": False, "kda_safe_gate": True, "kda_lower_bound": -5,
        "q_lora_rank": c["q_lora"], "kv_lora_rank": c["kv_lora"], "qk_nope_head_dim": c["nope"],
        "qk_rope_head_dim": c["rope"], "v_head_dim": c["v_head"], "gated_attention_proj_granularity_type": "head_wise",
        "first_k_dense_replace": c["first_dense"], "num_experts": c["experts"], "num_experts_per_tok": c["top_k"],
        "num_shared_experts": 1, "moe_intermediate_size": c["moe_inter"],
        "moe_shared_expert_intermediate_size": c["moe_inter"], "n_group": 8, "topk_group": 4,
        "score_function": "sigmoid", "moe_router_enable_expert_bias": True, "routed_scaling_factor": 2.5,
        "num_nextn_predict_layers": c["nextn"], "tie_word_embeddings": False,
    }
    if variant == "fp4":
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [BLOCK, BLOCK], "routed_experts_quant_method": "mxfp4"}
    return cfg


def tensors(variant: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, safetensors dtype, shape) of every tensor, in checkpoint order."""
    c = LING
    h, heads, hd = c["hidden"], c["heads"], c["head_dim"]
    out: list[tuple[str, str, tuple[int, ...]]] = []

    def matrix(name: str, rows: int, cols: int) -> None:  # a dense matrix: FP8 + block scales, or bf16
        if variant == "fp4":
            out.append((name + ".weight", "F8_E4M3", (rows, cols)))
            out.append((name + ".weight_scale_inv", "F32", (math.ceil(rows / BLOCK), math.ceil(cols / BLOCK))))
        else:
            out.append((name + ".weight", "BF16", (rows, cols)))

    def expert(name: str, rows: int, cols: int) -> None:  # a routed expert's matrix: MXFP4, or bf16
        if variant == "fp4":
            out.append((name + ".weight", "U8", (rows, cols // 2)))
            out.append((name + ".weight_scale", "U8", (rows, cols // 32)))
        else:
            out.append((name + ".weight", "BF16", (rows, cols)))

    def vector(name: str, n: int, dtype: str = "BF16") -> None:
        out.append((name, dtype, (n,)))

    def mla(p: str) -> None:
        matrix(p + "attention.q_a_proj", c["q_lora"], h)
        vector(p + "attention.q_a_layernorm.weight", c["q_lora"])
        matrix(p + "attention.q_b_proj", heads * (c["nope"] + c["rope"]), c["q_lora"])
        matrix(p + "attention.kv_a_proj_with_mqa", c["kv_lora"] + c["rope"], h)
        vector(p + "attention.kv_a_layernorm.weight", c["kv_lora"])
        matrix(p + "attention.kv_b_proj", heads * (c["nope"] + c["v_head"]), c["kv_lora"])
        matrix(p + "attention.dense", h, heads * c["v_head"])
        out.append((p + "attention.g_proj.weight", "BF16", (heads, h)))

    def kda(p: str) -> None:
        for proj in ("q_proj", "k_proj", "v_proj"):
            matrix(p + f"attention.{proj}", heads * hd, h)
        matrix(p + "attention.o_proj", h, heads * hd)
        out.append((p + "attention.b_proj.weight", "BF16", (heads, h)))
        for gate in ("f", "g"):
            out.append((p + f"attention.{gate}_a_proj.weight", "BF16", (c["gate_rank"], h)))
            out.append((p + f"attention.{gate}_b_proj.weight", "BF16", (heads * hd, c["gate_rank"])))
        for conv in ("q_conv1d", "k_conv1d", "v_conv1d"):
            out.append((p + f"attention.{conv}.weight", "BF16", (heads * hd, 1, c["conv"])))
        vector(p + "attention.A_log", heads, "F32")
        vector(p + "attention.dt_bias", heads * hd, "F32")
        vector(p + "attention.o_norm.weight", hd)

    def moe(p: str) -> None:
        out.append((p + "mlp.gate.weight", "BF16", (c["experts"], h)))
        vector(p + "mlp.gate.expert_bias", c["experts"], "F32")
        matrix(p + "mlp.shared_experts.gate_proj", c["moe_inter"], h)
        matrix(p + "mlp.shared_experts.up_proj", c["moe_inter"], h)
        matrix(p + "mlp.shared_experts.down_proj", h, c["moe_inter"])
        for e in range(c["experts"]):
            expert(p + f"mlp.experts.{e}.gate_proj", c["moe_inter"], h)
            expert(p + f"mlp.experts.{e}.up_proj", c["moe_inter"], h)
            expert(p + f"mlp.experts.{e}.down_proj", h, c["moe_inter"])

    out.append(("model.word_embeddings.weight", "BF16", (c["vocab"], h)))
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        vector(p + "input_layernorm.weight", h)
        vector(p + "post_attention_layernorm.weight", h)
        (mla if (i + 1) % c["layer_group_size"] == 0 else kda)(p)
        if i < c["first_dense"]:
            matrix(p + "mlp.gate_proj", c["dense_inter"], h)
            matrix(p + "mlp.up_proj", c["dense_inter"], h)
            matrix(p + "mlp.down_proj", h, c["dense_inter"])
        else:
            moe(p)
    for j in range(c["nextn"]):  # the NextN layer: numbered after the body (bailing_moe_nextn.py)
        p = f"model.layers.{c['layers'] + j}."
        for norm in ("enorm", "hnorm", "final_layernorm", "input_layernorm", "post_attention_layernorm"):
            vector(p + norm + ".weight", h)
        matrix(p + "eh_proj", h, 2 * h)
        mla(p)
        moe(p)
    vector("model.norm.weight", h)
    out.append(("lm_head.weight", "BF16", (c["vocab"], h)))
    return out


_BITS = {"BF16": 16, "F32": 32, "F8_E4M3": 8, "U8": 8}


def nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * _BITS[dtype] // 8


def write_checkpoint(directory: Path, variant: str = "fp4") -> Path:
    """Write the sparse checkpoint into `directory`; returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shards: list[list[tuple[str, str, tuple[int, ...]]]] = [[]]
    size = 0
    for entry in tensors(variant):
        n = nbytes(entry[1], entry[2])
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += n
    weight_map, total = {}, 0
    for k, shard in enumerate(shards, 1):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for tname, dtype, shape in shard:
            n = nbytes(dtype, shape)
            header[tname] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[tname] = name
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
        with open(directory / name, "wb") as handle:
            handle.write(struct.pack("<Q", len(raw)))
            handle.write(raw)
            handle.truncate(8 + len(raw) + offset)  # the data: a hole
        total += offset
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (directory / "config.json").write_text(json.dumps(config(variant), indent=1))
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--variant", choices=("fp4", "bf16"), default="fp4")
    args = parser.parse_args()
    write_checkpoint(args.directory, args.variant)
    print(f"wrote {args.directory} ({args.variant}: {sum(nbytes(d, s) for _, d, s in tensors(args.variant)) / 1e9:.1f} GB "
          "of headers over holes)")


if __name__ == "__main__":
    main()
