"""Page-cache residency of files (mincore) and evicting it (posix_fadvise DONTNEED).

Neither needs root: mincore reports, for a read-only mapping of the file, which pages the page
cache holds; POSIX_FADV_DONTNEED asks the kernel to drop the file's clean cached pages (dirty ones
are written back first; pages another process has mapped stay). That is the targeted form of
NVIDIA's `echo 3 > /proc/sys/vm/drop_caches` workaround: it drops only the checkpoint's pages,
which an engine no longer needs once it has copied the weights.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# mincore is asked one window at a time: its result vector (one byte per page) stays 256 KiB.
_WINDOW_BYTES = 1 << 30
# What files of a checkpoint directory hold weights (the ones worth evicting).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# mincore's vector: bit 0 of each byte says "resident"; the other bits are reserved.
_LOW_BIT = bytes(b & 1 for b in range(256))

_libc = None


def _c():
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        _libc = libc
    return _libc


def resident_bytes(path: Path) -> int:
    """Bytes of `path` that are in the page cache now (whole pages, capped at the file size)."""
    libc = _c()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        resident_pages = 0
        for offset in range(0, size, _WINDOW_BYTES):
            length = min(_WINDOW_BYTES, size - offset)
            addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
            if addr in (None, ctypes.c_void_p(-1).value):
                err = ctypes.get_errno()
                raise OSError(err, f"mmap: {os.strerror(err)}", str(path))
            try:
                pages = -(-length // PAGE_SIZE)
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(addr, length, vec) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"mincore: {os.strerror(err)}", str(path))
                resident_pages += bytes(vec).translate(_LOW_BIT).count(1)
            finally:
                libc.munmap(addr, length)
        return min(size, resident_pages * PAGE_SIZE)
    finally:
        os.close(fd)


def evict(path: Path) -> None:
    """Ask the kernel to drop `path`'s clean pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def weight_files(directories: Iterable[Path]) -> list[Path]:
    """The weight files of checkpoint directories (symlinks resolved: the Hugging Face cache links
    snapshots to blobs), each once."""
    seen: dict[Path, None] = {}
    for directory in directories:
        directory = Path(directory)
        if not directory.is_dir():
            continue
        for entry in sorted(directory.iterdir()):
            if entry.name.endswith(WEIGHT_SUFFIXES):
                try:
                    real = entry.resolve(strict=True)
                except OSError:
                    continue
                if real.is_file():
                    seen.setdefault(real, None)
    return list(seen)


def residency(files: Iterable[Path]) -> tuple[int, int]:
    """(bytes in the page cache, bytes in total) over `files`; unreadable files count as absent."""
    cached = total = 0
    for path in files:
        try:
            total += os.stat(path).st_size
            cached += resident_bytes(path)
        except OSError:
            continue
    return cached, total


def evict_files(files: Iterable[Path]) -> int:
    """Drop every file's cached pages; returns how many bytes left the page cache (mincore before
    and after, so a page the kernel kept, e.g. one another process maps, is not counted)."""
    files = list(files)
    before, _ = residency(files)
    for path in files:
        try:
            evict(path)
        except OSError:
            continue
    after, _ = residency(files)
    return max(0, before - after)
