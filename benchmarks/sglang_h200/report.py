"""Summarise a real-SGLang session (session.sh's session.tgz, extracted) as Markdown.

    python3 benchmarks/sglang_h200/report.py DIR [--out FILE]

DIR holds `sglang-session-w/` (the session's work files) and `sparkit-home/runs/` (one run
directory per `sparkit up` / verify server). For every run: its recipe, how it ended, each startup
check (status and detail, as checks.json recorded them), its startup phases (from the real log's
timestamps and SGLang's own "Engine startup timings" line), the weight loads, the activation
report's lm_head and MoE evidence, the probe's accept length and tok/s. Then the interleaved A/B
table, bench / eval / verify / chat figures, and the processes left after `down`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_section(run: Path) -> list[str]:
    from sparkit.engines.activation_report import load_reports
    from sparkit.engines.sglang.log import parse_log, phase_timeline

    meta = _json(run / "meta.json") or {}
    plan = _json(run / "plan.json") or {}
    checks = (_json(run / "checks.json") or {}).get("results", [])
    probe = _json(run / "probe.json") or {}
    log = (run / "server.log").read_text(errors="replace") if (run / "server.log").exists() else ""
    ev = parse_log(log)
    state = meta.get("extra", {}).get("state")
    out = [f"### {run.name}", "",
           f"recipe `{meta.get('recipe_name')}`, state `{state}`"
           + (f", failure: {meta['extra']['failure']}" if meta.get("extra", {}).get("failure") else "")
           + (f", ready after {meta['extra']['ready_s']} s" if meta.get("extra", {}).get("ready_s") else ""), ""]
    if plan.get("argv"):
        out += ["```", " ".join(f"{k}={v}" for k, v in sorted(plan.get("env", {}).items())) + " "
                + " ".join(plan["argv"][1:]), "```", ""]
    if checks:
        out += ["| check | status | detail |", "|---|---|---|"]
        for c in checks:
            detail = c.get("detail", "").replace("|", "\\|")
            if c.get("cause") and c.get("status") == "fail":
                detail += f" (cause: {c['cause']})".replace("|", "\\|")
            out.append(f"| {c.get('title')} | {c.get('status')} | {detail} |")
        out.append("")
    timeline = phase_timeline(log)
    if timeline:
        out.append("startup phases (s from the first log line): " + ", ".join(f"{p} {s:.0f}" for p, s in timeline))
    if ev.startup_timings:
        out.append("SGLang's startup timings (s): " + ", ".join(f"{k}={v:g}" for k, v in ev.startup_timings.items()))
    if ev.weight_loads:
        out.append("weights: " + "; ".join(f"{w.model_class} ({w.elapsed_s} s)" for w in ev.weight_loads))
    if ev.graph_captures:
        out.append(f"CUDA graph captures: {ev.graph_captures}; decode lines with `cuda graph: True`: "
                   f"{sum(1 for d in ev.decode_stats if d.graph)} of {len(ev.decode_stats)}")
    for line in ("fp8_lm_head",):
        if line in ev.lines:
            out.append(f"log: `{ev.lines[line][:220]}`")
    try:
        reports = load_reports(run)
    except Exception:
        reports = []
    for rep in reports:
        for role, model in rep.models.items():
            moe = model.moe
            out.append(f"report tp{rep.tp_rank} {role}: {model.model_class}, lm_head {model.lm_head.weight_dtype} via "
                       f"{model.lm_head.quant_method} (module {model.lm_head.module_id}, shared {model.lm_head.shared_with_target}, "
                       f"exact top-k {model.lm_head.exact_top_k})"
                       + (f", MoE {moe.expert_weight_format} via {moe.quant_method} on {moe.runner}" if moe else ""))
            if moe and moe.layers:  # schema /2: what every MoE layer runs
                kinds: dict = {}
                for layer in moe.layers:
                    kinds.setdefault((layer.quant_method, layer.expert_weight_format, layer.runner, layer.weight_schema), []).append(layer.name)
                for (method, fmt, runner, schema), names in kinds.items():
                    out.append(f"  {len(names)} MoE layer(s) ({names[0]}{', ...' if len(names) > 1 else ''}): {method}, {fmt}, "
                               f"runner {runner}" + (f", humming schema {schema}" if schema else ""))
    if probe:
        out.append(f"probe: accept length {probe.get('accept_length')}, decode {probe.get('decode_tok_s')} tok/s "
                   f"({probe.get('completion_tokens')} tokens / {probe.get('spec_verify_ct')} verify steps)")
    if state == "failed" or (not checks and log):
        from sparkit.engines.sglang.log import diagnose_failure

        d = diagnose_failure(log, None)
        out.append(f"diagnosis: {d.cause}: {d.detail} (line: `{(d.line or '')[:200]}`)")
    out.append("")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    root = Path(args.dir)
    work = root / "sglang-session-w"
    lines = ["# Real SGLang 0.5.23 on an H200: sparkit's session", ""]
    summary = work / "summary.txt"
    if summary.exists():
        lines += ["## The session's own log", "", "```", *summary.read_text().splitlines(), "```", ""]
    lines += ["## Runs", ""]
    for run in sorted((root / "sparkit-home" / "runs").glob("*")):
        if run.is_dir():
            lines += run_section(run)
    ab = _json(work / "ab-decode.json")
    if ab:
        lines += ["## Interleaved batch-1 decode", "", "| variant | TPOT median ms | decode tok/s | x first | accept | step est. ms |",
                  "|---|---|---|---|---|---|"]
        for row in ab["rows"]:
            f = lambda v, d=2: f"{v:.{d}f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
            lines.append(f"| {row['label']} | {f(row['tpot_median_ms'], 3)} | {f(row['decode_tok_s'], 1)} | "
                         f"{f(row.get('decode_ratio_to_first'), 3)} | {f(row['accept_length_mean'])} | {f(row['step_time_estimate_ms'], 3)} |")
        lines.append("")
    for name, title in (("main-bench.json", "sparkit bench (main run)"), ("main-eval.json", "sparkit eval gsm8k (main run)"),
                        ("verify.json", "sparkit verify"), ("main-chat.json", "scripted sparkit chat")):
        doc = _json(work / name)
        if doc is not None:
            text = json.dumps(doc.get("summary", doc) if isinstance(doc, dict) else doc, indent=1, default=str)
            lines += [f"## {title}", "", "```json", text[:4000], "```", ""]
    for name in ("end-gpu.txt", "end-ps.txt"):
        if (work / name).exists():
            lines += [f"`{name}` after `down --all`:", "", "```", (work / name).read_text().strip() or "(empty)", "```", ""]
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
