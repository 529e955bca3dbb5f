#!/usr/bin/env python3
"""Run SGLang 0.5.23's Triton attention kernels on CPU under Triton's interpreter
(TRITON_INTERPRET=1) at the tiny MLA model's widths, to see which widths the
kernels accept before spending GPU time.

Why: on an H200, ``--attention-backend triton`` died capturing CUDA graphs with
kv_lora_rank=128 / qk_rope_head_dim=128 (absorbed decode Lk=256, Lv=128):
``_decode_grouped_att_m_fwd`` -> CompilationError ``ValueError('Cannot
make_shape_compatible: incompatible dimensions at index 1: 128 and 256')``.
The grouped decode kernel only splits K into latent + rope for Lk == 576 (512+64)
and Lk == 288 (256+32); for any other Lk it reads BLOCK_DMODEL = next_pow2(Lk)
columns and, under MLA, reuses that K tile as V (``v = tl.trans(k)``), so the
P.V product is Lk wide while the accumulator is Lv wide.

Cases (one printed line each):
  a  decode_attention_fwd, MLA absorbed, old widths Lk 256 / Lv 128
     -> expected to fail with the same make_shape_compatible error (shows the
        interpreter reproduces the H200 failure).
  b  decode_attention_fwd, MLA absorbed, new widths Lk 576 / Lv 512
     (2 q heads, 1 latent kv head, v = first 512 columns of the 576-wide cache),
     checked against softmax(q k^T * scale) v in PyTorch.
  c1 extend_attention_fwd, absorbed form as in target verify (Lq=Lk 576, Lv 512,
     prefix from the paged latent cache + draft tokens under a bool custom mask).
  c2 extend_attention_fwd, absorbed form with a cached prefix and plain causal
     mask (chunked prefill / prefix-cache hit goes down the MLA path too).
  c3 extend_attention_fwd, normal (non-absorbed, "MHA") prefill with no prefix:
     q/k head dim 128, v head dim 64, 2 heads, k_buffer/v_buffer the MLA pool's
     576 / 512-wide buffers (as triton_backend.forward_extend passes them).
  Each of b/c* is compared against a PyTorch fp32 reference.

The calls mirror sglang/srt/layers/attention/triton_backend.py: forward_decode ->
decode_attention_fwd(q[B,H,576], k_buffer[N,1,576], v_buffer=k_buffer[...,:512],
o[B,H,512], kv_indptr int32, kv_indices int64, attn_logits[B,H,S,512] f32,
attn_lse[B,H,S] f32, num_kv_splits int32, max_kv_splits, scaling, 1.0, 1.0,
has_mla=True, use_pdl=True on sm90, page_size=1; the interpreter cannot run
tl.extra.cuda.gdc_* so decode retries with use_pdl=False and says so); forward_extend ->
extend_attention_fwd(q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr,
kv_indices, custom_mask, causal=True, mask_indptr, max_extend_len, 1.0, 1.0,
scaling, page_size=1). On CUDA (no gfx95) the target-verify split-KV kernels are
off, so target verify reaches extend_attention_fwd.

How the kernels are loaded: the script builds a shadow ``sglang`` package in
--work-dir (default /tmp/tri-work) holding byte-for-byte copies of
sglang/kernels/ops/attention/{decode_attention,extend_attention,score_mod}.py
(sha256 checked against the install) plus small stubs for what they import from
sglang.srt (utils: is_cuda True, is_hip/gfx* False, get_device_core_count 132;
environ: the env flags they read, all at their defaults; runtime_context). That
emulates an sm90 CUDA host: torch.cuda.get_device_capability is patched to (9, 0)
so extend_attention picks the Hopper BLOCK_M/BLOCK_N. Nothing in the sglang
install is modified.

Run (CPU only, a few seconds once the venv exists; no GPU needed):
    python3 -m venv /tmp/triton-venv
    /tmp/triton-venv/bin/pip install torch triton==3.6.0 "numpy<2.4"  # CPU torch is fine
    TRITON_INTERPRET=1 /tmp/triton-venv/bin/python \\
        benchmarks/sglang_triton_mla_interpret.py \\
        --sglang-root SITE_PACKAGES/sglang   # an SGLang 0.5.23 install (pip install --no-deps sglang==0.5.23)
(The script sets TRITON_INTERPRET=1 itself if it is unset.)
numpy must be < 2.4: with numpy 2.4 the triton 3.6 interpreter fails on every
``tl.range(start, end)`` whose bounds come from tl.load ("TypeError: only
0-dimensional arrays can be converted to Python scalars").

Data are float16: the interpreter stores bfloat16 as raw uint16 and its tl.dot
multiplies those bit patterns as integers, so bf16 numerics are meaningless there.
Widths and control flow are the same for fp16 and bf16.

What this proves: the kernels' tensor shapes, masks, broadcasting and index
arithmetic work at these widths, and the math matches a reference (the
interpreter executes the kernel body op by op with numpy, including the
shape checks that raised the H200 CompilationError).
What it does NOT prove: anything about GPU code generation -- shared-memory
capacity (Lk 576 tiles with BLOCK_N 32/64 are exactly the DeepSeek-V3 shapes
SGLang ships, but the interpreter does not check), register pressure / spills,
num_warps/num_stages pipelining, PDL (gdc_*) semantics, CUDA-graph capture, or
bf16 rounding. A GPU run is still the final word.
"""

