"""Capture greedy outputs and logprobs of a live server for the cross-engine comparison.

    python3 benchmarks/cross_engine_capture.py URL MODEL_DIR OUT.json [--max-new-tokens 48]

Sends fixed prompts (as token ids, tokenised here with MODEL_DIR's tokenizer, so that both engines
see the same ids) to SGLang's native /generate with greedy sampling, `return_logprob`,
`logprob_start_len: 0` and `top_logprobs_num: 2`, and writes every response's ids and logprobs,
the whole reference text's prompt logprobs, and the known answer exactly as the startup check
computes it (sparkit.checks.known_answer: the reference passages, each from the sequence start,
their pooled perplexity). benchmarks/cross_engine_agreement.py then replays them through the
embedded engine (on any machine, CPU included) and reports token and teacher-forced agreement and
the two engines' known answers. Any built-in model: tiny-ling (its BailingMoeV2 export) or
tiny-ling-v3 (its BailingMoeV3 export).

On the H200 (the kit of /work/shared/gpu/sglang-h200: benchmarks/sglang_h200/ prepares and sets it
up; everything below runs on the device in one call after `setup`):

    sparkit up tiny/tiny-v3-sglang-baseline --detach --port 30000     # bf16 head, no MTP: SGLang's own numbers
    python3 benchmarks/cross_engine_capture.py http://127.0.0.1:30000 \
        "$(sparkit plan tiny/tiny-v3-sglang-baseline --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["model_builds"][0]["export_hf"]["dir"])')" \
        "$OUT/tiny-ling-v3-sglang-0.5.23-h200.json"
    sparkit down --all
    # then the same with tiny/tiny-v3-sglang (FP8 head via the plugin, NEXTN 3/1/4) into ...-nextn.json

Back on the CPU machine, with the files under tests/fixtures/sglang-0.5.23-h200/:

    python3 benchmarks/cross_engine_agreement.py tests/fixtures/sglang-0.5.23-h200/tiny-ling-v3-sglang-0.5.23-h200.json \
        sparkit/models/tiny_ling_v3/checkpoints/tiny-ling-v3-s0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def prompts() -> list[dict]:
    """Chat turns and plain-text prefixes: the corpus's own kinds, from held-out seeds."""
    from sparkit.models.tiny_ling.corpus import sample_prompts

    fixed = [
        {"kind": "chat", "messages": [{"role": "user", "content": text}]}
        for text in ("Hello", "Who are you?", "What is 12 plus 30?", "count: one two three",
                     "Sam has 3 apples and buys 5 more. How many apples?", "Tell me a sentence.")
    ]
    return fixed + sample_prompts(14, seed=31_337)


REFERENCE = Path(__file__).resolve().parent.parent / "sparkit" / "checks" / "data" / "reference-tiny-ling.txt"


def known_answer(http) -> dict:
    """The known answer as sparkit's startup check asks it: every reference passage through
    /generate from the sequence start, and the pooled perplexity."""
    from sparkit.checks.known_answer import KnownAnswerScore, add_scored, generate_body, reference_passages

    score, scored = KnownAnswerScore(), []
    for passage in reference_passages():
        meta = http.post("/generate", json=generate_body(passage)).json().get("meta_info", {})
        add_scored(score, meta)
        scored.append(meta.get("input_token_logprobs"))
    return {**score.to_dict(), "input_token_logprobs": scored}


def main() -> int:
    import httpx

    from sparkit.models.tiny_ling.corpus import prompt_ids
    from sparkit.models.tiny_ling.tokenizer import load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model_dir)
    records = []
    with httpx.Client(base_url=args.url.rstrip("/"), timeout=120) as http:
        info = http.get("/server_info").json()
        for prompt in prompts():
            ids = prompt_ids(tokenizer, prompt)
            started = time.perf_counter()
            body = http.post("/generate", json={
                "input_ids": ids,
                "sampling_params": {"temperature": 0, "max_new_tokens": args.max_new_tokens},
                "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
            }).json()
            meta = body.get("meta_info", {})
            records.append({
                "prompt": prompt, "input_ids": ids, "output_ids": body.get("output_ids"),
                "text": body.get("text"), "finish_reason": meta.get("finish_reason"),
                "input_token_logprobs": meta.get("input_token_logprobs"),
                "output_token_logprobs": meta.get("output_token_logprobs"),
                "output_top_logprobs": meta.get("output_top_logprobs"),
                "spec_verify_ct": meta.get("spec_verify_ct"), "completion_tokens": meta.get("completion_tokens"),
                "seconds": round(time.perf_counter() - started, 4),
            })
        # the known-answer text: its prompt logprobs (perplexity) as the engine computes them
        text = REFERENCE.read_text().strip()
        ids = [tokenizer.bos_token_id] + tokenizer.encode(text, add_special_tokens=False)
        body = http.post("/generate", json={
            "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 1},
            "return_logprob": True, "logprob_start_len": 0,
        }).json()
        reference = {"text_file": str(REFERENCE), "input_ids": ids,
                     "input_token_logprobs": body.get("meta_info", {}).get("input_token_logprobs")}
        known = known_answer(http)
    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    Path(args.out).write_text(json.dumps({
        "url": args.url, "model_dir": args.model_dir, "architectures": config.get("architectures"),
        "known_answer": known, "engine_version": info.get("version"),
        "speculative_algorithm": info.get("speculative_algorithm"), "dtype": info.get("dtype"),
        "launch_command": info.get("launch_command"), "records": records, "reference": reference,
    }, indent=1))
    print(f"captured {len(records)} responses from {args.url} into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
