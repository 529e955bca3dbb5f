"""Shared CLI helpers: consoles, JSON output, running coroutines."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
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


def is_terminal(stream: Any) -> bool:
    """Whether a person watches `stream` (sys.stdout or sys.stderr). Decided by the stream
    itself, not rich's guess (FORCE_COLOR in CI makes rich draw for a terminal that is a log)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams: not a terminal
        return False


def print_json(data: Any) -> None:
    """Machine-readable output: one JSON document on stdout, nothing else."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def require_server(url: str, api_key: str | None) -> None:
    """Before any work (a dataset download, a results file, the chat screen): a server that does
    not answer is exit 7 with one message, `no server answered at URL`, not a failure later."""
    from sparkit.client import EngineClient

    async def probe() -> None:
        async with EngineClient(url, api_key=api_key, timeout=10.0) as client:
            await client.models()

    run_async(probe())


def writable_file(path: Path | None, flag: str) -> Path | None:
    """Check an output file flag before any work starts: a directory or an uncreatable parent
    is a usage error naming the flag, not an OSError minutes later."""
    from sparkit.errors import UsageError

    if path is None:
        return None
    path = Path(path).expanduser()
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory", hint=f"give a file name, e.g. {flag} {path / 'results.json'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot create {path.parent} ({exc.strerror})") from None
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"{flag} {path}: {path.parent} is not writable")
    return path


def writable_dir(path: Path | None, flag: str) -> Path | None:
    from sparkit.errors import UsageError

    if path is None:
        return None
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot create it ({exc.strerror})") from None
    return path