import argparse
import hashlib
import os
import shutil
import sys
import time
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
# Padded head rows (BLOCK_H 16 > 2 heads) compute exp(-inf - -inf) = nan, as on the
# GPU; they are masked out of every store. Keep numpy from warning about it.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\..*")

# an SGLang 0.5.23 install is only read (its kernel files copied): --sglang-root says where
DEFAULT_SGLANG_ROOT = None
KERNEL_FILES = ("decode_attention.py", "extend_attention.py", "score_mod.py")

STUB_UTILS = '''\
"""Stub for the sglang.srt.utils helpers the Triton attention kernels import.
Emulates an NVIDIA sm90 (H100/H200) host."""


def is_cuda():
    return True


def is_hip():
    return False


def is_gfx95_supported():
    return False


def is_gfx1250_supported():
    return False


def get_device_core_count(device_id: int = 0) -> int:
    return 132  # H100 SXM / H200 SM count
'''

STUB_ENVIRON = '''\
"""Stub for sglang.srt.environ.envs: only the flags the kernels read, at defaults."""


class _Env:
    def __init__(self, value):
        self._value = value

    def get(self):
        return self._value


class _Envs:
    _DEFAULTS = {
        "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": False,
        "SGLANG_MLA_DECODE_TUNE": True,  # only read on gfx950
        "SGLANG_FORCE_LEAN_GRID_CU_MULT": 1.0,  # only read on HIP (Lean)
        "SGLANG_TRITON_FP8_PREFILL_ATTN": False,  # only read on gfx95
        "SGLANG_TRITON_COMPACT_EXTEND_ATTENTION": False,  # only read on HIP
    }

    def __getattr__(self, name):
        if name in self._DEFAULTS:
            return _Env(self._DEFAULTS[name])
        raise AttributeError(f"stub envs has no {name}; add it to the stub")


envs = _Envs()
'''

STUB_RUNTIME_CONTEXT = '''\
"""Stub: only reached by the gfx950 MLA tuning path, which is off here."""


def get_exec():
    raise ValueError("runtime context not published (stub)")
'''


def build_shadow_package(sglang_root: Path, work_dir: Path) -> None:
    pkg = work_dir / "sglang"
    if pkg.exists():
        shutil.rmtree(pkg)
    attn = pkg / "kernels" / "ops" / "attention"
    attn.mkdir(parents=True)
    (pkg / "srt").mkdir()
    for d in (pkg, pkg / "kernels", pkg / "kernels" / "ops", attn, pkg / "srt"):
        (d / "__init__.py").write_text("")
    for name in KERNEL_FILES:
        src = sglang_root / "kernels" / "ops" / "attention" / name
        dst = attn / name
        shutil.copyfile(src, dst)
        a = hashlib.sha256(src.read_bytes()).hexdigest()
        b = hashlib.sha256(dst.read_bytes()).hexdigest()
        assert a == b, f"copy of {name} differs"
    (pkg / "srt" / "utils.py").write_text(STUB_UTILS)
    (pkg / "srt" / "environ.py").write_text(STUB_ENVIRON)
    (pkg / "srt" / "runtime_context.py").write_text(STUB_RUNTIME_CONTEXT)


