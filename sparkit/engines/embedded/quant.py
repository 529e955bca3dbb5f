"""Weight formats of the embedded engine: expert weights (bf16 / fp8 / mxfp4) and the lm_head
(fp32 / bf16 / fp8), quantised at load and dequantised in the forward.

- fp8 experts: e4m3 values, one float32 scale per output channel (scale = max|row| / 448).
- mxfp4 experts (OCP Microscaling): e2m1 values packed two per byte (element 2i in the low
  nibble, 2i+1 in the high nibble), one e8m0 scale (a biased power-of-two exponent) per 32
  consecutive values along the input dimension.
- fp8 lm_head: per-row e4m3 via sparkit.kernels.fp8_linear (the Triton path lives behind it).

The "quant method" objects mirror SGLang's: a layer holds one, and its class name is what the
activation report shows.
"""

from __future__ import annotations

EXPERT_FORMATS = ("fp32", "bf16", "fp8", "mxfp4")
LM_HEAD_DTYPES = ("fp32", "bf16", "fp8")
MX_BLOCK = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E2M1_EMAX = 2  # exponent of the largest normal e2m1 value (6 = 1.5 * 2^2)
E8M0_BIAS = 127
E8M0_NAN = 255
FP8_E4M3_MAX = 448.0


# ---------------------------------------------------------------- e2m1 / e8m0 / mxfp4


def encode_e2m1(values):
    """float tensor -> uint8 codes 0..15 (sign bit 3, magnitude index 0..7), round to nearest even,
    saturating at +-6 (OCP MX conversion semantics)."""
    import torch

    a = values.abs().to(torch.float32).clamp(max=E2M1_MAX)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=values.device)
    down = torch.bucketize(a, mids, right=False)  # ties land on the lower neighbour
    tie = a == mids[down.clamp(max=len(mids) - 1)]
    # Round half to even: at a tie go up when the lower neighbour's code is odd.
    code = torch.where(tie & (down % 2 == 1), down + 1, down)
    sign = (values < 0) & (code > 0)
    return (code + sign.to(code.dtype) * 8).to(torch.uint8)


def decode_e2m1(codes):
    import torch

    table = torch.tensor(list(E2M1_VALUES) + [-v for v in E2M1_VALUES], dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def encode_e8m0(exponents):
    """Integer power-of-two exponents -> biased uint8 codes (clamped to the finite range)."""
    import torch

    return (exponents.to(torch.int32) + E8M0_BIAS).clamp(0, 254).to(torch.uint8)


def decode_e8m0(codes):
    import torch

    out = torch.exp2(codes.to(torch.float32) - E8M0_BIAS)
    return torch.where(codes == E8M0_NAN, torch.full_like(out, float("nan")), out)


def quantize_mxfp4(weight):
    """[..., K] float (K a multiple of 32) -> (packed uint8 [..., K/2], scales uint8 [..., K/32])."""
    import torch

    if weight.shape[-1] % MX_BLOCK:
        raise ValueError(f"mxfp4 needs the input dimension to be a multiple of {MX_BLOCK}, got {weight.shape[-1]}")
    w = weight.detach().to(torch.float32)
    blocks = w.reshape(*w.shape[:-1], -1, MX_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    # OCP: shared exponent = floor(log2(amax)) - emax(e2m1); all-zero blocks get the smallest scale.
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=2.0**-126))) - E2M1_EMAX, torch.full_like(amax, -E8M0_BIAS))
    scale_codes = encode_e8m0(exponent)
    scaled = blocks / decode_e8m0(scale_codes)[..., None]
    codes = encode_e2m1(scaled).reshape(*w.shape[:-1], -1)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.contiguous(), scale_codes.contiguous()


def dequantize_mxfp4(packed, scale_codes, dtype=None):
    import torch

    low = packed & 0x0F
    high = packed >> 4
    codes = torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    values = decode_e2m1(codes).reshape(*packed.shape[:-1], -1, MX_BLOCK)
    out = (values * decode_e8m0(scale_codes)[..., None]).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    return out if dtype is None else out.to(dtype)


# ---------------------------------------------------------------- fp8 per output channel


