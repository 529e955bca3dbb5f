"""Widgets of the chat app. Textual is imported here, so only app.py imports this module."""

from __future__ import annotations

import datetime

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.scrollbar import ScrollBarRender
from textual.widgets import Button, Input, Label, Markdown, OptionList, Sparkline, Static
from textual.widgets.option_list import Option

from sparkit.tui.history import Conversation
from sparkit.tui.reply_metrics import ReplyMetrics, format_reply
from sparkit.tui.server_summary import ServerSummary
from sparkit.tui.settings import ChatSettings, parse_settings

STATUS_MARKS = {
    "complete": "",
    "streaming": "streaming…",
    "stopped": "stopped (partial)",
    "interrupted": "interrupted (partial)",  # the error is shown live; a reopened chat no longer knows it
}


class WholeCellScrollBarRender(ScrollBarRender):
    """A scrollbar thumb of whole cells only. Textual ends the thumb with eighth-block glyphs
    (▂▄▆, two columns wide); copied or captured as text (tmux capture-pane, a screenshot of
    the text) they are a stray `▂▂` beside the server panel."""

    VERTICAL_BARS = [" "] * len(ScrollBarRender.VERTICAL_BARS)
    HORIZONTAL_BARS = [" "] * len(ScrollBarRender.HORIZONTAL_BARS)


class Pane(VerticalScroll):
    """A scrolling pane of the chat (transcript, server panel) with a whole-cell scrollbar."""

    def on_mount(self) -> None:
        self.vertical_scrollbar.renderer = WholeCellScrollBarRender


class SpeedSparkline(Sparkline):
    """tok/s over the session's replies; a dash until there are two to compare (with none,
    Textual draws a row of ▁, with one a full bar: neither says anything)."""

    def render(self):
        if len(self.data or []) < 2:
            return Text("–", style="dim")
        return super().render()


class MessageView(Vertical):
    """One message: a role line (with the reply's status and figures) and its text."""

    def __init__(
        self,
        role: str,
        content: str = "",
        *,
        status: str = "complete",
        metrics: ReplyMetrics | None = None,
        settled: bool = False,
    ) -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self.settled = settled
        self.content = content
        self.status = status
        self.metrics = metrics
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(self._label_text(), classes="role", markup=False)
        if self.role == "assistant" and self.settled:
            yield self._settled_body()
        elif self.role == "assistant":
            yield Markdown(self.content, classes="body")
        else:
            yield Static(self.content, classes="body", markup=False)

    def _label_text(self) -> Text:
        text = Text("you" if self.role == "user" else self.role, style="bold")
        mark = STATUS_MARKS.get(self.status, self.status)
        if self.error and self.status == "interrupted":
            mark = f"interrupted: {self.error} (partial)"
        if mark:
            text.append(f"  [{mark}]", style="bold yellow" if self.status != "streaming" else "dim")
        if self.metrics is not None and self.status != "streaming":
            text.append("  " + format_reply(self.metrics, with_status=False), style="dim")
        return text

    @property
    def markdown(self) -> Markdown:
        return self.query_one(Markdown)

    def _settled_body(self) -> Static:
        from rich.markdown import Markdown as RichMarkdown

        return Static(RichMarkdown(self.content), classes="body settled")

    async def settle(self) -> None:
        """Swap the Markdown widget tree for one Static rendering the same Markdown.

        Textual lays out every widget of the transcript whenever anything grows, so each
        old reply kept as a Markdown tree (dozens of widgets for a list or code) slows the
        streaming of every later one; a settled reply is one widget.
        """
        if self.settled or self.role != "assistant" or self.status == "streaming":
            return
        self.settled = True
        await self.query_one(Markdown).remove()
        await self.mount(self._settled_body())

    def set_status(self, status: str, *, error: str | None = None, metrics: ReplyMetrics | None = None) -> None:
        self.status = status
        self.error = error
        if metrics is not None:
            self.metrics = metrics
        self.set_class(status in ("stopped", "interrupted"), "partial")
        self.query_one(".role", Static).update(self._label_text())


