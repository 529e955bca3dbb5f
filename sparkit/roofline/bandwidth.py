"""Memory bandwidth: spec-sheet figures per device and target, and what this host measured.

A plan's bandwidth comes from, in order: a measurement on this host of the device the plan runs
on (`sparkit doctor --bandwidth`, stored in the data directory), the spec sheet of this host's
GPU when it fits the recipe's target, the spec of the target profile's device, or nothing (a CPU
that was never measured: the bytes are still reported, the limit is not).

Spec figures are peak memory bandwidth from the vendors' data sheets (GB/s = 1e9 bytes/s); a
measured copy reaches 70-90% of them, which is why a measured figure wins.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkit.gpu_specs import GPU_SPECS, gpu_spec, spec_by_key
from sparkit.host import detect_host, target_fit
from sparkit.paths import data_dir, ensure_dir, write_atomic


@dataclass(frozen=True)
class TargetDevice:
    """The device a target profile is written for, when the profile alone says which."""

    spec_key: str  # a GPU_SPECS substring
    gpus: int
    why: str


TARGET_DEVICES: dict[str, TargetDevice] = {
    "gb10": TargetDevice("GB10", 1, "the gb10 target is one DGX Spark"),
    # The TP4 study's GPUs have 148 SMs (its KDA tiling note: 256 CTAs are 1.7 waves): B200.
    "blackwell-tp4": TargetDevice("B200", 4, "the blackwell-tp4 target as in the TP4 study: 4 x B200 (148 SMs)"),
    "hopper": TargetDevice("H100", 1, "the hopper target's reference part: H100 SXM"),
}

STORE_FILE = "bandwidth.json"
STORE_FORMAT = 1


@dataclass
class Measurement:
    """One achievable-bandwidth measurement on a host."""

    host: str
    device: str  # "cpu" or "cuda:N <name>"
    device_name: str  # CPU model or GPU name
    read_gb_s: float  # bytes read / time (a reduction over a buffer much larger than the caches)
    copy_gb_s: float  # (bytes read + bytes written) / time of a buffer copy, as STREAM counts it
    buffer_bytes: int
    threads: int | None  # CPU: threads used
    method: str
    measured_at: str
    # How busy the machine was while it measured (None in a measurement stored before they were kept):
    load_avg_1m: float | None = None  # the 1-minute load average at the end
    others_cpu_cores: float | None = None  # CPU the other processes used meanwhile, in cores (ours excluded)
    cpu_count: int | None = None
    rounds: int | None = None  # measurements spread over time, the best kept

    @property
    def gb_s(self) -> float:
        """The figure plans use: decode steps read weights, so the read bandwidth."""
        return self.read_gb_s

    @property
    def busy(self) -> bool | None:
        """Whether other processes competed for the machine while it measured (memory bandwidth is
        shared: a busy machine measures low). None when the load was not recorded."""
        if self.others_cpu_cores is None:
            return None
        return self.others_cpu_cores > busy_threshold_cores(self.cpu_count)

    def conditions(self) -> str:
        """When and under what load, in words: what every line that uses the figure says."""
        when = _when(self.measured_at)
        if self.others_cpu_cores is None:
            return f"measured {when}, load not recorded"
        load = f"load {self.load_avg_1m:.1f}" if self.load_avg_1m is not None else "load average unknown"
        text = (f"measured {when} at {load}, other processes using {self.others_cpu_cores:.1f} of "
                f"{self.cpu_count or '?'} cores")
        if self.busy:
            text += ": a busy machine, so the figure may be low"
        return text


def busy_threshold_cores(cpu_count: int | None) -> float:
    """Other processes' CPU use above which a measurement counts as taken on a busy machine: half
    a core, or a quarter of the machine's cores if that is more."""
    return max(0.5, 0.25 * (cpu_count or 1))


