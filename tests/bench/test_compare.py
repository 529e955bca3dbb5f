"""bench compare: ratios, and differences judged against run-to-run noise from repeats."""

from __future__ import annotations

import pytest

from sparkit.bench.compare import compare_results
from sparkit.bench.runner import BENCH_KIND, summarise


def result(tpot_per_repeat: list[float], accept: float = 3.0, **config) -> dict:
    repeats = [
        {
            "complete": True,
            "figures": {"tpot_mean_ms": t, "step_time_estimate_ms": t * accept, "accept_length_mean": accept},
        }
        for t in tpot_per_repeat
    ]
    cfg = {"dataset": "random", "input_len": 64, "output_len": 32, "concurrency": 1, "temperature": 0.0, "ignore_eos": True, "seed": 0}
    cfg.update(config)
    return {"kind": BENCH_KIND, "config": cfg, "repeats": repeats, "summary": summarise(repeats)}


def figure(comparison, key):
    return next(f for f in comparison.figures if f.key == key)


def test_a_difference_larger_than_the_repeat_spread_counts():
    a = result([10.0, 10.1, 9.9])
    b = result([8.0, 8.1, 7.9])
    tpot = figure(compare_results(a, b), "tpot_mean_ms")
    assert tpot.ratio == pytest.approx(0.8)
    assert tpot.exceeds_noise is True
    assert tpot.verdict == "better"  # lower TPOT is better


def test_a_difference_inside_the_repeat_spread_is_within_noise():
    a = result([10.0, 11.0, 9.0])
    b = result([10.2, 11.2, 9.2])
    comparison = compare_results(a, b)
    tpot = figure(comparison, "tpot_mean_ms")
    assert tpot.exceeds_noise is False and tpot.verdict == "within noise"
    assert any("3 (A) and 3 (B) repeats" in n for n in comparison.notes)


def test_single_repeat_says_noise_is_unknown():
    comparison = compare_results(result([10.0]), result([5.0]))
    tpot = figure(comparison, "tpot_mean_ms")
    assert tpot.ratio == pytest.approx(0.5)
    assert tpot.exceeds_noise is None and tpot.verdict == "noise unknown"
    assert any("noise unknown" in n for n in comparison.notes)


def test_throughput_higher_is_better_and_missing_figures_are_na():
    a = result([10.0, 10.1])
    comparison = compare_results(a, a)
    assert figure(comparison, "server_accept_length").verdict == "n/a"


def test_different_workloads_are_flagged():
    comparison = compare_results(result([10.0]), result([10.0], input_len=8192))
    assert any("workloads differ" in n and "input_len" in n for n in comparison.notes)


def test_results_measured_side_by_side_are_flagged_first():
    """An interleaved run's documents (tune, bench profile) record the servers up beside each one."""
    from sparkit.bench.runner import side_by_side

    a = result([10.0, 10.1, 9.9])
    b = {**result([8.0, 8.1, 7.9]), "side_by_side": side_by_side([{"url": "http://127.0.0.1:30001", "run": None}])}
    notes = compare_results(a, b, a_label="a.json", b_label="b.json").notes
    assert notes[0].startswith("b.json: measured while 1 other server(s) were up on this machine")
    assert not any(n.startswith("a.json:") for n in notes)
    assert side_by_side([]) is None
