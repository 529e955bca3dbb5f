"""tiny-ling-v3 in the Hugging Face BailingMoeV3 format: what stock SGLang 0.5.23 loads with its own
model code (models/bailing_moe_v3.py, models/bailing_moe_nextn.py; config re-parsed by
configs/bailing_hybrid.py's BailingHybridConfig, `model_type: bailing_hybrid`), and back. Pure
format: the config dict, the tensor names, the configuration class's source; files are written
and read by sparkit.models.checkpoint. tiny-ling-v3 keeps the checkpoint's names in its modules,
so the export is mostly a prefix:

    sparkit (model.safetensors)                     Hugging Face / SGLang
    embed_tokens, norm, lm_head                     model.word_embeddings, model.norm, lm_head
    layers.i.attention.* (KDA: q/k/v/f/g/b_proj,    model.layers.i.attention.* (q_conv1d.weight ...; SGLang
      q/k/v_conv1d, A_log, dt_bias, o_norm, o_proj;   fuses q/k/v/(b)/f/g into fused_qkvbfg_proj, the
      MLA: q_a_proj, q_a_layernorm, q_b_proj,         convs into qkv_conv1d, q_a and kv_a into
      kv_a_proj_with_mqa, kv_a_layernorm,             fused_qkv_a_proj_with_mqa)
      kv_b_proj, o_proj, g_proj)
    layers.0.mlp.gate_up_proj, down_proj (dense)    model.layers.0.mlp.{gate_proj, up_proj, down_proj}
    layers.i.mlp.gate, expert_bias                  model.layers.i.mlp.gate.{weight, expert_bias}
    layers.i.mlp.w_gate_up [E, 2I, H], w_down       model.layers.i.mlp.experts.e.{gate_proj, up_proj, down_proj}
    layers.i.mlp.shared_expert.*                    model.layers.i.mlp.shared_experts.{gate_proj, up_proj, down_proj}
    mtp.{enorm, hnorm, eh_proj, shared_head_norm}   model.layers.L.{enorm, hnorm, eh_proj, final_layernorm}
    mtp.decoder.*                                   model.layers.L.* (L = num_hidden_layers)

Two linear weights stay unquantised in every layout because SGLang builds them without a quant
config: a KDA layer's b_proj (beta) and an MLA layer's g_proj (the head-wise output gate).
Reading an HF config back, a key at a value tiny-ling-v3 does not implement is an error naming it.
"""

from __future__ import annotations

from sparkit.models.formats import ARCHITECTURES

HF_ARCHITECTURE = ARCHITECTURES["tiny-ling-v3"][1]
HF_MODEL_TYPE = "bailing_hybrid"
CONFIG_MODULE = "configuration_bailing_hybrid"

