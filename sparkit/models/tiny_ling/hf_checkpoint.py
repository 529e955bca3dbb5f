"""tiny-ling in the Hugging Face BailingMoeV2 format: what stock SGLang loads with its own model
code (sglang/srt/models/bailing_moe.py and bailing_moe_nextn.py), and back. Pure format: config
dicts, tensor names, the configuration class's source; the files are written and read by
sparkit.models.checkpoint.

BailingMoeV2 is the closest architecture SGLang 0.5.23 has to Ling-3.0's MoE + shared expert +
NextN layout with ordinary attention. tiny-ling computes exactly its function for the config
written here (see sparkit.models.tiny_ling.model), so the export is a renaming of tensors:

    sparkit (model.safetensors)                 Hugging Face / SGLang
    embed_tokens                                model.word_embeddings
    layers.i.self_attn.qkv_proj [q; k; v]       model.layers.i.attention.query_key_value
    layers.i.self_attn.o_proj                   model.layers.i.attention.dense
    layers.i.mlp.gate                           model.layers.i.mlp.gate
    layers.i.mlp.w_gate_up [E, 2I, H]           model.layers.i.mlp.experts.e.{gate_proj, up_proj}
    layers.i.mlp.w_down [E, H, I]               model.layers.i.mlp.experts.e.down_proj
    layers.i.mlp.shared_expert.gate_up_proj     model.layers.i.mlp.shared_experts.{gate_proj, up_proj}
    layers.i.mlp.shared_expert.down_proj        model.layers.i.mlp.shared_experts.down_proj
    norm, lm_head                               model.norm, lm_head
    mtp.{enorm, hnorm, eh_proj}                 model.layers.L.{enorm, hnorm, eh_proj}   (L = num layers)
    mtp.shared_head_norm                        model.layers.L.final_layernorm
    mtp.decoder.*                               model.layers.L.* (as a decoder layer)

The config is BailingMoeV2's keys at the values tiny-ling implements (no q/k norm, full-width
NeoX RoPE, softmax top-k routing renormalised, no expert bias, routed scaling 1, one shared
expert, no dense layers, no tied embeddings); SGLang reads it through a configuration class
written into the export (`--trust-remote-code`), as real Ling checkpoints ship theirs. Reading
an HF config back, any key at a value tiny-ling does not implement is an error naming the key.
"""

from __future__ import annotations

from sparkit.models.formats import ARCHITECTURES

HF_ARCHITECTURE = ARCHITECTURES["tiny-ling"][1]

HF_MODEL_TYPE = "bailing_moe"
CONFIG_MODULE = "configuration_bailing_moe_v2"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
DTYPES = ("bfloat16", "float32")

# The configuration class SGLang instantiates for the export (AutoConfig via auto_map).
CONFIG_SOURCE = '''"""BailingMoeV2 configuration for sparkit's tiny-ling export (written by sparkit)."""
from transformers.configuration_utils import PretrainedConfig


class BailingMoeV2Config(PretrainedConfig):
    model_type = "bailing_moe"

    def __init__(self, pad_token_id=None, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False, **kwargs):
        rope_theta = kwargs.pop("rope_theta", 10000.0)
        rope_parameters = kwargs.pop("rope_parameters", None) or {"rope_type": "default", "rope_theta": rope_theta}
        known = {k: kwargs.pop(k) for k in list(kwargs) if k in _KEYS}
        for key, value in {**_DEFAULTS, **known}.items():
            setattr(self, key, value)
        self.rope_theta = rope_parameters.get("rope_theta", rope_theta)
        self.rope_parameters = rope_parameters
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)


_DEFAULTS = {
    "vocab_size": 264, "hidden_size": 128, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64, "hidden_act": "silu",
    "use_qkv_bias": False, "use_bias": False, "use_qk_norm": False, "rms_norm_eps": 1e-6,
    "embedding_dropout": 0.0, "max_position_embeddings": 2048, "num_experts": 8,
    "num_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 0, "topk_group": 0,
    "moe_intermediate_size": 128, "moe_shared_expert_intermediate_size": 128,
    "first_k_dense_replace": 0, "norm_topk_prob": True, "score_function": "softmax",
    "moe_router_enable_expert_bias": False, "routed_scaling_factor": 1.0, "router_dtype": "fp32",
    "num_nextn_predict_layers": 1, "norm_head": False, "output_router_logits": False,
}
_KEYS = set(_DEFAULTS)
'''

