"""The FP8 head's per-GPU kernel choice (sparkit.kernels.fp8_tune) and every config it may choose.

The tuner picks, unattended on the device, among fp8_gemv_triton.TUNE_CANDIDATES; each of them is
run here by Triton's CPU interpreter (TRITON_INTERPRET=1, in a subprocess) against the exact
dequantised product and the exact re-scoring rule, so that no config the device may choose has
only been seen by the device. The timer is the one hardware boundary faked (CUDA events)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def _interpret(script: str, tmp_path, timeout: int = 900) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", SPARKIT_HOME=str(tmp_path / "home"))
    env.pop("SPARKIT_FP8_TUNE", None)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


# A head of 1000 tokens (8 packed tiles of 128, the last one padded) x 512 (2 K blocks of 256), so
# that persistent grids of 3 or 6 programs (the interpreter's 3 "SMs") get unequal runs of stripes.
_HEAD = """
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    torch.set_num_threads(1)
    from sparkit.kernels.fp8_linear import quantize_fp8_per_row
    from sparkit.kernels import fp8_gemv_triton as fk
    N, K = 1000, 512
    w = (torch.randn(N, K) * 0.05).to(torch.bfloat16)
    q, s = quantize_fp8_per_row(w)
    packed = fk.pack_fp8_weight(q, s, fk.PACK_BLOCK_N, fk.PACK_BLOCK_K, exact=w, exact_top_k=4)
    fp8 = q.double() * s.double()[:, None]
