"""Triton W8A16 lm_head kernel: e4m3 weights [N, K] with per-row fp32 scales, M = 1..16 rows.

The lm_head at decode time is a skinny GEMM (M <= 16 verify tokens, N = vocab) whose cost is
reading the weight once. Both kernels stream every [BLOCK_N, BLOCK_K] weight tile from HBM exactly
once and apply it to all M activation rows (the activations are tiny and stay in L2):

* ``dot``: "swap-AB" tensor-core kernel. The weight tile is the *left* operand
  (``tl.dot(w[BLOCK_N, BLOCK_K], xT[BLOCK_K, 16])``), so the big dimension sits on the MMA's M side
  and the batch is padded only to 16 columns. Its cost is flat in M.
* ``cc``: CUDA-core kernel for the smallest M; accumulates ``w * x`` elementwise in fp32 registers
  over K and reduces once at the end (no per-tile cross-thread reductions).

The per-row scale factors out of the K sum, so it is applied once to the fp32 accumulator.
The shipped path (prepare_fp8_weight, then fp8_linear) is the tile-packed swap-AB kernel, its
config per M chosen on the GPU by sparkit.kernels.fp8_tune. Untuned it runs pk16p: e4m3 -> fp16
weight tiles, activations scaled by a power of two per row and rounded to fp16 once per call
(overflow-safe for any bf16 input), the power of two undone on the fp32 result. On an H200 the
tuner picks pk8w: each bf16 activation row split exactly into two e4m3 rows (_split_fp8_row), the
weight tile multiplied as TMA left it in shared memory on FP8 tensor cores, the partial sums
promoted to fp32 once per K block (FP8_PROMOTE_K), 64-token stripes; 94-96 us at M = 1..16
against bf16 F.linear's 184-196 us (benchmarks/results/h200-session-9.md).
``fp8_linear(..., config=...)`` overrides the choice.

The persistent form of pk16p (STREAM_KIND, _fp8_stream_kernel) reads the same packed weight with a
grid of about as many programs as the GPU holds, each streaming one balanced run of 64- or
128-token stripes through one TMA pipeline that never drains between stripes, after asking L2 for
its first tiles while the pre-scaling kernel runs. Which config serves which M is chosen on the
device itself (sparkit.kernels.fp8_tune, among TUNE_CANDIDATES, at load time) and kept in the
packed weight (PackedFp8Weight.tuned); untuned, PACKED_DEFAULT serves every M.

Exact top-k re-scoring (a packed weight with ``exact``; see sparkit.kernels.fp8_linear): the main
kernel's epilogue folds each tile's best logit and token into <= 256 int64 keys per row
(RESCORE_SLOTS, one atomic max per tile and row), and _rescore_kernel recomputes the best tokens
of the k best slots from the bf16 weight. The pre-scaling kernel empties the keys, and the three
kernels are chained by programmatic dependent launch where the GPU has it (sm_90+).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from sparkit.kernels.rescoring import TOKENS_PER_STRETCH


@dataclass(frozen=True)
class KernelConfig:
    kind: str  # "dot" | "tma" | "tma16" | "cc" | "ccr" | a PACKED_MODES key | STREAM_KIND
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    # STREAM_KIND only: persistent programs per SM (the grid is ctas_per_sm x the GPU's SMs), and
    # the KiB of its first weight tiles each program asks L2 for before it waits on the
    # pre-scaling kernel (so HBM streams while the activations are prepared).
    ctas_per_sm: int = 0
    prefetch_kb: int = 0

    def label(self) -> str:
        base = f"{self.kind}:n{self.block_n}k{self.block_k}w{self.num_warps}s{self.num_stages}"
        if self.kind == STREAM_KIND:
            base += f"p{self.ctas_per_sm}f{self.prefetch_kb}"
        elif self.prefetch_kb:
            base += f"f{self.prefetch_kb}"
        return base

    @classmethod
    def from_label(cls, label: str) -> KernelConfig:
        """The inverse of label(): 'pk16p:n128k256w4s3', 'pk8:n128k256w4s3f32', 'ps16p:n128k256w4s3p2f64'."""
        m = re.fullmatch(r"([a-z0-9]+):n(\d+)k(\d+)w(\d+)s(\d+)(?:p(\d+))?(?:f(\d+))?", label.strip())
        if m is None:
            raise ValueError(f"not a kernel config label: {label!r} (expected e.g. {PACKED_DEFAULT.label()!r})")
        kind, bn, bk, nw, ns, ctas, pf = m.groups()
        if (kind == STREAM_KIND) != (ctas is not None) or (kind == STREAM_KIND and pf is None):
            raise ValueError(f"kernel config label {label!r}: p<ctas>f<KiB> belongs to {STREAM_KIND} only")
        return cls(kind, int(bn), int(bk), int(nw), int(ns), int(ctas or 0), int(pf or 0))


# How _fp8_packed_kernel reads the weight packed tile-major ([N/BLOCK_N, K/BLOCK_K, BLOCK_N,
# BLOCK_K], see pack_fp8_weight: every tile is one contiguous block and a program streams one
# contiguous region, which HBM serves far better than BLOCK_K-byte pieces of many rows), by mode:
# 0: bf16 MMA. 1: fp16 MMA, activations rescaled per tile (_dot_fp16_rescaled). 2: fp16 MMA, one
# power of two per activation row found by a pre-scan of x (from L2), which keeps the MMAs chained
# on one accumulator. 3: as 2, the powers of two computed once per call by _row_exponent_kernel.
# 4: activations already scaled and rounded to fp16 by _prescale_rows_kernel: nothing but the
# chained MMA in the loop. 5 and 6: activations split into two e4m3 parts by
# _split_rows_fp8_kernel (32 rows per block of 16: hi parts, then lo parts), multiplied by the
# e4m3 weight tile on FP8 tensor cores as it sits in shared memory; 5 as two MMAs of 16 columns,
# 6 as one of 32.
PACKED_MODES = {"pk": 0, "pk16t": 1, "pk16": 2, "pk16x": 3, "pk16p": 4, "pk8": 5, "pk8w": 6}
# The modes that read e4m3 activations (_split_rows_fp8_kernel: rows up to PRESCALE_ONE_PASS_K long).
FP8_ACTIVATION_MODES = (5, 6)
# The persistent kernel (_fp8_stream_kernel) on the same packed weight, activations pre-scaled as pk16p.
STREAM_KIND = "ps16p"

# The packing, and the untuned default, which is also the reference the tuner checks every candidate
# against (H200, N=157184, K=2560; benchmarks/gpu_session.sh, all candidates interleaved in
# the same rounds): weights packed as 128 x 256 tiles, read by pk16p (activations pre-scaled to fp16
# once per call by _prescale_rows_kernel, then plain chained fp16 MMAs), 4 warps, 3 stages:
# 1.80-1.87x bf16 F.linear for M = 1..16, and 0.5-4% faster than the former default (pk16t on 256 x 128
# tiles: per-tile rescaling in the loop) at every M. On the same 128 x 256 tiles the per-tile
# rescaling costs about 1% (pk16t vs pk16p); the rest of the gain is the tile shape.
# Plain [N, K] tensors use the TMA fp16 kernel.
PACK_BLOCK_N, PACK_BLOCK_K = 128, 256
PACKED_DEFAULT = KernelConfig("pk16p", PACK_BLOCK_N, PACK_BLOCK_K, 4, 3)
# What sparkit.kernels.fp8_tune may choose per M on the GPU it runs on (every one checked against
# an exact product under the CPU interpreter by the tests, and against PACKED_DEFAULT on the device
# before it is timed). On the H200's numbers (132 SMs, 228 KB of shared memory each, 4.8 TB/s):
# the weight is 402 MB, so each SM must take in a 32 KB tile every ~1 us. With fp16 MMAs a tile's
# 16 MMA steps run one after another in a warpgroup (the e4m3 -> fp16 operand sits in registers),
# which is as long as HBM takes to deliver the tile; with e4m3 activations (pk8, pk8w) the FP8 MMA
# reads the tile from shared memory where TMA put it, half the steps, nothing through registers.
# Grid programs on 64-token stripes (half a packed tile, 2456 programs: 2% imbalance at the end
# instead of 7% for 1228 whole tiles) and 3-4 stages keep 2-3 programs per SM; f32: each asks L2
# for its first 32 KB before waiting on the activations' kernel, so the first wave starts on data.
# Measured on an H200 (benchmarks/fp8_head_limit.py, benchmarks/results/h200-session-9.md):
# pk8w 1.5-9% faster than PACKED_DEFAULT with exact re-scoring (call 6); the persistent kernel (ps16p)
# 7-80% slower than PACKED_DEFAULT there (session 8), kept in two forms for other GPUs.
TUNE_CANDIDATES = (
    PACKED_DEFAULT,
    KernelConfig("pk16p", PACK_BLOCK_N, PACK_BLOCK_K, 4, 3, prefetch_kb=64),
    KernelConfig("pk8w", 64, PACK_BLOCK_K, 4, 3, prefetch_kb=32),
    KernelConfig("pk8w", 64, PACK_BLOCK_K, 4, 4, prefetch_kb=32),
    KernelConfig("pk8", 64, PACK_BLOCK_K, 4, 4, prefetch_kb=32),
    KernelConfig("pk8w", PACK_BLOCK_N, PACK_BLOCK_K, 4, 4),
    KernelConfig(STREAM_KIND, 128, PACK_BLOCK_K, 4, 3, 2, 64),
    KernelConfig(STREAM_KIND, 64, PACK_BLOCK_K, 4, 5, 2, 64),
)
UNPACKED_DEFAULT = KernelConfig("tma16", 128, 128, 8, 4)
FP32_DEFAULT = KernelConfig("cc", 16, 128, 4, 3)


# An empty candidate slot: below every key the epilogue writes (logit bits, token id).
EMPTY_KEY = tl.constexpr(-(2 ** 63))

# Triton's CPU interpreter (TRITON_INTERPRET=1, used by the CPU tests) gets bf16 tl.dot wrong;
# an fp32 dot there is exact (the products of bf16 and e4m3 values fit in fp32).
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _dot_fp16_rescaled(w, xk, acc):
    """acc[BN, BM] += w[BN, BK] @ xk[BM, BK]^T on fp16 tensor cores, exact for any bf16 xk.

    e4m3 -> fp16 is a single instruction per pair (e4m3 -> bf16 costs several), which is what
    lets the kernel keep up with HBM. fp16's range is smaller than bf16's and Hopper's fp16 MMA
    overflows on large products, so each activation row of the tile is scaled by a power of two
    that brings it to |x| <= 4 (|w| <= 448 in e4m3, so a 16-term product sum stays below 2^15);
    the power of two is undone on the fp32 partial sum. Typical hidden states need no scaling.
    """
    xf = xk.to(tl.float32)
    amax = tl.max(tl.abs(xf), axis=1)
    e = tl.maximum(tl.ceil(tl.log2(amax * 0.25)), 0.0)
    xs = (xf * tl.exp2(-e)[:, None]).to(tl.float16)
    part = tl.dot(w.to(tl.float16), tl.trans(xs))
    return acc + part * tl.exp2(e)[None, :]


@triton.jit
def _fp8_dot_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, W_VIA_F32: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            if EVEN_N:
                w = tl.load(w_ptrs)
            else:
                w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
            xt = tl.load(x_ptrs, mask=m_mask[None, :], other=0.0)
        else:
            k_mask = (offs_k + k0) < K
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            xt = tl.load(x_ptrs, mask=m_mask[None, :] & k_mask[:, None], other=0.0)
        if W_VIA_F32:
            acc = tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w.to(xt.dtype), xt, acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if EVEN_N:
        s = tl.load(s_ptr + offs_n)
    else:
        s = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)
    acc = acc * s[:, None]
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[None, :] & n_mask[:, None])


@triton.jit
def _fp8_cc_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_om,
    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, M_PAD)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    acc = tl.zeros((M_PAD, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            if EVEN_N:
                w = tl.load(w_ptrs)
            else:
                w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
            x = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
        else:
            k_mask = (offs_k + k0) < K
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        acc += w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    y = tl.sum(acc, axis=2)
    if EVEN_N:
        s = tl.load(s_ptr + offs_n)
    else:
        s = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)
    y = y * s[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _fp8_tma_kernel(
    x_desc, w_desc, s_ptr, out_ptr, M, N, K, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, EVEN_N: tl.constexpr, F16: tl.constexpr,
):
    # Same swap-AB product as _fp8_dot_kernel, but the weight and activation tiles arrive by TMA
    # (bulk async copies into shared memory, out-of-bounds rows zero-filled), which keeps many
    # weight bytes in flight per SM without spending registers or load instructions on them.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    off_n = pid_n * BLOCK_N
    off_m = pid_m * BLOCK_M
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        w = w_desc.load([off_n, k0])
        xk = x_desc.load([off_m, k0])
        if F16:
            acc = _dot_fp16_rescaled(w, xk, acc)
        else:
            acc = tl.dot(w.to(xk.dtype), tl.trans(xk), acc)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    if EVEN_N:
        s = tl.load(s_ptr + offs_n)
    else:
        s = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)
    acc = acc * s[:, None]
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m < M)[None, :] & n_mask[:, None])


@triton.jit
def _row_exponent(x_ptr, stride_xm, M, K, offs_m, BLOCK_K: tl.constexpr):
    """Per activation row, the power of two e >= 0 with max|x| * 2^-e <= 4 (see _dot_fp16_rescaled)."""
    offs_k = tl.arange(0, BLOCK_K)
    amax = tl.zeros((offs_m.shape[0],), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xv = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :],
                     mask=(offs_m < M)[:, None] & ((k0 + offs_k) < K)[None, :], other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(xv.to(tl.float32)), axis=1))
    return tl.maximum(tl.ceil(tl.log2(amax * 0.25)), 0.0)


@triton.jit
def _row_exponent_kernel(x_ptr, e_ptr, M, K, stride_xm, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    e = _row_exponent(x_ptr, stride_xm, M, K, offs_m, BLOCK_K)
    tl.store(e_ptr + offs_m, e, mask=offs_m < M)


# e4m3's largest power of two (its maximum is 448 = 1.75 * 2^8): a row scaled so that its largest
# magnitude lies in (128, 256] uses the format's top binade and keeps 15 binades below it normal.
FP8_SPLIT_TOP = tl.constexpr(8)


@triton.jit
def _pow2_exponent(amax):
    """The power of two e with amax * 2^-e in (128, 256]; 0 for an all-zero (or non-finite) amax."""
    return tl.where((amax > 0) & (amax < float("inf")), tl.ceil(tl.log2(amax)) - FP8_SPLIT_TOP, 0.0)


@triton.jit
def _split_fp8_row(v):
    """One activation row (fp32 values of a bf16 row) as two e4m3 rows and their powers of two:
    hi = e4m3(v * 2^-e), lo = e4m3((v * 2^-e - hi) * 2^-e_lo). hi keeps the top 4 significant bits
    of each value (rounded to nearest), so the remainder needs at most 4 more; a bf16 value has 8,
    so hi * 2^e + lo * 2^(e + e_lo) is the row itself for every value within e4m3's normal range
    of the row's largest (2^-14 of it: what lies below adds less than 2^-14 of the largest product
    to a logit). With e4m3 activations the main kernel feeds the weight tile from shared memory
    straight to the FP8 tensor cores: no conversion of the weight, no copy through registers."""
    e = _pow2_exponent(tl.max(tl.abs(v), axis=0))
    scaled = v * tl.exp2(-e)
    hi = _round_to_4_bits(scaled).to(tl.float8e4nv)
    rest = scaled - hi.to(tl.float32)  # exact; from hi as stored (below e4m3's normal range it rounds again)
    e_lo = _pow2_exponent(tl.max(tl.abs(rest), axis=0))
    lo = _round_to_4_bits(rest * tl.exp2(-e_lo)).to(tl.float8e4nv)
    return hi, lo, e, e_lo


@triton.jit
def _round_to_4_bits(v):
    """fp32 v rounded to 4 significant bits (e4m3's precision), to nearest, ties to even, by integer
    arithmetic on its bits: the rounding the split relies on is then the same on every GPU and
    under Triton's CPU interpreter (whose fp32 -> e4m3 conversion neither carries a rounded-up
    mantissa into the exponent nor breaks ties to even). Values in e4m3's normal range then
    convert to it exactly."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _prescale_rows_kernel(x_ptr, xs_ptr, e_ptr, K, stride_xm, key_ptr, n_slots, BLOCK_K: tl.constexpr,
                          PDL: tl.constexpr = False, NS_PAD: tl.constexpr = 0, ONE_PASS: tl.constexpr = False):
    """One activation row per program: xs = fp16(x * 2^-e) with e >= 0 the power of two that brings
    max|x| to <= 4 (the bound _dot_fp16_rescaled explains), and e itself, undone after the MMAs.
    ONE_PASS (K <= BLOCK_K): the row is read once and kept in registers, one memory round trip
    before the main kernel may start its MMAs. Else two passes over the row in BLOCK_K pieces (the
    second from L1/L2). A power of two keeps the scaling exact."""
    if PDL:  # the main kernel may launch now; it waits for this one before reading xs
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    src = x_ptr + row.to(tl.int64) * stride_xm
    dst = xs_ptr + row.to(tl.int64) * K
    if ONE_PASS:
        v = tl.load(src + offs, mask=offs < K, other=0.0).to(tl.float32)
        e = tl.maximum(tl.ceil(tl.log2(tl.max(tl.abs(v), axis=0) * 0.25)), 0.0)
        tl.store(dst + offs, (v * tl.exp2(-e)).to(tl.float16), mask=offs < K)
    else:
        amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            v = tl.load(src + k0 + offs, mask=(k0 + offs) < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(v.to(tl.float32)))
        e = tl.maximum(tl.ceil(tl.log2(tl.max(amax, axis=0) * 0.25)), 0.0)
        inv = tl.exp2(-e)
        for k0 in range(0, K, BLOCK_K):
            v = tl.load(src + k0 + offs, mask=(k0 + offs) < K, other=0.0)
            tl.store(dst + k0 + offs, (v.to(tl.float32) * inv).to(tl.float16), mask=(k0 + offs) < K)
    tl.store(e_ptr + row, e)
    if NS_PAD > 0:
        _empty_slots(key_ptr, n_slots, row, NS_PAD)


