"""tiny-ling-v3: Ling-3.0 (SGLang 0.5.23's BailingMoeV3, models/bailing_moe_v3.py) in miniature.

Layers in Ling-3.0's pattern: with `layer_group_size` N, layer i is gated MLA when (i + 1) % N == 0
and KDA linear attention otherwise (4 layers, N = 4: KDA, KDA, KDA, MLA); the first
`first_k_dense_replace` layers have a dense SwiGLU MLP, the others a MoE: a sigmoid router with an
expert bias (grouped top-k: `n_group` groups, the best `topk_group` of them by the sum of their two
best biased scores, then the top k experts in those; weights are the unbiased scores renormalised,
times `routed_scaling_factor`) plus one shared expert. One NextN layer (gated MLA + MoE: SGLang forces
full attention on it) predicts token t+2 from the target's normed hidden state at t and the
embedding of token t+1, sharing the target's embedding and lm_head.

The function is SGLang's for the config sparkit.models.tiny_ling_v3.hf_checkpoint writes; the
attention layers are kda.py and mla.py. The expert weights are tiny-ling's MoE holder (so the fp8
and mxfp4 expert formats and the activation report are the embedded engine's own).

Shapes: activations are [B, T, H]; inference runs B = 1. The cache (HybridCache) holds the MLA
layers' K/V by position and the KDA layers' state, with the state after each token of a verify
step, so that the engine's `cache.length = committed` rolls a rejected draft back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from sparkit.models.cache_pool import SequenceCaches
from sparkit.models.formats import ARCHITECTURES
from sparkit.models.tiny_ling.model import MoE, SharedExpert
from sparkit.models.tiny_ling_v3.kda import KimiDeltaAttention
from sparkit.models.tiny_ling_v3.mla import GatedMLA, InterleavedRope, MlaCache, RMSNorm

MODEL_CLASS = ARCHITECTURES["tiny-ling-v3"][0]
DRAFT_CLASS = "TinyLingV3ForCausalLMNextN"
# A prefill of more tokens than this runs KDA by chunks and keeps only its final state; every
# forward that continues a sequence (decode, verify) keeps the state after each of its tokens.
MAX_ROLLBACK_TOKENS = 16
RENORMALIZE_EPS = 1e-20  # SGLang's _RENORMALIZE_SUM_EPSILON


@dataclass
class TinyLingV3Config:
    vocab_size: int = 264
    hidden_size: int = 128
    intermediate_size: int = 256  # the dense layers' MLP
    num_hidden_layers: int = 4
    layer_group_size: int = 4  # every 4th layer MLA, the others KDA (Ling-3.0's 3:1)
    num_attention_heads: int = 2  # KDA and MLA heads alike (SGLang reads one key for both)
    # KDA: heads of head_dim, values of v_head_dim (SGLang's fused projection needs them equal)
    head_dim: int = 64
    v_head_dim: int = 64
    short_conv_kernel_size: int = 4
    kda_lower_bound: float = -5.0  # the safe gate (kda_safe_gate), Ling's
    # MLA at Ling-3.0's latent widths: SGLang's Triton MLA decode kernel takes kv_lora_rank +
    # qk_rope_head_dim of 576 (512 + 64) or 288 only (rule sglang-triton-mla-widths; 128 + 128 died
    # on the H200, session 12). Every other linear weight is whole 128-blocks (the -fp8 layout);
    # kv_a_proj_with_mqa's 576 rows end in a ragged block, as Ling's own -fp8 checkpoint does.
    q_lora_rank: int = 128
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 64
    first_k_dense_replace: int = 1
    num_experts: int = 8
    num_experts_per_tok: int = 2
    n_group: int = 2
    topk_group: int = 1
    routed_scaling_factor: float = 2.5
    moe_intermediate_size: int = 128
    shared_expert_intermediate_size: int = 128
    num_nextn_predict_layers: int = 1
    max_position_embeddings: int = 2048
    rope_theta: float = 600000.0
    rms_norm_eps: float = 1e-6
    bos_token_id: int = 256
    eos_token_id: int = 257
    pad_token_id: int = 258
    architectures: list[str] = field(default_factory=lambda: [MODEL_CLASS])
    model_type: str = "tiny_ling_v3"
    torch_dtype: str = "float32"
    sparkit: dict = field(default_factory=dict)  # builder metadata

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def top_k(self) -> int:
        return self.num_experts_per_tok

    def is_kda(self, layer: int) -> bool:
        return (layer + 1) % self.layer_group_size != 0

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TinyLingV3Config:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, directory: Path) -> None:
        (Path(directory) / "config.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n")


class BailingV3MoE(MoE):
    """tiny-ling's expert holder and shared expert with BailingMoeV3's router (BailingMoEGate +
    biased grouped top-k, sglang/srt/layers/moe/topk.py biased_grouped_topk_impl)."""

    def __init__(self, cfg: TinyLingV3Config):
        super().__init__(cfg)
        self.n_group, self.topk_group, self.scaling = cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor
        # not trained by gradient: moved towards balance after each step (update_bias), as Ling's
        # auxiliary-loss-free balancing does
        self.register_buffer("expert_bias", torch.zeros(cfg.num_experts))
        self.load = None  # tokens per expert of the last training batch

    def route(self, flat):
        n, E = flat.shape[0], self.num_experts
        scores = F.linear(flat.float(), self.gate.weight.float()).sigmoid()  # router_dtype fp32
        choice = scores + self.expert_bias.float()
        groups = choice.view(n, self.n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
        best_groups = groups.topk(self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(groups).scatter_(1, best_groups, 1.0)
        mask = group_mask.unsqueeze(-1).expand(n, self.n_group, E // self.n_group).reshape(n, E).bool()
        topi = choice.masked_fill(~mask, float("-inf")).topk(self.top_k, dim=-1, sorted=False)[1]
        topw = scores.gather(1, topi)
        topw = topw / (topw.sum(dim=-1, keepdim=True) + RENORMALIZE_EPS) * self.scaling
        if self.training:
            routed = F.one_hot(topi, E).float().sum(dim=(0, 1))
            self.load = routed
            probs = scores / scores.sum(dim=-1, keepdim=True)
            self.aux_loss = E * (routed / topi.numel() * probs.mean(dim=0)).sum()
        return topi, topw.to(flat.dtype)

    @torch.no_grad()
    def update_bias(self, rate: float) -> None:
        """Raise the bias of experts that got fewer tokens than the mean, lower the others'."""
        if self.load is not None:
            self.expert_bias += rate * torch.sign(self.load.mean() - self.load)
            self.load = None


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TinyLingV3Config, layer: int, nextn: bool = False):
        super().__init__()
        self.kda = not nextn and cfg.is_kda(layer)
        eps = cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        if self.kda:
            self.attention = KimiDeltaAttention(cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim,
                                                cfg.short_conv_kernel_size, cfg.kda_lower_bound)
        else:
            self.attention = GatedMLA(cfg.hidden_size, cfg.num_attention_heads, cfg.q_lora_rank, cfg.kv_lora_rank,
                                      cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.moe = nextn or cfg.is_moe(layer)
        self.mlp = BailingV3MoE(cfg) if self.moe else SharedExpert(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, rope, cache=None, layer: int = 0, start: int = 0, last_only: bool = False):
        h = self.input_layernorm(x)
        if self.kda:
            state = cache.kda[layer] if cache is not None else None
            attn = self.attention(h, state, keep_steps=cache is not None and cache.keep_steps)
            if last_only:
                attn = attn[:, -1:]
        else:
            mla = cache.mla if cache is not None else None
            attn = self.attention(h, rope, mla, cache.mla_index[layer] if cache is not None else 0, start, last_only)
        x = (x[:, -1:] if last_only else x) + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class HybridCache:
    """The target's cache for batch 1: the MLA layers' K/V (MlaCache) and each KDA layer's state.

    `length` is the committed length. A forward of T tokens at `start` (== the position the KDA
    states are at, or 0: a new sequence) advances the states to start + T and, when it continues
    a sequence (or is short), keeps the state after each token; setting `length` to a position
    inside that forward restores the state there (the rollback after a rejected draft)."""

    def __init__(self, model: TinyLingV3ForCausalLM, max_len: int, dtype, device):
        cfg = model.config
        mla_layers = [i for i in range(cfg.num_hidden_layers) if not cfg.is_kda(i)]
        self.mla_index = {layer: j for j, layer in enumerate(mla_layers)}
        self.mla = MlaCache(len(mla_layers), cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim,
                            cfg.v_head_dim, max_len, dtype, device)
        self._fresh = {i: model.layers[i].attention.new_state(dtype, device)
                       for i in range(cfg.num_hidden_layers) if cfg.is_kda(i)}
        self.kda = {i: state.clone() for i, state in self._fresh.items()}
        self.max_len = max_len
        self._length = 0
        self._state_at = 0  # the position the KDA states are at
        self._forward: tuple[int, dict] | None = None  # (start, the states before it) of the last forward
        self.keep_steps = False

    def begin(self, start: int, tokens: int) -> None:
        """Called by the model before a forward of `tokens` tokens at `start`."""
        if start == 0:
            self._reset()
        elif start != self._state_at:
            raise ValueError(f"a forward at position {start}, but the linear-attention state is at {self._state_at}")
        self.keep_steps = start > 0 or tokens <= MAX_ROLLBACK_TOKENS
        self._forward = (start, {i: s.clone() for i, s in self.kda.items()}) if self.keep_steps else None
        self._state_at = start + tokens

    def _reset(self) -> None:
        self.kda = {i: state.clone() for i, state in self._fresh.items()}
        self._state_at, self._forward = 0, None

    @property
    def length(self) -> int:
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        if value == 0:
            self._reset()
        elif value != self._state_at:
            start, before = self._forward if self._forward is not None else (None, None)
            if start is None or not start <= value < self._state_at:
                raise ValueError(f"cannot roll the linear-attention state back from {self._state_at} to {value}")
            for i, state in self.kda.items():
                if value == start:
                    state.conv, state.ssm = before[i].conv, before[i].ssm
                else:
                    state.conv, state.ssm = state.steps[value - start - 1]
                state.steps = []
            self._state_at = value
        self._length = value

    def truncate(self, length: int) -> None:
        self.length = length


class NextNLayer(nn.Module):
    """The MTP layer: enorm, hnorm, eh_proj, a decoder layer (gated MLA + MoE), the head norm."""

    def __init__(self, cfg: TinyLingV3Config):
        super().__init__()
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.decoder = DecoderLayer(cfg, 0, nextn=True)
        self.shared_head_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden, next_embeds, rope, cache: MlaCache | None = None, start: int = 0, last_only: bool = False):
        x = self.eh_proj(torch.cat((self.enorm(next_embeds), self.hnorm(hidden)), dim=-1))
        h = self.decoder.input_layernorm(x)
        attn = self.decoder.attention(h, rope, cache, 0, start, last_only)
        x = (x[:, -1:] if last_only else x) + attn
        return x + self.decoder.mlp(self.decoder.post_attention_layernorm(x))

    def prepare_inference(self) -> bool:
        return False  # no fast path: the modules run as they are


