"""The chat app, driven by Pilot, against real embedded-engine server processes."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time

import httpx
import pytest

from sparkit.tui.app import create_app
from sparkit.tui.history import ChatStore
from sparkit.tui.settings import ChatSettings

pytestmark = pytest.mark.e2e


def run_async(test):
    """Run an async test body with asyncio.run (no asyncio plugin needed)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return wrapper

SIZE = (120, 40)
WAIT_S = 120.0  # generous: the CI box is a shared 2-core machine


async def wait_until(pilot, condition, timeout: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def type_and_send(pilot, text: str) -> None:
    pilot.app.query_one("#prompt").focus()
    await pilot.press(*text)
    await pilot.press("enter")


@run_async
async def test_a_message_gets_a_streamed_reply_with_live_speed_figures(embedded_server, tmp_path):
    app = create_app(embedded_server.url, store_path=tmp_path / "chat.sqlite3",
                     settings=ChatSettings(temperature=0.0, max_tokens=48))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.connection_state == "online", what="connection")
        await type_and_send(pilot, "hello there")
        await wait_until(pilot, lambda: app.reply_finished.is_set(), what="the reply")
        reply_view = app.message_views()[-1]
        assert reply_view.role == "assistant" and reply_view.status == "complete"
        assert reply_view.content.strip(), "the reply is empty"
        assert reply_view.markdown.source == reply_view.content  # the final text is what is shown

        reply = app.finished_replies[-1]
        assert reply.decode_tok_s and reply.decode_tok_s > 0
        assert reply.ttft is not None and reply.ttft > 0
        assert reply.exact and 2 <= reply.output_tokens <= 48  # the server's usage count replaced the live one
        assert reply.accept_length is not None and reply.accept_length >= 1.0  # NEXTN 3/1/4 server
        bar_text = str(app.query_one("#reply-metrics").render())
        assert "tok/s" in bar_text and "– tok/s" not in bar_text and "accept" in bar_text
        assert app.query_one("#tok-s-spark").data == [reply.decode_tok_s]
        # The side panel shows what /server_info reports.
        panel = str(app.query_one("#server-text").render())
        assert "NEXTN" in panel or "EAGLE" in panel


@run_async
async def test_escape_stops_a_long_reply_and_the_server_frees_the_slot(embedded_server, tmp_path):
    app = create_app(embedded_server.url, store_path=tmp_path / "chat.sqlite3",
                     settings=ChatSettings(temperature=0.8, max_tokens=1500))
    app.request_extra = {"ignore_eos": True}  # tiny-ling ends replies early; this one must run long
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.connection_state == "online", what="connection")
        await type_and_send(pilot, "tell me a very long story")
        await wait_until(pilot, lambda: app._reply is not None and app._reply.output_tokens >= 5, what="first tokens")
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.reply_finished.is_set(), what="the stop")
        view = app.message_views()[-1]
        assert view.status == "stopped"
        assert view.content, "the partial reply was dropped"
        assert app.finished_replies[-1].output_tokens < 1500
        # The server is free again: a new request completes (the embedded server runs one at a time).
        async with httpx.AsyncClient(timeout=60) as http:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            response = await http.post(embedded_server.url + "/v1/chat/completions", json=body)
        assert response.status_code == 200
    stored = ChatStore(tmp_path / "chat.sqlite3").list_conversations()
    conversation = ChatStore(tmp_path / "chat.sqlite3").load(stored[0].id)
    assert conversation.messages[-1].status == "stopped"


@run_async
async def test_ctrl_c_mid_reply_quits_and_keeps_the_partial_reply(embedded_server, tmp_path):
    store_path = tmp_path / "chat.sqlite3"
    app = create_app(embedded_server.url, store_path=store_path, settings=ChatSettings(temperature=0.8, max_tokens=1500))
    app.request_extra = {"ignore_eos": True}
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.connection_state == "online", what="connection")
        await type_and_send(pilot, "tell me a very long story")
        await wait_until(pilot, lambda: app._reply is not None and app._reply.output_tokens >= 5, what="first tokens")
        conversation_id = app.conversation_id
        await pilot.press("ctrl+c")
        await wait_until(pilot, lambda: not app.is_running, what="the app to quit")
        assert app.return_code == 0
    reply = ChatStore(store_path).load(conversation_id).messages[-1]
    assert reply.role == "assistant" and reply.status == "stopped" and reply.content  # kept, marked partial
    assert reply.metrics and 5 <= reply.metrics["output_tokens"] < 1500


