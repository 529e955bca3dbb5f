"""Interrupts (Ctrl-C, SIGTERM, SIGHUP) that cannot be lost, and moments they must not cut short.

Python runs a signal handler between two bytecodes of the main thread, wherever they are. When that
is inside code whose exceptions the interpreter swallows (an `os.register_at_fork` hook, such as
logging's `_releaseLock`, which runs when subprocess forks for a preexec_fn; a `__del__`; a weakref
callback), the KeyboardInterrupt the handler raises is printed as `Exception ignored in ...` and
lost: a Ctrl-C during `sparkit up`'s start then went on to serve. So sparkit's handlers note each
signal here before they raise (`note`), and the long operations check at their phase boundaries
(`raise_if_pending`): a lost KeyboardInterrupt is raised again there.

One place in the standard library turns the KeyboardInterrupt itself into another error:
`threading.Condition.wait` (under `Event.wait` and `Thread.start`) releases its lock before the
`try` that takes it back, so an interruption landing between the two leaves the lock released and
the `with` around the wait releases it again: "RuntimeError: release unlocked lock" in place of the
Ctrl-C. So the main thread starts threads under `held()` and waits for them with `wait_until`,
which sleeps (a sleep a signal ends cleanly) instead of waiting on a Condition.

Where half of a step would leave something behind (an engine forked but not recorded, a server
half stopped), `deferred()` holds the signal for the length of the step: it is noted, not acted
on, and the caller raises it (`raise_if_pending`) once the step is whole.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# The signals sparkit's commands end on, as on Ctrl-C.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_pending: int | None = None
_received: int | None = None


def note(signum: int) -> None:
    """Remember that `signum` arrived (the first one counts)."""
    global _pending, _received
    if _pending is None:
        _pending = _received = signum


def received() -> int | None:
    """The signal that last interrupted this process (noted, raised or not), if any."""
    return _received


def describe(signum: int | None) -> str:
    """How a message names an interruption: `Ctrl-C`, `SIGTERM`, `SIGHUP`."""
    if signum in (None, signal.SIGINT):
        return "Ctrl-C"
    return signal.Signals(signum).name


def pending() -> int | None:
    """The signal noted and not raised yet, if any."""
    return _pending


def clear() -> None:
    global _pending
    _pending = None


def raise_if_pending() -> None:
    """Raise the KeyboardInterrupt of a signal that arrived and was not acted on (held by
    `deferred`, or lost where the interpreter swallowed it)."""
    if _pending is not None:
        clear()
        raise KeyboardInterrupt


def interrupt(signum: int, frame: Any) -> None:
    """A signal handler: what Ctrl-C does (KeyboardInterrupt), noted first so it cannot be lost."""
    note(signum)
    raise KeyboardInterrupt


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """For the block, INT, TERM and HUP are noted but not acted on (their handlers are restored
    after it); the caller raises a noted one with `raise_if_pending` once what it does is whole. A
    signal that is ignored, or left to the system (which ends the process), stays so. Only the
    main thread can change handlers; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: dict[int, Any] = {}
    try:
        for sig in SIGNALS:
            current = signal.getsignal(sig)
            if callable(current):
                held[sig] = current
                signal.signal(sig, _hold)
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def _hold(signum: int, frame: Any) -> None:
    note(signum)


def held(call: Callable[[], T]) -> T:
    """`call()` with INT, TERM and HUP held (`deferred`), then the KeyboardInterrupt of one that came
    meanwhile: for a call that waits on a Condition (starting a thread), where an interruption
    inside would surface as "RuntimeError: release unlocked lock"."""
    with deferred():
        result = call()
    raise_if_pending()
    return result


def wait_until(event: threading.Event, poll_s: float = 0.05) -> None:
    """Wait for `event` in sleeps a signal ends cleanly (`Event.wait` is a Condition.wait: see the
    module's note). `is_set` takes no lock."""
    while not event.is_set():
        time.sleep(poll_s)
