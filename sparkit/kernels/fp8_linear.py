"""Weight-only FP8 (W8A16) linear for the lm_head: e4m3 weights with per-row scales.

API (stable; the Triton fast path is added behind it):
    quantize_fp8_per_row(weight) -> (weight_fp8 [N, K] float8_e4m3fn, scale [N] float32)
    fp8_linear(x [..., K], weight_fp8, scale, out_dtype=None) -> [..., N]
    prepare_fp8_weight(weight_fp8, scale) -> PackedFp8Weight | None   (added; optional)
    kernel_description(weight_fp8) -> str   (added: which path fp8_linear takes, for logs/reports)

On CPU (and where Triton is missing) the reference path dequantises in row
chunks so that memory stays bounded; on CUDA a Triton kernel is used when present.
For the full speed on CUDA, pack the weight once with prepare_fp8_weight (a tile-major
re-layout, same bytes) and pass the packed weight as weight_fp8 (scale=None).

Exact top-k re-scoring (exact_weight=, exact_top_k=): per-row e4m3 keeps 4 significant bits, so
where the two best tokens are within a few hundredths of a logit the FP8 argmax can differ from
the bf16 one (a near-tie flip: 5% of positions on a synthetic Ling-shaped head, 1% on tiny-ling).
With the unquantised weight kept, the best FP8 candidates of every row are recomputed exactly
from it (fp32 product of the activation and the bf16 row): the FP8 logits pick the few tokens
that can win, the bf16 weight decides between them, and the argmax is the bf16 head's unless the
true best token is not among the candidates. Candidates: on CUDA, the vocabulary is cut into at
most 256 stretches of whole 128-token tiles; the kernel's epilogue keeps each stretch's best
FP8 logit, and a small second kernel re-scores the best TOKENS_PER_STRETCH tokens of each of the
exact_top_k best stretches (the runner-up matters: near-ties between neighbouring ids such as the
digits share a stretch). The torch path re-scores the exact_top_k * TOKENS_PER_STRETCH best
tokens of the row. The other logits stay FP8. It costs keeping the bf16 weight next to the FP8
copy (memory, not bandwidth: 2 * k * K * 2 bytes more read per row, 40 KB for k = 4 on Ling).
"""

from __future__ import annotations

from sparkit.kernels.rescoring import DEFAULT_EXACT_TOP_K, TOKENS_PER_STRETCH  # noqa: F401 (re-exported)

FP8_E4M3_MAX = 448.0


