"""Decode speed of tiny-ling on the embedded engine, with and without NEXTN MTP.

Same prompts (from the tiny corpus), greedy, ignore_eos, fixed output length; the two engines
run interleaved (A B, then B A, ...) in one process so that machine load hits both alike.
Decode tok/s counts the tokens after the first one over the time after the first one (prefill
excluded). Prints the accept length, both tok/s and the ratio, and the load average.

    python benchmarks/embedded_mtp_decode.py [--model-path DIR] [--num-steps 3] [--repeats 3] [--breakdown] [--json]

Defaults follow recipes/tiny/tiny.yaml: fp8 experts, fp8 lm_head, NEXTN 3/1/4.

Shapes tried for MTP to pay (2026-11-29; each trained 90 s with builder.build_model, width 128,
4 heads; E experts top-k of width I, shared expert width S). Side by side, alternating runs of
this script (--repeats 2, load 0.3-0.7), tok/s plain / MTP (ratio), two rounds:
    L4 E8 k2 I192 S192 (default)  accept 3.46   1002 / 1109 (1.11)    888 / 1058 (1.19)
    L4 E4 k1 I64  S64             accept 3.25   1118 / 1297 (1.16)   1203 / 1368 (1.14)
    L6 E4 k1 I64  S64             accept 3.26    744 /  969 (1.30)    847 / 1059 (1.25)
    L8 E4 k1 I64  S64             accept 3.27    613 /  889 (1.45)    734 / 1017 (1.39)
Deeper models reach 1.3-1.5x only by making plain decoding slower than MTP gains (verify /
decode forward stays ~1.6 even with 4 narrow top-1 experts: a step costs the weight bytes and
ops of attention + the experts touched; the NextN round overhead is ~1.4 plain steps at L4), so
the default shape was kept. Table with training steps: see the engineer's report (issue 3).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def decode_run(engine, ids, params):
    started = time.perf_counter()
    first_at = None
    tokens = 0
    verify_steps = verify_tokens = 0
    for step in engine.generate(ids, params, lambda: False):
        if first_at is None and step.token_ids:
            first_at = time.perf_counter()
            tokens_at_first = tokens + len(step.token_ids)
        tokens += len(step.token_ids)
        if step.verify_step:
            verify_steps += 1
            verify_tokens += len(step.token_ids)
    ended = time.perf_counter()
    return {"tokens": tokens, "decode_tokens": tokens - tokens_at_first, "decode_s": ended - first_at, "e2e_s": ended - started,
            "verify_steps": verify_steps, "verify_tokens": verify_tokens}


class CallTimes:
    """Wall time of the model calls an engine makes while it generates (wrapped in place): what a
    step really costs inside the decode loop, where the weights of the target, the draft and the
    head evict each other from cache (isolated timings of one call in a loop are lower)."""

    def __init__(self, engine):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._wrap(engine.model, "forward_hidden", lambda ids, *a, **k: "target_forward" if ids.shape[1] <= 16 else "prefill")
        self._wrap(engine.model, "logits", lambda hidden: "target_lm_head")
        if engine.draft is not None:
            self._wrap(engine.draft, "forward_hidden",
                       lambda h, ids, *a, **k: "prefill" if ids.shape[1] > 16 else ("nextn_extend" if k.get("last_only") else "nextn_step"))
            self._wrap(engine.draft, "logits", lambda hidden: "draft_lm_head")

    def _wrap(self, obj, name, key) -> None:
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            out = inner(*args, **kwargs)
            k = key(*args, **kwargs)
            self.seconds[k] = self.seconds.get(k, 0.0) + time.perf_counter() - started
            self.calls[k] = self.calls.get(k, 0) + 1
            return out

        setattr(obj, name, timed)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def per_unit(self, units: int, decode_seconds: float) -> dict:
        """Mean microseconds per unit (a plain decode step or a speculative round), by part."""
        out = {k: round(v / units * 1e6) for k, v in sorted(self.seconds.items()) if k != "prefill"}
        out["engine_other"] = round((decode_seconds - sum(v for k, v in self.seconds.items() if k != "prefill")) / units * 1e6)
        out["total"] = round(decode_seconds / units * 1e6)
        return out


def breakdown(engine, k: int, calls: int = 200) -> dict:
    """Best-of-5 mean time (us) of each piece of a decode step / speculative round."""
    import torch

    model, draft = engine.model, engine.draft
    cache, dcache = engine._target_cache, engine._draft_cache
    h1 = torch.randn(1, 1, model.config.hidden_size)
    hk = torch.randn(1, k, model.config.hidden_size)
    ids1 = torch.tensor([[65]])
    ids_verify = torch.tensor([[65 + i for i in range(k + 1)]])
    ids_k = ids_verify[:, :k]

    def timed(fn) -> int:
        for _ in range(10):
            fn()
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - started) / calls)
        return round(best * 1e6)

    with torch.inference_mode():
        out = {
            "target_1": timed(lambda: model.forward_hidden(ids1, cache, 64)),
            "target_verify": timed(lambda: model.forward_hidden(ids_verify, cache, 64)),
            "nextn_1": timed(lambda: draft.forward_hidden(h1, ids1, dcache, 64)),
            "nextn_extend": timed(lambda: draft.forward_hidden(hk, ids_k, dcache, 64, last_only=True)),
            "lm_head": timed(lambda: model.logits(h1)),
        }
    cache.length = dcache.length = 0
    out["plain_step"] = out["target_1"] + out["lm_head"]
    # one round: verify + its logits, extend (gives draft 1) + k-1 chained steps, k draft logits
    out["round"] = out["target_verify"] + out["lm_head"] + out["nextn_extend"] + (k - 1) * out["nextn_1"] + k * out["lm_head"]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", help="tiny-ling checkpoint (default: build/reuse the cached one)")
    parser.add_argument("--num-steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--expert-weights", default="fp8", choices=["fp32", "bf16", "fp8", "mxfp4"])
    parser.add_argument("--lm-head-dtype", default="fp8", choices=["fp32", "bf16", "fp8"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: the machine is shared)")
    parser.add_argument("--breakdown", action="store_true", help="also time the pieces of a step (target forward of 1 and k+1 tokens, NextN step, lm_head)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from sparkit.engines.embedded.api import SamplingParams
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig
    from sparkit.models.builder import ensure_model
    from sparkit.models.tiny_ling.corpus import prompt_ids, sample_prompts

    path = args.model_path or str(ensure_model(progress=lambda f, m: print(f"[build {f:.0%}] {m}", file=sys.stderr)))
    common = dict(model_path=path, expert_weights=args.expert_weights, lm_head_dtype=args.lm_head_dtype, device="cpu")
    engines = {
        "plain": EmbeddedEngine(EngineConfig(**common)),
        "mtp": EmbeddedEngine(EngineConfig(**common, speculative_algorithm="NEXTN", speculative_num_steps=args.num_steps)),
    }
    tokenizer = engines["plain"].tokenizer
    prompts = [prompt_ids(tokenizer, p) for p in sample_prompts(args.prompts, seed=2024)]
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens, ignore_eos=True)
    load_before = os.getloadavg()
    # warm-up (first-call allocations, lazy imports)
    for engine in engines.values():
        decode_run(engine, prompts[0], SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True))

    timers = {name: CallTimes(engine) for name, engine in engines.items()} if args.breakdown else {}
    for timer in timers.values():
        timer.reset()
    results = {name: [] for name in engines}
    order = list(engines)
    for repeat in range(args.repeats):
        for i, ids in enumerate(prompts):
            for name in order if (repeat + i) % 2 == 0 else order[::-1]:
                results[name].append(decode_run(engines[name], ids, params))
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)
    load_after = os.getloadavg()

    def summary(runs):
        tok_s = sum(r["decode_tokens"] for r in runs) / sum(r["decode_s"] for r in runs)
        per_run = [r["decode_tokens"] / r["decode_s"] for r in runs]
        out = {"decode_tok_s": round(tok_s, 1), "per_run_median_tok_s": round(statistics.median(per_run), 1), "runs": len(runs)}
        if any(r["verify_steps"] for r in runs):
            out["accept_length"] = round(sum(r["verify_tokens"] for r in runs) / sum(r["verify_steps"] for r in runs), 3)
        return out

    report = {
        "model_path": path,
        "num_steps": args.num_steps,
        "expert_weights": args.expert_weights,
        "lm_head_dtype": args.lm_head_dtype,
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "plain": summary(results["plain"]),
        "mtp": summary(results["mtp"]),
    }
    report["speedup"] = round(report["mtp"]["decode_tok_s"] / report["plain"]["decode_tok_s"], 3)
    if args.breakdown:
        # in the decode loop: per plain step (after the first token) and per speculative round
        plain_runs, mtp_runs = results["plain"], results["mtp"]
        plain_steps = sum(r["decode_tokens"] for r in plain_runs)
        rounds = sum(r["verify_steps"] for r in mtp_runs)
        in_loop = {
            "plain_step": timers["plain"].per_unit(plain_steps, sum(r["decode_s"] for r in plain_runs)),
            "mtp_round": timers["mtp"].per_unit(rounds, sum(r["decode_s"] for r in mtp_runs)),
        }
        accept = report["mtp"]["accept_length"]
        in_loop["round_over_plain_step"] = round(in_loop["mtp_round"]["total"] / in_loop["plain_step"]["total"], 2)
        in_loop["predicted_ratio"] = round(accept / in_loop["round_over_plain_step"], 3)
        in_loop["verify_over_decode_forward"] = round(in_loop["mtp_round"]["target_forward"] / in_loop["plain_step"]["target_forward"], 2)
        report["in_loop_us"] = in_loop
        report["breakdown_us"] = breakdown(engines["mtp"], args.num_steps)
        b = report["breakdown_us"]
        b["breakeven_accept_length"] = round(b["round"] / b["plain_step"], 2)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"tiny-ling decode on CPU ({args.threads} thread(s), {os.cpu_count()} cores, load {load_before[0]:.1f} -> {load_after[0]:.1f}); "
              f"experts {args.expert_weights}, lm_head {args.lm_head_dtype}; {args.prompts} prompts x {args.repeats}, {args.max_new_tokens} tokens")
        print(f"  plain         : {report['plain']['decode_tok_s']:8.1f} tok/s")
        print(f"  NEXTN {args.num_steps}/1/{args.num_steps + 1}  : {report['mtp']['decode_tok_s']:8.1f} tok/s   accept length {report['mtp']['accept_length']:.2f}")
        print(f"  ratio         : {report['speedup']:.2f}x")
        if args.breakdown:
            b = report["breakdown_us"]
            print(f"  per call (us) : target 1 tok {b['target_1']}, target {args.num_steps + 1} tok {b['target_verify']}, "
                  f"NextN step {b['nextn_1']}, NextN extend {b['nextn_extend']}, lm_head {b['lm_head']}")
            print(f"  plain step {b['plain_step']} us, speculative round {b['round']} us: "
                  f"break-even accept length {b['breakeven_accept_length']}  (isolated calls, warm cache)")
            loop = report["in_loop_us"]
            ps, mr = loop["plain_step"], loop["mtp_round"]
            print(f"  in the decode loop, per plain step (us): target forward {ps['target_forward']}, lm_head {ps['target_lm_head']}, "
                  f"engine/other {ps['engine_other']} = {ps['total']}")
            print(f"  in the decode loop, per MTP round (us): verify forward {mr['target_forward']}, its lm_head {mr['target_lm_head']}, "
                  f"NextN extend {mr.get('nextn_extend', 0)}, NextN steps {mr.get('nextn_step', 0)}, draft lm_head {mr.get('draft_lm_head', 0)}, "
                  f"engine/other {mr['engine_other']} = {mr['total']}")
            print(f"  round / plain step = {loop['round_over_plain_step']} (verify forward / decode forward = {loop['verify_over_decode_forward']}); "
                  f"accept length / that = predicted ratio {loop['predicted_ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
