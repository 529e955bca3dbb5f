"""The Triton FP8 lm_head kernel on a real CUDA GPU (skipped without one)."""

from __future__ import annotations

import pytest

from _shared import near_tie_states

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def head():
    from sparkit.kernels.fp8_linear import quantize_fp8_per_row

    g = torch.Generator(device="cuda").manual_seed(0)
    # Ling's hidden size, an N that is not a multiple of any tile, and rows of varied norm.
    w = torch.randn(5003, 2560, generator=g, device="cuda") * 0.02
    w *= torch.exp(0.35 * torch.randn(5003, 1, generator=g, device="cuda"))
    q, s = quantize_fp8_per_row(w.to(torch.bfloat16))
    return q, s


def _exact(x, q, s):
    return x.double() @ (q.double() * s.double()[:, None]).T


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 13, 16, 17, 40])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_default_dispatch_matches_exact_dequantised_product(head, m, out_dtype):
    from sparkit.kernels.fp8_linear import fp8_linear

    q, s = head
    x = torch.randn(m, 2560, device="cuda").to(torch.bfloat16)
    y = fp8_linear(x, q, s, out_dtype=getattr(torch, out_dtype))
    assert y.shape == (m, 5003) and y.dtype == getattr(torch, out_dtype)
    exact = _exact(x, q, s)
    rel = ((y.double() - exact).norm() / exact.norm()).item()
    # fp32 accumulation: only the output rounding (bf16: 2^-9) remains.
    assert rel < (4e-3 if out_dtype == "bfloat16" else 1e-5)
    # y's top-1 is the exact top-1 up to the output rounding (bf16 can tie near-equal logits).
    picked = exact.gather(1, y.double().argmax(1, keepdim=True)).squeeze(1)
    tol = 0.0 if out_dtype == "float32" else 2.0 ** -7
    assert (picked >= exact.max(1).values * (1 - tol) - 1e-6).all()


def test_every_candidate_config_is_correct(head):
    import sys

    from _shared import REPO_DIR

    sys.path.insert(0, str(REPO_DIR / "benchmarks"))
    import fp8_kernel_variants as sweep  # the benchmark's candidate configs

    from sparkit.kernels import fp8_gemv_triton as fk

    q, s = head
    for m in (1, 3, 16):
        x = torch.randn(m, 2560, device="cuda").to(torch.bfloat16)
        exact = _exact(x, q, s)
        cands = (sweep.TMA_CONFIGS[:2] + sweep.TMA16_CONFIGS + sweep.DOT_CONFIGS[:2] + (sweep.CC_CONFIGS[:2] if m <= 4 else [])
                 + (sweep.CCR_CONFIGS[:1] if m <= 2 else []))
        for cfg in cands:
            y = fk.fp8_linear(x, q, s, torch.float32, config=cfg)
            rel = ((y.double() - exact).norm() / exact.norm()).item()
            assert rel < 1e-5, (m, cfg.label(), rel)


def test_fp32_activations_and_leading_dims(head):
    from sparkit.kernels.fp8_linear import fp8_linear

    q, s = head
    x = torch.randn(2, 3, 2560, device="cuda")
    y = fp8_linear(x, q, s)
    assert y.shape == (2, 3, 5003) and y.dtype == torch.float32
    exact = _exact(x.reshape(6, -1), q, s).reshape(2, 3, -1)
    assert ((y.double() - exact).norm() / exact.norm()).item() < 1e-5


def test_a_corrupted_scale_is_detected(head):
    """The check above is not vacuous: a wrong scale for one row changes that row's logits."""
    from sparkit.kernels.fp8_linear import fp8_linear

    q, s = head
    bad = s.clone()
    bad[7] *= 2
    x = torch.randn(4, 2560, device="cuda").to(torch.bfloat16)
    y = fp8_linear(x, q, bad, out_dtype=torch.float32)
    exact = _exact(x, q, s)
    assert not torch.allclose(y[:, 7].double(), exact[:, 7], rtol=1e-3)
    assert torch.allclose(y[:, 8].double(), exact[:, 8], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 3, 16, 17])