# The configuration class transformers instantiates for the export (AutoConfig via auto_map; SGLang
# reads the same keys with its own BailingHybridConfig). The keys and defaults SGLang 0.5.23's
# configs/bailing_hybrid.py declares, without its SGLang-only cache properties.
CONFIG_SOURCE = '''"""BailingHybrid configuration for sparkit's tiny-ling-v3 export (written by sparkit)."""
from transformers.configuration_utils import PretrainedConfig


class BailingHybridConfig(PretrainedConfig):
    model_type = "bailing_hybrid"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, vocab_size=157184, hidden_size=2048, intermediate_size=5120, num_hidden_layers=20,
                 num_attention_heads=16, num_key_value_heads=4, hidden_act="silu", use_qkv_bias=False,
                 use_bias=False, rms_norm_eps=1e-06, tie_word_embeddings=False, embedding_dropout=0.0,
                 attention_dropout=0.0, output_dropout=0.0, initializer_range=0.02,
                 max_position_embeddings=32768, rope_theta=600000.0, use_cache=True, max_window_layers=20,
                 rope_scaling=None, pad_token_id=156892, eos_token_id=156892, num_experts=256,
                 num_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4,
                 moe_intermediate_size=512, first_k_dense_replace=1, head_dim=128, output_router_logits=False,
                 use_qk_norm=True, num_nextn_predict_layers=0, mtp_loss_scaling_factor=0,
                 moe_router_enable_expert_bias=False, routed_scaling_factor=1.0, layer_group_size=1,
                 group_norm_size=1, linear_silu=False, kv_lora_rank=512, q_lora_rank=None,
                 qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, rope_interleave=True,
                 short_conv_kernel_size=None, no_kda_lora=False, kda_safe_gate=False, kda_lower_bound=None,
                 use_mla_nope=False, **kwargs):
        self.num_hidden_layers = num_hidden_layers
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.use_qkv_bias = use_qkv_bias
        self.use_bias = use_bias
        self.rms_norm_eps = rms_norm_eps
        self.embedding_dropout = embedding_dropout
        self.attention_dropout = attention_dropout
        self.output_dropout = output_dropout
        self.num_nextn_predict_layers = num_nextn_predict_layers
        self.mtp_loss_scaling_factor = mtp_loss_scaling_factor
        self.initializer_range = initializer_range
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.use_cache = use_cache
        self.max_window_layers = max_window_layers
        self.head_dim = head_dim or self.hidden_size // self.num_attention_heads
        self.rope_scaling = rope_scaling
        self.use_qk_norm = use_qk_norm
        self.moe_router_enable_expert_bias = moe_router_enable_expert_bias
        self.routed_scaling_factor = routed_scaling_factor
        self.num_experts = num_experts
        self.num_shared_experts = num_shared_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.n_group = n_group
        self.topk_group = topk_group
        self.moe_intermediate_size = moe_intermediate_size
        self.first_k_dense_replace = first_k_dense_replace
        self.output_router_logits = output_router_logits
        self.layer_group_size = layer_group_size
        self.group_norm_size = group_norm_size
        self.linear_silu = linear_silu
        self.num_linear_key_value_heads = num_attention_heads
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.rope_interleave = rope_interleave
        self.short_conv_kernel_size = short_conv_kernel_size
        self.use_kda = short_conv_kernel_size is not None
        self.no_kda_lora = no_kda_lora
        self.kda_safe_gate = kda_safe_gate
        self.kda_lower_bound = kda_lower_bound if kda_safe_gate else None
        self.use_mla_nope = use_mla_nope
        self.for_nextn_model = False
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def layers_block_type(self):
        if self.for_nextn_model:
            return ["attention"]
        if isinstance(self.layer_group_size, int):
            return ["attention" if (i + 1) % self.layer_group_size == 0 else "linear_attention"
                    for i in range(self.num_hidden_layers)]
        return ["linear_attention" if self.layer_group_size[i] == 1 else "attention"
                for i in range(self.num_hidden_layers)]
'''

# Keys whose value tiny-ling-v3 fixes: (key, required value, what differs otherwise).
_FIXED = (
    ("hidden_act", "silu", "the activation"),
    ("use_bias", False, "biases in the linear layers"),
    ("no_kda_lora", True, "the f/g LoRA of the KDA layers"),
    ("kda_safe_gate", True, "the KDA forget gate without its lower bound"),
    ("use_mla_nope", False, "MLA without RoPE"),
    ("rope_interleave", True, "NeoX-style (half-split) RoPE in the MLA layers"),
    ("gated_attention_proj_granularity_type", "head_wise", "the MLA output gate's granularity"),
    ("full_attention_type", "mla", "softmax attention other than MLA"),
    ("norm_topk_prob", True, "renormalising the top-k routing weights"),
    ("score_function", "sigmoid", "the router's score function"),
    ("moe_router_enable_expert_bias", True, "a router without expert bias"),
    ("num_shared_experts", 1, "the number of shared experts"),
    ("num_nextn_predict_layers", 1, "the number of NextN layers"),
    ("tie_word_embeddings", False, "an lm_head tied to the embedding"),
)


