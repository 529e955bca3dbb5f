"""Byte units and how sparkit writes a byte count for people."""

from __future__ import annotations

MIB = 1024**2
GIB = 1024**3


def gib(n: float) -> str:
    """MiB below 1 GiB, else GiB (two decimals below 10 GiB, one above)."""
    if abs(n) < GIB:
        return f"{n / MIB:.1f} MiB"
    return f"{n / GIB:.2f} GiB" if abs(n) < 10 * GIB else f"{n / GIB:.1f} GiB"
