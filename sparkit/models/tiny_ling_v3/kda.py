"""Kimi Delta Attention (KDA) as SGLang 0.5.23's BailingMoeV3 runs it (models/bailing_moe_v3.py
BailingKDA over models/kimi_linear.py KimiDeltaAttention, without the f/g LoRA: `no_kda_lora`),
in PyTorch: a chunked form for training and prefill, a recurrent one for decode and verify.

Per token t and head h (SGLang's Triton kernels, kernels/ops/attention/fla/kda.py and
fused_recurrent.py, and its decode kernel, linear/fused_sigmoid_gating_recurrent.py):

    q, k, v  = silu(causal depthwise conv1d (width `conv_size`, no bias) of their projections)
    q, k     = l2norm(q), l2norm(k)      x / sqrt(sum x^2 + 1e-6), per head;  q *= head_dim^-0.5
    g        = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias))          (the safe gate, Ling's)
             | -exp(A_log[h]) * softplus(f + dt_bias)                          (without kda_safe_gate)
    beta     = sigmoid(b)
    S        = S * exp(g)[None, :]                    S [V, K]: the per-channel decay of the state
    S        = S + (beta * (v - S @ k)) outer k       the delta rule
    o        = S @ q
    out      = o_proj(rmsnorm(o) * o_norm.weight * sigmoid(g_proj(x)))       (FusedRMSNormGated)

The chunked form computes the same function over chunks of CHUNK tokens (the WY form of the delta
rule with per-channel decay, as flash-linear-attention's chunk_kda); the two agree to float
rounding (tests/models/test_tiny_ling_v3.py). The state a layer carries between calls is
KdaState: the last conv_size-1 projected inputs (the conv window) and S; a verify step keeps the
state after each of its tokens, so that a rejected draft rolls back (SGLang keeps per-draft
intermediate states for the same reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

CHUNK = 16  # tokens per chunk of the chunked form: exp of a chunk's decay stays finite (16 * 5 < 88)
L2NORM_EPS = 1e-6  # SGLang's kernels: x / sqrt(sum(x^2) + 1e-6)
O_NORM_EPS = 1e-6  # BailingKDA passes rms_norm_eps=1e-6 to KimiDeltaAttention's o_norm


@dataclass
class KdaState:
    """One KDA layer's carried state for batch 1: the conv window [conv_size-1, 3P] (the raw q, k,
    v projections of the last tokens) and the recurrent state S [H, V, K] (float32)."""

    conv: torch.Tensor
    ssm: torch.Tensor
    # after a forward of several tokens: the (conv, ssm) after each of them, for rollback
    steps: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def clone(self) -> KdaState:
        return KdaState(self.conv.clone(), self.ssm.clone())


def l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def causal_conv(x, weight, window=None):
    """silu(depthwise causal conv) of x [B, T, C] with weight [C, W] over the window of the W-1
    previous inputs [B, W-1, C] (zeros at the start of a sequence): SGLang's causal_conv1d_fn /
    causal_conv1d_update with activation silu."""
    B, T, C = x.shape
    W = weight.shape[-1]
    if window is None:
        window = x.new_zeros(B, W - 1, C)
    padded = torch.cat((window, x), dim=1)  # [B, W-1+T, C]
    frames = padded.unfold(1, W, 1)  # [B, T, C, W]
    return F.silu((frames * weight).sum(-1)), padded[:, -(W - 1):]


def recurrent(q, k, v, g, beta, state):
    """Token by token. q, k [B, T, H, K] (normed, q scaled), v [B, T, H, V], g [B, T, H, K] (log
    decay), beta [B, T, H]; state S [B, H, V, K] -> (o [B, T, H, V], S after each token: list)."""
    steps = []
    outs = []
    S = state
    for t in range(q.shape[1]):
        S = S * g[:, t].exp().unsqueeze(-2)
        kt = k[:, t]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhvk,bhk->bhv", S, kt))
        S = S + u.unsqueeze(-1) * kt.unsqueeze(-2)
        outs.append(torch.einsum("bhvk,bhk->bhv", S, q[:, t]))
        steps.append(S)
    return torch.stack(outs, dim=1), steps


def chunked(q, k, v, g, beta, state, chunk: int = CHUNK):
    """The same function by chunks (the WY form): within a chunk of C tokens with cumulative log
    decay G (per channel), the delta-rule updates U solve (I + M) U = beta * (V - (exp(G) * K) S0)
    with M[i, j] = beta_i sum_k k_i k_j exp(G_i - G_j) for j < i; then
    O = (q * exp(G)) S0 + Aqk U with Aqk[i, j] = sum_k q_i k_j exp(G_i - G_j) for j <= i, and
    S_end = exp(G_last) S0 + sum_j (exp(G_last - G_j) * k_j) u_j. exp(G_i - G_j) is formed as
    exp(G_i) * exp(-G_j): with the safe gate's lower bound (> -5 a token) and 16 tokens a chunk,
    |G| < 80 and both factors stay normal float32 numbers. -> (o, final S [B, H, V, K])."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    pad = (-T) % chunk
    if pad:  # padded tokens come last: zero k and beta leave the state alone, their outputs are dropped
        q, k, v, g = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    n = (T + pad) // chunk
    # [B, H, N, C, D]
    q, k, v, g = (x.view(B, n, chunk, H, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v, g))
    beta = beta.view(B, n, chunk, H).permute(0, 3, 1, 2)
    G = g.cumsum(-2)
    grow, shrink = G.exp(), (-G).exp()
    k_in, k_out = k * grow, k * shrink
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    M = (beta.unsqueeze(-1) * (k_in @ k_out.transpose(-1, -2))).masked_fill(~causal.tril(-1), 0.0)  # j < i
    A = M + torch.eye(chunk, dtype=q.dtype, device=q.device)
    u_part = torch.linalg.solve_triangular(A, beta.unsqueeze(-1) * v, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(A, beta.unsqueeze(-1) * k_in, upper=False, unitriangular=True)
    q_in = q * grow
    Aqk = (q_in @ k_out.transpose(-1, -2)).masked_fill(~causal, 0.0)
    last = grow[..., -1:, :]  # [B, H, N, 1, K]: exp(G_last)
    k_to_end = k_out * last
    S = state.transpose(-1, -2)  # [B, H, K, V]
    outs = []
    for i in range(n):
        U = u_part[:, :, i] - w[:, :, i] @ S  # [B, H, C, V]
        outs.append(q_in[:, :, i] @ S + Aqk[:, :, i] @ U)
        S = last[:, :, i].transpose(-1, -2) * S + k_to_end[:, :, i].transpose(-1, -2) @ U
    o = torch.stack(outs, dim=2).reshape(B, H, n * chunk, V).transpose(1, 2)
    return o[:, :T], S.transpose(-1, -2)


class GatedRMSNorm(nn.Module):
    """rmsnorm(x) * weight * sigmoid(gate) over the last dimension (SGLang's FusedRMSNormGated with
    activation sigmoid)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, gate):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps) * torch.sigmoid(gate)


class KimiDeltaAttention(nn.Module):
    """One KDA layer (BailingKDA without LoRA). Tensor names are the checkpoint's."""

    def __init__(self, hidden: int, num_heads: int, head_dim: int, conv_size: int, lower_bound: float | None):
        super().__init__()
        self.num_heads, self.head_dim, self.conv_size, self.lower_bound = num_heads, head_dim, conv_size, lower_bound
        inner = num_heads * head_dim
        self.q_proj = nn.Linear(hidden, inner, bias=False)
        self.k_proj = nn.Linear(hidden, inner, bias=False)
        self.v_proj = nn.Linear(hidden, inner, bias=False)
        self.f_proj = nn.Linear(hidden, inner, bias=False)
        self.g_proj = nn.Linear(hidden, inner, bias=False)
        self.b_proj = nn.Linear(hidden, num_heads, bias=False)
        # depthwise conv weights as checkpoints store them: [channels, 1, width]
        self.q_conv1d = nn.Parameter(torch.randn(inner, 1, conv_size) * conv_size**-0.5)
        self.k_conv1d = nn.Parameter(torch.randn(inner, 1, conv_size) * conv_size**-0.5)
        self.v_conv1d = nn.Parameter(torch.randn(inner, 1, conv_size) * conv_size**-0.5)
        self.A_log = nn.Parameter(torch.zeros(num_heads))
        self.dt_bias = nn.Parameter(torch.zeros(inner))
        self.o_norm = GatedRMSNorm(head_dim, O_NORM_EPS)
        self.o_proj = nn.Linear(inner, hidden, bias=False)

    def new_state(self, dtype, device) -> KdaState:
        inner = self.num_heads * self.head_dim
        return KdaState(torch.zeros(1, self.conv_size - 1, 3 * inner, dtype=dtype, device=device),
                        torch.zeros(1, self.num_heads, self.head_dim, self.head_dim, dtype=torch.float32, device=device))

    def _gate(self, f):
        A = self.A_log.float().exp().view(1, 1, self.num_heads, 1)
        x = f.float() + self.dt_bias.float().view(self.num_heads, self.head_dim)
        if self.lower_bound is not None:
            return self.lower_bound * torch.sigmoid(A * x)
        return -A * F.softplus(x)

    def forward(self, x, state: KdaState | None = None, keep_steps: bool = False):
        """x [B, T, hidden] -> [B, T, hidden]. With `state` (batch 1): continue from it and update
        it in place (the recurrent form, keeping the state after each token when `keep_steps`);
        without: a sequence from its start (the chunked form: training)."""
        B, T, _ = x.shape
        H, D = self.num_heads, self.head_dim
        mixed = torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1)  # [B, T, 3P]
        weight = torch.cat((self.q_conv1d, self.k_conv1d, self.v_conv1d)).squeeze(1)  # [3P, W]
        window = state.conv if state is not None else None
        conv_inputs = mixed
        mixed, new_window = causal_conv(mixed, weight.to(mixed.dtype), window)
        q, k, v = (t.reshape(B, T, H, D).float() for t in mixed.chunk(3, dim=-1))
        q = l2norm(q) * D**-0.5
        k = l2norm(k)
        g = self._gate(self.f_proj(x).view(B, T, H, D))
        beta = torch.sigmoid(self.b_proj(x).float())
        if state is None:
            o, _ = chunked(q, k, v, g, beta, x.new_zeros(B, H, D, D, dtype=torch.float32))
        elif T > CHUNK and not keep_steps:
            o, state.ssm = chunked(q, k, v, g, beta, state.ssm)
            state.conv = new_window
            state.steps = []
        else:
            o, steps = recurrent(q, k, v, g, beta, state.ssm)
            state.ssm = steps[-1]
            if keep_steps:
                padded = torch.cat((state.conv, conv_inputs), dim=1)
                W = self.conv_size
                state.steps = [(padded[:, t + 1 : t + W], s) for t, s in enumerate(steps)]
            else:
                state.steps = []
            state.conv = new_window
        o = self.o_norm(o.to(x.dtype), self.g_proj(x).view(B, T, H, D))
        return self.o_proj(o.reshape(B, T, H * D))