def _when(iso: str) -> str:
    try:
        moment = _dt.datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if moment.tzinfo is None:  # a bare date (or a time of no known zone): as written
        return iso[:16].replace("T", " ")
    return moment.astimezone(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


@dataclass
class Bandwidth:
    """The bandwidth a plan is evaluated at, and where it came from."""

    gb_s: float | None  # per GPU (or the CPU); None: unknown
    devices: int  # how many of them share the work (TP)
    source: str  # "measured" | "spec" | "unknown"
    detail: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def this_host() -> str:
    return platform.node() or "unknown-host"


def store_path() -> Path:
    return data_dir() / STORE_FILE


def load_measurements(path: Path | None = None) -> list[Measurement]:
    """Stored measurements (an unreadable store reads as none: a plan must not fail over it)."""
    path = path or store_path()
    try:
        raw = json.loads(path.read_text())
        return [Measurement(**m) for m in raw.get("measurements", [])]
    except (OSError, ValueError, TypeError, AttributeError):
        return []


def save_measurement(measurement: Measurement, path: Path | None = None) -> Path:
    """Keep `measurement`, replacing an older one of the same host and device."""
    path = path or store_path()
    kept = [m for m in load_measurements(path) if (m.host, m.device) != (measurement.host, measurement.device)]
    kept.append(measurement)

    ensure_dir(path.parent)
    return write_atomic(path, json.dumps({"format": STORE_FORMAT, "measurements": [asdict(m) for m in kept]}, indent=1) + "\n")


def keep_best(measurement: Measurement, path: Path | None = None) -> tuple[Measurement, Path]:
    """Store `measurement` unless this host already holds a better one of the same device taken
    the same way (buffer size, threads): bandwidth does not rise under load, so the best figure is
    the machine's. Returns (what is stored now, the store)."""
    path = path or store_path()
    for old in load_measurements(path):
        if ((old.host, old.device, old.buffer_bytes, old.threads) == (measurement.host, measurement.device,
                                                                      measurement.buffer_bytes, measurement.threads)
                and old.read_gb_s > measurement.read_gb_s):
            return old, path
    return measurement, save_measurement(measurement, path)


def measured_for(kind: str, gpu_name: str | None = None, host: str | None = None) -> Measurement | None:
    """This host's stored measurement of its CPU (kind "cpu") or of a GPU named `gpu_name`."""
    host = host or this_host()
    for m in load_measurements():
        if m.host != host:
            continue
        if kind == "cpu" and m.device == "cpu":
            return m
        if kind == "gpu" and m.device != "cpu" and gpu_name and m.device_name == gpu_name:
            return m
    return None


def resolve_bandwidth(target: str, device_kind: str, tp: int, host: Any | None = None,
                      target_gpu: str | None = None) -> Bandwidth:
    """The bandwidth for a plan on `target` running on `device_kind` ("gpu" | "cpu") over `tp`
    devices. `host` is a sparkit.host.Host (detected when None)."""
    host = host if host is not None else detect_host()
    if device_kind == "cpu":
        m = measured_for("cpu")
        if m:
            threads = f"{m.threads} thread" + ("s" if (m.threads or 1) > 1 else "")
            return Bandwidth(m.gb_s, 1, "measured", f"{m.gb_s:.1f} GB/s read, measured on this host's CPU "
                             f"({threads}; {m.conditions()}; `sparkit doctor --bandwidth`)")
        return Bandwidth(None, 1, "unknown", "this host's CPU bandwidth was never measured",
                         ["run `sparkit doctor --bandwidth` to measure it"])
    fits = host.gpus and (target == "auto" or target_fit(host, target, "sglang")[0])
    if fits:
        gpu = host.gpus[0]
        m = measured_for("gpu", gpu.name)
        if m:
            return Bandwidth(m.gb_s, tp, "measured", f"{m.gb_s:.0f} GB/s read{_per_gpu(tp)}, measured on this host's "
                             f"{gpu.name} ({m.conditions()}; `sparkit doctor --bandwidth`)")
        spec = gpu_spec(gpu.name)
        if spec:
            return Bandwidth(spec[1], tp, "spec", f"{spec[1]:.0f} GB/s{_per_gpu(tp)}: {spec[0]} spec sheet (this host's GPU)",
                             ["`sparkit doctor --bandwidth` measures what it reaches"])
    if target_gpu is not None:  # the part the recipe names (recipe key target_gpu)
        name, gb_s = spec_by_key(target_gpu)
        return Bandwidth(gb_s, max(tp, 1), "spec", f"{gb_s:.0f} GB/s{_per_gpu(tp)}: {name} spec sheet (the recipe's "
                         f"target_gpu)")
    device = TARGET_DEVICES.get(target)
    if device is not None:
        name, gb_s = spec_by_key(device.spec_key)
        return Bandwidth(gb_s, max(tp, 1), "spec", f"{gb_s:.0f} GB/s{_per_gpu(tp)}: {name} spec sheet ({device.why})")
    return Bandwidth(None, tp, "unknown", f"target {target!r} names no device and this host has no GPU sparkit knows",
                     ["run the plan on the machine that serves it, after `sparkit doctor --bandwidth`"])


def _per_gpu(tp: int) -> str:
    return " per GPU" if tp > 1 else ""


# ---------------------------------------------------------------- measuring


def default_buffer_bytes(kind: str, free_bytes: int | None = None) -> int:
    """Large against every cache (an H200's L2 is 60 MB, a CPU's LLC tens of MB), small against memory."""
    target = 1 << 30 if kind == "gpu" else 256 << 20
    if free_bytes:
        target = min(target, max(free_bytes // 8, 16 << 20))
    return target


class LoadSampler:
    """How busy the machine is over a block: the other processes' CPU use (all CPU time minus this
    process's, threads included) in cores, and the load average at the end."""

    def __enter__(self) -> LoadSampler:
        import psutil

        self._me = psutil.Process()
        self._t0 = time.monotonic()
        self._busy0, self._own0 = _busy_seconds(psutil.cpu_times()), _own_seconds(self._me)
        self.others_cores: float | None = None
        self.load_avg_1m: float | None = None
        self.cpu_count = psutil.cpu_count() or 1
        return self

    def __exit__(self, *exc: object) -> None:
        import os

        import psutil

        wall = max(time.monotonic() - self._t0, 1e-6)
        others = (_busy_seconds(psutil.cpu_times()) - self._busy0) - (_own_seconds(self._me) - self._own0)
        self.others_cores = round(max(others, 0.0) / wall, 2)
        try:
            self.load_avg_1m = round(os.getloadavg()[0], 2)
        except OSError:
            self.load_avg_1m = None

    def stamp(self, m: Measurement, rounds: int) -> Measurement:
        m.others_cpu_cores, m.load_avg_1m, m.cpu_count, m.rounds = self.others_cores, self.load_avg_1m, self.cpu_count, rounds
        return m


def _busy_seconds(times: Any) -> float:
    idle = getattr(times, "idle", 0.0) + getattr(times, "iowait", 0.0)
    return sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _own_seconds(process: Any) -> float:
    t = process.cpu_times()
    return t.user + t.system


def measure_cpu(buffer_bytes: int | None = None, repeats: int = 5, rounds: int = 5, pause_s: float = 0.3) -> Measurement:
    """Single-thread read and copy bandwidth of this CPU with numpy (the embedded engine runs
    small models on one thread): `rounds` rounds `pause_s` apart (a moment of the machine's
    load does not decide it), `repeats` passes each after one warm-up pass; the best pass is kept,
    with the other processes' CPU use over the whole measurement."""
    import numpy as np

    size = buffer_bytes or default_buffer_bytes("cpu")
    n = max(size // 8, 1)
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    best_read = best_copy = 0.0
    with LoadSampler() as load:
        for round_index in range(rounds):
            if round_index:
                time.sleep(pause_s)
            for i in range(repeats + 1):
                t0 = time.perf_counter()
                float(src.max())  # reads every byte once (a SIMD reduction: sum's pairwise loop is compute-bound)
                t1 = time.perf_counter()
                np.copyto(dst, src)
                t2 = time.perf_counter()
                if i == 0:
                    continue  # the first pass of a round faults pages in / warms the caches
                best_read = max(best_read, src.nbytes / (t1 - t0) / 1e9)
                best_copy = max(best_copy, 2 * src.nbytes / (t2 - t1) / 1e9)
    return load.stamp(Measurement(
        host=this_host(), device="cpu", device_name=_cpu_name(), read_gb_s=best_read, copy_gb_s=best_copy,
        buffer_bytes=int(src.nbytes), threads=1,
        method=(f"numpy float64 max (read) and copyto (read+write) over {src.nbytes >> 20} MiB, best of {rounds} "
                f"rounds of {repeats}"),
        measured_at=_now(),
    ), rounds)


def measure_gpu(index: int = 0, buffer_bytes: int | None = None, repeats: int = 20, rounds: int = 5,
                pause_s: float = 0.3) -> Measurement:
    """Read and copy bandwidth of GPU `index` with torch, timed with CUDA events: the best of
    `rounds` rounds `pause_s` apart, each the mean of `repeats` passes."""
    import torch

    device = torch.device(f"cuda:{index}")
    free, _ = torch.cuda.mem_get_info(device)
    size = buffer_bytes or default_buffer_bytes("gpu", free)
    n = max(size // 4, 1)
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / repeats

    read_s = copy_s = math.inf
    with LoadSampler() as load:
        for round_index in range(rounds):
            if round_index:
                time.sleep(pause_s)
            read_s = min(read_s, timed(lambda: src.sum()))
            copy_s = min(copy_s, timed(lambda: dst.copy_(src)))
    nbytes = src.numel() * 4
    name = torch.cuda.get_device_name(device)
    return load.stamp(Measurement(
        host=this_host(), device=f"cuda:{index} {name}", device_name=name, read_gb_s=nbytes / read_s / 1e9,
        copy_gb_s=2 * nbytes / copy_s / 1e9, buffer_bytes=int(nbytes), threads=None,
        method=(f"torch sum (read) and copy_ (read+write) over {nbytes >> 20} MiB, CUDA events, best of {rounds} "
                f"rounds of the mean of {repeats}"),
        measured_at=_now(),
    ), rounds)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


__all__ = ["GPU_SPECS", "TARGET_DEVICES", "Measurement", "Bandwidth", "gpu_spec", "resolve_bandwidth",
           "measure_cpu", "measure_gpu", "save_measurement", "keep_best", "load_measurements", "measured_for",
           "store_path", "LoadSampler", "busy_threshold_cores"]
