"""Key bindings that need no server: copy, settings, history, new chat, offline state."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from sparkit.tui.app import create_app
from sparkit.tui.clipboard import last_copy_path
from sparkit.tui.history import ChatStore
from sparkit.tui.settings import ChatSettings

SIZE = (110, 34)
DEAD_URL = "http://127.0.0.1:9"
REPLY = "Use this:\n\n```bash\nsparkit up recipes/tiny/tiny.yaml\n```\n\nthen chat."


def run_async(test):
    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return wrapper


async def wait_until(pilot, condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)


def stored_chat(tmp_path) -> tuple:
    store_path = tmp_path / "chat.sqlite3"
    store = ChatStore(store_path)
    cid = store.new_conversation("how do I start?")
    store.add_message(cid, "user", "how do I start?")
    store.add_message(cid, "assistant", REPLY)
    return store_path, cid


@run_async
async def test_copy_reply_and_code_block(sparkit_home, tmp_path):
    store_path, cid = stored_chat(tmp_path)
    app = create_app(DEAD_URL, store_path=store_path, health_interval=None, open_conversation=cid)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+y")
        await pilot.pause()
        assert last_copy_path().read_text() == REPLY
        assert app.clipboard == REPLY  # what App.copy_to_clipboard sent as OSC 52
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert last_copy_path().read_text() == "sparkit up recipes/tiny/tiny.yaml\n"


@run_async
async def test_copy_with_nothing_to_copy_says_so(sparkit_home, tmp_path):
    app = create_app(DEAD_URL, store_path=tmp_path / "c.sqlite3", health_interval=None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+y")
        await pilot.pause()
        assert not last_copy_path().exists()
        assert any("no reply to copy" in n.message for n in app._notifications)


@pytest.mark.slow
@run_async
async def test_settings_are_validated_and_saved(tmp_path):
    app = create_app(DEAD_URL, store_path=tmp_path / "c.sqlite3", health_interval=None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "SettingsScreen")
        app.screen.query_one("#set-max_tokens").value = "0"
        await pilot.click("#settings-save")
        await pilot.pause()
        assert type(app.screen).__name__ == "SettingsScreen"  # a bad value keeps the panel open
        assert "max_tokens: must be at least 1" in str(app.screen.query_one("#settings-error").render())
        for name, value in (("temperature", "0"), ("top_p", "0.9"), ("top_k", "-1"), ("max_tokens", "64")):
            app.screen.query_one(f"#set-{name}").value = value
        await pilot.pause(0.5)  # the button ignores a second press while it shows the first (0.2 s)
        await pilot.click("#settings-save")
        await wait_until(pilot, lambda: type(app.screen).__name__ != "SettingsScreen")
        assert app.settings == ChatSettings(temperature=0.0, top_p=0.9, top_k=-1, max_tokens=64)
        await pilot.press("ctrl+t")
        await pilot.pause()
        await pilot.press("escape")  # Esc cancels the panel, not a reply
        await wait_until(pilot, lambda: type(app.screen).__name__ != "SettingsScreen")
        assert app.settings.max_tokens == 64


@run_async
async def test_new_chat_clears_the_view_and_history_reopens_it(tmp_path):
    store_path, cid = stored_chat(tmp_path)
    app = create_app(DEAD_URL, store_path=store_path, health_interval=None, open_conversation=cid)
    async with app.run_test(size=SIZE) as pilot:
        assert len(app.message_views()) == 2 and app.conversation_id == cid
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: app.message_views() == [])
        assert app.conversation_id is None
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "HistoryScreen")
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(app.message_views()) == 2)
        assert app.conversation_id == cid


@pytest.mark.slow
@run_async
async def test_a_message_to_an_unreachable_server_is_marked_and_the_app_goes_on(tmp_path):
    app = create_app(DEAD_URL, store_path=tmp_path / "c.sqlite3", health_interval=0.5)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.connection_state == "offline")
        app.query_one("#prompt").focus()
        await pilot.press(*"hello", "enter")
        await wait_until(pilot, lambda: app.reply_finished.is_set())
        reply = app.message_views()[-1]
        assert reply.status == "interrupted"
        assert f"no server answered at {DEAD_URL}" in str(reply.query_one(".role").render())
        # It never answered: the notice says so, not that a server went away.
        titles = [n.title for n in app._notifications]
        assert f"no server answered at {DEAD_URL}" in titles and "server went away" not in titles
        await pilot.press(*"still here")
        assert app.query_one("#prompt").value == "still here"


def chat_with_figures(tmp_path) -> tuple:
    """A saved chat of two replies with their figures: 100 tok/s (accept 2.0) and 10 tok/s (3.0)."""
    store_path = tmp_path / "chat.sqlite3"
    store = ChatStore(store_path)
    cid = store.new_conversation("speeds")
    for tokens, accept in ((101, 2.0), (11, 3.0)):
        store.add_message(cid, "user", "go")
        store.add_message(cid, "assistant", "ok " * 5, metrics={"t_start": 0.0, "t_first": 0.05, "t_last": 1.05,
                                                               "output_tokens": tokens, "accept_length": accept,
                                                               "exact": True, "status": "done"})
    return store_path, cid


@pytest.mark.slow
@run_async
async def test_reopening_a_saved_chat_counts_each_reply_once(tmp_path):
    store_path, cid = chat_with_figures(tmp_path)
    app = create_app(DEAD_URL, store_path=store_path, health_interval=None, open_conversation=cid)
    async with app.run_test(size=SIZE) as pilot:
        first = (len(app.session.replies), app.session.mean_tok_s, app.session.mean_accept_length)
        assert first == (2, 110 / 2.0, 2.5)
        for _ in range(2):  # new chat, then the same one again from the history, twice
            await pilot.press("ctrl+n")
            await wait_until(pilot, lambda: app.message_views() == [])
            await pilot.press("ctrl+o")
            await wait_until(pilot, lambda: type(app.screen).__name__ == "HistoryScreen")
            await pilot.press("enter")
            await wait_until(pilot, lambda: len(app.message_views()) == 4)
        assert (len(app.session.replies), app.session.mean_tok_s, app.session.mean_accept_length) == first
        assert len(app.query_one("#tok-s-spark").data) == 2
        assert "█" in screen_rows(app, "tok-s-spark")[0]  # two replies to compare: the sparkline draws
        assert str(app.query_one("#session-metrics").render()) == "2 replies · mean 55 tok/s · acc 2.50"


@run_async
async def test_ctrl_c_quits_like_ctrl_q(tmp_path):
    for key in ("ctrl+c", "ctrl+q"):
        store_path, cid = chat_with_figures(tmp_path / key)
        app = create_app(DEAD_URL, store_path=store_path, health_interval=None, open_conversation=cid)
        async with app.run_test(size=SIZE) as pilot:
            app.query_one("#prompt").focus()  # the prompt has the focus, where Textual binds Ctrl-C to copy
            await pilot.press(*"draft")
            await pilot.press(key)
            await pilot.pause()
            assert app.return_code == 0 and not app.is_running, key
        assert len(ChatStore(store_path).load(cid).messages) == 4  # the history is untouched


def screen_rows(app, widget_id: str) -> list[str]:
    region = app.query_one(f"#{widget_id}").region
    strips = app.screen._compositor.render_strips()
    rows = ["".join(segment.text for segment in strip) for strip in strips]
    return [row[region.x:region.right] for row in rows[region.y:region.bottom]]


@run_async
async def test_no_stray_block_glyphs_beside_the_server_panel_and_no_sparkline_without_data(tmp_path):
    store_path = tmp_path / "chat.sqlite3"
    store = ChatStore(store_path)
    cid = store.new_conversation("long")
    for i in range(12):  # longer than the screen: the transcript scrolls
        store.add_message(cid, "user", f"question {i}")
        store.add_message(cid, "assistant", f"answer {i}\n\n" + "word " * 40)
    app = create_app(DEAD_URL, store_path=store_path, health_interval=None)
    async with app.run_test(size=(80, 24)) as pilot:
        assert screen_rows(app, "tok-s-spark")[0].strip() == "–"  # no reply yet: a dash, not ▁▁▁▁
        await app.open_conversation(cid)
        await pilot.pause()
        assert app.conversation_view.max_scroll_y > 0  # there is a scrollbar to draw
        main = "\n".join(screen_rows(app, "main"))
        assert not set(main) & set("▁▂▃▄▅▆▇"), main  # the thumb is whole cells
        assert screen_rows(app, "tok-s-spark")[0].strip() == "–"  # replies without figures: still a dash
