"""Metric definitions on synthetic request timelines, with hand-computed answers."""

from __future__ import annotations

import math

import pytest

from sparkit.bench.metrics import (
    ChunkArrival,
    RequestTimeline,
    compute_metrics,
    percentile,
    window_throughputs,
)


def speculative_request() -> RequestTimeline:
    # Prefill token at 0.5 s, then verify steps committing 3, 2 and 1 tokens.
    return RequestTimeline(
        t_start=0.0,
        t_end=0.9,
        chunks=[ChunkArrival(0.5, 1), ChunkArrival(0.6, 3), ChunkArrival(0.7, 2), ChunkArrival(0.9, 1)],
        output_tokens=7,
        prompt_tokens=10,
        spec_verify_ct=3,
    )


def second_request() -> RequestTimeline:
    return RequestTimeline(
        t_start=1.0,
        t_end=1.5,
        chunks=[ChunkArrival(1.2, 1), ChunkArrival(1.5, 4)],
        output_tokens=5,
        prompt_tokens=10,
        spec_verify_ct=2,
    )


def test_tpot_excludes_ttft():
    r = speculative_request()
    assert r.ttft == pytest.approx(0.5)
    # (0.9 - 0.5) / (7 - 1)
    assert r.tpot == pytest.approx(0.4 / 6)


def test_itl_spreads_a_multi_token_chunk_over_its_tokens():
    r = speculative_request()
    # 0.1 s over 3 tokens, 0.1 s over 2 tokens, 0.2 s over 1 token
    assert r.itls == pytest.approx([0.1 / 3] * 3 + [0.05] * 2 + [0.2])
    # spread ITLs over one request average to its TPOT
    assert sum(r.itls) / len(r.itls) == pytest.approx(r.tpot)


def test_accept_length_is_tokens_per_verify_step():
    assert speculative_request().accept_length == pytest.approx(7 / 3)
    no_spec = RequestTimeline(0.0, 1.0, [ChunkArrival(0.5, 1), ChunkArrival(1.0, 1)], output_tokens=2)
    assert no_spec.accept_length is None
    assert no_spec.step_time == pytest.approx(0.5)


def test_window_counts_tokens_at_chunk_arrival_on_a_grid_from_the_start():
    a, b = speculative_request(), second_request()
    # window [0,1): 1+3+2+1 = 7 tokens; window [1,2): 1+4 = 5
    assert window_throughputs([a, b], t0=0.0) == [7, 5]
    # a chunk exactly on a boundary belongs to the later window
    edge = RequestTimeline(0.0, 2.0, [ChunkArrival(1.0, 2), ChunkArrival(2.0, 3)], output_tokens=5)
    assert window_throughputs([edge], t0=0.0) == [0, 2, 3]


def test_peak_window_differs_from_mean_throughput():
    m = compute_metrics([speculative_request(), second_request()])
    assert m.duration_s == pytest.approx(1.5)
    assert m.total_output_tokens == 12
    assert m.output_throughput_tok_s == pytest.approx(12 / 1.5)
    assert m.peak_window_throughput_tok_s == pytest.approx(7.0)


def test_aggregates_hand_computed():
    m = compute_metrics([speculative_request(), second_request()])
    tpot_a, tpot_b = 400 / 6, 75.0  # ms
    assert m.tpot.mean_ms == pytest.approx((tpot_a + tpot_b) / 2)
    assert m.tpot.median_ms == pytest.approx((tpot_a + tpot_b) / 2)
    assert m.ttft.mean_ms == pytest.approx(350.0)
    assert m.accept_length_mean == pytest.approx((7 / 3 + 2.5) / 2)
    assert m.accept_length_total == pytest.approx(12 / 5)
    assert m.step_time_estimate_ms == pytest.approx((tpot_a + tpot_b) / 2 * (7 / 3 + 2.5) / 2)
    # ITLs of both requests pooled: 6 from the first, 4 x 75 ms from the second
    assert m.itl.n == 10
    assert m.itl.mean_ms == pytest.approx((400 + 300) / 10)


def test_failed_requests_are_excluded_and_noted():
    bad = RequestTimeline(0.0, 0.1, [], output_tokens=0, error="HTTP 500")
    m = compute_metrics([speculative_request(), bad])
    assert m.completed == 1 and m.failed == 1
    assert m.total_output_tokens == 7
    assert any("failed" in note for note in m.notes)


def test_percentile_matches_linear_interpolation():
    values = [1.0, 2.0, 3.0, 4.0, 100.0]
    assert percentile(values, 50) == 3.0
    # position 4 * 0.99 = 3.96 -> 4 + (100 - 4) * 0.96
    assert percentile(values, 99) == pytest.approx(96.16)
    assert math.isnan(percentile([], 50))


def test_round_trip_through_json_dicts():
    r = speculative_request()
    again = RequestTimeline.from_dict(r.to_dict())
    assert again.tpot == r.tpot and again.itls == r.itls
    m = compute_metrics([r])
    from sparkit.bench.metrics import BenchMetrics

    assert BenchMetrics.from_dict(m.to_dict()) == m
