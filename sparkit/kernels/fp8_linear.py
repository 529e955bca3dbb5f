"""Weight-only FP8 (W8A16) linear for the lm_head: e4m3 weights with per-row scales.

API (stable; the Triton fast path is added behind it):
    quantize_fp8_per_row(weight) -> (weight_fp8 [N, K] float8_e4m3fn, scale [N] float32)
    fp8_linear(x [..., K], weight_fp8, scale, out_dtype=None) -> [..., N]
    prepare_fp8_weight(weight_fp8, scale) -> PackedFp8Weight | None   (added; optional)

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


def fp8_linear_reference(x, weight_fp8, scale, out_dtype=None, chunk_rows: int = 8192):
    """y = x @ (weight_fp8 * scale[:, None]).T, fp32 accumulation, chunked over output rows."""
    import torch

    out_dtype = out_dtype or x.dtype
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
    n = weight_fp8.shape[0]
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
