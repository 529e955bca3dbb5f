"""Batch-1 decode of several live servers in one run, interleaved request by request
(sparkit.bench.runner.run_interleaved), side by side with ratios against the first.

    python3 benchmarks/decode_interleaved.py LABEL=URL LABEL=URL ... [--input-len 256] [--output-len 256]
        [--num-prompts 8] [--repeats 2] [--json OUT]

The servers are up at the same time and get the same prompts in rotating order, so a drift of the
machine's load falls on all of them alike (docs/protocols.md, "Timing on a shared machine"). Printed per
server: mean and median TPOT, decode tok/s (1 / median TPOT), output throughput over the server's
own request time, mean accept length (completion tokens / verify steps per request) and the
step-time estimate (mean TPOT x accept length), then each figure's ratio to the first server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    from sparkit.bench.runner import BenchConfig, BenchTarget, run_interleaved

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("servers", nargs="+", help="LABEL=URL")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dataset", default="random")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    labels, targets = [], []
    for item in args.servers:
        label, _, url = item.partition("=")
        if not url:
            parser.error(f"{item!r} is not LABEL=URL")
        labels.append(label)
        targets.append(BenchTarget(url=url))
    config = BenchConfig(input_len=args.input_len, output_len=args.output_len, num_prompts=args.num_prompts,
                         repeats=args.repeats, dataset=args.dataset, warmup=1)
    docs = asyncio.run(run_interleaved(targets, config))
    rows = []
    for label, doc in zip(labels, docs):
        fig = doc["summary"]["figures"]
        tpot_median = fig.get("tpot_median_ms")
        rows.append({
            "label": label, "url": doc["server"]["url"],
            "tpot_mean_ms": fig.get("tpot_mean_ms"), "tpot_median_ms": tpot_median,
            "decode_tok_s": 1000.0 / tpot_median if tpot_median else None,
            "output_throughput_tok_s": fig.get("output_throughput_tok_s"),
            "accept_length_mean": fig.get("accept_length_mean"),
            "server_accept_length": fig.get("server_accept_length"),
            "step_time_estimate_ms": fig.get("step_time_estimate_ms"),
            "ttft_median_ms": fig.get("ttft_median_ms"),
        })
    base = rows[0]
    print(f"interleaved batch-1 decode: {args.num_prompts} prompts x {args.repeats} repeats, "
          f"{args.input_len} in / {args.output_len} out, greedy, ignore_eos, dataset {args.dataset}")
    print(f"{'server':<22} {'TPOT mean ms':>12} {'median':>8} {'decode tok/s':>12} {'x first':>8} "
          f"{'out tok/s':>9} {'accept':>7} {'step est ms':>11} {'TTFT ms':>8}")

    def f(value, digits=2):
        return f"{value:.{digits}f}" if isinstance(value, (int, float)) and value == value else "-"

    for row in rows:
        ratio = row["decode_tok_s"] / base["decode_tok_s"] if row["decode_tok_s"] and base["decode_tok_s"] else None
        row["decode_ratio_to_first"] = ratio
        print(f"{row['label']:<22} {f(row['tpot_mean_ms'], 3):>12} {f(row['tpot_median_ms'], 3):>8} "
              f"{f(row['decode_tok_s'], 1):>12} {f(ratio, 3):>8} {f(row['output_throughput_tok_s'], 1):>9} "
              f"{f(row['accept_length_mean']):>7} {f(row['step_time_estimate_ms'], 3):>11} {f(row['ttft_median_ms'], 1):>8}")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": vars(args), "rows": rows, "docs": docs}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
