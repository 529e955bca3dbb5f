"""The honest memory picture: what the OS can give now, how much of the page cache is the model's
own files, swap, and what NVML and CUDA would claim, side by side, with why they differ.

On a GB10 the numbers disagree widely. MemAvailable counts clean page cache as free (the kernel
can drop it); CUDA's free-memory figure on the integrated GPU counts it as used, so it reports
about MemFree (writing a 60 GB file moved it from 103 to 41 GiB in one report); NVML reports no
memory at all (NotSupported). An engine that sizes its KV pool from CUDA's figure gets a pool far
too small or refuses to start; SGLang 0.5.23 uses MemAvailable on an integrated GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkit.memory.meminfo import MemInfo, read_meminfo
from sparkit.memory.pagecache import residency, weight_files
from sparkit.memory.units import gib as _gib


@dataclass
class CheckpointCache:
    directory: str
    files: int
    file_bytes: int
    cached_bytes: int  # of those files, in the page cache now (mincore)


@dataclass
class MemoryPicture:
    meminfo: dict[str, int | str]
    unified: bool  # the GPU shares this memory (GB10)
    checkpoints: list[CheckpointCache] = field(default_factory=list)
    nvml: str = ""  # what NVML says about GPU memory
    cuda_free_bytes: int | None = None  # what CUDA would report free, where sparkit can say (GB10: ~MemFree)
    reasons: list[str] = field(default_factory=list)

    @property
    def checkpoint_cached_bytes(self) -> int:
        return sum(c.cached_bytes for c in self.checkpoints)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["checkpoint_cached_bytes"] = self.checkpoint_cached_bytes
        return data


def memory_picture(host: Any, checkpoint_dirs: list[Path] = (), meminfo: MemInfo | None = None) -> MemoryPicture:
    """This machine's memory now, with the page-cache share of `checkpoint_dirs`."""
    m = meminfo or read_meminfo()
    caches = []
    for directory in checkpoint_dirs:
        files = weight_files([directory])
        if files:
            cached, total = residency(files)
            caches.append(CheckpointCache(str(directory), len(files), total, cached))
    unified = bool(host.gpus) and all(g.unified_memory for g in host.gpus)
    picture = MemoryPicture(meminfo=m.to_dict(), unified=unified, checkpoints=caches)
    if not host.gpus:
        picture.nvml = f"no NVIDIA GPU ({host.nvml_status})"
    elif unified:
        picture.nvml = "NotSupported: NVML reports no memory for the GB10's GPU (it has none of its own)"
        picture.cuda_free_bytes = m.free
    else:
        parts = [f"GPU{g.index} {_gib(g.memory_free_bytes)} free of {_gib(g.memory_total_bytes)}"
                 for g in host.gpus if g.memory_total_bytes and g.memory_free_bytes is not None]
        picture.nvml = ", ".join(parts) or "unknown"
    r = picture.reasons
    r.append(f"MemAvailable {_gib(m.available)} counts the reclaimable page cache ({_gib(m.page_cache)}) as free; "
             f"MemFree {_gib(m.free)} does not")
    own = picture.checkpoint_cached_bytes
    if caches:
        r.append(f"{_gib(own)} of the page cache is the model's own files ({_gib(sum(c.file_bytes for c in caches))} "
                 "on disk): reclaimable, and evicted by sparkit's load guard as the engine loads")
    if unified:
        r.append(f"CUDA on the GB10 counts the page cache as used: it would report about MemFree, {_gib(m.free)} "
                 f"free, while the OS can give {_gib(m.available)}; SGLang 0.5.23 sizes from MemAvailable here, "
                 "engines that size from CUDA's figure get a smaller KV pool or refuse to start")
    if m.swap_total:
        r.append(f"swap {_gib(m.swap_total - m.swap_free)} used of {_gib(m.swap_total)}: GPU memory is never swapped, "
                 "so swap only helps the OS's own processes")
    else:
        r.append("no swap")
    return picture
