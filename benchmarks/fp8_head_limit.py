"""The FP8 lm_head kernel at its limit (issue 25 item 4): Ling-3.0-flash's head, M = 1..16.

On the GPU (one H200 here), from the repository root:
    python3 benchmarks/fp8_head_limit.py OUTDIR
writes OUTDIR/fp8_head_limit.json and OUTDIR/fp8_head_limit.txt, both rewritten after every M (a
run cut short keeps what it measured), and logs its steps on stderr. About 60-90 s on an H200.

What it does, in one process:
1. Ling's head (157184 x 2560; the rows' norms vary, hidden states are heavy-tailed: the inputs of
   benchmarks/fp8_lm_head.py), quantised to e4m3 per row and packed; --copies copies of each
   weight, so that consecutive calls never find the weight in L2.
2. The kernel config per M is chosen on this GPU by sparkit's own tuner (sparkit.kernels.fp8_tune,
   what the SGLang plugin runs at load), with exact top-4 re-scoring on; its per-M timings of every
   candidate are printed and recorded.
3. Per M, interleaved round by round and replayed from CUDA graphs (as SGLang decodes): bf16
   F.linear; the tuned FP8 kernel without and with exact top-4 re-scoring; the same with only the
   candidates' epilogue (no re-scoring kernel: what re-scoring costs); the tuned path with
   re-scoring that does not guess its tokens before the main kernel is done; and the former shipped
   path (PACKED_DEFAULT, exact top-4), the baseline of earlier H200 results. The ratio is the
   median of per-round ratios. Beside it, the bytes-bound limit: the bytes bf16 F.linear moves over
   the bytes the FP8 path moves (e4m3 weight, row scales, activations, logits, re-scored rows).
4. Checks: the tuned path's logits against the former path's (the same MMA steps: equal), and top-1
   against bf16 F.linear's over the sample states at M = 1 and the largest M.

--rehearse runs the same steps on the CPU through Triton's interpreter (TRITON_INTERPRET=1, set by
the script) at a toy shape, timed by the wall clock, to check the script itself before a device
session; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

T0 = time.monotonic()


def log(*a):
    print(f"[{time.monotonic() - T0:6.1f}s]", *a, file=sys.stderr, flush=True)


def parse_ms(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return sorted(set(out))


def wall_timer(fns, reps, rounds):
    """--rehearse's stand-in for CUDA-graph timing: wall-clock microseconds per call."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            times[name].append((time.perf_counter() - start) * 1e6 / reps)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", help="directory for fp8_head_limit.json and fp8_head_limit.txt")
    ap.add_argument("--n", type=int, default=157184)
    ap.add_argument("--k", type=int, default=2560)
    ap.add_argument("--ms", default="1-16", help="rows per call, e.g. 1-16 or 1,2,4 (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=20, help="calls per CUDA graph")
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--exact-top-k", type=int, default=4)
    ap.add_argument("--tune-rounds", type=int, default=5)
    ap.add_argument("--tune-reps", type=int, default=10)
    ap.add_argument("--candidates", default="",
                    help="comma-separated config labels for the tuner (default: all of TUNE_CANDIDATES)")
    ap.add_argument("--rescore-parts", action="store_true",
                    help="also time, at the first and last M, what each part of exact re-scoring costs: "
                         "the re-scoring kernel with 1 slot of 1 token, 4 slots of 1 token, 2 warps, 128 slots")
    ap.add_argument("--rehearse", action="store_true", help="CPU interpreter run of the script at a toy shape")
    args = ap.parse_args(argv)
    if args.rehearse:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
        args.n, args.k, args.copies, args.samples = min(args.n, 600), min(args.k, 512), 2, 8
        args.rounds, args.reps, args.tune_rounds, args.tune_reps = 1, 1, 1, 1
    os.environ.setdefault("SPARKIT_FP8_TUNE", "1")

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    import torch.nn.functional as F
    import triton
    from fp8_lm_head import make_inputs

    from sparkit.kernels import fp8_gemv_triton as fk
    from sparkit.kernels import fp8_linear as api
    from sparkit.kernels import fp8_tune

    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    json_path, txt_path = outdir / "fp8_head_limit.json", outdir / "fp8_head_limit.txt"
    dev = "cpu" if args.rehearse else "cuda"
    n, k, top_k = args.n, args.k, args.exact_top_k
    ms = parse_ms(args.ms)
    if args.rehearse:
        ms = [m for m in ms if m <= 2] or ms[:1]
    gpu = "CPU interpreter (rehearsal)" if args.rehearse else torch.cuda.get_device_name()
    sms = fk.INTERPRETER_SMS if args.rehearse else torch.cuda.get_device_properties(0).multi_processor_count
    log(f"{gpu}, {sms} SMs, torch {torch.__version__}, triton {triton.__version__}, N={n} K={k}, M={ms}")
    doc = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if argv is None else argv,
           "device": gpu, "sms": sms, "torch": torch.__version__, "triton": triton.__version__, "n": n, "k": k,
           "exact_top_k": top_k, "timing": "wall clock (rehearsal)" if args.rehearse else
           f"CUDA-graph replay, {args.reps} calls per graph, {args.rounds} interleaved rounds, "
           f"{args.copies} weight copies in rotation", "rows": [], "tuning": None}

    # 1. the head, its FP8 copies and the former shipped path's baseline
    w_bf16, hidden = make_inputs(n, k, args.samples, 0, dev)
    w_fp8, scale = api.quantize_fp8_per_row(w_bf16)
    log("inputs ready")
    w_copies = [w_bf16] + [w_bf16.clone() for _ in range(args.copies - 1)]
    plain = [fk.pack_fp8_weight(w_fp8, scale)]
    plain += [dataclasses.replace(plain[0], data=plain[0].data.clone()) for _ in range(args.copies - 1)]
    exact = [dataclasses.replace(p, exact=wb, exact_top_k=top_k) for p, wb in zip(plain, w_copies)]
    del w_fp8
    out_dtype = torch.bfloat16

    def write(table_lines):
        json_path.write_text(json.dumps(doc, indent=1, default=str))
        txt_path.write_text("\n".join(table_lines) + "\n")

    # 2. the tuner, as the plugin runs it (exact re-scoring on), but not from the cache
    cands = [fk.KernelConfig.from_label(c) for c in args.candidates.split(",") if c.strip()] or None
    log("tuning (compiles every candidate, checks it against the default, times it per M)")
    rep = fp8_tune.tune_packed(exact[0], ms=ms, candidates=cands, reps=args.tune_reps, rounds=args.tune_rounds,
                               use_cache=False, min_elements=0, timer=wall_timer if args.rehearse else None,
                               log=log)
    if not exact[0].tuned:
        raise SystemExit(f"tuning did not run: {rep.reason or rep.source}")
    for p in plain + exact:
        p.tuned = dict(exact[0].tuned)
    doc["tuning"] = rep.to_dict()
    lines = [f"# FP8 lm_head kernel vs bf16 F.linear, {gpu} ({sms} SMs), torch {torch.__version__}, "
             f"triton {triton.__version__}", f"# head {n} x {k}, exact top-{top_k} re-scoring; {doc['timing']}",
             f"# kernel config per M: {rep.summary()} (tuning took {rep.seconds:.0f} s)"]
    if rep.rejected:
        lines.append("# rejected by the tuner's check: " + "; ".join(f"{a}: {b}" for a, b in rep.rejected.items()))
    for m in ms:
        ranked = sorted(rep.times_us.get(m, {}).items(), key=lambda kv: kv[1])
        lines.append(f"# tuning M={m}: " + ", ".join(f"{a} {b:.1f}" for a, b in ranked))
    header = ("M | bf16 us | fp8 us | fp8+exact us | x bf16 (exact) | x bf16 (fp8) | limit x | "
              "cand-only us | no-guess us | x bf16 (no guess) | former us | x bf16 (former) | config | "
              "logits = former | top1 vs bf16 | "
              "fp8 err (former err)")
    lines += ["", header]
    write(lines)
    log("tuned: " + rep.summary())

    # 3. the table
    bf16_top1 = torch.cat([F.linear(hidden[i:i + 1], w_bf16).argmax(dim=1) for i in range(args.samples)])
    q_packed, s_packed = fk.unpack_fp8_weight(plain[0])
    w_product = q_packed.double() * s_packed.double()[:, None]  # what the FP8 kernels compute, exactly
    del q_packed
    timer = wall_timer if args.rehearse else fp8_tune.time_graphs
    pack_bytes = plain[0].data.numel() + plain[0].scale.numel() * 4
    for m in ms:
        x = hidden[:m].contiguous()
        cfg = exact[0].config_for(m)

        def cycling(fn):
            it = itertools.cycle(range(args.copies))
            return lambda: fn(next(it))

        fns = {
            "bf16": cycling(lambda i: F.linear(x, w_copies[i])),
            "fp8": cycling(lambda i: api.fp8_linear(x, plain[i], None, out_dtype=out_dtype)),
            "exact": cycling(lambda i: api.fp8_linear(x, exact[i], None, out_dtype=out_dtype)),
            "cand": cycling(lambda i: fk.fp8_linear_packed_default(x, exact[i], out_dtype, rescore=False)),
            "former": cycling(lambda i: fk.fp8_linear_packed(x, exact[i], out_dtype, config=fk.PACKED_DEFAULT)),
            # the same exact path with re-scoring that does not guess its tokens early (speculate=False)
            "no guess": cycling(lambda i: fk.fp8_linear_packed_default(x, exact[i], out_dtype, speculate=False)),
        }
        parts = {}
        if args.rescore_parts and m in (ms[0], ms[-1]):
            parts = {
                "rescore 1 slot x 1 token": cycling(lambda i: fk.fp8_linear_packed_default(
                    x, exact[i], out_dtype, exact_top_k=1, per_slot=1)),
                "rescore 4 slots x 1 token": cycling(lambda i: fk.fp8_linear_packed_default(
                    x, exact[i], out_dtype, per_slot=1)),
                "rescore, 2 warps": cycling(lambda i: fk.fp8_linear_packed_default(
                    x, exact[i], out_dtype, rescore_warps=2)),
                "rescore, 128 slots": cycling(lambda i: fk.fp8_linear_packed_default(
                    x, exact[i], out_dtype, key_slots=128)),
            }
        fns.update(parts)
        per_round = timer(fns, args.reps, args.rounds)
        if parts:
            doc.setdefault("rescore_parts", {})[m] = {name: statistics.median(per_round[name]) for name in parts}
            lines.append(f"# M={m} re-scoring parts (us; fp8 {statistics.median(per_round['fp8']):.1f}, cand-only "
                         f"{statistics.median(per_round['cand']):.1f}, exact {statistics.median(per_round['exact']):.1f}): "
                         + ", ".join(f"{name} {statistics.median(per_round[name]):.1f}" for name in parts))
            for name in parts:
                del fns[name]
        med = {name: statistics.median(v) for name, v in per_round.items()}
        ratio = {name: statistics.median(b / t for b, t in zip(per_round["bf16"], per_round[name]))
                 for name in fns}
        bf16_bytes = n * k * 2 + m * k * 2 + m * n * 2
        fp8_bytes = pack_bytes + m * k * (2 + 2 + 2) + m * n * 2 + m * top_k * 2 * k * 2  # x, fp16 copy, logits, rows
        limit = bf16_bytes / fp8_bytes
        y = api.fp8_linear(x, exact[0], None, out_dtype=out_dtype).float()
        y_former = fk.fp8_linear_packed(x, exact[0], out_dtype, config=fk.PACKED_DEFAULT).float()
        same = float((y - y_former).abs().max())
        # a guess may change the time, never the logits (fp8_gemv_triton._rescore_kernel)
        y_no_guess = fk.fp8_linear_packed_default(x, exact[0], out_dtype, speculate=False).float()
        row_equal_no_guess = bool(torch.equal(y, y_no_guess))
        row = {"m": m, "config": cfg.label(), "us": med, "x_bf16": ratio, "limit_x": limit,
               "bf16_gbs": bf16_bytes / med["bf16"] / 1e3, "fp8_exact_gbs": fp8_bytes / med["exact"] / 1e3,
               "max_abs_diff_vs_former": same, "logits_equal_no_guess": row_equal_no_guess, "argmax_equal_former": bool(torch.equal(y.argmax(1), y_former.argmax(1)))}
        agree = ""
        if m in (ms[0], ms[-1]):
            hits = []
            for start in range(0, args.samples - m + 1, m):
                ye = api.fp8_linear(hidden[start:start + m], exact[0], None, out_dtype=out_dtype)
                hits.append(ye.argmax(1) == bf16_top1[start:start + m])
            hit = torch.cat(hits)
            row["top1_vs_bf16"] = float(hit.float().mean())
            row["top1_samples"] = int(hit.numel())
            agree = f"{row['top1_vs_bf16'] * 100:.2f}% of {hit.numel()}"
            # Without re-scoring, each path's largest logit error against the exact product of its
            # e4m3 weight and the bf16 activations, relative to the largest logit (fp32 outputs).
            want = x.double() @ w_product.T
            for name, y_path in (("fp8", api.fp8_linear(x, plain[0], None, out_dtype=torch.float32)),
                                 ("former", fk.fp8_linear_packed(x, plain[0], torch.float32,
                                                                 config=fk.PACKED_DEFAULT))):
                row[f"{name}_err_vs_product"] = float((y_path.double() - want).abs().max() / want.abs().max())
            agree += f" | {row['fp8_err_vs_product']:.2g} ({row['former_err_vs_product']:.2g})"
        doc["rows"].append(row)
        lines.append(f"{m} | {med['bf16']:.1f} | {med['fp8']:.1f} | {med['exact']:.1f} | {ratio['exact']:.3f}x | "
                     f"{ratio['fp8']:.3f}x | {limit:.3f}x | {med['cand']:.1f} | {med['no guess']:.1f} | "
                     f"{ratio['no guess']:.3f}x | {med['former']:.1f} | "
                     f"{ratio['former']:.3f}x | {cfg.label()} | {'yes' if same == 0 else f'max diff {same:.3g}'} | "
                     f"{agree or '- | -'}")
        write(lines)
        log(lines[-1])
    if not all(r["logits_equal_no_guess"] for r in doc["rows"]):
        lines.append("# LOGITS DIFFER with and without the re-scoring's guess at M = "
                     + ", ".join(str(r["m"]) for r in doc["rows"] if not r["logits_equal_no_guess"]))
    worst = min(doc["rows"], key=lambda r: r["x_bf16"]["exact"])
    lines.append(f"# worst M: {worst['m']} at {worst['x_bf16']['exact']:.3f}x bf16 with exact top-{top_k} "
                 f"(target >= 1.9x; bytes bound {worst['limit_x']:.3f}x)")
    doc["worst"] = {"m": worst["m"], "x_bf16_exact": worst["x_bf16"]["exact"]}
    write(lines)
    print("\n".join(lines))
    log(f"done; {json_path} and {txt_path}")


if __name__ == "__main__":
    main()
