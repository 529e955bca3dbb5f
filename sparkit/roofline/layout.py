"""Which tensors a decode step reads: a checkpoint's tensors grouped by the role they play.

A MoE decoder's step reads, per layer, the attention weights, the norms, the router, a dense MLP
(first layers) or the shared expert plus k of the E routed experts; then the final norm and the
whole lm_head; one embedding row per token. The MTP (NextN) layer is read by each draft step.
Tensor names are classified by the conventions of the checkpoints sparkit meets: Hugging Face
Bailing V2/V3 (`model.layers.N.attention.*`, `mlp.experts.E.*`, `mlp.shared_experts.*`; the
NextN layer is layer `num_hidden_layers`), transformers' stacked experts (`mlp.experts.gate_up_proj`)
and tiny-ling's own layout (`layers.N.mlp.w_gate_up`, `mtp.*`). A tensor that fits no role is
counted as read every step ("other"), so an unknown layout over-states a step, never under-states it.

Sizes are the stored ones (data_offsets) together with how many of those bytes are float
weights, so an engine that reads weights in another dtype (the embedded engine decodes to its
compute dtype) can be re-priced without re-reading the headers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkit.checkpoint_headers import TensorInfo, read_config, read_safetensors_index

# Roles of weights that every forward of a layer reads in full.
ROLES = ("attention", "dense_mlp", "shared_expert", "router", "norm", "mtp_proj", "other")
FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}

_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)$")
_MTP_NATIVE = re.compile(r"^mtp\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.")
_STACKED_EXPERTS = re.compile(r"^mlp\.(?:w_gate_up|w_down|experts\.(?:gate_up_proj|down_proj)(?:_[a-z_]+)?)(?:\.|$)")
_SHARED = re.compile(r"^mlp\.shared_experts?\.")
_ROUTER = re.compile(r"^mlp\.gate\.")
_DENSE = re.compile(r"^mlp\.(?:gate_proj|up_proj|down_proj|gate_up_proj)\.")
_ATTENTION = re.compile(r"^(?:attention|self_attn)\.")
_NORM = re.compile(r"(?:^|\.|_)(?:layernorm|norm|enorm|hnorm)\.weight$")
_MTP_PROJ = re.compile(r"^eh_proj\.")
# In the NextN layer: the target's embedding and lm_head, shared (SGLang skips these names).
_MTP_SHARED = re.compile(r"(?:^|\.)(?:shared_head\.head|embed_tokens|word_embeddings)\.")
_EMBEDDING = re.compile(r"^(?:model\.)?(?:word_embeddings|embed_tokens)\.")
_LM_HEAD = re.compile(r"^lm_head\.")
_FINAL_NORM = re.compile(r"^(?:model\.)?norm\.weight$")


@dataclass
class Weights:
    """Bytes of some tensors: as stored, and how much of that is float weights (numel by dtype)."""

    stored_bytes: int = 0
    float_numel: int = 0  # elements of F16/BF16/F32/F64 tensors
    float_stored_bytes: int = 0  # their stored bytes
    dtypes: set[str] = field(default_factory=set)
    tensors: int = 0

    def add(self, t: TensorInfo) -> None:
        self.stored_bytes += t.nbytes
        self.tensors += 1
        self.dtypes.add(t.dtype)
        if t.dtype in FLOAT_DTYPES:
            self.float_numel += t.numel
            self.float_stored_bytes += t.nbytes

    def bytes_at(self, float_bytes: int | None) -> float:
        """Bytes read when float weights are read at `float_bytes` per element (None: as stored)."""
        if float_bytes is None:
            return float(self.stored_bytes)
        return float(self.stored_bytes - self.float_stored_bytes + self.float_numel * float_bytes)

    def merged(self, other: Weights) -> Weights:
        return Weights(self.stored_bytes + other.stored_bytes, self.float_numel + other.float_numel,
                       self.float_stored_bytes + other.float_stored_bytes, self.dtypes | other.dtypes,
                       self.tensors + other.tensors)


@dataclass
class ExpertSet:
    """The routed experts of one MoE layer: E experts of which each token reads k."""

    num_experts: int
    top_k: int
    per_expert: Weights  # one expert's weights (and scales), averaged over the layer's experts


@dataclass
class LayerReads:
    """What one decoder layer holds, by role."""

    index: int
    mtp: bool = False
    weights: dict[str, Weights] = field(default_factory=dict)
    experts: ExpertSet | None = None
    # Attention cache read per step: full attention reads kv_elements_per_token x context;
    # linear attention reads (and writes back) a fixed state.
    attention: str = "full"  # "full" | "linear"
    kv_elements_per_token: int = 0
    kv_sharded: bool = True  # False: every TP rank holds the whole cache (MLA's single latent head)
    state_elements: int = 0  # linear attention: the recurrent state (float32 in SGLang)
    conv_elements: int = 0  # linear attention: the short-convolution state (model dtype)

    def role(self, name: str) -> Weights:
        return self.weights.setdefault(name, Weights())


@dataclass
class ModelLayout:
    """A model's decode-step reads, from a checkpoint or a declared profile."""

    name: str
    source: str  # "checkpoint" | "declared profile"
    source_detail: str  # the directory, or what the profile is declared from
    config: dict[str, Any]
    layers: list[LayerReads]
    embedding: Weights
    lm_head: Weights
    final_norm: Weights
    other: Weights  # top-level tensors of no known role (read every step, to be safe)
    hidden_size: int
    vocab_size: int
    max_context: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def target_layers(self) -> list[LayerReads]:
        return [layer for layer in self.layers if not layer.mtp]

    @property
    def mtp_layers(self) -> list[LayerReads]:
        return [layer for layer in self.layers if layer.mtp]

    @property
    def target_parameters(self) -> int:
        """Parameters of the target's layers (every expert counted), embedding and head excluded."""
        total = sum(w.float_numel for layer in self.target_layers for w in layer.weights.values())
        return total + sum(layer.experts.per_expert.float_numel * layer.experts.num_experts
                           for layer in self.target_layers if layer.experts)

    @property
    def active_target_parameters(self) -> int:
        """target_parameters with only the top-k routed experts of each layer: what one token uses."""
        return self.target_parameters - sum(
            layer.experts.per_expert.float_numel * (layer.experts.num_experts - layer.experts.top_k)
            for layer in self.target_layers if layer.experts)

    @property
    def total_stored_bytes(self) -> int:
        total = self.embedding.stored_bytes + self.lm_head.stored_bytes + self.final_norm.stored_bytes + self.other.stored_bytes
        for layer in self.layers:
            total += sum(w.stored_bytes for w in layer.weights.values())
            if layer.experts:
                total += round(layer.experts.per_expert.stored_bytes * layer.experts.num_experts)
        return total


