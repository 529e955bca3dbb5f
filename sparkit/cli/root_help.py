"""The `sparkit --help` screen, drawn from sparkit.cli.commands alone, without typer or rich:
importing typer alone costs nearly three times a bare interpreter's start, and this is the screen
a newcomer opens first (benchmarks/cli_startup.py measures it).

The screen is the one typer's rich help draws for the root group, character for character and
escape for escape: the usage, the help, the Options and Commands panels, wrapped at the width rich
would choose (COLUMNS, else the terminal's, else 80), coloured when stdout is a terminal. Where
rich could decide otherwise or draw differently (FORCE_COLOR, NO_COLOR, TTY_COMPATIBLE or typer's
TERMINAL_WIDTH set, a dumb terminal, Jupyter, Windows, a stdout that is not UTF-8, a terminal too
narrow for a word or an option row, markup in a summary), `root_help` returns None and typer
draws the screen itself. tests/cli/test_root_help.py holds the two side by side at many widths,
on a terminal and piped."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from sparkit.cli.commands import COMMANDS, ROOT_OPTIONS, SPARKIT_HELP, USAGE

# The environment that makes rich or typer decide colour, terminal or width on their own.
_THEIR_SETTINGS = ("FORCE_COLOR", "PY_COLORS", "GITHUB_ACTIONS", "NO_COLOR", "TTY_COMPATIBLE", "TERMINAL_WIDTH",
                   "_TYPER_FORCE_DISABLE_TERMINAL")
# What typer's highlighter colours in help text: --options (bold cyan) and -s switches (bold green).
_OPTION = re.compile(r"(^|\W)(\-\-[\w\-]+)(?![a-zA-Z0-9])")
_SWITCH = re.compile(r"(^|\W)(\-\w+)(?![a-zA-Z0-9])")
# Text rich would read as markup, an emoji code, a type (`<int>`) or the usage label: not drawn here.
_NOT_PLAIN = re.compile(r"[\[\]\\<>\x1b]|:\S*?:|Usage: |\s\s|[^ -~]")
_BOLD, _USAGE, _OPTION_STYLE, _SWITCH_STYLE, _BORDER = "1", "1;33", "1;36", "1;32", "2"


def root_help(stream: Any = None, environ: Any = None) -> str | None:
    """The root --help screen as typer would write it to `stream` (sys.stdout), or None where
    only typer can say."""
    stream = sys.stdout if stream is None else stream
    environ = os.environ if environ is None else environ
    if sys.platform == "win32" or any(name in environ for name in _THEIR_SETTINGS) or _in_jupyter():
        return None
    if not (getattr(stream, "encoding", None) or "utf-8").lower().startswith("utf"):
        return None  # rich draws its boxes in ASCII there
    terminal = _is_terminal(stream)
    if terminal and environ.get("TERM", "").lower() in ("dumb", "unknown"):
        return None
    texts = [SPARKIT_HELP, *(help for _, help in ROOT_OPTIONS), *(info.summary for info in COMMANDS.values())]
    if any(_NOT_PLAIN.search(text) for text in texts):
        return None
    return _Screen(_width(environ), terminal).draw()


def _in_jupyter() -> bool:
    import builtins

    return hasattr(builtins, "get_ipython")


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _width(environ: Any) -> int:
    """rich's: COLUMNS, else the size of the first of stdin, stdout, stderr that is a terminal, else 80."""
    columns = environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns)
    for fd in (0, 1, 2):
        try:
            return os.get_terminal_size(fd).columns or 80
        except (AttributeError, ValueError, OSError):
            continue
    return 80


def _wrap(text: str, width: int) -> list[str] | None:
    """rich's word wrap of single-spaced text: as many words on a line as fit; None where a word
    alone is wider than the line (rich folds it)."""
    lines: list[str] = []
    for word in text.split(" "):
        if len(word) > width:
            return None
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


