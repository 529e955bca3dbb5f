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
        _console = _make_console(sys.stdout, stderr=False)
    return _console


def err_console():
    """stderr console for progress and messages, so that --json stdout stays clean."""
    global _err_console
    if _err_console is None:
        _err_console = _make_console(sys.stderr, stderr=True)
    return _err_console


# Piped or redirected without COLUMNS: the width a table may take (it takes what its cells need, up
# to this): room for a path or a command whole in a cell, lines a log viewer still shows.
PIPE_WIDTH = 160


def _make_console(stream: Any, *, stderr: bool):
    """On a terminal, rich wraps text at its width. Piped or redirected, nothing is broken or cut
    to fit 80 columns: a line of text is never wrapped (soft wrap: a path, a URL, a command stay
    whole for grep, a log or the next command), and a table may take PIPE_WIDTH columns so that
    its cells wrap between words, unless COLUMNS asks for a width."""
    from rich.console import Console

    if is_terminal(stream):
        return Console(stderr=stderr)
    try:
        width = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        width = PIPE_WIDTH
    return Console(stderr=stderr, soft_wrap=True, width=width)


def is_terminal(stream: Any) -> bool:
    """Whether a person watches `stream` (sys.stdout or sys.stderr). Decided by the stream
    itself, not rich's guess (FORCE_COLOR in CI makes rich draw for a terminal that is a log)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams: not a terminal
        return False


class ProgressLines:
    """Progress for a log or CI, where a progress bar shows nothing until it ends: one stderr line
    per step of finished items (`bench: 3/8`, `gsm8k: 140/1319 acc 71.4%`). Steps are counts, not
    seconds, so a log reads the same however fast the machine is: every item up to 100 of them,
    else every hundredth of the total, and always the first and the last."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self._shown: dict[str, int] = {}

    def update(self, phase: str, done: int, total: int, note: str = "") -> None:
        last = self._shown.get(phase)
        step = max(1, -(-total // 100)) if total else 1
        if last is not None and (done == last or (done - last < step and done != total)):
            return
        self._shown[phase] = done
        self.stream.write(f"{phase}: {done}/{total}" + (f" {note}" if note else "") + "\n")
        self.stream.flush()


def signals_as_interrupt(*, sigint: bool = False) -> None:
    """SIGTERM and SIGHUP (the terminal closed) end a command like Ctrl-C: what it finished is kept,
    it says how to go on, it exits 130. A SIGHUP that was already ignored (`nohup sparkit ...`)
    stays ignored: that user asked for the command to outlive the terminal. Each is noted before
    it raises (sparkit.interrupts), so that one the interpreter swallows is raised again at the
    next phase of the work; `sigint` gives Ctrl-C the same handler (for a command that runs no
    event loop of its own while it waits: asyncio.run takes Ctrl-C only from the default one)."""
    import signal

    from sparkit import interrupts

    def handler(signum: int, frame: Any) -> None:
        # Whatever Ctrl-C would do now: asyncio.run's own SIGINT handler cancels its main task
        # cleanly (a KeyboardInterrupt raised inside the event loop can leave it waiting on its
        # threads); elsewhere, KeyboardInterrupt.
        on_sigint = signal.getsignal(signal.SIGINT)
        if callable(on_sigint) and on_sigint not in (signal.default_int_handler, interrupts.interrupt):
            interrupts.note(signum)  # should the cancelled task swallow its cancellation, the next phase raises it
            on_sigint(signum, frame)
            return
        interrupts.interrupt(signum, frame)

    if sigint:
        signal.signal(signal.SIGINT, interrupts.interrupt)
    signal.signal(signal.SIGTERM, handler)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, handler)


def say(console: Any, message: str, **kwargs: Any) -> None:
    """A message on a console, if there is still a terminal to show it (after SIGHUP there may
    not be; what the command does next must not depend on it)."""
    try:
        console.print(message, **kwargs)
    except (OSError, ValueError):
        pass


def resume_command(*flags: str) -> str:
    """The command line that was run, with `flags` added where it lacks them: what to type to go on."""
    import shlex

    argv = ["sparkit", *sys.argv[1:]]
    i = 0
    while i < len(flags):
        flag = flags[i]
        value = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
        if flag in argv:
            if value is not None:
                at = argv.index(flag)
                if at + 1 < len(argv):
                    argv[at + 1] = value
        else:
            argv += [flag] + ([value] if value is not None else [])
        i += 2 if value is not None else 1
    return shlex.join(argv)


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