class TinyLingV3ForCausalLM(nn.Module):
    # the engine decodes its running sequences one forward each (a KDA state per sequence; tiny-ling's
    # row batches are built on its fast path's products): batching.check_rows reads this
    row_batches = False

    def __init__(self, cfg: TinyLingV3Config):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.mtp = NextNLayer(cfg)
        self.rope = InterleavedRope(cfg.qk_rope_head_dim, cfg.max_position_embeddings, cfg.rope_theta)

    def forward_hidden(self, input_ids, cache: HybridCache | None = None, start: int = 0, capture: tuple[int, ...] = ()):
        """input_ids [B, T] -> hidden states [B, T, H] after the final norm (what the lm_head reads
        and SGLang hands a NextN draft). With `capture` (layer indices), also the residual stream
        after each of those layers (before the final norm), concatenated in that order
        [B, T, len(capture) * H] as tiny-ling's forward_hidden gives it -- what SGLang's
        set_dspark_layers_to_capture hands a DSpark draft ("hidden_states + residual")."""
        if cache is not None:
            cache.begin(start, input_ids.shape[1])
        x = self.embed_tokens(input_ids)
        captured = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, self.rope, cache, i, start)
            if i in capture:
                captured[i] = x
        hidden = self.norm(x)
        if not capture:
            return hidden
        return hidden, torch.cat([captured[i] for i in capture], dim=-1)

    def prepare_inference(self) -> bool:
        return False

    def logits(self, hidden):
        return self.lm_head(hidden)

    def new_cache(self, max_len: int, dtype=None, device=None) -> HybridCache:
        p = self.embed_tokens.weight
        return HybridCache(self, max_len, dtype or p.dtype, device or p.device)

    def new_pool(self, slots: int, max_len: int, dtype, device) -> SequenceCaches:
        """A cache per sequence running at once (a KDA state and an MLA cache are not one buffer's slots)."""
        return SequenceCaches(slots, lambda: self.new_cache(max_len, dtype, device))

    def nextn_draft(self, nextn: NextNLayer, lm_head: nn.Module) -> TinyLingV3ForCausalLMNextN:
        return TinyLingV3ForCausalLMNextN(nextn, self.embed_tokens, lm_head, self.rope, self.config)


