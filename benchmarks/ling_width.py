"""Ling-3.0-flash at its own widths on real SGLang (issue 25): the memory fit against SGLang's own
log, decode against the bandwidth roofline at two layer counts, and the decode step explained.

    python3 benchmarks/ling_width.py --out DIR --tokenizer-from TOKDIR [--phases base,l12]
        [--budget-s 450] [--rehearse]

No Ling weights exist here: every model is a Ling-width config (sparkit's one declaration,
sparkit/roofline/profiles.py, at 6 or 12 layers: the first two dense, every 6th MLA, so 12 - 6
layers are one more of Ling's 6-layer groups, 1 MLA + 5 KDA + 6 MoE, exactly what 42 layers have
six of) with sparse safetensors headers (scripts/make_sparse_ling.py), served by SGLang with
`--load-format dummy` (random weights: a NEXTN draft accepts ~1 token, said in the results).
Phases (each skipped when what is left of --budget-s cannot hold it; the summary says which):

  base  6 layers, bf16 experts: A fp8 head plain (started first: its state pool is sized by SGLang
        itself from mem_fraction_static 0.25), then, once A's pools are allocated (its log's "Memory
        pool end"), B bf16 head plain and C fp8 head + NEXTN 3/1/4 together, with explicit pools
        (--max-mamba-cache-size 64, --max-total-tokens 16384, mem_fraction_static 0.85): sparkit's
        launch lock and reservations judge each against what A and the other will take. The cold
        Triton compiles of the three overlap. Decode interleaved request by request (A B C), then
        SGLang's /start_profile on A and B (and C's verify steps, time permitting): the step
        breakdown, FP8 head against bf16 head.
  l12   12 layers, bf16 experts, mem_fraction_static 0.9: E fp8 head, then (once E's pools are
        allocated) F bf16 head, plain, and G (bf16 head + NEXTN, 65 GiB more) launched while F starts
        and E warms up: the preflight must refuse it (exit 4). Decode interleaved E F.
  extra (not in the default: a second call, STEPS=setup,ling LING_PHASES=extra) D bf16 head + NEXTN
        at 6 layers, and FP8 block-128 experts (the -fp8 layout, quantization_config fp8) with the
        fp8 head, plain, at 6 (H) and 12 (I) layers: does SGLang serve a dummy FP8 checkpoint; its
        fit and decode beside the bf16 experts'.

Then, per variant: decode tok/s (1 / median TPOT) beside the roofline's bound at the measured
bandwidth (`sparkit doctor --bandwidth`, run first) and the fraction reached; a line through the
6- and 12-layer step times (per-layer and fixed cost) extrapolated to 42 layers, at the H200's
bandwidth and at GB10's 273 GB/s, against the Spark study's fractions of the bound
(docs/roofline.md). And per server, the memory fit's prediction (its run's memory-fit.json,
written by preflight) against SGLang's own log lines, and the formula replayed from the free
memory SGLang logged. Everything is written to DIR as it is measured (results.json, summary.txt,
the per-variant files); nothing is left running at the end.

--rehearse runs the same control flow on a machine without a GPU: the embedded engine's tiny
recipe stands in for every variant (with the variant's lm_head and speculative settings); the
figures are the CPU's and mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LING_LAYERS = 42
GB10_GB_S = 273.0
INPUT_LEN, OUTPUT_LEN = 256, 256


@dataclass
class Variant:
    name: str
    phase: str
    layers: int
    experts: str  # bf16 | fp8
    head: str  # fp8 | bf16
    speculative: bool
    fraction: float
    auto_pools: bool = False  # SGLang sizes the state pool itself (only for a server started alone)
    expect_refusal: bool = False  # the preflight must refuse it (exit 4)

    @property
    def label(self) -> str:
        spec = "nextn" if self.speculative else "plain"
        return f"L{self.layers}-{self.experts}x-{self.head}head-{spec}"


VARIANTS = [
    Variant("A", "base", 6, "bf16", "fp8", False, 0.25, auto_pools=True),
    Variant("B", "base", 6, "bf16", "bf16", False, 0.85),
    Variant("C", "base", 6, "bf16", "fp8", True, 0.85),
    Variant("D", "extra", 6, "bf16", "bf16", True, 0.85),
    Variant("E", "l12", 12, "bf16", "fp8", False, 0.9),
    Variant("F", "l12", 12, "bf16", "bf16", False, 0.9),
    Variant("G", "l12", 12, "bf16", "bf16", True, 0.9, expect_refusal=True),
    Variant("H", "extra", 6, "fp8", "fp8", False, 0.85),
    Variant("I", "extra", 12, "fp8", "fp8", False, 0.85),
]
# Seconds each phase needs on the H200 (cold Triton compiles in the first: ~2-3 min, CEO's run and
# ../shared/gpu/sglang-h200/README.md; warm starts ~90 s), decode and profile included.
PHASE_COST_S = {"base": 240, "l12": 110, "extra": 150}


class Session:
    """The output directory: results.json rewritten after every step, summary.txt appended."""

    def __init__(self, out: Path, budget_s: float):
        self.out = out
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.results: dict[str, Any] = {"issue": 25, "variants": {}, "phases": {}, "notes": []}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def say(self, line: str) -> None:
        stamped = f"[+{time.monotonic() - self.t0:5.0f}s] {line}"
        print(stamped, flush=True)
        with open(self.out / "summary.txt", "a") as handle:
            handle.write(stamped + "\n")

    def save(self) -> None:
        tmp = self.out / ".results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(self.out / "results.json")


# ------------------------------------------------------------------------------ models and recipes

def make_models(session: Session, models: Path, tokenizer_from: Path | None, rehearse: bool) -> dict[str, Path]:
    """The Ling-width checkpoints (sparse headers, config from the declaration), one per (layers, experts)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_sparse_ling", REPO / "scripts" / "make_sparse_ling.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    made = {}
    for layers, experts in sorted({(v.layers, v.experts) for v in VARIANTS}):
        directory = models / f"ling-{experts}-L{layers}"
        generator.write_checkpoint(directory, experts, layers=layers, tokenizer_from=tokenizer_from)
        made[f"{experts}-L{layers}"] = directory
        info = generator.summary(experts, layers, True)
        session.say(f"model {directory}: {info['layout']}, {layers} layers + NextN, {info['bytes'] / 2**30:.2f} GiB "
                    "of headers over holes")
    # the config-only form of one (what --load-format dummy serves without headers): the fit says so
    config_only = models / "ling-bf16-L6-config-only"
    generator.write_checkpoint(config_only, "bf16", layers=6, headers=False, tokenizer_from=tokenizer_from)
    made["config-only"] = config_only
    return made


