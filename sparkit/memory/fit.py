"""The memory fit of a plan: what its engine will hold, term by term, and whether that fits.

Weights come from the checkpoint's safetensors headers (every tensor's dtype and shape), with
what the recipe's stack adds or frees at load: the FP8 lm_head copy (e4m3 + a float32 scale per
row) that sparkit's plugin quantises online, next to the bf16 head it keeps for exact re-scoring
when `stack.lm_head_exact_top_k > 0` (freed at 0); the NextN draft layer (loaded only with
speculative decoding) or a separate draft checkpoint. The KV cache and the linear-attention
state come from config.json (sparkit.memory.model_shape) at the recipe's context length and
`max_running_requests` (1 when unset: batch 1 at full context is the least a server must hold).

SGLang 0.5.23's semantics (mem_cache/kv_cache_configurator.py `_profile_available_bytes`): with
P the memory free when the engine starts (pre_model_load_memory; on an integrated GPU such as
GB10, psutil's MemAvailable), the KV pool is what is free after the weights load minus
P x (1 - mem_fraction_static). So the static part (weights + pool) is P x f, and P x (1 - f) is
left for activations and CUDA graphs and, on unified memory, for the OS. A recipe fits when

    f >= (weights + KV needed) / P           (else SGLang refuses: no memory for the KV cache)
    f <= 1 - (runtime headroom + floor) / P  (else activations, graphs or the OS run out)

For a hybrid model SGLang splits the pool between the linear-attention state and the KV cache
(mamba_full_memory_ratio, 0.9 by default), so the pool must be large enough for each share.
Runtime headroom uses SGLang's own estimate (arg_groups/memory_hook.py): 512 MiB + 1.5 MiB per
chunked-prefill token + 2 MiB per decode CUDA-graph batch size + the prefill graphs. The
embedded engine has no memory fraction: everything it holds must fit in MemAvailable minus the
floor.

Where the free memory is known, the fit also predicts what SGLang will allocate, formula by formula
(sparkit.memory.sglang_pool): the state pool's slots and its conv / ssm / intermediate sizes, the
KV pool's tokens and size, what is left after the pools, and the error SGLang raises when nothing
is left ("Not enough GPU memory for hybrid ... state cache", "Loaded weights leave no GPU memory
for the KV cache"): such a launch does not fit. P is what SGLang will measure: on a discrete GPU
NVML's free memory less the engine's own CUDA context and less what the servers sparkit is still
starting on that GPU will take (sparkit.memory.reservations); on an integrated GPU MemAvailable.
A checkpoint directory with a config.json and no weight files (what `--load-format dummy` serves)
is sized from its config through sparkit's declared layout (sparkit.roofline.profiles), and the
fit says so.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkit.checkpoint_headers import read_config, read_safetensors_index, safetensors_files
from sparkit.contract.flag_table import SPECULATIVE_DEFAULTS as SGLANG_SPECULATIVE_DEFAULTS
from sparkit.engines.base import flag_value, get_adapter
from sparkit.errors import DataError, HubError
from sparkit.host import target_fit
from sparkit.hub.remote import remote_checkpoint
from sparkit.memory.checkpoint_location import plan_checkpoints
from sparkit.memory.floor import floor_bytes, floor_source
from sparkit.memory.model_shape import ModelShape, UnsupportedConfig, model_shape
from sparkit.memory.reservations import reserved_on, starting_reservations
from sparkit.memory.sglang_pool import PRE_POOL_BYTES as SGLANG_PRE_POOL_BYTES
from sparkit.memory.sglang_pool import PoolInputs, size_pools
from sparkit.memory.units import GIB, MIB, gib
from sparkit.models.dspark.config import UNKNOWN_DRAFT_BLOCK_SIZE
from sparkit.roofline.profiles import VARIANTS, UnsupportedLayout, config_only_tensors, find_profile, tensor_infos
from sparkit.weight_formats import MX_BLOCK, SCALE_NAME

# Estimates of what an engine holds before it measures free memory (so P is that much lower than
# what the OS reports before the launch): a CUDA context, and on unified memory also SGLang's
# Python processes (scheduler, tokenizer manager, detokenizer), which live in the same memory.
# Measured on the H200: NVML reports 139.80 GiB free on the idle GPU (`sparkit doctor`, session 3)
# and SGLang's first "Load weight begin. avail mem=139.13 GB" (torch.cuda.mem_get_info in its own
# process, CUDA context and kernels loaded) is 0.67 GiB less; P is NVML's free minus this.
CUDA_CONTEXT_BYTES = int(0.67 * GIB)
SGLANG_PROCESSES_BYTES = 2 * GIB
# The embedded engine's process: Python, torch and the HTTP server. Measured: 244 MiB of unique
# memory (psutil USS) serving tiny-ling after its startup checks, CPU torch 2.13 on x86-64.
EMBEDDED_PROCESS_BYTES = 320 * MIB

# A target machine sparkit cannot measure from here: GB10 has 128 GB of unified memory; at its
# start an idle DGX OS desktop is assumed to use 6 GiB. On the Spark itself the fit reads
# MemAvailable instead, so this assumption only shapes `plan` on another machine.
NOMINAL_MEMORY_BYTES = {"gb10": 128 * 10**9}
NOMINAL_IDLE_USE_BYTES = 6 * GIB

# SGLang 0.5.23 defaults used below (checked against the installed source by the tests).
SGLANG_MAMBA_FULL_MEMORY_RATIO = 0.9  # share of the pool for linear-attention state : KV cache
SGLANG_MAMBA_SLOTS_PER_REQUEST = 3  # state slots per running request with the radix cache on
SGLANG_BAILING_DRAFT_TOKENS = SGLANG_SPECULATIVE_DEFAULTS["num_draft_tokens"]  # for Bailing when the recipe sets none
SGLANG_SPECULATIVE_MAX_RUNNING_REQUESTS = 48  # "Max running requests is reset to 48 for speculative decoding"
SGLANG_MLA_PREFILL_GRAPHS_MIB = 1536
SGLANG_MLA_PREFILL_GRAPH_MAX_TOKENS = 8192

VERDICTS = ("fits", "fits-with", "does-not-fit", "unknown")


@dataclass
class FitTerm:
    group: str  # "weights" | "kv" | "runtime" | "engine" | "reserve"
    name: str
    bytes: int
    detail: str  # how it was computed


@dataclass
class MemoryBasis:
    """The memory the engine will size itself from."""

    kind: str  # "unified" (GB10: GPU and OS share host memory) | "gpu" (per GPU) | "host" (CPU engine)
    capacity_bytes: int | None  # the device's total
    available_bytes: int | None  # free when the engine starts (before its own overhead)
    source: str  # where the figures come from
    measured: bool  # False: a nominal figure for a machine that is not this one
    # servers sparkit is still starting on these GPUs: what they will take beyond what they hold
    # now is not free (sparkit.memory.reservations); available_bytes has it taken off already
    reservations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def shared_with_os(self) -> bool:
        return self.kind in ("unified", "host")


@dataclass
class MemoryFit:
    recipe: str
    engine: str
    verdict: str  # one of VERDICTS
    summary: str  # one sentence
    checkpoint: str | None  # the directory read
    checkpoint_note: str  # where it was found, or why it could not be read
    need: str | None = None  # what would make an unknown verdict known
    terms: list[FitTerm] = field(default_factory=list)
    basis: MemoryBasis | None = None
    floor_bytes: int | None = None
    mem_fraction_static: float | None = None
    mem_fraction_source: str = ""
    min_fraction: float | None = None  # SGLang: the least f that leaves a KV cache
    max_fraction: float | None = None  # SGLang: the most f that leaves the runtime headroom and the floor
    suggested_fraction: float | None = None  # for a fits-with verdict
    required_available_bytes: int | None = None  # free memory the engine needs at start (per GPU)
    engine_bytes: int | None = None  # what the engine holds at steady state (per GPU)
    arithmetic: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # SGLang's own sizing at start (sparkit.memory.sglang_pool), where the free memory is known:
    # {"inputs": {...}, "predicted": the figures as SGLang logs them, "error": its refusal or None}
    pools: dict[str, Any] | None = None

    def total(self, group: str) -> int:
        return sum(t.bytes for t in self.terms if t.group == group)

    @property
    def weights_bytes(self) -> int:
        return self.total("weights")

    @property
    def kv_bytes(self) -> int:
        return self.total("kv")

    @property
    def headroom_bytes(self) -> int:
        return self.total("runtime") + self.total("engine") + self.total("reserve")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(weights_bytes=self.weights_bytes, kv_bytes=self.kv_bytes, headroom_bytes=self.headroom_bytes)
        return data


_size = gib


# ------------------------------------------------------------------------------- the basis

def _memory_model(plan: Any) -> str:
    """How the plan's engine takes memory (its adapter's `memory_model`): "mem_fraction_static"
    (SGLang: a static pool, a fraction of the device's memory, sized at start) or "host_process"
    (a process that holds what it loads, in host memory)."""
    return getattr(get_adapter(plan.engine), "memory_model", "mem_fraction_static")


def memory_basis(plan: Any, host: Any) -> MemoryBasis | None:
    """What the plan's engine will size from: this host when it is the plan's target, else the
    target's nominal memory where sparkit knows it (GB10), else None."""
    target = str((plan.recipe or {}).get("target", "auto"))
    if _memory_model(plan) == "host_process":
        return MemoryBasis("host", host.ram_total_bytes, host.ram_available_bytes,
                           "this host: MemAvailable", measured=True)
    runs_here, _ = target_fit(host, target, plan.engine)
    tp = int(((plan.recipe or {}).get("stack") or {}).get("tp", 1) or 1)
    if runs_here and host.gpus:
        gpus = host.gpus[:tp]
        pending = starting_reservations(host, [g.index for g in gpus])
        if all(g.unified_memory for g in gpus):
            reserved = reserved_on(pending, gpus[0].index)
            return MemoryBasis("unified", host.ram_total_bytes, host.ram_available_bytes - reserved,
                               "this host: MemAvailable (what SGLang 0.5.23 sizes from on an integrated GPU)"
                               + _reserved_note(pending, reserved), measured=True,
                               reservations=[r.to_dict() for r in pending])
        totals = [g.memory_total_bytes for g in gpus]
        if all(totals):
            frees = [(g.memory_free_bytes if g.memory_free_bytes is not None else g.memory_total_bytes)
                     - reserved_on(pending, g.index) for g in gpus]
            reserved = max(reserved_on(pending, g.index) for g in gpus)
            which = f"GPU0-{len(gpus) - 1}" if len(gpus) > 1 else "GPU0"
            return MemoryBasis("gpu", min(totals), min(frees),
                               f"this host: NVML free memory of {which} (what torch.cuda.mem_get_info reports before "
                               "the engine's own CUDA context)" + _reserved_note(pending, reserved),
                               measured=True, reservations=[r.to_dict() for r in pending])
    if target in NOMINAL_MEMORY_BYTES:
        capacity = NOMINAL_MEMORY_BYTES[target]
        return MemoryBasis("unified", capacity, capacity - NOMINAL_IDLE_USE_BYTES,
                           f"nominal {target} ({capacity / 10**9:.0f} GB; {gib(NOMINAL_IDLE_USE_BYTES)} assumed in use "
                           "at start): this host is not one", measured=False)
    return None


def _reserved_note(pending: list, reserved: int) -> str:
    if not pending:
        return ""
    runs = sorted({r.run_id for r in pending})
    return (f", less {gib(reserved)} that {len(runs)} server(s) still starting will take ({', '.join(runs)}: "
            "their fit's steady state less what they hold now)")


# ------------------------------------------------------------------------------- the checkpoint

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.|\.w_gate_up$|\.w_down$|\.w13_weight|\.w2_weight")
_SHARED_WITH_TARGET = re.compile(r"(embed_tokens|word_embeddings|shared_head\.head|lm_head)\.weight$")


def _is_draft_layer(name: str, num_hidden_layers: int) -> bool:
    if name.startswith(("mtp.", "model.mtp.")):
        return True
    m = _LAYER.search(name)
    return bool(m) and int(m.group(1)) >= num_hidden_layers


def _is_lm_head(name: str) -> bool:
    return name in ("lm_head.weight", "model.lm_head.weight")


@dataclass
class _Checkpoint:
    label: str  # its directory, or repo@commit for headers read from the hub
    tensors: list
    config: dict
    shape: ModelShape | None
    shape_problem: str | None
    config_only: str | None = None  # why the tensors come from config.json (no weight files), else None
    origin: str = "the safetensors headers"  # where the tensors' shapes come from


def _checkpoint_of(label: str, tensors: list, config: dict, tp: int, config_only: str | None = None) -> _Checkpoint:
    try:
        shape, problem = model_shape(config, tp), None
    except UnsupportedConfig as exc:
        shape, problem = None, str(exc)
    found = _Checkpoint(label, tensors, config, shape, problem, config_only)
    if config_only:
        found.origin = "config.json, through the declared layout"
    return found


def _read_checkpoint(directory: Path, tp: int) -> _Checkpoint:
    config = read_config(directory)  # DataError naming it: missing, not JSON, nested too deep
    found = safetensors_files(directory)
    config_only = None
    if found:
        files = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in found)
        tensors = _cached_index(str(directory), files)
    else:
        try:
            declared, config_only = config_only_tensors(config if isinstance(config, dict) else {})
        except UnsupportedLayout as exc:
            raise DataError(f"{directory}: no .safetensors files, and its config.json cannot be sized without them "
                            f"({exc})") from None
        tensors = list(declared.values())
    return _checkpoint_of(str(directory), tensors, config, tp, config_only)



