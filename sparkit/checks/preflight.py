"""Preflight: can this host run this plan? Checked before anything is launched.

Each check looks at (plan, host) only and returns a CheckResult; the launcher
refuses to start when any of them fails (PreflightError, exit code 4).
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from sparkit.contract.checks import CheckResult, Status
from sparkit.contract.plan import LaunchPlan
from sparkit.engines.base import get_adapter
from sparkit.host import Host, target_fit
from sparkit.memory.checkpoint_location import plan_checkpoint_dirs
from sparkit.memory.fit import compute_fit, memory_basis
from sparkit.memory.floor import floor_bytes, floor_source, guard_settings
from sparkit.memory.guard import guard_supported
from sparkit.memory.meminfo import read_meminfo
from sparkit.memory.picture import memory_picture
from sparkit.memory.units import gib
from sparkit.paths import MIN_FREE_BYTES, free_bytes, runs_dir
from sparkit.runs.store import holder_of_port


def _target(plan: LaunchPlan) -> str:
    return str(plan.recipe.get("target", "auto"))


def check_gpus(plan: LaunchPlan, host: Host) -> CheckResult:
    return gpus_check(_target(plan), plan.engine, int((plan.recipe.get("stack") or {}).get("tp", 1) or 1), host)


def gpus_check(target: str, engine: str, tp: int, host: Host) -> CheckResult:
    """Does this host have the GPUs a recipe's target, engine and tp need? (Needs no plan, so
    `up` asks it before compiling: a GPU recipe on a CPU host fails at once, before the engine's
    parser is even imported.)"""
    ok, why = target_fit(host, target, engine)
    if ok and tp > 1 and host.gpu_count < tp:
        # A target of "one or more" GPUs (hopper, auto) says nothing of how many a TP plan spreads over.
        return CheckResult("gpus", "GPUs", Status.FAIL, f"stack.tp {tp} needs {tp} GPUs, found {host.gpu_count}",
                           evidence=[f"GPU{g.index}: {g.name} {g.sm}" for g in host.gpus] or [host.nvml_status],
                           fix=f"run on a host with {tp} GPUs, or --set stack.tp={max(host.gpu_count, 1)}")
    if target in ("auto", "cpu") and ok:
        return CheckResult("gpus", "GPUs", Status.PASS, f"target {target}: {why}",
                           evidence=[f"{host.gpu_count} GPU(s) detected"])
    if ok:
        return CheckResult("gpus", "GPUs", Status.PASS, f"target {target}: {why}",
                           evidence=[f"GPU{g.index}: {g.name} {g.sm}" for g in host.gpus])
    return CheckResult("gpus", "GPUs", Status.FAIL, f"target {target}: {why}",
                       evidence=[f"GPU{g.index}: {g.name} {g.sm}" for g in host.gpus] or [host.nvml_status],
                       fix="run on a host that matches the recipe's target, or pick a recipe for this host (`sparkit doctor`)")


def check_memory(plan: LaunchPlan, host: Host) -> CheckResult:
    """The memory fit (sparkit.memory.fit): weights from the safetensors headers, KV and state from
    config.json, headroom, and SGLang's mem_fraction_static semantics."""
    title = "memory fits"
    basis = memory_basis(plan, host)
    fit = compute_fit(plan, basis)
    terms = [f"weights {gib(fit.weights_bytes)}, KV and state {gib(fit.kv_bytes)}, headroom "
             f"{gib(fit.headroom_bytes)} (`sparkit plan {plan.recipe_name}` shows every term)"]
    evidence = terms + fit.arithmetic + fit.notes
    data = fit.to_dict()
    nominal = "" if basis is None or basis.measured else " (nominal: not measured on this host)"
    if fit.verdict == "fits":
        return CheckResult("memory", title, Status.PASS, fit.summary + nominal, evidence, data=data)
    if fit.verdict == "unknown":
        return CheckResult("memory", title, Status.WARN, fit.summary, evidence, data=data,
                           fix=fit.need or "run the preflight where the checkpoint is readable")
    if fit.verdict == "does-not-fit" and fit.pools and fit.pools.get("error"):
        return CheckResult("memory", title, Status.FAIL, fit.summary + nominal, evidence, data=data,
                           cause="SGLang's own pool sizing would find no room after the weights: " + fit.pools["error"],
                           fix="raise server.mem_fraction_static (it keeps P x (1 - f) free), size the pools explicitly "
                               "(--max-mamba-cache-size, --max-total-tokens in server.extra_args), or free the GPU: "
                               "stop servers that hold or are about to take its memory (`sparkit status`)")
    if fit.verdict == "does-not-fit":
        return CheckResult("memory", title, Status.FAIL, fit.summary + nominal, evidence, data=data,
                           cause="the weights, the KV cache and the runtime headroom need more memory than is free",
                           fix="a smaller checkpoint (fp4/fp8), a shorter model.context_length, fewer "
                               "server.max_running_requests, or more GPUs (stack.tp)")
    # fits-with: the recipe's mem_fraction_static (or none) is outside the range that fits
    fix = f"--set server.mem_fraction_static={fit.suggested_fraction} (fits between {fit.min_fraction} and {fit.max_fraction})"
    f = fit.mem_fraction_static
    too_low = f is not None and fit.min_fraction is not None and f < fit.min_fraction
    shared = basis is not None and basis.shared_with_os
    if too_low or (f is not None and shared):
        cause = ("SGLang refuses to start: the weights leave no memory for the KV cache" if too_low else
                 "on unified memory the engine would take what the OS needs: the machine can hang instead of an OOM")
        return CheckResult("memory", title, Status.FAIL, fit.summary + nominal, evidence, data=data, cause=cause, fix=fix)
    return CheckResult("memory", title, Status.WARN, fit.summary + nominal, evidence, data=data, fix=fix,
                       cause=None if f is None else "activations or CUDA graph capture may run out of GPU memory")


