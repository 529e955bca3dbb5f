"""Paired comparison of two GSM8K runs: is B (say, the optimised stack) worse than A?

Pairs on the questions both runs answered, counts the discordant pairs (b: A right and B wrong,
c: A wrong and B right) and applies McNemar's exact test. With two stacks of about 97% accuracy
most questions agree, so the paired test is far more sensitive than comparing two intervals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkit.errors import DataError, UsageError
from sparkit.evals.gsm8k.results_file import ResultsFile, read_results
from sparkit.evals.stats import mcnemar_exact, proportion

METRICS = ("strict", "flexible")


def resolve_results_path(path: Path) -> Path:
    """Accept the results JSONL or its .summary.json (which names the JSONL)."""
    path = Path(path).expanduser()
    if path.name.endswith(".summary.json"):
        candidate = path.with_name(path.name[: -len(".summary.json")] + ".jsonl")
        if candidate.is_file():
            return candidate
    if not path.is_file():
        raise DataError(f"results file not found: {path}", hint="pass the .jsonl written by `sparkit eval gsm8k --out`")
    return path


def compare_results(a: ResultsFile, b: ResultsFile, *, metric: str = "flexible", alpha: float = 0.05) -> dict[str, Any]:
    if metric not in METRICS:
        raise UsageError(f"--metric must be one of {', '.join(METRICS)}, got {metric!r}")
    a_data = (a.header or {}).get("settings", {}).get("data_sha256")
    b_data = (b.header or {}).get("settings", {}).get("data_sha256")
    common = sorted(set(a.results) & set(b.results))
    for qid in common:
        if a.results[qid]["gold"] != b.results[qid]["gold"]:
            raise DataError(
                f"{a.path} and {b.path} disagree on the gold answer of question {qid}: they are not runs on the same data",
                hint="compare runs made with the same --data",
            )
    if not common:
        raise DataError(f"{a.path} and {b.path} have no question in common", hint="both runs must cover the same questions")

    per_metric: dict[str, Any] = {}
    for m in METRICS:
        a_ok = [bool(a.results[q]["correct"][m]) for q in common]
        b_ok = [bool(b.results[q]["correct"][m]) for q in common]
        a_only = sum(x and not y for x, y in zip(a_ok, b_ok))
        b_only = sum(y and not x for x, y in zip(a_ok, b_ok))
        pa, pb = proportion(sum(a_ok), len(common)), proportion(sum(b_ok), len(common))
        p = mcnemar_exact(a_only, b_only)
        per_metric[m] = {
            "a": pa.as_dict(),
            "b": pb.as_dict(),
            "b_discordant": a_only,  # A right, B wrong
            "c_discordant": b_only,  # A wrong, B right
            "both_right": sum(x and y for x, y in zip(a_ok, b_ok)),
            "both_wrong": sum(not x and not y for x, y in zip(a_ok, b_ok)),
            "difference_points": (pb.value - pa.value) * 100,
            "mcnemar_p": p,
            "verdict": verdict(pa.value, pb.value, p, alpha),
        }
    main = per_metric[metric]
    return {
        "a": str(a.path),
        "b": str(b.path),
        "n_paired": len(common),
        "a_only_answered": len(set(a.results) - set(b.results)),
        "b_only_answered": len(set(b.results) - set(a.results)),
        "same_data": a_data == b_data,
        "same_settings": (a.header or {}).get("settings_hash") == (b.header or {}).get("settings_hash"),
        "metric": metric,
        "alpha": alpha,
        "metrics": per_metric,
        "mcnemar_p": main["mcnemar_p"],
        "verdict": main["verdict"],
    }


def verdict(a_accuracy: float, b_accuracy: float, p: float, alpha: float = 0.05) -> str:
    if p >= alpha:
        return f"no detectable difference at alpha {alpha:g} (p = {p:.3g})"
    points = abs(b_accuracy - a_accuracy) * 100
    direction = "worse" if b_accuracy < a_accuracy else "better"
    return f"B is {direction} by {points:.2f} points, p = {p:.3g}"


def compare_files(a: Path, b: Path, *, metric: str = "flexible", alpha: float = 0.05) -> dict[str, Any]:
    return compare_results(read_results(resolve_results_path(a)), read_results(resolve_results_path(b)), metric=metric, alpha=alpha)
