"""Byte units and how sparkit writes a byte count for people."""

from __future__ import annotations

MIB = 1024**2
GIB = 1024**3


def gib(n: float) -> str:
    """MiB below 1 GiB, else GiB (two decimals below 10 GiB, one above)."""
    if abs(n) < GIB:
        return f"{n / MIB:.1f} MiB"
    return f"{n / GIB:.2f} GiB" if abs(n) < 10 * GIB else f"{n / GIB:.1f} GiB"


def size_text(n: float) -> str:
    """A file's size for people: bytes and KiB for small files, else as gib() writes it."""
    if abs(n) < 1024:
        return f"{int(n)} B"
    if abs(n) < MIB:
        return f"{n / 1024:.1f} KiB"
    return gib(n)