class MetricsBar(Horizontal):
    """Live figures of the current (or last) reply, a sparkline of tok/s, and the connection state.

    Laid out to its width by what matters most: the reply's figures whole (values and units, the
    accept length included), then the connection state, then the session's figures, and the
    sparkline in whatever room is left; what does not fit is hidden, never cut."""

    SPARK_MIN, SPARK_MAX = 8, 30

    def compose(self) -> ComposeResult:
        yield Static("no reply yet", id="reply-metrics", markup=False)
        yield SpeedSparkline([], id="tok-s-spark", summary_function=max)
        yield Static("", id="session-metrics", markup=False)
        yield Static("connecting…", id="connection", markup=False)

    def on_mount(self) -> None:
        self._texts = {"reply-metrics": "no reply yet", "session-metrics": "", "connection": "connecting…"}
        self._fit()

    def on_resize(self) -> None:
        self._fit()

    def _show(self, widget_id: str, text: str) -> None:
        self._texts[widget_id] = text
        self.query_one(f"#{widget_id}", Static).update(text)
        self._fit()

    def _fit(self) -> None:
        from rich.cells import cell_len

        width = self.content_size.width
        if not width:
            return
        reply, session, connection = (cell_len(self._texts[k]) for k in ("reply-metrics", "session-metrics", "connection"))
        used = reply + (1 + connection if connection else 0)
        show_session = bool(session) and used + 1 + session <= width
        used += 1 + session if show_session else 0
        spark = min(self.SPARK_MAX, width - used - 2)  # its margin, a cell each side
        widths = {"reply-metrics": max(min(reply, width - (1 + connection if connection else 0)), 1),
                  "session-metrics": session, "connection": connection + 1}
        for widget_id, cells in widths.items():
            self.query_one(f"#{widget_id}", Static).styles.width = cells
        self.query_one("#session-metrics", Static).display = show_session
        sparkline = self.query_one(Sparkline)
        sparkline.display = spark >= self.SPARK_MIN
        if spark >= self.SPARK_MIN:
            sparkline.styles.width = spark
        else:  # the room the sparkline would have had goes to the figures before it: the state stays right
            self.query_one("#session-metrics" if show_session else "#reply-metrics", Static).styles.width = "1fr"

    def show_reply(self, reply: ReplyMetrics | None) -> None:
        self._show("reply-metrics", format_reply(reply))

    def show_session(self, series: list[float], mean: float | None, accept: float | None) -> None:
        self.query_one(Sparkline).data = list(series[-60:])
        parts = [f"{len(series)} repl{'y' if len(series) == 1 else 'ies'}"]
        if mean is not None:
            parts.append(f"mean {mean:.0f} tok/s")
        if accept is not None:
            parts.append(f"acc {accept:.2f}")
        self._show("session-metrics", " · ".join(parts))

    def show_connection(self, state: str, url: str) -> None:
        label = self.query_one("#connection", Static)
        label.set_class(state == "online", "online")
        label.set_class(state != "online", "offline")
        label.tooltip = url
        self._show("connection", f"● {state}" if state == "online" else f"○ {state}")


class ServerPanel(Pane):
    """The server's recipe and startup-check status."""

    def compose(self) -> ComposeResult:
        yield Static("server: waiting for /server_info…", id="server-text", markup=False)

    def show(self, summary: ServerSummary | None, url: str) -> None:
        text = Text()
        text.append("server\n", style="bold")
        text.append(f"{url}\n", style="dim")
        if summary is None:
            text.append("no server information yet\n", style="dim")
        else:
            text.append("recipe: ", style="bold")
            text.append(f"{summary.recipe or '(unknown)'}\n")
            text.append(f"from {summary.source}\n", style="dim")
            # The checks first: whether the optimisations are active is what this panel is for.
            text.append("\nstartup checks\n", style="bold")
            if not summary.checks:
                text.append(f"{summary.checks_note or 'none recorded'}\n", style="dim")
            styles = {"pass": ("✓", "green"), "fail": ("✗", "bold red"), "warn": ("!", "yellow"), "skip": ("-", "dim")}
            for check in summary.checks:
                mark, style = styles.get(check.status, ("?", "dim"))
                text.append(f"{mark} ", style=style)
                text.append(f"{check.name}", style=style if check.status == "fail" else "")
                text.append(f" {check.status}\n", style=style)
                if check.status in ("fail", "warn") and check.detail:
                    text.append(f"  {check.detail}\n", style="dim")
            text.append("\n")
            for label, value in summary.facts:
                text.append(f"{label}: ", style="bold")
                text.append(f"{value}\n")
        self.query_one("#server-text", Static).update(text)


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """Sampling settings; Save validates, Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, settings: ChatSettings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-dialog", classes="dialog"):
            yield Label("Sampling settings", classes="dialog-title")
            for name, kind in (("temperature", "number"), ("top_p", "number"), ("top_k", "integer"), ("max_tokens", "integer")):
                with Horizontal(classes="field"):
                    yield Label(name, classes="field-label")
                    yield Input(str(getattr(self.settings, name)), id=f"set-{name}", type=kind)
            yield Static("", id="settings-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save", id="settings-save", variant="primary")
                yield Button("Cancel", id="settings-cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "settings-save":
            self.action_save()
        else:
            self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_save()

    def action_save(self) -> None:
        values = {name: self.query_one(f"#set-{name}", Input).value for name in ("temperature", "top_p", "top_k", "max_tokens")}
        try:
            self.dismiss(parse_settings(values))
        except ValueError as exc:
            self.query_one("#settings-error", Static).update(str(exc))

    def action_cancel(self) -> None:
        self.dismiss(None)


class HistoryScreen(ModalScreen[int | None]):
    """Past conversations, newest first; Enter reopens one."""

    BINDINGS = [Binding("escape", "cancel", "Close")]

    def __init__(self, conversations: list[Conversation]) -> None:
        super().__init__()
        self.conversations = conversations

    def compose(self) -> ComposeResult:
        with Vertical(id="history-dialog", classes="dialog"):
            yield Label("Chat history (Enter opens, Esc closes)", classes="dialog-title")
            if not self.conversations:
                yield Static("no saved chats yet", markup=False)
            options = []
            for c in self.conversations:
                when = datetime.datetime.fromtimestamp(c.updated_at).strftime("%Y-%m-%d %H:%M")
                options.append(Option(f"{when}  {c.title}", id=str(c.id)))
            yield OptionList(*options, id="history-list")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id) if event.option.id else None)

    def action_cancel(self) -> None:
        self.dismiss(None)
