"""What reading Ling's FP8 head costs with no arithmetic at all: the ceiling under the FP8 lm_head kernel.

On the GPU, from the repository root:
    python3 benchmarks/fp8_read_ceiling.py OUTDIR
writes OUTDIR/fp8_read_ceiling.txt (and .json). In one process, interleaved round by round and
replayed from CUDA graphs (sparkit.kernels.fp8_tune.time_graphs), with weight copies in rotation
so that no call finds its weight in L2:

* bf16 F.linear at M = 1 on the whole head (157184 x 2560, 805 MB) and on half its rows (the
  bytes of the e4m3 head, 402 MB): cuBLAS's own time for the FP8 kernel's bytes;
* a Triton kernel that only streams the packed e4m3 weight by TMA, tile by tile, with the FP8
  kernel's grid (one program per stripe of 128 or 64 tokens) and pipeline depths, and sums each
  tile's bytes per row (so the loads cannot be dropped; every byte goes through registers, as in
  the fp16-MMA kernel, not in the FP8-MMA one);
* torch's own sum over the same bytes (as int32 words).

--rehearse runs it on the CPU through Triton's interpreter at a toy shape (figures meaningless).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--n", type=int, default=157184)
    ap.add_argument("--k", type=int, default=2560)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rehearse", action="store_true")
    args = ap.parse_args(argv)
    if args.rehearse:
        os.environ["TRITON_INTERPRET"] = "1"
        args.n, args.k, args.copies, args.rounds, args.reps = 1024, 512, 2, 1, 1
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch
    import torch.nn.functional as F
    import triton
    import triton.language as tl

    from sparkit.kernels import fp8_gemv_triton as fk
    from sparkit.kernels import fp8_tune

    @triton.jit
    def stream_only(w_desc, out_ptr, K_BLOCKS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PACK_N: tl.constexpr, NUM_STAGES: tl.constexpr):
        SUB: tl.constexpr = PACK_N // BLOCK_N
        pid = tl.program_id(0)
        row0 = (pid // SUB) * K_BLOCKS * PACK_N + (pid % SUB) * BLOCK_N
        keep = tl.zeros((BLOCK_N,), dtype=tl.int32)
        for kb in tl.range(0, K_BLOCKS, num_stages=NUM_STAGES):
            w = w_desc.load([row0 + kb * PACK_N, 0])
            keep += tl.sum(w.to(tl.int8, bitcast=True).to(tl.int32), axis=1)
        tl.store(out_ptr + pid, tl.sum(keep, axis=0))

    dev = "cpu" if args.rehearse else "cuda"
    n, k = args.n, args.k
    gen = torch.Generator(device="cpu").manual_seed(0)
    w_bf16 = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16).to(dev)
    x = torch.randn(1, k, generator=gen).to(torch.bfloat16).to(dev)
    q = w_bf16.to(torch.float8_e4m3fn)
    packed = [fk.pack_fp8_weight(q, torch.ones(n, device=dev)) for _ in range(args.copies)]
    whole = [w_bf16] + [w_bf16.clone() for _ in range(args.copies - 1)]
    half = [w[: n // 2].clone() for w in whole]
    words = [p.data.view(torch.int32) for p in packed]
    outs = torch.empty(n, dtype=torch.int32, device=dev)
    k_blocks = packed[0].data.shape[0] // packed[0].scale.shape[0]

    def rotating(fn):
        state = {"i": 0}

        def call():
            state["i"] = (state["i"] + 1) % args.copies
            return fn(state["i"])
        return call

    fns = {"bf16 F.linear, whole head": rotating(lambda i: F.linear(x, whole[i])),
           "bf16 F.linear, half the rows (the e4m3 bytes)": rotating(lambda i: F.linear(x, half[i])),
           "torch sum of the e4m3 bytes (int32 words)": rotating(lambda i: words[i].sum(dtype=torch.int64))}
    for block_n, stages, warps in ((128, 3, 4), (128, 4, 4), (128, 5, 4), (64, 4, 4), (64, 6, 4), (128, 4, 8)):
        if fk.PACK_BLOCK_N % block_n:
            continue

        def launch(i, block_n=block_n, stages=stages, warps=warps):
            desc = fk._descriptor(packed[i].data, (block_n, fk.PACK_BLOCK_K))
            stream_only[(packed[i].scale.shape[0] // block_n,)](
                desc, outs, K_BLOCKS=k_blocks, BLOCK_N=block_n, BLOCK_K=fk.PACK_BLOCK_K,
                PACK_N=fk.PACK_BLOCK_N, NUM_STAGES=stages, num_warps=warps)
        fns[f"TMA stream only, grid of {block_n}-token stripes, {stages} stages, {warps} warps"] = rotating(launch)
    for fn in fns.values():
        fn()
    if args.rehearse:
        times = {name: [] for name in fns}
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e6)
    else:
        times = fp8_tune.time_graphs(fns, reps=args.reps, rounds=args.rounds)
    e4m3_bytes = packed[0].data.numel()
    rows = []
    for name, per_round in times.items():
        us = statistics.median(per_round)
        moved = n * k * 2 if "whole" in name else (n // 2) * k * 2 if "half" in name else e4m3_bytes
        rows.append({"what": name, "us": us, "bytes": moved, "gb_s": moved / us / 1e3})
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    gpu = "CPU interpreter (rehearsal)" if args.rehearse else torch.cuda.get_device_name()
    lines = [f"# reading the e4m3 head ({n} x {k}, {e4m3_bytes / 1e6:.1f} MB) with no arithmetic, {gpu}, "
             f"triton {triton.__version__}; CUDA-graph replay, {args.reps} calls per graph, {args.rounds} rounds",
             "what | us | GB/s"]
    lines += [f"{r['what']} | {r['us']:.1f} | {r['gb_s']:.0f}" for r in rows]
    (outdir / "fp8_read_ceiling.txt").write_text("\n".join(lines) + "\n")
    (outdir / "fp8_read_ceiling.json").write_text(json.dumps({"command": sys.argv, "rows": rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
