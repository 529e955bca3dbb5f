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

from torch import nn

from sparkit.models.formats import EXPERT_FORMATS, LM_HEAD_DTYPES  # noqa: F401 (declared there)
from sparkit.weight_formats import E8M0_BIAS, E8M0_NAN, FP8_BLOCK, FP8_E4M3_MAX, MX_BLOCK  # noqa: F401 (declared there)

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E2M1_EMAX = 2  # exponent of the largest normal e2m1 value (6 = 1.5 * 2^2)


class LmHead(nn.Module):
    """The output projection (built here, where its quant methods live). Its `quant_method`
    decides how `weight` is used (SGLang's design): UnquantizedLinearMethod for fp32/bf16,
    Fp8LmHeadMethod for an e4m3 weight + row scale."""

    def __init__(self, weight, quant_method, weight_scale=None):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale = weight_scale
        self.quant_method = quant_method

    def forward(self, x):
        return self.quant_method.apply(self, x)


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


_BYTE_PAIRS: dict = {}


def _byte_pair_table(device):
    """[256, 2] float32: the two e2m1 values (low nibble, high nibble) of every packed byte."""
    import torch

    table = _BYTE_PAIRS.get(device)
    if table is None:
        b = torch.arange(256)
        table = torch.stack((decode_e2m1(b & 0x0F), decode_e2m1(b >> 4)), dim=-1).to(device)
        _BYTE_PAIRS[device] = table
    return table


def dequantize_mxfp4(packed, scale_codes, dtype=None):
    import torch

    # one lookup per byte (both nibbles at once), then one multiply by the block scales
    values = torch.index_select(_byte_pair_table(packed.device), 0, packed.reshape(-1).to(torch.int32))
    values = values.view(*packed.shape[:-1], -1, MX_BLOCK)
    out = (values * decode_e8m0(scale_codes)[..., None]).view(*packed.shape[:-1], packed.shape[-1] * 2)
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


# ---------------------------------------------------------------- fp8 per 128 x 128 block (checkpoints)


