"""The memory fit of every shipped recipe, as a table: weights, KV and state, headroom, the range
of mem_fraction_static that fits, and the verdict.

    python3 benchmarks/memory_fit_table.py [--markdown]

The Ling recipes name hub checkpoints that are not on this machine; each is pointed (as
`--set model.path=DIR` would) at a sparse checkpoint with Ling-3.0-flash's headers written by
scripts/make_sparse_ling.py: -fp4 for the Spark recipes, bf16 for the TP4 ones. The memory figure
is this host's where it runs the recipe's target, a nominal GB10 for the Spark recipes elsewhere
(128 GB, 6 GiB assumed in use), and none for GPUs that are not here (the table then gives the
free memory per GPU the recipe needs).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (default: aligned text)")
    args = parser.parse_args()

    from sparkit.host import detect_host
    from sparkit.memory.fit import compute_fit, memory_basis
    from sparkit.memory.units import gib
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import load_recipe, shipped_recipes

    spec = importlib.util.spec_from_file_location("make_sparse_ling", REPO / "scripts" / "make_sparse_ling.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    work = Path(tempfile.mkdtemp(prefix="sparse-ling-"))
    sparse = {"fp4": generator.write_checkpoint(work / "fp4", "fp4"), "bf16": generator.write_checkpoint(work / "bf16", "bf16")}
    host = detect_host()
    rows = []
    for name, _path in shipped_recipes():
        sets = []
        if name.startswith("ling-3.0-flash/"):
            sets = [f"model.path={sparse['fp4' if '/spark-' in name else 'bf16']}"]
        plan = compile_plan(load_recipe(name, sets))
        fit = compute_fit(plan, memory_basis(plan, host))
        f = fit.mem_fraction_static
        fraction_range = (f"[{fit.min_fraction}, {fit.max_fraction}]" if fit.min_fraction is not None else
                          (f"needs {gib(fit.required_available_bytes)} free" + ("/GPU" if plan.engine == "sglang" else "")
                           if fit.required_available_bytes else "-"))
        basis = "-" if fit.basis is None else ("nominal GB10" if not fit.basis.measured else f"this host ({fit.basis.kind})")
        rows.append([name, "sparse " + ("fp4" if "/spark-" in name else "bf16") if sets else "as shipped", basis,
                     gib(fit.weights_bytes), gib(fit.kv_bytes), gib(fit.headroom_bytes),
                     "unset" if f is None else str(f), fraction_range, fit.verdict])
    header = ["recipe", "checkpoint", "memory", "weights", "KV+state", "headroom", "mem_frac", "fits for", "verdict"]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    print(f"\nheadroom = runtime (SGLang's activation + CUDA-graph estimate) + the engine's own start + the OS floor "
          f"on unified memory; host {host.os}, {gib(host.ram_available_bytes)} available")


if __name__ == "__main__":
    main()