class _Screen:
    """The screen at `width` columns, with escapes on a terminal (`colour`)."""

    def __init__(self, width: int, colour: bool) -> None:
        self.width, self.colour = width, colour

    def paint(self, text: str, style: str) -> str:
        return f"\x1b[{style}m{text}\x1b[0m" if self.colour and text else text

    def highlighted(self, text: str) -> str:
        """Help text with its --options and -s switches coloured as typer's highlighter colours
        them: rich writes one segment per stretch between the edges of any match (`--keep-on-fail`
        is four: `-`, `-keep`, `-on`, `-fail`), an option's colour over a switch's."""
        if not self.colour:
            return text
        options = [m.span(2) for m in _OPTION.finditer(text)]
        switches = [m.span(2) for m in _SWITCH.finditer(text)]
        edges = sorted({0, len(text), *(edge for span in options + switches for edge in span)})
        out = []
        for start, end in zip(edges, edges[1:]):
            piece = text[start:end]
            if any(a <= start and end <= b for a, b in options):
                piece = self.paint(piece, _OPTION_STYLE)
            elif any(a <= start and end <= b for a, b in switches):
                piece = self.paint(piece, _SWITCH_STYLE)
            out.append(piece)
        return "".join(out)

    def draw(self) -> str | None:
        head, options, commands = self.head(), self.options(), self.commands()
        if head is None or options is None or commands is None:
            return None
        return "".join(line + "\n" for line in head + options + commands)

    def head(self) -> list[str] | None:
        """The usage in bold, padded by a line above and below; the help, and a blank line."""
        width = self.width
        usage = "Usage: " + USAGE
        lines = _wrap(SPARKIT_HELP, width - 2)
        if len(usage) > width - 2 or lines is None:
            return None
        blank = self.paint(" " * width, _BOLD)
        usage_line = (self.paint(" ", _BOLD) + self.paint("Usage: ", _USAGE) + self.paint(USAGE, _BOLD)
                      + self.paint(" " * (width - 2 - len(usage)), _BOLD) + self.paint(" ", _BOLD))
        text = [" " + self.highlighted(line) + " " * (width - 2 - len(line)) + " " for line in lines]
        return [blank, usage_line, blank, *text, " " * width]

    def panel(self, title: str, rows: list[str]) -> list[str]:
        """A dim rounded box titled on its top left, one cell of padding each side of `rows`
        (each already width - 4 columns)."""
        title = f" {title} "
        top = (self.paint("╭─", _BORDER) + self.paint(title, _BORDER) + self.paint("─" * (self.width - 4 - len(title)), _BORDER)
               + self.paint("─╮", _BORDER))
        side = self.paint("│", _BORDER)
        return [top, *(f"{side} {row} {side}" for row in rows), self.paint("╰" + "─" * (self.width - 2) + "╯", _BORDER)]

    def options(self) -> list[str] | None:
        """--version and --help: typer's six-column option table, four of its columns empty."""
        column = max(len(name) for name, _ in ROOT_OPTIONS) + 10
        inner = self.width - 4
        if any(len(help) > inner - column for _, help in ROOT_OPTIONS):
            return None  # the help would wrap, where rich's column widths are its own to decide
        rows = [self.highlighted(name) + " " * (column - len(name)) + self.highlighted(help) + " " * (inner - column - len(help))
                for name, help in ROOT_OPTIONS]
        return self.panel("Options", rows)

    def commands(self) -> list[str] | None:
        """Each command's name (bold cyan, as wide as the longest) and its summary, wrapped."""
        name_width = max(len(name) for name in COMMANDS)
        text_width = self.width - 6 - name_width
        rows = []
        for name, info in COMMANDS.items():
            lines = _wrap(info.summary, text_width)
            if lines is None:
                return None
            for index, line in enumerate(lines):
                cell = (self.paint(name.ljust(name_width), _OPTION_STYLE) + self.paint(" ", _OPTION_STYLE) if index == 0
                        else self.paint(" " * (name_width + 1), _OPTION_STYLE))
                rows.append(cell + " " + self.highlighted(line) + " " * (text_width - len(line)))
        return self.panel("Commands", rows)