def _config_int(config: dict[str, Any], *keys: str, default: int | None = None) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def num_target_layers(config: dict[str, Any]) -> int:
    layers = _config_int(config, "num_hidden_layers", "num_layers")
    if layers is None:
        raise ValueError("config.json has no num_hidden_layers")
    return layers


def top_k(config: dict[str, Any]) -> int | None:
    return _config_int(config, "num_experts_per_tok", "top_k", "moe_top_k")


def is_linear_attention_layer(config: dict[str, Any], index: int) -> bool:
    """Ling V3 (bailing_hybrid with KDA): the last layer of every group of `layer_group_size` is
    full (MLA) attention, the others linear (KDA); an explicit `layer_types` list wins. The
    NextN layer is MLA (SGLang forces attention_type 1 on it)."""
    types = config.get("layer_types")
    if isinstance(types, list) and index < len(types):
        return types[index] == "linear_attention"
    group = config.get("layer_group_size")
    if isinstance(group, list):
        return index < len(group) and group[index] == 1
    if isinstance(group, int) and group > 0 and config.get("short_conv_kernel_size"):
        return (index + 1) % group != 0
    return False


def uses_mla(config: dict[str, Any]) -> bool:
    return config.get("kv_lora_rank") is not None and config.get("model_type") in ("bailing_hybrid", "deepseek_v3",
                                                                                  "deepseek_v2", "bailing_moe_v3")


