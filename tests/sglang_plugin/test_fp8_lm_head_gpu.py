"""The plugin's head conversion on a CUDA GPU: the packed Triton path (skipped without CUDA)."""

from __future__ import annotations

import pytest

from _shared import near_tie_states

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class Head(torch.nn.Module):
    def __init__(self, rows, hidden):
        super().__init__()
        w = torch.randn(rows, hidden, device="cuda") * 0.02
        self.weight = torch.nn.Parameter(w.to(torch.bfloat16), requires_grad=False)
        self.quant_method = type("UnquantizedEmbeddingMethod", (), {})()


@pytest.mark.parametrize("rows", [39296, 5003])  # a TP4 shard of Ling's vocab; an odd size
def test_cuda_conversion_packs_and_computes_exact_logits(rows):
    from sparkit.engines.sglang.fp8_lm_head import convert_lm_head_to_fp8, share_lm_head_with_draft
    from sparkit.engines.sglang.report import lm_head_report
    from sparkit.kernels.fp8_gemv_triton import unpack_fp8_weight
    from sparkit.kernels.fp8_linear import quantize_fp8_per_row

    head = Head(rows, 2560)
    q_ref, s_ref = quantize_fp8_per_row(head.weight.data)
    info = convert_lm_head_to_fp8(head)
    assert info["kernel"] == "triton (tile-packed)"
    assert head.weight.dtype == torch.float8_e4m3fn and head.sparkit_packed is not None
    q, s = unpack_fp8_weight(head.sparkit_packed)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    for m in (1, 4, 16):
        x = torch.randn(m, 2560, device="cuda").to(torch.bfloat16)
        y = head.quant_method.apply(head, x)
        assert y.shape == (m, rows) and y.dtype == torch.bfloat16
        exact = x.double() @ (q_ref.double() * s_ref.double()[:, None]).T
        assert ((y.double() - exact).norm() / exact.norm()).item() < 4e-3  # bf16 output rounding

    target = torch.nn.Module()
    target.lm_head = head
    draft = torch.nn.Module()
    draft.lm_head = Head(rows, 2560)
    assert share_lm_head_with_draft(target, draft)
    rep = lm_head_report(draft.lm_head, target.lm_head)
    assert rep.shared_with_target and rep.storage_ptr == head.weight.data_ptr()
    assert rep.weight_dtype == "float8_e4m3fn" and rep.quant_method == "SparkitFp8LmHeadMethod"


def test_cuda_conversion_with_exact_rescoring_gives_the_bf16_argmax_at_near_ties():
    """The plugin's default on CUDA: the packed FP8 head re-scores its top candidates from the
    loaded bf16 weight (kept, not copied) and picks the bf16 head's token where FP8 alone does not."""
    from sparkit.engines.sglang.fp8_lm_head import convert_lm_head_to_fp8

    rows, hidden = 39296, 2560  # a TP4 shard of Ling's vocab
    plain, exact = Head(rows, hidden), Head(rows, hidden)
    exact.weight.data.copy_(plain.weight.data)
    loaded = exact.weight.data
    # fp32 activations and logits: these pairs are closer than a bf16 logit's rounding step (1/8 at
    # 20), so bf16 outputs would tie them, and cuBLAS's bf16 GEMM (reduced-precision reductions on)
    # is itself no exact reference there. The bf16 head's exact logits decide.
    x = near_tie_states(loaded, 512, seed=3).float()
    bf16_top1 = (x.double() @ loaded.double().T).argmax(1)
    convert_lm_head_to_fp8(plain)
    info = convert_lm_head_to_fp8(exact, exact_top_k=4)
    assert info["exact_top_k"] == 4 and exact.sparkit_packed.exact.data_ptr() == loaded.data_ptr()
    fp8_top1 = torch.cat([plain.quant_method.apply(plain, x[i:i + 4]).argmax(1) for i in range(0, 512, 4)])
    exact_top1 = torch.cat([exact.quant_method.apply(exact, x[i:i + 4]).argmax(1) for i in range(0, 512, 4)])
    assert (fp8_top1 != bf16_top1).sum() >= 5
    assert torch.equal(exact_top1, bf16_top1)