def hf_config(cfg) -> dict:
    """The config.json of the export, from a TinyLingV3Config."""
    return {
        "architectures": [HF_ARCHITECTURE],
        "model_type": HF_MODEL_TYPE,
        "auto_map": {"AutoConfig": f"{CONFIG_MODULE}.BailingHybridConfig"},
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "layer_group_size": cfg.layer_group_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "use_bias": False,
        "use_qkv_bias": False,
        "use_qk_norm": False,
        "rms_norm_eps": cfg.rms_norm_eps,
        "embedding_dropout": 0.0,
        "attention_dropout": 0.0,
        "output_dropout": 0.0,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_interleave": True,
        "short_conv_kernel_size": cfg.short_conv_kernel_size,
        "no_kda_lora": True,
        "kda_safe_gate": True,
        "kda_lower_bound": cfg.kda_lower_bound,
        "full_attention_type": "mla",
        "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "use_mla_nope": False,
        "gated_attention_proj_granularity_type": "head_wise",
        "first_k_dense_replace": cfg.first_k_dense_replace,
        "num_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "num_shared_experts": 1,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "moe_shared_expert_intermediate_size": cfg.shared_expert_intermediate_size,
        "n_group": cfg.n_group,
        "topk_group": cfg.topk_group,
        "norm_topk_prob": True,
        "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "routed_scaling_factor": cfg.routed_scaling_factor,
        "router_dtype": "fp32",
        "num_nextn_predict_layers": 1,
        "mtp_loss_scaling_factor": 0,
        "tie_word_embeddings": False,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "torch_dtype": "bfloat16",
    }


def config_from_hf(raw: dict):
    """A TinyLingV3Config from an HF BailingMoeV3 config; ValueError naming the first key whose
    value tiny-ling-v3 does not implement."""
    from sparkit.models.tiny_ling_v3.model import TinyLingV3Config

    for key, want, meaning in _FIXED:
        if key in raw and raw[key] != want:
            raise ValueError(f"config key {key}={raw[key]!r}: tiny-ling-v3 implements BailingMoeV3 with {key}={want!r} "
                             f"({meaning} is not supported)")
    if not isinstance(raw.get("layer_group_size"), int):
        raise ValueError(f"config key layer_group_size={raw.get('layer_group_size')!r}: an integer is supported "
                         "(every Nth layer MLA), not a per-layer list")
    rope = raw.get("rope_parameters") or {}
    if rope.get("factor", 1.0) != 1.0:
        raise ValueError(f"config key rope_parameters.factor={rope['factor']!r}: only unscaled RoPE is supported")
    heads = raw["num_attention_heads"]
    if raw.get("v_head_dim") != raw.get("head_dim"):
        raise ValueError(f"config key v_head_dim={raw.get('v_head_dim')!r}: the KDA layers need it equal to "
                         f"head_dim ({raw.get('head_dim')!r})")
    try:
        return TinyLingV3Config(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            layer_group_size=int(raw["layer_group_size"]),
            num_attention_heads=int(heads),
            head_dim=int(raw["head_dim"]),
            v_head_dim=int(raw["v_head_dim"]),
            short_conv_kernel_size=int(raw["short_conv_kernel_size"]),
            kda_lower_bound=float(raw["kda_lower_bound"]),
            q_lora_rank=int(raw["q_lora_rank"]),
            kv_lora_rank=int(raw["kv_lora_rank"]),
            qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
            qk_rope_head_dim=int(raw["qk_rope_head_dim"]),
            first_k_dense_replace=int(raw["first_k_dense_replace"]),
            num_experts=int(raw["num_experts"]),
            num_experts_per_tok=int(raw["num_experts_per_tok"]),
            n_group=int(raw["n_group"]),
            topk_group=int(raw["topk_group"]),
            routed_scaling_factor=float(raw["routed_scaling_factor"]),
            moe_intermediate_size=int(raw["moe_intermediate_size"]),
            shared_expert_intermediate_size=int(raw.get("moe_shared_expert_intermediate_size") or raw["moe_intermediate_size"]),
            max_position_embeddings=int(raw["max_position_embeddings"]),
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 600000.0))),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=raw.get("eos_token_id"),
            pad_token_id=raw.get("pad_token_id"),
            torch_dtype=str(raw.get("torch_dtype", "bfloat16")),
            sparkit=dict(raw.get("sparkit") or {}),
        )
    except KeyError as exc:
        raise ValueError(f"config key {exc.args[0]} is missing") from None


def _is_kda(cfg, layer: int) -> bool:
    return (layer + 1) % cfg.layer_group_size != 0