def quantize_fp8_per_row(weight):
    """Per-output-row symmetric e4m3 quantisation; scale = max|row| / 448 (1.0 for all-zero rows)."""
    import torch

    w = weight.detach().to(torch.float32)
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_E4M3_MAX, torch.ones_like(amax))
    q = (w / scale[:, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


# CPU: the dequantised weight (exact: e4m3 * float32 scale) is kept next to the fp8 weight, so an
# fp8 head costs what a float32 head costs instead of re-decoding on every call. Keyed by the
# weight object (weakly) and both tensors' version counters; only for weights up to this size.
_CPU_DEQUANT_CACHE_MAX_ELEMENTS = 1 << 26
_cpu_dequantised: dict = {}


def _cached_dequantised_t(weight_fp8, scale):
    """[K, N] float32 dequantised weight (transposed: faster for a few rows on CPU), or None."""
    import weakref

    import torch

    if weight_fp8.is_cuda or weight_fp8.numel() > _CPU_DEQUANT_CACHE_MAX_ELEMENTS or weight_fp8.requires_grad:
        return None
    key = id(weight_fp8)
    entry = _cpu_dequantised.get(key)
    if entry is not None:
        ref, version, scale_ref, scale_version, w_t = entry
        if ref() is weight_fp8 and scale_ref() is scale and version == weight_fp8._version and scale_version == scale._version:
            return w_t
    w_t = (weight_fp8.to(torch.float32) * scale[:, None].to(torch.float32)).T.contiguous()
    ref = weakref.ref(weight_fp8, lambda _r, key=key: _cpu_dequantised.pop(key, None))
    _cpu_dequantised[key] = (ref, weight_fp8._version, weakref.ref(scale), scale._version, w_t)
    return w_t


def rescore_top_k(x, logits, exact_weight, top_k: int):
    """In place: the top_k * TOKENS_PER_STRETCH largest logits of each row recomputed as
    x . exact_weight[token] (fp32 accumulation), rounded to the logits' dtype. Returns logits.
    The torch path (any device)."""
    import torch

    n = logits.shape[-1]
    top_k = min(int(top_k) * TOKENS_PER_STRETCH, n)
    if top_k <= 0 or logits.numel() == 0:
        return logits
    x2 = x.reshape(-1, x.shape[-1])
    y2 = logits.view(-1, n)
    idx = y2.float().topk(top_k, dim=-1).indices  # [M, k]
    rows = exact_weight[idx].to(torch.float32)  # [M, k, K]
    exact = torch.einsum("mk,mjk->mj", x2.to(torch.float32), rows)
    y2.scatter_(1, idx, exact.to(y2.dtype))
    return logits


def fp8_linear_reference(x, weight_fp8, scale, out_dtype=None, chunk_rows: int = 8192):
    """y = x @ (weight_fp8 * scale[:, None]).T, fp32 accumulation, chunked over output rows."""
    import torch

    out_dtype = out_dtype or x.dtype
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
    n = weight_fp8.shape[0]
    w_t = _cached_dequantised_t(weight_fp8, scale)
    if w_t is not None:
        return torch.mm(x2, w_t).to(out_dtype).reshape(*lead, n)
    out = torch.empty((x2.shape[0], n), dtype=out_dtype, device=x.device)
    for start in range(0, n, chunk_rows):
        stop = min(n, start + chunk_rows)
        w = weight_fp8[start:stop].to(torch.float32) * scale[start:stop, None].to(torch.float32)
        out[:, start:stop] = (x2 @ w.T).to(out_dtype)
    return out.reshape(*lead, n)


def prepare_fp8_weight(weight_fp8, scale, exact_weight=None, exact_top_k: int = 0, tune: bool = True,
                       log=None):
    """The weight re-laid for the CUDA kernel (sparkit.kernels.fp8_gemv_triton.PackedFp8Weight),
    or None where that kernel cannot run (CPU tensors, no Triton): then keep using the tensors.
    With exact_weight (the unquantised [N, K] weight, kept by reference) and exact_top_k > 0 the
    packed weight re-scores each row's top exact_top_k logits exactly (see the module docstring).
    tune: choose the kernel config per M on this GPU now (sparkit.kernels.fp8_tune; a head
    below its size threshold, or SPARKIT_FP8_TUNE=0, keeps the default). Call it before any CUDA
    graph capture (tuning is skipped during one); log(str) gets the one-line outcome."""
    if not weight_fp8.is_cuda:
        return None
    try:
        from sparkit.kernels import fp8_gemv_triton
    except ImportError:
        return None
    if exact_weight is not None and not exact_weight.is_contiguous():
        exact_weight = exact_weight.contiguous()
    packed = fp8_gemv_triton.pack_fp8_weight(weight_fp8, scale, exact=exact_weight,
                                             exact_top_k=exact_top_k)
    if tune:
        from sparkit.kernels.fp8_tune import TuneReport, tune_packed

        try:
            tune_packed(packed, log=log)
        except Exception as exc:  # the head must still come up: on the default config
            packed.tuned = {}
            packed.tuning = TuneReport(source="skipped", reason=f"tuning failed: {type(exc).__name__}: {exc}")
            if log:
                log(f"FP8 head kernel: {packed.tuning.summary()}")
    return packed


def exact_description(exact_top_k: int) -> str:
    return (f"top-{exact_top_k} candidates re-scored exactly from the bf16 weight" if exact_top_k > 0
            else "no exact re-scoring")


def kernel_description(weight_fp8, exact_top_k: int | None = None) -> str:
    """Which path fp8_linear(x, weight_fp8, ...) takes for x on weight_fp8's device, in words
    (for the engine's log and activation report: proof that the Triton kernel serves the head).
    exact_top_k: the re-scoring a plain-tensor caller passes (a packed weight carries its own)."""
    if not hasattr(weight_fp8, "dtype"):
        from sparkit.kernels import fp8_gemv_triton

        tuning = weight_fp8.tuning
        kernel = (tuning.summary() if weight_fp8.tuned and tuning is not None
                  else fp8_gemv_triton.PACKED_DEFAULT.label())
        return (f"Triton W8A16 kernel {kernel} "
                f"(tile-packed e4m3 weight {weight_fp8.block_n}x{weight_fp8.block_k}; "
                f"{exact_description(weight_fp8.exact_top_k)})")
    suffix = f"; {exact_description(exact_top_k)}" if exact_top_k is not None else ""
    if weight_fp8.is_cuda:
        try:
            from sparkit.kernels import fp8_gemv_triton
        except ImportError:
            pass
        else:
            return (f"Triton W8A16 kernel {fp8_gemv_triton.UNPACKED_DEFAULT.label()} "
                    f"(row-major e4m3 weight{suffix})")
    return f"torch reference (e4m3 weight dequantised with its row scales, fp32 matmul{suffix})"


def fp8_linear(x, weight_fp8, scale, out_dtype=None, exact_weight=None, exact_top_k: int | None = None):
    """Dispatch: the Triton kernel on CUDA when available, else the reference path.

    weight_fp8 is an [N, K] e4m3 tensor (with scale [N]) or a prepare_fp8_weight() result (which
    carries its own exact weight and top-k; exact_top_k=0 turns its re-scoring off for this call).
    exact_weight + exact_top_k: re-score each row's top-k logits exactly (module docstring).
    """
    if not hasattr(weight_fp8, "dtype"):  # a packed weight: only the CUDA kernel reads it
        from sparkit.kernels import fp8_gemv_triton

        return fp8_gemv_triton.fp8_linear_packed_default(
            x, weight_fp8, out_dtype=out_dtype, exact=exact_weight, exact_top_k=exact_top_k)
    y = None
    if x.is_cuda:
        try:
            from sparkit.kernels import fp8_gemv_triton
        except ImportError:
            pass
        else:
            y = fp8_gemv_triton.fp8_linear(x, weight_fp8, scale, out_dtype=out_dtype)
    if y is None:
        y = fp8_linear_reference(x, weight_fp8, scale, out_dtype=out_dtype)
    if exact_weight is not None and exact_top_k:
        rescore_top_k(x, y, exact_weight, exact_top_k)
    return y