def check_memory_now(plan: LaunchPlan, host: Host) -> CheckResult:
    """What the OS can give right now, against the load guard's floor (the guard would stop an
    engine at once under it); on unified memory the whole picture (page cache, the checkpoint's
    share of it, swap, what NVML and CUDA would claim)."""
    title = "memory now"
    if guard_supported() is not None:
        return CheckResult("memory_now", title, Status.SKIP, guard_supported() or "")
    m = read_meminfo()
    floor = floor_bytes(plan.recipe, m.total)
    picture = memory_picture(host, plan_checkpoint_dirs(plan), meminfo=m)
    enabled = guard_settings(plan.recipe).get("enabled", True)
    detail = f"{gib(m.available)} available (MemAvailable), {gib(m.free)} free, page cache {gib(m.page_cache)}"
    if picture.checkpoints:
        detail += f" ({gib(picture.checkpoint_cached_bytes)} of it the model's files)"
    if picture.unified:
        detail += (f"; CUDA would report ~{gib(m.free)} free, NVML none (NotSupported); swap "
                   f"{gib(m.swap_used)} used of {gib(m.swap_total)}")
    detail += f"; guard floor {gib(floor)}" + ("" if enabled else " (guard off)")
    data = {"picture": picture.to_dict(), "floor_bytes": floor, "floor_source": floor_source(plan.recipe)}
    if enabled and m.available < floor:
        return CheckResult("memory_now", title, Status.FAIL,
                           f"only {gib(m.available)} is available, under the memory guard's floor of "
                           f"{gib(floor)}: the guard would stop the engine as soon as it starts",
                           picture.reasons, data=data,
                           fix="free memory (stop other servers: `sparkit status`), or lower server.memory_guard.floor_gib")
    return CheckResult("memory_now", title, Status.PASS, detail, picture.reasons, data=data)


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
            if exc.errno != errno.EADDRINUSE:
                return CheckResult("port", "port free", Status.FAIL, f"{bind_host}:{plan.port}: {exc.strerror or exc}",
                                   fix="`--port auto` picks a free port; or pass another --port")
            holder, run = holder_of_port(plan.port) or (None, None)
            held = f", held by {holder}" if holder else ""
            stop_it = f"stop it (`sparkit down {run.id}`)" if run is not None else "stop what listens there"
            return CheckResult("port", "port free", Status.FAIL, f"{bind_host}:{plan.port} is in use{held}",
                               fix=f"`--port auto` picks a free port; or {stop_it}, or pass another --port")
    return CheckResult("port", "port free", Status.PASS, f"{bind_host}:{plan.port} is free")


def check_model(plan: LaunchPlan, host: Host) -> CheckResult:
    """The checkpoints are on this machine: a built-in model (built before the launch), a local
    directory, or a hub model pulled into the Hugging Face cache (`sparkit pull`; the engine is
    given the snapshot and never downloads). A hub model not here refuses the launch with the
    exact pull command. An engine with its own model check (the embedded engine's `model_check`)
    is given this pull verdict and judges what it would load: the pulled snapshot, not the id."""
    pulled = pulls_check(plan)
    engine_check = getattr(get_adapter(plan.engine), "model_check", None)
    if engine_check is not None:
        return engine_check(plan, pulled)
    if pulled is not None:
        return pulled
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
    return CheckResult("model", title, Status.FAIL, f"{model} is neither a local directory nor a hub id",
                       fix="fix model.path (a directory, or org/name[@revision] on the hub)")