_KDA_TENSORS = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "f_proj.weight", "g_proj.weight", "b_proj.weight",
                "A_log", "dt_bias", "o_norm.weight", "o_proj.weight")
_MLA_TENSORS = ("q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight",
                "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight", "g_proj.weight")
_CONVS = ("q_conv1d", "k_conv1d", "v_conv1d")


def _layer_to_hf(mine: str, theirs: str, state: dict, out: dict, cfg, kda: bool, moe: bool) -> None:
    for norm in ("input_layernorm", "post_attention_layernorm"):
        out[f"{theirs}.{norm}.weight"] = state[f"{mine}.{norm}.weight"]
    for name in _KDA_TENSORS if kda else _MLA_TENSORS:
        out[f"{theirs}.attention.{name}"] = state[f"{mine}.attention.{name}"]
    if kda:
        for name in _CONVS:
            out[f"{theirs}.attention.{name}.weight"] = state[f"{mine}.attention.{name}"]
    if not moe:
        gate_up = state[f"{mine}.mlp.gate_up_proj.weight"]
        half = gate_up.shape[0] // 2
        out[f"{theirs}.mlp.gate_proj.weight"], out[f"{theirs}.mlp.up_proj.weight"] = gate_up[:half], gate_up[half:]
        out[f"{theirs}.mlp.down_proj.weight"] = state[f"{mine}.mlp.down_proj.weight"]
        return
    inter = cfg.moe_intermediate_size
    out[f"{theirs}.mlp.gate.weight"] = state[f"{mine}.mlp.gate.weight"]
    out[f"{theirs}.mlp.gate.expert_bias"] = state[f"{mine}.mlp.expert_bias"]
    gate_up, down = state[f"{mine}.mlp.w_gate_up"], state[f"{mine}.mlp.w_down"]
    for e in range(cfg.num_experts):
        out[f"{theirs}.mlp.experts.{e}.gate_proj.weight"] = gate_up[e, :inter]
        out[f"{theirs}.mlp.experts.{e}.up_proj.weight"] = gate_up[e, inter:]
        out[f"{theirs}.mlp.experts.{e}.down_proj.weight"] = down[e]
    shared = state[f"{mine}.mlp.shared_expert.gate_up_proj.weight"]
    half = shared.shape[0] // 2
    out[f"{theirs}.mlp.shared_experts.gate_proj.weight"] = shared[:half]
    out[f"{theirs}.mlp.shared_experts.up_proj.weight"] = shared[half:]
    out[f"{theirs}.mlp.shared_experts.down_proj.weight"] = state[f"{mine}.mlp.shared_expert.down_proj.weight"]


def _layer_from_hf(theirs: str, mine: str, hf: dict, out: dict, cfg, kda: bool, moe: bool) -> None:
    import torch

    for norm in ("input_layernorm", "post_attention_layernorm"):
        out[f"{mine}.{norm}.weight"] = hf[f"{theirs}.{norm}.weight"]
    for name in _KDA_TENSORS if kda else _MLA_TENSORS:
        out[f"{mine}.attention.{name}"] = hf[f"{theirs}.attention.{name}"]
    if kda:
        for name in _CONVS:
            out[f"{mine}.attention.{name}"] = hf[f"{theirs}.attention.{name}.weight"]
    if not moe:
        out[f"{mine}.mlp.gate_up_proj.weight"] = torch.cat((hf[f"{theirs}.mlp.gate_proj.weight"], hf[f"{theirs}.mlp.up_proj.weight"]))
        out[f"{mine}.mlp.down_proj.weight"] = hf[f"{theirs}.mlp.down_proj.weight"]
        return
    out[f"{mine}.mlp.gate.weight"] = hf[f"{theirs}.mlp.gate.weight"]
    out[f"{mine}.mlp.expert_bias"] = hf[f"{theirs}.mlp.gate.expert_bias"]
    experts = range(cfg.num_experts)
    out[f"{mine}.mlp.w_gate_up"] = torch.stack([
        torch.cat((hf[f"{theirs}.mlp.experts.{e}.gate_proj.weight"], hf[f"{theirs}.mlp.experts.{e}.up_proj.weight"]))
        for e in experts])
    out[f"{mine}.mlp.w_down"] = torch.stack([hf[f"{theirs}.mlp.experts.{e}.down_proj.weight"] for e in experts])
    out[f"{mine}.mlp.shared_expert.gate_up_proj.weight"] = torch.cat(
        (hf[f"{theirs}.mlp.shared_experts.gate_proj.weight"], hf[f"{theirs}.mlp.shared_experts.up_proj.weight"]))
    out[f"{mine}.mlp.shared_expert.down_proj.weight"] = hf[f"{theirs}.mlp.shared_experts.down_proj.weight"]


