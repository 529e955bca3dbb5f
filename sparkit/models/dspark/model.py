"""The DSpark block draft (SGLang 0.5.23's LingDSparkModel) in PyTorch: what it sees, what it
predicts, and how it is trained.

What the draft sees (SGLang: speculative/dspark_components/dspark_worker_v2.py `_forward_prefill`,
`_forward_decode`; dspark_verify.py `commit_hidden`; models/dspark.py `write_target_hidden_kv`):
  - context: for every committed position p, the target's residual stream after each layer of
    `target_layer_ids` (before any norm: BailingMoeV3's `set_dspark_layers_to_capture` captures
    the updated residual after layer i, `final_norm_pair`'s capture before the final norm for the
    last layer), concatenated in that order: [K * H_target]. `project_context` maps it to the
    draft's width, ctx = hidden_norm(fc(features)) (models/dflash.py `project_target_hidden`), and
    every draft layer writes its own K/V of ctx into the draft's cache at p: k = RoPE_p(k_norm(
    k_proj(ctx))), v = v_proj(ctx) (`write_target_hidden_kv`: the same ctx for every layer, never
    passed through a layer). The prefill writes the prompt's positions; after each verify the
    anchor's and the accepted drafts' (their features from the verify forward: commit_lens).
  - the block (dspark_draft.py `DraftBlockProposer._run_forward`, sample_from_anchor true): the
    anchor (the last committed token, the bonus of the previous step, not yet in either cache) at
    position m, and block_size - 1 mask tokens at m+1..m+block_size-1, embedded with the target's
    own embedding. The draft layers (Qwen3's: q/k norms, NeoX RoPE, SwiGLU) attend with no causal
    mask (DFlashAttention without layer_types is ENCODER_ONLY): each block position sees every
    context position < m and every block position. The block's own K/V are scratch.
What it predicts (dspark_draft.py `draft_markov_block`, models/dspark.py `compute_base_logits`,
`VanillaMarkov.step_bias`, `DSparkConfidenceHead.predict`):
  - base logits: the target's lm_head (the module itself) of norm(h_i) for each block row i;
  - step i's logits: base_i + markov_w2(markov_w1(prev_i)), prev_0 = the anchor, prev_i = the token
    drafted at step i-1; the draft token d_i is their argmax (greedy) or a sample at the request's
    temperature. Row i drafts the token at position m+1+i, so a block proposes block_size tokens;
  - confidence_i = sigmoid(proj([h_i ; markov_w1(prev_i)])), the probability that d_i is accepted
    given d_0..d_{i-1} were (SGLang multiplies them into survival for its ragged verify budget,
    dspark_schedule.py `compute_sort_survival`; its default static verify does not build the head).
The target then verifies [anchor, d_0..d_{block_size-1}] in one forward (block_size + 1 rows);
greedy: accept the longest prefix where d_i equals the target's argmax of row i, plus the
target's token after it (dflash.py `compute_dflash_correct_drafts_and_bonus`).

The embedding and the lm_head are the target's modules, attached, never owned or stored
(`attach_shared`; SGLang's `attach_shared_modules`): whatever the head's quantisation (the FP8 head
included), the draft computes with it.

Shapes: inference is batch 1 ([T, H]); training takes [B, T, H] (sparkit.models.dspark.training).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from sparkit.models.dspark.config import ARCHITECTURE, DSparkConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def neox_rope(x, cos, sin):
    """RoPE over the last dim in halves (GPT-NeoX, SGLang's is_neox_style): x [..., T, D], cos/sin [T, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, max_pos: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def tables(self, positions, dtype):
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


class DraftAttention(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        H = cfg.hidden_size
        self.q_proj = nn.Linear(H, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(H, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(H, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, H, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def keys_values(self, x, cos, sin):
        """x [..., T, H] -> k, v [..., kv_heads, T, head_dim] (k normed and rotated)."""
        *lead, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(*lead, T, self.kv_heads, self.head_dim)).transpose(-3, -2)
        v = self.v_proj(x).view(*lead, T, self.kv_heads, self.head_dim).transpose(-3, -2)
        return neox_rope(k, cos, sin), v

    def forward(self, x, cos, sin, context_k, context_v, mask=None):
        """Block rows x [..., T, H] attending to the context K/V [..., kv_heads, C, D] and to the
        block's own K/V (no causal mask; `mask` [T, C + T] restricts what each row sees)."""
        *lead, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(*lead, T, self.heads, self.head_dim)).transpose(-3, -2)
        q = neox_rope(q, cos, sin)
        k, v = self.keys_values(x, cos, sin)
        keys, values = torch.cat((context_k, k), dim=-2), torch.cat((context_v, v), dim=-2)
        if self.kv_heads != self.heads:
            group = self.heads // self.kv_heads
            keys, values = keys.repeat_interleave(group, dim=-3), values.repeat_interleave(group, dim=-3)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.transpose(-3, -2).reshape(*lead, T, -1))


class DraftMLP(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, x, cos, sin, context_k, context_v, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context_k, context_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class VanillaMarkov(nn.Module):
    """SGLang's VanillaMarkov: a rank-r bias on step i's logits from the token before it."""

    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.markov_w1 = nn.Embedding(cfg.vocab_size, cfg.markov_rank)
        self.markov_w2 = nn.Linear(cfg.markov_rank, cfg.vocab_size, bias=False)

    def bias(self, prev_tokens):
        return self.markov_w2(self.markov_w1(prev_tokens))


class ConfidenceHead(nn.Module):
    """SGLang's DSparkConfidenceHead (with_markov): a logit from [h_i ; markov_w1(prev_i)]."""

    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.hidden_size + cfg.markov_rank, 1, bias=True)

    def forward(self, hidden, prev_embeds):
        return self.proj(torch.cat((hidden, prev_embeds.to(hidden.dtype)), dim=-1)).squeeze(-1)


class DraftCache:
    """The draft's K/V per layer for batch 1: k, v [layers, kv_heads, max_len, head_dim]; positions
    below `length` hold the committed context. A rejected draft costs no rollback: a block's own
    K/V never enter the cache, and the next commit overwrites what lies past the committed length."""

    def __init__(self, cfg: DSparkConfig, max_len: int, dtype, device):
        shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        self.max_len = max_len


class LingDSparkModel(nn.Module):
    """The draft's own weights (SGLang's names, sparkit.models.dspark.config) and, once attached,
    references to the target's embedding and lm_head modules (not submodules: never in the
    state dict, never copied)."""

    model_class = ARCHITECTURE

    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        problems = cfg.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.config = cfg
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.markov_head = VanillaMarkov(cfg)
        self.confidence_head = ConfidenceHead(cfg) if cfg.enable_confidence_head else None
        self.rotary = Rotary(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        self._shared: tuple[nn.Module, nn.Module] | None = None

    # -- the target's modules
    def attach_shared(self, embed_tokens: nn.Module, lm_head: nn.Module) -> None:
        """Compute with the target's own embedding and lm_head modules (held by reference)."""
        self._shared = (embed_tokens, lm_head)

    @property
    def embed_tokens(self) -> nn.Module:
        if self._shared is None:
            raise RuntimeError("the draft has no embedding: attach the target's (attach_shared) first")
        return self._shared[0]

    @property
    def lm_head(self) -> nn.Module:
        if self._shared is None:
            raise RuntimeError("the draft has no lm_head: attach the target's (attach_shared) first")
        return self._shared[1]

    # -- the context
    def project_context(self, features):
        """Captured target features [..., T, K*H] -> the context hidden [..., T, H]."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, ctx, positions):
        """Each layer's K/V of the context hidden ctx [..., T, H] at `positions` [T]:
        a list of (k, v) [..., kv_heads, T, D]."""
        cos, sin = self.rotary.tables(positions, ctx.dtype)
        return [layer.self_attn.keys_values(ctx, cos, sin) for layer in self.layers]

    def write_context(self, features, cache: DraftCache, start: int) -> None:
        """Write the context of positions start.. (features [n, K*H]) into the cache; the cache's
        committed length becomes start + n."""
        n = features.shape[0]
        if start + n > cache.max_len:
            raise ValueError(f"sequence length {start + n} exceeds the draft cache ({cache.max_len})")
        positions = torch.arange(start, start + n, device=features.device)
        for i, (k, v) in enumerate(self.context_kv(self.project_context(features), positions)):
            cache.k[i, :, start:start + n] = k
            cache.v[i, :, start:start + n] = v
        cache.length = start + n

    # -- a block
    def block_hidden(self, anchor: int, cache: DraftCache, position: int):
        """The draft's hidden states after its final norm [block_size, H] for the block anchored at
        `position` (the anchor token, then mask tokens), over the context below `position`."""
        cfg = self.config
        device = cache.k.device
        ids = torch.full((cfg.block_size,), cfg.mask_token_id, dtype=torch.long, device=device)
        ids[0] = anchor
        x = self.embed_tokens(ids)
        cos, sin = self.rotary.tables(torch.arange(position, position + cfg.block_size, device=device), x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.k[i, :, :position], cache.v[i, :, :position])
        return self.norm(x)

    def base_logits(self, hidden):
        """The target's lm_head of the draft's normed hidden states (SGLang's compute_base_logits)."""
        return self.lm_head(hidden)

    def confidence(self, hidden, prev_tokens):
        """P(draft i accepted | the drafts before it were) for each block row [block_size]."""
        if self.confidence_head is None:
            return None
        prev = self.markov_head.markov_w1(prev_tokens)
        return torch.sigmoid(self.confidence_head(hidden.float(), prev.float()))

    def propose(self, anchor: int, cache: DraftCache, position: int, pick, vocab_limit: int):
        """One block: (the drafted tokens, the corrected logits each was picked from [vocab_limit],
        the draft's hidden states [block_size, H]). `pick(logits)` chooses a token (argmax, or a
        sample at the request's temperature); the Markov bias of each step follows the token
        picked before it."""
        hidden = self.block_hidden(anchor, cache, position)
        base = self.base_logits(hidden)[:, :vocab_limit].float()
        w1, w2 = self.markov_head.markov_w1.weight, self.markov_head.markov_w2.weight
        tokens, rows = [], []
        prev = anchor
        for i in range(self.config.block_size):
            logits = base[i] + torch.mv(w2[:vocab_limit], w1[prev]).float()
            prev = pick(logits)
            tokens.append(prev)
            rows.append(logits)
        return tokens, rows, hidden
