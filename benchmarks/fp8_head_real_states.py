"""FP8 lm_head vs bf16 head on a real trained LM's own hidden states (CPU, minutes at most).

    python benchmarks/fp8_head_real_states.py [--model ~/.cache/sparkit-tests/tiny-ling-s0]
        [--positions 4000] [--json benchmarks/data/tiny_ling_margins.json] [--device cuda] [--exact-top-k 8]

What it measures: tiny-ling (the MoE sparkit trains itself) reads held-out corpus documents
teacher-forced; at every position the final-norm hidden state goes through the bf16 head (the
reference: fp32 product of the bf16 tensors) and through the per-row e4m3 head (sparkit's
fp8_linear), and through the same FP8 head with exact top-k re-scoring from the bf16 weight (what
`lm_head: fp8` does by default). It prints the top-1 agreement of both, the distribution of the bf16 top1-top2 logit margin in
the bands benchmarks/fp8_lm_head.py reports, and the agreement within each band. The JSON it writes
(band fractions) is what `fp8_lm_head.py --margins-from` reweights its per-band agreement with, so
the GPU table can also say what the agreement would be under a real LM's margin distribution.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EDGES = [0.0, 0.1, 0.25, 0.5, 1.0, float("inf")]


def band_label(lo: float, hi: float) -> str:
    return f"[{lo},{hi})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/sparkit-tests/tiny-ling-s0"))
    ap.add_argument("--positions", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=12345, help="corpus seed (training used 0)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--exact-top-k", type=int, default=None,
                    help="also measure the head with exact top-k re-scoring (default: the shipped k)")
    ap.add_argument("--device", default="cpu", help="cuda: run the heads through the Triton kernels")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from sparkit.kernels.fp8_linear import DEFAULT_EXACT_TOP_K, fp8_linear, prepare_fp8_weight, quantize_fp8_per_row
    from sparkit.models import checkpoint
    from sparkit.models.tiny_ling import corpus

    _, model = checkpoint.load_checkpoint(args.model)
    model.eval()
    states = []
    got = 0
    with torch.no_grad():
        for doc in corpus.documents(args.seed):
            ids = corpus.encode_document(doc)[:512]
            if len(ids) < 2:
                continue
            h = model.forward_hidden(torch.tensor([ids]))[0]  # already after the final norm
            states.append(h)
            got += h.shape[0]
            if got >= args.positions:
                break
    hidden = torch.cat(states)[: args.positions].to(torch.bfloat16)
    w = model.lm_head.weight.detach().to(torch.bfloat16)
    ref = hidden.float() @ w.float().T
    exact_k = DEFAULT_EXACT_TOP_K if args.exact_top_k is None else args.exact_top_k
    hidden, w, ref = hidden.to(args.device), w.to(args.device), ref.to(args.device)
    q, s = quantize_fp8_per_row(w)
    packed = prepare_fp8_weight(q, s)  # None on CPU: the torch path
    y = (fp8_linear(hidden, packed, None, out_dtype=torch.float32) if packed is not None
         else fp8_linear(hidden, q, s, out_dtype=torch.float32))
    packed_exact = prepare_fp8_weight(q, s, exact_weight=w, exact_top_k=exact_k)
    y_exact = (fp8_linear(hidden, packed_exact, None, out_dtype=torch.float32) if packed_exact is not None
               else fp8_linear(hidden, q, s, out_dtype=torch.float32, exact_weight=w, exact_top_k=exact_k))
    hit_exact = y_exact.argmax(1) == ref.argmax(1)
    top2 = ref.topk(2, dim=1).values
    margin = top2[:, 0] - top2[:, 1]
    hit = y.argmax(1) == ref.argmax(1)
    n = hidden.shape[0]
    bands = []
    for lo, hi in zip(EDGES[:-1], EDGES[1:]):
        sel = (margin >= lo) & (margin < hi)
        k = int(sel.sum())
        bands.append({"band": band_label(lo, hi), "lo": lo, "hi": hi, "fraction": k / n, "states": k,
                      "agree": float(hit[sel].float().mean()) if k else None})
    rel = float((y - ref).norm() / ref.norm())
    doc = {
        "model": Path(args.model).name, "positions": n, "vocab": w.shape[0], "hidden": w.shape[1],
        "corpus_seed": args.seed, "logit_std": float(ref.std(dim=1).mean()),
        "margin_median": float(margin.median()), "top1_agree": float(hit.float().mean()),
        "rel_err_vs_bf16": rel, "bands": bands, "device": str(hidden.device),
        "kernel": "triton (packed)" if packed is not None else "torch reference",
        "exact_top_k": exact_k, "top1_agree_exact": float(hit_exact.float().mean()),
        "rel_err_vs_bf16_exact": float((y_exact - ref).norm() / ref.norm()),
        "what": "bf16 top1-top2 logit margins of tiny-ling's final-norm hidden states, teacher-forced on "
                "held-out corpus documents; agreement = fp8 per-row head vs bf16 head top-1",
    }
    print(f"tiny-ling real states: {n} positions, vocab {w.shape[0]}, hidden {w.shape[1]}, "
          f"logit std {doc['logit_std']:.2f}, margin median {doc['margin_median']:.2f}")
    print(f"top-1 agreement fp8 head vs bf16 head: {doc['top1_agree'] * 100:.2f}% "
          f"(relative logit error {rel:.2e})")
    print(f"with exact top-{exact_k} re-scoring from the bf16 weight: {doc['top1_agree_exact'] * 100:.2f}% "
          f"({int((~hit_exact).sum())} of {n} differ; relative logit error {doc['rel_err_vs_bf16_exact']:.2e}; "
          f"{doc['kernel']} on {doc['device']})")
    for b in bands:
        agree = "n/a" if b["agree"] is None else f"{b['agree'] * 100:.1f}% agree"
        print(f"  margin {b['band']}: {b['fraction'] * 100:.1f}% of states ({b['states']}), {agree}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
