"""FP8 (W8A16) lm_head linear on CPU: the torch reference path, and the Triton kernels' logic
run by Triton's CPU interpreter (TRITON_INTERPRET=1) in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)


def _exact(x, q, s):
    return x.double() @ (q.double() * s.double()[:, None]).T


def test_quantize_per_row_scale_range_and_rounding():
    from sparkit.kernels.fp8_linear import FP8_E4M3_MAX, quantize_fp8_per_row

    torch.manual_seed(0)
    w = torch.randn(64, 128) * torch.logspace(-3, 2, 64)[:, None]  # rows over 5 decades
    w[3] = 0.0
    q, s = quantize_fp8_per_row(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (64,)
    assert s[3] == 1.0 and q[3].float().abs().max() == 0  # an all-zero row stays zero
    amax = w.abs().amax(1)
    nz = amax > 0
    assert torch.allclose(s[nz], amax[nz] / FP8_E4M3_MAX)
    assert torch.equal(q.float().abs().amax(1)[nz], torch.full((63,), FP8_E4M3_MAX))
    deq = q.float() * s[:, None]
    big = w.abs() > amax[:, None] / 64  # normal e4m3 range: 3 mantissa bits -> <= 2^-4 relative
    assert ((deq - w).abs()[big] <= w.abs()[big] * 2 ** -4 + 1e-12).all()


def test_reference_linear_is_the_dequantised_product_across_row_chunks():
    from sparkit.kernels.fp8_linear import fp8_linear_reference, quantize_fp8_per_row

    torch.manual_seed(1)
    q, s = quantize_fp8_per_row(torch.randn(1000, 96))
    x = torch.randn(2, 3, 96).to(torch.bfloat16)
    y = fp8_linear_reference(x, q, s, out_dtype=torch.float32, chunk_rows=97)  # uneven chunks
    assert y.shape == (2, 3, 1000) and y.dtype == torch.float32
    exact = _exact(x.reshape(6, 96), q, s).reshape(2, 3, 1000)
    assert ((y.double() - exact).norm() / exact.norm()).item() < 1e-6
    assert fp8_linear_reference(x, q, s).dtype == torch.bfloat16  # default: the input's dtype


def test_dispatch_on_cpu_uses_the_reference_and_prepare_declines():
    from sparkit.kernels.fp8_linear import fp8_linear, fp8_linear_reference, prepare_fp8_weight, quantize_fp8_per_row

    q, s = quantize_fp8_per_row(torch.randn(50, 32))
    x = torch.randn(4, 32)
    assert torch.equal(fp8_linear(x, q, s), fp8_linear_reference(x, q, s))
    assert prepare_fp8_weight(q, s) is None  # packing is for the CUDA kernel only


def test_exact_rescoring_gives_the_bf16_argmax_where_fp8_alone_flips_it():
    """Near-ties (two tokens a few hundredths of a logit apart) flip under per-row e4m3; re-scoring
    the FP8 top candidates exactly from the bf16 weight gives back the bf16 head's choice at every one."""
    from sparkit.kernels.fp8_linear import fp8_linear, quantize_fp8_per_row

    from _shared import near_tie_states

    torch.manual_seed(3)
    n, k = 6000, 256
    w = (torch.randn(n, k) * 0.06 * torch.exp(0.35 * torch.randn(n, 1))).to(torch.bfloat16)
    x = near_tie_states(w, 256, seed=3)
    ref = x.float() @ w.float().T
    q, s = quantize_fp8_per_row(w)
    fp8_only = fp8_linear(x, q, s, out_dtype=torch.float32)
    flips = int((fp8_only.argmax(1) != ref.argmax(1)).sum())
    assert flips >= 5  # the states really are near-ties for this head
    y = fp8_linear(x, q, s, out_dtype=torch.float32, exact_weight=w, exact_top_k=4)
    assert torch.equal(y.argmax(1), ref.argmax(1))
    top8 = fp8_only.topk(8, dim=1).indices  # 4 candidates x TOKENS_PER_STRETCH on the torch path
    torch.testing.assert_close(y.gather(1, top8), ref.gather(1, top8), rtol=1e-5, atol=1e-4)
    others = torch.ones_like(y, dtype=torch.bool).scatter_(1, top8, False)
    assert torch.equal(y[others], fp8_only[others])
    # Off by default for a plain call, and k = 0 is off.
    assert torch.equal(fp8_linear(x, q, s, out_dtype=torch.float32, exact_weight=w, exact_top_k=0), fp8_only)