def test_packed_weight_kernel_matches_and_round_trips(head, m, mode):
    from sparkit.kernels import fp8_gemv_triton as fk

    q, s = head
    packed = fk.pack_fp8_weight(q, s, 64, 128)
    q2, s2 = fk.unpack_fp8_weight(packed)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s2, s)
    x = torch.randn(m, 2560, device="cuda").to(torch.bfloat16)
    x[:, 5] = 2.0e5  # an outlier channel far beyond what fp16 holds without the 2^-8 prescale
    y = fk.fp8_linear_packed(x, packed, torch.float32, mode=mode)
    exact = _exact(x, q, s)
    assert ((y.double() - exact).norm() / exact.norm()).item() < 1e-5
    y2 = fk.fp8_linear(x, q, s, torch.float32, config=fk.KernelConfig("tma16", 64, 128, 4, 3))
    assert ((y2.double() - exact).norm() / exact.norm()).item() < 1e-5


@pytest.mark.parametrize("kernel", ["default", "pk16t", "pk16p"])
@pytest.mark.parametrize("x_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("m", [1, 7, 16, 33])
def test_shipped_path_prepare_then_linear(head, m, x_dtype, kernel):
    """What the plugin and the embedded engine call: pack once, then fp8_linear(x, packed, None);
    also each of the two kernels that can be the default (per-tile or per-row activation scaling)."""
    from sparkit.kernels import fp8_gemv_triton as fk
    from sparkit.kernels.fp8_linear import fp8_linear, prepare_fp8_weight

    q, s = head
    packed = prepare_fp8_weight(q, s)
    assert packed is not None and packed.shape == (5003, 2560)
    x = torch.randn(m, 2560, device="cuda").to(getattr(torch, x_dtype))
    if kernel == "default":
        y = fp8_linear(x, packed, None, out_dtype=torch.float32)
    else:
        cfg = fk.KernelConfig(kernel, packed.block_n, packed.block_k, 8, 3)
        y = fk.fp8_linear(x, packed, None, torch.float32, config=cfg)
    exact = _exact(x, q, s)
    # bf16 activations are exact in the kernel's fp16 MMA; fp32 ones are rounded to fp16 (2^-11).
    tol = 1e-5 if x_dtype == "bfloat16" else 1e-3
    assert ((y.double() - exact).norm() / exact.norm()).item() < tol


@pytest.mark.parametrize("kernel", ["pk16t", "pk16p"])
def test_large_activations_stay_finite_on_the_fp16_path(head, kernel):
    """bf16 hidden states far beyond fp16's range (6.5e4) must not overflow the fp16 MMA."""
    from sparkit.kernels import fp8_gemv_triton as fk

    q, s = head
    packed = fk.pack_fp8_weight(q, s)
    x = torch.randn(4, 2560, device="cuda").to(torch.bfloat16)
    x[0] *= 1.0e6
    x[1, 100] = -3.0e9
    cfg = fk.KernelConfig(kernel, packed.block_n, packed.block_k, 8, 3)
    y = fk.fp8_linear(x, packed, None, torch.float32, config=cfg)
    exact = _exact(x, q, s)
    assert torch.isfinite(y).all()
    for row in range(4):  # each row on its own: rows 0 and 1 dwarf the others
        rel = ((y[row].double() - exact[row]).norm() / exact[row].norm()).item()
        assert rel < 1e-5, (row, rel)


# ---------------------------------------------------------------- exact top-k re-scoring


@pytest.fixture(scope="module", params=[5003, 40000], ids=["small-vocab", "large-vocab"])
def head_bf16(request):
    """(bf16 weight, e4m3 weight, scales): 5003 rows = 40 tiles (k candidates per tile), 40000 rows
    = 313 tiles (one candidate per tile: the large-vocabulary path Ling's head takes)."""
    from sparkit.kernels.fp8_linear import quantize_fp8_per_row

    n = request.param
    g = torch.Generator(device="cuda").manual_seed(n)
    w = torch.randn(n, 2560, generator=g, device="cuda") * 0.02
    w *= torch.exp(0.35 * torch.randn(n, 1, generator=g, device="cuda"))
    w = w.to(torch.bfloat16)
    q, s = quantize_fp8_per_row(w)
    return w, q, s


@pytest.mark.parametrize("m", [1, 4, 16, 33])
def test_exact_rescoring_restores_the_bf16_argmax_on_near_ties(head_bf16, m):
    from sparkit.kernels.fp8_linear import fp8_linear, prepare_fp8_weight

    w, q, s = head_bf16
    xs = near_tie_states(w, 64 * m, seed=m)
    ref = xs.float() @ w.float().T
    plain = prepare_fp8_weight(q, s)
    exact = prepare_fp8_weight(q, s, exact_weight=w, exact_top_k=4)
    y_fp8 = torch.cat([fp8_linear(xs[i:i + m], plain, None, out_dtype=torch.float32) for i in range(0, len(xs), m)])
    y = torch.cat([fp8_linear(xs[i:i + m], exact, None, out_dtype=torch.float32) for i in range(0, len(xs), m)])
    # The states are near-ties: the FP8 head alone must get some wrong, or this test proves nothing.
    assert (y_fp8.argmax(1) != ref.argmax(1)).any()
    assert torch.equal(y.argmax(1), ref.argmax(1))
    changed = y != y_fp8
    assert (changed.sum(1) <= 8).all() and (changed.sum(1) >= 2).all()  # 4 stretches x 2 tokens
    # What changed is the exact product of the bf16 tensors (fp32 accumulation order aside)...
    torch.testing.assert_close(y[changed], ref[changed], rtol=1e-5, atol=1e-4)
    # ...and everything else is the FP8 head's own output, untouched.
    assert torch.equal(y[~changed], y_fp8[~changed])


def test_exact_rescoring_reads_the_weight_it_was_given(head_bf16):
    """A wrong exact weight must show in the logits: the re-scored values come from that tensor."""
    from sparkit.kernels.fp8_linear import fp8_linear, prepare_fp8_weight

    w, q, s = head_bf16
    x = near_tie_states(w, 4, 99)
    doubled = prepare_fp8_weight(q, s, exact_weight=(w.float() * 2).to(torch.bfloat16), exact_top_k=4)
    right = prepare_fp8_weight(q, s, exact_weight=w, exact_top_k=4)
    y_right = fp8_linear(x, right, None, out_dtype=torch.float32)
    y_doubled = fp8_linear(x, doubled, None, out_dtype=torch.float32)
    changed = y_doubled != fp8_linear(x, prepare_fp8_weight(q, s), None, out_dtype=torch.float32)
    torch.testing.assert_close(y_doubled[changed], 2 * y_right[changed], rtol=1e-5, atol=1e-4)


def test_exact_rescoring_replays_in_a_cuda_graph(head_bf16):
    """SGLang captures decode in CUDA graphs: the two kernels must capture and replay new inputs."""
    from sparkit.kernels.fp8_linear import fp8_linear, prepare_fp8_weight

    w, q, s = head_bf16
    packed = prepare_fp8_weight(q, s, exact_weight=w, exact_top_k=8)
    static_x = near_tie_states(w, 3, 5).clone()
    fp8_linear(static_x, packed, None, out_dtype=torch.bfloat16)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = fp8_linear(static_x, packed, None, out_dtype=torch.bfloat16)
    for seed in (6, 7):
        static_x.copy_(near_tie_states(w, 3, seed))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, fp8_linear(static_x, packed, None, out_dtype=torch.bfloat16))


