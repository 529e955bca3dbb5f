"""The statistics match scipy on known values (scipy is a test dependency only)."""

from __future__ import annotations

import math

import pytest

from sparkit.evals.stats import Z_95, mcnemar_exact, proportion, wilson_interval

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("k, n", [(1278, 1319), (1277, 1319), (0, 10), (10, 10), (1, 2), (194, 200), (5, 1319), (660, 1319)])
def test_wilson_interval_matches_scipy(k, n):
    expected = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(expected.low, abs=1e-12)
    assert high == pytest.approx(expected.high, abs=1e-12)


def test_wilson_formula_by_hand_and_published_half_width():
    # The textbook formula written out, and docs/protocols.md's "about 0.9 points near 97% at n=1319".
    k, n = 1278, 1319
    p, z = k / n, Z_95
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert wilson_interval(k, n) == pytest.approx((centre - half, centre + half), abs=1e-15)
    assert proportion(k, n).half_width * 100 == pytest.approx(0.9, abs=0.1)
    assert proportion(194, 200).half_width * 100 == pytest.approx(2.4, abs=0.3)


def test_z_is_the_normal_quantile():
    assert Z_95 == pytest.approx(scipy_stats.norm.ppf(0.975), abs=1e-15)


def test_wilson_rejects_impossible_counts():
    with pytest.raises(ValueError):
        wilson_interval(5, 3)
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("b, c", [(0, 0), (1, 0), (5, 5), (9, 8), (10, 2), (2, 10), (0, 7), (30, 12), (40, 70), (300, 280), (600, 500)])
def test_mcnemar_exact_matches_scipy_binomtest(b, c):
    expected = 1.0 if b + c == 0 else scipy_stats.binomtest(b, b + c, 0.5).pvalue
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_mcnemar_published_spark_result_is_p_one():
    # 96.89% vs 96.82% over 1319 questions is one net discordant question: p = 1.0 whatever b + c.
    for b in range(0, 30):
        assert mcnemar_exact(b + 1, b) == 1.0


def test_mcnemar_detects_a_real_regression():
    assert mcnemar_exact(20, 3) < 0.01
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)
