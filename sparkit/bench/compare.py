"""Side-by-side comparison of two bench results.

A difference "exceeds noise" when |B - A| is larger than twice its standard
error estimated from the run-to-run spread of the repeats:
2 * sqrt(sA^2/nA + sB^2/nB), sA and sB the standard deviations over repeats.
With fewer than two repeats on either side the noise is unknown and the
comparison says so instead of guessing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkit.bench.runner import HEADLINE

NOISE_SIGMAS = 2.0
# Settings that must match for a comparison to mean anything.
WORKLOAD_KEYS = ("dataset", "input_len", "output_len", "concurrency", "temperature", "ignore_eos", "seed")


@dataclass
class FigureComparison:
    key: str
    unit: str
    lower_is_better: bool
    a: float | None
    b: float | None
    ratio: float | None  # b / a
    noise: float | None  # absolute, same unit as a and b; None when unknown
    exceeds_noise: bool | None  # None when noise is unknown or a value is missing
    verdict: str  # "better" | "worse" | "within noise" | "noise unknown" | "n/a"


@dataclass
class Comparison:
    a_label: str
    b_label: str
    a_repeats: int
    b_repeats: int
    figures: list[FigureComparison]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _label(doc: dict[str, Any], fallback: str) -> str:
    recipe = doc.get("recipe") or {}
    name = recipe.get("name") if isinstance(recipe, dict) else None
    return str(name or fallback)


def compare_results(a: dict[str, Any], b: dict[str, Any], *, a_label: str = "A", b_label: str = "B") -> Comparison:
    sa, sb = a.get("summary", {}), b.get("summary", {})
    na, nb = int(sa.get("repeats", 0)), int(sb.get("repeats", 0))
    notes: list[str] = []
    for doc, label in ((a, a_label), (b, b_label)):
        if doc.get("side_by_side"):  # first: it decides whether the rest means anything
            notes.append(f"{label}: {doc['side_by_side']['warning']}")
    ca, cb = a.get("config", {}), b.get("config", {})
    differing = [k for k in WORKLOAD_KEYS if ca.get(k) != cb.get(k)]
    if differing:
        notes.append("workloads differ (" + ", ".join(f"{k}: {ca.get(k)} vs {cb.get(k)}" for k in differing) + "): ratios compare unlike things")
    if min(na, nb) < 2:
        notes.append(f"run-to-run noise unknown: {na} and {nb} repeat(s); rerun with --repeats 3 or more to judge differences")
    else:
        notes.append(
            f"noise from {na} (A) and {nb} (B) repeats: a difference counts when it exceeds "
            f"{NOISE_SIGMAS:g} x its standard error"
        )
    figures: list[FigureComparison] = []
    for key, unit, lower_is_better in HEADLINE:
        va, vb = sa.get("figures", {}).get(key), sb.get("figures", {}).get(key)
        if va is None or vb is None:
            figures.append(FigureComparison(key, unit, lower_is_better, va, vb, None, None, None, "n/a"))
            continue
        ratio = vb / va if va else None
        std_a, std_b = sa.get("stdev", {}).get(key), sb.get("stdev", {}).get(key)
        if std_a is None or std_b is None or min(na, nb) < 2:
            figures.append(FigureComparison(key, unit, lower_is_better, va, vb, ratio, None, None, "noise unknown"))
            continue
        noise = NOISE_SIGMAS * math.sqrt(std_a**2 / na + std_b**2 / nb)
        exceeds = abs(vb - va) > noise
        if not exceeds:
            verdict = "within noise"
        else:
            verdict = "better" if (vb < va) == lower_is_better else "worse"
        figures.append(FigureComparison(key, unit, lower_is_better, va, vb, ratio, noise, exceeds, verdict))
    if any(f.key == "peak_window_throughput_tok_s" for f in figures):
        notes.append("peak throughput is a 1-second-window statistic with about +-5% phase noise: reported, not a decision figure")
    return Comparison(a_label=_label(a, a_label), b_label=_label(b, b_label), a_repeats=na, b_repeats=nb, figures=figures, notes=notes)
