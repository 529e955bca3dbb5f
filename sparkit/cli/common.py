"""Shared CLI helpers: consoles, JSON output, running coroutines."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_console = None
_err_console = None


def console():
    """stdout console (rich), created on first use."""
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console()
    return _console


def err_console():
    """stderr console for progress and messages, so that --json stdout stays clean."""
    global _err_console
    if _err_console is None:
        from rich.console import Console

        _err_console = Console(stderr=True)
    return _err_console


def print_json(data: Any) -> None:
    """Machine-readable output: one JSON document on stdout, nothing else."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)
