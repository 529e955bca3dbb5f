"""Gated multi-head latent attention as SGLang 0.5.23's BailingMoeV3 runs it (DsV3MLA in
models/bailing_moe_v3.py over DeepseekV2AttentionMLA, with `gated_attention_proj_granularity_type:
head_wise`), in PyTorch:

    q            = q_b_proj(rmsnorm(q_a_proj(x)))                 [heads, nope + rope]
    c, k_pe      = kv_a_proj_with_mqa(x)                          [kv_lora], [rope] (one, shared)
    k_nope, v    = kv_b_proj(rmsnorm(c))                          [heads, nope], [heads, v]
    q_pe, k_pe   = RoPE (interleaved pairs: `rope_interleave`, SGLang's is_neox_style False)
    o            = softmax((q . k) * (nope + rope)^-0.5) v        causal
    out          = o_proj(o * sigmoid(g_proj(x))[heads, None])    the head-wise output gate

RoPE: SGLang makes it `deepseek_yarn` whenever the config has rope parameters; with no `factor`
(1.0) that is the plain rotation at `rope_theta` (inv_freq unchanged, mscale 1), which this module
computes. The cache keeps k ([nope; rope]) and v per head for each position (SGLang caches the
latent c and k_pe and absorbs kv_b_proj into the query; the same function, another cost).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class MlaCache:
    """K/V of the MLA layers for batch 1: k [layers, heads, max_len, nope+rope], v [layers,
    heads, max_len, v], and the committed length. Rolling back is `truncate(n)`: later entries
    are overwritten by the next write."""

    def __init__(self, num_layers: int, num_heads: int, k_dim: int, v_dim: int, max_len: int, dtype, device):
        self.k = torch.zeros((num_layers, num_heads, max_len, k_dim), dtype=dtype, device=device)
        self.v = torch.zeros((num_layers, num_heads, max_len, v_dim), dtype=dtype, device=device)
        self.length = 0
        self.max_len = max_len

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length


class InterleavedRope(nn.Module):
    """RoPE over pairs (x[2i], x[2i+1]) (GPT-J style) of the last `dim` features."""

    def __init__(self, dim: int, max_pos: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, x, start: int):
        T = x.shape[-2]
        cos = self.cos[start : start + T].to(x.dtype)
        sin = self.sin[start : start + T].to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class GatedMLA(nn.Module):
    """One gated MLA layer. Tensor names are the checkpoint's."""

    def __init__(self, hidden: int, num_heads: int, q_lora_rank: int, kv_lora_rank: int, nope: int, rope: int,
                 v_dim: int, eps: float):
        super().__init__()
        self.num_heads, self.nope, self.rope_dim, self.v_dim, self.kv_lora_rank = num_heads, nope, rope, v_dim, kv_lora_rank
        self.q_a_proj = nn.Linear(hidden, q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(q_lora_rank, eps)
        self.q_b_proj = nn.Linear(q_lora_rank, num_heads * (nope + rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, kv_lora_rank + rope, bias=False)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, num_heads * (nope + v_dim), bias=False)
        self.o_proj = nn.Linear(num_heads * v_dim, hidden, bias=False)
        self.g_proj = nn.Linear(hidden, num_heads, bias=False)
        self.scaling = (nope + rope) ** -0.5

    def forward(self, x, rope: InterleavedRope, cache: MlaCache | None = None, layer: int = 0, start: int = 0,
                last_only: bool = False):
        """x [B, T, hidden]; with `cache` (batch 1) the layer's K/V go to positions start.. and the
        queries attend over 0..start+T. last_only: K/V for every position, the output for the last."""
        B, T, _ = x.shape
        H = self.num_heads
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, T, H, self.nope + self.rope_dim).transpose(1, 2)
        latent = self.kv_a_proj_with_mqa(x)
        c, k_pe = latent.split((self.kv_lora_rank, self.rope_dim), dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(B, T, H, self.nope + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split((self.nope, self.v_dim), dim=-1)
        q_pe = rope(q[..., self.nope :], start)
        k_pe = rope(k_pe.unsqueeze(1), start).expand(B, H, T, self.rope_dim)
        q = torch.cat((q[..., : self.nope], q_pe), dim=-1)
        k = torch.cat((k_nope, k_pe), dim=-1)
        gate = torch.sigmoid(self.g_proj(x).float()).to(x.dtype)  # [B, T, H]
        if cache is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling)
        else:
            end = start + T
            if end > cache.max_len:
                raise ValueError(f"sequence length {end} exceeds the cache ({cache.max_len})")
            cache.k[layer, :, start:end] = k[0]
            cache.v[layer, :, start:end] = v[0]
            keys, values = cache.k[layer : layer + 1, :, :end], cache.v[layer : layer + 1, :, :end]
            if last_only and T > 1:
                q, gate, T = q[:, :, -1:], gate[:, -1:], 1
            if T == 1:
                out = F.scaled_dot_product_attention(q, keys, values, scale=self.scaling)
            else:
                mask = torch.ones(T, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling)
        out = out.transpose(1, 2) * gate.unsqueeze(-1)  # [B, T, H, v]
        return self.o_proj(out.reshape(B, T, H * self.v_dim))
