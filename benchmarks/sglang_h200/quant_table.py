"""The quantised-export runs of a session (session.sh's `quant` step) as one table.

    python3 benchmarks/sglang_h200/quant_table.py W RUNS [--json OUT]

W is the session's work directory (quant-LABEL-up.json, quant-decode.json, main-up.json), RUNS the
run directories (SPARKIT_HOME/runs). Per variant (bf16: the main run, the bf16 export with the same
stack; fp8, mxfp4, damaged): how `sparkit up` ended, every startup check's status, the known-answer
perplexity against the bf16 run's and the recipe's expectation, the accept length, the probe's and
the interleaved decode tok/s, the start-up time (`ready_s`), the MoE layers as the activation
report states them, and where the server log is. Plain text on stdout, the same as JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

VARIANTS = (("bf16", "main-up.json"), ("fp8", "quant-fp8-up.json"), ("mxfp4", "quant-mxfp4-up.json"),
            ("damaged", "quant-damaged-up.json"))


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _check(checks: list[dict], name: str) -> dict:
    return next((c for c in checks if c.get("name") == name), {})


def variant_row(label: str, up: dict | None, runs: Path, decode: dict) -> dict:
    row: dict = {"variant": label, "up": "no result" if up is None else ("ok" if up.get("ok") else "checks failed")}
    if not up:
        return row
    run = runs / str(up.get("run"))
    meta = _json(run / "meta.json") or {}
    checks = up.get("checks") or (_json(run / "checks.json") or {}).get("results", [])
    known = _check(checks, "known_answer").get("data", {})
    accept = _check(checks, "acceptance").get("data", {})
    speed = _check(checks, "decode_speed").get("data", {})
    row.update({
        "run": up.get("run"), "recipe": meta.get("recipe_name"),
        "checks": {c.get("name"): c.get("status") for c in checks},
        "failed": [f"{c.get('title')}: {c.get('detail')}" for c in checks if c.get("status") == "fail"],
        "perplexity": known.get("perplexity"), "expected_perplexity": known.get("expected"),
        "tolerance": known.get("tolerance"), "accept_length": accept.get("accept_length"),
        "probe_decode_tok_s": speed.get("decode_tok_s"),
        "ready_s": meta.get("ready_s", (meta.get("extra") or {}).get("ready_s")),
        "log": str(run / "server.log"),
    })
    try:
        from sparkit.engines.activation_report import load_reports

        reports = load_reports(run)
    except Exception:
        reports = []
    if reports and reports[0].target and reports[0].target.moe:
        layers = [layer for rep in reports for model in rep.models.values() if model.moe for layer in model.moe.per_layer()]
        kinds = sorted({(layer.quant_method, layer.expert_weight_format, layer.runner) for layer in layers})
        row["moe_layers"] = f"{len(layers)} layers: " + "; ".join(f"{m} {f} on {r}" for m, f, r in kinds)
    for server in (decode or {}).get("rows", []):
        if server.get("label") == label:
            row["interleaved_decode_tok_s"] = server.get("decode_tok_s")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("runs", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    decode = _json(args.work / "quant-decode.json") or {}
    rows = [variant_row(label, _json(args.work / name), args.runs, decode) for label, name in VARIANTS]
    base = next((r.get("perplexity") for r in rows if r["variant"] == "bf16" and r.get("perplexity")), None)
    for row in rows:
        if base and row.get("perplexity"):
            row["perplexity_vs_bf16"] = row["perplexity"] / base - 1.0

    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    print("variant  up             ppl     vs bf16  expected  accept  probe tok/s  decode tok/s  ready s  MoE layers")
    for r in rows:
        print(f"{r['variant']:<8} {r['up']:<14} {fmt(r.get('perplexity'), '.4f'):>7} {fmt(r.get('perplexity_vs_bf16'), '+.1%'):>8} "
              f"{fmt(r.get('expected_perplexity'), '.3f'):>9} {fmt(r.get('accept_length'), '.2f'):>7} "
              f"{fmt(r.get('probe_decode_tok_s'), '.1f'):>12} {fmt(r.get('interleaved_decode_tok_s'), '.1f'):>13} "
              f"{fmt(r.get('ready_s'), '.0f'):>8}  {r.get('moe_layers', '-')}")
        for name, status in (r.get("checks") or {}).items():
            if status != "pass":
                print(f"         {name}: {status}")
        for line in r.get("failed", []):
            print(f"         FAIL {line}")
    if args.json:
        args.json.write_text(json.dumps({"variants": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