# The NextN layer's own tensors beside its decoder layer (SGLang's names: final_layernorm is the head norm).
NEXTN_OWN_TENSORS = (("enorm", "enorm"), ("hnorm", "hnorm"), ("eh_proj", "eh_proj"), ("shared_head_norm", "final_layernorm"))


def _layers(cfg):
    """(sparkit prefix, HF prefix, is KDA, is MoE) of every decoder layer, the NextN layer's last."""
    out = [(f"layers.{i}", f"model.layers.{i}", _is_kda(cfg, i), i >= cfg.first_k_dense_replace)
           for i in range(cfg.num_hidden_layers)]
    return out + [("mtp.decoder", f"model.layers.{cfg.num_hidden_layers}", False, True)]


def state_dict_to_hf(state: dict, cfg) -> dict:
    """sparkit tensor names -> the HF BailingMoeV3 names (views of the same tensors)."""
    out = {"model.word_embeddings.weight": state["embed_tokens.weight"],
           "model.norm.weight": state["norm.weight"], "lm_head.weight": state["lm_head.weight"]}
    for mine, theirs, kda, moe in _layers(cfg):
        _layer_to_hf(mine, theirs, state, out, cfg, kda, moe)
    nextn = f"model.layers.{cfg.num_hidden_layers}"
    for mine, theirs in NEXTN_OWN_TENSORS:
        out[f"{nextn}.{theirs}.weight"] = state[f"mtp.{mine}.weight"]
    return out


def state_dict_from_hf(hf: dict, cfg) -> dict:
    """The inverse of state_dict_to_hf (KeyError names a missing HF tensor)."""
    out = {"embed_tokens.weight": hf["model.word_embeddings.weight"],
           "norm.weight": hf["model.norm.weight"], "lm_head.weight": hf["lm_head.weight"]}
    for mine, theirs, kda, moe in _layers(cfg):
        _layer_from_hf(theirs, mine, hf, out, cfg, kda, moe)
    nextn = f"model.layers.{cfg.num_hidden_layers}"
    for mine, theirs in NEXTN_OWN_TENSORS:
        out[f"mtp.{mine}.weight"] = hf[f"{nextn}.{theirs}.weight"]
    return out


def unquantised_linears(cfg) -> set[str]:
    """The linear weights SGLang builds without a quant config (kept bf16 in every layout): each
    KDA layer's b_proj, each MLA layer's (and the NextN layer's) g_proj."""
    return {f"{theirs}.attention.{'b_proj' if kda else 'g_proj'}.weight" for _, theirs, kda, _ in _layers(cfg)}


