"""Memory that servers sparkit is still starting will take, so a launch is judged against what will
really be free.

SGLang sizes its pools from the free memory it measures when it starts (sparkit.memory.sglang_pool).
Two servers started at the same moment both measure the whole GPU free, the first then fills its
share and the second's profile finds nothing left ("Not enough GPU memory for hybrid ... state
cache ... total_rest_memory=-9.30 GB" on the H200). NVML's free memory cannot see that coming: at
the second preflight the first has not allocated yet.

So every `sparkit up` records, under the launch lock (sparkit.runs.store.launch_lock), the memory
fit its preflight computed (`memory-fit.json`: what the engine will hold at steady state, per GPU).
A later preflight reserves, for each run still starting on the same GPUs, what it will hold less
what it already holds (NVML's per-process memory of the run's process group; all of it when NVML
cannot say). Runs that are up need no reservation: NVML's free memory already shows them.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Reservation:
    run_id: str
    recipe: str
    gpu: int
    expected_bytes: int  # what its fit says it will hold on this GPU
    held_bytes: int | None  # what its processes hold on it now (None: NVML cannot say)
    reserved_bytes: int  # expected - held, at least 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError, OSError):
        return None


def held_by_group(gpu: Any, pgid: int | None) -> int | None:
    """Bytes NVML says the processes of process group `pgid` hold on `gpu` (None: unknown)."""
    if pgid is None or gpu.processes is None:
        return None
    return sum(p["used_bytes"] or 0 for p in gpu.processes if _group_of(int(p["pid"])) == pgid)


def starting_reservations(host: Any, gpus: list[int], runs: list[Any] | None = None) -> list[Reservation]:
    """What the runs still starting on `gpus` will take beyond what they hold now."""
    from sparkit.runs.store import RunFiles, RunState, list_runs

    out: list[Reservation] = []
    for run in runs if runs is not None else list_runs():
        if run.observed_state() is not RunState.STARTING:
            continue
        record = run.read_json(RunFiles.MEMORY) or {}
        expected = record.get("engine_bytes")
        if not isinstance(expected, int) or expected <= 0:
            continue
        for index in record.get("gpus") or [0]:
            if index not in gpus or index >= len(host.gpus):
                continue
            held = held_by_group(host.gpus[index], run.pgid)
            out.append(Reservation(run.id, run.recipe_name, index, expected, held,
                                   max(0, expected - (held or 0))))
    return out


def reserved_on(reservations: list[Reservation], gpu: int) -> int:
    return sum(r.reserved_bytes for r in reservations if r.gpu == gpu)


__all__ = ["Reservation", "starting_reservations", "reserved_on", "held_by_group"]