def import_kernels(work_dir: Path):
    # extend_attention.py reads the capability at import when is_cuda() is True.
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    sys.path.insert(0, str(work_dir))
    from sglang.kernels.ops.attention import decode_attention as da
    from sglang.kernels.ops.attention import extend_attention as ea

    assert "sglang/kernels" in da.__file__ and str(work_dir) in da.__file__
    return da, ea


DTYPE = torch.float16
ATOL = 2e-2


def _randn(*shape, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(DTYPE)


def _short_err(e: BaseException) -> str:
    # Walk the cause chain and report the innermost message (the interpreter
    # wraps the kernel error), plus the outer type.
    chain = [e]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        nxt = chain[-1].__cause__ or chain[-1].__context__
        if nxt in chain:
            break
        chain.append(nxt)
    inner = chain[-1]
    # Innermost frame inside the copied kernel files: where the kernel broke.
    where = ""
    for exc in chain:
        for fr in traceback.extract_tb(exc.__traceback__):
            if "/sglang/kernels/ops/attention/" in fr.filename:
                where = (f" (at {Path(fr.filename).name}:{fr.lineno} in {fr.name}: "
                         f"`{(fr.line or '').strip()}`)")
    msg = f"{type(e).__name__}"
    if inner is not e:
        msg += f" <- {type(inner).__name__}"
    text = str(inner).strip().splitlines()
    msg += ": " + (text[-1] if text else repr(inner))
    return msg + where


# --------------------------------------------------------------------------- decode
def run_decode(da, kv_lora_rank, rope_dim, num_heads=2, seq_lens=(7, 70),
               num_kv_splits=(1, 3), max_kv_splits=4, use_pdl=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    Lk, Lv = kv_lora_rank + rope_dim, kv_lora_rank
    B, H = len(seq_lens), num_heads
    N = sum(seq_lens) + 16  # pool slots
    scaling = 1.0 / (64 + rope_dim) ** 0.5  # qk_head_dim of the non-absorbed form

    kv_cache = _randn(N, 1, Lk, gen=gen)  # MLATokenToKVPool layer buffer
    k_buffer = kv_cache
    v_buffer = kv_cache[..., :kv_lora_rank]  # get_value_buffer: a strided view
    perm = torch.randperm(N, generator=gen)
    kv_indptr = torch.zeros(B + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(torch.tensor(seq_lens), 0)
    kv_indices = perm[: sum(seq_lens)].to(torch.int64)

    q = _randn(B, H, Lk, gen=gen)
    o = torch.empty(B, H, Lv, dtype=DTYPE)
    attn_logits = torch.zeros(B, H, max_kv_splits, Lv, dtype=torch.float32)
    attn_lse = torch.zeros(B, H, max_kv_splits, dtype=torch.float32)
    nks = torch.tensor(num_kv_splits, dtype=torch.int32)

    da.decode_attention_fwd(
        q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
        nks, max_kv_splits, scaling, 1.0, 1.0,
        logit_cap=0.0, sinks=None, xai_temperature_len=-1,
        has_mla=True, use_pdl=use_pdl, page_size=1,
        score_mod=None, aux_tensors=None, enable_lean=None,
        lean_Mp=None, lean_Lp=None, lean_Op=None, lean_locks=None,
        uneven_batch=torch.zeros(1, dtype=torch.int32),
    )

    err = 0.0
    for b in range(B):
        idx = kv_indices[kv_indptr[b]: kv_indptr[b + 1]]
        K = k_buffer[idx, 0, :].float()  # [L, Lk]
        V = v_buffer[idx, 0, :].float()  # [L, Lv]
        s = (q[b].float() @ K.T) * scaling  # [H, L]
        ref = torch.softmax(s, -1) @ V
        err = max(err, (o[b].float() - ref).abs().max().item())
    return err


# --------------------------------------------------------------------------- extend
def run_extend(ea, *, qk_dim, v_dim, q_heads, kv_heads, prefix_lens, extend_lens,
               pool_k_dim, pool_v_dim, scaling, target_verify_mask=False,
               absorbed=True, seed=1):
    """absorbed=True: k_extend/v_extend/prefix come from the latent cache (v is the
    first v_dim columns of k).  absorbed=False: separate MHA k/v, no prefix."""
    gen = torch.Generator().manual_seed(seed)
    B = len(extend_lens)
    T = sum(extend_lens)
    N = sum(prefix_lens) + T + 16

    kv_cache = _randn(N, 1, pool_k_dim, gen=gen)
    k_buffer = kv_cache
    v_buffer = kv_cache[..., :pool_v_dim]

    q = _randn(T, q_heads, qk_dim, gen=gen)
    if absorbed:
        k_ext = _randn(T, kv_heads, qk_dim, gen=gen)
        v_ext = k_ext[..., :v_dim].contiguous()  # forward_extend does .contiguous()
    else:
        k_ext = _randn(T, kv_heads, qk_dim, gen=gen)
        v_ext = _randn(T, kv_heads, v_dim, gen=gen)
    o = torch.empty(T, q_heads, v_dim, dtype=DTYPE)

    qo_indptr = torch.zeros(B + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.cumsum(torch.tensor(extend_lens), 0)
    kv_indptr = torch.zeros(B + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(torch.tensor(prefix_lens), 0)
    perm = torch.randperm(N, generator=gen)
    kv_indices = perm[: max(1, sum(prefix_lens))].to(torch.int64)

    custom_mask = None
    mask_indptr = torch.zeros(B + 1, dtype=torch.int64)
    masks = []
    if target_verify_mask:
        # EAGLE topk=1 chain: every draft token sees the whole prefix and the
        # draft tokens up to itself. Layout per request: [n_draft, prefix + n_draft].
        for p, e in zip(prefix_lens, extend_lens):
            m = torch.zeros(e, p + e, dtype=torch.bool)
            m[:, :p] = True
            m[:, p:] = torch.tril(torch.ones(e, e, dtype=torch.bool))
            masks.append(m)
        custom_mask = torch.cat([m.flatten() for m in masks])
        mask_indptr[1:] = torch.cumsum(
            torch.tensor([m.numel() for m in masks]), 0)

    # Write the extend tokens into the pool too (save_kv_cache), as the server does.
    if absorbed:
        loc = perm[sum(prefix_lens): sum(prefix_lens) + T]
        kv_cache[loc, :, :] = k_ext

    ea.extend_attention_fwd(
        q, k_ext, v_ext, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
        custom_mask, True, mask_indptr, max(extend_lens), 1.0, 1.0, scaling,
        logit_cap=0.0, sliding_window_size=-1, sinks=None, window_kv_offsets=None,
        xai_temperature_len=-1, page_size=1, score_mod=None, aux_tensors=None,
        extend_seq_lens_cpu=list(extend_lens),
    )

    group = q_heads // kv_heads
    err = 0.0
    for b in range(B):
        p, e = prefix_lens[b], extend_lens[b]
        pidx = kv_indices[kv_indptr[b]: kv_indptr[b + 1]] if p else None
        qs, qe = qo_indptr[b].item(), qo_indptr[b + 1].item()
        for h in range(q_heads):
            kh = h // group
            Ke = k_ext[qs:qe, kh].float()
            Ve = v_ext[qs:qe, kh].float()
            if p:
                Kp = k_buffer[pidx, kh, :qk_dim].float()
                Vp = v_buffer[pidx, kh, :v_dim].float()
                K, V = torch.cat([Kp, Ke]), torch.cat([Vp, Ve])
            else:
                K, V = Ke, Ve
            s = (q[qs:qe, h].float() @ K.T) * scaling  # [e, p+e]
            if target_verify_mask:
                allow = masks[b]
            else:
                allow = torch.ones(e, p + e, dtype=torch.bool)
                allow[:, p:] = torch.tril(torch.ones(e, e, dtype=torch.bool))
            s = s.masked_fill(~allow, float("-inf"))
            ref = torch.softmax(s, -1) @ V
            err = max(err, (o[qs:qe, h].float() - ref).abs().max().item())
    return err


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sglang-root", default=DEFAULT_SGLANG_ROOT, required=True,
                    help="the sglang package directory of an SGLang 0.5.23 install (site-packages/sglang)")
    ap.add_argument("--work-dir", default="/tmp/tri-work")
    args = ap.parse_args()

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    build_shadow_package(Path(args.sglang_root), work)
    import triton

    da, ea = import_kernels(work)
    print(f"# triton {triton.__version__}, torch {torch.__version__}, "
          f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}, dtype {DTYPE}, "
          f"kernels from {args.sglang_root}", flush=True)

    failures = 0

    def report(case, widths, fn, expect_error=None):
        nonlocal failures
        t0 = time.time()
        try:
            err = fn()
        except Exception as e:  # noqa: BLE001
            dt = time.time() - t0
            text = _short_err(e)
            if expect_error and expect_error in "".join(
                    traceback.format_exception(e)):
                print(f"{case} | {widths} | expected error reproduced: {text} "
                      f"[{dt:.1f}s]", flush=True)
            else:
                failures += 1
                print(f"{case} | {widths} | ERROR: {text} [{dt:.1f}s]", flush=True)
            return
        dt = time.time() - t0
        if expect_error:
            failures += 1
            print(f"{case} | {widths} | UNEXPECTED ok (no error), max abs err "
                  f"{err:.3e} [{dt:.1f}s]", flush=True)
        elif err <= ATOL:
            print(f"{case} | {widths} | ok, max abs err {err:.3e} [{dt:.1f}s]",
                  flush=True)
        else:
            failures += 1
            print(f"{case} | {widths} | MISMATCH, max abs err {err:.3e} "
                  f"(atol {ATOL}) [{dt:.1f}s]", flush=True)

    def decode_case(kv_lora_rank, rope_dim):
        # use_pdl=True as on sm90; fall back if the interpreter lacks gdc ops.
        try:
            return run_decode(da, kv_lora_rank, rope_dim, use_pdl=True)
        except Exception as e:  # noqa: BLE001
            if "gdc" in "".join(traceback.format_exception(e)).lower() or \
                    "launch_pdl" in "".join(traceback.format_exception(e)):
                print(f"#   note: use_pdl=True not runnable in interpreter "
                      f"({_short_err(e)}); retrying use_pdl=False", flush=True)
                return run_decode(da, kv_lora_rank, rope_dim, use_pdl=False)
            raise

    report("a decode_attention_fwd (grouped, MLA absorbed), old model",
           "Lk 256 / Lv 128, q heads 2, kv heads 1",
           lambda: decode_case(128, 128),
           expect_error="Cannot make_shape_compatible")
    report("b decode_attention_fwd (grouped, MLA absorbed), new model",
           "Lk 576 / Lv 512, q heads 2, kv heads 1",
           lambda: decode_case(512, 64))
    report("c1 extend_attention_fwd, absorbed target verify (custom mask)",
           "Lq=Lk 576 / Lv 512, q heads 2, kv heads 1, prefix (5, 40), draft 3",
           lambda: run_extend(ea, qk_dim=576, v_dim=512, q_heads=2, kv_heads=1,
                              prefix_lens=(5, 40), extend_lens=(3, 3),
                              pool_k_dim=576, pool_v_dim=512,
                              scaling=1.0 / 128 ** 0.5, target_verify_mask=True))
    report("c2 extend_attention_fwd, absorbed extend with prefix (causal)",
           "Lq=Lk 576 / Lv 512, q heads 2, kv heads 1, prefix (4, 33), extend (6, 40)",
           lambda: run_extend(ea, qk_dim=576, v_dim=512, q_heads=2, kv_heads=1,
                              prefix_lens=(4, 33), extend_lens=(6, 40),
                              pool_k_dim=576, pool_v_dim=512,
                              scaling=1.0 / 128 ** 0.5))
    report("c3 extend_attention_fwd, normal (MHA) prefill, no prefix",
           "Lq=Lk 128 / Lv 64, q heads 2, kv heads 2, extend (5, 70)",
           lambda: run_extend(ea, qk_dim=128, v_dim=64, q_heads=2, kv_heads=2,
                              prefix_lens=(0, 0), extend_lens=(5, 70),
                              pool_k_dim=576, pool_v_dim=512,
                              scaling=1.0 / 128 ** 0.5, absorbed=False))
    return 1 if failures else 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"# total {time.time() - t0:.1f}s, rc={rc}", flush=True)
    sys.exit(rc)
