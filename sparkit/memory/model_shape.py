"""What config.json says an engine must keep per token and per request, the way SGLang 0.5.23
sizes it.

* Softmax-attention layers keep a KV cache per token: MLA layers their compressed latent
  (`kv_lora_rank + qk_rope_head_dim` values, the same on every TP rank), MHA/GQA layers a key and
  a value per KV head (`2 x num_key_value_heads x head_dim`, KV heads split over TP ranks).
* Linear-attention layers (KDA in Ling-3.0) keep a fixed-size state per request instead: a short
  convolution window over q, k and v (`(short_conv_kernel_size - 1) x 3 x heads x head_dim`, in
  bf16) and the recurrent state (`heads x head_dim x head_dim`, in fp32), heads split over TP
  (sglang.srt.configs.mamba_utils.KimiLinearStateShape, BaseLinearStateParams.mamba_cache_per_req).
* Bailing hybrid layer schedule (configs/bailing_hybrid.py): layer i is full attention when
  (i + 1) % layer_group_size == 0, else linear; a list gives the schedule per layer (1 = linear).
* The NextN (MTP) draft is one full-attention layer per `num_nextn_predict_layers`.
"""

from __future__ import annotations

from dataclasses import dataclass

BF16_BYTES, FP32_BYTES = 2, 4
_SSM_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    architecture: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int | None
    full_attention_layers: int  # softmax attention: a KV cache per token
    linear_attention_layers: int  # KDA: a state per request
    attention: str  # "mla" | "mha"
    kv_values_per_token_layer: int  # per TP rank (see kv_values)
    linear_state_conv_values: int  # per layer per request, bf16, per TP rank
    linear_state_temporal_values: int  # per layer per request, per TP rank, in temporal_bytes each
    linear_state_temporal_bytes: int  # fp32 unless config.json's mamba_ssm_dtype says otherwise
    nextn_layers: int
    detail: str  # how the attention was read, for the arithmetic

    @property
    def hybrid(self) -> bool:
        return self.linear_attention_layers > 0

    def kv_bytes_per_token(self, kv_dtype_bytes: int, layers: int | None = None) -> int:
        return (self.full_attention_layers if layers is None else layers) * self.kv_values_per_token_layer * kv_dtype_bytes

    def linear_state_bytes_per_request(self) -> int:
        per_layer = (self.linear_state_conv_values * BF16_BYTES
                     + self.linear_state_temporal_values * self.linear_state_temporal_bytes)
        return per_layer * self.linear_attention_layers


class UnsupportedConfig(ValueError):
    """config.json lacks what the fit needs (its message names the key)."""


def _int(config: dict, *keys: str, default: int | None = None) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def _layer_schedule(config: dict, layers: int) -> list[str]:
    group = config.get("layer_group_size")
    if isinstance(group, list):
        if len(group) != layers:
            raise UnsupportedConfig(f"layer_group_size has {len(group)} entries for {layers} layers")
        return ["linear" if g == 1 else "full" for g in group]
    if isinstance(group, int) and group > 0:
        return ["full" if (i + 1) % group == 0 else "linear" for i in range(layers)]
    return ["full"] * layers


def model_shape(config: dict, tp: int = 1) -> ModelShape:
    """The per-token / per-request memory shape of a checkpoint's config.json, per TP rank."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = _int(text, "num_hidden_layers", "num_layers", "n_layer")
    hidden = _int(text, "hidden_size", "d_model")
    vocab = _int(text, "vocab_size")
    if not layers or not hidden or not vocab:
        raise UnsupportedConfig("config.json needs num_hidden_layers, hidden_size and vocab_size")
    heads = _int(text, "num_attention_heads", "n_head")
    if not heads:
        raise UnsupportedConfig("config.json has no num_attention_heads")
    head_dim = _int(text, "head_dim") or hidden // heads
    model_type = str(text.get("model_type", "?"))
    architecture = (config.get("architectures") or ["?"])[0]

    hybrid = model_type == "bailing_hybrid" or "layer_group_size" in text and "short_conv_kernel_size" in text
    schedule = _layer_schedule(text, layers) if hybrid else ["full"] * layers
    linear = schedule.count("linear")
    conv = temporal = 0
    if linear:
        kernel = _int(text, "short_conv_kernel_size")
        if kernel is None:
            raise UnsupportedConfig(f"{model_type}: linear-attention layers without short_conv_kernel_size "
                                    "(a Mamba2-style state this fit does not size)")
        local_heads = -(-heads // tp)
        conv = (kernel - 1) * 3 * local_heads * head_dim
        temporal = local_heads * head_dim * head_dim
    kv_lora = _int(text, "kv_lora_rank")
    rope = _int(text, "qk_rope_head_dim")
    if kv_lora and rope is not None:
        attention, per_layer = "mla", kv_lora + rope
        detail = f"MLA latent kv_lora_rank {kv_lora} + qk_rope_head_dim {rope}"
    else:
        kv_heads = _int(text, "num_key_value_heads", default=heads) or heads
        local_kv = max(1, kv_heads // tp)
        attention, per_layer = "mha", 2 * local_kv * head_dim
        detail = f"K and V: 2 x {local_kv} KV head(s){' per TP rank' if tp > 1 else ''} x head_dim {head_dim}"
    nextn = _int(text, "num_nextn_predict_layers", default=0) or 0
    return ModelShape(
        model_type=model_type, architecture=architecture, num_hidden_layers=layers, hidden_size=hidden,
        vocab_size=vocab, max_position_embeddings=_int(text, "max_position_embeddings"),
        full_attention_layers=schedule.count("full"), linear_attention_layers=linear, attention=attention,
        kv_values_per_token_layer=per_layer, linear_state_conv_values=conv, linear_state_temporal_values=temporal,
        linear_state_temporal_bytes=_SSM_DTYPE_BYTES.get(str(text.get("mamba_ssm_dtype", "float32")), FP32_BYTES),
        nextn_layers=nextn, detail=detail,
    )
