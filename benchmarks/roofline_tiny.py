"""tiny-ling's acceptance profile (MTP on vs off, interleaved in one run) and its measured decode
speed against the bandwidth roofline, on this machine.

    python3 benchmarks/roofline_tiny.py [--recipe tiny] [--prompts 12] [--depths 32,96]
        [--output-len 32] [--json benchmarks/results/cpu-tiny-ling-roofline.json]

1. measures this CPU's single-thread memory bandwidth (as `sparkit doctor --bandwidth`) into a
   private SPARKIT_HOME, so the roofline below uses it;
2. brings up the recipe with and without its speculative decoding (`sparkit bench profile`: both
   servers up, each prompt to one then the other) over the shipped texts of every kind; prints the
   profile table and a verdict per kind;
3. prints, for MTP on and off, the measured decode speed (1 / mean TPOT over every prompt) next to
   the roofline's limit at the measured accept length and the mean context.

tiny-ling was trained on 128-token windows: the default depths (32, 96) and 32 output tokens keep
every context under 130 tokens. The model fits in a CPU's caches and runs a few hundred small
operators per step, so expect a small fraction of a DRAM-bandwidth bound: the bound is an upper
limit, the profile and the ratio between the two sides are the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--depths", default="32,96")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--kinds", default=None)
    parser.add_argument("--json", default=None, help="write the figures here (the docs table reads them)")
    args = parser.parse_args()
    os.environ["SPARKIT_HOME"] = tempfile.mkdtemp(prefix="sparkit-roofline-bench-")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from sparkit.bench.metrics import mean
    from sparkit.bench.profile import KINDS, ProfileConfig, run_profile
    from sparkit.cli.commands.bench import render_profile
    from sparkit.recipes.load import load_recipe
    from sparkit.roofline.bandwidth import measure_cpu, save_measurement
    from sparkit.roofline.estimate import estimate

    cpu = measure_cpu()
    save_measurement(cpu)
    print(f"CPU bandwidth ({cpu.device_name}, 1 thread): read {cpu.read_gb_s:.1f} GB/s, copy {cpu.copy_gb_s:.1f} GB/s "
          f"({cpu.method})")
    config = ProfileConfig(kinds=args.kinds.split(",") if args.kinds else list(KINDS),
                           depths=[int(d) for d in args.depths.split(",")], prompts_per_cell=args.prompts,
                           output_len=args.output_len, warmup=1)
    doc = run_profile(args.recipe, config, on_progress=None)
    render_profile(doc)

    cells = doc["cells"]
    context = round(mean([c["depth"] + args.output_len / 2 for c in cells]))
    accept = mean([c["accept_length"] for c in cells if c["accept_length"]])
    weights = [c["prompts"] for c in cells]

    def pooled(key: str) -> float:  # 1 / mean TPOT over every prompt = prompt-weighted harmonic mean of cells
        return sum(weights) / sum(w / c[key] for w, c in zip(weights, cells))

    rows = []
    for label, overrides, measured, at in (("MTP off", ["stack.speculative=none"], pooled("tok_s_off"), None),
                                           ("MTP on", [], pooled("tok_s_on"), accept)):
        recipe = load_recipe(args.recipe, overrides).recipe
        roof = estimate(recipe, context=context)
        limit = roof.tok_s(at)
        rows.append({"side": label, "overrides": overrides, "decode_tok_s": measured, "accept_length": at,
                     "context_tokens": context, "step_bytes": roof.step_bytes,
                     "cycle_bytes": roof.spec.cycle_bytes(at) if at and roof.spec else None,
                     "limit_tok_s": limit, "fraction_of_limit": measured / limit if limit else None})
    print(f"\nmeasured against the bandwidth roofline ({cpu.read_gb_s:.1f} GB/s, context {context} tokens):")
    for row in rows:
        at = f" at accept {row['accept_length']:.2f}" if row["accept_length"] else ""
        print(f"  {row['side']:<8} {row['decode_tok_s']:8.1f} tok/s = {row['fraction_of_limit']:.1%} of the "
              f"{row['limit_tok_s']:,.0f} tok/s limit{at} (a step reads {row['cycle_bytes'] or row['step_bytes']:,.0f} bytes)")
    on, off = rows[1], rows[0]
    print(f"  speed-up: measured {on['decode_tok_s'] / off['decode_tok_s'] - 1:+.1%}, "
          f"roofline {on['limit_tok_s'] / off['limit_tok_s'] - 1:+.1%} at accept {accept:.2f}")
    if args.json:
        record = {"command": "python3 benchmarks/roofline_tiny.py " + " ".join(sys.argv[1:]),
                  "bandwidth": {"read_gb_s": cpu.read_gb_s, "copy_gb_s": cpu.copy_gb_s, "device": cpu.device_name,
                                "method": cpu.method, "threads": cpu.threads},
                  "recipe": args.recipe, "rows": rows, "profile": doc}
        Path(args.json).write_text(json.dumps(record, indent=1, default=str) + "\n")
        print(f"\nsaved {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
