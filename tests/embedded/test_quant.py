"""Weight formats: exact e2m1/e8m0 encodings, mxfp4 packing, fp8/mxfp4 round-trip error bounds,
and the lm_head quant methods (including the reproduced shared-head trap)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sparkit.models.tiny_ling import quant  # noqa: E402


def test_e2m1_encodes_every_representable_value_exactly():
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    codes = quant.encode_e2m1(values)
    assert codes.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15]
    assert torch.equal(quant.decode_e2m1(codes), values)


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.25, 0.0),  # tie between 0 (code 0, even) and 0.5 (code 1): round half to even
        (0.75, 1.0),  # tie 0.5 (code 1) / 1.0 (code 2) -> 1.0
        (1.25, 1.0),  # tie 1.0 (code 2) / 1.5 (code 3) -> 1.0
        (1.75, 2.0),  # tie 1.5 (code 3) / 2.0 (code 4) -> 2.0
        (2.5, 2.0),  # tie 2 (code 4) / 3 (code 5) -> 2
        (3.5, 4.0),  # tie 3 (code 5) / 4 (code 6) -> 4
        (5.0, 4.0),  # tie 4 (code 6) / 6 (code 7) -> 4
        (2.6, 3.0),
        (5.1, 6.0),
        (7.9, 6.0),  # saturates
        (1000.0, 6.0),
        (-2.6, -3.0),
        (0.1, 0.0),
    ],
)
def test_e2m1_rounds_to_nearest_even_and_saturates(value, expected):
    assert quant.decode_e2m1(quant.encode_e2m1(torch.tensor([value]))).item() == expected


def test_negative_values_that_round_to_zero_encode_as_positive_zero():
    assert quant.encode_e2m1(torch.tensor([-0.1])).item() == 0


def test_e8m0_is_a_biased_power_of_two_exponent():
    codes = quant.encode_e8m0(torch.tensor([0, 1, -1, -127, 127, 200]))
    assert codes.tolist() == [127, 128, 126, 0, 254, 254]
    decoded = quant.decode_e8m0(torch.tensor([127, 128, 126, 0, 254], dtype=torch.uint8))
    assert decoded.tolist() == [1.0, 2.0, 0.5, 2.0**-127, 2.0**127]
    assert torch.isnan(quant.decode_e8m0(torch.tensor([255], dtype=torch.uint8))).all()


def test_mxfp4_packs_two_values_per_byte_low_nibble_first_with_one_scale_per_32():
    # One block of 32 with max |x| = 6: shared exponent floor(log2 6) - 2 = 0, scale 1.
    block = torch.tensor([1.0, -2.0] + [0.0] * 29 + [6.0])
    packed, scales = quant.quantize_mxfp4(block[None])
    assert packed.shape == (1, 16) and scales.shape == (1, 1)
    assert scales.item() == 127
    assert packed[0, 0].item() == 0x2 | (0xC << 4)  # 1.0 -> code 2 (low), -2.0 -> code 12 (high)
    assert packed[0, 15].item() == 0x0 | (0x7 << 4)
    # A block whose max is 48 = 6 * 2^3 gets scale 2^(floor(log2 48) - 2) = 2^3: code 130.
    _, scales = quant.quantize_mxfp4(torch.tensor([[48.0] + [1.0] * 31]))
    assert scales.item() == 130


def test_mxfp4_round_trip_stays_within_a_quarter_of_the_block_max():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=gen) * torch.logspace(-3, 1, 64)[:, None]
    packed, scales = quant.quantize_mxfp4(w)
    back = quant.dequantize_mxfp4(packed, scales)
    assert back.shape == w.shape
    block_max = w.abs().reshape(64, -1, 32).amax(dim=-1, keepdim=True)
    err = (back - w).abs().reshape(64, -1, 32)
    assert (err <= block_max / 4 + 1e-12).all()
    rel_rms = ((back - w).pow(2).mean() / w.pow(2).mean()).sqrt()
    assert rel_rms < 0.2  # 4-bit values: coarse but not garbage


def test_mxfp4_rejects_a_dimension_that_is_not_a_multiple_of_32():
    with pytest.raises(ValueError, match="multiple of 32"):
        quant.quantize_mxfp4(torch.ones(4, 48))


def test_fp8_per_channel_round_trip_error_is_within_e4m3_precision():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(8, 96, 64, generator=gen) * torch.logspace(-2, 2, 96)[None, :, None]
    q, scale = quant.quantize_fp8_per_channel(w)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (8, 96)
    back = quant.dequantize_fp8(q, scale)
    # 3 mantissa bits: relative error <= 2^-4 for normal values; subnormals: absolute 2^-10 * scale
    bound = w.abs() * 2.0**-4 + scale[..., None] * 2.0**-10
    assert ((back - w).abs() <= bound).all()
    # each row's max maps to exactly 448
    assert torch.allclose(back.abs().amax(dim=-1), w.abs().amax(dim=-1), rtol=1e-6)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
def test_expert_holders_dequantise_selected_experts_close_to_the_original(fmt):
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(8, 64, 128, generator=gen) * 0.05
    holder = quant.make_expert_weights(w, fmt, torch.float32)
    assert holder.fmt == fmt
    picked = holder.select(torch.tensor([3, 5]))
    assert picked.shape == (2, 64, 128) and picked.dtype == torch.float32
    rel = ((picked - w[[3, 5]]).norm() / w[[3, 5]].norm()).item()
    assert rel < {"bf16": 0.01, "fp8": 0.05, "mxfp4": 0.2}[fmt]
    assert torch.equal(holder.dense(5), picked[1])


def test_unknown_formats_are_rejected_with_the_choices():
    with pytest.raises(ValueError, match="bf16, fp8, mxfp4"):
        quant.make_expert_weights(torch.ones(1, 32, 32), "int4", torch.float32)
    with pytest.raises(ValueError, match="fp32, bf16, fp8"):
        quant.make_lm_head(torch.ones(4, 4), "int8")


def test_fp8_lm_head_matches_the_fp32_head_closely():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(264, 128, generator=gen) * 0.1
    x = torch.randn(5, 128, generator=gen)
    exact = x @ w.T
    head = quant.make_lm_head(w, "fp8")
    assert head.weight.dtype == torch.float8_e4m3fn
    assert type(head.quant_method).__name__ == "Fp8LmHeadMethod"
    out = head(x)
    assert out.dtype == torch.float32
    assert ((out - exact).norm() / exact.norm()) < 0.05
    assert torch.equal(out.argmax(-1), exact.argmax(-1)) or ((out - exact).abs().max() < 0.2)


def test_raw_tensor_copy_of_an_fp8_head_gives_garbage_logits_but_of_a_bf16_head_does_not():
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(264, 128, generator=gen) * 0.1
    x = torch.randn(200, 128, generator=gen)
    exact_top = (x @ w.T).argmax(-1)
    fp8_head = quant.make_lm_head(w, "fp8")
    trap = quant.lm_head_from_raw_tensor(fp8_head.weight, torch.float32)
    assert trap is not fp8_head and type(trap.quant_method).__name__ == "UnquantizedLinearMethod"
    agreement = (trap(x).argmax(-1) == exact_top).float().mean().item()
    assert agreement < 0.2  # garbage: the draft almost never agrees with the target
    bf16_head = quant.make_lm_head(w, "bf16")
    copy = quant.lm_head_from_raw_tensor(bf16_head.weight, torch.float32)
    assert (copy(x).argmax(-1) == bf16_head(x).argmax(-1)).float().mean().item() == 1.0


def test_fp8_bit_trick_dequantisation_equals_the_cast_for_every_code():
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # the two NaN encodings never come out of quantisation
    q = codes.view(torch.float8_e4m3fn).reshape(1, -1)
    scale = torch.tensor([0.0123])
    expected = quant.dequantize_fp8(q, scale)
    got = quant.dequantize_fp8_bits(q, scale * 2.0**120)
    assert torch.equal(got, expected)