def recipe_text(v: Variant, model: Path, rehearse: bool) -> str:
    spec = ("{method: nextn, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}" if v.speculative else "none")
    if rehearse:  # the embedded engine's tiny-ling stands in
        return (f"description: rehearsal stand-in for {v.label}\nextends: tiny\n"
                f"stack:\n  lm_head: {v.head}\n  speculative: {spec}\n"
                "checks:\n  min_accept_length: 1.0\n")
    pools = [] if v.auto_pools else ["--max-mamba-cache-size", "64"]
    extra = ["--load-format", "dummy", "--max-total-tokens", "16384", "--chunked-prefill-size", "2048", *pools]
    return "\n".join([
        f"description: Ling-3.0-flash widths, {v.layers} layers, {v.experts} experts (dummy weights), {v.head} head, "
        f"{'NEXTN 3/1/4' if v.speculative else 'no MTP'} (benchmarks/ling_width.py, issue 25)",
        "extends: tiny/tiny-sglang",
        "model:",
        f"  path: {model}",
        f"  served_name: ling-width-{v.name}",
        "  trust_remote_code: true",
        "  context_length: 8192",
        "stack:",
        f"  weights: {v.experts}",
        f"  lm_head: {v.head}",
        f"  speculative: {spec}",
        "checks:",
        "  reference_perplexity: null",
        "  min_accept_length: 1.0",
        "server:",
        f"  mem_fraction_static: {v.fraction}",
        "  cuda_graph:",
        "    max_bs_decode: 4",
        "    prefill: false",
        f"  extra_args: {json.dumps(extra)}",
        "",
    ])


