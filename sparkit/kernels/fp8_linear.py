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
"""

from __future__ import annotations

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


def prepare_fp8_weight(weight_fp8, scale):
    """The weight re-laid for the CUDA kernel (sparkit.kernels.fp8_gemv_triton.PackedFp8Weight),
    or None where that kernel cannot run (CPU tensors, no Triton): then keep using the tensors."""
    if not weight_fp8.is_cuda:
        return None
    try:
        from sparkit.kernels import fp8_gemv_triton
    except ImportError:
        return None
    return fp8_gemv_triton.pack_fp8_weight(weight_fp8, scale)


def kernel_description(weight_fp8) -> str:
    """Which path fp8_linear(x, weight_fp8, ...) takes for x on weight_fp8's device, in words
    (for the engine's log and activation report: proof that the Triton kernel serves the head)."""
    if not hasattr(weight_fp8, "dtype"):
        from sparkit.kernels import fp8_gemv_triton

        return (f"Triton W8A16 kernel {fp8_gemv_triton.PACKED_DEFAULT.label()} "
                f"(tile-packed e4m3 weight {weight_fp8.block_n}x{weight_fp8.block_k})")
    if weight_fp8.is_cuda:
        try:
            from sparkit.kernels import fp8_gemv_triton
        except ImportError:
            pass
        else:
            return f"Triton W8A16 kernel {fp8_gemv_triton.UNPACKED_DEFAULT.label()} (row-major e4m3 weight)"
    return "torch reference (e4m3 weight dequantised with its row scales, fp32 matmul)"


def fp8_linear(x, weight_fp8, scale, out_dtype=None):
    """Dispatch: the Triton kernel on CUDA when available, else the reference path.

    weight_fp8 is an [N, K] e4m3 tensor (with scale [N]) or a prepare_fp8_weight() result.
    """
    if not hasattr(weight_fp8, "dtype"):  # a packed weight: only the CUDA kernel reads it
        from sparkit.kernels import fp8_gemv_triton

        return fp8_gemv_triton.fp8_linear(x, weight_fp8, None, out_dtype=out_dtype)
    if x.is_cuda:
        try:
            from sparkit.kernels import fp8_gemv_triton  # noqa: F401  (added by the kernel work)
        except ImportError:
            pass
        else:
            return fp8_gemv_triton.fp8_linear(x, weight_fp8, scale, out_dtype=out_dtype)
    return fp8_linear_reference(x, weight_fp8, scale, out_dtype=out_dtype)
