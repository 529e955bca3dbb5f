"""The load guard: keeps an engine's start from wedging a machine whose memory it shares.

On a DGX Spark the GPU allocates from the same LPDDR5X the OS runs in, and loading a checkpoint
fills that memory twice over: once with the engine's copy of the weights, once with the page
cache of the files it read. Reports of that ending in a hung or powered-off box are common; the
workaround everyone is told is `echo 3 > /proc/sys/vm/drop_caches` (root, and after the fact).

While the engine loads and warms up, the guard samples /proc/meminfo every `interval_s`:

* MemFree under `evict_below` (the floor): the page cache is what keeps free memory low, so it
  evicts the checkpoint's already-read pages (posix_fadvise DONTNEED on its weight files; pages
  the engine still maps stay), at most once every `evict_every` samples;
* MemAvailable under `stop_below` (the floor): evicting cannot help any more (MemAvailable
  already counts clean page cache as free), so after one last eviction and a fresh sample still
  under the floor it stops the engine: SIGTERM to its process group, SIGKILL after `stop_grace_s`
  or at once if MemAvailable falls under half the floor meanwhile.

Every decision is a line of JSON in `log_path` (start, each further drop of available memory by
5% of its starting value, evict, stop, kill, end); `stop()` returns the summary that goes into the
run's meta.json. The guard never raises into the engine's launch: launch reads `tripped`.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkit.memory.meminfo import MemInfo, read_meminfo
from sparkit.memory.pagecache import evict_files, residency
from sparkit.memory.units import GIB
from sparkit.paths import open_output

GUARD_LOG = "memory-guard.jsonl"
# A drop of available memory worth a line in the log: this share of what was available at start.
_LOG_STEP_FRACTION = 0.05


@dataclass
class GuardSummary:
    floor_bytes: int
    evict_below: int
    stop_below: int
    files: int
    file_bytes: int
    start_available: int
    start_free: int
    start_cached_bytes: int  # of the checkpoint's files, in the page cache when the guard started
    min_available: int
    min_free: int
    samples: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    stopped: bool = False
    stopped_at_available: int | None = None
    killed: bool = False
    log: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)  # what was logged (also in `log`)

    @property
    def peak_used(self) -> int:
        """How much more memory was in use at the lowest point than when the guard started."""
        return max(0, self.start_available - self.min_available)

    def to_dict(self, events: bool = False) -> dict[str, Any]:
        data = asdict(self)
        data["peak_used"] = self.peak_used
        if not events:
            data.pop("events")
        return data


class LoadGuard:
    def __init__(
        self,
        *,
        pgid: int,
        files: list[Path],
        floor_bytes: int,
        log_path: Path,
        alive: Callable[[], bool] | None = None,
        interval_s: float = 0.1,
        evict_every: int = 10,
        stop_grace_s: float = 5.0,
        evict_below: int | None = None,
        stop_below: int | None = None,
        read: Callable[[], MemInfo] = read_meminfo,
    ) -> None:
        self.pgid = pgid
        self.files = list(files)
        self.floor = int(floor_bytes)
        self.evict_below = int(floor_bytes if evict_below is None else evict_below)
        self.stop_below = int(floor_bytes if stop_below is None else stop_below)
        self.log_path = Path(log_path)
        self.alive = alive or self._group_exists
        self.interval_s = interval_s
        self.evict_every = max(1, evict_every)
        self.stop_grace_s = stop_grace_s
        self._read = read
        self._halt = threading.Event()
        self.tripped = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()
        self.summary: GuardSummary | None = None

    # -------------------------------------------------------------------- lifecycle

    def start(self) -> LoadGuard:
        m = self._read()
        cached, total = residency(self.files)
        self.summary = GuardSummary(
            floor_bytes=self.floor, evict_below=self.evict_below, stop_below=self.stop_below,
            files=len(self.files), file_bytes=total, start_available=m.available, start_free=m.free,
            start_cached_bytes=cached, min_available=m.available, min_free=m.free, log=str(self.log_path))
        self._log("start", m, floor=self.floor, evict_below=self.evict_below, stop_below=self.stop_below,
                  files=len(self.files), file_bytes=total, cached_bytes=cached)
        self._thread = threading.Thread(target=self._run, name="sparkit-load-guard", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> GuardSummary:
        """Stop watching (idempotent); returns the summary."""
        self._halt.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        assert self.summary is not None, "stop() before start()"
        if not any(e["event"] == "end" for e in self.summary.events):
            s, m = self.summary, self._read()
            s.min_available, s.min_free = min(s.min_available, m.available), min(s.min_free, m.free)
            self._log("end", m, samples=s.samples, min_available=s.min_available, peak_used=s.peak_used,
                      evictions=s.evictions, evicted_bytes=s.evicted_bytes, stopped=s.stopped)
        return self.summary

    # -------------------------------------------------------------------- the loop

    def _run(self) -> None:
        s = self.summary
        assert s is not None
        since_evict = self.evict_every  # the first low sample may evict at once
        logged_available = s.start_available
        step = max(1, int(s.start_available * _LOG_STEP_FRACTION))
        while not self._halt.wait(self.interval_s):
            m = self._read()
            s.samples += 1
            s.min_available = min(s.min_available, m.available)
            s.min_free = min(s.min_free, m.free)
            since_evict += 1
            if logged_available - m.available >= step:
                self._log("low", m)
                logged_available = m.available
            if m.free < self.evict_below and since_evict >= self.evict_every and self.files:
                self._evict(m, f"MemFree {_gib(m.free)} < {_gib(self.evict_below)}")
                since_evict = 0
            if m.available < self.stop_below:
                if self.files and since_evict > 0:
                    self._evict(m, f"MemAvailable {_gib(m.available)} < {_gib(self.stop_below)}")
                    since_evict = 0
                again = self._read()
                s.min_available = min(s.min_available, again.available)
                if again.available < self.stop_below:
                    self._stop_engine(again)
                    return

    def _evict(self, m: MemInfo, reason: str) -> None:
        s = self.summary
        assert s is not None
        evicted = evict_files(self.files)
        s.evictions += 1
        s.evicted_bytes += evicted
        self._log("evict", self._read(), reason=reason, evicted_bytes=evicted, before_available=m.available,
                  before_free=m.free)

    def _stop_engine(self, m: MemInfo) -> None:
        s = self.summary
        assert s is not None
        s.stopped, s.stopped_at_available = True, m.available
        self.tripped.set()  # before the signal: launch must see the guard, not a mere exit
        self._log("stop", m, reason=f"MemAvailable {_gib(m.available)} < floor {_gib(self.stop_below)}",
                  peak_used=s.peak_used, signal="SIGTERM")
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        while self.alive() and time.monotonic() < deadline:
            now = self._read()
            s.min_available = min(s.min_available, now.available)
            if now.available < self.stop_below // 2:
                break
            time.sleep(self.interval_s)
        if self.alive():
            s.killed = True
            self._log("kill", self._read(), signal="SIGKILL")
            self._signal(signal.SIGKILL)

    # -------------------------------------------------------------------- helpers

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _group_exists(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def _log(self, event: str, m: MemInfo, **fields: Any) -> None:
        record = {"t_s": round(time.monotonic() - self._t0, 3), "event": event, "available": m.available,
                  "free": m.free, "page_cache": m.page_cache, **fields}
        if self.summary is not None:
            self.summary.events.append(record)
        try:
            with open_output(self.log_path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        except OSError:
            pass  # the run directory went away; the summary still has it


def _gib(n: int) -> str:
    # Two decimals always: the guard compares figures a few MiB apart with its floor.
    return f"{n / GIB:.2f} GiB"


def guard_supported() -> str | None:
    """None where the guard can run, else why not."""
    import sys

    if not sys.platform.startswith("linux"):
        return "the load guard needs Linux (/proc/meminfo, posix_fadvise)"
    if not Path("/proc/meminfo").is_file():
        return "/proc/meminfo is not readable"
    return None