def quantize_fp8_per_channel(weight):
    """[..., N, K] -> (e4m3 [..., N, K], float32 scale [..., N]); scale = max|row| / 448."""
    import torch

    w = weight.detach().to(torch.float32)
    amax = w.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_E4M3_MAX, torch.ones_like(amax))
    q = (w / scale[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(q, scale, dtype=None):
    import torch

    out = q.to(torch.float32) * scale[..., None].to(torch.float32)
    return out if dtype is None else out.to(dtype)


# ---------------------------------------------------------------- expert weight holders


class ExpertWeights:
    """One stacked expert weight [E, N, K] in some format. `select(idx)` dequantises only the
    experts the router picked (decode), `dense()` all of them (prefill, which loops over experts)."""

    method_name = "UnquantizedFusedMoEMethod"
    fmt = "fp32"

    def __init__(self, weight, compute_dtype):
        self.weight = weight
        self.compute_dtype = compute_dtype

    @property
    def shape(self):
        return tuple(self.weight.shape)

    def select(self, idx):
        # index_select, not fancy indexing: several times faster for a few experts on CPU
        return torch_index_select(self.weight, idx).to(self.compute_dtype)

    def dense(self, e: int):
        return self.weight[e].to(self.compute_dtype)

    def tensors(self) -> dict:
        return {"weight": self.weight}


class Bf16ExpertWeights(ExpertWeights):
    method_name = "EmbeddedBf16Experts"
    fmt = "bf16"

    def __init__(self, weight, compute_dtype):
        import torch

        super().__init__(weight.detach().to(torch.bfloat16).contiguous(), compute_dtype)


class Fp8ExpertWeights(ExpertWeights):
    method_name = "EmbeddedFp8Experts"
    fmt = "fp8"

    def __init__(self, weight, compute_dtype):
        q, scale = quantize_fp8_per_channel(weight)
        self.weight, self.scale = q.contiguous(), scale.contiguous()
        self.compute_dtype = compute_dtype
        self._shape = tuple(weight.shape)

    def select(self, idx):
        return dequantize_fp8(torch_index_select(self.weight, idx), torch_index_select(self.scale, idx), self.compute_dtype)

    def dense(self, e: int):
        return dequantize_fp8(self.weight[e], self.scale[e], self.compute_dtype)

    def tensors(self) -> dict:
        return {"weight": self.weight, "scale": self.scale}


class Mxfp4ExpertWeights(ExpertWeights):
    method_name = "EmbeddedMxfp4Experts"
    fmt = "mxfp4"

    def __init__(self, weight, compute_dtype):
        self.packed, self.scales = quantize_mxfp4(weight)
        self.weight = self.packed
        self.compute_dtype = compute_dtype
        self._shape = tuple(weight.shape)

    @property
    def shape(self):
        return self._shape

    def select(self, idx):
        return dequantize_mxfp4(torch_index_select(self.packed, idx), torch_index_select(self.scales, idx), self.compute_dtype)

    def dense(self, e: int):
        return dequantize_mxfp4(self.packed[e], self.scales[e], self.compute_dtype)

    def tensors(self) -> dict:
        return {"packed": self.packed, "scales": self.scales}


def torch_index_select(tensor, idx):
    import torch

    return torch.index_select(tensor, 0, idx)


def make_expert_weights(weight, fmt: str, compute_dtype) -> ExpertWeights:
    classes = {"fp32": ExpertWeights, "bf16": Bf16ExpertWeights, "fp8": Fp8ExpertWeights, "mxfp4": Mxfp4ExpertWeights}
    if fmt not in classes:
        raise ValueError(f"unknown expert weight format {fmt!r} (choose from {', '.join(EXPERT_FORMATS)})")
    if fmt == "fp32":
        import torch

        return ExpertWeights(weight.detach().to(torch.float32).contiguous(), compute_dtype)
    return classes[fmt](weight, compute_dtype)


# ---------------------------------------------------------------- lm_head quant methods


class UnquantizedLinearMethod:
    """y = x @ W.T in the weight's dtype, logits returned in float32."""

    def apply(self, layer, x):
        import torch

        return torch.nn.functional.linear(x.to(layer.weight.dtype), layer.weight).to(torch.float32)


class Fp8LmHeadMethod:
    """Weight-only FP8 (W8A16): e4m3 weight + per-row scale, via sparkit.kernels.fp8_linear.
    On CUDA the weight is also packed once (same bytes, tile-major) for the Triton kernel;
    `layer.weight` stays the plain e4m3 tensor (what the activation report inspects)."""

    def __init__(self):
        self.packed = None
        self._prepared_for = None

    def apply(self, layer, x):
        import torch

        from sparkit.kernels.fp8_linear import fp8_linear

        if x.is_cuda:
            if self._prepared_for is not layer.weight:
                from sparkit.kernels.fp8_linear import prepare_fp8_weight

                self.packed, self._prepared_for = prepare_fp8_weight(layer.weight, layer.weight_scale), layer.weight
            if self.packed is not None:
                return fp8_linear(x, self.packed, None, out_dtype=torch.float32)
        return fp8_linear(x, layer.weight, layer.weight_scale, out_dtype=torch.float32)


def make_lm_head(weight, dtype: str):
    """An LmHead module holding `weight` in the requested format (quantised online for fp8)."""
    import torch

    from sparkit.engines.embedded.model import LmHead

    if dtype == "fp8":
        from sparkit.kernels.fp8_linear import quantize_fp8_per_row

        q, scale = quantize_fp8_per_row(weight)
        return LmHead(q, Fp8LmHeadMethod(), weight_scale=scale)
    if dtype in ("fp32", "float32"):
        return LmHead(weight.detach().to(torch.float32).contiguous(), UnquantizedLinearMethod())
    if dtype in ("bf16", "bfloat16"):
        return LmHead(weight.detach().to(torch.bfloat16).contiguous(), UnquantizedLinearMethod())
    raise ValueError(f"unknown lm_head dtype {dtype!r} (choose from {', '.join(LM_HEAD_DTYPES)})")


def lm_head_from_raw_tensor(weight, compute_dtype):
    """SGLang 0.5.23's shared-head trap, reproduced: the draft gets a fresh unquantised linear built
    from the target head's raw weight *tensor*. For an FP8 head those are e4m3 bytes read through
    an unquantised method (the bytes read as unsigned integers, no scale): the draft's logits are
    garbage and the accept length falls to about 1.0. For a bf16/fp32 head the copy is harmless."""
    import torch

    from sparkit.engines.embedded.model import LmHead

    if weight.dtype == torch.float8_e4m3fn:
        # The stored bytes, read as plain numbers by an unquantised method: sign bits become
        # large magnitudes and no scale is applied.
        raw = weight.view(torch.uint8).to(compute_dtype)
    else:
        raw = weight.detach().clone()
    return LmHead(raw, UnquantizedLinearMethod())
