"""The engine processes sparkit starts: one process group each (SGLang forks schedulers and
detokenizers; one killpg reaches all of them, and Ctrl-C in the terminal does not hit the engine
before sparkit has had a chance to stop it cleanly). Identity, liveness, stopping, reaping; no run
records here (sparkit.runs.store) and no launching (sparkit.runs.launcher).

A process is identified by its pid, its start time and its command line, all three recorded when
sparkit started it: pids are reused, and a signal sent to a reused pid (or to a process group whose
number was reused) hits somebody else's program. A record without a start time identifies nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

# Engines started by this process, by pid, so that they can be reaped (no zombies) and are
# known to be ours whatever the clock says.
children: dict[int, subprocess.Popen] = {}

# psutil derives a start time from the boot time, which moves when the wall clock is stepped
# (NTP); a reused pid starts later than the process it replaces by far more than this.
START_TIME_TOLERANCE_S = 1.0


@dataclass(frozen=True)
class ProcessIdentity:
    """Who a pid was when it was recorded: pid, start time (psutil's create_time) and argv."""

    pid: int
    create_time: float | None
    cmdline: tuple[str, ...] | None = None

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        """The identity of the live process `pid` now (None when it is gone). Called right after
        Popen it waits for the command line: Popen returns once exec closed its pipe, which the
        kernel does before the new program's arguments are readable in /proc (a few steps)."""
        try:
            import psutil

            proc = psutil.Process(pid)
            argv: list[str] = []
            for _ in range(200):
                argv = proc.cmdline()
                if argv:
                    break
                time.sleep(0.005)
            return cls(pid, proc.create_time(), tuple(argv) or None)
        except Exception:
            return None

    @classmethod
    def from_dict(cls, data: Any) -> ProcessIdentity | None:
        if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
            return None
        cmdline = data.get("cmdline")
        started = data.get("create_time")
        return cls(data["pid"], float(started) if isinstance(started, (int, float)) else None,
                   tuple(str(a) for a in cmdline) if isinstance(cmdline, list) else None)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cmdline"] = list(self.cmdline) if self.cmdline is not None else None
        return out

    def alive(self) -> bool:
        """The recorded process is running (not a zombie) and is still that process."""
        return identified(self.pid, self.create_time, self.cmdline)


def leaders_with_env(name: str, value: str) -> list[int]:
    """Session leaders of this user whose environment has name=value. A launch marks its engine
    with its run directory (SPARKIT_REPORT_DIR): this finds an engine that started before its
    `sparkit up` could record the pid (killed in between)."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                env = handle.read().split(b"\0")
            if needle in env and os.getsid(pid) == pid:
                found.append(pid)
        except (OSError, ProcessLookupError):
            continue  # gone, or another user's
    return found


def port_listener(port: int) -> tuple[int | None, str | None] | None:
    """(pid, name) of the process listening on TCP `port` (any address), None when nothing this
    process can see listens there; pid and name are None for another user's process, whose
    socket the OS shows without its owner."""
    try:
        import psutil

        listening = [c for c in psutil.net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port]
    except Exception:  # the OS refuses the table (macOS without root): nothing known
        return None
    if not listening:
        return None
    pid = next((c.pid for c in listening if c.pid), None)
    if pid is None:
        return None, None
    try:
        return pid, psutil.Process(pid).name()
    except Exception:
        return pid, None


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


def cmdline(pid: int) -> list[str] | None:
    try:
        import psutil

        return psutil.Process(pid).cmdline()
    except Exception:
        return None


def identified(pid: int | None, started: float | None, argv: tuple[str, ...] | list[str] | None = None) -> bool:
    """`pid` is alive and is the process recorded with start time `started` (and command line
    `argv`, when one was recorded). Without a recorded start time nothing is identified: a
    signal must never go to a process sparkit cannot tell from a stranger."""
    if not pid or not pid_alive(pid):
        return False
    proc = children.get(pid)
    if proc is not None and proc.poll() is None:
        return True  # our own child, not reaped yet: its pid cannot have been reused
    if started is None:
        return False
    actual = create_time(pid)
    if actual is None or abs(actual - started) >= START_TIME_TOLERANCE_S:
        return False
    if argv:
        now = cmdline(pid)
        if now is None or list(now) != list(argv):
            return False
    return True


def group_members(pgid: int) -> list[int]:
    """Pids of the group's live (non-zombie) members."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return []
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return found


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_members(pgid))  # only zombies left (children not reaped yet) do not count


