"""A DSpark draft's configuration, as SGLang 0.5.23 reads it from the draft checkpoint's
config.json, and the names of its tensors as SGLang's loader expects them. A leaf module (no
torch): the planner reads a draft's block size and the preflight recognises a draft with it.

Who reads which key (SGLang 0.5.23):
  - speculative/dflash_utils.py `parse_dflash_draft_config`: `num_hidden_layers`, `block_size`,
    `num_target_layers`, `target_layer_ids`, `mask_token_id` (top level or under `dflash_config`);
  - speculative/dspark_components/dspark_config.py `parse_dspark_draft_config`: `markov_rank`,
    `markov_head_type`, `mask_token_id` (under `dspark_config` or `dflash_config`, else top level);
    gamma (the drafted tokens per block) is `block_size`; `resolve_runtime_config` refuses a draft
    without `mask_token_id` or with one outside the target's vocabulary;
  - models/dspark.py `build_markov_head` (a top-level `markov_rank`, `markov_head_type`) and
    `build_confidence_head` (`enable_confidence_head`; the head reads the hidden state and the
    Markov embedding of the previous token unless `confidence_head_with_markov` is false);
  - models/dflash.py `DFlashDraftModel` / `DFlashAttention`: the Qwen3-shaped layers
    (`hidden_size`, `num_attention_heads`, `num_key_value_heads`, `head_dim`,
    `intermediate_size`, `rms_norm_eps`, `rope_theta`, `max_position_embeddings`, `hidden_act`,
    `attention_bias`); no `layer_types`, so every draft layer attends without a causal mask
    (AttentionType.ENCODER_ONLY): a block's positions see each other and the whole context;
  - arg_groups/speculative_hook.py `_handle_dspark`: `--speculative-num-draft-tokens` resolves to
    block_size + 1 (the anchor and the drafted tokens), num steps and eagle topk to 1.

The weight names (models/dflash.py `DFlashDraftModel.load_weights`, models/dspark.py
`DSparkDraftMixin.load_weights`): `layers.N.self_attn.{q,k,v,o}_proj.weight` (q/k/v are stacked
into qkv_proj on load), `layers.N.self_attn.{q,k}_norm.weight`,
`layers.N.{input,post_attention}_layernorm.weight`, `layers.N.mlp.{gate,up,down}_proj.weight`,
`fc.weight`, `hidden_norm.weight`, `norm.weight`, `markov_head.markov_w1.weight`,
`markov_head.markov_w2.weight`, `confidence_head.proj.{weight,bias}`. The embedding and the
lm_head are not stored: `attach_shared_modules` gives the draft the target's own modules (the
loader skips `embed_tokens.*` and `lm_head.*`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

ARCHITECTURE = "LingDSparkModel"  # models/dspark.py: the Ling / Bailing target family's DSpark draft
MODEL_TYPE = "qwen3"  # the draft's layers are Qwen3's; SGLang's config loader reads it as a Qwen3Config
MARKOV_HEAD_TYPES = ("vanilla",)  # what sparkit builds (SGLang also has gated and rnn)
# The block size planned for a draft whose config cannot be read (a hub draft not pulled): the TP4
# study's measured Ling-3.0-flash draft drafted blocks of 16 (accept 9.95 needs more than 8); the
# published checkpoint's config says 8.
UNKNOWN_DRAFT_BLOCK_SIZE = 16


@dataclass
class DSparkConfig:
    """A LingDSparkModel draft for a target of `hidden_size` and `vocab_size` (the draft shares
    the target's embedding and lm_head, so both must be the target's)."""

    hidden_size: int = 128
    vocab_size: int = 264
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    # 64: SGLang's CUDA RoPE kernel takes head sizes 64/128/256/512 only
    head_dim: int = 64
    intermediate_size: int = 384
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    # gamma: tokens drafted per block (the verify window is block_size + 1: the anchor and these)
    block_size: int = 8
    # the target layers whose outputs (the residual stream after the layer, before any norm) are
    # concatenated into the draft's context features, in this order
    target_layer_ids: list[int] = field(default_factory=lambda: [1, 3])
    num_target_layers: int = 4
    mask_token_id: int = 263
    markov_rank: int = 16
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    sparkit: dict = field(default_factory=dict)  # builder metadata (target, seed, training figures)

    def problems(self) -> list[str]:
        """Why SGLang (or the embedded engine) would refuse this draft (empty: none)."""
        out = []
        if self.markov_rank <= 0:
            out.append(f"markov_rank {self.markov_rank}: DSpark needs a Markov head (markov_rank > 0)")
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            out.append(f"markov_head_type {self.markov_head_type!r} is not one of {', '.join(MARKOV_HEAD_TYPES)}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            out.append(f"mask_token_id {self.mask_token_id} is outside the vocabulary (size {self.vocab_size})")
        if self.block_size < 1:
            out.append(f"block_size {self.block_size} must be >= 1")
        if not self.target_layer_ids or any(not 0 <= i < self.num_target_layers for i in self.target_layer_ids):
            out.append(f"target_layer_ids {self.target_layer_ids} must name layers of a {self.num_target_layers}-layer target")
        if self.num_attention_heads % self.num_key_value_heads:
            out.append(f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads "
                       f"{self.num_key_value_heads}")
        return out

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json as SGLang reads it (the keys of the module docstring), with sparkit's
        metadata under `sparkit` (a Qwen3Config keeps it as an attribute nobody reads)."""
        shared = {"block_size": self.block_size, "target_layer_ids": list(self.target_layer_ids),
                  "num_target_layers": self.num_target_layers, "mask_token_id": self.mask_token_id}
        markov = {"markov_rank": self.markov_rank, "markov_head_type": self.markov_head_type,
                  "mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)}
        return {
            "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "torch_dtype": "bfloat16",
            "hidden_size": self.hidden_size, "vocab_size": self.vocab_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "hidden_act": "silu", "attention_bias": False,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings, "tie_word_embeddings": False,
            **shared, "markov_rank": self.markov_rank, "markov_head_type": self.markov_head_type,
            "enable_confidence_head": self.enable_confidence_head, "confidence_head_with_markov": True,
            "dflash_config": shared, "dspark_config": markov,
            "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id, "pad_token_id": self.pad_token_id,
            "sparkit": self.sparkit,
        }

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> DSparkConfig:
        """The configuration of a draft's config.json: top-level keys, else the nested ones, as
        SGLang resolves them (KeyError/TypeError/ValueError on a config that is not a draft's)."""
        nested = {**(data.get("dflash_config") or {}), **(data.get("dspark_config") or {})}
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in {**nested, **data}.items() if k in known}
        for key in ("block_size", "mask_token_id", "target_layer_ids", "markov_rank", "markov_head_type"):
            if key in nested:
                values[key] = nested[key]
        config = cls(**values)
        config.target_layer_ids = [int(i) for i in config.target_layer_ids]
        return config

    def save(self, directory: Path) -> None:
        (Path(directory) / "config.json").write_text(json.dumps(self.to_hf_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> DSparkConfig:
        return cls.from_hf_dict(json.loads((Path(directory) / "config.json").read_text()))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_dspark_config(data: Any) -> bool:
    """Whether a parsed config.json is a DSpark draft's (its architecture)."""
    return isinstance(data, dict) and ARCHITECTURE in (data.get("architectures") or [])


def read_block_size(directory: str | Path) -> int | None:
    """The block size a draft checkpoint declares (None: no readable DSpark config there)."""
    try:
        data = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not is_dspark_config(data):
        return None
    try:
        return int(DSparkConfig.from_hf_dict(data).block_size)
    except (TypeError, ValueError):
        return None


def tensor_names(config: DSparkConfig) -> list[str]:
    """Every tensor a draft checkpoint holds, in SGLang's names (the module docstring)."""
    names = []
    for i in range(config.num_hidden_layers):
        p = f"layers.{i}"
        names += [f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight"]
        names += [f"{p}.self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")]
        names += [f"{p}.mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    names += ["fc.weight", "hidden_norm.weight", "norm.weight", "markov_head.markov_w1.weight",
              "markov_head.markov_w2.weight"]
    if config.enable_confidence_head:
        names += ["confidence_head.proj.weight", "confidence_head.proj.bias"]
    return names
