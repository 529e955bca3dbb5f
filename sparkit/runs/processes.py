"""The engine processes sparkit starts: one process group each (SGLang forks schedulers and
detokenizers; one killpg reaches all of them, and Ctrl-C in the terminal does not hit the engine
before sparkit has had a chance to stop it cleanly). Liveness, stopping, reaping; no run records
here (sparkit.runs.store) and no launching (sparkit.runs.launcher)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

# Engines started by this process, by pid, so that they can be reaped (no zombies) and are
# known to be ours whatever the clock says.
children: dict[int, subprocess.Popen] = {}


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def create_time(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Only zombies left (children not reaped yet) do not count.
    try:
        import psutil

        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    return True
            except (ProcessLookupError, psutil.Error, OSError):
                continue
        return False
    except ImportError:  # pragma: no cover - psutil is a dependency
        return True


def reap(pid: int | None) -> None:
    proc = children.get(pid) if pid else None
    if proc is not None and proc.poll() is not None:
        children.pop(pid, None)


def is_ours(pid: int | None, pgid: int | None, started: float | None) -> bool:
    """The recorded pid still belongs to the engine sparkit started (pids get reused)."""
    if not pid:
        return False
    if pid in children:
        return True
    if not pid_alive(pid):
        # The leader is gone; its group may still hold children (SGLang schedulers).
        try:
            os.killpg(pgid or pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    actual = create_time(pid)
    return started is None or actual is None or abs(actual - started) < 1.0


def engine_alive(pid: int | None, pgid: int | None, started: float | None) -> bool:
    return pid_alive(pid) and is_ours(pid, pgid, started)


def stop_group(pid: int | None, pgid: int | None, started: float | None, grace: float) -> None:
    """SIGTERM to the group, SIGKILL after `grace` seconds; returns once it is gone."""
    pgid = pgid or pid
    if pgid and is_ours(pid, pgid, started):
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + wait
            while time.monotonic() < end:
                reap(pid)
                if not group_alive(pgid):
                    break
                time.sleep(0.1)
            reap(pid)
            if not group_alive(pgid):
                break
    reap(pid)