def _open_checkpoint(location: Any, recipe: dict, tp: int, role: str) -> tuple[_Checkpoint | None, str]:
    """The checkpoint a location names and how it was read: a local directory's headers; for a
    hub model not here, its headers read from the hub by range requests (or kept from an earlier
    read of the same commit); when the hub cannot be asked either, the target's declared profile
    (sparkit.roofline.profiles), said so. (None, why) when none of these exists. DataError for a
    checkpoint whose files do not add up."""
    if location.readable:
        return _read_checkpoint(location.directory, tp), location.how
    if location.hub is None:
        return None, location.how

    try:
        remote = remote_checkpoint(location.hub)
    except HubError as exc:
        declared = _declared_checkpoint(location, recipe, tp) if role == "target" else None
        if declared is not None:
            return declared, (f"sparkit's declared profile of {declared.label}: {location.ref} is not here and its "
                              f"headers cannot be read from the hub ({exc.message})")
        return None, f"{location.how}; its headers cannot be read from the hub either: {exc.message}"
    return _checkpoint_of(remote.label, remote.tensors, remote.config, tp), remote.source


_DECLARED: dict[tuple[str, str], list] = {}


def _declared_tensors(profile: Any, weights: str) -> list:
    """A declared profile's tensors, built once per process (127k of them for Ling-3.0-flash)."""
    key = (profile.family, weights)
    if key not in _DECLARED:
        _DECLARED[key] = list(tensor_infos(profile.tensors(weights)).values())
    return _DECLARED[key]


