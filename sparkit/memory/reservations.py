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
what it already holds. What it holds is the larger of two readings: NVML's per-process memory of
the run's process group (in a container NVML often lists no process, or the host's pids), and the
run's progress in its own log, priced by its fit: its CUDA context once it logs `Load weight
begin`, the target's weights at the first `Load weight end`, the draft's at the second, the pools
at `Memory pool end`. Runs that are up need no reservation: NVML's free memory already shows them.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from sparkit.memory.sglang_pool import PRE_POOL_BYTES
from sparkit.runs.store import RunFiles, RunState, list_runs


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


_DRAFT_TERMS = ("NextN draft", "draft model", "NextN draft's own")


def held_by_progress(record: dict[str, Any], log_text: str) -> int:
    """What a starting SGLang engine holds by now, from how far its log got, priced by its fit."""
    terms = record.get("terms") or []
    weights = sum(t.get("bytes", 0) for t in terms if t.get("group") == "weights")
    draft = sum(t.get("bytes", 0) for t in terms if t.get("group") == "weights"
                and str(t.get("name", "")).startswith(_DRAFT_TERMS))
    context = sum(t.get("bytes", 0) for t in terms if t.get("group") == "engine")
    sizes = ((record.get("pools") or {}).get("sizes")) or {}
    if "Memory pool end" in log_text and sizes:
        pools = sum(int(sizes.get(k) or 0) for k in ("state_reserved_bytes", "kv_bytes", "draft_kv_bytes",
                                                     "req_to_token_bytes"))
        return int(context + weights + PRE_POOL_BYTES + pools)
    loads = log_text.count("Load weight end")
    if loads >= 2:
        return int(context + weights)
    if loads == 1:
        return int(context + weights - draft)
    return int(context) if "Load weight begin" in log_text else 0


def starting_reservations(host: Any, gpus: list[int], runs: list[Any] | None = None) -> list[Reservation]:
    """What the runs still starting on `gpus` will take beyond what they hold now."""
    out: list[Reservation] = []
    for run in runs if runs is not None else list_runs():
        if run.observed_state() is not RunState.STARTING:
            continue
        record = run.read_json(RunFiles.MEMORY) or {}
        expected = record.get("engine_bytes")
        kind = (record.get("basis") or {}).get("kind", "gpu")
        if not isinstance(expected, int) or expected <= 0 or kind not in ("gpu", "unified"):
            continue  # a process in host memory (the embedded engine) takes no GPU memory
        try:
            log_text = run.log_path.read_text(errors="replace")
        except OSError:
            log_text = ""
        progress = held_by_progress(record, log_text)
        for index in record.get("gpus") or [0]:
            if index not in gpus or index >= len(host.gpus):
                continue
            seen = held_by_group(host.gpus[index], run.pgid)  # None: NVML cannot say
            held = max(seen or 0, progress)
            known = seen is not None or progress > 0
            out.append(Reservation(run.id, run.recipe_name, index, expected, held if known else None,
                                   max(0, expected - held)))
    return out


def reserved_on(reservations: list[Reservation], gpu: int) -> int:
    return sum(r.reserved_bytes for r in reservations if r.gpu == gpu)


__all__ = ["Reservation", "starting_reservations", "reserved_on", "held_by_group", "held_by_progress"]
