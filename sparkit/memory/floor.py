"""The memory floor: what the OS keeps while an engine runs on a shared (unified or host) memory.

One number serves two purposes. The load guard stops an engine whose start would take memory
below it, and the memory fit keeps it out of what the engine may use at steady state on unified
memory. The recipe key is `server.memory_guard.floor_gib`; the default is 5% of the machine's
memory, at least 2 GiB (about 6 GiB on a 128 GB DGX Spark): enough for the desktop, sshd and the
kernel's own reserves, small enough not to cost a model.
"""

from __future__ import annotations

from typing import Any

from sparkit.memory.units import GIB

DEFAULT_FLOOR_FRACTION = 0.05
DEFAULT_FLOOR_MIN_BYTES = 2 * GIB


def default_floor_bytes(total_bytes: int) -> int:
    return max(DEFAULT_FLOOR_MIN_BYTES, int(total_bytes * DEFAULT_FLOOR_FRACTION))


def guard_settings(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe's server.memory_guard as a dict (defaults applied by the schema)."""
    return dict(((recipe or {}).get("server") or {}).get("memory_guard") or {"enabled": True, "floor_gib": None})


def floor_bytes(recipe: dict[str, Any], total_bytes: int) -> int:
    """The floor a recipe asks for on a machine with `total_bytes` of memory."""
    floor_gib = guard_settings(recipe).get("floor_gib")
    return int(floor_gib * GIB) if floor_gib else default_floor_bytes(total_bytes)


def floor_source(recipe: dict[str, Any]) -> str:
    floor_gib = guard_settings(recipe).get("floor_gib")
    return "server.memory_guard.floor_gib" if floor_gib else "default: 5% of memory, at least 2 GiB"