# Keys whose value tiny-ling fixes: (key, required value, what differs otherwise).
_FIXED = (
    ("hidden_act", "silu", "the activation"),
    ("use_qk_norm", False, "q/k RMSNorms"),
    ("use_bias", False, "biases in the linear layers"),
    ("use_qkv_bias", False, "a QKV bias"),
    ("first_k_dense_replace", 0, "dense (non-MoE) first layers"),
    ("norm_topk_prob", True, "renormalising the top-k routing weights"),
    ("moe_router_enable_expert_bias", False, "an expert bias (sigmoid routing)"),
    ("routed_scaling_factor", 1.0, "scaling the routed experts' output"),
    ("num_shared_experts", 1, "the number of shared experts"),
    ("num_nextn_predict_layers", 1, "the number of NextN layers"),
    ("tie_word_embeddings", False, "an lm_head tied to the embedding"),
    ("norm_head", False, "a normalised lm_head"),
)


def hf_config(cfg) -> dict:
    """The config.json of the export, from a TinyLingConfig."""
    return {
        "architectures": [HF_ARCHITECTURE],
        "model_type": HF_MODEL_TYPE,
        "auto_map": {"AutoConfig": f"{CONFIG_MODULE}.BailingMoeV2Config"},
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.moe_intermediate_size,  # dense layers: none (first_k_dense_replace 0)
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "use_qkv_bias": False,
        "use_bias": False,
        "use_qk_norm": False,
        "rms_norm_eps": cfg.rms_norm_eps,
        "embedding_dropout": 0.0,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "num_experts": cfg.num_experts,
        "num_shared_experts": 1,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "n_group": 0,
        "topk_group": 0,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "moe_shared_expert_intermediate_size": cfg.shared_expert_intermediate_size,
        "first_k_dense_replace": 0,
        "norm_topk_prob": True,
        "score_function": "softmax",
        "moe_router_enable_expert_bias": False,
        "routed_scaling_factor": 1.0,
        "router_dtype": "fp32",
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
        "norm_head": False,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "torch_dtype": "bfloat16",
    }


def config_from_hf(raw: dict):
    """A TinyLingConfig from an HF BailingMoeV2 config; ValueError naming the first key whose
    value tiny-ling does not implement."""
    from sparkit.models.tiny_ling.model import TinyLingConfig

    for key, want, meaning in _FIXED:
        if key in raw and raw[key] != want:
            raise ValueError(f"config key {key}={raw[key]!r}: tiny-ling implements BailingMoeV2 with {key}={want!r} "
                             f"({meaning} is not supported)")
    if raw.get("score_function") not in (None, "softmax"):
        raise ValueError(f"config key score_function={raw['score_function']!r}: only softmax routing is supported")
    for key in ("n_group", "topk_group"):
        if raw.get(key):
            raise ValueError(f"config key {key}={raw[key]!r}: grouped top-k routing is not supported")
    if raw.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"config key partial_rotary_factor={raw['partial_rotary_factor']!r}: only full-width RoPE is supported")
    heads = raw["num_attention_heads"]
    if raw.get("num_key_value_heads", heads) != heads:
        raise ValueError(f"config key num_key_value_heads={raw['num_key_value_heads']!r}: grouped-query attention "
                         f"is not supported (num_attention_heads={heads})")
    rope = raw.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"config key rope_parameters.rope_type={rope.get('rope_type')!r}: only default RoPE is supported")
    try:
        return TinyLingConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=int(heads),
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
            num_experts=int(raw["num_experts"]),
            num_experts_per_tok=int(raw["num_experts_per_tok"]),
            moe_intermediate_size=int(raw["moe_intermediate_size"]),
            shared_expert_intermediate_size=int(raw.get("moe_shared_expert_intermediate_size") or raw["moe_intermediate_size"]),
            num_nextn_predict_layers=1,
            max_position_embeddings=int(raw["max_position_embeddings"]),
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=raw.get("eos_token_id"),
            pad_token_id=raw.get("pad_token_id"),
            torch_dtype=str(raw.get("torch_dtype", "bfloat16")),
            sparkit=dict(raw.get("sparkit") or {}),
        )
    except KeyError as exc:
        raise ValueError(f"config key {exc.args[0]} is missing") from None