@triton.jit
def _empty_slots(key_ptr, n_slots, row, NS_PAD: tl.constexpr):
    """The row's candidate slots, emptied for the main kernel's atomic maxima."""
    slots = tl.arange(0, NS_PAD)
    tl.store(key_ptr + row.to(tl.int64) * n_slots + slots, tl.full((NS_PAD,), EMPTY_KEY, tl.int64),
             mask=slots < n_slots)


@triton.jit
def _split_rows_fp8_kernel(x_ptr, x8_ptr, e_ptr, K, stride_xm, key_ptr, n_slots, BLOCK_K: tl.constexpr,
                           PDL: tl.constexpr = False, NS_PAD: tl.constexpr = 0):
    """One activation row per program (K <= BLOCK_K, read once): its two e4m3 rows (_split_fp8_row)
    for the FP8-activation modes. Layout, per block b of 16 rows: the rows' hi parts at rows
    32b .. 32b+15 of x8, their lo parts at 32b+16 .. 32b+31, the powers of two in e at the same
    indices; so one block's 32 rows are one [32, BLOCK_K] TMA box."""
    if PDL:  # the main kernel may launch now; it waits for this one before reading x8
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    v = tl.load(x_ptr + row.to(tl.int64) * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
    hi, lo, e, e_lo = _split_fp8_row(v)
    hi_row = row + (row // 16) * 16
    tl.store(x8_ptr + hi_row.to(tl.int64) * K + offs, hi, mask=offs < K)
    tl.store(x8_ptr + (hi_row + 16).to(tl.int64) * K + offs, lo, mask=offs < K)
    tl.store(e_ptr + hi_row, e)
    tl.store(e_ptr + hi_row + 16, e + e_lo)
    if NS_PAD > 0:
        _empty_slots(key_ptr, n_slots, row, NS_PAD)


@triton.jit
def _fp8_packed_kernel(
    x_desc, x_ptr, stride_xm, e_ptr, w_desc, s_ptr, out_ptr, M, N, K, stride_om,
    key_ptr, n_slots, w_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    K_BLOCKS: tl.constexpr, NUM_STAGES: tl.constexpr, MODE: tl.constexpr,
    PDL: tl.constexpr = False, KEY_GROUP: tl.constexpr = 0, PREFETCH_TILES: tl.constexpr = 0,
    PACK_N: tl.constexpr = 0, LOGITS_EVICT: tl.constexpr = "",
):
    # Weight pre-packed tile-major (pack_fp8_weight); MODE: PACKED_MODES. PACK_N (0: BLOCK_N): the
    # packing's tile rows, of which a program reads BLOCK_N (a stripe: a packed tile's
    # [BLOCK_N, BLOCK_K] pieces are contiguous), so that the grid may have more, shorter programs.
    PACKED_N: tl.constexpr = BLOCK_N if PACK_N == 0 else PACK_N
    SUB: tl.constexpr = PACKED_N // BLOCK_N
    pid_n = tl.program_id(0)
    row0 = (pid_n // SUB) * K_BLOCKS * PACKED_N + (pid_n % SUB) * BLOCK_N
    if PREFETCH_TILES > 0:
        # Before waiting on the kernel that prepares the activations: ask L2 for this program's
        # first weight tiles, so that the programs of the first wave find them there instead of
        # starting on an idle HBM.
        for t in tl.static_range(PREFETCH_TILES):
            _prefetch_l2(w_ptr + (row0 + t * PACKED_N).to(tl.int64) * BLOCK_K,
                         tl.full((), BLOCK_N * BLOCK_K, tl.int32))
    if PDL:
        # Launched early (programmatic dependent launch): let the re-scoring kernel launch in turn,
        # then wait until the pre-scaling kernel's output is complete and visible.
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    pid_m = tl.program_id(1)
    off_m = pid_m * BLOCK_M
    offs_m = off_m + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if MODE == 2:
        e = _row_exponent(x_ptr, stride_xm, M, K, offs_m, BLOCK_K)
        inv = tl.exp2(-e)
    if MODE == 3:
        e = tl.load(e_ptr + offs_m, mask=offs_m < M, other=0.0)
        inv = tl.exp2(-e)
    if MODE == 4:
        e = tl.load(e_ptr + offs_m, mask=offs_m < M, other=0.0)
    if MODE >= 5:
        e_at = 2 * off_m + tl.arange(0, BLOCK_M)
        e = tl.load(e_ptr + e_at, mask=offs_m < M, other=0.0)
        e_lo = tl.load(e_ptr + e_at + BLOCK_M, mask=offs_m < M, other=0.0)
    if MODE == 5:  # the lo parts' products, in their own accumulator
        acc_lo = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if MODE == 6:  # hi and lo parts side by side, split after the loop
        acc_both = tl.zeros((BLOCK_N, 2 * BLOCK_M), dtype=tl.float32)
    for kb in tl.range(0, K_BLOCKS, num_stages=NUM_STAGES):
        w = w_desc.load([row0 + kb * PACKED_N, 0])
        xk = x_desc.load([2 * off_m if MODE >= 5 else off_m, kb * BLOCK_K])
        if MODE == 1:
            acc = _dot_fp16_rescaled(w, xk, acc)
        elif MODE == 5:
            acc = _dot_fp8(w, xk, acc)
            acc_lo = _dot_fp8(w, x_desc.load([2 * off_m + BLOCK_M, kb * BLOCK_K]), acc_lo)
        elif MODE == 6:
            acc_both = _dot_fp8(w, xk, acc_both)
        elif MODE == 4:
            acc = tl.dot(w.to(tl.float16), tl.trans(xk), acc)
        elif MODE >= 2:
            xs = (xk.to(tl.float32) * inv[:, None]).to(tl.float16)
            acc = tl.dot(w.to(tl.float16), tl.trans(xs), acc)
        else:
            acc = tl.dot(w.to(xk.dtype), tl.trans(xk), acc)
    if MODE == 6:
        acc, acc_lo = tl.split(tl.permute(tl.reshape(acc_both, (BLOCK_N, 2, BLOCK_M)), (0, 2, 1)))
    if MODE >= 5:
        acc = acc * tl.exp2(e)[None, :] + acc_lo * tl.exp2(e_lo)[None, :]
    elif MODE >= 2:
        acc = acc * tl.exp2(e)[None, :]  # MODE 2, 3, 4
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    s = tl.load(s_ptr + offs_n)  # padded to a multiple of BLOCK_N
    acc = acc * s[:, None]
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty),
             mask=(offs_m < M)[None, :] & (offs_n < N)[:, None], eviction_policy=LOGITS_EVICT)
    if KEY_GROUP > 0:
        _fold_tile_keys(acc, offs_n, offs_m, M, N, key_ptr, n_slots, (pid_n // SUB) // KEY_GROUP)


# Triton's CPU interpreter has no FP8 dot; there the e4m3 operands are widened to fp32 (exact).
_FP8_DOT_VIA_F32 = tl.constexpr(_INTERPRETED)
# Hopper's FP8 MMA adds into its accumulator with fewer bits than fp32, so a sum carried through
# many MMAs drifts; every FP8_PROMOTE_K products the partial sum is added to an fp32 accumulator
# on the CUDA cores (Triton's max_num_imprecise_acc). 0: never; -1: once per BLOCK_K (256).
# Largest logit error against the exact product on an H200, relative to the largest logit (heavy-
# tailed hidden states; benchmarks/fp8_head_limit.py): 0: 2.7e-3 (M = 1) .. 1.7e-2 (M = 16);
# 128: 4.2e-4 .. 5.5e-4; -1: 4.6e-4 .. 6.5e-4 and the fastest; 32: 1.1e-4 but 2-5% slower.
# Half a bf16 ulp of the largest logit is 2^-9 = 2.0e-3. SPARKIT_FP8_PROMOTE_K is for measuring.
_PROMOTE = os.environ.get("SPARKIT_FP8_PROMOTE_K", "-1")
if not re.fullmatch(r"-1|0|[1-9][0-9]*", _PROMOTE):
    raise ValueError(f"SPARKIT_FP8_PROMOTE_K={_PROMOTE!r}: expected -1, 0 or a number of products")
FP8_PROMOTE_K = tl.constexpr(int(_PROMOTE))


@triton.jit
def _dot_fp8(w, xk, acc):
    """acc[BN, BM] += w[BN, BK] @ xk[BM, BK]^T, both e4m3, fp32 accumulation."""
    if _FP8_DOT_VIA_F32:
        return tl.dot(w.to(tl.float32), tl.trans(xk.to(tl.float32)), acc, input_precision="ieee")
    if FP8_PROMOTE_K < 0:
        return acc + tl.dot(w, tl.trans(xk))
    if FP8_PROMOTE_K == 0:
        return tl.dot(w, tl.trans(xk), acc)
    return tl.dot(w, tl.trans(xk), acc, max_num_imprecise_acc=FP8_PROMOTE_K)


@triton.jit
def _fold_tile_keys(y, offs_n, offs_m, M, N, key_ptr, n_slots, slot):
    """Exact re-scoring's candidates: the tile's best token per activation row (y: [tokens, rows]
    fp32 logits), folded by an atomic max into the row's `slot` (one per KEY_GROUP neighbouring
    128-token tiles, <= 256 slots per row) as a 64-bit key: order-preserving bits of the logit,
    then the token id. One int64 max over the tile finds the best logit and its token together."""
    bits = y.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    keys = (ordered.to(tl.int64) << 32) | offs_n.to(tl.int64)[:, None]
    keys = tl.where((offs_n < N)[:, None], keys, EMPTY_KEY)
    tl.atomic_max(key_ptr + offs_m.to(tl.int64) * n_slots + slot, tl.max(keys, axis=0),
                  mask=offs_m < M, sem="relaxed")


@triton.jit
def _prefetch_l2(ptr, nbytes):
    """One thread of the program asks for nbytes (a multiple of 16) from ptr into L2: a bulk
    prefetch (sm_90's cp.async.bulk.prefetch), a hint that cannot change any result."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _fp8_stream_kernel(
    x_desc, e_ptr, w_desc, w_ptr, w_bytes, s_ptr, out_ptr, M, N, stride_om, key_ptr, n_slots,
    n_stripes, prefetch_bytes,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PACK_N: tl.constexpr,
    K_BLOCKS: tl.constexpr, NUM_STAGES: tl.constexpr, KEY_GROUP: tl.constexpr,
    PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False, LOGITS_EVICT: tl.constexpr = "",
):
    """The persistent form of _fp8_packed_kernel (MODE 4): a grid of about as many programs as
    the GPU holds at once, each streaming one contiguous, balanced run of BLOCK_N-token stripes
    (BLOCK_N divides the packing's PACK_N: a stripe is PACK_N // BLOCK_N of a packed tile's rows,
    each [BLOCK_N, BLOCK_K] piece one contiguous TMA box). The (stripe, K block) loop is one flat
    loop, so the TMA pipeline runs on across stripes: no program starts with an empty pipeline
    after the first, and there is no last partial wave of programs. Each stripe's epilogue
    (scales, store, candidate keys) sits inside the loop while the next tiles are in flight.
    Before waiting on the pre-scaling kernel (PDL), a program asks L2 for its first
    prefetch_bytes of weight, so HBM is busy while the activations are prepared."""
    SUB: tl.constexpr = PACK_N // BLOCK_N
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    pid_m = tl.program_id(1)
    first = (pid * n_stripes) // n_prog
    last = ((pid + 1) * n_stripes) // n_prog
    if PREFETCH:
        start = (first // SUB).to(tl.int64) * (K_BLOCKS * PACK_N * BLOCK_K)
        todo = tl.minimum(prefetch_bytes, w_bytes - start)
        for c in range(0, todo, 32768):
            _prefetch_l2(w_ptr + start + c, tl.minimum(todo - c, 32768).to(tl.int32))
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    off_m = pid_m * BLOCK_M
    offs_m = off_m + tl.arange(0, BLOCK_M)
    pow2 = tl.exp2(tl.load(e_ptr + offs_m, mask=offs_m < M, other=0.0))
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for i in tl.range(0, (last - first) * K_BLOCKS, num_stages=NUM_STAGES):
        stripe = first + i // K_BLOCKS
        kb = i % K_BLOCKS
        w = w_desc.load([((stripe // SUB) * K_BLOCKS + kb) * PACK_N + (stripe % SUB) * BLOCK_N, 0])
        xk = x_desc.load([off_m, kb * BLOCK_K])
        acc = tl.dot(w.to(tl.float16), tl.trans(xk), acc)
        if kb == K_BLOCKS - 1:
            offs_n = stripe * BLOCK_N + tl.arange(0, BLOCK_N)
            # as _fp8_packed_kernel: the power of two first, then the scale (padded to the packing)
            y = acc * pow2[None, :] * tl.load(s_ptr + offs_n)[:, None]
            tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], y.to(out_ptr.dtype.element_ty),
                     mask=(offs_m < M)[None, :] & (offs_n < N)[:, None], eviction_policy=LOGITS_EVICT)
            if KEY_GROUP > 0:
                _fold_tile_keys(y, offs_n, offs_m, M, N, key_ptr, n_slots, (stripe // SUB) // KEY_GROUP)
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)


@triton.jit
def _rescore_candidate(key_ptr, out_ptr, stride_om, m, t, c, n_slots, N, NS_PAD: tl.constexpr,
                       SLOT_TOKENS: tl.constexpr, ST_PAD: tl.constexpr):
    """(token, whether there is one) of program (m, t, c) of _rescore_kernel, from row m's keys and
    logits as they are in memory now. Read at L2 (.cg): the keys and logits are written by other
    SMs, and a line kept in this SM's L1 from an earlier read would not show their final values."""
    offs = tl.arange(0, NS_PAD)
    keys = tl.load(key_ptr + m.to(tl.int64) * n_slots + offs, mask=offs < n_slots, other=EMPTY_KEY,
                   cache_modifier=".cg")
    for _ in range(t):
        keys = tl.where(keys == tl.max(keys, axis=0), EMPTY_KEY, keys)
    best = tl.max(keys, axis=0)
    # a key read before the main kernel is done may be anything (its slot not yet emptied): the
    # token is kept in range, so that a speculative row read stays inside the weight
    tok = tl.minimum(tl.maximum((best & 0xFFFFFFFF).to(tl.int32), 0), N - 1)
    found = best != EMPTY_KEY
    if c > 0:  # the slot's c-th runner-up by FP8 logit
        out_row = out_ptr + m.to(tl.int64) * stride_om
        start = (tok // SLOT_TOKENS) * SLOT_TOKENS
        offs_s = tl.arange(0, ST_PAD)
        in_slot = (offs_s < SLOT_TOKENS) & (start + offs_s < N)
        slot_logits = tl.load(out_row + start + offs_s, mask=in_slot, other=float("-inf"),
                              cache_modifier=".cg").to(tl.float32)
        slot_logits = tl.where(offs_s == tok - start, float("-inf"), slot_logits)
        for _ in range(c - 1):
            slot_logits = tl.where(offs_s == tl.argmax(slot_logits, axis=0), float("-inf"), slot_logits)
        tok = tl.minimum(start + tl.argmax(slot_logits, axis=0).to(tl.int32), N - 1)
        found = found & (tl.max(slot_logits, axis=0) > float("-inf"))
    return tok, found


@triton.jit
def _exact_logit(x_row, w_ptr, stride_wn, tok, k_end, BLOCK_K: tl.constexpr, K_BLOCKS: tl.constexpr):
    """x_row . w[tok] over the first k_end of K (0: no load is issued), fp32; loads unrolled so
    that they are all in flight at once."""
    w_row = w_ptr + tok.to(tl.int64) * stride_wn
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for kb in tl.static_range(K_BLOCKS):
        offs_k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(w_row + offs_k, mask=offs_k < k_end, other=0.0)
        xv = tl.load(x_row + offs_k, mask=offs_k < k_end, other=0.0)
        acc += w.to(tl.float32) * xv.to(tl.float32)
    return tl.sum(acc, axis=0)


@triton.jit
def _rescore_kernel(
    x_ptr, stride_xm, w_ptr, stride_wn, key_ptr, guess_key_ptr, out_ptr, stride_om, n_slots, N, K,
    NS_PAD: tl.constexpr, SLOT_TOKENS: tl.constexpr, ST_PAD: tl.constexpr,
    BLOCK_K: tl.constexpr, K_BLOCKS: tl.constexpr, PDL: tl.constexpr = False,
    SPECULATE: tl.constexpr = False,
):
    """Program (m, t, c): the c-th best token of row m's t-th best slot gets its exact logit.

    The FP8 logits decide which few tokens can be the argmax; the retained bf16 weight decides
    which of them is. Selection: t rounds of a max over the row's <= 256 keys (logit bits and token
    id in one int64, so the slot's best token needs no second lookup). For c > 0 the slot's own
    FP8 logits (SLOT_TOKENS values, from L2) give its runner-up tokens: a near-tie between
    neighbouring ids (the digits "3" and "4") shares a slot, so the slot's best alone would miss
    it. The programs of a slot write different tokens and read the slot's logits only at
    positions no other program writes (the best token is masked by position, not by value).

    SPECULATE: launched early (PDL), the program guesses its token from the keys and logits as
    they stand before the main kernel is done (guess_key_ptr: the same keys; a test passes others)
    and computes that token's exact logit while the main kernel's last programs run. After the
    wait it selects again from the final keys; where the guess was right, the HBM read of the bf16
    row is off the critical path, and where it was wrong the row is read then. Either way the
    value stored is the final token's dot product, computed by the same code: a guess can change
    the time, never the result."""
    m = tl.program_id(0)
    t = tl.program_id(1)
    c = tl.program_id(2)
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    if SPECULATE:
        guess, guess_found = _rescore_candidate(guess_key_ptr, out_ptr, stride_om, m, t, c, n_slots, N,
                                                NS_PAD, SLOT_TOKENS, ST_PAD)
        guessed = _exact_logit(x_row, w_ptr, stride_wn, guess, tl.where(guess_found, K, 0), BLOCK_K, K_BLOCKS)
    if PDL:  # launched while the main kernel finishes: wait for all its logits and keys
        tl.extra.cuda.gdc_wait()
    tok, found = _rescore_candidate(key_ptr, out_ptr, stride_om, m, t, c, n_slots, N, NS_PAD, SLOT_TOKENS, ST_PAD)
    if SPECULATE:
        hit = guess_found & (guess == tok)
        logit = _exact_logit(x_row, w_ptr, stride_wn, tok, tl.where(found & ~hit, K, 0), BLOCK_K, K_BLOCKS)
        logit = tl.where(hit, guessed, logit)
    else:
        logit = _exact_logit(x_row, w_ptr, stride_wn, tok, tl.where(found, K, 0), BLOCK_K, K_BLOCKS)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + tok, logit.to(out_ptr.dtype.element_ty), mask=found)


@dataclass
class PackedFp8Weight:
    """An [N, K] e4m3 weight re-laid tile-major for _fp8_packed_kernel, with its padded scales."""

    data: torch.Tensor  # [N_pad / block_n * K_pad / block_k * block_n, block_k] float8_e4m3fn
    scale: torch.Tensor  # [N_pad] float32
    n: int
    k: int
    block_n: int
    block_k: int
    # Exact top-k re-scoring (see sparkit.kernels.fp8_linear): the unquantised [N, K] weight
    # (row-major, bf16 as loaded) and how many FP8 top candidates per row it re-scores (0: off).
    exact: torch.Tensor | None = None
    exact_top_k: int = 0
    # The kernel config per number of activation rows M, chosen on this GPU by
    # sparkit.kernels.fp8_tune.tune_packed (empty: PACKED_DEFAULT for every M), and its report.
    tuned: dict = field(default_factory=dict)
    tuning: object = None

    @property
    def shape(self):
        return (self.n, self.k)

    def config_for(self, m: int) -> KernelConfig:
        """The config that serves m rows: the tuned one for m, else that of the largest tuned M
        below m (M > 16 runs 16-row blocks), else PACKED_DEFAULT."""
        if not self.tuned:
            return PACKED_DEFAULT
        if m in self.tuned:
            return self.tuned[m]
        below = [t for t in self.tuned if t <= m]
        return self.tuned[max(below)] if below else PACKED_DEFAULT


def pack_fp8_weight(weight_fp8, scale, block_n: int = PACK_BLOCK_N,
                    block_k: int = PACK_BLOCK_K, exact=None, exact_top_k: int = 0) -> PackedFp8Weight:
    n, k = weight_fp8.shape
    n_pad = triton.cdiv(n, block_n) * block_n
    k_pad = triton.cdiv(k, block_k) * block_k
    w = weight_fp8
    if (n_pad, k_pad) != (n, k):
        w = torch.zeros((n_pad, k_pad), dtype=weight_fp8.dtype, device=weight_fp8.device)
        w[:n, :k] = weight_fp8
    tiles = (w.view(n_pad // block_n, block_n, k_pad // block_k, block_k)
             .permute(0, 2, 1, 3).contiguous()
             .view(-1, block_k))
    s = torch.ones(n_pad, dtype=torch.float32, device=scale.device)
    s[:n] = scale.reshape(-1).float()
    if exact is not None:
        _check_exact(exact, n, k)
    return PackedFp8Weight(tiles, s, n, k, block_n, block_k, exact if exact_top_k > 0 else None,
                           exact_top_k if exact is not None else 0)


_PDL_CACHE: dict = {}


def pdl_available(device) -> bool:
    """Programmatic dependent launch: Hopper (sm_90) and later, with Triton's griddepcontrol ops;
    not under the CPU interpreter. SPARKIT_FP8_PDL=0 turns it off."""
    if _INTERPRETED or os.environ.get("SPARKIT_FP8_PDL", "1") == "0":
        return False
    key = str(device)
    if key not in _PDL_CACHE:
        ok = False
        try:
            from triton.language.extra.cuda import gdc_wait  # noqa: F401  (present: PDL usable)

            ok = torch.cuda.get_device_capability(device)[0] >= 9
        except Exception:
            ok = False
        _PDL_CACHE[key] = ok
    return _PDL_CACHE[key]


# Exact re-scoring on CUDA: each row's tiles are folded into at most RESCORE_SLOTS slots (a slot
# keeps the best FP8 logit of its tiles); the k best slots each re-score their RESCORE_PER_SLOT
# best tokens, so k slots re-score up to k * RESCORE_PER_SLOT tokens. RESCORE_WARPS: the
# re-scoring kernel's warps (latency-bound; measured on an H200 in benchmarks/fp8_lm_head.py).
RESCORE_SLOTS = 256
RESCORE_PER_SLOT = TOKENS_PER_STRETCH
RESCORE_WARPS = 1
# The logits stores' L2 policy: "evict_last" keeps them in L2 while the 402 MB weight streams past
# (the re-scoring and the sampler read them next), where written back under the stream's pressure
# they cost the read stream up to 6 us at M = 16 (H200 session 9, call 5: FP8 kernel 95.3 us at
# every M with it, 94.5-100.5 us without). SPARKIT_FP8_LOGITS_EVICT="" (the default policy) is
# for measuring that again.
LOGITS_EVICT = os.environ.get("SPARKIT_FP8_LOGITS_EVICT", "evict_last")
if LOGITS_EVICT not in ("", "evict_last", "evict_first"):
    raise ValueError(f"SPARKIT_FP8_LOGITS_EVICT={LOGITS_EVICT!r}: expected evict_last, evict_first or empty")
# Re-scoring guesses its tokens before the main kernel is done and reads their bf16 rows while the
# last programs run (_rescore_kernel's SPECULATE; with PDL only, where it launches early). The
# result is the same either way. H200 session 10, side by side: 0-1.0 us saved per call (0.8 at
# M = 1), never slower; least where a re-scored token lies in the last wave's stripes (its key is
# not there yet when the guess is made). SPARKIT_FP8_RESCORE_SPECULATE=0 turns it off, for measuring.
_SPECULATE = os.environ.get("SPARKIT_FP8_RESCORE_SPECULATE", "1")
if _SPECULATE not in ("0", "1"):
    raise ValueError(f"SPARKIT_FP8_RESCORE_SPECULATE={_SPECULATE!r}: expected 1 or 0")
RESCORE_SPECULATE = _SPECULATE == "1"
# Measured and dropped (H200 session 9): starting the re-scoring kernel on a count of the main
# kernel's programs done (release/acquire) instead of on its grid's completion saved <= 0.6 us
# of re-scoring and cost 0.8 us in the main kernel's epilogues (a barrier and an atomic each).


def _check_exact(exact, n, k):
    if exact.dim() != 2 or exact.shape[0] < n or exact.shape[1] != k or exact.stride(1) != 1:
        raise ValueError(f"the exact weight must be a row-major [>= {n}, {k}] tensor "
                         f"(got shape {tuple(exact.shape)}, strides {tuple(exact.stride())})")


def unpack_fp8_weight(packed: PackedFp8Weight):
    """Back to the [N, K] row-major tensor (for reports and reference checks)."""
    n_pad = packed.scale.shape[0]
    kb = packed.data.shape[0] // n_pad
    w = (packed.data.view(n_pad // packed.block_n, kb, packed.block_n, packed.block_k)
         .permute(0, 2, 1, 3).reshape(n_pad, kb * packed.block_k))
    return w[: packed.n, : packed.k].contiguous(), packed.scale[: packed.n].clone()


def fp8_linear_packed(x, packed: PackedFp8Weight, out_dtype=None, num_warps: int = 4,
                      num_stages: int = 4, mode: int = 2, exact=None, exact_top_k: int | None = None,
                      rescore: bool = True, pdl: bool | None = None, key_slots: int | None = None,
                      rescore_warps: int | None = None, per_slot: int | None = None,
                      config: KernelConfig | None = None, speculate: bool | None = None):
    """exact/exact_top_k default to the packed weight's own (exact_top_k=0 turns re-scoring off).
    config (a PACKED_MODES kind or STREAM_KIND) replaces num_warps, num_stages and mode.
    The other keywords override module settings for benchmarks/fp8_lm_head.py, which times the
    parts: rescore=False stops after the candidates; pdl, key_slots, rescore_warps, per_slot,
    speculate (_rescore's)."""
    stream = None
    if config is not None:
        stream, mode, num_warps, num_stages = _packed_config(config, packed, num_warps, num_stages)
    out_dtype = out_dtype or x.dtype
    if exact is None:
        exact = packed.exact
    if exact_top_k is None:
        exact_top_k = packed.exact_top_k if exact is not None else 0
    n, k = packed.n, packed.k
    lead = x.shape[:-1]
    x2 = _kernel_rows(x, k, mode)
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0:
        return out.reshape(*lead, n)
    mode = _mode_for_rows(mode, x2, stream)
    block_m = 16
    # Programmatic dependent launch chains the 2-3 kernels of a call without a launch gap
    # between them (each waits on the previous one's results inside the kernel).
    pdl = pdl_available(x2.device) if pdl is None else pdl
    launch = {"launch_pdl": True} if pdl else {}
    # the grid kernel's programs each read one stripe of block_n tokens (a whole packed tile, or a part)
    block_n = config.block_n if config is not None and stream is None else packed.block_n
    grid = (packed.scale.shape[0] // block_n, triton.cdiv(m, block_m))
    n_tiles = packed.scale.shape[0] // packed.block_n
    top_k = min(exact_top_k, n) if exact is not None else 0
    key_group, n_slots, keys = _candidate_slots(m, n_tiles, top_k, key_slots, mode, out)
    x_desc, exps = _activation_rows(x2, mode, block_m, packed.block_k, keys, n_slots, key_group, pdl)
    k_blocks = packed.data.shape[0] // packed.scale.shape[0]
    if stream is not None:
        n_stripes = packed.scale.shape[0] // stream.block_n
        programs = min(n_stripes, stream_programs(stream, x2.device))
        _fp8_stream_kernel[(programs, triton.cdiv(m, block_m))](
            x_desc, exps, _descriptor(packed.data, (stream.block_n, packed.block_k)), packed.data,
            packed.data.numel(), packed.scale, out, m, n, out.stride(0), keys, n_slots, n_stripes,
            stream.prefetch_kb * 1024,
            BLOCK_M=block_m, BLOCK_N=stream.block_n, BLOCK_K=packed.block_k, PACK_N=packed.block_n,
            K_BLOCKS=k_blocks, NUM_STAGES=stream.num_stages, KEY_GROUP=key_group,
            PDL=pdl, PREFETCH=not _INTERPRETED, LOGITS_EVICT=LOGITS_EVICT,
            num_warps=stream.num_warps, **launch,
        )
    else:
        w_desc = _descriptor(packed.data, (block_n, packed.block_k))
        if mode == 3:
            exps = torch.empty((m,), dtype=torch.float32, device=x2.device)
            _row_exponent_kernel[(triton.cdiv(m, block_m),)](
                x2, exps, m, k, x2.stride(0), BLOCK_M=block_m, BLOCK_K=256, num_warps=4)
        _fp8_packed_kernel[grid](
            x_desc, x2, x2.stride(0), exps, w_desc, packed.scale, out, m, n, k, out.stride(0),
            keys, n_slots, packed.data,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=packed.block_k, PACK_N=packed.block_n,
            K_BLOCKS=k_blocks, NUM_STAGES=num_stages,
            MODE=mode, KEY_GROUP=key_group, num_warps=num_warps,
            PREFETCH_TILES=0 if _INTERPRETED or config is None else
            min(config.prefetch_kb * 1024 // (block_n * packed.block_k), k_blocks),
            PDL=pdl and mode >= 4, LOGITS_EVICT=LOGITS_EVICT, **(launch if mode >= 4 else {}),
        )
    if key_group and rescore:
        _rescore(x2, exact, keys, out, n_slots, key_group * packed.block_n, min(top_k, n_slots),
                 RESCORE_WARPS if rescore_warps is None else rescore_warps,
                 RESCORE_PER_SLOT if per_slot is None else per_slot, pdl, launch, speculate=speculate)
    return out.reshape(*lead, n)


def _mode_for_rows(mode: int, x2, stream) -> int:
    """The mode that can read these activation rows (K = x2's row length) in place of `mode`."""
    k = x2.shape[1]
    if mode in FP8_ACTIVATION_MODES and (x2.dtype != torch.bfloat16 or k % 16 or k > PRESCALE_ONE_PASS_K):
        # Two e4m3 parts hold a bf16 value's 8 significant bits, not fp16's 11; e4m3 rows must be
        # 16-byte aligned for TMA, and are split in one read.
        mode = 4
    if mode == 4 and k % 8:
        if stream is not None:
            raise ValueError(f"{stream.label()} needs K divisible by 8 (K={k})")
        mode = 1  # the fp16 copy's rows would not be 16-byte aligned for TMA
    return mode


def _activation_rows(x2, mode: int, block_m: int, block_k: int, keys, n_slots: int, key_group: int, pdl: bool):
    """(the TMA descriptor of the activations as `mode` reads them, their powers of two or x2 when
    the mode has none); from mode 4 the kernel that prepares them also empties the key slots."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if mode == 4:
        xs, exps = _prescaled_rows(x2, keys, n_slots, key_group, pdl)
        return TensorDescriptor.from_tensor(xs, [block_m, block_k]), exps
    if mode in FP8_ACTIVATION_MODES:
        xs, exps = _split_rows(x2, keys, n_slots, key_group, pdl)
        return TensorDescriptor.from_tensor(xs, [block_m * (2 if mode == 6 else 1), block_k]), exps
    return TensorDescriptor.from_tensor(x2, [block_m, block_k]), x2


def reference_candidate_keys(logits, slot_tokens: int):
    """What the main kernels' epilogues fold into the key slots (_fold_tile_keys), computed by
    torch from fp32 logits [M, N]: per row and slot of slot_tokens tokens, the int64 max of the
    logit's order-preserving bits << 32 | token id. For checking the re-scoring kernel."""
    m, n = logits.shape
    n_slots = -(-n // slot_tokens)
    bits = logits.float().contiguous().view(torch.int32).long()
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    keyed = (ordered << 32) | torch.arange(n, device=logits.device)
    keyed = torch.nn.functional.pad(keyed, (0, n_slots * slot_tokens - n), value=-(2 ** 63))
    return keyed.view(m, n_slots, slot_tokens).max(2).values.contiguous()


def _rescore(x2, exact, keys, out, n_slots: int, slot_tokens: int, slots_read: int, warps: int, tokens: int,
             pdl: bool, launch: dict, speculate: bool | None = None, guess_keys=None) -> None:
    """The exact (bf16) logits of the candidates in the key slots, written over their FP8 ones in `out`.
    speculate (default: RESCORE_SPECULATE where the kernel launches early, pdl) guesses the
    tokens from guess_keys (default: keys, as they stand when the kernel starts)."""
    m, k = x2.shape
    n = out.shape[1]
    speculate = (RESCORE_SPECULATE and pdl) if speculate is None else speculate
    _rescore_kernel[(m, slots_read, tokens)](
        x2, x2.stride(0), exact, exact.stride(0), keys, keys if guess_keys is None else guess_keys,
        out, out.stride(0), n_slots, n, k, **rescore_constants(n_slots, slot_tokens, k, warps),
        num_warps=warps, PDL=pdl, SPECULATE=speculate, **launch,
    )


def rescore_constants(n_slots: int, slot_tokens: int, k: int, warps: int) -> dict:
    """_rescore_kernel's block sizes for these slots and K (benchmarks/fp8_kernel_compile_check.py
    builds it with the same): each of its warps' lanes loads 8 contiguous bf16 per K block."""
    block_k = min(triton.next_power_of_2(k), 32 * warps * 8)
    return dict(NS_PAD=triton.next_power_of_2(n_slots), SLOT_TOKENS=slot_tokens,
                ST_PAD=triton.next_power_of_2(slot_tokens), BLOCK_K=block_k, K_BLOCKS=triton.cdiv(k, block_k))


def _packed_config(config: KernelConfig, packed: PackedFp8Weight, num_warps: int,
                   num_stages: int) -> tuple[KernelConfig | None, int, int, int]:
    """A kernel config -> (the stream config or None, mode, num_warps, num_stages), checked against the weight."""
    stream = None
    if config.kind == STREAM_KIND:
        stream, mode = config, 4
    elif config.kind in PACKED_MODES:
        mode = PACKED_MODES[config.kind]
        num_warps, num_stages = config.num_warps, config.num_stages
    else:
        raise ValueError(f"kernel config {config.label()} does not read a packed weight "
                         f"(kinds: {', '.join([*PACKED_MODES, STREAM_KIND])})")
    _check_config_fits(config, packed)
    return stream, mode, num_warps, num_stages


def _prescaled_rows(x2, keys, n_slots: int, key_group: int, pdl: bool):
    """Mode 4's fp16 copy of the rows, each scaled by a power of two, and those exponents (the
    kernel also empties the candidates' slots)."""
    m, k = x2.shape
    xs = torch.empty((m, k), dtype=torch.float16, device=x2.device)
    exps = torch.empty((m,), dtype=torch.float32, device=x2.device)
    # A plain launch (it reads x, written by whatever ran before); it lets the next launch early.
    one_pass = k <= PRESCALE_ONE_PASS_K
    _prescale_rows_kernel[(m,)](x2, xs, exps, k, x2.stride(0), keys, n_slots,
                                BLOCK_K=triton.next_power_of_2(k) if one_pass else 512,
                                num_warps=4, PDL=pdl, ONE_PASS=one_pass,
                                NS_PAD=triton.next_power_of_2(n_slots) if key_group else 0)
    return xs, exps


def _split_rows(x2, keys, n_slots: int, key_group: int, pdl: bool):
    """The FP8-activation modes' e4m3 rows (two per activation row, 32 per block of 16) and their
    powers of two (the kernel also empties the candidates' slots)."""
    m, k = x2.shape
    rows = triton.cdiv(m, 16) * 32
    x8 = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=x2.device)
    exps = torch.empty((rows,), dtype=torch.float32, device=x2.device)
    _split_rows_fp8_kernel[(m,)](x2, x8, exps, k, x2.stride(0), keys, n_slots,
                                 BLOCK_K=triton.next_power_of_2(k), num_warps=4, PDL=pdl,
                                 NS_PAD=triton.next_power_of_2(n_slots) if key_group else 0)
    return x8, exps


def _kernel_rows(x, k: int, mode: int):
    """x as the kernels read it: 2-D rows of K, contiguous, 16-byte aligned (TMA), bf16/fp16 (fp32 too from mode 1)."""
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    if x2.dtype not in (torch.bfloat16, torch.float16) and not (mode >= 1 and x2.dtype == torch.float32):
        x2 = x2.to(torch.bfloat16)
    if x2.data_ptr() % 16 or (k * x2.element_size()) % 16:
        x2 = x2.clone()  # TMA needs 16-byte aligned rows; a fresh allocation is aligned
        if (k * x2.element_size()) % 16:
            raise ValueError(f"fp8_linear_packed needs K * itemsize divisible by 16 (K={k})")
    return x2


def _candidate_slots(m: int, n_tiles: int, top_k: int, key_slots: int | None, mode: int, out):
    """(tiles per key slot, slots, the slots' tensor) of the candidates the re-scoring reads; (0, 0, unused)
    without re-scoring."""
    slots = RESCORE_SLOTS if key_slots is None else key_slots
    key_group = triton.cdiv(n_tiles, slots) if top_k else 0
    n_slots = triton.cdiv(n_tiles, key_group) if key_group else 0
    if not key_group:
        return key_group, n_slots, out  # unused
    keys = torch.empty((m, n_slots), dtype=torch.int64, device=out.device)
    if mode < 4:  # from mode 4 the kernel that prepares the activations empties the slots
        keys.fill_(-(2 ** 63))
    return key_group, n_slots, keys


def _check_config_fits(config: KernelConfig, packed: PackedFp8Weight) -> None:
    """A packed-weight config reads the packing's own tiles: its K block is the packing's, and its
    stripes (a grid program's, or a persistent program's) split a packed tile evenly."""
    if config.block_k != packed.block_k or (
            config.kind == STREAM_KIND and (packed.block_n % config.block_n or config.ctas_per_sm < 1)) or (
            config.kind in PACKED_MODES and packed.block_n % config.block_n):
        raise ValueError(f"kernel config {config.label()} does not fit a weight packed as "
                         f"{packed.block_n}x{packed.block_k} tiles")


# Rows up to this long are pre-scaled in one read (4 warps hold 8192 values in registers).
PRESCALE_ONE_PASS_K = 8192

# Under the CPU interpreter there is no GPU: a persistent grid is sized as if it had this many SMs
# (few, so that the tests see programs with unequal runs of stripes).
INTERPRETER_SMS = 3
_SM_COUNT: dict = {}


def stream_programs(config: KernelConfig, device) -> int:
    """The persistent grid of a STREAM_KIND config on `device`: ctas_per_sm programs per SM."""
    key = str(device)
    if key not in _SM_COUNT:
        _SM_COUNT[key] = (torch.cuda.get_device_properties(device).multi_processor_count
                          if torch.device(device).type == "cuda" else INTERPRETER_SMS)
    return max(1, config.ctas_per_sm) * _SM_COUNT[key]


_DESCRIPTORS: dict = {}


def _descriptor(t, block_shape):
    """Host-side TMA descriptors, cached per tensor storage and tile (building one costs host time)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, tuple(block_shape))
    desc = _DESCRIPTORS.get(key)
    if desc is None:
        if len(_DESCRIPTORS) > 64:
            _DESCRIPTORS.clear()
        desc = TensorDescriptor.from_tensor(t, list(block_shape))
        _DESCRIPTORS[key] = desc
    return desc


@triton.jit
def _fp8_ccr_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_om,
    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    # CUDA-core variant that reduces each tile at once: fewer registers than _fp8_cc_kernel, so
    # larger tiles (more weight bytes in flight per program) fit. Needs K % BLOCK_K == 0.
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, M_PAD)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    for _k0 in range(0, K, BLOCK_K):
        if EVEN_N:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
        x = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
        acc += tl.sum(w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :], axis=2)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if EVEN_N:
        s = tl.load(s_ptr + offs_n)
    else:
        s = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)
    y = acc * s[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def choose_config(m: int, x_dtype) -> KernelConfig:
    if x_dtype == torch.float32:
        # tl.dot on fp32 would round through tf32; the CUDA-core kernel stays exact in fp32.
        return FP32_DEFAULT
    return UNPACKED_DEFAULT


def fp8_linear_packed_default(x, packed: PackedFp8Weight, out_dtype=None, exact=None,
                              exact_top_k: int | None = None, **overrides):
    """The shipped path for a packed weight: the config tuned for this M on this GPU
    (PackedFp8Weight.config_for; PACKED_DEFAULT when untuned), with its exact re-scoring."""
    m = x.numel() // x.shape[-1] if x.dim() else 0
    return fp8_linear_packed(x, packed, out_dtype, exact=exact, exact_top_k=exact_top_k,
                             config=overrides.pop("config", None) or packed.config_for(m), **overrides)


def fp8_linear(x, weight_fp8, scale, out_dtype=None, config: KernelConfig | None = None):
    """y[..., N] = x[..., K] @ (weight_fp8 * scale[:, None]).T with fp32 accumulation.
    A packed weight with an exact weight also gets its exact top-k re-scoring."""
    if isinstance(weight_fp8, PackedFp8Weight):
        return fp8_linear_packed_default(x, weight_fp8, out_dtype, config=config)
    out_dtype = out_dtype or x.dtype
    n, k = weight_fp8.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if not weight_fp8.is_contiguous():
        weight_fp8 = weight_fp8.contiguous()
    scale = scale.reshape(-1)
    if scale.dtype != torch.float32:
        scale = scale.float()
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0:
        return out.reshape(*lead, n)
    cfg = config or choose_config(m, x2.dtype)
    even_n = n % cfg.block_n == 0
    even_k = k % cfg.block_k == 0
    if cfg.kind == "dot":
        block_m = 16
        grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, block_m))
        _fp8_dot_kernel[grid](
            x2, weight_fp8, scale, out, m, n, k, x2.stride(0), out.stride(0),
            BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            EVEN_N=even_n, EVEN_K=even_k, W_VIA_F32=_INTERPRETED,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    elif cfg.kind in ("tma", "tma16"):
        block_m = 16
        grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, block_m))
        # Activations are re-described every call (they change); the weight descriptor is cached.
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_desc = TensorDescriptor.from_tensor(x2, [block_m, cfg.block_k])
        w_desc = _descriptor(weight_fp8, (cfg.block_n, cfg.block_k))
        _fp8_tma_kernel[grid](
            x_desc, w_desc, scale, out, m, n, k, out.stride(0),
            BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            NUM_STAGES=cfg.num_stages, EVEN_N=even_n, F16=cfg.kind == "tma16",
            num_warps=cfg.num_warps,
        )
    elif cfg.kind == "ccr" and even_k:
        grid = (triton.cdiv(n, cfg.block_n),)
        for start in range(0, m, 2):
            rows = min(2, m - start)
            _fp8_ccr_kernel[grid](
                x2[start:], weight_fp8, scale, out[start:], rows, n, k, x2.stride(0), out.stride(0),
                M_PAD=triton.next_power_of_2(rows), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                EVEN_N=even_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )
    else:
        grid = (triton.cdiv(n, cfg.block_n),)
        for start in range(0, m, 4):
            # Register use grows with M_PAD * BLOCK_N * BLOCK_K; four rows per launch at most.
            rows = min(4, m - start)
            m_pad = triton.next_power_of_2(rows)
            _fp8_cc_kernel[grid](
                x2[start:], weight_fp8, scale, out[start:], rows, n, k, x2.stride(0), out.stride(0),
                M_PAD=m_pad, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                EVEN_N=even_n, EVEN_K=even_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )
    return out.reshape(*lead, n)