def attention_cache(config: dict[str, Any], layer: LayerReads) -> None:
    """Fill the layer's per-step attention-cache reads from the config."""
    heads = _config_int(config, "num_attention_heads", default=1) or 1
    hidden = _config_int(config, "hidden_size", default=0) or 0
    if not layer.mtp and is_linear_attention_layer(config, layer.index):
        head_dim = _config_int(config, "linear_head_dim", "head_dim", default=hidden // heads) or 1
        kernel = _config_int(config, "short_conv_kernel_size", default=4) or 4
        layer.attention = "linear"
        layer.state_elements = heads * head_dim * head_dim  # K x V per head
        layer.conv_elements = (kernel - 1) * 3 * heads * head_dim  # q, k, v convolution windows
        return
    if uses_mla(config):
        layer.kv_elements_per_token = int(config["kv_lora_rank"]) + (_config_int(config, "qk_rope_head_dim", default=0) or 0)
        layer.kv_sharded = False
        return
    kv_heads = _config_int(config, "num_key_value_heads", default=heads) or heads
    head_dim = _config_int(config, "head_dim", default=hidden // heads) or 1
    layer.kv_elements_per_token = 2 * kv_heads * head_dim


@dataclass(frozen=True)
class TensorRole:
    """What one tensor of a checkpoint is, by its name (classify_tensor)."""

    role: str  # one of ROLES; "routed_experts"; top level: "embedding", "lm_head", "final_norm", "other";
    #            "mtp_shared": the NextN layer's copy of the target's embedding / head (not counted)
    layer: int | None = None  # the decoder layer (the NextN layer is num_hidden_layers)
    mtp: bool = False
    expert: int | None = None  # a per-expert tensor's expert index
    stacked: bool = False  # all experts of a layer in one tensor (leading dimension E)


def classify_tensor(name: str, n_layers: int) -> TensorRole:
    """The role a tensor named `name` plays in a model of `n_layers` decoder layers."""
    where = _locate(name, n_layers)
    if where is None:
        role = ("embedding" if _EMBEDDING.match(name) else "lm_head" if _LM_HEAD.match(name)
                else "final_norm" if _FINAL_NORM.match(name) else "other")
        return TensorRole(role)
    index, mtp, rest = where
    if mtp and _MTP_SHARED.search(rest):
        return TensorRole("mtp_shared", index, mtp)
    expert = _EXPERT.match(rest)
    if expert:
        return TensorRole("routed_experts", index, mtp, expert=int(expert.group(1)))
    if _STACKED_EXPERTS.match(rest):
        return TensorRole("routed_experts", index, mtp, stacked=True)
    for pattern, role in ((_SHARED, "shared_expert"), (_ROUTER, "router"), (_DENSE, "dense_mlp"),
                          (_ATTENTION, "attention"), (_MTP_PROJ, "mtp_proj")):
        if pattern.match(rest):
            return TensorRole(role, index, mtp)
    return TensorRole("norm" if _NORM.search(rest) else "other", index, mtp)


def layout_from_tensors(tensors: dict[str, TensorInfo], config: dict[str, Any], *, name: str, source: str,
                        source_detail: str) -> ModelLayout:
    """Group a checkpoint's tensors by role (see the module docstring)."""
    n_layers = num_target_layers(config)
    k = top_k(config)
    layers: dict[tuple[int, bool], LayerReads] = {}
    experts: dict[tuple[int, bool], dict[int, Weights]] = {}
    stacked: dict[tuple[int, bool], tuple[int, Weights]] = {}
    top = {"embedding": Weights(), "lm_head": Weights(), "norm": Weights(), "other": Weights()}
    for tensor in tensors.values():
        what = classify_tensor(tensor.name, n_layers)
        if what.layer is None:
            top["norm" if what.role == "final_norm" else what.role].add(tensor)
            continue
        key = (what.layer, what.mtp)
        layer = layers.setdefault(key, LayerReads(index=what.layer, mtp=what.mtp))
        if what.role == "mtp_shared":
            continue  # the target's own embedding / head, counted there
        if what.expert is not None:
            experts.setdefault(key, {}).setdefault(what.expert, Weights()).add(tensor)
        elif what.stacked:
            count, weights = stacked.get(key, (0, Weights()))
            weights.add(tensor)
            stacked[key] = (max(count, tensor.shape[0] if tensor.shape else 1), weights)
        else:
            layer.role(what.role).add(tensor)
    notes: list[str] = []
    for key, by_expert in experts.items():
        total = Weights()
        for weights in by_expert.values():
            total = total.merged(weights)
        layers[key].experts = _expert_set(len(by_expert), k, total, notes, key)
    for key, (count, weights) in stacked.items():
        layers[key].experts = _expert_set(count, k, weights, notes, key)
    ordered = sorted(layers.values(), key=lambda layer: (layer.mtp, layer.index))
    for layer in ordered:
        attention_cache(config, layer)
    if top["other"].tensors:
        notes.append(f"{top['other'].tensors} tensor(s) outside any layer of no known role: counted as read every step")
    return ModelLayout(
        name=name, source=source, source_detail=source_detail, config=config, layers=ordered,
        embedding=top["embedding"], lm_head=top["lm_head"], final_norm=top["norm"], other=top["other"],
        hidden_size=_config_int(config, "hidden_size", default=0) or 0,
        vocab_size=_config_int(config, "vocab_size", default=0) or 0,
        max_context=_config_int(config, "max_position_embeddings", "model_max_length"),
        notes=notes,
    )


def _expert_set(count: int, k: int | None, total: Weights, notes: list[str], key: tuple[int, bool]) -> ExpertSet:
    if k is None:
        k = count
        notes.append(f"layer {key[0]}: the config has no num_experts_per_tok; every expert counted as read")
    per = Weights(
        stored_bytes=round(total.stored_bytes / count), float_numel=round(total.float_numel / count),
        float_stored_bytes=round(total.float_stored_bytes / count), dtypes=set(total.dtypes),
        tensors=round(total.tensors / count),
    )
    return ExpertSet(num_experts=count, top_k=min(k, count), per_expert=per)


def _locate(name: str, n_layers: int) -> tuple[int, bool, str] | None:
    """(layer index, is the MTP layer, the name within the layer), or None outside layers."""
    native = _MTP_NATIVE.match(name)
    if native:
        rest = native.group(1)
        return n_layers, True, rest.removeprefix("decoder.")
    match = _LAYER.match(name)
    if not match:
        return None
    index = int(match.group(1))
    return index, index >= n_layers, match.group(2)


def layout_from_checkpoint(directory: str | Path, *, name: str | None = None) -> ModelLayout:
    """The layout of a local checkpoint, from its config.json and safetensors headers."""
    directory = Path(directory)
    config = read_config(directory)
    index = read_safetensors_index(directory)
    return layout_from_tensors(index.tensors, config, name=name or directory.name, source="checkpoint",
                               source_detail=f"{directory} ({len(index.files)} safetensors file(s), headers only)")


def layout_to_dict(layout: ModelLayout) -> dict[str, Any]:
    """A layout as JSON-ready data (layout_from_dict reads it back equal)."""
    from dataclasses import asdict

    def weights(w: Weights) -> dict[str, Any]:
        return {**asdict(w), "dtypes": sorted(w.dtypes)}

    data = asdict(layout)
    for name in ("embedding", "lm_head", "final_norm", "other"):
        data[name] = weights(getattr(layout, name))
    data["layers"] = []
    for layer in layout.layers:
        entry = asdict(layer)
        entry["weights"] = {role: weights(w) for role, w in layer.weights.items()}
        if layer.experts is not None:
            entry["experts"] = {**asdict(layer.experts), "per_expert": weights(layer.experts.per_expert)}
        data["layers"].append(entry)
    return data


def layout_from_dict(data: dict[str, Any]) -> ModelLayout:
    def weights(d: dict[str, Any]) -> Weights:
        return Weights(**{**d, "dtypes": set(d["dtypes"])})

    layers = []
    for entry in data["layers"]:
        experts = entry.get("experts")
        layers.append(LayerReads(**{
            **entry, "weights": {role: weights(w) for role, w in entry["weights"].items()},
            "experts": None if experts is None else ExpertSet(**{**experts, "per_expert": weights(experts["per_expert"])}),
        }))
    return ModelLayout(**{**data, "layers": layers, **{name: weights(data[name])
                                                        for name in ("embedding", "lm_head", "final_norm", "other")}})


__all__ = ["ModelLayout", "LayerReads", "ExpertSet", "Weights", "TensorRole", "classify_tensor", "layout_from_tensors",
           "layout_from_checkpoint", "layout_to_dict", "layout_from_dict", "ROLES", "FLOAT_DTYPES"]