def _layer_to_hf(prefix_in: str, prefix_out: str, state: dict, out: dict, cfg) -> None:
    inter = cfg.moe_intermediate_size
    out[f"{prefix_out}.input_layernorm.weight"] = state[f"{prefix_in}.input_layernorm.weight"]
    out[f"{prefix_out}.post_attention_layernorm.weight"] = state[f"{prefix_in}.post_attention_layernorm.weight"]
    out[f"{prefix_out}.attention.query_key_value.weight"] = state[f"{prefix_in}.self_attn.qkv_proj.weight"]
    out[f"{prefix_out}.attention.dense.weight"] = state[f"{prefix_in}.self_attn.o_proj.weight"]
    out[f"{prefix_out}.mlp.gate.weight"] = state[f"{prefix_in}.mlp.gate.weight"]
    gate_up, down = state[f"{prefix_in}.mlp.w_gate_up"], state[f"{prefix_in}.mlp.w_down"]
    for e in range(cfg.num_experts):
        out[f"{prefix_out}.mlp.experts.{e}.gate_proj.weight"] = gate_up[e, :inter]
        out[f"{prefix_out}.mlp.experts.{e}.up_proj.weight"] = gate_up[e, inter:]
        out[f"{prefix_out}.mlp.experts.{e}.down_proj.weight"] = down[e]
    shared = state[f"{prefix_in}.mlp.shared_expert.gate_up_proj.weight"]
    half = shared.shape[0] // 2
    out[f"{prefix_out}.mlp.shared_experts.gate_proj.weight"] = shared[:half]
    out[f"{prefix_out}.mlp.shared_experts.up_proj.weight"] = shared[half:]
    out[f"{prefix_out}.mlp.shared_experts.down_proj.weight"] = state[f"{prefix_in}.mlp.shared_expert.down_proj.weight"]


def _layer_from_hf(prefix_hf: str, prefix_out: str, hf: dict, out: dict, cfg) -> None:
    import torch

    out[f"{prefix_out}.input_layernorm.weight"] = hf[f"{prefix_hf}.input_layernorm.weight"]
    out[f"{prefix_out}.post_attention_layernorm.weight"] = hf[f"{prefix_hf}.post_attention_layernorm.weight"]
    out[f"{prefix_out}.self_attn.qkv_proj.weight"] = hf[f"{prefix_hf}.attention.query_key_value.weight"]
    out[f"{prefix_out}.self_attn.o_proj.weight"] = hf[f"{prefix_hf}.attention.dense.weight"]
    out[f"{prefix_out}.mlp.gate.weight"] = hf[f"{prefix_hf}.mlp.gate.weight"]
    experts = range(cfg.num_experts)
    out[f"{prefix_out}.mlp.w_gate_up"] = torch.stack([
        torch.cat((hf[f"{prefix_hf}.mlp.experts.{e}.gate_proj.weight"], hf[f"{prefix_hf}.mlp.experts.{e}.up_proj.weight"]))
        for e in experts])
    out[f"{prefix_out}.mlp.w_down"] = torch.stack([hf[f"{prefix_hf}.mlp.experts.{e}.down_proj.weight"] for e in experts])
    out[f"{prefix_out}.mlp.shared_expert.gate_up_proj.weight"] = torch.cat(
        (hf[f"{prefix_hf}.mlp.shared_experts.gate_proj.weight"], hf[f"{prefix_hf}.mlp.shared_experts.up_proj.weight"]))
    out[f"{prefix_out}.mlp.shared_expert.down_proj.weight"] = hf[f"{prefix_hf}.mlp.shared_experts.down_proj.weight"]


# The NextN layer's own tensors beside its decoder layer: sparkit's `mtp.<name>` -> HF's
# `model.layers.<N>.<name>` (SGLang's BailingMoeForCausalLMNextN calls the head norm final_layernorm).
NEXTN_OWN_TENSORS = (("enorm", "enorm"), ("hnorm", "hnorm"), ("eh_proj", "eh_proj"), ("shared_head_norm", "final_layernorm"))


def state_dict_to_hf(state: dict, cfg) -> dict:
    """sparkit tensor names -> the HF BailingMoeV2 names (views of the same tensors)."""
    out = {"model.word_embeddings.weight": state["embed_tokens.weight"],
           "model.norm.weight": state["norm.weight"], "lm_head.weight": state["lm_head.weight"]}
    for i in range(cfg.num_hidden_layers):
        _layer_to_hf(f"layers.{i}", f"model.layers.{i}", state, out, cfg)
    nextn = f"model.layers.{cfg.num_hidden_layers}"
    for mine, theirs in NEXTN_OWN_TENSORS:
        out[f"{nextn}.{theirs}.weight"] = state[f"mtp.{mine}.weight"]
    _layer_to_hf("mtp.decoder", nextn, state, out, cfg)
    return out


def state_dict_from_hf(hf: dict, cfg) -> dict:
    """The inverse of state_dict_to_hf (KeyError names a missing HF tensor)."""
    out = {"embed_tokens.weight": hf["model.word_embeddings.weight"],
           "norm.weight": hf["model.norm.weight"], "lm_head.weight": hf["lm_head.weight"]}
    for i in range(cfg.num_hidden_layers):
        _layer_from_hf(f"model.layers.{i}", f"layers.{i}", hf, out, cfg)
    nextn = f"model.layers.{cfg.num_hidden_layers}"
    for mine, theirs in NEXTN_OWN_TENSORS:
        out[f"mtp.{mine}.weight"] = hf[f"{nextn}.{theirs}.weight"]
    _layer_from_hf(nextn, "mtp.decoder", hf, out, cfg)
    return out


