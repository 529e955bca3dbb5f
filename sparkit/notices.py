"""One-line notices from the core about slow work a user should hear of while it runs (importing
SGLang's parser, say). The core never prints: it calls notice(), and whoever drives it (the CLI
prints them to stderr) registers a listener. With none registered, a notice goes nowhere."""

from __future__ import annotations

from collections.abc import Callable

LISTENERS: list[Callable[[str], None]] = []


def notice(line: str) -> None:
    for listener in LISTENERS:
        listener(line)