# ------------------------------------------------------------------------------ servers

def sk(*args: str) -> list[str]:
    return [sys.executable, "-m", "sparkit.cli.main", *args]


def start(session: Session, v: Variant, recipe: Path, timeout_s: float) -> subprocess.Popen:
    up_dir = session.out / "up"
    up_dir.mkdir(exist_ok=True)
    argv = sk("up", str(recipe), "--port", "auto", "--detach", "--timeout", str(int(timeout_s)), "--json",
              "--keep-on-fail")
    session.say(f"{v.name} {v.label}: sparkit up {recipe.name} (mem_fraction_static {v.fraction}"
                f"{', SGLang sizes the state pool' if v.auto_pools else ', pools sized explicitly'})")
    return subprocess.Popen(argv, stdout=open(up_dir / f"{v.name}.json", "w"), stderr=open(up_dir / f"{v.name}.err", "w"),
                            cwd=REPO)


def finish(session: Session, v: Variant, proc: subprocess.Popen, timeout_s: float) -> dict[str, Any]:
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        rc = proc.wait(timeout=30)
    up_dir = session.out / "up"
    try:
        doc = json.loads((up_dir / f"{v.name}.json").read_text() or "{}")
    except ValueError:
        doc = {}
    err = (up_dir / f"{v.name}.err").read_text(errors="replace").strip().splitlines()
    record = {"rc": rc, "url": doc.get("url"), "run": doc.get("run"), "error_tail": err[-6:] if rc not in (0, 6) else []}
    if rc == 4:
        record["preflight"] = [line for line in err if "memory" in line.lower()][-6:]
    entry = session.results["variants"].setdefault(v.name, {"label": v.label, **asdict(v)})
    entry["up"] = record
    verdict = {0: "up, checks pass", 6: "up, a startup check failed (kept: --keep-on-fail)", 4: "refused by preflight",
               5: "launch failed"}.get(rc, f"exit {rc}")
    if v.expect_refusal:
        verdict += " (expected: refused)" if rc == 4 else " (NOT the expected refusal)"
    session.say(f"{v.name} {v.label}: {verdict}" + (f" at {record['url']}" if record["url"] else "")
                + (f"; {err[-1][:200]}" if rc not in (0, 6) and err else ""))
    session.save()
    return record


def run_dir(run_id: str | None) -> Path | None:
    if not run_id:
        return None
    from sparkit.paths import runs_dir

    return runs_dir() / run_id


