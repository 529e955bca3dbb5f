"""Preflight: can this host run this plan? Checked before anything is launched.

Each check looks at (plan, host) only and returns a CheckResult; the launcher
refuses to start when any of them fails (PreflightError, exit code 4).
"""

from __future__ import annotations

import errno
import importlib.util
import json
import re
import socket
from pathlib import Path

from sparkit.checks.results import CheckResult, Status
from sparkit.host import Host, target_fit
from sparkit.recipes.plan import LaunchPlan

GIB = 1024**3
# KV cache, activations and CUDA graphs on top of the weights, as a fraction of the weights
# plus a fixed floor: a batch-1 server needs little KV, but graph capture needs some room.
HEADROOM_FRACTION = 0.10
HEADROOM_FLOOR_BYTES = 4 * GIB
DEFAULT_MEM_FRACTION = 0.85  # what sglang roughly uses when mem_fraction_static is unset

# Approximate weight bytes of known hub checkpoints, for checking without a local copy:
# 124B parameters; -fp4 is MXFP4 experts + FP8 elsewhere (~60-70 GB published).
KNOWN_WEIGHT_BYTES = {
    "inclusionai/ling-3.0-flash-fp4": 65 * 10**9,
    "inclusionai/ling-3.0-flash-fp8": 125 * 10**9,
    "inclusionai/ling-3.0-flash": 248 * 10**9,
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def _target(plan: LaunchPlan) -> str:
    return str(plan.recipe.get("target", "auto"))


def check_gpus(plan: LaunchPlan, host: Host) -> CheckResult:
    target = _target(plan)
    ok, why = target_fit(host, target, plan.engine)
    if target in ("auto", "cpu") and ok:
        return CheckResult("gpus", "GPUs", Status.PASS, f"target {target}: {why}",
                           evidence=[f"{host.gpu_count} GPU(s) detected"])
    if ok:
        return CheckResult("gpus", "GPUs", Status.PASS, f"target {target}: {why}",
                           evidence=[f"GPU{g.index}: {g.name} {g.sm}" for g in host.gpus])
    return CheckResult("gpus", "GPUs", Status.FAIL, f"target {target}: {why}",
                       evidence=[f"GPU{g.index}: {g.name} {g.sm}" for g in host.gpus] or [host.nvml_status],
                       fix="run on a host that matches the recipe's target, or pick a recipe for this host (`sparkit doctor`)")


def weight_bytes(model: str) -> tuple[int | None, str]:
    """Checkpoint weight bytes: from a local safetensors index / files, else a known hub id."""
    path = Path(model).expanduser()
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        if index.is_file():
            try:
                total = json.loads(index.read_text())["metadata"]["total_size"]
                return int(total), f"{index.name} metadata.total_size"
            except (OSError, ValueError, KeyError, TypeError):
                pass
        files = list(path.glob("*.safetensors"))
        if files:
            return sum(f.stat().st_size for f in files), f"{len(files)} safetensors file(s)"
        return None, "no safetensors files in the directory"
    known = KNOWN_WEIGHT_BYTES.get(model.lower())
    if known:
        return known, "known size of this hub checkpoint"
    return None, "size unknown (not local)"


def check_memory(plan: LaunchPlan, host: Host) -> CheckResult:
    title = "memory fits"
    if plan.model.startswith("sparkit:"):
        return CheckResult("memory", title, Status.PASS, "built-in tiny model: a few MB",
                           evidence=[f"host RAM {host.ram_available_bytes / GIB:.1f} GiB available"])
    size, source = weight_bytes(plan.model)
    if size is None:
        return CheckResult("memory", title, Status.WARN, f"cannot estimate the weights: {source}",
                           fix="use a local checkpoint directory to check memory before launch")
    tp = int(plan.recipe.get("stack", {}).get("tp", 1) or 1)
    per_gpu_need = size / tp
    headroom = max(per_gpu_need * HEADROOM_FRACTION, HEADROOM_FLOOR_BYTES)
    fraction = plan.expectations.mem_fraction_static or DEFAULT_MEM_FRACTION
    if not host.gpus:
        return CheckResult("memory", title, Status.SKIP, "no GPU to check against",
                           data={"weight_bytes": size})
    gpu_mem = host.gpu_memory_bytes(0)
    if gpu_mem is None:
        return CheckResult("memory", title, Status.WARN, "GPU memory unknown", evidence=[host.gpus[0].memory_note])
    usable = gpu_mem * fraction
    kind = "unified (host RAM)" if host.unified_memory else "per GPU"
    evidence = [f"weights {size / GIB:.1f} GiB ({source}) / tp {tp} = {per_gpu_need / GIB:.1f} GiB per GPU",
                f"+ headroom {headroom / GIB:.1f} GiB (KV cache, graphs)",
                f"usable {usable / GIB:.1f} GiB = {gpu_mem / GIB:.1f} GiB {kind} x mem_fraction_static {fraction}"]
    data = {"weight_bytes": size, "need_bytes": int(per_gpu_need + headroom), "usable_bytes": int(usable)}
    if per_gpu_need + headroom <= usable:
        return CheckResult("memory", title, Status.PASS,
                           f"needs {(per_gpu_need + headroom) / GIB:.1f} GiB of {usable / GIB:.1f} GiB", evidence, data=data)
    return CheckResult("memory", title, Status.FAIL,
                       f"needs {(per_gpu_need + headroom) / GIB:.1f} GiB but only {usable / GIB:.1f} GiB is usable",
                       evidence, fix="use a smaller checkpoint (fp4/fp8), more GPUs (stack.tp), or a higher mem_fraction_static",
                       data=data)


def check_port(plan: LaunchPlan, host: Host) -> CheckResult:
    bind_host = "127.0.0.1" if plan.host in ("", "localhost") else plan.host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As the servers bind it (uvicorn sets SO_REUSEADDR): connections of a server just stopped,
        # left in TIME_WAIT, do not keep the port from being used; only a listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind_host, plan.port))
        except OSError as exc:
            reason = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            return CheckResult("port", "port free", Status.FAIL, f"{bind_host}:{plan.port} is {reason}",
                               fix="stop what listens there (`sparkit status`, `sparkit down`) or pass --port")
    return CheckResult("port", "port free", Status.PASS, f"{bind_host}:{plan.port} is free")


def check_model(plan: LaunchPlan, host: Host) -> CheckResult:
    model = plan.model
    title = "model"
    if model.startswith("sparkit:"):
        builds = ", ".join(b["dir"] for b in plan.model_builds)
        return CheckResult("model", title, Status.PASS, f"built-in {model}, built before launch if missing",
                           evidence=[builds] if builds else [])
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            return CheckResult("model", title, Status.FAIL, f"{model} has no config.json",
                               fix="point model.path at a checkpoint directory")
        return CheckResult("model", title, Status.PASS, f"local checkpoint {model}")
    if _HUB_ID.match(model) and not model.startswith((".", "/", "~")):
        return CheckResult("model", title, Status.PASS, f"hub id {model} (downloaded by the engine)")
    return CheckResult("model", title, Status.FAIL, f"{model} is neither a local directory nor a hub id",
                       fix="fix model.path (a directory, or org/name on the hub)")


def packages_check(adapter) -> CheckResult:
    """Are the engine's packages importable here (without importing them)?"""
    missing = [m for m in adapter.packages if importlib.util.find_spec(m) is None]
    if missing:
        return CheckResult("engine_packages", "engine packages", Status.FAIL, "missing " + ", ".join(missing),
                           fix=adapter.install_hint)
    return CheckResult("engine_packages", "engine packages", Status.PASS, "importable: " + ", ".join(adapter.packages))


def check_engine(plan: LaunchPlan, host: Host) -> list[CheckResult]:
    """The engine's own checks of this host (its adapter's `preflight`)."""
    from sparkit.engines.base import get_adapter

    return get_adapter(plan.engine).preflight(plan)


PREFLIGHT_CHECKS = [check_gpus, check_memory, check_port, check_model]


def run_preflight(plan: LaunchPlan, host: Host) -> list[CheckResult]:
    """Every preflight check, in a stable order: the general ones, then the engine's."""
    return [check(plan, host) for check in PREFLIGHT_CHECKS] + check_engine(plan, host)
