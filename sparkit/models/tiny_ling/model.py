"""tiny-ling: Ling-3.0-flash in miniature (PyTorch).

Decoder layers (RMSNorm, causal attention with RoPE and a rollback-able KV cache, a MoE FFN
with E routed experts top-k plus one shared expert), a final norm and an lm_head; plus one
NextN MTP layer that predicts token t+2 from the hidden state at t and the embedding of token
t+1. The draft (TinyLingForCausalLMNextN) holds *references* to the target's embedding and
lm_head modules, so whatever the head's quantisation, the draft computes with it.

The function is exactly SGLang 0.5.23's BailingMoeV2 (models/bailing_moe.py and
bailing_moe_nextn.py) for the config sparkit.models.tiny_ling.hf_checkpoint writes: fused QKV
without bias or q/k norms, full-width NeoX RoPE, softmax routing renormalised over the top k, one
shared expert, no dense layers; and the NextN layer reads what SGLang hands its draft: the
target's hidden states *after* the final norm, and for a chained draft step its own output after
its final norm. So one checkpoint serves both engines with the same numbers (up to rounding).

Shapes: activations are [B, T, H]; inference runs B = 1, or several requests' rows side by side
([R, H], RowBatch: a request's rows get the same bits as alone).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from sparkit.models.formats import ARCHITECTURES  # declared where the preflight reads them
from sparkit.models.profiler_spans import span

MODEL_CLASS = ARCHITECTURES["tiny-ling"][0]
DRAFT_CLASS = "TinyLingForCausalLMNextN"


@dataclass
class TinyLingConfig:
    vocab_size: int = 264
    hidden_size: int = 128
    # Shape: see benchmarks/embedded_mtp_decode.py's docstring for the shapes measured for NEXTN
    # MTP on CPU (deeper models with narrow top-1 experts raise the MTP/plain ratio, but only by
    # slowing plain decoding down more than MTP gains).
    num_hidden_layers: int = 4
    # 2 heads of 64: SGLang 0.5.23's CUDA RoPE kernel takes head sizes 64/128/256/512 only; with
    # 32, its BailingMoeV2 fuses the KV-cache write into a fallback RoPE that cannot do it and the
    # first forward fails ("save kv cache is not supported for fallback_rotary_embedding", seen
    # on the H200).
    num_attention_heads: int = 2
    head_dim: int = 64
    num_experts: int = 8
    num_experts_per_tok: int = 2
    # Experts (and the shared expert) of width 128: the -fp8 layout's block-128 FP8 weights and the
    # -fp4 layout's MXFP4 groups of 32 both tile it exactly (SGLang refuses an FP8 block-quant MoE
    # whose per-partition intermediate size is not a multiple of the block; 192 was not).
    moe_intermediate_size: int = 128
    shared_expert_intermediate_size: int = 128
    num_nextn_predict_layers: int = 1
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    bos_token_id: int = 256
    eos_token_id: int = 257
    pad_token_id: int = 258
    architectures: list[str] = field(default_factory=lambda: [MODEL_CLASS])
    model_type: str = "tiny_ling"
    torch_dtype: str = "float32"
    sparkit: dict = field(default_factory=dict)  # builder metadata (seed, corpus, training stats)

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def top_k(self) -> int:
        return self.num_experts_per_tok

    def to_dict(self) -> dict:
        data = asdict(self)
        # HF-style aliases, for readers that expect them
        data["num_layers"] = self.num_hidden_layers
        data["top_k"] = self.num_experts_per_tok
        return data

    @classmethod
    def from_dict(cls, data: dict) -> TinyLingConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, directory: Path) -> None:
        (Path(directory) / "config.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> TinyLingConfig:
        return cls.from_dict(json.loads((Path(directory) / "config.json").read_text()))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class KVCache:
    """Per-layer K/V buffers [1, heads, max_len, head_dim] and a committed length.

    Rolling back after a rejected draft is `truncate(n)`: entries past n are simply
    overwritten by the next write, so rollback costs nothing. A cache a KVPool hands out is a view
    of one of its slots (`pool`, `slot`), so that a batched forward writes the K/V of every request
    in it with one indexed copy."""

    def __init__(self, num_layers: int, num_heads: int, head_dim: int, max_len: int, dtype, device,
                 buffer=None, pool: KVPool | None = None, slot: int | None = None):
        # K and V of a layer side by side in one buffer so that the fast path writes both with
        # one copy; k and v are views [num_layers, 1, heads, max_len, head_dim] of it.
        if buffer is None:
            buffer = torch.zeros((num_layers, 2, num_heads, max_len, head_dim), dtype=dtype, device=device)
        self.kv = buffer
        self.k = self.kv[:, 0].unsqueeze(1)
        self.v = self.kv[:, 1].unsqueeze(1)
        self.length = 0
        self.max_len = max_len
        self.pool, self.slot = pool, slot

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a KV cache of length {self.length} to {length}")
        self.length = length


class KVPool:
    """`slots` KV caches in one buffer [slots, layers, 2, heads, max_len, head_dim], one per request
    running at once. A zeroed buffer this size is mapped, not written: a slot's pages cost memory as
    far as its requests' sequences reach."""

    def __init__(self, slots: int, num_layers: int, num_heads: int, head_dim: int, max_len: int, dtype, device):
        self.buffer = torch.zeros((slots, num_layers, 2, num_heads, max_len, head_dim), dtype=dtype, device=device)
        self._shape = (num_layers, num_heads, head_dim, max_len)
        self._free = list(range(slots - 1, -1, -1))

    @property
    def slots(self) -> int:
        return self.buffer.shape[0]

    @property
    def in_use(self) -> int:
        return self.slots - len(self._free)

    def acquire(self) -> KVCache:
        if not self._free:
            raise RuntimeError(f"every KV cache slot is in use ({self.slots})")
        slot = self._free.pop()
        layers, heads, head_dim, max_len = self._shape
        return KVCache(layers, heads, head_dim, max_len, self.buffer.dtype, self.buffer.device,
                       buffer=self.buffer[slot], pool=self, slot=slot)

    def release(self, cache: KVCache) -> None:
        if cache.pool is not self or cache.slot in self._free:
            raise ValueError("not a slot of this pool in use")
        cache.length = 0
        self._free.append(cache.slot)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_pos: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        t = torch.arange(max_pos, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def fast_tables(self):
        """For the fast inference path (float32): a complex table [max_pos, 3, 1, head_dim/2] that
        rotates q and k (as interleaved pairs, see _interleave_rows) and leaves v as is (1 + 0i,
        exact), so one complex multiply applies RoPE to the whole qkv projection; and a causal mask
        [max_pos, max_pos] whose slice [start:end, :end] is the mask of a verify step."""
        tables = getattr(self, "_fast_tables", None)
        if tables is None or tables[0].device != self.cos.device:
            rotate = torch.complex(self.cos, self.sin)  # exactly cos + i sin (polar would round)
            identity = torch.complex(torch.ones_like(self.cos), torch.zeros_like(self.cos))
            table = torch.stack((rotate, rotate, identity), dim=1).unsqueeze(2).contiguous()
            n = self.cos.shape[0]
            mask = torch.ones(n, n, dtype=torch.bool, device=self.cos.device).tril()
            tables = self._fast_tables = (table, mask)
        return tables

    def forward(self, x, start: int):
        # x: [..., T, head_dim]; rotate halves (GPT-NeoX style)
        T = x.shape[-2]
        cos = self.cos[start : start + T].to(x.dtype)
        sin = self.sin[start : start + T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: TinyLingConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        inner = cfg.num_attention_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, 3 * inner, bias=False)
        self.o_proj = nn.Linear(inner, cfg.hidden_size, bias=False)

    def forward(self, x, rope: RotaryEmbedding, cache: KVCache | None = None, layer: int = 0, start: int = 0, last_only: bool = False):
        """last_only: write K/V for every position but attend for the last query only."""
        B, T, _ = x.shape
        qkv = self.qkv_proj(x).view(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = rope(qkv[:2], start).unbind(0)  # one rotary call for q and k
        v = qkv[2]
        if cache is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            end = start + T
            if end > cache.max_len:
                raise ValueError(f"sequence length {end} exceeds the KV cache ({cache.max_len})")
            cache.k[layer, :, :, start:end] = k
            cache.v[layer, :, :, start:end] = v
            keys, values = cache.k[layer, :, :, :end], cache.v[layer, :, :, :end]
            if last_only and T > 1:
                q, T = q[:, :, -1:], 1
            if T == 1:
                out = F.scaled_dot_product_attention(q, keys, values)
            else:
                # query i sits at position start+i and sees positions <= start+i
                mask = torch.ones(T, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class SharedExpert(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


# Up to this many tokens, gather the chosen experts' weights per token (decode and verify);
# beyond it loop over experts (prefill, training).
_GATHER_MAX_TOKENS = 8


class MoE(nn.Module):
    """E routed experts, softmax top-k routing (renormalised), plus one always-on shared expert.

    Expert weights are nn.Parameters while training; `quantize_experts(fmt)` replaces them by an
    ExpertWeights holder (bf16/fp8/mxfp4) that is dequantised in the forward."""

    def __init__(self, cfg: TinyLingConfig):
        super().__init__()
        E, H, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size  # noqa: E741 (the shape names of the comments)
        self.num_experts, self.top_k = E, cfg.num_experts_per_tok
        self.gate = nn.Linear(H, E, bias=False)
        self.w_gate_up = nn.Parameter(torch.randn(E, 2 * I, H) * H**-0.5)
        self.w_down = nn.Parameter(torch.randn(E, H, I) * I**-0.5)
        self.shared_expert = SharedExpert(H, cfg.shared_expert_intermediate_size)
        self.experts_gate_up = None  # ExpertWeights once quantised
        self.experts_down = None
        self.aux_loss = None

    @property
    def expert_format(self) -> str:
        return self.experts_gate_up.fmt if self.experts_gate_up is not None else "fp32"

    @property
    def quant_method_name(self) -> str:
        from sparkit.models.tiny_ling.quant import ExpertWeights

        return (self.experts_gate_up or ExpertWeights).method_name

    def quantize_experts(self, fmt: str, compute_dtype, corrupt_expert_index: bool = False,
                         from_checkpoint: bool = False) -> None:
        """from_checkpoint: the weights hold a quantised checkpoint's decoded values in `fmt`."""
        from sparkit.models.tiny_ling.quant import make_expert_weights

        self.experts_gate_up = make_expert_weights(self.w_gate_up.data, fmt, compute_dtype, from_checkpoint)
        self.experts_down = make_expert_weights(self.w_down.data, fmt, compute_dtype, from_checkpoint)
        if corrupt_expert_index:  # debug: see Fp8ExpertWeights.corrupt_expert_index
            self.experts_gate_up.corrupt_expert_index = self.experts_down.corrupt_expert_index = True
        del self.w_gate_up, self.w_down  # the quantised copy is the only one kept

    def experts_inter_size(self) -> int:
        full = self._all_experts()
        return full[1].shape[-1] if full is not None else -1

    def _weights(self):
        if self.experts_gate_up is not None:
            return self.experts_gate_up, self.experts_down
        return None, None

    def _all_experts(self):
        """All experts' weights in the compute dtype without decoding work (the trained parameters,
        or a decoded copy cached at load), else None."""
        if self.experts_gate_up is None:
            return self.w_gate_up, self.w_down
        if self.experts_gate_up.decoded is not None:
            return self.experts_gate_up.decoded, self.experts_down.decoded
        return None

    def route(self, flat):
        """(the top-k experts [n, k] of each token of flat [n, H], their weights [n, k]); while
        training also the load-balancing loss (aux_loss)."""
        router_logits = self.gate(flat)
        # softmax over the top-k logits == full softmax, top-k, renormalised (fewer ops per step)
        top_logits, topi = router_logits.topk(self.top_k, dim=-1)
        topw = top_logits.float().softmax(dim=-1).to(flat.dtype)
        if self.training:
            # Switch-style load balancing: fraction routed x mean probability per expert.
            probs = router_logits.float().softmax(dim=-1)
            frac = F.one_hot(topi, self.num_experts).float().sum(dim=(0, 1)) / topi.numel()
            self.aux_loss = self.num_experts * (frac * probs.mean(dim=0)).sum()
        return topi, topw

    def forward(self, x):
        B, T, H = x.shape
        flat = x.reshape(-1, H)
        topi, topw = self.route(flat)
        out = self.shared_expert(flat)
        return self.add_experts(flat, topi, topw, out).view(B, T, H)

    def add_experts(self, flat, topi, topw, out):
        """out + the routed experts' outputs for tokens flat [n, H] routed to topi with weights topw."""
        n, k = flat.shape[0], self.top_k
        gate_up_q, down_q = self._weights()
        if n <= _GATHER_MAX_TOKENS and not self.training:
            # Dequantise only the experts the router picked, each once.
            if n == 1:
                idx = topi[0]  # top-k experts of one token are distinct
                if gate_up_q is not None:
                    wgu, wd = gate_up_q.select(idx), down_q.select(idx)
                else:
                    wgu, wd = torch.index_select(self.w_gate_up, 0, idx), torch.index_select(self.w_down, 0, idx)
                gate, up = torch.matmul(wgu, flat[0]).chunk(2, dim=-1)  # [k, I] each
                y = torch.bmm(wd, (F.silu(gate) * up).unsqueeze(-1)).squeeze(-1)  # [k, H]
                out = out + topw @ y
            elif (full := self._all_experts()) is not None:
                # A few tokens (a verify step): every expert on every token in two batched matmuls
                # (tiny), then keep what the router chose through an [experts, tokens] weight matrix.
                # Far fewer ops than gathering per slot; top-k experts of a token are distinct.
                gate, up = torch.matmul(full[0], flat.T).chunk(2, dim=1)  # [E, I, n]
                y = torch.matmul(full[1], F.silu(gate) * up)  # [E, H, n]
                route = torch.zeros(self.num_experts, n, dtype=y.dtype, device=flat.device).scatter_(0, topi.T, topw.T)
                out = out + torch.einsum("ehn,en->nh", y, route)
            else:
                # Same, over the picked experts only, each decoded once.
                uniq, slot_expert = topi.reshape(-1).unique(return_inverse=True)
                wgu, wd = gate_up_q.select(uniq), down_q.select(uniq)
                gate, up = torch.matmul(wgu, flat.T).chunk(2, dim=1)  # [u, I, n]
                y = torch.matmul(wd, F.silu(gate) * up)  # [u, H, n]
                slot_token = torch.arange(n, device=flat.device).repeat_interleave(k)
                route = torch.zeros(uniq.numel(), n, dtype=y.dtype, device=flat.device)
                route.index_put_((slot_expert, slot_token), topw.reshape(-1), accumulate=True)
                out = out + torch.einsum("uhn,un->nh", y, route)
        else:
            for e in range(self.num_experts):
                token_idx, slot = (topi == e).nonzero(as_tuple=True)
                if token_idx.numel() == 0:
                    continue
                if gate_up_q is not None:
                    wgu, wd = gate_up_q.dense(e), down_q.dense(e)
                else:
                    wgu, wd = self.w_gate_up[e], self.w_down[e]
                xe = flat[token_idx]
                gate, up = (xe @ wgu.T).chunk(2, dim=-1)
                ye = (F.silu(gate) * up) @ wd.T
                out = out.index_add(0, token_idx, ye * topw[token_idx, slot].unsqueeze(-1))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TinyLingConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg)

    def forward(self, x, rope, cache=None, layer=0, start=0, last_only=False):
        attn = self.self_attn(self.input_layernorm(x), rope, cache, layer, start, last_only)
        x = (x[:, -1:] if last_only else x) + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class NextNLayer(nn.Module):
    """The MTP layer's own weights: norms for the embedding and the hidden state, the projection
    of their concatenation, one decoder layer, and the norm before the shared lm_head."""

    def __init__(self, cfg: TinyLingConfig):
        super().__init__()
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.decoder = DecoderLayer(cfg)
        self.shared_head_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden, next_embeds, rope, cache=None, start=0, last_only=False):
        """hidden[t] (target hidden at t) + embedding of token t+1 -> MTP hidden at t (pre-norm).
        last_only: fill the KV cache for all positions, compute the output for the last one only
        (a single layer's K/V depend only on its input, so the rest of the layer can be skipped)."""
        fast = getattr(self, "_fast", None)
        if fast is not None and cache is not None and not self.training and hidden.shape[0] == 1:
            x = torch.mm(torch.cat((self.enorm(next_embeds[0]), self.hnorm(hidden[0])), dim=-1), self._eh_t)
            return fast(x, rope, cache, 0, start, last_only)[None]
        x = self.eh_proj(torch.cat((self.enorm(next_embeds), self.hnorm(hidden)), dim=-1))
        return self.decoder(x, rope, cache, 0, start, last_only)

    def prepare_inference(self) -> bool:
        """Build the fast path from the current weights (call after quantisation and .to());
        False (module path kept) where it does not apply."""
        self._fast = FastDecoderLayer(self.decoder) if FastDecoderLayer.supports(self.decoder) else None
        self._eh_t = self.eh_proj.weight.detach().T.contiguous() if self._fast is not None else None
        self._embed_table = None
        return self._fast is not None

    def fast_forward_ids(self, hidden, next_ids, embed_weight, rope, cache, start: int, last_only: bool):
        """The fast path fed token ids: enorm(embedding) @ W_e depends on the token only, so it is a
        table [V, H] computed once; a step is then a lookup plus one addmm for the hidden half."""
        H = hidden.shape[-1]
        x = torch.addmm(F.embedding(next_ids[0], self._embedding_table(embed_weight)), self.hnorm(hidden[0]), self._eh_t[H:])
        return self._fast(x, rope, cache, 0, start, last_only)[None]

    def fast_forward_rows(self, hidden, next_ids, embed_weight, rope, batch: RowBatch, last_only: bool,
                          fused_moe: bool = False):
        """fast_forward_ids over a RowBatch: hidden [R, H], next_ids [R] -> [R, H] (with last_only
        each request's last row: [len(batch.caches), H]), pre-norm."""
        H = hidden.shape[-1]
        ids, hidden = batch.pad(next_ids, batch.rows), batch.pad(hidden, batch.rows)
        x = torch.addmm(F.embedding(ids, self._embedding_table(embed_weight)), self.hnorm(hidden), self._eh_t[H:])
        x = self._fast.rows(x, rope, batch, 0, last_only, fused_moe)
        return x[: len(batch.caches) if last_only else batch.rows]

    def _embedding_table(self, embed_weight):
        H = embed_weight.shape[-1]
        cached = self._embed_table
        if cached is None or cached[0] is not embed_weight or cached[1] != embed_weight._version:
            table = torch.mm(self.enorm(embed_weight.detach()), self._eh_t[:H])
            cached = self._embed_table = (embed_weight, embed_weight._version, table)
        return cached[2]


# ---------------------------------------------------------------- fast inference path
#
# At this size (width 128, 4 layers) a decode step is bound by the number of torch ops, not by
# arithmetic (each op costs microseconds whatever its size) and by the bytes of weights read (the
# model does not fit in L2). The fast path computes the same function as the modules with few ops
# per layer and reads only the weights it needs:
#   - q/k/v in one matmul whose q/k output rows are permuted to interleaved pairs, so that RoPE
#     (and the identity on v) is one complex multiply; K and V reach the cache in one copy;
#   - MoE for a few tokens (decode, verify): only the experts touched, read in place (views),
#     with the residual added by addmm; for many tokens (prefill) the router and every expert's
#     gate/up in ONE matmul, routing weights on the activations (0 for experts not picked, 1 for
#     the shared one), every down projection plus the residual in ONE addmm;
#   - weights pre-transposed ([in, out]: faster for a few rows on CPU), masks and rotary tables
#     precomputed. Results equal the module path up to float rounding (summation order).
# Built by prepare_inference() from the current (quantised-then-decoded) weights, so the numbers
# it computes with are exactly the stored fp8/mxfp4 values; float32 only (complex64 RoPE).


# silu(gate) * up can be a float32 subnormal (gate near -87, small up), and subnormal operands
# make a CPU matmul ~10x slower: the dense (prefill) path, over all experts, zeroes activations
# under 1e-20 (contributions far below rounding). The per-expert path skips the extra op: with the
# trained model no subnormal occurs there (0 of ~11k expert activations over the benchmark).
_SUBNORMAL_GUARD = 1e-20
_PER_EXPERT_MAX_TOKENS = 8  # decode, verify and MTP extend: per expert touched; beyond (prefill): dense


def _interleave_rows(weight, num_heads: int, head_dim: int):
    """Rows [heads * head_dim, in] of a q or k projection, each head's halves (x1, x2) reordered
    to pairs (x1_0, x2_0, x1_1, x2_1, ...). The same permutation on q and k leaves q.k unchanged."""
    half = head_dim // 2
    perm = torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1).reshape(-1).to(weight.device)
    return weight.view(num_heads, head_dim, -1).index_select(1, perm).reshape(num_heads * head_dim, -1)


class RowBatch:
    """The rows of one forward over several requests' sequences (FastDecoderLayer.rows): request
    i's counts[i] rows are consecutive and sit at positions starts[i], starts[i] + 1, ... of
    caches[i]. The forward pads them with zero rows up to `min_rows`: on CPU a matmul's row depends
    on how many rows the product has (MKL gives the row of an M = 1 product other bits than the
    same row of an M = 8 one), and from some row count on it no longer does
    (sparkit.engines.embedded.batching measures it), so a request computed alone and the same
    request among others go through products of the same kind and get the same bits."""

    def __init__(self, caches: list[KVCache], starts: list[int], counts: list[int], min_rows: int = 1):
        self.caches, self.starts, self.counts = list(caches), list(starts), list(counts)
        self.ends = [start + n for start, n in zip(self.starts, self.counts)]
        for cache, end in zip(self.caches, self.ends):
            if end > cache.max_len:
                raise ValueError(f"sequence length {end} exceeds the KV cache ({cache.max_len})")
        self.offsets = [0]
        for n in self.counts:
            self.offsets.append(self.offsets[-1] + n)
        self.rows = self.offsets[-1]
        self.min_rows = min_rows
        self.padded = max(self.rows, min_rows)
        self.device = self.caches[0].kv.device
        pool = self.caches[0].pool
        self.pool = pool if pool is not None and all(c.pool is pool for c in self.caches) else None
        self._positions = self._slots = self._last_rows = None
        self._zeros: dict[tuple, torch.Tensor] = {}

    @property
    def single(self) -> bool:
        return len(self.caches) == 1

    def rope(self, table):
        """The rotary table's rows for every row (the padding's at positions after the last one, or 0)."""
        start = self.starts[0]
        if self.single and start + self.padded <= table.shape[0]:
            return table[start : start + self.padded]  # a view: no index op
        if self._positions is None:
            positions = [p for start, n in zip(self.starts, self.counts) for p in range(start, start + n)]
            self._positions = torch.tensor(positions + [0] * (self.padded - self.rows), device=self.device)
        return table[self._positions]

    @property
    def last_rows(self):
        """last_only: the index of each request's last row."""
        if self._last_rows is None:
            self._last_rows = torch.tensor([end - 1 for end in self.offsets[1:]], device=self.device)
        return self._last_rows

    def pad(self, x, rows: int):
        """x [rows, ...] with zero rows appended up to min_rows."""
        if rows >= self.min_rows:
            return x
        shape = (self.min_rows - rows, *x.shape[1:])
        zeros = self._zeros.get(shape)
        if zeros is None or zeros.dtype != x.dtype:
            zeros = self._zeros[shape] = x.new_zeros(shape)
        return torch.cat((x, zeros))

    def write(self, layer: int, kv) -> None:
        """kv [rows, 2, heads, D]: every row's K and V into its request's cache at its position."""
        if self.pool is not None and not self.single:
            if self._slots is None:
                slots = [c.slot for c, n in zip(self.caches, self.counts) for _ in range(n)]
                self._slots = torch.tensor(slots, device=self.device)
                positions = [p for start, n in zip(self.starts, self.counts) for p in range(start, start + n)]
                self._slot_positions = torch.tensor(positions, device=self.device)
            self.pool.buffer[self._slots, layer, :, :, self._slot_positions] = kv
            return
        for i, cache in enumerate(self.caches):
            rows = kv[self.offsets[i] : self.offsets[i + 1]]
            cache.kv[layer, :, :, self.starts[i] : self.ends[i]] = rows.permute(1, 2, 0, 3)


class FastDecoderLayer:
    """One decoder layer's weights laid out for the fast path (plain tensors, not parameters)."""

    def __init__(self, layer: DecoderLayer):
        attn, moe = layer.self_attn, layer.mlp
        heads, head_dim = attn.num_heads, attn.head_dim
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.in_norm, self.post_norm = layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()
        self.eps = layer.input_layernorm.eps
        w = attn.qkv_proj.weight.detach()
        q, k, v = w[:inner], w[inner : 2 * inner], w[2 * inner :]
        qkv = torch.cat((_interleave_rows(q, heads, head_dim), _interleave_rows(k, heads, head_dim), v))
        self.qkv_t = qkv.T.contiguous()
        self.o_t = attn.o_proj.weight.detach().T.contiguous()
        gate_up, down = moe._all_experts()
        E, two_i, H = gate_up.shape
        self.num_experts, self.top_k, self.inter = E, moe.top_k, two_i // 2
        shared = moe.shared_expert
        # the shared expert may be wider or narrower than the routed ones (config key of its own)
        shared_gu = shared.gate_up_proj.weight.detach().to(gate_up.dtype)  # [2Is, H]
        shared_down = shared.down_proj.weight.detach().to(down.dtype)  # [H, Is]
        self.shared_inter = shared_down.shape[1]
        self.moe_t = torch.cat((moe.gate.weight.detach(), gate_up.detach().reshape(-1, H), shared_gu)).T.contiguous()  # [H, E + E*2I + 2Is]
        self.down_t = torch.cat((down.detach().transpose(1, 2).reshape(-1, H), shared_down.T)).contiguous()  # [E*I + Is, H]
        # A few tokens: each expert touched (and the shared one, last) read as views [H, 2I] / [I, H].
        self.router_t = moe.gate.weight.detach().T.contiguous()
        self.gate_up_t = [w.T.contiguous() for w in gate_up.detach()] + [shared_gu.T.contiguous()]
        self.down_t_each = [w.T.contiguous() for w in down.detach()] + [shared_down.T.contiguous()]
        # For a batch of rows that touches most experts (rows()): every expert's gate/up, the shared
        # one last, in one matrix whose columns of expert e give what gate_up_t[e]'s own product
        # gives (checked at load: sparkit.engines.embedded.batching). None when the shared expert's
        # width differs from the routed ones'.
        self.gate_up_all_t = torch.cat(self.gate_up_t, dim=1).contiguous() if self.shared_inter == self.inter else None

    @staticmethod
    def supports(layer: DecoderLayer) -> bool:
        moe = layer.mlp
        return (
            moe._all_experts() is not None
            and layer.self_attn.head_dim % 2 == 0
            and layer.self_attn.qkv_proj.weight.dtype == torch.float32
        )

    def __call__(self, x, rope: RotaryEmbedding, cache: KVCache, layer: int, start: int, last_only: bool = False):
        """x [T, H] -> [T, H] (or [1, H] with last_only: K/V for all T, the rest for the last)."""
        # profiler spans (no-ops unless a profile runs: sparkit.models.profiler_spans)
        with span("attention"):
            T, H = x.shape
            end = start + T
            if end > cache.max_len:
                raise ValueError(f"sequence length {end} exceeds the KV cache ({cache.max_len})")
            table, causal = rope.fast_tables()
            h = F.rms_norm(x, (H,), self.in_norm, self.eps)
            qkv = torch.view_as_complex(torch.mm(h, self.qkv_t).view(T, 3, self.heads, self.head_dim // 2, 2))
            qkv = torch.view_as_real(qkv * table[start:end]).view(T, 3, self.heads, self.head_dim).permute(1, 2, 0, 3)
            cache.kv[layer, :, :, start:end] = qkv[1:]
            # 4-D [1, heads, T, D]: SDPA's fused CPU kernel (3-D inputs take the slower math path)
            keys, values = cache.kv[layer, 0:1, :, :end], cache.kv[layer, 1:2, :, :end]
            q = qkv[0:1]
            if last_only and T > 1:
                q, x = q[:, :, -1:], x[-1:]
            n = q.shape[2]
            if n == 1:
                attn = F.scaled_dot_product_attention(q, keys, values)
            else:
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=causal[start:end, :end])
            x = torch.addmm(x, attn[0].transpose(0, 1).reshape(n, -1), self.o_t)

        with span("moe"):
            h = F.rms_norm(x, (H,), self.post_norm, self.eps)
            E, inter = self.num_experts, self.inter
            if n <= _PER_EXPERT_MAX_TOKENS:
                # Decode, verify, MTP extend: a loop over the experts the tokens picked (plus the shared
                # one), each read once and applied to all n rows, its output weighted per token (0 for
                # a token that did not pick it). At this size a step costs the bytes of weights it reads
                # (the model does not fit in L2) as much as its op count, so only touched experts are
                # read. Experts in ascending order for any n, so that a token's sum is formed in the
                # same order in a decode step and in a verify step.
                top_logits, topi = torch.mm(h, self.router_t).topk(self.top_k, dim=-1)
                topw = top_logits.softmax(dim=-1)
                if n == 1:
                    picked, columns = map(list, zip(*sorted(zip(topi[0].tolist(), topw[0].tolist()))))
                else:
                    route = torch.zeros(n, E, dtype=x.dtype, device=x.device).scatter_(1, topi, topw).T.contiguous()
                    picked = sorted(set(topi.view(-1).tolist()))
                    columns = [route[e, :, None] for e in picked]
                for e, w in zip(picked + [E], columns + [None]):
                    gate_up = torch.mm(h, self.gate_up_t[e])
                    width = gate_up.shape[1] // 2
                    act = F.silu(gate_up[:, :width]).mul_(gate_up[:, width:])
                    # w is None for the shared expert, 1.0 for top-1 routing of one token (softmax of one logit)
                    x = torch.addmm(x, act if w is None or (type(w) is float and w == 1.0) else act.mul_(w), self.down_t_each[e])
                return x
            y = torch.mm(h, self.moe_t)
            top_logits, topi = y[:, :E].topk(self.top_k, dim=-1)
            route = torch.zeros(n, E, 1, dtype=x.dtype, device=x.device).scatter_(1, topi.unsqueeze(-1), top_logits.softmax(dim=-1).unsqueeze(-1))
            if self.shared_inter == inter:
                gate_up = y[:, E:].view(n, E + 1, 2, inter)
                act = F.hardshrink(F.silu(gate_up[:, :, 0]).mul_(gate_up[:, :, 1]), _SUBNORMAL_GUARD)  # [n, E+1, I]
                act[:, :E] *= route  # routed experts by their weight (0 if not picked); shared expert by 1
                return torch.addmm(x, act.view(n, -1), self.down_t)
            routed = y[:, E : E + 2 * E * inter].view(n, E, 2, inter)
            shared = y[:, E + 2 * E * inter :].view(n, 2, self.shared_inter)
            act = torch.cat(((F.silu(routed[:, :, 0]) * routed[:, :, 1] * route).view(n, -1), F.silu(shared[:, 0]) * shared[:, 1]), dim=1)
            return torch.addmm(x, F.hardshrink(act, _SUBNORMAL_GUARD), self.down_t)


    def rows(self, x, rope: RotaryEmbedding, batch: RowBatch, layer: int, last_only: bool = False,
             fused_moe: bool = False):
        """x [P, H]: the batch's rows, padded (batch.padded) -> [P, H], or with last_only each
        request's last row, padded to batch.min_rows (K/V still written for every row).

        A request's rows get the same bits whichever other requests share the batch: every
        product has at least batch.min_rows rows, attention runs per request over its own cache,
        row-wise ops act on each row alone, and the MoE adds each expert a row picked into it in
        ascending order (the shared one last), an expert it did not pick adding nothing. With
        fused_moe, when the rows picked most experts, the gate/up products of all experts are one
        matmul (gate_up_all_t), whose columns equal the per-expert products (checked at load): the
        same bits in fewer ops."""
        with span("attention"):
            P, H = x.shape
            R = batch.rows
            table, causal = rope.fast_tables()
            h = F.rms_norm(x, (H,), self.in_norm, self.eps)
            qkv = torch.view_as_complex(torch.mm(h, self.qkv_t).view(P, 3, self.heads, self.head_dim // 2, 2))
            qkv = torch.view_as_real(qkv * batch.rope(table)).view(P, 3, self.heads, self.head_dim)
            batch.write(layer, qkv[:R, 1:])
            q_all = qkv[:, 0].transpose(0, 1).unsqueeze(0)  # [1, heads, P, D]
            outs = []
            for i, cache in enumerate(batch.caches):
                first, last, start, end = batch.offsets[i], batch.offsets[i + 1], batch.starts[i], batch.ends[i]
                keys, values = cache.kv[layer, 0:1, :, :end], cache.kv[layer, 1:2, :, :end]
                if last_only or last - first == 1:
                    outs.append(F.scaled_dot_product_attention(q_all[:, :, last - 1 : last], keys, values))
                else:
                    outs.append(F.scaled_dot_product_attention(q_all[:, :, first:last], keys, values,
                                                               attn_mask=causal[start:end, :end]))
            if last_only:
                n = len(batch.caches)
                x = batch.pad(x.index_select(0, batch.last_rows), n)
            else:
                n = R
            attn = (outs[0] if len(outs) == 1 else torch.cat(outs, dim=2))[0].transpose(0, 1).reshape(n, -1)
            x = torch.addmm(x, batch.pad(attn, n), self.o_t)

        with span("moe"):
            P = x.shape[0]
            E = self.num_experts
            h = F.rms_norm(x, (H,), self.post_norm, self.eps)
            top_logits, topi = torch.mm(h, self.router_t).topk(self.top_k, dim=-1)
            route = torch.zeros(P, E, dtype=x.dtype, device=x.device).scatter_(1, topi, top_logits.softmax(dim=-1))
            picked = sorted(set(topi[:n].reshape(-1).tolist()))  # the padding's picks are not served
            # one product over every expert's gate/up reads them all: worth it when most are picked
            if fused_moe and self.gate_up_all_t is not None and 2 * len(picked) > E:
                gate_up = torch.mm(h, self.gate_up_all_t).view(P, E + 1, 2, self.inter)
                act = F.silu(gate_up[:, :, 0]).mul_(gate_up[:, :, 1])  # [P, E + 1, I]
                act[:, :E] *= route[:, :, None]
                for e in picked + [E]:
                    x = torch.addmm(x, act[:, e], self.down_t_each[e])
                return x
            for e in picked + [E]:
                gate_up = torch.mm(h, self.gate_up_t[e])
                width = gate_up.shape[1] // 2
                act = F.silu(gate_up[:, :width]).mul_(gate_up[:, width:])
                if e < E:  # a row that did not pick e: weight 0, x + 0
                    act.mul_(route[:, e : e + 1])
                x = torch.addmm(x, act, self.down_t_each[e])
            return x


class TinyLingForCausalLM(nn.Module):
    def __init__(self, cfg: TinyLingConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.mtp = NextNLayer(cfg)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)

    def forward_hidden(self, input_ids, cache: KVCache | None = None, start: int = 0, capture: tuple[int, ...] = ()):
        """input_ids [B, T] -> hidden states [B, T, H] after the final norm: what the lm_head
        reads, and what SGLang's logits processor hands a NextN draft. With `capture` (layer
        indices), also the residual stream after each of those layers, before any norm,
        concatenated in that order [B, T, len(capture) * H]: what BailingMoeV3's
        `set_dspark_layers_to_capture` hands a DSpark draft (sparkit.models.dspark)."""
        captured = []
        fast = getattr(self, "_fast", None)
        if fast is not None and cache is not None and not self.training and input_ids.shape[0] == 1:
            x = F.embedding(input_ids[0], self.embed_tokens.weight)
            for i, layer in enumerate(fast):
                x = layer(x, self.rope, cache, i, start)
                if i in capture:
                    captured.append((capture.index(i), x[None]))
            hidden = self.norm(x)[None]
        else:
            x = self.embed_tokens(input_ids)
            for i, layer in enumerate(self.layers):
                x = layer(x, self.rope, cache, i, start)
                if i in capture:
                    captured.append((capture.index(i), x))
            hidden = self.norm(x)
        if not capture:
            return hidden
        return hidden, torch.cat([x for _, x in sorted(captured, key=lambda item: item[0])], dim=-1)

    def forward_rows(self, input_ids, batch: RowBatch, fused_moe: bool = False):
        """input_ids [R]: batch.counts[i] tokens of each request i -> hidden states [R, H] after the
        final norm, each request's rows the same bits whatever else shares the batch
        (FastDecoderLayer.rows). The fast path only (prepare_inference)."""
        ids = batch.pad(input_ids, batch.rows)
        x = F.embedding(ids, self.embed_tokens.weight)
        for i, layer in enumerate(self._fast):
            x = layer.rows(x, self.rope, batch, i, fused_moe=fused_moe)
        return self.norm(x[: batch.rows])

    def prepare_inference(self) -> bool:
        """Build the fast path (FastDecoderLayer) for the target layers and the MTP layer from the
        current weights; call after quantisation and .to(). Returns whether it applies (float32,
        experts decoded or unquantised); otherwise the modules run as they are."""
        layers = [FastDecoderLayer(layer) if FastDecoderLayer.supports(layer) else None for layer in self.layers]
        self._fast = layers if all(layer is not None for layer in layers) else None
        self.mtp.prepare_inference()
        return self._fast is not None

    def logits(self, hidden):
        """Logits of forward_hidden()'s output (already normed)."""
        return self.lm_head(hidden)

    def new_cache(self, max_len: int, dtype=None, device=None) -> KVCache:
        cfg = self.config
        p = self.embed_tokens.weight
        return KVCache(cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim, max_len, dtype or p.dtype, device or p.device)

    def new_pool(self, slots: int, max_len: int, dtype, device) -> KVPool:
        """One KV cache per sequence running at once, slots of one mapped buffer."""
        cfg = self.config
        return KVPool(slots, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim, max_len, dtype, device)

    def nextn_draft(self, nextn: NextNLayer, lm_head: nn.Module) -> TinyLingForCausalLMNextN:
        """The draft over `nextn` (this model's own or another checkpoint's) with this model's
        embedding and the head `lm_head`."""
        return TinyLingForCausalLMNextN(nextn, self.embed_tokens, lm_head, self.rope, self.config)


class TinyLingForCausalLMNextN:
    """The draft model: a NextN layer plus the target's embedding and lm_head.

    Not an nn.Module on purpose: it *refers* to modules owned elsewhere (the target's embedding and,
    with module sharing, the target's lm_head object) instead of owning copies."""

    model_class = DRAFT_CLASS

    def __init__(self, nextn: NextNLayer, embed_tokens: nn.Embedding, lm_head: nn.Module, rope: RotaryEmbedding, config: TinyLingConfig):
        self.nextn, self.embed_tokens, self.lm_head, self.rope, self.config = nextn, embed_tokens, lm_head, rope, config

    def forward_hidden(self, hidden, next_ids, cache: KVCache | None = None, start: int = 0, last_only: bool = False):
        """(normed hidden states at t, ids of the tokens at t+1) -> the draft's hidden states after
        its final norm: what its lm_head reads and what a chained draft step is fed (SGLang's)."""
        nextn = self.nextn
        if getattr(nextn, "_fast", None) is not None and cache is not None and not nextn.training and hidden.shape[0] == 1:
            out = nextn.fast_forward_ids(hidden, next_ids, self.embed_tokens.weight, self.rope, cache, start, last_only)
        else:
            out = nextn(hidden, self.embed_tokens(next_ids), self.rope, cache, start, last_only)
        return nextn.shared_head_norm(out)

    def forward_rows(self, hidden, next_ids, batch: RowBatch, last_only: bool = False, fused_moe: bool = False):
        """forward_hidden over a RowBatch (hidden [R, H], next_ids [R]) -> normed [R, H] (last_only:
        each request's last row), each request's rows the same bits whatever else shares the batch.
        The fast path only."""
        nextn = self.nextn
        out = nextn.fast_forward_rows(hidden, next_ids, self.embed_tokens.weight, self.rope, batch, last_only, fused_moe)
        return nextn.shared_head_norm(out)

    def logits(self, mtp_hidden):
        """Logits of forward_hidden()'s output (already normed)."""
        return self.lm_head(mtp_hidden)

    def new_cache(self, max_len: int, dtype, device) -> KVCache:
        cfg = self.config
        return KVCache(1, cfg.num_attention_heads, cfg.head_dim, max_len, dtype, device)

    def new_pool(self, slots: int, max_len: int, dtype, device) -> KVPool:
        cfg = self.config
        return KVPool(slots, 1, cfg.num_attention_heads, cfg.head_dim, max_len, dtype, device)


def training_loss(model: TinyLingForCausalLM, batch, mtp_weight: float = 1.0, aux_weight: float = 0.01):
    """Next-token loss of the target + t+2 loss of the NextN layer (fed the target's hidden states,
    detached so that the MTP objective does not disturb the target) + MoE load balancing."""
    inputs = batch[:, :-1]
    hidden = model.forward_hidden(inputs)  # after the final norm, as the draft receives it
    logits = model.logits(hidden)
    loss_main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    # MTP at t: normed hidden[t] + embed(x[t+1]) -> x[t+2]
    mtp_hidden = model.mtp(hidden[:, :-1].detach(), model.embed_tokens(batch[:, 1:-1]), model.rope)
    mtp_logits = model.lm_head(model.mtp.shared_head_norm(mtp_hidden))
    loss_mtp = F.cross_entropy(mtp_logits.reshape(-1, mtp_logits.shape[-1]), batch[:, 2:].reshape(-1))
    aux = sum(m.aux_loss for m in model.modules() if isinstance(m, MoE) and m.aux_loss is not None)
    # (A second loss for chained drafting steps was tried: at equal wall time it did not raise the
    # accept length, and it costs a third of the steps.)
    total = loss_main + mtp_weight * loss_mtp + aux_weight * aux
    return total, loss_main.detach(), loss_mtp.detach()