def down_all(session: Session) -> None:
    subprocess.run(sk("down", "--all", "--json"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
                   cwd=REPO)
    session.say("down --all")


# ------------------------------------------------------------------------------ measurements

def bandwidth(session: Session, rehearse: bool) -> dict[str, Any]:
    done = subprocess.run(sk("doctor", "--bandwidth", "--json"), capture_output=True, text=True, timeout=180, cwd=REPO)
    try:
        doc = json.loads(done.stdout)
        measured = doc["bandwidth"]["measured_now"] or []
    except (ValueError, KeyError, TypeError):
        measured = []
    gpu = [m for m in measured if str(m.get("device", "")).startswith("cuda")]
    pick = (gpu or measured or [None])[0]
    figure = {"read_gb_s": pick["read_gb_s"], "copy_gb_s": pick["copy_gb_s"], "device": pick["device"]} if pick else None
    session.results["bandwidth"] = figure
    session.say(f"bandwidth: {figure['read_gb_s']:.0f} GB/s read on {figure['device']}" if figure
                else f"bandwidth: not measured (rc {done.returncode}: {done.stderr.strip()[-200:]})")
    session.save()
    return figure or {}


def decode(session: Session, names: list[str], phase: str) -> list[dict[str, Any]]:
    from sparkit.bench.runner import BenchConfig, BenchTarget, run_interleaved

    live = [(n, session.results["variants"][n]["up"]["url"]) for n in names
            if session.results["variants"].get(n, {}).get("up", {}).get("url")]
    if not live:
        session.say(f"{phase}: no server up to decode")
        return []
    config = BenchConfig(input_len=INPUT_LEN, output_len=OUTPUT_LEN, num_prompts=3, repeats=2, warmup=1)
    session.say(f"{phase}: interleaved decode over {' '.join(n for n, _ in live)} ({config.num_prompts} prompts x "
                f"{config.repeats} repeats, {INPUT_LEN} in / {OUTPUT_LEN} out, greedy)")
    docs = asyncio.run(run_interleaved([BenchTarget(url=u) for _, u in live], config))
    rows = []
    for (name, url), doc in zip(live, docs):
        fig = doc["summary"]["figures"]
        tpot = fig.get("tpot_median_ms")
        row = {"name": name, "url": url, "tpot_median_ms": tpot, "tpot_mean_ms": fig.get("tpot_mean_ms"),
               "decode_tok_s": 1000.0 / tpot if tpot else None, "accept_length": fig.get("accept_length_mean"),
               "ttft_median_ms": fig.get("ttft_median_ms"),
               "tpot_per_request_ms": [r.get("tpot_ms") for rep in doc.get("repeats", []) for r in rep.get("requests", [])
                                       if r.get("tpot_ms")]}
        session.results["variants"][name]["decode"] = row
        rows.append(row)
        accept = f", accept {row['accept_length']:.2f}" if row["accept_length"] else ""
        session.say(f"  {name} {session.results['variants'][name]['label']}: {row['decode_tok_s']:.1f} tok/s "
                    f"(median TPOT {tpot:.3f} ms{accept})" if tpot else f"  {name}: no figure")
    (session.out / f"decode-{phase}.json").write_text(json.dumps({"rows": rows, "docs": docs}, indent=1, default=str))
    session.save()
    return rows


def profile(session: Session, name: str, stage: str) -> dict[str, Any] | None:
    from sparkit.bench.steps import StepsConfig, profile_steps
    from sparkit.bench.trace import table

    url = session.results["variants"].get(name, {}).get("up", {}).get("url")
    if not url:
        return None
    config = StepsConfig(num_steps=40, input_len=128, stage=stage, keep_trace=session.out / "traces", wait_s=90)
    try:
        breakdown, done = asyncio.run(profile_steps(url, config))
    except Exception as exc:  # noqa: BLE001 - a profile that fails is recorded, the session goes on
        session.say(f"profile {name}: failed ({type(exc).__name__}: {str(exc)[:200]})")
        session.results["variants"][name]["profile_error"] = str(exc)
        session.save()
        return None
    session.results["variants"][name]["profile"] = {"breakdown": breakdown.to_dict(), "done": done}
    lines = table(breakdown)
    (session.out / f"steps-{name}.txt").write_text("\n".join(lines) + "\n")
    session.say(f"profile {name} {session.results['variants'][name]['label']} ({stage}):")
    for line in lines[:16]:
        session.say("  " + line)
    session.save()
    return breakdown.to_dict()


def compare_profiles(session: Session, a: str, b: str) -> None:
    from sparkit.bench.trace import StepBreakdown, compare

    pa = session.results["variants"].get(a, {}).get("profile")
    pb = session.results["variants"].get(b, {}).get("profile")
    if not pa or not pb:
        return
    rows = compare(StepBreakdown(**pa["breakdown"]), StepBreakdown(**pb["breakdown"]))
    session.results["profile_comparison"] = {"a": a, "b": b, "rows": rows}
    session.say(f"step breakdown, {a} ({session.results['variants'][a]['label']}) vs {b} "
                f"({session.results['variants'][b]['label']}), us per step:")
    for r in rows:
        session.say(f"  {r['label']:<32} {r['a_us']:>9.1f} {r['b_us']:>9.1f}  {r['delta_us']:+9.1f}")
    session.save()


def memory_check(session: Session, name: str) -> None:
    """The fit preflight recorded (memory-fit.json) against SGLang's own log, and the formula replayed
    from the memory SGLang logged."""
    from sparkit.engines.sglang.log import parse_memory
    from sparkit.memory.sglang_pool import GIB, PoolInputs, size_pools

    entry = session.results["variants"].get(name, {})
    directory = run_dir(entry.get("up", {}).get("run"))
    if directory is None or not directory.is_dir():
        return
    fit = json.loads((directory / "memory-fit.json").read_text()) if (directory / "memory-fit.json").exists() else {}
    log = (directory / "server.log").read_text(errors="replace") if (directory / "server.log").exists() else ""
    logged = parse_memory(log)
    pools = fit.get("pools") or {}
    # "Load weight end ... mem usage" counts what the loader allocated: not the FP8 head copy the
    # plugin adds after it (it is in the memory the pools are sized from)
    loaded = sum(t["bytes"] for t in fit.get("terms", []) if t["group"] == "weights"
                 and not t["name"].startswith(("FP8 lm_head copy", "bf16 lm_head freed")))
    check: dict[str, Any] = {"predicted": pools.get("predicted"), "inputs": pools.get("inputs"),
                             "predicted_weights_gb": round(loaded / GIB, 2) if fit else None,
                             "predicted_weights_with_fp8_head_gb": round(fit.get("weights_bytes", 0) / GIB, 2) if fit else None,
                             "logged": logged.to_dict(), "verdict": fit.get("verdict"), "summary": fit.get("summary")}
    if logged.pre_model_load_gb is not None and logged.available_after_weights_gb is not None and pools.get("inputs"):
        model = {k: v for k, v in pools["inputs"].items()
                 if k not in ("pre_model_load_gb", "available_after_weights_gb", "mem_fraction_static")}
        replay = size_pools(PoolInputs(pre_model_load_bytes=logged.pre_model_load_gb * GIB,
                                       available_bytes=logged.available_after_weights_gb * GIB,
                                       mem_fraction_static=pools["inputs"]["mem_fraction_static"], **model))
        check["replayed_from_logged_memory"] = replay.log_figures()
    entry["memory"] = check
    p = check.get("predicted") or {}
    lg = logged
    session.say(f"memory {name}: weights predicted {check['predicted_weights_gb']} GiB vs logged {lg.weights_gb} GiB "
                f"(`Load weight end ... mem usage`); P predicted {(check.get('inputs') or {}).get('pre_model_load_gb')} vs "
                f"logged {lg.pre_model_load_gb} (`Load weight begin. avail mem`)")
    if lg.mamba or p.get("max_mamba_cache_size") is not None:
        session.say(f"  state pool: predicted {p.get('max_mamba_cache_size')} slots, conv {p.get('conv_state_gb')} / ssm "
                    f"{p.get('ssm_state_gb')} GiB; logged {lg.mamba}; replayed "
                    f"{(check.get('replayed_from_logged_memory') or {}).get('max_mamba_cache_size')}")
    session.say(f"  KV: predicted {p.get('kv_tokens')} tokens {p.get('kv_gb')} GiB; logged {lg.kv}; pool end predicted "
                f"{p.get('memory_pool_end_avail_gb')} vs logged {lg.pool_end_avail_gb}")
    if lg.state_error or lg.no_kv_error:
        session.say(f"  SGLang refused: {lg.state_error or lg.no_kv_error}; sparkit predicted: {pools.get('error')}")
    session.save()


def config_only_plan(session: Session, recipe: Path) -> None:
    """The fit of a config-only checkpoint (no .safetensors): sized from config.json, and said so."""
    done = subprocess.run(sk("plan", str(recipe), "--json"), capture_output=True, text=True, timeout=120, cwd=REPO)
    try:
        fit = json.loads(done.stdout)["memory_fit"]
    except (ValueError, KeyError):
        session.say(f"config-only plan: rc {done.returncode} {done.stderr.strip()[-200:]}")
        return
    session.results["config_only_fit"] = {"checkpoint_note": fit.get("checkpoint_note"), "verdict": fit.get("verdict"),
                                          "weights_bytes": fit.get("weights_bytes"), "notes": fit.get("notes")}
    session.say(f"config-only checkpoint: {fit.get('checkpoint_note')} -> weights {fit.get('weights_bytes', 0) / 2**30:.2f} GiB")
    session.save()


# ------------------------------------------------------------------------------ the roofline

def roofline(session: Session, recipes: dict[str, Path], gb_s: float | None) -> None:
    from sparkit.recipes.load import load_recipe
    from sparkit.roofline.bandwidth import Bandwidth
    from sparkit.roofline.estimate import estimate

    if not gb_s:
        session.say("roofline: no measured bandwidth, no bound")
        return
    bw = Bandwidth(gb_s, 1, "measured", f"{gb_s:.0f} GB/s read (sparkit doctor --bandwidth, this session)")
    context = INPUT_LEN + OUTPUT_LEN // 2
    for name, entry in session.results["variants"].items():
        row = entry.get("decode")
        if not row or not row.get("decode_tok_s"):
            continue
        try:
            r = estimate(load_recipe(str(recipes[name])).recipe, context=context, bandwidth=bw)
        except Exception as exc:  # noqa: BLE001
            entry["roofline_error"] = str(exc)
            continue
        accept = row.get("accept_length") if entry.get("speculative") else None
        bound = r.tok_s(accept) if accept else r.tok_s()
        entry["roofline"] = {"step_bytes": r.step_bytes, "bound_tok_s": bound, "fraction": row["decode_tok_s"] / bound,
                             "bound_step_ms": 1000.0 / r.tok_s(), "accept": accept, "context": context}
        session.say(f"  {name} {entry['label']}: {row['decode_tok_s']:.1f} tok/s of a {bound:,.0f} tok/s bound "
                    f"({r.step_bytes / 1e9:.2f} GB a step at {gb_s:.0f} GB/s) = {row['decode_tok_s'] / bound:.1%}")
    session.save()


def line_fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(fixed, per_layer) of step_ms = fixed + per_layer x layers, least squares; None under 2 layer counts."""
    xs = [p[0] for p in points]
    if len(set(xs)) < 2:
        return None
    n = len(points)
    mx, my = sum(xs) / n, sum(p[1] for p in points) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def extrapolate(session: Session, gb_s: float | None) -> None:
    """Per series (experts, head, speculative): the line through its layer counts, at 42 layers, on
    the H200 and on GB10 at the H200's fraction of the bound."""
    from sparkit.recipes.load import load_recipe
    from sparkit.roofline.bandwidth import Bandwidth
    from sparkit.roofline.estimate import estimate

    series: dict[tuple[str, str, bool], list[tuple[int, float]]] = {}
    for entry in session.results["variants"].values():
        row = entry.get("decode")
        if row and row.get("tpot_median_ms") and not entry.get("speculative"):
            series.setdefault((entry["experts"], entry["head"], entry["speculative"]), []).append(
                (entry["layers"], row["tpot_median_ms"]))
    out = []
    for (experts, head, spec), points in sorted(series.items()):
        fitted = line_fit(points)
        if fitted is None:
            continue
        fixed, per_layer = fitted
        step42 = fixed + per_layer * LING_LAYERS
        # the bound of the whole model (the declared profile: no checkpoint needed), same stack
        recipe = load_recipe("ling-3.0-flash/tp4-baseline", ["stack.tp=1", f"stack.weights={experts}", f"stack.lm_head={head}",
                                                             "stack.speculative=none", "stack.moe_backend=triton"]).recipe
        row = {"experts": experts, "head": head, "speculative": spec, "points": points, "fixed_ms": fixed,
               "per_layer_ms": per_layer, "step42_ms": step42, "tok_s42": 1000.0 / step42}
        if gb_s:
            h200 = estimate(recipe, context=INPUT_LEN + OUTPUT_LEN // 2,
                            bandwidth=Bandwidth(gb_s, 1, "measured", "this session"))
            spark = estimate(recipe, context=INPUT_LEN + OUTPUT_LEN // 2,
                             bandwidth=Bandwidth(GB10_GB_S, 1, "spec", "GB10 spec sheet"))
            fraction = row["tok_s42"] / h200.tok_s()
            # Two readings of GB10: the H200's fraction of the bound (scales the host's fixed cost with
            # bandwidth, so it is a floor), and the step's bytes at 273 GB/s plus the fixed cost measured
            # here (the host's share does not shrink on a slower memory).
            gb10_step_ms = h200.step_bytes / (GB10_GB_S * 1e9) * 1000.0 + fixed
            row.update(bound42_h200_tok_s=h200.tok_s(), fraction42=fraction, bound42_gb10_tok_s=spark.tok_s(),
                       gb10_at_that_fraction_tok_s=fraction * spark.tok_s(), step42_bytes=h200.step_bytes,
                       gb10_bytes_plus_fixed_ms=gb10_step_ms, gb10_bytes_plus_fixed_tok_s=1000.0 / gb10_step_ms)
        out.append(row)
        session.say(f"line {experts} experts, {head} head: step = {fixed:.3f} ms + {per_layer:.4f} ms x layers "
                    f"-> 42 layers {step42:.2f} ms = {row['tok_s42']:.0f} tok/s"
                    + (f", {row['fraction42']:.0%} of the H200 bound {row['bound42_h200_tok_s']:.0f}; on GB10 at that "
                       f"fraction {row['gb10_at_that_fraction_tok_s']:.1f} tok/s of a {row['bound42_gb10_tok_s']:.1f} "
                       f"tok/s bound; its bytes at 273 GB/s + this fixed cost {row['gb10_bytes_plus_fixed_ms']:.1f} ms "
                       f"= {row['gb10_bytes_plus_fixed_tok_s']:.1f} tok/s" if gb_s else ""))
    session.results["extrapolation"] = out
    from sparkit.roofline.published import PUBLISHED

    spark = [{"recipe": f.recipe, "workload": f.workload, "tok_s": f.decode_tok_s} for f in PUBLISHED
             if f.recipe.startswith("ling-3.0-flash/spark") and not f.accept]
    session.results["spark_study"] = {"figures": spark, "fractions": "69-77% of the bound without MTP "
                                      "(docs/roofline.md: spark-baseline 69%, spark-humming 75%, -fp8head 77%)"}
    session.say("Spark study without MTP (docs/roofline.md): 69-77% of the bound (36.1-43.9 tok/s, MXFP4 experts)")
    session.save()


# ------------------------------------------------------------------------------ the phases

def wait_for_pools(session: Session, v: Variant, proc: subprocess.Popen, timeout_s: float) -> None:
    """Until the server of `v` has allocated its pools (SGLang's "Memory pool end"), its `up` ended,
    or `timeout_s`: a server started after that point measures the memory the first really left."""
    from sparkit.paths import runs_dir

    deadline = time.monotonic() + timeout_s
    recipe = str(session.out / "recipes")
    while time.monotonic() < deadline and proc.poll() is None:
        for run in sorted(runs_dir().glob("*"), key=lambda p: p.stat().st_mtime, reverse=True)[:8]:
            plan = run / "plan.json"
            log = run / "server.log"
            try:
                if recipe in plan.read_text() and f"ling-width-{v.name}" in plan.read_text() \
                        and "Memory pool end" in log.read_text(errors="replace"):
                    session.say(f"{v.name}: its pools are allocated ({run.name}): the next servers start")
                    return
            except OSError:
                continue
        time.sleep(1)


def phase_base(session: Session, recipes: dict[str, Path], timeout_s: float) -> None:
    a = next(v for v in VARIANTS if v.name == "A")
    first = start(session, a, recipes["A"], timeout_s)
    wait_for_pools(session, a, first, timeout_s)
    procs = [(a, first)]
    for v in (v for v in VARIANTS if v.phase == "base" and v.name != "A"):
        procs.append((v, start(session, v, recipes[v.name], timeout_s)))
        time.sleep(2)
    for v, p in procs:
        finish(session, v, p, timeout_s + 60)
    decode(session, ["A", "B", "C"], "base")
    for name in ("A", "B", "C"):
        memory_check(session, name)
    profile(session, "A", "DECODE")
    profile(session, "B", "DECODE")
    compare_profiles(session, "A", "B")
    if session.left() > PHASE_COST_S["l12"] + 40:
        profile(session, "C", "VERIFY")
    down_all(session)


def phase_l12(session: Session, recipes: dict[str, Path], timeout_s: float) -> None:
    # E's pools first: two 60 GiB servers profiling at the same moment would each find the other's
    # weights in what they measured as free (the CEO's "total_rest_memory=-9.30 GB")
    e, f, g = (next(x for x in VARIANTS if x.name == name) for name in ("E", "F", "G"))
    first = start(session, e, recipes["E"], timeout_s)
    wait_for_pools(session, e, first, timeout_s)
    procs = [(e, first), (f, start(session, f, recipes["F"], timeout_s))]
    time.sleep(3)  # E warms up and F starts: G's preflight must count what they will take
    procs.append((g, start(session, g, recipes["G"], timeout_s)))
    for v, p in procs:
        finish(session, v, p, timeout_s + 60)
    decode(session, ["E", "F"], "l12")
    for name in ("E", "F", "G"):
        memory_check(session, name)
    down_all(session)


def phase_extra(session: Session, recipes: dict[str, Path], timeout_s: float) -> None:
    procs = []
    for name in ("D", "H", "I"):
        v = next(x for x in VARIANTS if x.name == name)
        procs.append((v, start(session, v, recipes[name], timeout_s)))
        time.sleep(2)
    for v, p in procs:
        finish(session, v, p, timeout_s + 60)
    decode(session, ["D", "H", "I"], "extra")
    for name in ("D", "H", "I"):
        memory_check(session, name)
    down_all(session)


PHASES = {"base": phase_base, "l12": phase_l12, "extra": phase_extra}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer-from", type=Path, default=None,
                        help="a tokenizer directory (the kit's make_tiny_v3.py output); padded to Ling's vocabulary")
    parser.add_argument("--models", type=Path, default=Path("/tmp/ling-width-models"))
    parser.add_argument("--phases", default=os.environ.get("LING_PHASES", "base,l12"))
    parser.add_argument("--budget-s", type=float, default=float(os.environ.get("LING_BUDGET_S", 450)))
    parser.add_argument("--server-timeout-s", type=float, default=300)
    parser.add_argument("--rehearse", action="store_true", help="the embedded engine stands in (no GPU needed)")
    args = parser.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        parser.error(f"--phases: unknown {', '.join(unknown)} (known: {', '.join(PHASES)})")
    if not args.rehearse and args.tokenizer_from is None:
        parser.error("--tokenizer-from DIR is needed to serve the Ling-width models (the kit's make_tiny_v3.py output)")
    session = Session(args.out, args.budget_s)
    session.results.update(rehearsal=args.rehearse, phases_asked=phases, budget_s=args.budget_s)
    if args.rehearse:
        session.results["notes"].append("REHEARSAL: the embedded engine's tiny-ling stands in for every variant; "
                                        "the figures are this CPU's and mean nothing")
    session.results["notes"].append("dummy (random) weights: a NEXTN draft accepts about one token in four "
                                    "proposals at best; its figures show the cost of the speculative machinery, not its gain")
    models = make_models(session, args.models, args.tokenizer_from, args.rehearse)
    recipe_dir = args.out / "recipes"
    recipe_dir.mkdir(exist_ok=True)
    recipes = {}
    for v in VARIANTS:
        path = recipe_dir / f"{v.name}-{v.label}.yaml"
        path.write_text(recipe_text(v, models[f"{v.experts}-L{v.layers}"], args.rehearse))
        recipes[v.name] = path
    if not args.rehearse:
        config_only = recipe_dir / "config-only.yaml"
        config_only.write_text(recipe_text(VARIANTS[0], models["config-only"], False))
        config_only_plan(session, config_only)
    gb_s = bandwidth(session, args.rehearse).get("read_gb_s")
    try:
        for phase in phases:
            need = PHASE_COST_S[phase]
            if session.left() < need:
                session.say(f"{phase}: skipped ({session.left():.0f} s of the budget left, it needs ~{need} s)")
                session.results["phases"][phase] = "skipped: budget"
                session.save()
                continue
            session.say(f"{phase}: begins ({session.left():.0f} s of the budget left)")
            PHASES[phase](session, recipes, args.server_timeout_s)
            session.results["phases"][phase] = "done"
            session.save()
    finally:
        down_all(session)
        session.say("the roofline at the measured bandwidth:")
        roofline(session, recipes, gb_s)
        extrapolate(session, gb_s)
        session.say("done")
        session.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