def test_fp8_head_keeps_top1_of_a_peaked_bf16_head():
    from sparkit.kernels.fp8_linear import fp8_linear, quantize_fp8_per_row

    torch.manual_seed(2)
    w = (torch.randn(4000, 64) * 0.05).to(torch.bfloat16)
    targets = torch.randint(0, 4000, (64,))
    x = (w[targets].float() * 40 + torch.randn(64, 64) * 0.5).to(torch.bfloat16)
    q, s = quantize_fp8_per_row(w)
    ref = (x.float() @ w.float().T)
    y = fp8_linear(x, q, s, out_dtype=torch.float32)
    assert (y.argmax(1) == ref.argmax(1)).float().mean() == 1.0
    assert ((y - ref).norm() / ref.norm()).item() < 0.05


_INTERPRETER_SCRIPT = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    from sparkit.kernels.fp8_linear import quantize_fp8_per_row
    from sparkit.kernels import fp8_gemv_triton as fk
    N, K = 300, 256
    q, s = quantize_fp8_per_row(torch.randn(N, K))
    exact = lambda x: x.double() @ (q.double() * s.double()[:, None]).T
    packed = fk.pack_fp8_weight(q, s, 64, 128)
    q2, s2 = fk.unpack_fp8_weight(packed)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s2, s)
    packed128 = fk.pack_fp8_weight(q, s, 128, 128)
    for m in (1, 3, 17):
        for dt in (torch.float16, torch.bfloat16):
            x = torch.randn(m, K).to(dt)
            x[:, 7] = 3.0e4  # needs the fp16 path's rescaling
            want = exact(x)
            runs = {f"packed mode {mode}": fk.fp8_linear_packed(x, packed, torch.float32, mode=mode)
                    for mode in (1, 2, 3, 4, 5, 6)}
            runs["tma16"] = fk.fp8_linear(x, q, s, torch.float32, config=fk.KernelConfig("tma16", 64, 128, 4, 3))
            runs["dot"] = fk.fp8_linear(x, q, s, torch.float32, config=fk.KernelConfig("dot", 64, 128, 4, 3))
            runs["cc"] = fk.fp8_linear(x, q, s, torch.float32, config=fk.KernelConfig("cc", 16, 128, 4, 3))
            if dt == torch.float16:
                runs["packed mode 0"] = fk.fp8_linear_packed(x, packed, torch.float32, mode=0)
                runs["tma"] = fk.fp8_linear(x, q, s, torch.float32, config=fk.KernelConfig("tma", 64, 128, 4, 3))
            for kind in ("pk16p", "pk8", "pk8w"):  # programs reading half a packed tile each
                runs[f"{kind} stripes"] = fk.fp8_linear_packed(x, packed128, torch.float32,
                                                               config=fk.KernelConfig(kind, 64, 128, 4, 3))
            if dt == torch.float16:  # 8 significant bits in two e4m3 parts: fp16's 11 take mode 4
                assert torch.equal(runs["packed mode 5"], runs["packed mode 4"])
            for name, y in runs.items():
                rel = ((y.double() - want).norm() / want.norm()).item()
                assert y.shape == (m, N) and rel < 1e-5, (name, m, dt, rel)
    # The FP8-activation modes' split: a bf16 row is hi * 2^e + lo * 2^e_lo exactly where its
    # values lie within e4m3's normal range of its largest (rows of randn, one scaled to 1e-30);
    # a row with a 3e4 outlier loses only values below 2^-20 of it; hi alone is not the row.
    x = torch.randn(19, K).clamp(-4, 4).to(torch.bfloat16)
    x[x.abs() < 2.0 ** -9] = 2.0 ** -9
    x[3, 9] = -3.0e4
    x[5] *= 1e-30
    x8, e = fk._split_rows(x, x, 0, 0, False)
    at = torch.arange(19) + torch.arange(19) // 16 * 16
    hi, lo = x8[at].double(), x8[at + 16].double()
    rebuilt = hi * torch.exp2(e[at].double())[:, None] + lo * torch.exp2(e[at + 16].double())[:, None]
    plain = torch.arange(19) != 3
    assert torch.equal(rebuilt[plain], x.double()[plain]), (rebuilt - x.double())[plain].abs().max()
    assert (rebuilt[3] - x[3].double()).abs().max() <= 3.0e4 * 2.0 ** -20
    assert not torch.equal(hi * torch.exp2(e[at].double())[:, None], x.double())
    bad = s.clone(); bad[5] *= 2  # a wrong scale must show: the check above is not vacuous
    x = torch.randn(2, K).to(torch.bfloat16)
    y = fk.fp8_linear_packed(x, fk.pack_fp8_weight(q, bad, 64, 128), torch.float32, mode=1)
    assert torch.allclose(y[:, 5].double(), 2 * exact(x)[:, 5], rtol=1e-4, atol=1e-6)
    assert torch.allclose(y[:, 6].double(), exact(x)[:, 6], rtol=1e-4, atol=1e-6)
    # Exact top-k re-scoring: the epilogue's keyed slots and the re-scoring kernel. 3000 tokens =
    # 47 tiles of 64 (24 of 128); 16 slots -> 3 tiles per slot (2 of 128); 256 slots -> 1. Logits of both signs, and a
    # row whose logits are all negative (the key's order-preserving bits must hold there too).
    import itertools
    import torch.nn.functional as F
    w = (torch.randn(3000, K) * 0.05).to(torch.bfloat16)
    qw, sw = quantize_fp8_per_row(w)
    x = torch.randn(5, K).to(torch.bfloat16)
    ref = x.float() @ w.float().T
    x[4] = -x[4].abs()
    wpos = w.abs()
    qp, sp = quantize_fp8_per_row(wpos)
    for weight, qq, ss in ((w, qw, sw), (wpos, qp, sp)):
        ref = x.float() @ weight.float().T
        # (packed tile rows, how the kernel runs: a mode on whole tiles, or a config on half tiles)
        runs = [(64, {"mode": mode}) for mode in (4, 2, 5)]
        runs += [(128, {"config": fk.KernelConfig(kind, 64, 128, 4, 3)}) for kind in ("pk8", "pk16p")]
        for (pack_n, how), slots in itertools.product(runs, (16, 256)):
            packed = fk.pack_fp8_weight(qq, ss, pack_n, 128, exact=weight, exact_top_k=4)
            y0 = fk.fp8_linear_packed(x, packed, torch.float32, exact_top_k=0, **how)
            y = fk.fp8_linear_packed(x, packed, torch.float32, key_slots=slots, **how)
            changed = y != y0
            assert torch.allclose(y[changed], ref[changed], rtol=1e-5, atol=1e-5)
            assert torch.equal(y[~changed], y0[~changed])
            tiles = -(-3000 // pack_n)
            group = -(-tiles // slots)
            n_slots = -(-tiles // group)
            span = group * pack_n
            stretches = F.pad(y0, (0, n_slots * span - 3000), value=-float("inf")).view(5, n_slots, span)
            best_slots = stretches.max(2).values.topk(4, dim=1).indices
            for r in range(5):
                want = set()
                for sl in best_slots[r].tolist():
                    want |= {sl * span + i for i in stretches[r, sl].topk(2).indices.tolist()}
                assert set(changed[r].nonzero().flatten().tolist()) == want, (how, slots, r)
    # Speculative re-scoring: the tokens guessed from keys read before the main kernel is done
    # (here: the final keys, none, garbage, another row's) never change what is stored; a miss
    # re-reads the final token's row.
    packed = fk.pack_fp8_weight(qw, sw, 64, 128, exact=w, exact_top_k=4)
    y0 = fk.fp8_linear_packed(x, packed, torch.float32, exact_top_k=0, mode=4)
    want = fk.fp8_linear_packed(x, packed, torch.float32, mode=4, key_slots=16)
    span, n_slots = 3 * 64, 16
    keys = fk.reference_candidate_keys(y0, span)
    guesses = {"final": keys, "none": torch.full_like(keys, -(2 ** 63)),
               "garbage": torch.randint(-(2 ** 62), 2 ** 62, keys.shape) * 2,
               "rolled": keys.roll(1, 0).contiguous()}
    for speculate, (name, guess) in itertools.product((False, True), guesses.items()):
        out = y0.clone()
        fk._rescore(x, w, keys, out, n_slots, span, 4, 1, 2, False, {}, speculate=speculate, guess_keys=guess)
        assert torch.equal(out, want), (speculate, name, (out != want).sum())
    out = y0.clone()  # and the check is not vacuous: a wrong final key changes what is stored
    fk._rescore(x, w, keys.roll(1, 0).contiguous(), out, n_slots, span, 4, 1, 2, False, {}, speculate=True,
                guess_keys=keys)
    assert not torch.equal(out, want)
    print("INTERPRETER-OK")
""")


@pytest.mark.slow
def test_triton_kernels_under_the_cpu_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _INTERPRETER_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "INTERPRETER-OK" in proc.stdout, proc.stderr[-3000:]


def test_kernel_description_names_the_path_the_head_takes():
    """The engine logs this and puts it in the activation report: it must say which path runs."""
    from sparkit.kernels.fp8_linear import kernel_description, quantize_fp8_per_row

    q, s = quantize_fp8_per_row(torch.randn(300, 256))
    assert kernel_description(q).startswith("torch reference")  # CPU tensors: no Triton kernel
    fk = pytest.importorskip("sparkit.kernels.fp8_gemv_triton")
    packed = fk.pack_fp8_weight(q, s)  # what prepare_fp8_weight returns on CUDA
    desc = kernel_description(packed)
    assert desc.startswith("Triton") and fk.PACKED_DEFAULT.label() in desc
    assert f"{fk.PACK_BLOCK_N}x{fk.PACK_BLOCK_K}" in desc and "no exact re-scoring" in desc
    exact = fk.pack_fp8_weight(q, s, exact=torch.randn(300, 256).to(torch.bfloat16), exact_top_k=8)
    assert "top-8 candidates re-scored exactly" in kernel_description(exact)
    assert "top-4 candidates re-scored exactly" in kernel_description(q, exact_top_k=4)


@pytest.mark.parametrize("variable, value", [("SPARKIT_FP8_LOGITS_EVICT", "keep"), ("SPARKIT_FP8_PROMOTE_K", "-2"),
                                             ("SPARKIT_FP8_RESCORE_SPECULATE", "yes")])
def test_a_bad_value_of_a_kernel_knob_is_named_at_import(variable, value):
    """The kernel module's measuring knobs refuse a value Triton would fail on later, by name."""
    pytest.importorskip("triton")
    env = dict(os.environ, **{variable: value})
    proc = subprocess.run([sys.executable, "-c", "import sparkit.kernels.fp8_gemv_triton"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and f"{variable}={value!r}" in proc.stderr, proc.stderr[-2000:]
    env[variable] = {"SPARKIT_FP8_LOGITS_EVICT": "evict_first", "SPARKIT_FP8_PROMOTE_K": "32",
                     "SPARKIT_FP8_RESCORE_SPECULATE": "0"}[variable]
    ok = subprocess.run([sys.executable, "-c", "import sparkit.kernels.fp8_gemv_triton"], env=env,
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
