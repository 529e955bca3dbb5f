"""The `sparkit chat` app.

Streaming design (how it keeps up with a fast server without distorting tok/s): a reply is read
by a Textual thread worker (`@work(thread=True)`, its own event loop) that stamps every chunk with
time.perf_counter() on arrival (inside sparkit.client), so a slow redraw never delays a timestamp,
and posts typed messages to the app: ReplyStarted, ReplyChunk per chunk, then exactly one of
ReplyDone, ReplyStopped, ReplyFailed. The app writes the text to a MarkdownStream at most once per
painted frame, no sooner than the last frame's cost after it (text that arrives meanwhile waits
for the frame, then is written at once). When the reply ends, the rest is flushed and painted
first (that is when the user has the final text), then one full Markdown update runs and older
replies are settled into one widget each (Textual lays out the whole transcript whenever it
grows). Esc cancels the worker's task, which closes the HTTP stream so that the server frees the
slot; what waits for a reply to end (quit, a new chat, a signal) runs when its last message
arrives.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Header, Input, Markdown

from sparkit.client import EngineClient, Generation, StreamChunk
from sparkit.errors import EngineError
from sparkit.tui.clipboard import code_blocks, copy_fallback
from sparkit.tui.history import ChatStore
from sparkit.tui.reply_metrics import ReplyMetrics, SessionMetrics
from sparkit.tui.server_summary import ServerSummary, merge, summarize_run, summarize_server_info
from sparkit.tui.settings import ChatSettings
from sparkit.tui.widgets import HistoryScreen, MessageView, MetricsBar, Pane, ServerPanel, SettingsScreen

LIVE_REPLIES = 1  # the newest replies stay Markdown widgets; older ones are settled (MessageView.settle)
RENDER_INTERVAL_S = 0.05  # at most 20 screen updates a second while streaming
STOP_WAIT_S = 10.0  # how long a stopped reply may take to end before the app goes on without it
ONLINE_POLL_S = 10.0  # /health every 10 s while connected (SGLang's /health runs a 1-token generate)


class ReplyStarted(Message):
    """The request went out (its perf_counter time: where TTFT counts from)."""

    def __init__(self, stream: ReplyStream, t0: float) -> None:
        super().__init__()
        self.stream, self.t0 = stream, t0


class ReplyChunk(Message):
    """A streamed chunk, stamped on arrival."""

    def __init__(self, stream: ReplyStream, chunk: StreamChunk) -> None:
        super().__init__()
        self.stream, self.chunk = stream, chunk


class ReplyDone(Message):
    """The reply ended on its own: the server's final figures."""

    def __init__(self, stream: ReplyStream, generation: Generation) -> None:
        super().__init__()
        self.stream, self.generation = stream, generation


class ReplyStopped(Message):
    """The reply was stopped (Esc, quit, a signal) before it ended."""

    def __init__(self, stream: ReplyStream) -> None:
        super().__init__()
        self.stream = stream


class ReplyFailed(Message):
    """The stream broke: the server went away or answered with an error."""

    def __init__(self, stream: ReplyStream, error: str) -> None:
        super().__init__()
        self.stream, self.error = stream, error


REPLY_ENDS = (ReplyDone, ReplyStopped, ReplyFailed)


class ReplyStream:
    """One reply being read: what the app asks it for the request, and how to stop it from the
    app's thread (the worker's task is cancelled in the worker's own loop)."""

    def __init__(self, messages: list[dict[str, str]], *, model: str | None, settings: ChatSettings,
                 request_extra: dict[str, Any] | None = None) -> None:
        self.messages, self.model, self.settings = messages, model, settings
        self.request_extra = request_extra or {}
        self.ended = False  # its last message (one of REPLY_ENDS) was handled
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._stop_requested = threading.Event()

    def attach(self) -> None:
        """Called in the worker's loop: where stop() cancels."""
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        if self._stop_requested.is_set():
            self._task.cancel()  # type: ignore[union-attr]

    def stop(self) -> None:
        self._stop_requested.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop already closed: the reply ended on its own
                pass