def reap(pid: int | None) -> None:
    proc = children.get(pid) if pid else None
    if proc is not None and proc.poll() is not None:
        children.pop(pid, None)


def _remnants_are_ours(pid: int, pgid: int, started: float | None) -> bool:
    """The group of a dead leader still has members (SGLang's schedulers, say): are they the
    leader's? Only when the group is the one the leader made (pgid == pid, start_new_session) and
    every member started after the leader and stays in its session. Linux keeps a number in use
    while any process has it as its pid, group or session id, so such a group cannot be a
    stranger's that reused the number."""
    if pgid != pid or started is None:
        return False
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return False
    members = group_members(pgid)
    if not members:
        return False
    for member in members:
        try:
            if os.getsid(member) != pgid or psutil.Process(member).create_time() + START_TIME_TOLERANCE_S < started:
                return False
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return True


def is_ours(pid: int | None, pgid: int | None, started: float | None,
            argv: tuple[str, ...] | list[str] | None = None) -> bool:
    """The recorded engine (or what is left of its process group) is still the one sparkit
    started, so that signalling group `pgid` reaches nobody else."""
    if not pid:
        return False
    pgid = pgid or pid
    if pid_alive(pid):
        # A live leader must be the recorded process and still lead the recorded group.
        if not identified(pid, started, argv):
            return False
        try:
            return os.getpgid(pid) == pgid
        except (ProcessLookupError, OSError):
            return False
    return _remnants_are_ours(pid, pgid, started)


def engine_alive(pid: int | None, pgid: int | None, started: float | None,
                 argv: tuple[str, ...] | list[str] | None = None) -> bool:
    return pid_alive(pid) and is_ours(pid, pgid, started, argv)


def stop_group(pid: int | None, pgid: int | None, started: float | None, grace: float,
               argv: tuple[str, ...] | list[str] | None = None) -> bool:
    """SIGTERM to the group, SIGKILL after `grace` seconds; returns once it is gone. Returns
    False, signalling nothing, when the recorded process cannot be identified (see is_ours)."""
    pgid = pgid or pid
    if not pgid or not is_ours(pid, pgid, started, argv):
        reap(pid)
        return False
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
    return True


def stop_process(identity: ProcessIdentity, grace: float) -> None:
    """SIGTERM to one identified process, SIGKILL after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if not identity.alive():
            return
        try:
            os.kill(identity.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        end = time.monotonic() + wait
        while time.monotonic() < end and identity.alive():
            time.sleep(0.1)


def die_with_parent(sig: int = signal.SIGTERM):
    """A preexec_fn: the child receives `sig` when the thread that started it dies (Linux's
    PR_SET_PDEATHSIG), so that a foreground `sparkit up` killed with SIGKILL, or whose terminal
    closed, takes its engine with it. None where the OS has no such call."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        # Resolved before the fork: the child only makes the call.
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    PR_SET_PDEATHSIG = 1

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: nobody would tell us
            os._exit(1)

    return preexec


def process_environ(pid: int | None) -> dict[str, str] | None:
    """The environment a process runs with, as the OS reports it (/proc/PID/environ: what the
    engine was started with); None where it cannot be read (gone, another user's, no /proc)."""
    if not pid:
        return None
    try:
        import psutil

        return dict(psutil.Process(pid).environ())
    except Exception:  # psutil's NoSuchProcess / AccessDenied / ZombieProcess, or no such support here
        return None