"""

_CANDIDATES_SCRIPT = _HEAD + """
    n_tiles = packed.scale.shape[0] // packed.block_n
    group = -(-n_tiles // fk.RESCORE_SLOTS)
    n_slots = -(-n_tiles // group)
    span = group * packed.block_n
    for cfg in fk.TUNE_CANDIDATES:
        for m in (1, 3, 17):  # 17: two blocks of 16 rows
            x = torch.randn(m, K).to(torch.bfloat16)
            if m == 3:
                x[1, 7] = 3.0e4  # a row the fp16 path must scale down by a power of two
            want = x.double() @ fp8.T
            y0 = fk.fp8_linear_packed(x, packed, torch.float32, config=cfg, exact_top_k=0)
            rel = ((y0.double() - want).norm() / want.norm()).item()
            assert y0.shape == (m, N) and rel < 1e-5, (cfg.label(), m, rel)
            yb = fk.fp8_linear_packed(x, packed, torch.bfloat16, config=cfg, exact_top_k=0)
            # bf16 out: y0 rounded (to nearest on a GPU; the interpreter truncates: one ulp)
            assert yb.dtype == torch.bfloat16 and torch.allclose(yb.float(), y0, rtol=2.0 ** -7, atol=1e-6), cfg.label()
            # Exact top-4: the 2 best tokens of each of the 4 best stretches get the bf16 product.
            y = fk.fp8_linear_packed(x, packed, torch.float32, config=cfg)
            changed = y != y0
            ref = x.float() @ w.float().T
            assert torch.allclose(y[changed], ref[changed], rtol=1e-5, atol=1e-4), cfg.label()
            assert torch.equal(y[~changed], y0[~changed]), cfg.label()
            stretches = F.pad(y0, (0, n_slots * span - N), value=-float("inf")).view(m, n_slots, span)
            best = stretches.max(2).values.topk(4, dim=1).indices
            for r in range(m):
                expected = set()
                for sl in best[r].tolist():
                    expected |= {sl * span + i for i in stretches[r, sl].topk(2).indices.tolist()}
                assert set(changed[r].nonzero().flatten().tolist()) == expected, (cfg.label(), m, r)
        print("ok", cfg.label(), flush=True)
    # The pre-scaling kernel's two forms (one read of the row; BLOCK_K pieces past
    # PRESCALE_ONE_PASS_K): fp16(x * 2^-e) with e the smallest power of two >= 0 bringing max|x| to 4.
    for kk, one in ((512, True), (fk.PRESCALE_ONE_PASS_K + 8, False)):
        x = torch.randn(3, kk).to(torch.bfloat16)
        x[1, kk - 1] = -3.0e4
        xs = torch.empty(3, kk, dtype=torch.float16)
        e = torch.empty(3)
        fk._prescale_rows_kernel[(3,)](x, xs, e, kk, x.stride(0), x, 0, BLOCK_K=512 if not one else kk,
                                       ONE_PASS=one)
        want_e = torch.clamp(torch.ceil(torch.log2(x.float().abs().amax(1) * 0.25)), min=0)
        assert torch.equal(e, want_e) and e[1] == 13, (kk, e)
        assert torch.equal(xs, (x.float() * torch.exp2(-want_e)[:, None]).half()), kk
    print("CANDIDATES-OK")
"""


@pytest.mark.slow
def test_every_config_the_tuner_may_choose_is_exact_under_the_cpu_interpreter(tmp_path):
    """Logits against the exact dequantised product (fp32 and bf16 outputs, a row that needs the
    fp16 path's scaling, two 16-row blocks), and exact top-4 re-scoring's candidates and values,
    for every TUNE_CANDIDATE: the legacy grid kernel and each persistent variant."""
    from sparkit.kernels import fp8_gemv_triton as fk

    out = _interpret(_CANDIDATES_SCRIPT, tmp_path)
    assert "CANDIDATES-OK" in out
    assert {line.split()[1] for line in out.splitlines() if line.startswith("ok ")} == {
        c.label() for c in fk.TUNE_CANDIDATES}
    kinds = {c.kind for c in fk.TUNE_CANDIDATES}
    assert fk.STREAM_KIND in kinds and fk.PACKED_DEFAULT.kind in kinds
    assert {c.block_n for c in fk.TUNE_CANDIDATES if c.kind == fk.STREAM_KIND} == {64, 128}
    assert {"pk8", "pk8w"} <= kinds  # the e4m3-activation modes, on half tiles as well
    assert any(c.kind == "pk8w" and c.block_n < fk.PACK_BLOCK_N for c in fk.TUNE_CANDIDATES)


_TUNER_SCRIPT = _HEAD + """
    import json, os
    from sparkit.kernels import fp8_tune
    from sparkit.kernels.fp8_linear import fp8_linear, kernel_description
    A = fk.KernelConfig(fk.STREAM_KIND, 64, 256, 4, 5, 2, 64)
    B = fk.KernelConfig(fk.STREAM_KIND, 128, 256, 4, 3, 1, 0)
    BROKEN = fk.KernelConfig("tma16", 128, 256, 4, 3)  # a row-major weight's kernel: cannot read this one
    calls = []

    def timer(fns, reps, rounds):  # CUDA events stand-in: A wins for M <= 2, B above
        calls.append(sorted(fns))
        fast = A.label() if len(calls) <= 2 else B.label()
        return {name: [1.0 if name == fast else 2.0 + i] * rounds for i, name in enumerate(fns)}

    rep = fp8_tune.tune_packed(packed, ms=(1, 2, 3), candidates=[A, B, BROKEN], timer=timer, min_elements=0)
    assert rep.source == "measured", rep
    assert "does not read a packed weight" in rep.rejected[BROKEN.label()], rep.rejected
    assert set(rep.rejected) == {BROKEN.label()}, rep.rejected
    assert all(BROKEN.label() not in c for c in calls) and len(calls) == 3
    assert packed.tuned == {1: A, 2: A, 3: B}, packed.tuned
    assert packed.config_for(16) == B and packed.config_for(1) == A
    assert rep.summary() == f"tuned on this GPU (measured): M=1-2 {A.label()}, M=3 {B.label()}", rep.summary()
    assert rep.summary() in kernel_description(packed)
    # The tuned path is what fp8_linear runs, and it computes the same logits.
    x = torch.randn(2, K).to(torch.bfloat16)
    y = fp8_linear(x, packed, None, out_dtype=torch.float32)
    assert torch.equal(y, fk.fp8_linear_packed(x, packed, torch.float32, config=A))
    # Cached: a second weight of the same shape re-uses the choice without timing anything.
    again = fk.pack_fp8_weight(q, s, fk.PACK_BLOCK_N, fk.PACK_BLOCK_K, exact=w, exact_top_k=4)
    rep2 = fp8_tune.tune_packed(again, ms=(1, 2, 3), candidates=[A, B, BROKEN], timer=timer, min_elements=0)
    assert rep2.source == "cache" and len(calls) == 3 and again.tuned == packed.tuned, rep2
    path = fp8_tune._cache_path()
    print("MODE", oct(os.stat(path).st_mode & 0o777))
    data = json.load(open(path))
    assert list(data) == [rep.key] and data[rep.key]["chosen"] == {"1": A.label(), "2": A.label(), "3": B.label()}
    # A different re-scoring depth is another key: measured again.
    other = fk.pack_fp8_weight(q, s, fk.PACK_BLOCK_N, fk.PACK_BLOCK_K, exact=w, exact_top_k=2)
    rep3 = fp8_tune.tune_packed(other, ms=(1,), candidates=[A, B], timer=timer, min_elements=0)
    assert rep3.source == "measured" and rep3.key != rep.key and len(calls) == 4
    # A cached label this sparkit no longer offers is not trusted: the entry is measured anew.
    data = json.load(open(path))
    data[rep.key]["chosen"]["1"] = "ps16p:n96k256w4s3p1f0"
    open(path, "w").write(json.dumps(data))
    rep4 = fp8_tune.tune_packed(again, ms=(1, 2, 3), candidates=[A, B, BROKEN], timer=timer, min_elements=0)
    assert rep4.source == "measured" and rep4.key == rep.key and len(calls) == 7, rep4
    print("TUNER-OK")
"""


@pytest.mark.slow
def test_the_tuner_keeps_the_fastest_config_that_agrees_and_caches_it(tmp_path):
    out = _interpret(_TUNER_SCRIPT, tmp_path)
    assert "TUNER-OK" in out
    assert "MODE 0o600" in out  # sparkit's state is private


def _small_packed(n=300, k=256, exact_top_k=0):
    from sparkit.kernels import fp8_gemv_triton as fk
    from sparkit.kernels.fp8_linear import quantize_fp8_per_row

    w = torch.randn(n, k).to(torch.bfloat16)
    q, s = quantize_fp8_per_row(w)
    return fk.pack_fp8_weight(q, s, exact=w if exact_top_k else None, exact_top_k=exact_top_k)


def test_tuning_is_skipped_where_it_cannot_or_need_not_run(monkeypatch):
    from sparkit.kernels import fp8_gemv_triton as fk
    from sparkit.kernels import fp8_tune

    packed = _small_packed()
    rep = fp8_tune.tune_packed(packed)  # 300 x 256: far below the threshold
    assert rep.source == "skipped" and "below" in rep.reason and packed.tuned == {}
    assert packed.config_for(1) == fk.PACKED_DEFAULT and packed.tuning is rep
    rep = fp8_tune.tune_packed(packed, min_elements=0)  # CPU tensors, no timer given
    assert rep.source == "skipped" and "no CUDA device" in rep.reason
    monkeypatch.setenv("SPARKIT_FP8_TUNE", "0")
    rep = fp8_tune.tune_packed(packed, min_elements=0, timer=lambda *a: pytest.fail("timed while off"))
    assert rep.source == "skipped" and "SPARKIT_FP8_TUNE=0" in rep.reason
    assert rep.summary() == "not tuned (SPARKIT_FP8_TUNE=0)"


def test_agreement_check_catches_wrong_logits_and_passes_rounding():
    from sparkit.kernels.fp8_tune import _agrees

    ref = torch.randn(3, 500) * 3
    assert _agrees(ref.clone(), ref) == ""
    assert _agrees(ref.to(torch.bfloat16), ref.to(torch.bfloat16)) == ""
    nudged = ref.clone()
    nudged[0, 5] += 1e-6 * ref.abs().max()  # below fp32 output rounding of the largest logit
    assert _agrees(nudged, ref) == ""
    wrong = ref.clone()
    wrong[1, 7] += 0.5  # one logit off: what a racing or miscompiled kernel produces
    assert "differ" in _agrees(wrong, ref)
    swapped = ref.clone()
    top = swapped[2].argmax()
    swapped[2, top] = swapped[2].min() - 1  # argmax moved; magnitude within tolerance elsewhere
    assert _agrees(swapped, ref) != ""
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert "non-finite" in _agrees(nan, ref)
    assert "shape" in _agrees(ref[:2], ref)


def test_config_labels_round_trip_and_bad_ones_are_named():
    from sparkit.kernels import fp8_gemv_triton as fk

    for cfg in (*fk.TUNE_CANDIDATES, fk.UNPACKED_DEFAULT, fk.FP32_DEFAULT):
        assert fk.KernelConfig.from_label(cfg.label()) == cfg
    assert fk.KernelConfig.from_label("ps16p:n64k256w4s5p2f64").ctas_per_sm == 2
    with pytest.raises(ValueError, match="not a kernel config label"):
        fk.KernelConfig.from_label("ps16p:n64")
    with pytest.raises(ValueError, match="belongs to ps16p only"):
        fk.KernelConfig.from_label("pk16p:n128k256w4s3p2f64")
    with pytest.raises(ValueError, match="belongs to ps16p only"):
        fk.KernelConfig.from_label("ps16p:n128k256w4s3p2")  # the persistent kernel states its prefetch
    grid = fk.KernelConfig.from_label("pk8w:n64k256w4s3f32")  # a grid program's L2 prefetch, in KiB
    assert (grid.kind, grid.block_n, grid.prefetch_kb, grid.ctas_per_sm) == ("pk8w", 64, 32, 0)
    assert fk.KernelConfig("pk8", 64, 256, 4, 4).label() == "pk8:n64k256w4s4"  # no prefetch: no suffix


def test_configs_that_do_not_read_the_packing_are_refused():
    from sparkit.kernels import fp8_gemv_triton as fk
    from sparkit.kernels import fp8_tune

    packed = _small_packed()  # 128 x 256 tiles
    x = torch.randn(1, 256).to(torch.bfloat16)
    for bad in (fk.KernelConfig(fk.STREAM_KIND, 96, 256, 4, 3, 1, 0),  # 96 does not split 128
                fk.KernelConfig(fk.STREAM_KIND, 128, 128, 4, 3, 1, 0),  # not the packing's K block
                fk.KernelConfig(fk.STREAM_KIND, 128, 256, 4, 3, 0, 0),  # no programs
                fk.KernelConfig("pk16p", 96, 256, 4, 3)):  # a grid program's stripe must split a tile
        with pytest.raises(ValueError, match="does not fit a weight packed as 128x256"):
            fk.fp8_linear_packed(x, packed, config=bad)
        assert bad not in fp8_tune.fitting_candidates(packed, [bad, fk.PACKED_DEFAULT])
    with pytest.raises(ValueError, match="does not read a packed weight"):
        fk.fp8_linear_packed(x, packed, config=fk.UNPACKED_DEFAULT)
    assert fp8_tune.fitting_candidates(packed) == list(fk.TUNE_CANDIDATES)


def test_the_summary_groups_runs_of_m():
    from sparkit.kernels.fp8_tune import TuneReport

    rep = TuneReport(source="measured", chosen={1: "a", 2: "a", 3: "b", 4: "a", 5: "a"})
    assert rep.summary() == "tuned on this GPU (measured): M=1-2 a, M=3 b, M=4-5 a"


@pytest.mark.slow
def test_every_candidate_compiles_for_hopper_and_holds_its_programs_per_sm():
    """Without a GPU: each candidate is compiled for sm_90 by the installed Triton and ptxas
    (benchmarks/fp8_kernel_compile_check.py); its shared memory and registers must let an SM hold
    the ctas_per_sm programs its grid assumes, its MMAs must be Hopper's (wgmma), and the
    persistent kernel must carry its L2 prefetch and dependent-launch wait. (The device's Triton
    3.6 gives the same verdicts: benchmarks/results/README.md.)"""
    import triton

    from _shared import REPO_DIR

    if not (REPO_DIR / "benchmarks").is_dir():
        pytest.skip("no benchmarks/ beside the tests")
    sys.path.insert(0, str(REPO_DIR / "benchmarks"))
    import fp8_kernel_compile_check as check

    from sparkit.kernels import fp8_gemv_triton as fk

    if not (os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))):
        pytest.skip("this Triton has no ptxas to compile for sm_90")
    for cfg in fk.TUNE_CANDIDATES:
        shared, ptx, cubin = check.compile_for_sm90(cfg)
        regs = check.registers(cubin)
        assert regs is not None and regs <= 255, (cfg.label(), regs)
        assert check.programs_per_sm(cfg, shared, regs) >= max(1, cfg.ctas_per_sm), (cfg.label(), shared, regs)
        assert "wgmma.mma_async" in ptx, cfg.label()  # Hopper tensor cores, not the mma.sync fallback
        # the logits are stored with vector stores that ask L2 to keep them (fk.LOGITS_EVICT)
        assert re.search(r"st\.global\.L1::evict_last\.L2::cache_hint\.v\d", ptx), cfg.label()
        assert "createpolicy.fractional.L2::evict_last" in ptx, cfg.label()
        if cfg.kind == fk.STREAM_KIND or cfg.prefetch_kb:
            assert "cp.async.bulk.prefetch.L2.global" in ptx and "griddepcontrol.wait" in ptx, cfg.label()
        if fk.PACKED_MODES.get(cfg.kind) in fk.FP8_ACTIVATION_MODES:  # e4m3 x e4m3 MMAs, the weight unconverted
            assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n(16|32)k32\.f32\.e4m3\.e4m3", ptx), cfg.label()
            assert "cvt.rn.f16x2.e4m3x2" not in ptx, cfg.label()
    # The check is not vacuous: a candidate with more stages than an SM's shared memory holds
    # twice is reported as not fitting its two programs per SM.
    greedy = fk.KernelConfig(fk.STREAM_KIND, 128, 256, 4, 5, 2, 0)
    shared, _, cubin = check.compile_for_sm90(greedy)
    assert check.programs_per_sm(greedy, shared, check.registers(cubin)) < 2


def test_the_rescoring_kernel_reads_its_guessed_rows_before_the_wait_and_the_keys_at_l2():
    """Compiled for sm_90 (benchmarks/fp8_kernel_compile_check.py): with the guess, the bf16
    rows of the guessed tokens are loaded before the dependent-launch wait (that is its whole
    gain), and without it none is. Every read of the keys and of the slot's logits is at L2
    (ld.global.cg): the guess reads them before the main kernel is done, and a line left in L1
    from that read would hide the final values from the read after the wait."""
    import triton

    from _shared import REPO_DIR

    if not (os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))):
        pytest.skip("this Triton has no ptxas to compile for sm_90")
    sys.path.insert(0, str(REPO_DIR / "benchmarks"))
    import fp8_kernel_compile_check as check

    for speculate in (True, False):
        ptx = check.compile_rescore_for_sm90(speculate)
        before, wait, after = ptx.partition("griddepcontrol.wait")
        assert wait, speculate
        key_loads = re.compile(r"ld\.global(\.cg)?\.b64 ")  # the int64 keys
        assert key_loads.search(after) and all(x.group(1) for x in key_loads.finditer(ptx)), speculate
        row_loads = len(re.findall(r"ld\.global\.v4\.b32 ", before))  # the bf16 rows of x and w (not .cg)
        assert (row_loads >= 20) if speculate else (row_loads == 0 and not key_loads.search(before)), (speculate, row_loads)
        assert len(re.findall(r"ld\.global\.cg\.v4\.b32 ", after)) >= 4, speculate  # the slot's 640 logits


@pytest.mark.slow
def test_the_device_benchmark_rehearses_end_to_end_on_the_cpu(tmp_path):
    """benchmarks/fp8_head_limit.py runs unattended in one device call: its whole flow (inputs,
    the tuner, the table, the checks, both files) is rehearsed here through the interpreter."""
    from _shared import REPO_DIR

    out = tmp_path / "out"
    env = dict(os.environ, SPARKIT_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(REPO_DIR / "benchmarks" / "fp8_head_limit.py"), str(out), "--rehearse", "--ms", "1-2",
         "--candidates", "pk16p:n128k256w4s3,ps16p:n64k256w4s5p2f64"],
        env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((out / "fp8_head_limit.json").read_text())
    assert [row["m"] for row in doc["rows"]] == [1, 2]
    for row in doc["rows"]:
        assert set(row["us"]) == {"bf16", "fp8", "exact", "cand", "former", "no guess"}
        assert row["logits_equal_no_guess"]
        assert row["config"] in ("pk16p:n128k256w4s3", "ps16p:n64k256w4s5p2f64")
        assert 1.0 < row["limit_x"] < 2.05 and row["argmax_equal_former"] and row["max_abs_diff_vs_former"] == 0
    assert doc["rows"][0]["top1_vs_bf16"] == 1.0  # exact top-4 re-scoring at the toy shape
    assert doc["tuning"]["source"] == "measured" and set(doc["tuning"]["chosen"]) == {"1", "2"}
    table = (out / "fp8_head_limit.txt").read_text()
    assert table.count("\n1 | ") == 1 and "# worst M:" in table and "# kernel config per M: tuned" in table
    assert "LOGITS DIFFER" not in table