class ChatApp(App):
    """Chat with a running SGLang-compatible server, with live speed figures."""

    CSS_PATH = "chat.tcss"
    TITLE = "sparkit chat"
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+o", "history", "History"),
        Binding("ctrl+y", "copy_reply", "Copy reply"),
        Binding("ctrl+l", "copy_code", "Copy code"),
        Binding("ctrl+t", "settings", "Settings"),
        Binding("ctrl+b", "toggle_panel", "Server panel"),
        Binding("ctrl+q", "quit", "Quit"),
        # Ctrl-C is how a terminal program is left: quit as Ctrl+Q does (Textual would only say
        # "press ctrl+q"; the prompt would take it as copy). Priority: whatever has the focus.
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        system_prompt: str | None = None,
        run: Any = None,
        store: ChatStore | None = None,
        settings: ChatSettings | None = None,
        health_interval: float | None = 1.0,
        open_conversation: int | None = None,
    ) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.model = model
        self.system_prompt = system_prompt
        self.run_dir = run
        self.store = store or ChatStore()
        self.settings = settings or ChatSettings()
        self.health_interval = health_interval
        self.initial_conversation = open_conversation
        self.request_extra: dict[str, Any] = {}  # extra request fields, e.g. {"ignore_eos": True} in tests
        self.connection_state = "connecting"
        self.server_answered = False  # once anything came back: later failures mean it went away
        self.conversation_id: int | None = None
        self.session = SessionMetrics()
        self.server_summary: ServerSummary | None = None
        # The reply being streamed.
        self._stream: ReplyStream | None = None
        self._reply: ReplyMetrics | None = None
        self._reply_view: MessageView | None = None
        self._reply_text = ""
        self._pending_text = ""  # received, not yet written to the Markdown stream
        self._frame_pending = False
        self._next_write_at = 0.0
        self._reply_message_id: int | None = None
        self._unsaved_reply: tuple[ReplyMetrics, MessageView, int] | None = None  # finished, not yet in the store
        self._md_stream = None
        self._write_timer = None  # a write of the pending text, due when the next frame may be written
        self._stop_timer = None  # gives up on a stopped reply's last message after STOP_WAIT_S
        self._after_reply: list[Callable[[], Awaitable[None]]] = []  # what waits for the reply to end
        self._last_health_check = 0.0
        self._health_busy = False
        self._client: EngineClient | None = None
        # Figures for tests and benchmarks/chat_stream.py.
        self.finished_replies: list[ReplyMetrics] = []
        self.display_latencies: list[float] = []  # last token arrival -> final text painted (s)
        self.reply_finished = asyncio.Event()
        # The signal (SIGINT, SIGTERM, SIGHUP) that is ending the app, if one is: the reply being
        # streamed is kept as far as it came, marked interrupted, and `sparkit chat` exits 130.
        self.interrupted_by: int | None = None

    # -- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield Pane(id="conversation")
            yield ServerPanel(id="server-panel")
        yield MetricsBar(id="metrics-bar")
        yield Input(placeholder="Message (Enter sends, Esc stops a reply)", id="prompt")
        yield Footer()

    async def on_mount(self) -> None:
        self.sub_title = f"{self.model or 'model ?'} @ {self.url}"
        self.query_one("#conversation", VerticalScroll).anchor()
        self._client = EngineClient(self.url, api_key=self.api_key)
        self._loop = asyncio.get_running_loop()
        self._app_context = contextvars.copy_context()
        # The reader thread must get the GIL promptly to stamp arrivals while the UI thread
        # renders Markdown (pure-Python work); 1 ms instead of CPython's 5 ms default.
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(0.001)
        self._show_summary()
        self.query_one(MetricsBar).show_connection(self.connection_state, self.url)
        self.query_one("#prompt", Input).focus()
        if self.initial_conversation is not None:
            await self.open_conversation(self.initial_conversation)
        if self.health_interval:
            self.set_interval(self.health_interval, self._poll_health)
            self.call_later(self._poll_health)
        self._catch_signals()

    def _catch_signals(self) -> None:
        """SIGINT (`kill -INT`, a terminal's Ctrl-C outside raw mode), SIGTERM and SIGHUP end the app
        as Ctrl+Q does, through the event loop rather than a KeyboardInterrupt in the middle of
        it: the partial reply is saved, nothing is printed over the screen."""
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                self._loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests), or no such signal
                pass

    def _on_signal(self, sig: int) -> None:
        if self.interrupted_by is not None:  # a second one: leave now, the reply is saved as it stood
            self.exit(return_code=128 + sig)
            return
        self.interrupted_by = sig
        self._loop.create_task(self._interrupted(sig), context=self._app_context)

    async def _interrupted(self, sig: int) -> None:
        async def leave() -> None:
            if self._unsaved_reply is not None:
                self._save_reply(*self._unsaved_reply)
            self.exit(return_code=128 + sig)

        await self._when_reply_ended(leave)

    async def on_unmount(self) -> None:
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                self._loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        sys.setswitchinterval(self._switch_interval)
        if self._stream is not None:
            self._stream.stop()
        if self._client is not None:
            await self._client.aclose()

    def _show_summary(self, info_summary: ServerSummary | None = None) -> None:
        run_summary = summarize_run(self.run_dir) if self.run_dir is not None else None
        self.server_summary = merge(run_summary, info_summary) or self.server_summary
        if self.server_summary and self.server_summary.recipe:
            self.title = f"sparkit chat · {self.server_summary.recipe}"
        self.query_one(ServerPanel).show(self.server_summary, self.url)

    # -- connection -------------------------------------------------------------------------------
    async def _poll_health(self) -> None:
        if self._health_busy or self._stream is not None or self._client is None:
            return
        now = time.monotonic()
        if self.connection_state == "online" and now - self._last_health_check < ONLINE_POLL_S:
            return
        self._health_busy = True
        try:
            self._last_health_check = now
            healthy = await self._client.health()
            if healthy and self.connection_state != "online":
                was_offline, had_answered = self.connection_state == "offline", self.server_answered
                self.server_answered = True
                self._set_connection("online")
                await self._fetch_server_info()
                if was_offline:
                    self.notify("server is back: reconnected" if had_answered else f"connected to {self.url}",
                                title="reconnected" if had_answered else "connected")
            elif not healthy and self.connection_state != "offline":
                self._set_connection("offline")
        finally:
            self._health_busy = False

    def _set_connection(self, state: str) -> None:
        self.connection_state = state
        self.query_one(MetricsBar).show_connection(state, self.url)

    async def _fetch_server_info(self) -> None:
        try:
            info = await self._client.server_info()
        except EngineError:
            info = None
        if info:
            if self.model is None:
                self.model = info.get("served_model_name") or None
            self.sub_title = f"{self.model or 'default model'} @ {self.url}"
            self._show_summary(summarize_server_info(info))

    # -- conversation -----------------------------------------------------------------------------
    @property
    def conversation_view(self) -> VerticalScroll:
        return self.query_one("#conversation", VerticalScroll)

    @property
    def streaming(self) -> bool:
        return self._stream is not None

    def message_views(self) -> list[MessageView]:
        return list(self.query(MessageView))

    def _api_messages(self) -> list[dict[str, str]]:
        assert self.conversation_id is not None
        conversation = self.store.load(self.conversation_id)
        return [{"role": m.role, "content": m.content} for m in conversation.messages if m.content]

    @on(Input.Submitted, "#prompt")
    async def on_prompt_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.streaming:
            self.notify("a reply is still streaming: Esc stops it", severity="warning")
            return
        event.input.value = ""
        await self.send(text)

    async def send(self, text: str) -> None:
        """Add the user's message and stream the reply."""
        self.reply_finished.clear()
        if self.conversation_id is None:
            self.conversation_id = self.store.new_conversation(
                text.splitlines()[0][:60], model=self.model, server_url=self.url, system_prompt=self.system_prompt
            )
            if self.system_prompt:
                self.store.add_message(self.conversation_id, "system", self.system_prompt)
        self.store.add_message(self.conversation_id, "user", text)
        messages = self._api_messages()
        view = self.conversation_view
        await view.mount(MessageView("user", text))
        reply_view = MessageView("assistant", "", status="streaming")
        await view.mount(reply_view)
        # Saved as interrupted until it ends, so a crash of the app leaves an honest mark.
        self._reply_message_id = self.store.add_message(self.conversation_id, "assistant", "", status="interrupted")
        self._reply_view = reply_view
        self._reply_text = ""
        self._pending_text = ""
        self._frame_pending = False
        self._next_write_at = 0.0
        self._reply = ReplyMetrics(t_start=time.perf_counter())
        self._md_stream = Markdown.get_stream(reply_view.markdown)
        self.query_one(MetricsBar).show_reply(self._reply)
        self._stream = ReplyStream(messages, model=self.model, settings=self.settings, request_extra=self.request_extra)
        self._read_reply(self._stream)

    @work(thread=True, group="reply", exit_on_error=False)
    async def _read_reply(self, stream: ReplyStream) -> None:
        """In the worker's own thread and loop: the reply's chunks as they arrive (stamped there),
        then how it ended, as messages to the app."""
        stream.attach()
        ended = False
        try:
            async with EngineClient(self.url, api_key=self.api_key) as client:
                s = stream.settings
                self.post_message(ReplyStarted(stream, time.perf_counter()))
                async for item in client.stream_chat(
                    stream.messages,
                    model=stream.model,
                    temperature=s.temperature,
                    top_p=s.top_p,
                    top_k=s.top_k,
                    max_tokens=s.max_tokens,
                    # Per-chunk usage (SGLang) makes live token counts exact under speculative decoding.
                    extra={"stream_options": {"include_usage": True, "continuous_usage_stats": True}, **stream.request_extra},
                ):
                    if isinstance(item, StreamChunk):
                        self.post_message(ReplyChunk(stream, item))
                    elif isinstance(item, Generation):
                        self.post_message(ReplyDone(stream, item))
                        ended = True
            if not ended:
                self.post_message(ReplyFailed(stream, "the stream ended before the reply's last chunk"))
        except asyncio.CancelledError:
            self.post_message(ReplyStopped(stream))
        except EngineError as exc:
            self.post_message(ReplyFailed(stream, exc.message))
        except Exception as exc:  # anything else from the network stack: keep the app alive
            self.post_message(ReplyFailed(stream, f"{type(exc).__name__}: {exc}"))

    @on(ReplyStarted)
    def _reply_started(self, message: ReplyStarted) -> None:
        if message.stream is self._stream and self._reply is not None:
            self._reply.t_start = message.t0

    @on(ReplyChunk)
    async def _reply_chunk(self, message: ReplyChunk) -> None:
        if message.stream is not self._stream or self._reply is None:
            return  # a stopped reply's last chunks, after the app went on
        chunk = message.chunk
        self._reply.on_chunk(chunk.t, chunk.new_tokens, counted_exactly="usage" in chunk.meta)
        self._pending_text += chunk.text
        await self._write_when_due()

    async def _write_when_due(self) -> None:
        """Write the pending text now when a frame may be written: at most once per frame the screen
        actually painted, and no sooner than RENDER_INTERVAL_S or the last frame's cost after it, so
        the event loop stays idle about half the time and the end of a reply is handled at once."""
        if self._frame_pending or self._write_timer is not None:
            return  # the painted frame, or the timer, writes it
        delay = self._next_write_at - time.perf_counter()
        if delay > 0:
            self._write_timer = self.set_timer(delay, self._write_due)
            return
        await self._write_pending()
        self.query_one(MetricsBar).show_reply(self._reply)

    async def _write_due(self) -> None:
        self._write_timer = None
        if self._stream is not None:
            await self._write_when_due()

    @on(ReplyDone)
    @on(ReplyStopped)
    @on(ReplyFailed)
    async def _reply_ended(self, message: ReplyDone | ReplyStopped | ReplyFailed) -> None:
        if message.stream is not self._stream:
            return
        if self._write_timer is not None:
            self._write_timer.stop()
            self._write_timer = None
        await self._write_pending()  # the rest at once: that is when the user has the final text
        self.query_one(MetricsBar).show_reply(self._reply)
        await self._finish(message)

    async def _write_pending(self) -> None:
        if not self._pending_text or self._md_stream is None:
            return
        piece, self._pending_text = self._pending_text, ""
        self._reply_text += piece
        await self._md_stream.write(piece)
        self._frame_pending = True
        self.call_after_refresh(self._frame_painted, time.perf_counter())

    def _frame_painted(self, t_written: float) -> None:
        now = time.perf_counter()
        self._frame_pending = False
        self._next_write_at = now + max(RENDER_INTERVAL_S, now - t_written)
        if self._pending_text and self._stream is not None and self._write_timer is None:
            self._write_timer = self.set_timer(self._next_write_at - now, self._write_due)

    async def _finish(self, final: ReplyDone | ReplyStopped | ReplyFailed) -> None:
        reply, view = self._reply, self._reply_view
        error: str | None = None
        if isinstance(final, ReplyDone):
            generation = final.generation
            status = "complete"
            reply.settle(completion_tokens=generation.completion_tokens, accept_length=generation.accept_length, status="done")
        elif isinstance(final, ReplyStopped):
            status = "interrupted" if self.interrupted_by is not None else "stopped"
            reply.settle(completion_tokens=None, accept_length=None, status="stopped")
        else:
            status, error = "interrupted", final.error
            reply.settle(completion_tokens=None, accept_length=None, status="error")
        final.stream.ended = True
        self._stream = None
        if self._stop_timer is not None:
            self._stop_timer.stop()
            self._stop_timer = None
        await self._md_stream.stop()  # appends what is still pending
        self._md_stream = None
        async with view.markdown.lock:  # an append still in flight finishes first
            pass
        view.content = self._reply_text
        view.set_status(status, error=error, metrics=reply)
        if reply.t_first is not None or status == "complete":
            self.server_answered = True
        self.session.add(reply, message_id=self._reply_message_id)
        self.finished_replies.append(reply)
        bar = self.query_one(MetricsBar)
        bar.show_reply(reply)
        bar.show_session(self.session.tok_s_series, self.session.mean_tok_s, self.session.mean_accept_length)
        if error is not None:
            if self.server_answered:
                self.notify(f"{error}\nthe partial reply is kept; reconnecting when the server is back",
                            title="server went away", severity="error", timeout=8)
            else:  # it never answered: nothing went away, nothing is there
                self.notify(f"{error}\nyour message is kept; the chat connects once a server answers there",
                            title=f"no server answered at {self.url}", severity="error", timeout=8)
            self._set_connection("offline")
        elif self.connection_state != "online" and status == "complete":
            self._set_connection("online")
        self._unsaved_reply = (reply, view, self._reply_message_id)
        self.call_after_refresh(self._painted, reply, view, self._reply_message_id)
        waiting, self._after_reply = self._after_reply, []
        for then in waiting:
            await then()

    def _painted(self, reply: ReplyMetrics, view: MessageView, message_id: int) -> None:
        # The streamed text is complete and painted: that is when the user has the final text.
        if reply.t_last is not None:
            self.display_latencies.append(time.perf_counter() - reply.t_last)
        self._save_reply(reply, view, message_id)
        self.run_worker(self._full_update(view), group="markdown-final")

    def _save_reply(self, reply: ReplyMetrics, view: MessageView, message_id: int) -> None:
        # Saved after the paint: a commit (fsync) must not delay the final text.
        if self._unsaved_reply is not None and self._unsaved_reply[2] == message_id:
            self._unsaved_reply = None
        self.store.update_message(message_id, content=view.content, status=view.status, metrics=reply.to_dict())

    async def _full_update(self, view: MessageView) -> None:
        # One full parse of the final text after the paint, so a long reply is never held back
        # by it; incremental appends re-parse only the last block, the full update fixes any
        # block boundary they saw differently.
        await view.markdown.update(view.content)
        await self._settle_older_replies()
        self.reply_finished.set()

    async def _settle_older_replies(self) -> None:
        replies = [v for v in self.message_views() if v.role == "assistant" and v.status != "streaming"]
        for view in replies[:-LIVE_REPLIES]:
            await view.settle()

    # -- actions ----------------------------------------------------------------------------------
    async def action_quit(self) -> None:
        """Ctrl+Q and Ctrl-C: a reply still streaming is stopped and kept (marked partial), the
        last reply is in the store, then the app exits (`sparkit chat` exits 0)."""
        async def leave() -> None:
            if self._unsaved_reply is not None:  # finished but its paint (and save) did not come yet
                self._save_reply(*self._unsaved_reply)
            self.exit()

        await self._when_reply_ended(leave)

    def action_stop(self) -> None:
        if isinstance(self.screen, (SettingsScreen, HistoryScreen)):
            self.screen.dismiss(None)
            return
        if self._stream is not None:
            self._stream.stop()

    async def _when_reply_ended(self, then: Callable[[], Awaitable[None]]) -> None:
        """Run `then` once no reply is streaming: at once, or (the reply stopped) when its last
        message has been handled, or after STOP_WAIT_S without one (the reply then ends stopped)."""
        stream = self._stream
        if stream is None:
            await then()
            return
        self._after_reply.append(then)
        stream.stop()
        if self._stop_timer is None:
            self._stop_timer = self.set_timer(STOP_WAIT_S, lambda: self._reply_ended(ReplyStopped(stream)))

    async def action_new_chat(self) -> None:
        await self._when_reply_ended(self._new_chat)

    async def _new_chat(self) -> None:
        self.conversation_id = None
        await self.conversation_view.remove_children()
        self.query_one(MetricsBar).show_reply(None)
        self.query_one("#prompt", Input).focus()

    def action_history(self) -> None:
        async def chosen(conversation_id: int | None) -> None:
            if conversation_id is not None:
                await self.open_conversation(conversation_id)

        self.push_screen(HistoryScreen(self.store.list_conversations()), chosen)

    async def open_conversation(self, conversation_id: int) -> None:
        """Show a stored conversation and continue it (once a reply streaming now has ended)."""
        await self._when_reply_ended(lambda: self._open_conversation(conversation_id))

    async def _open_conversation(self, conversation_id: int) -> None:
        conversation = self.store.load(conversation_id)
        if conversation is None:
            self.notify(f"no saved chat with id {conversation_id}", severity="error")
            return
        self.conversation_id = conversation.id
        if conversation.system_prompt:
            self.system_prompt = conversation.system_prompt
        view = self.conversation_view
        await view.remove_children()
        views = []
        last: ReplyMetrics | None = None
        assistant_left = sum(1 for m in conversation.messages if m.role == "assistant")
        for message in conversation.messages:
            if message.role == "assistant":
                assistant_left -= 1
            metrics = ReplyMetrics.from_dict(message.metrics) if message.metrics else None
            if metrics is not None:
                # Counted once per saved reply: a chat reopened (again, or after its replies were
                # made in this session) adds nothing twice to the figures.
                self.session.add(metrics, message_id=message.id)
                last = metrics
            views.append(MessageView(message.role, message.content, status=message.status, metrics=metrics,
                                     settled=message.role == "assistant" and assistant_left >= LIVE_REPLIES))
        await view.mount_all(views)
        for v in views:
            if v.status in ("stopped", "interrupted"):
                v.set_status(v.status, metrics=v.metrics)
        bar = self.query_one(MetricsBar)
        bar.show_reply(last)
        bar.show_session(self.session.tok_s_series, self.session.mean_tok_s, self.session.mean_accept_length)
        view.scroll_end(animate=False)
        self.query_one("#prompt", Input).focus()

    def last_reply_text(self) -> str | None:
        for view in reversed(self.message_views()):
            if view.role == "assistant" and view.status != "streaming":
                return view.content if view.content else self._view_text(view)
        return None

    def _view_text(self, view: MessageView) -> str:
        return view.markdown.source if view.role == "assistant" and not view.settled else view.content

    def _copy(self, text: str, what: str) -> None:
        self.copy_to_clipboard(text)  # OSC 52
        where = copy_fallback(text)
        self.notify(f"copied {what} ({len(text)} chars) via OSC 52; also {', '.join(where)}", title="copied")

    def action_copy_reply(self) -> None:
        text = self.last_reply_text()
        if not text:
            self.notify("no reply to copy yet", severity="warning")
            return
        self._copy(text, "the last reply")

    def action_copy_code(self) -> None:
        text = self.last_reply_text() or ""
        blocks = code_blocks(text)
        if not blocks:
            self.notify("the last reply has no code block", severity="warning")
            return
        self._copy(blocks[-1], "the last code block")

    def action_settings(self) -> None:
        def saved(settings: ChatSettings | None) -> None:
            if settings is not None:
                self.settings = settings
                self.notify(
                    f"temperature {settings.temperature}, top_p {settings.top_p}, top_k {settings.top_k}, "
                    f"max tokens {settings.max_tokens}",
                    title="settings saved",
                )

        self.push_screen(SettingsScreen(self.settings), saved)

    def action_toggle_panel(self) -> None:
        panel = self.query_one(ServerPanel)
        panel.display = not panel.display


def create_app(
    url: str,
    *,
    api_key: str | None = None,
    model: str | None = None,
    system_prompt: str | None = None,
    run: Any = None,
    store_path: Path | None = None,
    settings: ChatSettings | None = None,
    health_interval: float | None = 1.0,
    open_conversation: int | None = None,
    store: ChatStore | None = None,
) -> ChatApp:
    """Build the chat app (tests and benchmarks build it here, the CLI too). `store`: an open
    history (else the one at `store_path`, by default sparkit's)."""
    return ChatApp(
        url,
        api_key=api_key,
        model=model,
        system_prompt=system_prompt,
        run=run,
        store=store or ChatStore(store_path),
        settings=settings,
        health_interval=health_interval,
        open_conversation=open_conversation,
    )
