"""The FP8 lm_head kernel's configuration per M, chosen on the GPU that runs it.

tune_packed(packed) times every candidate of fp8_gemv_triton.TUNE_CANDIDATES that fits the
packing, for each M in TUNE_MS (1..16 rows: decode, and verify with MTP), on the packed weight
itself, and keeps the fastest per M in `packed.tuned` (read by fp8_linear_packed_default through
PackedFp8Weight.config_for). At Ling's head (157184 x 2560: 402 MB of e4m3, larger than L2) every
call reads the weight from HBM, as in decoding, so no weight copies are needed. Calls are timed
through CUDA graphs, as SGLang replays decode, candidates interleaved round by round.

Safety, for a choice made unattended on a GPU no test ran on:
- before a candidate is timed, its logits (with the weight's exact top-k re-scoring, if any) are
  compared with PACKED_DEFAULT's at M = 1 and at the largest M; a candidate that fails to
  compile, launch or agree is dropped, and why is in the report;
- tuning never runs while a CUDA graph is being captured (SGLang captures after the weights are
  loaded; the plugin tunes at load, in convert_lm_head_to_fp8), and a weight smaller than
  TUNE_MIN_ELEMENTS is not worth it: both keep PACKED_DEFAULT;
- SPARKIT_FP8_TUNE=0 turns tuning off, =retune ignores the cache.

The choice is cached per GPU model, SM count, shape, packing, dtypes, re-scoring, Triton version
and kernel source (sparkit's cache dir, fp8-head-tuning.json), so a restarted server re-uses it
after one check of the chosen configs' outputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import triton

import sparkit.paths as paths
from sparkit.kernels import fp8_gemv_triton as fk

TUNE_MS = tuple(range(1, 17))
# Below this many weight elements (16M: a 6400 x 2560 head) the head is a small part of a step and
# the default config is kept (tiny-ling's 264 x 128 head is not tuned).
TUNE_MIN_ELEMENTS = 1 << 24
CACHE_NAME = "fp8-head-tuning.json"


@dataclass
class TuneReport:
    """What tune_packed did: `chosen` maps M to a config label; `times_us` M -> label -> median
    microseconds per call (measured runs only); `rejected` label -> why it was dropped."""

    source: str  # "measured" | "cache" | "skipped"
    reason: str = ""
    key: str = ""
    chosen: dict = field(default_factory=dict)
    times_us: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        """'M=1-3 ps16p:..., M=4-16 pk16p:...' (runs of M with one config), or why untuned."""
        if not self.chosen:
            return f"not tuned ({self.reason})" if self.reason else "not tuned"
        runs: list[list] = []
        for m in sorted(self.chosen):
            if runs and runs[-1][2] == self.chosen[m] and runs[-1][1] == m - 1:
                runs[-1][1] = m
            else:
                runs.append([m, m, self.chosen[m]])
        parts = [f"M={a}{'' if a == b else f'-{b}'} {label}" for a, b, label in runs]
        return f"tuned on this GPU ({self.source}): " + ", ".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)


def tuning_mode() -> str:
    """'off', 'retune' (ignore the cache) or 'on', from SPARKIT_FP8_TUNE."""
    value = os.environ.get("SPARKIT_FP8_TUNE", "1").strip().lower()
    if value in ("0", "off", "false", "no"):
        return "off"
    return "retune" if value == "retune" else "on"


def fitting_candidates(packed, candidates=None) -> list:
    """The candidates that read this packing (K block the packing's, stripes that split a tile)."""
    out = []
    for cfg in fk.TUNE_CANDIDATES if candidates is None else candidates:
        try:
            fk._check_config_fits(cfg, packed)
        except ValueError:
            continue
        out.append(cfg)
    return out


def _source_hash() -> str:
    with open(fk.__file__, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()[:16]


def cache_key(packed, device, x_dtype, out_dtype, candidates) -> str:
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = f"{props.name}/sm{props.multi_processor_count}"
    else:
        gpu = f"interpreter/sm{fk.INTERPRETER_SMS}"
    labels = hashlib.sha256(",".join(c.label() for c in candidates).encode()).hexdigest()[:8]
    return (f"{gpu}|{packed.n}x{packed.k}|pack{packed.block_n}x{packed.block_k}|exact{packed.exact_top_k}"
            f"|x:{str(x_dtype).replace('torch.', '')}|out:{str(out_dtype).replace('torch.', '')}"
            f"|triton{triton.__version__}|src{_source_hash()}|cand{labels}")


def _cache_path():
    return paths.cache_dir() / CACHE_NAME


def _read_cache() -> dict:
    try:
        with open(_cache_path(), encoding="utf-8") as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, ImportError):  # no cache yet, a damaged one, or no cache dir at all
        return {}


def _write_cache(key: str, report: TuneReport) -> None:
    data = _read_cache()
    data[key] = {"chosen": {str(m): label for m, label in report.chosen.items()},
                 "times_us": {str(m): t for m, t in report.times_us.items()},
                 "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path = _cache_path()
    paths.ensure_dir(path.parent)
    paths.write_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def _capturing() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


def time_graphs(fns: dict, reps: int = 8, rounds: int = 5, warmup: int = 2) -> dict:
    """name -> fn(): per-round microseconds per call of each fn, replayed from a CUDA graph of
    `reps` calls, the fns interleaved within each round (the order rotating), after `warmup`
    plain calls (which also compile). What sparkit tunes with and what the benchmark reports."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    torch.cuda.synchronize()
    graphs = {}
    for name in names:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fns[name]()
        graphs[name] = graph
        graph.replay()
    torch.cuda.synchronize()
    times = {name: [] for name in names}
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1000.0 / reps)
    del graphs
    return times


def _agrees(y, ref) -> str:
    """'' when y matches the reference logits (same argmax per row, and within the output's
    rounding: the kernels compute each logit with the same MMA steps in the same order), else why."""
    if y.shape != ref.shape:
        return f"shape {tuple(y.shape)} != {tuple(ref.shape)}"
    yf, rf = y.float(), ref.float()
    if not torch.isfinite(yf).all():
        return "non-finite logits"
    tol = (1e-5 if y.dtype == torch.float32 else 2.0 ** -7) * float(rf.abs().max()) + 1e-6
    worst = float((yf - rf).abs().max())
    if worst > tol:
        return f"logits differ from {fk.PACKED_DEFAULT.label()}'s by up to {worst:.3g} (allowed {tol:.3g})"
    if not torch.equal(yf.argmax(dim=1), rf.argmax(dim=1)):
        return f"argmax differs from {fk.PACKED_DEFAULT.label()}'s"
    return ""


def _probe_inputs(packed, m: int, device, x_dtype):
    """Hidden-state-like rows: heavier-tailed than normal, one channel 20x larger, unit RMS (seeded)."""
    g = torch.Generator(device="cpu").manual_seed(1234)
    x = torch.randn(m, packed.k, generator=g) * (1.0 + 4.0 * torch.rand(m, packed.k, generator=g) ** 8)
    x[:, packed.k // 3] *= 20.0
    x = x / x.pow(2).mean(dim=1, keepdim=True).sqrt()
    return x.to(device=device, dtype=x_dtype)


def _why_not_tuned(packed, mode: str, ms: list[int], min_elements: int, timer, device) -> str:
    """Why no tuning happens here ("" when it does)."""
    if mode == "off":
        return "SPARKIT_FP8_TUNE=0"
    if not ms:
        return "no M to tune for"
    if packed.n * packed.k < min_elements:
        return f"a {packed.n}x{packed.k} head is below {min_elements} elements"
    if timer is None and device.type != "cuda":
        return "no CUDA device to time on"
    if _capturing():
        return "a CUDA graph is being captured"
    return ""


def _cached_choice(key: str, by_label: dict[str, Any]) -> dict[int, Any]:
    """M -> config of the cache entry for `key` ({} when there is none, or it names a config not offered)."""
    entry = _read_cache().get(key)
    if not isinstance(entry, dict):
        return {}
    try:
        return {int(m): by_label[label] for m, label in entry.get("chosen", {}).items()}
    except (KeyError, ValueError, TypeError):
        return {}


def _median_times(packed, x, configs: list, out_dtype, timer, reps: int, rounds: int) -> dict[str, float]:
    """config label -> median per-round time (us) of the packed head on rows `x`."""
    fns = {c.label(): (lambda c=c: fk.fp8_linear_packed(x, packed, out_dtype, config=c)) for c in configs}
    per_round = timer(fns, reps, rounds)
    return {label: statistics.median(v) for label, v in per_round.items()}


def tune_packed(packed, ms=TUNE_MS, *, candidates=None, timer=None, reps: int = 8, rounds: int = 5,
                use_cache: bool | None = None, x_dtype=torch.bfloat16, out_dtype=torch.bfloat16,
                min_elements: int = TUNE_MIN_ELEMENTS, log=None) -> TuneReport:
    """Choose and set packed.tuned (M -> KernelConfig) on the device of packed.data; returns the
    report (also kept as packed.tuning). timer(fns, reps, rounds) -> name -> per-round us replaces
    the CUDA-graph timer (time_graphs); it is what lets the CPU interpreter run the selection.
    use_cache: None follows SPARKIT_FP8_TUNE (cached unless =retune)."""
    started = time.monotonic()
    device = packed.data.device
    ms = sorted({int(m) for m in ms if int(m) >= 1})
    mode = tuning_mode()
    report = TuneReport(source="skipped")

    def done(rep: TuneReport) -> TuneReport:
        rep.seconds = time.monotonic() - started
        packed.tuning = rep
        if log:
            log(f"FP8 head kernel: {rep.summary()} [{rep.seconds:.1f} s]")
        return rep

    skip = _why_not_tuned(packed, mode, ms, min_elements, timer, device)
    if skip:
        report.reason = skip
        return done(report)
    cands = fitting_candidates(packed, candidates)
    if fk.PACKED_DEFAULT not in cands:
        cands.insert(0, fk.PACKED_DEFAULT)
    key = cache_key(packed, device, x_dtype, out_dtype, cands)
    report.key = key
    if use_cache is None:
        use_cache = mode != "retune"
    by_label = {c.label(): c for c in cands}

    probe = {m: _probe_inputs(packed, m, device, x_dtype) for m in sorted({1, max(ms)})}
    refs = {m: fk.fp8_linear_packed(x, packed, out_dtype, config=fk.PACKED_DEFAULT) for m, x in probe.items()}

    def check(cfg) -> str:
        if cfg == fk.PACKED_DEFAULT:
            return ""
        try:
            for m, x in probe.items():
                why = _agrees(fk.fp8_linear_packed(x, packed, out_dtype, config=cfg), refs[m])
                if why:
                    return f"M={m}: {why}"
        except Exception as exc:  # a config that does not compile or launch here
            return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        return ""

    if use_cache:
        chosen = _cached_choice(key, by_label)
        if chosen and set(ms) <= set(chosen):
            bad = {c.label(): why for c in set(chosen.values()) if (why := check(c))}
            if not bad:
                packed.tuned = {m: chosen[m] for m in ms}
                report.source = "cache"
                report.chosen = {m: chosen[m].label() for m in ms}
                return done(report)
            report.rejected.update(bad)  # re-measure without them below

    for cfg in (c for c in cands if c.label() not in report.rejected):
        if why := check(cfg):
            report.rejected[cfg.label()] = why
    valid = [c for c in cands if c.label() not in report.rejected]
    big = _probe_inputs(packed, max(ms), device, x_dtype)
    tuned = {}
    for m in ms:
        report.times_us[m] = _median_times(packed, big[:m], valid, out_dtype, timer or time_graphs, reps, rounds)
        tuned[m] = by_label[min(report.times_us[m], key=report.times_us[m].get)]
    packed.tuned = tuned
    if device.type == "cuda":
        # The graphs' memory back to the driver: SGLang sizes its KV pool from free memory next.
        torch.cuda.empty_cache()
    report.source = "measured"
    report.chosen = {m: c.label() for m, c in tuned.items()}
    if use_cache or mode == "retune":
        try:
            _write_cache(key, report)
        except (OSError, ImportError) as exc:  # a read-only or absent cache dir costs a re-tune next time
            report.reason = f"choice not cached: {exc}"
    return done(report)