class TinyLingV3ForCausalLMNextN:
    """The draft: the NextN layer plus *references* to the target's embedding and lm_head."""

    model_class = DRAFT_CLASS

    def __init__(self, nextn: NextNLayer, embed_tokens: nn.Embedding, lm_head: nn.Module, rope, config: TinyLingV3Config):
        self.nextn, self.embed_tokens, self.lm_head, self.rope, self.config = nextn, embed_tokens, lm_head, rope, config

    def forward_hidden(self, hidden, next_ids, cache: MlaCache | None = None, start: int = 0, last_only: bool = False):
        out = self.nextn(hidden, self.embed_tokens(next_ids), self.rope, cache, start, last_only)
        return self.nextn.shared_head_norm(out)

    def logits(self, mtp_hidden):
        return self.lm_head(mtp_hidden)

    def new_cache(self, max_len: int, dtype, device) -> MlaCache:
        cfg = self.config
        return MlaCache(1, cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim,
                        max_len, dtype, device)

    def new_pool(self, slots: int, max_len: int, dtype, device) -> SequenceCaches:
        return SequenceCaches(slots, lambda: self.new_cache(max_len, dtype, device))


def training_loss(model: TinyLingV3ForCausalLM, batch, mtp_weight: float = 1.0, aux_weight: float = 0.01):
    """Next-token loss + the NextN layer's t+2 loss (on the target's detached normed hidden states)
    + load balancing, as tiny-ling's."""
    inputs = batch[:, :-1]
    hidden = model.forward_hidden(inputs)
    logits = model.logits(hidden)
    loss_main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    mtp_hidden = model.mtp(hidden[:, :-1].detach(), model.embed_tokens(batch[:, 1:-1]), model.rope)
    mtp_logits = model.lm_head(model.mtp.shared_head_norm(mtp_hidden))
    loss_mtp = F.cross_entropy(mtp_logits.reshape(-1, mtp_logits.shape[-1]), batch[:, 2:].reshape(-1))
    aux = sum(m.aux_loss for m in model.modules() if isinstance(m, MoE) and m.aux_loss is not None)
    total = loss_main + mtp_weight * loss_mtp + aux_weight * aux
    return total, loss_main.detach(), loss_mtp.detach()


BIAS_UPDATE_RATE = 1e-3  # per optimiser step (DeepSeek-V3's auxiliary-loss-free balancing uses this order)


def after_step(model: TinyLingV3ForCausalLM) -> None:
    for module in model.modules():
        if isinstance(module, BailingV3MoE):
            module.update_bias(BIAS_UPDATE_RATE)