def _declared_checkpoint(location: Any, recipe: dict, tp: int) -> _Checkpoint | None:
    profile = find_profile(location.hub.repo)
    weights = str((recipe.get("stack") or {}).get("weights", "bf16"))
    if profile is None or weights not in VARIANTS:
        return None
    tensors = _declared_tensors(profile, weights)
    declared = _checkpoint_of(f"{profile.title}{VARIANTS[weights][0]} ({VARIANTS[weights][1]})", tensors,
                              dict(profile.config), tp)
    declared.origin = "sparkit's declared profile"
    return declared


@functools.lru_cache(maxsize=4)
def _cached_index(directory: str, files: tuple) -> list:
    """The headers of a checkpoint, read once per process while its files stay the same (`plan`
    and the preflight both need them; a Ling checkpoint has 127k tensors)."""
    return list(read_safetensors_index(Path(directory)).tensors.values())


def _per_gpu(t, tp: int) -> int:
    """Bytes of one tensor on one TP rank: matrices and expert stacks are split, vectors replicated."""
    return t.nbytes if tp == 1 or len(t.shape) < 2 else -(-t.nbytes // tp)


def _describe(tensors: list, origin: str = "the safetensors headers") -> str:
    by_dtype: dict[str, int] = {}
    for t in tensors:
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
    parts = ", ".join(f"{d} {_size(b)}" for d, b in sorted(by_dtype.items(), key=lambda kv: -kv[1]))
    return f"{len(tensors)} tensor{'s' if len(tensors) != 1 else ''} from {origin} ({parts})"


# ------------------------------------------------------------------------------- flags

def _provider(plan: Any, optimisation: str) -> str | None:
    """Which path the plan provides `optimisation` by (its provisions: "sglang-env", "sparkit-plugin", ...)."""
    return next((p.provider for p in plan.provisions if p.optimisation == optimisation), None)


def _int_flag(argv: list[str], name: str) -> int | None:
    value = flag_value(argv, name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _sglang_capacity_defaults(capacity: int | None, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode CUDA-graph max batch size) SGLang picks from the device's
    capacity (arg_groups/memory_hook.py handle_gpu_memory_settings)."""
    if capacity is None:
        return 4096, 160
    mib = capacity / MIB
    if mib < 20 * 1024:
        return 2048, 8
    if mib < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def sglang_prefill_graph_sizes(max_tokens: int) -> list[int]:
    """SGLang 0.5.23's prefill CUDA-graph token counts up to max_tokens (cuda_graph_hook.py)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return [s for s in sizes if s <= max_tokens]


# ------------------------------------------------------------------------------- the fit

def compute_fit(plan: Any, basis: MemoryBasis | None) -> MemoryFit:
    """The memory fit of `plan` against `basis` (None: the requirement only)."""
    recipe = plan.recipe or {}
    locations = plan_checkpoints(plan)
    target = locations["target"]
    fit = MemoryFit(recipe=plan.recipe_name, engine=plan.engine, verdict="unknown", summary="",
                    checkpoint=str(target.directory) if target.directory else None, checkpoint_note=target.how,
                    basis=basis)
    if basis is not None:
        fit.floor_bytes = floor_bytes(recipe, basis.capacity_bytes or basis.available_bytes or 0)
    tp = int((recipe.get("stack") or {}).get("tp", 1) or 1)
    draft_loc = locations.get("draft")
    draft, draft_how = None, ""
    try:
        ckpt, how = _open_checkpoint(target, recipe, tp, "target")
        fit.checkpoint_note = how
        if ckpt is None:
            fit.summary = f"cannot read the checkpoint {target.ref}: {how}"
            fit.need = target.need
            return fit
        fit.checkpoint = ckpt.label
        if draft_loc is not None:
            draft, draft_how = _open_checkpoint(draft_loc, recipe, tp, "draft")
    except DataError as exc:
        fit.summary = f"cannot read the checkpoint: {exc}"
        fit.need = "a complete checkpoint (config.json and every .safetensors file its index names)"
        return fit
    if draft is not None and draft_how != draft_loc.how:
        fit.notes.append(f"draft {draft_loc.ref}: {draft_how}")
    extras: dict[str, Any] = {"checkpoint_file_bytes": 0 if ckpt.config_only else sum(t.nbytes for t in ckpt.tensors)}
    if ckpt.config_only:
        fit.checkpoint_note = f"{target.how}; {ckpt.config_only}"
        fit.notes.append(ckpt.config_only)
    if _memory_model(plan) == "host_process":
        _embedded_terms(fit, plan, ckpt, draft)
    else:
        extras.update(_sglang_terms(fit, plan, ckpt, draft, basis, tp))
    if draft_loc is not None and draft is None:
        fit.notes.append(f"the draft checkpoint {draft_loc.ref} cannot be read ({draft_how}): its weights "
                         "and KV are not counted")
        fit.need = draft_loc.need
        fit.verdict, fit.summary = "unknown", f"cannot read the draft checkpoint {draft_loc.ref}: {draft_how}"
        return fit
    if ckpt.shape is None:
        fit.summary = f"cannot size the KV cache from config.json: {ckpt.shape_problem}"
        fit.need = "a config.json with the model's attention shapes"
        return fit
    if _memory_model(plan) == "host_process":
        _embedded_verdict(fit, basis)
    else:
        _sglang_verdict(fit, plan, basis, extras)
    return fit


_PARTITIONS: dict[tuple[int, int], tuple[list, list, list, list, list]] = {}


def _partition(tensors: list, layers: int) -> tuple[list, list, list, list, list]:
    """(lm_head, NextN layers, the rest, its routed experts, its others), in one pass (a Ling
    checkpoint has 127k tensors); kept per process for a declared profile's tensors, built once."""
    key = (id(tensors), layers)
    declared = any(tensors is d for d in _DECLARED.values())
    if declared and key in _PARTITIONS:
        return _PARTITIONS[key]
    head, nextn, body, experts, others = [], [], [], [], []
    for t in tensors:
        if _is_lm_head(t.name):
            head.append(t)
        elif _is_draft_layer(t.name, layers):
            nextn.append(t)
        else:
            body.append(t)
            (experts if _EXPERT.search(t.name) else others).append(t)
    if declared:
        _PARTITIONS[key] = (head, nextn, body, experts, others)
    return head, nextn, body, experts, others


def _sglang_terms(fit: MemoryFit, plan: Any, ckpt: _Checkpoint, draft: _Checkpoint | None,
                  basis: MemoryBasis | None, tp: int) -> dict[str, Any]:
    """Adds the terms; returns what the verdict needs besides them. By part: the target's weights
    (and the FP8 head the plan provides), the draft's, the KV cache and linear-attention state,
    SGLang's runtime headroom, and what SGLang's own pool sizing reads."""
    method = (((plan.recipe.get("stack") or {}).get("speculative") or {}).get("method", "none"))
    layers = ckpt.shape.num_hidden_layers if ckpt.shape else int(ckpt.config.get("num_hidden_layers", 0))
    head, nextn, body, experts, others = _partition(ckpt.tensors, layers)
    _target_weight_terms(fit, plan, ckpt, head, experts, others, tp)
    draft_shape, draft_kv_layers, transient = _draft_terms(fit, ckpt, draft, nextn, method, tp)
    shape = ckpt.shape
    if shape is None:
        return {}
    kv = _kv_terms(fit, plan, shape, method, draft_shape, draft_kv_layers)
    transient = _runtime_terms(fit, plan, shape, head, basis, tp, kv["cap"], transient)
    pool_model = _pool_model(plan, ckpt, shape, kv, draft_kv_layers if draft_shape is not None else 0, method)
    argv = list(plan.argv)
    capped = kv["cap"] is not None and (not shape.hybrid or _int_flag(argv, "--max-mamba-cache-size") is not None)
    return {"capped": capped, "pool_model": pool_model, "transient_bytes": transient}


def _target_weight_terms(fit: MemoryFit, plan: Any, ckpt: _Checkpoint, head: list, experts: list, others: list,
                         tp: int) -> None:
    """The target's weights per GPU, and the FP8 head by the path the plan provides it: sparkit's
    plugin adds an e4m3 copy + a float32 scale per row and frees the bf16 weight only when exact
    re-scoring is off; SGLang's own (patched) FP8 head replaces it."""
    rank = f" / tp {tp}" if tp > 1 else ""
    fit.terms.append(FitTerm("weights", "routed experts", sum(_per_gpu(t, tp) for t in experts),
                             _describe(experts, ckpt.origin) + rank))
    fit.terms.append(FitTerm("weights", "attention, dense layers, embeddings, norms",
                             sum(_per_gpu(t, tp) for t in others), _describe(others, ckpt.origin) + rank))
    head_bytes = sum(_per_gpu(t, tp) for t in head)
    fit.terms.append(FitTerm("weights", "lm_head (checkpoint)", head_bytes, _describe(head, ckpt.origin) + rank))
    if plan.expectations.lm_head != "fp8" or not head:
        return
    rows = -(-head[0].shape[0] // tp)
    cols = head[0].shape[1] if len(head[0].shape) > 1 else 1
    fp8 = rows * cols + rows * 4
    if _provider(plan, "lm_head=fp8") == "sglang-env":
        fit.terms.append(FitTerm("weights", "FP8 lm_head (SGLang's own, replaces the bf16 weight)",
                                 fp8 - head_bytes, f"e4m3 {rows} x {cols} + scales - the bf16 weight"))
        return
    fit.terms.append(FitTerm("weights", "FP8 lm_head copy (sparkit plugin)", fp8,
                             f"e4m3 {rows} x {cols} x 1 B + a float32 scale per row"))
    exact = int(plan.expectations.lm_head_exact_top_k or 0)
    if exact:
        fit.notes.append(f"the bf16 lm_head ({_size(head_bytes)}) stays loaded for exact re-scoring of "
                         f"the {exact} best FP8 candidates (stack.lm_head_exact_top_k {exact}; 0 frees it)")
    else:
        fit.terms.append(FitTerm("weights", "bf16 lm_head freed (lm_head_exact_top_k 0)", -head_bytes,
                                 "only the FP8 copy is kept"))


def _draft_terms(fit: MemoryFit, ckpt: _Checkpoint, draft: _Checkpoint | None, nextn: list, method: str,
                 tp: int) -> tuple[ModelShape | None, int, int]:
    """The draft's weights: (its shape, its KV layers, bytes held only while SGLang sizes its pools)."""
    rank = f" / tp {tp}" if tp > 1 else ""
    if method == "nextn" and draft is None:
        loaded = [t for t in nextn if not _SHARED_WITH_TARGET.search(t.name)]
        fit.terms.append(FitTerm("weights", "NextN draft layer", sum(_per_gpu(t, tp) for t in loaded),
                                 _describe(loaded, ckpt.origin) + rank + "; embedding and lm_head shared with the target"))
        if ckpt.shape is None:
            return ckpt.shape, 1, 0
        # SGLang's NextN model builds its own embedding and lm_head and drops them for the
        # target's only in init_lm_head, after the target's pools were sized (scheduler:
        # tp_worker.alloc_memory_pool, then the draft's): at the profile they are still held
        rows = -(-ckpt.shape.vocab_size // tp)
        own = 2 * rows * ckpt.shape.hidden_size * 2
        fit.terms.append(FitTerm("weights", "NextN draft's own embedding and lm_head (until shared)", own,
                                 f"2 x {rows} x {ckpt.shape.hidden_size} x 2 B, held while "
                                 "SGLang sizes its pools, freed when the draft takes the target's"))
        return ckpt.shape, ckpt.shape.nextn_layers or 1, own
    if draft is not None:
        d_layers = draft.shape.num_hidden_layers if draft.shape else 0
        if method == "nextn":  # SGLang's NextN class loads only the draft checkpoint's NextN layer
            loaded = [t for t in draft.tensors if _is_draft_layer(t.name, d_layers) and not _SHARED_WITH_TARGET.search(t.name)]
            kv_layers = (draft.shape.nextn_layers if draft.shape else 0) or 1
            label = "NextN draft layer (from the draft checkpoint)"
        else:
            loaded = list(draft.tensors)
            kv_layers = draft.shape.full_attention_layers if draft.shape else 0
            label = f"{method} draft model"
        fit.terms.append(FitTerm("weights", label, sum(_per_gpu(t, tp) for t in loaded),
                                 _describe(loaded, draft.origin) + rank + f" ({draft.label})"))
        return draft.shape, kv_layers, 0
    if nextn:
        fit.notes.append(f"the checkpoint's NextN layer ({_size(sum(t.nbytes for t in nextn))}) is not loaded: "
                         "no speculative decoding")
    return None, 0, 0


def _kv_terms(fit: MemoryFit, plan: Any, shape: ModelShape, method: str, draft_shape: ModelShape | None,
              draft_kv_layers: int) -> dict[str, Any]:
    """The KV cache (the target's and the draft's) and the linear-attention state; returns the
    figures the pool model reads."""
    recipe, argv = plan.recipe, list(plan.argv)
    server, model = recipe.get("server") or {}, recipe.get("model") or {}
    spec = (recipe.get("stack") or {}).get("speculative") or {}
    context = model.get("context_length") or shape.max_position_embeddings
    if not context:
        fit.notes.append("no context length (model.context_length or max_position_embeddings): the KV cache is not sized")
        context = 0
    requests = int(server.get("max_running_requests") or 1)
    kv_dtype = (flag_value(argv, "--kv-cache-dtype") or "auto").lower()
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(model.get("dtype", "auto")), 2)
    kv_bytes = 1 if kv_dtype.startswith("fp8") else (2 if kv_dtype in ("bf16", "bfloat16", "fp16", "float16") else dtype_bytes)
    cap = _int_flag(argv, "--max-total-tokens")
    tokens = context * requests
    tokens_note = f"{context} tokens x {requests} request(s)"
    if cap is not None:  # the pool is exactly this large (when the static budget holds it)
        tokens, tokens_note = cap, f"{cap} tokens (--max-total-tokens)"
        if cap < context:
            fit.notes.append(f"--max-total-tokens {cap} holds less than one request at the full context of {context}")
    fit.notes.append(f"KV sized for max_running_requests {requests}" + ("" if server.get("max_running_requests") else
                     " (unset: SGLang adds as many requests as the pool then holds)"))
    per_token = shape.kv_bytes_per_token(kv_bytes)
    kv_full = per_token * tokens
    fit.terms.append(FitTerm("kv", f"KV cache ({shape.full_attention_layers} {shape.attention.upper()} layers)", kv_full,
                             f"{shape.full_attention_layers} layers x {shape.kv_values_per_token_layer} values "
                             f"({shape.detail}) x {kv_bytes} B x {tokens_note}"))
    if draft_kv_layers and draft_shape is not None:
        draft_per_token = draft_shape.kv_bytes_per_token(kv_bytes, layers=draft_kv_layers)
        fit.terms.append(FitTerm("kv", "draft KV cache", draft_per_token * tokens,
                                 f"{draft_kv_layers} layer(s) x {draft_shape.kv_values_per_token_layer} values x "
                                 f"{kv_bytes} B x {tokens_note}"))
        kv_full += draft_per_token * tokens
    if shape.hybrid:
        _linear_state_terms(fit, argv, shape, method, spec, requests, kv_full, _draft_block(plan))
    return {"per_token": per_token, "context": context, "cap": cap}


def _draft_block(plan: Any) -> int | None:
    """The DSpark draft's block size the plan read from its config (None: not DSpark, or unread)."""
    return getattr(getattr(plan, "expectations", None), "draft_block_size", None)


def _linear_state_terms(fit: MemoryFit, argv: list[str], shape: ModelShape, method: str, spec: dict[str, Any],
                        requests: int, kv_full: int, draft_block: int | None = None) -> None:
    """A hybrid model's linear-attention state: its slots, NEXTN's snapshots, and the rest of the
    pool SGLang's state : KV split leaves."""
    per_request = shape.linear_state_bytes_per_request()
    radix = "--disable-radix-cache" not in argv
    ratio = SGLANG_MAMBA_SLOTS_PER_REQUEST if radix else 1
    slots = _int_flag(argv, "--max-mamba-cache-size") or ratio * requests + 1
    state = per_request * slots
    fit.terms.append(FitTerm("kv", f"linear-attention state ({shape.linear_attention_layers} KDA layers)", state,
                             f"{shape.linear_attention_layers} layers x ({shape.linear_state_conv_values} bf16 conv + "
                             f"{shape.linear_state_temporal_values} x {shape.linear_state_temporal_bytes} B state) "
                             f"= {_size(per_request)} per slot x {slots} slots"
                             + (f" ({ratio} per request with the radix cache, + 1)" if radix else " (radix cache off)")))
    if method != "none":
        draft_tokens = _verify_tokens(spec, draft_block)
        snapshots = per_request * (requests + 1) * draft_tokens
        fit.terms.append(FitTerm("kv", "speculative state snapshots", snapshots,
                                 f"{_size(per_request)} x ({requests} + 1) requests x {draft_tokens} verified tokens"))
        state += snapshots
    ratio_full = float(flag_value(argv, "--mamba-full-memory-ratio") or SGLANG_MAMBA_FULL_MEMORY_RATIO)
    pool = max(kv_full * (1 + ratio_full), state * (1 + ratio_full) / ratio_full)
    split = int(pool - kv_full - state)
    if split > 0:
        share = "KV cache" if kv_full * (1 + ratio_full) >= state * (1 + ratio_full) / ratio_full else "state"
        fit.terms.append(FitTerm("kv", "rest of the pool (SGLang's state : KV split)", split,
                                 f"the pool is split state : KV = {ratio_full} : 1 (mamba_full_memory_ratio), so "
                                 f"the {share} needs a pool of {_size(pool)}"))


def _runtime_terms(fit: MemoryFit, plan: Any, shape: ModelShape, head: list, basis: MemoryBasis | None, tp: int,
                   cap: int | None, transient: int) -> int:
    """SGLang's own estimate of its runtime headroom (activations, CUDA graphs, an fp32 head's
    working copy), the CUDA context and, on unified memory, its processes and the OS floor;
    returns the bytes held only while SGLang sizes its pools."""
    recipe, argv = plan.recipe, list(plan.argv)
    server = recipe.get("server") or {}
    capacity = basis.capacity_bytes if basis else None
    chunked_default, max_bs_default = _sglang_capacity_defaults(capacity, tp)
    if capacity is None:
        fit.notes.append(f"device capacity unknown here: SGLang's defaults for an unknown device are assumed "
                         f"(chunked prefill {chunked_default}, decode graphs up to batch {max_bs_default}); a larger "
                         "GPU gets larger defaults and a larger activation estimate")
    chunked = _int_flag(argv, "--chunked-prefill-size") or chunked_default
    activations = (512 + max(chunked, 2048) * 1.5 + tp / 8 * 1024) * MIB
    fit.terms.append(FitTerm("runtime", "activations (SGLang's estimate)", int(activations),
                             f"512 MiB + 1.5 MiB x {max(chunked, 2048)} chunked-prefill tokens + {tp / 8 * 1024:g} MiB for tp {tp}"))
    graph = server.get("cuda_graph") or {}
    if graph.get("enabled", True):
        max_bs = graph.get("max_bs_decode") or max_bs_default
        if not graph.get("max_bs_decode") and server.get("max_running_requests"):
            max_bs = min(max_bs, int(server["max_running_requests"]))
        graphs = max_bs * 2 * MIB
        detail = f"2 MiB x decode batch sizes up to {max_bs}"
        if graph.get("prefill", True):
            if shape.attention == "mla":
                graphs += SGLANG_MLA_PREFILL_GRAPHS_MIB * MIB
                detail += f" + {SGLANG_MLA_PREFILL_GRAPHS_MIB} MiB of MLA prefill graphs"
            else:
                prefill_max = min(chunked, cap) if cap else chunked
                count = len(sglang_prefill_graph_sizes(prefill_max))
                graphs += count * 8 * MIB
                detail += f" + 8 MiB x {count} prefill graphs"
        fit.terms.append(FitTerm("runtime", "CUDA graphs (SGLang's estimate)", int(graphs), detail))
    if plan.expectations.lm_head == "fp32" and head:
        rows = -(-head[0].shape[0] // tp)
        transient = rows * head[0].shape[1] * 4
        fit.terms.append(FitTerm("runtime", "fp32 lm_head working copy", transient,
                                 "--enable-fp32-lm-head converts the head to fp32 in every forward "
                                 f"({rows} x {head[0].shape[1]} x 4 B)"))
    fit.terms.append(FitTerm("engine", "CUDA context", CUDA_CONTEXT_BYTES, "estimate, held before the engine measures free memory"))
    if basis is not None and basis.kind == "unified":
        fit.terms.append(FitTerm("engine", "SGLang processes (unified memory)", SGLANG_PROCESSES_BYTES,
                                 "estimate: scheduler, tokenizer manager and detokenizer share the GPU's memory"))
        fit.terms.append(FitTerm("reserve", "OS floor", fit.floor_bytes or 0, floor_source(recipe)))
    return transient


def _pool_model(plan: Any, ckpt: _Checkpoint, shape: ModelShape, kv: dict[str, Any], draft_kv_layers: int,
                method: str) -> dict[str, Any]:
    """What SGLang's own pool sizing reads (sparkit.memory.sglang_pool), for the prediction."""
    recipe, argv = plan.recipe, list(plan.argv)
    server = recipe.get("server") or {}
    spec = (recipe.get("stack") or {}).get("speculative") or {}
    resolved_requests = server.get("max_running_requests") or (SGLANG_SPECULATIVE_MAX_RUNNING_REQUESTS
                                                               if method != "none" else None)
    pool_model: dict[str, Any] = {
        "kv_cell_bytes": kv["per_token"], "kv_layers": shape.full_attention_layers, "draft_kv_layers": draft_kv_layers,
        "context_len": int(kv["context"] or shape.max_position_embeddings or 4096), "max_total_tokens": kv["cap"],
        "max_running_requests": int(resolved_requests) if resolved_requests else None,
    }
    if shape.hybrid:
        strategy = (flag_value(argv, "--mamba-radix-cache-strategy") or "extra_buffer").lower()
        kernel = int(ckpt.config.get("short_conv_kernel_size") or 4)
        pool_model.update(
            mamba_conv_bytes_per_req=shape.linear_attention_layers * shape.linear_state_conv_values * 2,
            mamba_ssm_bytes_per_req=(shape.linear_attention_layers * shape.linear_state_temporal_values
                                     * shape.linear_state_temporal_bytes),
            mamba_full_memory_ratio=float(flag_value(argv, "--mamba-full-memory-ratio") or SGLANG_MAMBA_FULL_MEMORY_RATIO),
            max_mamba_cache_size=_int_flag(argv, "--max-mamba-cache-size"),
            radix_cache="--disable-radix-cache" not in argv, extra_buffer=strategy == "extra_buffer",
            overlap_schedule="--disable-overlap-schedule" not in argv,
            conv_kernel=kernel, conv_channels_per_layer=shape.linear_state_conv_values // max(1, kernel - 1),
            linear_layers=shape.linear_attention_layers,
        )
    if method != "none":
        pool_model["spec_draft_tokens"] = _verify_tokens(spec, _draft_block(plan))
    return pool_model


def _verify_tokens(spec: dict[str, Any], draft_block: int | None) -> int:
    """Tokens one verify step scores: DSpark's block and its anchor (SGLang resolves
    speculative_num_draft_tokens to block_size + 1), NEXTN's num_draft_tokens."""
    if spec.get("method") == "dspark":
        return int(spec.get("block_size") or draft_block or UNKNOWN_DRAFT_BLOCK_SIZE) + 1
    return int(spec.get("num_draft_tokens") or SGLANG_BAILING_DRAFT_TOKENS)


def predict_pools(fit: MemoryFit, pre_model_load_bytes: float, fraction: float, pool_model: dict[str, Any]) -> Any:
    """SGLang's pool sizes at start for this fit's weights, P and mem_fraction_static
    (sparkit.memory.sglang_pool.size_pools): records them on the fit and returns them."""
    available = pre_model_load_bytes - fit.weights_bytes
    inputs = PoolInputs(pre_model_load_bytes=pre_model_load_bytes, available_bytes=available,
                        mem_fraction_static=fraction, **pool_model)
    sizes = size_pools(inputs)
    fit.pools = {"inputs": {"pre_model_load_gb": round(pre_model_load_bytes / GIB, 2),
                            "available_after_weights_gb": round(available / GIB, 2),
                            "mem_fraction_static": fraction, **pool_model},
                 "predicted": sizes.log_figures(), "error": sizes.error, "notes": sizes.notes,
                 "sizes": sizes.to_dict()}
    a = fit.arithmetic
    a.append(f"SGLang at start: P = {gib(pre_model_load_bytes)}, after the weights {gib(available)} free; rest = "
             f"{gib(available)} - {gib(inputs.pre_pool_bytes)} of buffers - P x (1 - {fraction}) = {gib(sizes.rest_bytes)}")
    if sizes.max_mamba_cache_size is not None and sizes.max_mamba_cache_size > 0:
        extra = (f", intermediate {gib(sizes.intermediate_ssm_bytes + sizes.intermediate_conv_bytes)}"
                 if sizes.intermediate_ssm_bytes else "")
        how = ("--max-mamba-cache-size" if pool_model.get("max_mamba_cache_size") is not None
               else f"{pool_model.get('mamba_full_memory_ratio', SGLANG_MAMBA_FULL_MEMORY_RATIO)} / "
                    f"{1 + pool_model.get('mamba_full_memory_ratio', SGLANG_MAMBA_FULL_MEMORY_RATIO):g} of rest")
        a.append(f"state pool ({how}): max_mamba_cache_size {sizes.max_mamba_cache_size} (conv {gib(sizes.conv_state_bytes)}, "
                 f"ssm {gib(sizes.ssm_state_bytes)}{extra})")
    if sizes.error:
        a.append(f"SGLang refuses to start: {sizes.error}")
        return sizes
    draft = f" + draft {gib(sizes.draft_kv_bytes)}" if sizes.draft_kv_bytes else ""
    a.append(f"KV pool: {sizes.kv_tokens} tokens ({gib(sizes.kv_bytes)}{draft})"
             + (" (--max-total-tokens)" if pool_model.get("max_total_tokens") is not None
                and sizes.kv_tokens == pool_model["max_total_tokens"] else "")
             + f"; left after the pools: {gib(sizes.pool_end_available_bytes)}")
    return sizes


def _floor3(x: float) -> float:
    return math.floor(x * 1000) / 1000


def _ceil3(x: float) -> float:
    return math.ceil(x * 1000) / 1000


def _sglang_verdict(fit: MemoryFit, plan: Any, basis: MemoryBasis | None, extras: dict[str, Any]) -> None:
    """The verdict on the terms: the range of mem_fraction_static that fits the memory free at
    start (P), or, with no figure for it here, what the start needs; then what SGLang's own pool
    sizing makes of it at steady state, and on unified memory the peak while loading."""
    server = plan.recipe.get("server") or {}
    static = fit.weights_bytes + fit.kv_bytes
    runtime, overhead, reserve = fit.total("runtime"), fit.total("engine"), fit.total("reserve")
    slack_need = runtime + reserve
    f = server.get("mem_fraction_static")
    fit.mem_fraction_static, fit.mem_fraction_source = (f, "server.mem_fraction_static") if f else (None, "")
    a = fit.arithmetic
    a.append(f"weights {gib(fit.weights_bytes)} + KV and state {gib(fit.kv_bytes)} = {gib(static)} "
             "(must fit in P x mem_fraction_static)")
    a.append(f"runtime headroom {gib(runtime)}" + (f" + OS floor {gib(reserve)}" if reserve else "")
             + f" = {gib(slack_need)} (must fit in P x (1 - mem_fraction_static))")
    if basis is None or basis.available_bytes is None:
        _sglang_requirement(fit, plan, f, static, slack_need, overhead)
        return
    p = basis.available_bytes - overhead
    a.insert(0, f"P = {gib(basis.available_bytes)} free at start ({basis.source}) - {gib(overhead)} the engine "
                f"holds before measuring = {gib(p)}")
    if p <= 0:
        fit.verdict = "does-not-fit"
        fit.summary = (f"does not fit: the server(s) still starting here will take what is free ({basis.source})"
                       if basis.reservations else
                       f"only {gib(basis.available_bytes)} is free: less than the engine's own start")
        return
    f_min, f_max = static / p, 1 - slack_need / p
    fit.min_fraction, fit.max_fraction = _ceil3(f_min), _floor3(f_max)
    # the headline's interval is these bounds rounded inwards to 3 decimals (min up, max down), so
    # that any value it admits fits: said beside the arithmetic, which would otherwise round to another figure
    a.append(f"mem_fraction_static >= {gib(static)} / {gib(p)} = {f_min:.4f}, rounded up: {fit.min_fraction}")
    a.append(f"mem_fraction_static <= 1 - {gib(slack_need)} / {gib(p)} = {f_max:.4f}, rounded down: {fit.max_fraction}")
    fit.required_available_bytes = int((static + slack_need) + overhead)
    if f is None:
        fit.mem_fraction_source = "unset"
        fit.notes.append("server.mem_fraction_static is unset: SGLang derives one from the device's capacity "
                         + ("(which NVML cannot report on GB10)" if basis.kind == "unified" else "")
                         + "; set it to pin the fit")
    if f_min > f_max:
        short = static + slack_need - p
        fit.verdict = "does-not-fit"
        fit.summary = (f"does not fit: needs {gib(static + slack_need + overhead)}, {gib(short)} more than the "
                       f"{gib(basis.available_bytes)} free")
        a.append(f"{f_min:.3f} > {f_max:.3f}: no mem_fraction_static works")
        return
    _fraction_verdict(fit, f, f_min, f_max, p, slack_need, reserve)
    if _steady_state(fit, basis, p, f, f_min, f_max, static, runtime, overhead, extras) and basis.kind == "unified":
        _loading_peak(fit, basis, p, overhead, extras["checkpoint_file_bytes"])


def _sglang_requirement(fit: MemoryFit, plan: Any, f: float | None, static: int, slack_need: int,
                        overhead: int) -> None:
    """With no figure of the memory free here: what the start needs (at the recipe's fraction)."""
    per = "per GPU " if _memory_model(plan) == "mem_fraction_static" else ""
    if f:
        p_need = max(static / f, slack_need / (1 - f))
        fit.required_available_bytes = int(p_need + overhead)
        fit.summary = (f"needs {gib(fit.required_available_bytes)} free {per}at start at mem_fraction_static {f} "
                       "(no memory figure for this target here)")
    else:
        p_need = static + slack_need
        fit.required_available_bytes = int(p_need + overhead)
        fit.summary = (f"needs at least {gib(fit.required_available_bytes)} free {per}at start "
                       "(no memory figure for this target here)")
    fit.arithmetic.append(f"P >= {gib(p_need)}, + {gib(overhead)} the engine holds before measuring = "
                          f"{gib(fit.required_available_bytes)} free at start")
    fit.need = "run on the target machine (or a GPU of the target kind) for a verdict"


def _fraction_verdict(fit: MemoryFit, f: float | None, f_min: float, f_max: float, p: float, slack_need: int,
                      reserve: int) -> None:
    """The verdict on the recipe's mem_fraction_static against the range that fits."""
    if f is None:
        fit.verdict, fit.suggested_fraction = "fits-with", fit.max_fraction
        fit.summary = f"fits with mem_fraction_static between {fit.min_fraction} and {fit.max_fraction}"
    elif f > f_max:
        fit.verdict, fit.suggested_fraction = "fits-with", fit.max_fraction
        fit.summary = (f"fits with mem_fraction_static <= {fit.max_fraction}; the recipe's {f} leaves "
                       f"{gib(p * (1 - f))} for {gib(slack_need)} of headroom" + (" and OS floor" if reserve else ""))
    elif f < f_min:
        fit.verdict, fit.suggested_fraction = "fits-with", fit.min_fraction
        fit.summary = (f"fits with mem_fraction_static >= {fit.min_fraction}; at the recipe's {f} the weights leave "
                       "no memory for the KV cache (SGLang refuses to start)")
    else:
        fit.verdict = "fits"
        fit.summary = f"fits: mem_fraction_static {f} is within [{fit.min_fraction}, {fit.max_fraction}]"


def _steady_state(fit: MemoryFit, basis: MemoryBasis, p: float, f: float | None, f_min: float, f_max: float,
                  static: int, runtime: int, overhead: int, extras: dict[str, Any]) -> bool:
    """What the engine holds once up, from SGLang's own pool sizing at the fraction it will use;
    False when that sizing refuses the start (the verdict then says so)."""
    a = fit.arithmetic
    used_f = f if f is not None and f_min <= f <= f_max else fit.suggested_fraction
    sized_at = f if f is not None else used_f  # SGLang sizes at the recipe's fraction, whatever fits
    sizes = predict_pools(fit, p, sized_at, extras["pool_model"]) if sized_at and extras.get("pool_model") else None
    if sizes is not None and sizes.error and f is not None and f >= f_min:
        # sparkit's own requirement passed, SGLang's formula does not (its state pool takes its share first)
        fit.verdict, fit.suggested_fraction = "does-not-fit", None
        fit.summary = f"does not fit: at mem_fraction_static {f} SGLang would refuse to start ({sizes.error.split('. ')[0]})"
        return False
    if sizes is not None and not sizes.error and used_f is not None and used_f == sized_at:
        held = (fit.weights_bytes - extras.get("transient_bytes", 0) + sizes.state_reserved_bytes + sizes.kv_bytes
                + sizes.draft_kv_bytes + sizes.req_to_token_bytes + SGLANG_PRE_POOL_BYTES)
        fit.engine_bytes = int(overhead + held + runtime)
        a.append(f"at steady state the engine holds {gib(fit.engine_bytes)} ({gib(overhead)} + weights and pools "
                 f"{gib(held)} + {gib(runtime)} runtime)" + (f", leaving {gib(basis.available_bytes - fit.engine_bytes)} "
                 f"of the {gib(basis.available_bytes)} free" if basis.available_bytes else ""))
    elif used_f is not None:
        if extras.get("capped"):
            static_held = static
            held_note = "weights + the capped pool"
        else:
            static_held = p * used_f
            held_note = f"P x {used_f}: the pool fills the static budget"
        fit.engine_bytes = int(overhead + static_held + runtime)
        a.append(f"at steady state the engine holds {gib(fit.engine_bytes)} ({gib(overhead)} + {held_note} + "
                 f"{gib(runtime)} runtime)" + (f", leaving {gib(basis.available_bytes - fit.engine_bytes)} of the "
                                               f"{gib(basis.available_bytes)} free" if basis.shared_with_os else ""))
    return True


def _loading_peak(fit: MemoryFit, basis: MemoryBasis, p: float, overhead: int, files: int) -> None:
    """On unified memory the checkpoint's page cache competes with the weights while they load."""
    peak = fit.weights_bytes + files + overhead
    if peak > basis.available_bytes:
        fit.arithmetic.append(f"while loading: weights {gib(fit.weights_bytes)} + the checkpoint's page cache "
                              f"{gib(files)} = {gib(peak - overhead)} > {gib(p)}: the kernel must drop page cache as "
                              "the engine loads; sparkit's load guard evicts the checkpoint's pages itself")


def _embedded_terms(fit: MemoryFit, plan: Any, ckpt: _Checkpoint, draft: _Checkpoint | None) -> None:
    """The embedded engine (sparkit.engines.embedded.engine): the checkpoint converted to the compute
    dtype, experts kept in their quantised form next to a decoded copy, the lm_head in its format."""
    recipe = plan.recipe
    stack, model = recipe.get("stack") or {}, recipe.get("model") or {}
    spec = stack.get("speculative") or {}
    compute = {"bfloat16": 2, "float32": 4}.get(str(model.get("dtype", "auto")), 4)
    cname = "bf16" if compute == 2 else "float32"
    fmt = stack.get("weights", "bf16")

    def values(tensors: list) -> int:
        """Weight values (a quantised export's U8 tensors pack two per byte; its scales are not values)."""
        return sum(t.numel * (2 if t.dtype == "U8" else 1) for t in tensors if not t.name.endswith(SCALE_NAME))

    def expert_terms(tensors: list, label: str) -> None:
        numel = values(tensors)
        stored_as = {"F8_E4M3": "fp8", "U8": "mxfp4"}.get(next((t.dtype for t in tensors if not t.name.endswith(SCALE_NAME)), ""))
        if stored_as:  # a quantised export: the engine decodes the checkpoint's values once and keeps only those
            fit.terms.append(FitTerm("weights", f"{label}: decoded from the checkpoint's {stored_as}", numel * compute,
                                     f"{numel} values x {compute} B ({cname}), decoded once at load"))
            return
        rows = sum(math.prod(t.shape[:-1]) for t in tensors)
        stored = {"bf16": numel * 2, "fp8": numel + rows * 4 * 2, "mxfp4": numel // 2 + numel // MX_BLOCK}[fmt]
        how = {"bf16": "bf16", "fp8": "e4m3 + two float32 scales per row", "mxfp4": f"e2m1 + an e8m0 scale per {MX_BLOCK}"}[fmt]
        fit.terms.append(FitTerm("weights", f"{label}: {fmt} form", stored, f"{numel} values as {how}"))
        fit.terms.append(FitTerm("weights", f"{label}: decoded copy", numel * compute,
                                 f"{numel} values x {compute} B ({cname}), decoded once at load"))

    layers = ckpt.shape.num_hidden_layers if ckpt.shape else 0
    head = [t for t in ckpt.tensors if _is_lm_head(t.name)]
    experts = [t for t in ckpt.tensors if _EXPERT.search(t.name)]
    rest = [t for t in ckpt.tensors if not _is_lm_head(t.name) and not _EXPERT.search(t.name)]
    fit.terms.append(FitTerm("weights", "dense weights, embeddings, norms", values(rest) * compute,
                             f"{values(rest)} values x {compute} B ({cname})"))
    expert_terms(experts, "experts")
    if head:
        n, cols = head[0].shape[0], head[0].shape[1]
        numel = n * cols
        lm = stack.get("lm_head", "bf16")
        if lm == "fp8":
            exact = int(stack.get("lm_head_exact_top_k", 0) or 0)
            fit.terms.append(FitTerm("weights", "FP8 lm_head", numel + n * 4, f"e4m3 {n} x {cols} + a float32 scale per row"))
            if exact:
                fit.terms.append(FitTerm("weights", "bf16 lm_head kept for exact re-scoring", numel * 2,
                                         f"{n} x {cols} x 2 B (stack.lm_head_exact_top_k {exact})"))
            if numel <= 1 << 26:
                fit.terms.append(FitTerm("weights", "FP8 lm_head decoded for the CPU path", numel * 4,
                                         f"{n} x {cols} x 4 B, kept by sparkit.kernels.fp8_linear on CPU"))
        else:
            b = 4 if lm == "fp32" else 2
            fit.terms.append(FitTerm("weights", f"{lm} lm_head", numel * b, f"{n} x {cols} x {b} B"))
    if spec.get("method") == "nextn" and draft is not None:
        d_layers = draft.shape.num_hidden_layers if draft.shape else 0
        d = [t for t in draft.tensors if _is_draft_layer(t.name, d_layers)]
        d_experts = [t for t in d if _EXPERT.search(t.name)]
        d_rest = [t for t in d if not _EXPERT.search(t.name)]
        fit.terms.append(FitTerm("weights", "draft NextN layer (draft checkpoint)", values(d_rest) * compute,
                                 f"{values(d_rest)} values x {compute} B ({draft.label})"))
        expert_terms(d_experts, "draft experts")
    shape = ckpt.shape
    if shape is None:
        return
    context = min(model.get("context_length") or shape.max_position_embeddings or 0, shape.max_position_embeddings or 1 << 62)
    per_token = shape.kv_bytes_per_token(compute, layers=layers)
    fit.terms.append(FitTerm("kv", "KV cache", per_token * context,
                             f"{layers} layers x {shape.kv_values_per_token_layer} values ({shape.detail}) x "
                             f"{compute} B x {context} tokens"))
    if spec.get("method") == "nextn":
        fit.terms.append(FitTerm("kv", "draft KV cache", shape.kv_bytes_per_token(compute, layers=1) * context,
                                 f"1 layer x {shape.kv_values_per_token_layer} values x {compute} B x {context} tokens"))
    if spec.get("method") == "dspark" and draft is not None:
        _embedded_dspark_terms(fit, draft, values(draft.tensors), compute, context)
    fit.terms.append(FitTerm("engine", "engine process (Python, torch, HTTP server)", EMBEDDED_PROCESS_BYTES, "estimate"))
    fit.terms.append(FitTerm("reserve", "OS floor", fit.floor_bytes or 0, floor_source(recipe)))


def _embedded_dspark_terms(fit: MemoryFit, draft: _Checkpoint, values: int, compute: int, context: int) -> None:
    """A DSpark draft on the embedded engine: its own weights in the compute dtype (the embedding
    and lm_head are the target's) and its context K/V over the whole context."""
    cname = "bf16" if compute == 2 else "float32"
    fit.terms.append(FitTerm("weights", "DSpark draft model (its layers, Markov and confidence heads; the "
                             "embedding and lm_head are the target's)", values * compute,
                             f"{values} values x {compute} B ({cname}; {draft.label})"))
    if draft.shape is not None:
        d = draft.shape
        fit.terms.append(FitTerm("kv", "DSpark draft's context K/V", d.kv_bytes_per_token(compute) * context,
                                 f"{d.full_attention_layers} layer(s) x {d.kv_values_per_token_layer} values "
                                 f"({d.detail}) x {compute} B x {context} tokens"))


def _embedded_verdict(fit: MemoryFit, basis: MemoryBasis | None) -> None:
    need = fit.weights_bytes + fit.kv_bytes + fit.total("runtime") + fit.total("engine")
    fit.engine_bytes = need
    fit.mem_fraction_source = "n/a (the embedded engine has no memory fraction)"
    fit.required_available_bytes = need + fit.total("reserve")
    fit.arithmetic.append(f"weights {gib(fit.weights_bytes)} + KV {gib(fit.kv_bytes)} + engine process "
                          f"{gib(fit.total('engine'))} = {gib(need)}")
    if basis is None or basis.available_bytes is None:
        fit.summary = f"needs {gib(fit.required_available_bytes)} free"
        return
    room = basis.available_bytes - fit.total("reserve")
    fit.arithmetic.append(f"room = {gib(basis.available_bytes)} free ({basis.source}) - OS floor "
                          f"{gib(fit.total('reserve'))} = {gib(room)}")
    if need <= room:
        fit.verdict, fit.summary = "fits", f"fits: needs {gib(need)} of {gib(room)}"
    else:
        fit.verdict, fit.summary = "does-not-fit", f"does not fit: needs {gib(need)}, {gib(room)} is free above the floor"
