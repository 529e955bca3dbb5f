"""Evidence that the kernel's OOM killer ended a process, and only evidence.

A SIGKILL alone says nothing about memory: a user, a supervisor or a job limit sends it too. So a
killed engine is blamed on the OOM killer only when the kernel recorded it: an `oom_kill` counter of
the engine's memory cgroup that moved while it ran (cgroup v2 memory.events, v1
memory.oom_control), or a kernel-log line naming its pid ("Killed process PID", "oom-kill: ...
pid=PID") read from /dev/kmsg. Each source that could not be read is said so, so that a
diagnosis can say what was checked.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Records of the kernel log (/dev/kmsg) read at most: the ring buffer is small (a few thousand
# lines), and this bounds the read however noisy the kernel was.
KMSG_MAX_RECORDS = 20000


def _cgroup_counter_files(pid: int | str) -> list[Path]:
    """The oom_kill counter files of `pid`'s memory cgroup (v2, then v1), most specific first."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    found: list[Path] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":  # v2 unified hierarchy
            candidates = [CGROUP_ROOT / rel / "memory.events", CGROUP_ROOT / "memory.events"]
        elif "memory" in controllers.split(","):  # v1; inside a container the root is often ours
            candidates = [CGROUP_ROOT / "memory" / rel / "memory.oom_control", CGROUP_ROOT / "memory" / "memory.oom_control"]
        else:
            continue
        first = next((c for c in candidates if c.is_file()), None)
        if first is not None and first not in found:
            found.append(first)
    return found


def _oom_kills(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


_KILLED = re.compile(r"(?:Killed process (?P<a>\d+)\b|oom-kill:.*\bpid=(?P<b>\d+)\b)")


def kernel_oom_lines(pid: int, since_monotonic: float) -> tuple[list[str], str | None]:
    """Kernel-log lines of an OOM kill of `pid` logged after `since_monotonic` (CLOCK_MONOTONIC
    seconds); and why the log could not be read, when it could not (no permission, no /dev/kmsg)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return [], f"the kernel log is not readable here ({exc.strerror})"
    found = []
    try:
        for _ in range(KMSG_MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the buffer: never wait for new records
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: records overwritten while reading; go on
                    continue
                return found, f"reading the kernel log failed ({exc.strerror})"
            if not record:
                break
            header, _, message = record.decode("utf-8", "replace").partition(";")
            fields = header.split(",")
            try:
                stamp = int(fields[2]) / 1e6
            except (IndexError, ValueError):
                stamp = 0.0
            match = _KILLED.search(message)
            if match and int(match.group("a") or match.group("b")) == pid and stamp >= since_monotonic - 1.0:
                found.append(message.strip().splitlines()[0])
    finally:
        os.close(fd)
    return found, None


@dataclass
class OomWatch:
    """The OOM counters of a process's cgroup when it started, to compare with when it died."""

    pid: int
    started_monotonic: float
    counters: dict[str, int] = field(default_factory=dict)

    @classmethod
    def start(cls, pid: int) -> OomWatch:
        counters = {}
        for path in _cgroup_counter_files(pid):
            count = _oom_kills(path)
            if count is not None:
                counters[str(path)] = count
        return cls(pid, time.monotonic(), counters)

    def evidence(self) -> tuple[list[str], list[str]]:
        """(evidence of an OOM kill, what was checked and found nothing or could not be read)."""
        evidence, checked = [], []
        for path, before in self.counters.items():
            now = _oom_kills(Path(path))
            if now is not None and now > before:
                evidence.append(f"{path}: oom_kill {before} -> {now} while the engine ran")
            else:
                checked.append(f"{path} oom_kill unchanged")
        lines, unreadable = kernel_oom_lines(self.pid, self.started_monotonic)
        evidence += [f"kernel log: {line}" for line in lines]
        checked.append(unreadable or "no OOM kill of it in the kernel log")
        if not self.counters:
            checked.append("no cgroup OOM counter readable")
        return evidence, checked
