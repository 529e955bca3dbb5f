"""Key bindings that need no server: copy, settings, history, new chat, offline state."""

from __future__ import annotations

import asyncio
import functools
import time

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
        await pilot.press(*"still here")
        assert app.query_one("#prompt").value == "still here"
