"""Per-reply and session speed figures (hand-computed)."""

from __future__ import annotations

import pytest

from sparkit.tui.reply_metrics import ReplyMetrics, SessionMetrics, format_reply


def test_decode_speed_excludes_the_time_to_first_token():
    reply = ReplyMetrics(t_start=10.0)
    reply.on_chunk(12.0, 1)  # TTFT 2 s: a slow prefill must not lower the decode speed
    for k in range(1, 101):
        reply.on_chunk(12.0 + k * 0.01, 1)
    assert reply.ttft == pytest.approx(2.0)
    assert reply.output_tokens == 101
    assert reply.decode_tok_s == pytest.approx(100 / 1.0)


def test_speculative_chunks_count_all_their_tokens():
    reply = ReplyMetrics(t_start=0.0)
    reply.on_chunk(0.1, 1)
    reply.on_chunk(0.2, 4)
    reply.on_chunk(0.3, 3)
    assert reply.output_tokens == 8
    assert reply.decode_tok_s == pytest.approx(7 / 0.2)


def test_settle_takes_the_servers_count_and_accept_length():
    reply = ReplyMetrics(t_start=0.0)
    for k in range(10):  # chat chunks counted one token each while streaming
        reply.on_chunk(0.1 + k * 0.1, 1)
    reply.settle(completion_tokens=28, accept_length=2.8, status="done")
    assert reply.exact and reply.output_tokens == 28
    assert reply.accept_length == 2.8
    assert reply.decode_tok_s == pytest.approx(27 / 0.9)


def test_no_speed_before_two_tokens_and_empty_chunks_do_not_count():
    reply = ReplyMetrics(t_start=0.0)
    reply.on_chunk(0.5, 0)
    assert reply.ttft is None and reply.decode_tok_s is None
    reply.on_chunk(0.6, 1)
    assert reply.ttft == pytest.approx(0.6) and reply.decode_tok_s is None


def test_round_trip_through_a_dict_keeps_the_figures():
    reply = ReplyMetrics(t_start=1.0, t_first=1.5, t_last=2.5, output_tokens=11, accept_length=3.0, exact=True, status="done")
    again = ReplyMetrics.from_dict(reply.to_dict())
    assert again == reply
    assert again.decode_tok_s == pytest.approx(10.0)


def test_session_mean_is_token_weighted_and_the_series_skips_replies_without_speed():
    fast = ReplyMetrics(t_start=0, t_first=0, t_last=1.0, output_tokens=101)  # 100 tok/s over 1 s
    slow = ReplyMetrics(t_start=0, t_first=0, t_last=1.0, output_tokens=11, accept_length=2.0)  # 10 tok/s
    empty = ReplyMetrics(t_start=0, status="stopped")
    session = SessionMetrics([fast, slow, empty])
    assert session.tok_s_series == [pytest.approx(100.0), pytest.approx(10.0)]
    assert session.mean_tok_s == pytest.approx(110 / 2.0)
    assert session.mean_accept_length == 2.0
    assert SessionMetrics().mean_tok_s is None


def test_the_metrics_line_says_what_is_known():
    reply = ReplyMetrics(t_start=0, t_first=0.041, t_last=1.041, output_tokens=301, accept_length=2.71, status="done")
    assert format_reply(reply) == "300.0 tok/s · TTFT 41 ms · 301 tok · accept 2.71"
    waiting = ReplyMetrics(t_start=0)
    assert format_reply(waiting) == "– tok/s · TTFT – · 0 tok · streaming…"
    # chunks whose token count the server did not report make the live figures lower bounds
    live = ReplyMetrics(t_start=0)
    live.on_chunk(0.1, 1, counted_exactly=False)
    live.on_chunk(0.2, 1, counted_exactly=False)
    assert format_reply(live) == "≥10.0 tok/s · TTFT 100 ms · ≥2 tok · streaming…"
    live.settle(completion_tokens=7, accept_length=3.5, status="done")
    assert format_reply(live) == "60.0 tok/s · TTFT 100 ms · 7 tok · accept 3.50"
    stopped = ReplyMetrics(t_start=0, t_first=0.1, t_last=0.2, output_tokens=3, status="stopped")
    assert format_reply(stopped).endswith("· stopped")
