"""The metrics bar keeps the reply's figures whole (values, units, the accept length) at every
width a terminal has, then the connection state; the session's figures and the sparkline take
what room is left, hidden rather than cut."""

from __future__ import annotations

import asyncio

import pytest
from rich.cells import cell_len
from test_snapshots import app_for  # noqa: E402  (the snapshots' prepared conversation)

from sparkit.tui.reply_metrics import ReplyMetrics, format_reply
from sparkit.tui.widgets import MetricsBar

LONG = ReplyMetrics(t_start=0.0, t_first=0.024, t_last=0.024 + 40 / 2358.4, output_tokens=41, accept_length=3.42,
                    exact=True, status="done")


@pytest.mark.parametrize("size", [(120, 36), (100, 30), (80, 24), (60, 20)])
def test_the_reply_figures_and_the_connection_are_never_cut(tmp_path, size):
    asyncio.run(_check_the_bar(tmp_path, size))


async def _check_the_bar(tmp_path, size):
    app = app_for(tmp_path)
    async with app.run_test(size=size) as pilot:
        bar = app.query_one(MetricsBar)
        bar.show_reply(LONG)
        bar.show_session([900.0, 2358.4], 1671.0, 3.63)
        bar.show_connection("online", "http://127.0.0.1:30000")
        await pilot.pause()
        text = format_reply(LONG)
        assert text.endswith("tok/s · TTFT 24 ms · 41 tok · accept 3.42") and text.startswith("2358.4")
        reply = app.query_one("#reply-metrics")
        connection = app.query_one("#connection")
        assert reply.region.width >= cell_len(text), (size, reply.region)
        assert connection.display and connection.region.right <= size[0] and connection.region.width >= cell_len("● online")
        session = app.query_one("#session-metrics")
        if session.display:  # shown whole or not at all
            assert session.region.width >= cell_len("2 replies · mean 1671 tok/s · acc 3.63")
        spark = app.query_one("#tok-s-spark")
        assert not spark.display or spark.region.right <= connection.region.x
        if size[0] >= 120:
            assert session.display and spark.display  # a wide terminal shows everything