def test_exact_rescoring_on_row_major_fp8_weights_uses_the_torch_selection(head_bf16):
    """Unpacked CUDA weights (the fallback path) re-score the global top k the same way."""
    from sparkit.kernels.fp8_linear import fp8_linear

    w, q, s = head_bf16
    x = torch.cat([near_tie_states(w, 16, seed) for seed in range(4)])
    ref = x.float() @ w.float().T
    y = fp8_linear(x, q, s, out_dtype=torch.float32, exact_weight=w, exact_top_k=8)
    assert torch.equal(y.argmax(1), ref.argmax(1))


@pytest.mark.parametrize("m", [1, 2, 5, 16, 17, 40])
def test_every_config_the_tuner_may_choose_matches_on_the_gpu(head_bf16, m):
    """The persistent kernel's variants and the grid kernel, compiled for this GPU: the exact
    dequantised product, and the same re-scored candidates and values as the former default."""
    from sparkit.kernels import fp8_gemv_triton as fk

    w, q, s = head_bf16
    packed = fk.pack_fp8_weight(q, s, exact=w, exact_top_k=4)
    x = near_tie_states(w, m, seed=100 + m)
    x[:, 5] = 2.0e5 if m == 5 else x[:, 5]  # a row the fp16 path must scale down
    want = _exact(x, q, s)
    ref = fk.fp8_linear_packed(x, packed, torch.float32, config=fk.PACKED_DEFAULT)
    bf16_product = x.float() @ w.float().T
    for cfg in fk.TUNE_CANDIDATES:
        y0 = fk.fp8_linear_packed(x, packed, torch.float32, config=cfg, exact_top_k=0)
        y = fk.fp8_linear_packed(x, packed, torch.float32, config=cfg)
        if fk.PACKED_MODES.get(cfg.kind) in fk.FP8_ACTIVATION_MODES:
            # FP8 MMAs, their partial sums promoted to fp32 once per K block: within half a bf16
            # ulp of the largest logit (carried through all the MMAs it was 2.7e-3..1.7e-2 on an
            # H200); the re-scoring rule holds on these logits, and its values are the bf16 product.
            err = ((y0.double() - want).abs().max() / want.abs().max()).item()
            assert err < 2.0 ** -9, (cfg.label(), err)
            assert _rescored(y0) == _changed(y, y0), cfg.label()
            changed = y != y0
            torch.testing.assert_close(y[changed], bf16_product[changed], rtol=1e-5, atol=1e-4)
            continue
        assert ((y0.double() - want).norm() / want.norm()).item() < 1e-5, cfg.label()
        assert torch.equal(y != y0, ref != fk.fp8_linear_packed(x, packed, torch.float32, exact_top_k=0,
                                                               config=fk.PACKED_DEFAULT)), cfg.label()
        torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-5)