def hf_tensor_inventory(cfg, weights: str = "bf16", dtype: str = "BF16") -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (safetensors dtype, shape)} of the export of a model of config `cfg` in the weights
    layout `weights` (sparkit.weight_formats.LAYOUTS), its unquantised tensors in `dtype`: what
    state_dict_to_hf writes, then sparkit.models.tiny_ling.hf_quantized quantises."""
    from sparkit.weight_formats import LAYOUTS, linear_tensors

    layout = LAYOUTS[weights]
    H, heads = cfg.hidden_size, cfg.num_attention_heads
    inner = heads * cfg.head_dim
    keep = unquantised_linears(cfg)
    out: dict[str, tuple[str, tuple[int, ...]]] = {}

    def plain(name: str, *shape: int) -> None:
        out[name] = (dtype, tuple(shape))

    def linear(name: str, rows: int, cols: int, fmt: str) -> None:
        if fmt == "bf16" or f"{name}.weight" in keep:
            plain(f"{name}.weight", rows, cols)
        else:
            out.update(linear_tensors(name, rows, cols, fmt))

    other = layout.other_linear
    plain("model.word_embeddings.weight", cfg.vocab_size, H)
    plain("model.norm.weight", H)
    plain("lm_head.weight", cfg.vocab_size, H)
    for _, p, kda, moe in _layers(cfg):
        plain(f"{p}.input_layernorm.weight", H)
        plain(f"{p}.post_attention_layernorm.weight", H)
        a = f"{p}.attention"
        if kda:
            for proj in ("q_proj", "k_proj", "v_proj", "f_proj", "g_proj"):
                linear(f"{a}.{proj}", inner, H, other)
            linear(f"{a}.b_proj", heads, H, other)
            for conv in _CONVS:
                plain(f"{a}.{conv}.weight", inner, 1, cfg.short_conv_kernel_size)
            plain(f"{a}.A_log", heads)
            plain(f"{a}.dt_bias", inner)
            plain(f"{a}.o_norm.weight", cfg.head_dim)
            linear(f"{a}.o_proj", H, inner, other)
        else:
            nope, rope, v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
            linear(f"{a}.q_a_proj", cfg.q_lora_rank, H, other)
            plain(f"{a}.q_a_layernorm.weight", cfg.q_lora_rank)
            linear(f"{a}.q_b_proj", heads * (nope + rope), cfg.q_lora_rank, other)
            linear(f"{a}.kv_a_proj_with_mqa", cfg.kv_lora_rank + rope, H, other)
            plain(f"{a}.kv_a_layernorm.weight", cfg.kv_lora_rank)
            linear(f"{a}.kv_b_proj", heads * (nope + v), cfg.kv_lora_rank, other)
            linear(f"{a}.o_proj", H, heads * v, other)
            linear(f"{a}.g_proj", heads, H, other)
        if not moe:
            linear(f"{p}.mlp.gate_proj", cfg.intermediate_size, H, other)
            linear(f"{p}.mlp.up_proj", cfg.intermediate_size, H, other)
            linear(f"{p}.mlp.down_proj", H, cfg.intermediate_size, other)
            continue
        inter, shared = cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
        plain(f"{p}.mlp.gate.weight", cfg.num_experts, H)
        plain(f"{p}.mlp.gate.expert_bias", cfg.num_experts)
        for e in range(cfg.num_experts):
            linear(f"{p}.mlp.experts.{e}.gate_proj", inter, H, layout.routed_experts)
            linear(f"{p}.mlp.experts.{e}.up_proj", inter, H, layout.routed_experts)
            linear(f"{p}.mlp.experts.{e}.down_proj", H, inter, layout.routed_experts)
        linear(f"{p}.mlp.shared_experts.gate_proj", shared, H, other)
        linear(f"{p}.mlp.shared_experts.up_proj", shared, H, other)
        linear(f"{p}.mlp.shared_experts.down_proj", H, shared, other)
    nextn = f"model.layers.{cfg.num_hidden_layers}"
    for _, theirs in NEXTN_OWN_TENSORS:
        if theirs == "eh_proj":
            linear(f"{nextn}.eh_proj", H, 2 * H, other)
        else:
            plain(f"{nextn}.{theirs}.weight", H)
    return out


def layout_error(cfg, weights: str) -> str | None:
    """Why tiny-ling-v3 of config `cfg` cannot be exported in the layout `weights` (None: it can)."""
    from sparkit.models.tiny_ling.hf_quantized import layout_problems
    from sparkit.weight_formats import LAYOUTS

    inventory = {k: v for k, v in hf_tensor_inventory(cfg).items() if k not in unquantised_linears(cfg)}
    problems = layout_problems(inventory, cfg.num_hidden_layers, weights)
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more tensors)" if len(problems) > 1 else ""
    return f"tiny-ling-v3 cannot be written in the {weights} layout ({LAYOUTS[weights].title}): {problems[0]}{more}"


def damage_target(cfg) -> str:
    """The scale `--debug-damage-scale` changes: the first MoE layer's last expert's down projection."""
    from sparkit.weight_formats import SCALE_NAME

    return f"model.layers.{cfg.first_k_dense_replace}.mlp.experts.{cfg.num_experts - 1}.down_proj.{SCALE_NAME}"