def test_sparkit_chat_exits_0_on_ctrl_c(embedded_server, tmp_path):
    """The real command on a real terminal: Ctrl-C (the byte a terminal sends) ends it with 0."""
    import pty
    import select
    import subprocess
    import sys

    env = {**os.environ, "SPARKIT_HOME": str(tmp_path / "home"), "TERM": "xterm-256color"}
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "sparkit", "chat", "--url", embedded_server.url],
                            stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True, start_new_session=True)
    os.close(slave)
    drawn = b""
    try:
        deadline = time.monotonic() + WAIT_S
        while b"online" not in drawn and time.monotonic() < deadline:  # the app is up and connected
            if select.select([master], [], [], 0.5)[0]:
                drawn += os.read(master, 65536)
        assert b"online" in drawn, drawn[-2000:]
        os.write(master, b"\x03")
        # Read what it draws while it ends: a terminal nobody reads fills up and blocks the app's last
        # writes (restoring the screen), so it never exits (CI saw the old `wait(timeout=30)` expire).
        deadline = time.monotonic() + WAIT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    drawn += os.read(master, 65536)
                except OSError:  # EIO: the app closed its end
                    break
        code = proc.wait(timeout=WAIT_S)
        assert code == 0, drawn[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)


def test_a_history_damaged_while_chatting_ends_the_command_with_exit_8_and_no_locals(embedded_server, tmp_path):
    """The real command on a real terminal: the history file is damaged while the screen is up
    (every page but the first), then Ctrl+O reads it. The screen ends, exit 8, the file and the
    command that moves it aside are named, and no traceback or local variable (chat titles) is
    printed."""
    import pty
    import select
    import subprocess
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from test_history import TITLE, filled_history

    home = tmp_path / "home"
    path = filled_history(home / "data" / "chat.sqlite3")
    env = {**os.environ, "SPARKIT_HOME": str(home), "TERM": "xterm-256color"}
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "sparkit", "chat", "--url", embedded_server.url],
                            stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True, start_new_session=True)
    os.close(slave)
    drawn = b""

    def read_some() -> None:
        nonlocal drawn
        if select.select([master], [], [], 0.5)[0]:
            try:
                drawn += os.read(master, 65536)
            except OSError:  # EIO: the command exited and closed the terminal
                pass

    try:
        deadline = time.monotonic() + WAIT_S
        while b"online" not in drawn and time.monotonic() < deadline:
            read_some()
        assert b"online" in drawn, drawn[-2000:]
        with open(path, "r+b") as handle:
            size = path.stat().st_size
            handle.seek(4096)
            handle.write(b"\xa5" * (size - 4096))
            handle.seek(24)
            counter = int.from_bytes(handle.read(4), "big")
            handle.seek(24)
            handle.write((counter + 1).to_bytes(4, "big"))
        os.write(master, b"\x0f")  # Ctrl+O: the history list reads the damaged file
        while proc.poll() is None and time.monotonic() < deadline:
            read_some()
        for _ in range(4):
            read_some()
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    text = drawn.decode("utf-8", "replace")
    assert code == 8, text[-3000:]
    assert "the chat history cannot be used" in text and "mv " in text
    assert "Traceback" not in text and "locals" not in text.lower() and TITLE not in text


@run_async
async def test_history_reopens_after_a_restart(embedded_server, tmp_path):
    store_path = tmp_path / "chat.sqlite3"
    first = create_app(embedded_server.url, store_path=store_path, settings=ChatSettings(temperature=0.0, max_tokens=16))
    async with first.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: first.connection_state == "online", what="connection")
        await type_and_send(pilot, "remember this line")
        await wait_until(pilot, lambda: first.reply_finished.is_set(), what="the reply")
        said = first.message_views()[-1].content
        tok_s = first.finished_replies[-1].decode_tok_s

    second = create_app(embedded_server.url, store_path=store_path)
    async with second.run_test(size=SIZE) as pilot:
        assert second.message_views() == []
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: second.screen.__class__.__name__ == "HistoryScreen", what="history")
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(second.message_views()) == 2, what="the reopened chat")
        user, assistant = second.message_views()
        assert user.content == "remember this line"
        assert assistant.content == said
        assert assistant.metrics.decode_tok_s == pytest.approx(tok_s)
        # The chat continues where it was: the next message goes to the same conversation.
        conversation_id = second.conversation_id
        await type_and_send(pilot, "and one more")
        await wait_until(pilot, lambda: second.reply_finished.is_set(), what="the next reply")
        assert len(ChatStore(store_path).load(conversation_id).messages) == 4
        # The older reply is settled into one widget (layout cost stays flat) and keeps its text.
        older = second.message_views()[1]
        assert older.settled and not older.query("Markdown") and older.content == said


