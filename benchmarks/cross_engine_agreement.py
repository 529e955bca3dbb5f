"""Agreement of the embedded engine with responses captured from real SGLang on one checkpoint.

    python3 benchmarks/cross_engine_agreement.py CAPTURE.json MODEL_DIR [--json OUT]

CAPTURE.json comes from benchmarks/cross_engine_capture.py (greedy /generate with logprobs);
MODEL_DIR is the same checkpoint (the HF export SGLang served, or the native build it came from:
tiny-ling or tiny-ling-v3). For every captured prompt it reports:
  * free-running token agreement: the embedded engine's own greedy continuation (float32 on the
    CPU, plain decoding) against SGLang's, position by position up to the first divergence;
  * teacher-forced agreement: the embedded model's argmax at every position of SGLang's output,
    given SGLang's previous tokens (one forward over prompt + output);
  * logprob differences: SGLang's logprob of each token it produced against the embedded
    model's, and the same for the prompt tokens (input_token_logprobs).
Where they differ the reasons are numeric, not semantic: SGLang computed in bfloat16 on the GPU
(its attention, MoE and norms kernels round differently) and, with an FP8 lm_head, from e4m3
weights re-scored at the top; the embedded engine here computes in float32 with the bf16 head.
Near-ties (top-2 logprobs closer than --tie) are counted separately. And the known answer: the
perplexity SGLang scored on the reference passages (the startup check's procedure) against the
embedded model's on the same token ids, and their relative gap.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _ids(record: dict) -> list[int]:
    if record.get("output_ids"):
        return list(record["output_ids"])
    return [int(entry[1]) for entry in record.get("output_token_logprobs") or []]


def _known_answers(model, captured: dict | None) -> dict | None:
    """SGLang's pooled perplexity on the reference passages and the embedded model's on the same ids."""
    import torch

    if not captured or not captured.get("input_token_logprobs") or captured.get("perplexity") is None:
        return None
    nll = tokens = 0.0
    with torch.inference_mode():
        for entries in captured["input_token_logprobs"]:
            ids = [int(e[1]) for e in entries]
            logprobs = model.logits(model.forward_hidden(torch.tensor([ids])))[0].float().log_softmax(-1)
            nll -= sum(float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids)))
            tokens += len(ids) - 1
    mine = math.exp(nll / tokens)
    return {"sglang": captured["perplexity"], "embedded": mine, "relative_gap": mine / captured["perplexity"] - 1,
            "tokens": int(tokens), "passages": len(captured["input_token_logprobs"])}


def main() -> int:
    import torch

    from sparkit.models.checkpoint import load_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("capture")
    parser.add_argument("model_dir")
    parser.add_argument("--json", default=None)
    parser.add_argument("--tie", type=float, default=0.05, help="a top-2 logprob gap below this counts as a near-tie")
    args = parser.parse_args()
    torch.set_num_threads(1)
    capture = json.loads(Path(args.capture).read_text())
    _, model = load_checkpoint(args.model_dir)
    eos = model.config.eos_token_id
    rows = []
    with torch.inference_mode():
        for record in capture["records"]:
            prompt, theirs = list(record["input_ids"]), _ids(record)
            if not theirs:
                continue
            # free-running greedy, float32, plain decoding, stopping where SGLang stopped
            seq, mine = list(prompt), []
            for _ in range(len(theirs)):
                logits = model.logits(model.forward_hidden(torch.tensor([seq])))[0, -1]
                token = int(logits.argmax())
                mine.append(token)
                seq.append(token)
                if token == eos:
                    break
            prefix = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
            # teacher-forced over SGLang's own output
            full = torch.tensor([prompt + theirs])
            logprobs = model.logits(model.forward_hidden(full))[0].float().log_softmax(-1)
            positions = range(len(prompt) - 1, len(prompt) + len(theirs) - 1)
            argmax = [int(logprobs[p].argmax()) for p in positions]
            agree = sum(a == b for a, b in zip(argmax, theirs))
            ties = 0
            for p, token in zip(positions, theirs):
                top2 = logprobs[p].topk(2).values
                if float(top2[0] - top2[1]) < args.tie and int(logprobs[p].argmax()) != token:
                    ties += 1
            out_diffs = []
            for p, entry in zip(positions, record.get("output_token_logprobs") or []):
                if entry and entry[0] is not None:
                    out_diffs.append(abs(float(entry[0]) - float(logprobs[p, int(entry[1])])))
            in_diffs = []
            for i, entry in enumerate(record.get("input_token_logprobs") or []):
                if i == 0 or not entry or entry[0] is None:
                    continue  # the first prompt token has no logprob
                in_diffs.append(abs(float(entry[0]) - float(logprobs[i - 1, int(entry[1])])))
            rows.append({
                "prompt": record["prompt"].get("messages", [{}])[0].get("content") if record["prompt"]["kind"] == "chat"
                else record["prompt"]["text"],
                "tokens": len(theirs), "free_running_prefix": prefix,
                "identical": mine == theirs[: len(mine)] and len(mine) == len(theirs),
                "teacher_forced": agree, "teacher_forced_near_ties": ties,
                "max_output_logprob_diff": max(out_diffs, default=0.0),
                "mean_output_logprob_diff": sum(out_diffs) / len(out_diffs) if out_diffs else 0.0,
                "max_input_logprob_diff": max(in_diffs, default=0.0),
            })
    known = _known_answers(model, capture.get("known_answer"))
    total = sum(r["tokens"] for r in rows)
    forced = sum(r["teacher_forced"] for r in rows)
    identical = sum(r["identical"] for r in rows)
    summary = {
        "capture": args.capture, "engine_version": capture.get("engine_version"),
        "speculative_algorithm": capture.get("speculative_algorithm"), "prompts": len(rows),
        "identical_continuations": identical, "tokens": total,
        "teacher_forced_agreement": forced / total if total else math.nan,
        "teacher_forced_disagreements": total - forced,
        "disagreements_at_near_ties": sum(r["teacher_forced_near_ties"] for r in rows),
        "free_running_tokens_before_first_divergence": sum(r["free_running_prefix"] for r in rows),
        "max_output_logprob_diff": max((r["max_output_logprob_diff"] for r in rows), default=0.0),
        "max_input_logprob_diff": max((r["max_input_logprob_diff"] for r in rows), default=0.0),
        "known_answer": known, "rows": rows,
    }
    print(f"{capture.get('engine_version')} ({capture.get('speculative_algorithm')}) vs embedded float32: "
          f"{identical}/{len(rows)} identical greedy continuations; teacher-forced {forced}/{total} "
          f"({summary['teacher_forced_agreement']:.2%}), {summary['disagreements_at_near_ties']} of the "
          f"{total - forced} disagreements at near-ties (< {args.tie} nats); max |logprob diff| output "
          f"{summary['max_output_logprob_diff']:.4f}, prompt {summary['max_input_logprob_diff']:.4f}")
    if known:
        print(f"known answer: SGLang {known['sglang']:.4f}, embedded float32 {known['embedded']:.4f} "
              f"(gap {known['relative_gap']:+.2%}, {known['tokens']} tokens in {known['passages']} passages)")
    for r in rows:
        print(f"  {r['tokens']:3d} tok  prefix {r['free_running_prefix']:3d}  forced {r['teacher_forced']:3d}  "
              f"max|dlp| {r['max_output_logprob_diff']:.4f}  {r['prompt'][:50]!r}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
