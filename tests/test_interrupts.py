"""sparkit.interrupts: a signal the interpreter swallows is raised again at the next phase, and a
step that must be whole holds the signals that come meanwhile (issue 40.8)."""

from __future__ import annotations

import os
import signal

import pytest

from sparkit import interrupts


@pytest.fixture(autouse=True)
def clean():
    interrupts.clear()
    previous = {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS}
    yield
    interrupts.clear()
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def test_a_keyboard_interrupt_swallowed_in_a_fork_hook_is_raised_at_the_next_phase():
    """What a fork's hooks do with an exception (os.register_at_fork: 'Exception ignored in'),
    done here directly: the handler's KeyboardInterrupt is lost, its note is not."""
    signal.signal(signal.SIGINT, interrupts.interrupt)
    try:
        os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt:
        pass  # swallowed, as the interpreter swallows it in a fork hook
    with pytest.raises(KeyboardInterrupt):
        interrupts.raise_if_pending()
    interrupts.raise_if_pending()  # raised once, then clear
    assert interrupts.received() == signal.SIGINT and interrupts.describe(signal.SIGTERM) == "SIGTERM"


def test_deferred_holds_the_signals_until_the_step_is_whole_and_restores_the_handlers():
    signal.signal(signal.SIGINT, interrupts.interrupt)
    signal.signal(signal.SIGTERM, interrupts.interrupt)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # `nohup`: an ignored signal stays ignored
    with interrupts.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGHUP)
        with interrupts.deferred():  # nested: still held
            os.kill(os.getpid(), signal.SIGINT)
        done = True  # nothing was raised inside
    assert done and interrupts.pending() == signal.SIGTERM  # the first one counts
    assert signal.getsignal(signal.SIGINT) is interrupts.interrupt and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    with pytest.raises(KeyboardInterrupt):
        interrupts.raise_if_pending()


def _signal_inside_condition_wait(sig: int, thread_name: str):
    """A trace that sends `sig` once a thread named `thread_name` starts, at the line of
    Condition.wait between releasing the Event's lock and the `try` that takes it back."""
    import inspect
    import sys
    import threading

    src, first = inspect.getsourcelines(threading.Condition.wait)
    line = first + next(i for i, text in enumerate(src) if "gotit = False" in text)
    state: list[str] = []

    def in_wait(frame, event, arg):
        if event == "line" and frame.f_lineno == line and state == ["armed"]:
            state.append("fired")
            sys.settrace(None)
            os.kill(os.getpid(), sig)
        return in_wait

    def on_call(frame, event, arg):
        if frame.f_code is threading.Thread.start.__code__ and frame.f_locals["self"].name == thread_name:
            state.append("armed")
        elif frame.f_code is threading.Condition.wait.__code__ and state == ["armed"]:
            return in_wait
        return None

    sys.settrace(on_call)
    return state


@pytest.mark.parametrize("held", [False, True], ids=["bare", "held"])
def test_a_thread_started_held_turns_a_signal_inside_its_start_into_the_interrupt_not_a_lock_error(held):
    """CPython's Thread.start waits on an Event; an interruption at one bytecode of that wait is
    turned into "RuntimeError: release unlocked lock" (the bare case shows the trace reaches that
    bytecode). Started under `held`, the same signal is the KeyboardInterrupt, after the start."""
    import sys
    import threading

    signal.signal(signal.SIGINT, interrupts.interrupt)
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="victim", daemon=True)
    state = _signal_inside_condition_wait(signal.SIGINT, "victim")
    try:
        with pytest.raises(BaseException) as raised:
            interrupts.held(thread.start) if held else thread.start()
    finally:
        sys.settrace(None)
        release.set()
    assert state == ["armed", "fired"]
    if held:
        assert raised.type is KeyboardInterrupt and thread.ident is not None
    else:
        assert raised.type is RuntimeError and "release unlocked lock" in str(raised.value)


def test_wait_until_ends_on_a_signal_as_the_interrupt():
    import threading

    signal.signal(signal.SIGINT, interrupts.interrupt)
    never = threading.Event()
    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        interrupts.wait_until(never)
    timer.join()