def _changed(y, y0) -> list[set]:
    return [set((y[r] != y0[r]).nonzero().flatten().tolist()) for r in range(y.shape[0])]


def _stretch_tokens(n: int) -> int:
    """Tokens per re-scoring stretch (key slot) of an n-token packed head: whole 128-token tiles,
    at most RESCORE_SLOTS stretches."""
    from sparkit.kernels import fp8_gemv_triton as fk

    tiles = -(-n // fk.PACK_BLOCK_N)
    return -(-tiles // fk.RESCORE_SLOTS) * fk.PACK_BLOCK_N


def _rescored(y0, top_k: int = 4) -> list[set]:
    """Which tokens exact re-scoring recomputes from these FP8 logits: the best TOKENS_PER_STRETCH
    of each of the top_k best stretches (RESCORE_SLOTS stretches of whole 128-token tiles)."""
    import torch.nn.functional as F

    from sparkit.kernels import fp8_gemv_triton as fk

    m, n = y0.shape
    span = _stretch_tokens(n)
    slots = -(-n // span)
    stretches = F.pad(y0, (0, slots * span - n), value=-float("inf")).view(m, slots, span)
    best = stretches.max(2).values.topk(top_k, dim=1).indices
    return [{sl * span + i for sl in best[r].tolist() for i in stretches[r, sl].topk(fk.RESCORE_PER_SLOT).indices.tolist()}
            for r in range(m)]


def test_tuning_on_the_gpu_chooses_per_m_and_the_choice_replays_in_a_graph(head_bf16, tmp_path, monkeypatch):
    from sparkit.kernels import fp8_gemv_triton as fk
    from sparkit.kernels import fp8_tune
    from sparkit.kernels.fp8_linear import fp8_linear, kernel_description

    monkeypatch.setenv("SPARKIT_HOME", str(tmp_path))
    w, q, s = head_bf16
    packed = fk.pack_fp8_weight(q, s, exact=w, exact_top_k=4)
    rep = fp8_tune.tune_packed(packed, ms=(1, 2, 8), min_elements=0, reps=2, rounds=2)
    assert rep.source == "measured" and set(packed.tuned) == {1, 2, 8}, rep
    assert set(rep.times_us[1]) | set(rep.rejected) == {c.label() for c in fk.TUNE_CANDIDATES}
    assert not rep.rejected, rep.rejected  # every candidate runs and agrees on this GPU
    assert rep.summary() in kernel_description(packed)
    static_x = near_tie_states(w, 2, 5).clone()
    eager = fp8_linear(static_x, packed, None, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = fp8_linear(static_x, packed, None, out_dtype=torch.bfloat16)
        # Tuning is refused during a capture (its timing would be captured, not run).
        assert fp8_tune.tune_packed(fk.pack_fp8_weight(q, s), min_elements=0).reason == "a CUDA graph is being captured"
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, eager)
    assert torch.equal(eager, fk.fp8_linear_packed(static_x, packed, torch.bfloat16, config=packed.tuned[2]))


@pytest.mark.parametrize("m", [1, 7, 16])
def test_rescoring_that_guesses_early_stores_the_same_logits(head_bf16, m):
    """Launched early (PDL), the re-scoring kernel guesses its tokens from keys and logits read
    while the main kernel's last programs still run (the large vocabulary's grid outlasts one
    wave, so they do race here). What it stores must be the final tokens' values: the same
    logits as without guessing, for every config the tuner may choose, in and out of a graph."""
    from sparkit.kernels import fp8_gemv_triton as fk

    w, q, s = head_bf16
    packed = fk.pack_fp8_weight(q, s, exact=w, exact_top_k=4)
    for seed in range(3):
        x = near_tie_states(w, m, seed=300 + 10 * m + seed)
        for cfg in fk.TUNE_CANDIDATES:
            guessed = fk.fp8_linear_packed(x, packed, torch.bfloat16, config=cfg, speculate=True)
            plain = fk.fp8_linear_packed(x, packed, torch.bfloat16, config=cfg, speculate=False)
            assert torch.equal(guessed, plain), (cfg.label(), seed)
    static_x = near_tie_states(w, m, seed=7).clone()
    fk.fp8_linear_packed(static_x, packed, torch.bfloat16, speculate=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = fk.fp8_linear_packed(static_x, packed, torch.bfloat16, speculate=True)
    for seed in (8, 9):
        static_x.copy_(near_tie_states(w, m, seed))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, fk.fp8_linear_packed(static_x, packed, torch.bfloat16, speculate=False))


def test_a_wrong_or_garbage_guess_changes_no_logit_and_reads_inside_the_weight(head_bf16):
    """Guesses from keys that are not the final ones (none, another row's, random bits whose
    token ids lie far outside the vocabulary) are recomputed from the final keys; the garbage
    ones must not read outside the weight (a fault would end the process)."""
    from sparkit.kernels import fp8_gemv_triton as fk

    w, q, s = head_bf16
    packed = fk.pack_fp8_weight(q, s, exact=w, exact_top_k=4)
    x = near_tie_states(w, 5, seed=11)
    y0 = fk.fp8_linear_packed(x, packed, torch.float32, config=fk.PACKED_DEFAULT, exact_top_k=0)
    want = fk.fp8_linear_packed(x, packed, torch.float32, config=fk.PACKED_DEFAULT, speculate=False)
    span = _stretch_tokens(w.shape[0])
    keys = fk.reference_candidate_keys(y0, span)
    g = torch.Generator(device="cuda").manual_seed(3)
    guesses = {"final": keys, "none": torch.full_like(keys, -(2 ** 63)), "rolled": keys.roll(1, 0).contiguous(),
               "garbage": torch.randint(-(2 ** 62), 2 ** 62, keys.shape, generator=g, device="cuda") * 2}
    for name, guess in guesses.items():
        out = y0.clone()
        fk._rescore(x, w, keys, out, keys.shape[1], span, 4, fk.RESCORE_WARPS, fk.RESCORE_PER_SLOT, False, {},
                    speculate=True, guess_keys=guess)
        torch.cuda.synchronize()
        assert torch.equal(out, want), name