@run_async
async def test_a_server_killed_mid_reply_keeps_the_partial_text_and_reconnects(start_embedded_server, tmp_path):
    # 20 ms per step: the 1500-token reply takes many seconds on any machine, so it is still
    # streaming when the kill comes (a fast server could otherwise have sent it all to the socket
    # before the app, busy rendering, has shown its first tokens).
    server = start_embedded_server(debug_step_delay_ms=20)
    port = int(server.url.rsplit(":", 1)[1])
    app = create_app(server.url, store_path=tmp_path / "chat.sqlite3",
                     settings=ChatSettings(temperature=0.8, max_tokens=1500), health_interval=0.5)
    app.request_extra = {"ignore_eos": True}
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.connection_state == "online", what="connection")
        await type_and_send(pilot, "a long answer please")
        await wait_until(pilot, lambda: app._reply is not None and app._reply.output_tokens >= 5, what="first tokens")
        # SIGKILL at once: under SIGTERM the server drains the stream, and a fast engine can
        # finish the whole reply within that grace period (seen when the suite runs loaded).
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        await wait_until(pilot, lambda: app.reply_finished.is_set(), what="the broken stream")
        view = app.message_views()[-1]
        assert view.status == "interrupted"
        assert view.content, "the partial reply was dropped"
        assert "interrupted" in str(view.query_one(".role").render())
        assert "server went away" in [n.title for n in app._notifications]  # it had answered: it went away
        assert app.connection_state == "offline"
        stored = ChatStore(tmp_path / "chat.sqlite3").load(app.conversation_id)
        assert stored.messages[-1].status == "interrupted" and stored.messages[-1].content == view.content

        # The app keeps running, and reconnects when a server is back on that port.
        start_embedded_server(port=port)
        await wait_until(pilot, lambda: app.connection_state == "online", what="reconnection")
        app.reply_finished.clear()
        app.settings = ChatSettings(temperature=0.0, max_tokens=8)
        await type_and_send(pilot, "are you back?")
        await wait_until(pilot, lambda: app.reply_finished.is_set(), what="a reply after reconnecting")
        assert app.message_views()[-1].status == "complete"


@run_async
async def test_a_stopped_replys_late_chunks_never_reach_the_next_reply(start_embedded_server, tmp_path):
    """The reader is a thread worker posting typed messages; one that arrives after its reply was
    stopped (the worker's last chunks race the stop) belongs to that reply, not to the one the user
    started since. 20 ms per engine step: each reply streams for seconds on any machine."""
    from sparkit.client import StreamChunk
    from sparkit.tui.app import ReplyChunk

    server = start_embedded_server(debug_step_delay_ms=20)
    app = create_app(server.url, store_path=tmp_path / "chat.sqlite3",
                     settings=ChatSettings(temperature=0.0, max_tokens=400))
    app.request_extra = {"ignore_eos": True}
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.connection_state == "online", what="connection")
        await type_and_send(pilot, "tell me a story")
        await wait_until(pilot, lambda: app._reply is not None and app._reply.output_tokens >= 2, what="first tokens")
        first = app._stream
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.reply_finished.is_set(), what="the stop")
        app.reply_finished.clear()
        await type_and_send(pilot, "count: one two three")
        await wait_until(pilot, lambda: app._stream is not None and app._stream is not first
                         and app._reply.output_tokens >= 2, what="the second reply's first tokens")
        app.post_message(ReplyChunk(first, StreamChunk(time.perf_counter(), " LATE CHUNK", 1, 99)))
        await wait_until(pilot, lambda: app.reply_finished.is_set(), what="the second reply")
        second = app.message_views()[-1]
        assert second.status == "complete" and second.content and "LATE CHUNK" not in second.content
