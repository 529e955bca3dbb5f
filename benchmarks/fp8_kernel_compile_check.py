"""Compile every FP8 head kernel config the tuner may choose for Hopper (sm_90), without a GPU.

    python benchmarks/fp8_kernel_compile_check.py            (the installed Triton)
    PYTHONPATH=/path/to/triton-3.6 python benchmarks/fp8_kernel_compile_check.py

Prints, per candidate of sparkit.kernels.fp8_gemv_triton.TUNE_CANDIDATES at Ling's head (K = 2560,
10 K blocks, 128 x 256 packing, exact re-scoring on): shared memory, registers per thread (from
the cubin, by the Triton wheel's cuobjdump), how many such programs an H100/H200 SM holds (228 KB
of shared memory, 64K registers) against the ctas_per_sm its grid assumes, and whether the code
has the persistent kernel's L2 prefetch and the dependent-launch wait. A config that would not
compile or fit on the device fails here first.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SM90_SHARED = 228 * 1024  # per SM; each CTA also reserves 1 KB
SM90_REGISTERS = 65536


def compile_for_sm90(cfg, key_group: int = 5, k_blocks: int = 10):
    """(shared bytes, PTX text, cubin bytes) of cfg's main kernel built for sm_90."""
    from sparkit.kernels import fp8_gemv_triton as fk

    if cfg.kind == fk.STREAM_KIND:
        fn = fk._fp8_stream_kernel
        sig = {"x_desc": "tensordesc<fp16[16, 256]>", "e_ptr": "*fp32",
               "w_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {cfg.block_k}]>", "w_ptr": "*fp8e4nv",
               "w_bytes": "i64", "s_ptr": "*fp32", "out_ptr": "*bf16", "M": "i32", "N": "i32", "stride_om": "i32",
               "key_ptr": "*i64", "n_slots": "i32", "n_stripes": "i32", "prefetch_bytes": "i32"}
        const = dict(BLOCK_M=16, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PACK_N=fk.PACK_BLOCK_N,
                     K_BLOCKS=k_blocks, NUM_STAGES=cfg.num_stages, KEY_GROUP=key_group, PDL=True, PREFETCH=True,
                     LOGITS_EVICT=fk.LOGITS_EVICT)
    else:
        fn = fk._fp8_packed_kernel
        mode = fk.PACKED_MODES[cfg.kind]
        # the activations as the mode reads them: fp16 rows, or e4m3 hi/lo rows (32 per block of 16)
        x_desc = ("tensordesc<fp8e4nv[32, 256]>" if mode == 6 else "tensordesc<fp8e4nv[16, 256]>"
                  if mode in fk.FP8_ACTIVATION_MODES else "tensordesc<fp16[16, 256]>")
        sig = {"x_desc": x_desc, "x_ptr": "*bf16", "stride_xm": "i32", "e_ptr": "*fp32",
               "w_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {cfg.block_k}]>", "s_ptr": "*fp32", "out_ptr": "*bf16",
               "M": "i32", "N": "i32", "K": "i32", "stride_om": "i32", "key_ptr": "*i64", "n_slots": "i32",
               "w_ptr": "*fp8e4nv"}
        const = dict(BLOCK_M=16, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, K_BLOCKS=k_blocks,
                     NUM_STAGES=cfg.num_stages, MODE=mode, PDL=True, KEY_GROUP=key_group,
                     PREFETCH_TILES=min(cfg.prefetch_kb * 1024 // (cfg.block_n * cfg.block_k), k_blocks),
                     PACK_N=fk.PACK_BLOCK_N, LOGITS_EVICT=fk.LOGITS_EVICT)
    kernel = _compile_sm90(fn, sig, const, cfg.num_warps)
    return kernel.metadata.shared, kernel.asm["ptx"], kernel.asm["cubin"]


def _compile_sm90(fn, sig: dict, const: dict, num_warps: int):
    """fn built for sm_90 with these argument types and constexprs, under what Triton assumes at
    run time at Ling's head (N = 157184, K = 2560, torch's allocations): pointers and the sizes
    and strides divisible by 16 (it decides, among others, the vector width of loads and stores)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {**sig, **{name: "constexpr" for name in const}}
    names = list(sig)
    aligned = [name for name, kind in sig.items()
               if kind.startswith("*") or name in ("N", "K", "stride_om", "stride_xm", "stride_wn")]
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    return triton.compile(ASTSource(fn, sig, const, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps})


def compile_rescore_for_sm90(speculate: bool, n_slots: int = 246, slot_tokens: int = 640, k: int = 2560):
    """The re-scoring kernel's PTX for sm_90 at Ling's head (246 slots of 640 tokens, K = 2560),
    launched early (PDL), with or without its early guess."""
    from sparkit.kernels import fp8_gemv_triton as fk

    sig = {"x_ptr": "*bf16", "stride_xm": "i32", "w_ptr": "*bf16", "stride_wn": "i32", "key_ptr": "*i64",
           "guess_key_ptr": "*i64", "out_ptr": "*bf16", "stride_om": "i32", "n_slots": "i32", "N": "i32", "K": "i32"}
    const = dict(fk.rescore_constants(n_slots, slot_tokens, k, fk.RESCORE_WARPS), PDL=True, SPECULATE=speculate)
    return _compile_sm90(fk._rescore_kernel, sig, const, fk.RESCORE_WARPS).asm["ptx"]


def registers(cubin: bytes) -> int | None:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as handle:
        handle.write(cubin)
    try:
        text = subprocess.run([str(tool), "--dump-resource-usage", handle.name], capture_output=True,
                              text=True, check=True).stdout
    finally:
        os.unlink(handle.name)
    found = re.search(r"REG:(\d+)", text)
    return int(found.group(1)) if found else None


def programs_per_sm(cfg, shared: int, regs: int | None) -> int:
    by_shared = SM90_SHARED // (shared + 1024)
    by_regs = SM90_REGISTERS // (regs * 32 * cfg.num_warps) if regs else by_shared
    return min(by_shared, by_regs, 64 // cfg.num_warps)


def main() -> int:
    import triton

    from sparkit.kernels import fp8_gemv_triton as fk

    print(f"triton {triton.__version__}, target sm_90")
    bad = 0
    for cfg in fk.TUNE_CANDIDATES:
        shared, ptx, cubin = compile_for_sm90(cfg)
        regs = registers(cubin)
        fit = programs_per_sm(cfg, shared, regs)
        wants = max(1, cfg.ctas_per_sm)
        extras = [name for name, marker in (("L2 prefetch", "cp.async.bulk.prefetch.L2"),
                                            ("PDL wait", "griddepcontrol.wait"),
                                            ("wgmma", "wgmma.mma_async")) if marker in ptx]
        ok = fit >= wants
        bad += not ok
        print(f"{cfg.label():28s} shared {shared / 1024:6.1f} KB, {regs} registers -> {fit} per SM "
              f"(grid assumes {wants}){'' if ok else '  DOES NOT FIT'}; {', '.join(extras)}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