def quantize_fp8_block(weight):
    """[N, K] (K a multiple of FP8_BLOCK) -> (e4m3 [N, K], float32 scale_inv [ceil(N/B), K/B]): one
    scale per B x B block, scale = max|block| / 448 (1.0 for an all-zero block), the layout of
    the published -fp8 checkpoints (weight ~= value x the block's scale_inv). A ragged last block
    of rows takes the scale of the rows it has (weight_formats.tiling_problem says which layers
    may have one)."""
    import torch

    n, k = weight.shape
    if k % FP8_BLOCK:
        raise ValueError(f"block FP8 needs the columns to be a multiple of {FP8_BLOCK}, got [{n}, {k}]")
    w = weight.detach().to(torch.float32)
    padded = -(-n // FP8_BLOCK) * FP8_BLOCK
    if padded != n:  # zero rows leave every block's max|value| as it was
        w = torch.cat([w, w.new_zeros(padded - n, k)])
    blocks = w.reshape(padded // FP8_BLOCK, FP8_BLOCK, k // FP8_BLOCK, FP8_BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_E4M3_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q.reshape(padded, k)[:n].contiguous(), scale.contiguous()


def dequantize_fp8_block(q, scale_inv, dtype=None):
    """The inverse of quantize_fp8_block (scale_inv [ceil(N/B), ceil(K/B)]; a ragged last block
    is allowed, as SGLang's loader allows it)."""
    import torch

    n, k = q.shape
    full = scale_inv.to(torch.float32).repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]
    out = q.to(torch.float32) * full
    return out if dtype is None else out.to(dtype)


_E4M3_TO_F32_SHIFT = 2.0**120  # e4m3 bits moved into a float32's exponent/mantissa fields are the value * 2^-120


def dequantize_fp8_bits(q, scale_shifted, dtype=None):
    """The same values as dequantize_fp8, by bit manipulation (PyTorch's CPU e4m3 -> float cast is
    several times slower): sign to bit 31, exponent+mantissa to bits 20..27, then one multiply by
    scale * 2^120. Exact for every finite e4m3 value, subnormals included; `scale_shifted` is
    scale * 2^120 (precomputed at load)."""
    import torch

    i = q.view(torch.uint8).to(torch.int32)
    bits = ((i & 0x7F) << 20) | ((i & 0x80) << 24)
    out = bits.view(torch.float32) * scale_shifted[..., None]
    return out if dtype is None else out.to(dtype)


# ---------------------------------------------------------------- expert weight holders


class ExpertWeights:
    """One stacked expert weight [E, N, K] in some format (the quantised tensors are the stored
    form, what `tensors()` and the activation report see).

    Decoding: `select(idx)` gives the picked experts in the compute dtype, `dense(e)` one expert.
    By default each call decodes from the quantised bytes (as a fused GPU kernel would). After
    `cache_decoded()` they read a copy decoded once (same values, bit for bit): on CPU PyTorch's
    e4m3/e2m1 decoding costs more than the rest of a decode step and would distort what sparkit
    measures (see EngineConfig.expert_dequant)."""

    method_name = "UnquantizedFusedMoEMethod"
    fmt = "fp32"
    decoded = None

    def __init__(self, weight, compute_dtype):
        self.weight = weight
        self.compute_dtype = compute_dtype

    @property
    def shape(self):
        return tuple(self.weight.shape)

    @property
    def num_experts(self) -> int:
        return self.shape[0]

    def select(self, idx):
        if self.decoded is not None:
            return torch_index_select(self.decoded, idx)
        return self._select(idx)

    def dense(self, e: int):
        return self.decoded[e] if self.decoded is not None else self._dense(e)

    def cache_decoded(self) -> None:
        import torch

        self.decoded = self._select(torch.arange(self.num_experts, device=self.weight.device)).contiguous()

    def _select(self, idx):
        # index_select, not fancy indexing: several times faster for a few experts on CPU
        return torch_index_select(self.weight, idx).to(self.compute_dtype)

    def _dense(self, e: int):
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
        # scale * 2^120 must stay finite in float32 (it does for any sane weight: scale = amax / 448)
        self.scale_shifted = self.scale * _E4M3_TO_F32_SHIFT if float(self.scale.max()) < 2.0**7 else None

    # Debug only (EngineConfig.debug_corrupt_expert_dequant): experts 0 and 1 swapped in the map
    # from expert id to stored weights, a kernel indexing bug. On tiny-ling it writes text that
    # still reads like its corpus, and the draft (same experts) keeps agreeing with the target
    # (accept length ~2, above the recipe's 1.5): only the numbers are wrong (perplexity x1.9).
    # An off-by-one over all experts is louder: gibberish, accept length ~1.1.
    corrupt_expert_index = False

    def _index(self, idx):
        if not self.corrupt_expert_index:
            return idx
        import torch

        swapped = torch.arange(self.weight.shape[0], device=idx.device)
        swapped[0], swapped[1] = 1, 0
        return swapped[idx]

    def _select(self, idx):
        idx = self._index(idx)
        if self.scale_shifted is None:
            return dequantize_fp8(torch_index_select(self.weight, idx), torch_index_select(self.scale, idx), self.compute_dtype)
        return dequantize_fp8_bits(torch_index_select(self.weight, idx), torch_index_select(self.scale_shifted, idx), self.compute_dtype)

    def _dense(self, e: int):
        e = {0: 1, 1: 0}.get(e, e) if self.corrupt_expert_index else e
        return dequantize_fp8(self.weight[e], self.scale[e], self.compute_dtype)

    def tensors(self) -> dict:
        tensors = {"weight": self.weight, "scale": self.scale}
        if self.scale_shifted is not None:
            tensors["scale_shifted"] = self.scale_shifted
        return tensors


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

    def _select(self, idx):
        return dequantize_mxfp4(torch_index_select(self.packed, idx), torch_index_select(self.scales, idx), self.compute_dtype)

    def _dense(self, e: int):
        return dequantize_mxfp4(self.packed[e], self.scales[e], self.compute_dtype)

    def tensors(self) -> dict:
        return {"packed": self.packed, "scales": self.scales}


class CheckpointExpertWeights(ExpertWeights):
    """Experts the checkpoint itself stores quantised (block FP8 or MXFP4: a quantised export),
    decoded once at load with the checkpoint's own scales. The engine computes with exactly the
    checkpoint's values and does not quantise them again (its fp8 is per channel, not per block)."""

    def __init__(self, weight, fmt: str, compute_dtype):
        import torch

        super().__init__(weight.detach().to(torch.float32).contiguous(), compute_dtype)
        self.fmt = fmt
        self.method_name = CHECKPOINT_EXPERT_METHODS[fmt]


# The quant method class names the report shows for experts decoded from a quantised checkpoint.
CHECKPOINT_EXPERT_METHODS = {"fp8": "EmbeddedCheckpointFp8BlockExperts", "mxfp4": "EmbeddedCheckpointMxfp4Experts"}


def torch_index_select(tensor, idx):
    import torch

    return torch.index_select(tensor, 0, idx)


def make_expert_weights(weight, fmt: str, compute_dtype, from_checkpoint: bool = False) -> ExpertWeights:
    """The holder of one stacked expert weight in `fmt`; `from_checkpoint`: the values are already
    the checkpoint's quantised ones (decoded), kept as they are."""
    if from_checkpoint:
        return CheckpointExpertWeights(weight, fmt, compute_dtype)
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
                self.prepare(layer)
            if self.packed is not None:
                return fp8_linear(x, self.packed, None, out_dtype=torch.float32)
        return fp8_linear(x, layer.weight, layer.weight_scale, out_dtype=torch.float32,
                          exact_weight=getattr(layer, "exact_weight", None),
                          exact_top_k=getattr(layer, "exact_top_k", 0))

    def prepare(self, layer):
        from sparkit.kernels.fp8_linear import prepare_fp8_weight

        self.packed = prepare_fp8_weight(layer.weight, layer.weight_scale,
                                         exact_weight=getattr(layer, "exact_weight", None),
                                         exact_top_k=getattr(layer, "exact_top_k", 0))
        self._prepared_for = layer.weight

    def kernel(self, layer) -> str:
        """The path the logits take, in words (the engine logs it and puts it in the report)."""
        from sparkit.kernels.fp8_linear import kernel_description

        if self.packed is not None:
            return kernel_description(self.packed)
        return kernel_description(layer.weight, exact_top_k=getattr(layer, "exact_top_k", 0))


def make_lm_head(weight, dtype: str, exact_top_k: int = 0):
    """An LmHead module holding `weight` in the requested format (quantised online for fp8).

    fp8 with exact_top_k > 0 also keeps the weight in bf16 (`head.exact_weight`, what the bf16
    head would hold) and re-scores each row's best FP8 candidates exactly from it."""
    import torch

    if dtype == "fp8":
        from sparkit.kernels.fp8_linear import quantize_fp8_per_row

        q, scale = quantize_fp8_per_row(weight)
        head = LmHead(q, Fp8LmHeadMethod(), weight_scale=scale)
        head.exact_top_k = max(0, int(exact_top_k))
        # A plain attribute, not a buffer: state_dict and the activation report see the FP8 head.
        head.exact_weight = weight.detach().to(torch.bfloat16).contiguous() if head.exact_top_k else None
        if q.is_cuda:
            head.quant_method.prepare(head)  # packed at load, so the report can name the kernel
        return head
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

    if weight.dtype == torch.float8_e4m3fn:
        # The stored bytes, read as plain numbers by an unquantised method: sign bits become
        # large magnitudes and no scale is applied.
        raw = weight.view(torch.uint8).to(compute_dtype)
    else:
        raw = weight.detach().clone()
    return LmHead(raw, UnquantizedLinearMethod())