def hf_tensor_inventory(cfg, weights: str = "bf16", dtype: str = "BF16") -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (safetensors dtype, shape)} of the export of a model of config `cfg` in the weights
    layout `weights` (sparkit.weight_formats.LAYOUTS), its unquantised tensors in `dtype` (BF16 or
    F32): what state_dict_to_hf writes, then sparkit.models.tiny_ling.hf_quantized quantises, known
    before anything is written (the recipe rules, the roofline, and the exporter's own check)."""
    from sparkit.weight_formats import LAYOUTS, linear_tensors

    layout = LAYOUTS[weights]
    hidden, inter, shared = cfg.hidden_size, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    attn = cfg.num_attention_heads * cfg.head_dim
    out: dict[str, tuple[str, tuple[int, ...]]] = {}

    def plain(name: str, *shape: int) -> None:
        out[name] = (dtype, tuple(shape))

    def linear(name: str, rows: int, cols: int, fmt: str) -> None:
        if fmt == "bf16":
            plain(f"{name}.weight", rows, cols)
        else:
            out.update(linear_tensors(name, rows, cols, fmt))

    plain("model.word_embeddings.weight", cfg.vocab_size, hidden)
    plain("model.norm.weight", hidden)
    plain("lm_head.weight", cfg.vocab_size, hidden)
    for i in range(cfg.num_hidden_layers + 1):  # the NextN layer is layer num_hidden_layers
        p = f"model.layers.{i}"
        plain(f"{p}.input_layernorm.weight", hidden)
        plain(f"{p}.post_attention_layernorm.weight", hidden)
        linear(f"{p}.attention.query_key_value", 3 * attn, hidden, layout.other_linear)
        linear(f"{p}.attention.dense", hidden, attn, layout.other_linear)
        plain(f"{p}.mlp.gate.weight", cfg.num_experts, hidden)
        for e in range(cfg.num_experts):
            linear(f"{p}.mlp.experts.{e}.gate_proj", inter, hidden, layout.routed_experts)
            linear(f"{p}.mlp.experts.{e}.up_proj", inter, hidden, layout.routed_experts)
            linear(f"{p}.mlp.experts.{e}.down_proj", hidden, inter, layout.routed_experts)
        linear(f"{p}.mlp.shared_experts.gate_proj", shared, hidden, layout.other_linear)
        linear(f"{p}.mlp.shared_experts.up_proj", shared, hidden, layout.other_linear)
        linear(f"{p}.mlp.shared_experts.down_proj", hidden, shared, layout.other_linear)
    nextn = f"model.layers.{cfg.num_hidden_layers}"
    for _, theirs in NEXTN_OWN_TENSORS:
        if theirs == "eh_proj":
            linear(f"{nextn}.eh_proj", hidden, 2 * hidden, layout.other_linear)
        else:
            plain(f"{nextn}.{theirs}.weight", hidden)
    return out


def layout_error(cfg, weights: str) -> str | None:
    """Why tiny-ling of config `cfg` cannot be exported in the layout `weights` (None: it can):
    the widths, and the first tensor that does not tile (torch-free: plans call it)."""
    from sparkit.models.tiny_ling.hf_quantized import layout_problems
    from sparkit.weight_formats import LAYOUTS

    problems = layout_problems(hf_tensor_inventory(cfg), cfg.num_hidden_layers, weights)
    if not problems:
        return None
    widths = f"moe_intermediate_size {cfg.moe_intermediate_size}, shared_expert_intermediate_size {cfg.shared_expert_intermediate_size}"
    more = f" (and {len(problems) - 1} more tensors)" if len(problems) > 1 else ""
    return (f"tiny-ling ({widths}) cannot be written in the {weights} layout ({LAYOUTS[weights].title}): "
            f"{problems[0]}{more}")


def damage_target(cfg) -> str:
    """The scale `--debug-damage-scale` changes (sparkit.models.tiny_ling.hf_quantized.damage_scale)."""
    from sparkit.models.tiny_ling.hf_quantized import damage_target as target

    return target(cfg.num_hidden_layers, cfg.num_experts)


def unquantised_linears(cfg) -> set[str]:
    """Linear weights kept unquantised in every layout: none (SGLang quantises all of BailingMoeV2's)."""
    return set()
