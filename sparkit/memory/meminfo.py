"""/proc/meminfo as numbers: the kernel's own accounting, read fresh on every call.

MemAvailable is what the kernel estimates it can give a new allocation without swapping (free
memory plus the reclaimable part of the page cache and slab); MemFree excludes the page cache.
The two differ by the page cache, which is why CUDA on a GB10 (it counts the page cache as used)
and the OS disagree about "free" memory. Off Linux, psutil's figures stand in (no page-cache
split).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class MemInfo:
    total: int
    available: int  # MemAvailable
    free: int  # MemFree
    cached: int  # Cached (page cache, tmpfs included)
    buffers: int
    shmem: int  # tmpfs and shared memory: inside Cached but not reclaimable
    swap_total: int
    swap_free: int
    source: str  # "/proc/meminfo" or "psutil"

    @property
    def page_cache(self) -> int:
        """Reclaimable file pages: Cached + Buffers - Shmem."""
        return max(0, self.cached + self.buffers - self.shmem)

    @property
    def swap_used(self) -> int:
        return max(0, self.swap_total - self.swap_free)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["page_cache"] = self.page_cache
        data["swap_used"] = self.swap_used
        return data


_FIELDS = {"MemTotal": "total", "MemAvailable": "available", "MemFree": "free", "Cached": "cached",
           "Buffers": "buffers", "Shmem": "shmem", "SwapTotal": "swap_total", "SwapFree": "swap_free"}


def parse_meminfo(text: str) -> MemInfo:
    values = dict.fromkeys(_FIELDS.values(), 0)
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in _FIELDS:
            parts = rest.split()
            # Values are in kB (KiB) unless a line has no unit (counts such as HugePages_Total).
            scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
            values[_FIELDS[key]] = int(parts[0]) * scale
    return MemInfo(**values, source=str(MEMINFO))


def read_meminfo() -> MemInfo:
    """This machine's memory now."""
    if sys.platform.startswith("linux") and MEMINFO.is_file():
        return parse_meminfo(MEMINFO.read_text())
    import psutil

    vm, sw = psutil.virtual_memory(), psutil.swap_memory()
    cached = int(getattr(vm, "cached", 0) or 0)
    return MemInfo(total=int(vm.total), available=int(vm.available), free=int(vm.free), cached=cached,
                   buffers=int(getattr(vm, "buffers", 0) or 0), shmem=int(getattr(vm, "shared", 0) or 0),
                   swap_total=int(sw.total), swap_free=int(sw.free), source="psutil")