def pulls_check(plan: LaunchPlan) -> CheckResult | None:
    """The hub models of a plan (its model_pulls), whatever the engine: all here and verified
    (pass), here but not verified by sparkit (warn), or one not here (fail, with the exact
    `sparkit pull`). None for a plan that names no hub model."""
    title = "model"
    pulls = list(plan.model_pulls or [])
    if not pulls:
        return None
    missing = [p for p in pulls if not p.get("local")]
    if missing:
        refs = " ".join(p["ref"] for p in missing)
        return CheckResult("model", title, Status.FAIL,
                           "; ".join(f"{p['ref']} ({p['role']}) is not here: {p['detail']}" for p in missing),
                           evidence=[f"{p['key']}: {p['ref']}" for p in pulls],
                           cause="the engine is given a local copy and never downloads inside a launch",
                           fix=f"`sparkit pull {refs}` (or `sparkit up --pull ...` pulls it first)")
    unverified = [p for p in pulls if p.get("state") != "verified"]
    detail = "; ".join(f"{p['ref']}: {p['local']} ({p['state']})" for p in pulls)
    if unverified:
        refs = " ".join(p["ref"] for p in unverified)
        return CheckResult("model", title, Status.WARN, detail, evidence=[p["detail"] for p in unverified],
                           fix=f"`sparkit pull --check {refs}` verifies it against the hub's hashes")
    return CheckResult("model", title, Status.PASS, detail, evidence=[p["detail"] for p in pulls])


def check_engine(plan: LaunchPlan, host: Host) -> list[CheckResult]:
    """The engine's own checks of this host (its adapter's `preflight`)."""
    return get_adapter(plan.engine).preflight(plan)


def check_state_space(plan: LaunchPlan, host: Host) -> CheckResult:
    """The run's files (plan, record, the engine's log) go to sparkit's runs directory: a full disk
    there is said before anything starts, not as an error halfway through."""
    where = runs_dir()
    free = free_bytes(where)
    title = "disk space for the run"
    if free is None:
        return CheckResult("state_space", title, Status.SKIP, f"cannot tell the free space of {where}")
    fix = f"free space on the file system holding {where} (`df -h {where}`), or point SPARKIT_HOME elsewhere"
    if free < MIN_FREE_BYTES:
        return CheckResult("state_space", title, Status.FAIL,
                           f"{free // 1024} KiB free for {where}: a run needs at least {MIN_FREE_BYTES // 1024} KiB "
                           "(its plan, record and the engine's log)", fix=fix)
    if free < 64 * MIN_FREE_BYTES:
        return CheckResult("state_space", title, Status.WARN, f"{gib(free)} free for {where}: the engine's log may "
                           "fill it", fix=fix)
    return CheckResult("state_space", title, Status.PASS, f"{gib(free)} free for {where}")


def check_code_env(plan: LaunchPlan, host: Host) -> CheckResult:
    """The variables the recipe lets into the engine beyond its settings (server.allow_code_env):
    said before the launch, since they can make it run code the startup checks cannot tell from
    its own."""
    title = "recipe environment"
    if not plan.code_env:
        return CheckResult("code_env", title, Status.PASS,
                           f"server.env sets {len(plan.recipe.get('server', {}).get('env') or {})} variable(s), "
                           "all of them the engine's settings")
    names = ", ".join(plan.code_env)
    return CheckResult("code_env", title, Status.WARN,
                       f"the recipe lets {len(plan.code_env)} variable(s) outside the engine's settings into it "
                       f"(server.allow_code_env): {names}",
                       [f"{name}={plan.env.get(name, '')}: {why}" for name, why in plan.code_env.items()],
                       cause="each can make the engine load code the startup checks cannot tell from its own",
                       fix="keep them only if you trust where they point; remove them from the recipe's server.env "
                           "and server.allow_code_env otherwise",
                       data={"code_env": dict(plan.code_env)})


PREFLIGHT_CHECKS = [check_gpus, check_memory_now, check_memory, check_port, check_model, check_state_space,
                    check_code_env]


def run_preflight(plan: LaunchPlan, host: Host) -> list[CheckResult]:
    """Every preflight check, in a stable order: the general ones, then the engine's."""
    return [check(plan, host) for check in PREFLIGHT_CHECKS] + check_engine(plan, host)
