"""Host detection: GPUs (through NVML), host memory and cores, driver and CUDA versions.

NVML comes from the `nvidia-ml-py` package (module `pynvml`). On GB10 (DGX Spark)
NVML cannot report memory (NOT_SUPPORTED): the GPU shares the host's LPDDR5X, so
the memory figure is the host's, from psutil, marked "unified". Detection never
raises: what cannot be read is reported as unknown, with the reason.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkit.engines.base import get_adapter
from sparkit.recipes.schema import TARGETS


@dataclass
class Gpu:
    index: int
    name: str
    compute_capability: tuple[int, int] | None
    memory_total_bytes: int | None  # None when NVML cannot report it
    unified_memory: bool = False  # GB10: the GPU uses host memory
    memory_note: str = ""  # e.g. "unified, NVML cannot report"
    uuid: str | None = None
    memory_free_bytes: int | None = None  # NVML's free memory now (None when it cannot report)
    # The compute processes on it and the memory each holds (NVML; None when it cannot say, e.g.
    # in a container without the host's process table): {"pid": int, "used_bytes": int | None}
    processes: list[dict[str, int | None]] | None = None

    @property
    def sm(self) -> str | None:
        cc = self.compute_capability
        return f"sm_{cc[0]}{cc[1]}" if cc else None


@dataclass
class Host:
    gpus: list[Gpu] = field(default_factory=list)
    nvml_status: str = ""  # "ok" or why NVML is unavailable
    driver_version: str | None = None
    cuda_version: str | None = None
    gpu_links: list[str] = field(default_factory=list)  # e.g. "GPU0-GPU1: NVLink x18"
    ram_total_bytes: int = 0
    ram_available_bytes: int = 0
    cpu_cores: int = 0
    machine: str = ""  # x86_64, aarch64
    os: str = ""

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def unified_memory(self) -> bool:
        return any(g.unified_memory for g in self.gpus)

    def gpu_memory_bytes(self, index: int = 0) -> int | None:
        """Memory the GPU can use: its own, or the host's total when unified."""
        if index >= len(self.gpus):
            return None
        gpu = self.gpus[index]
        if gpu.unified_memory:
            return self.ram_total_bytes
        return gpu.memory_total_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for gpu, raw in zip(self.gpus, data["gpus"]):
            raw["sm"] = gpu.sm
        return data


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _import_nvml():
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError:
        return None
    return pynvml


def detect_host(nvml: Any = None) -> Host:
    """Detect this machine. `nvml` replaces the pynvml module (tests, at the hardware
    boundary only)."""
    import psutil

    vm = psutil.virtual_memory()
    host = Host(
        ram_total_bytes=int(vm.total),
        ram_available_bytes=int(vm.available),
        cpu_cores=os.cpu_count() or 0,
        machine=platform.machine(),
        os=f"{platform.system()} {platform.release()}",
    )
    nvml = nvml if nvml is not None else _import_nvml()
    if nvml is None:
        host.nvml_status = "nvidia-ml-py is not installed"
        return host
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded on machines without a GPU
        host.nvml_status = f"no NVIDIA driver ({_nvml_reason(exc)})"
        return host
    try:
        _read_nvml(nvml, host)
        host.nvml_status = "ok"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return host


def _nvml_reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text


def _read_nvml(nvml: Any, host: Host) -> None:
    try:
        host.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
    except Exception:
        pass
    try:
        v = int(nvml.nvmlSystemGetCudaDriverVersion())
        host.cuda_version = f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        pass
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:
        host.nvml_status = f"cannot count GPUs ({_nvml_reason(exc)})"
        return
    handles = []
    for i in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        handles.append(handle)
        try:
            name = _text(nvml.nvmlDeviceGetName(handle))
        except Exception:
            name = "unknown NVIDIA GPU"
        try:
            cc = tuple(int(x) for x in nvml.nvmlDeviceGetCudaComputeCapability(handle))
        except Exception:
            cc = None
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except Exception:
            uuid = None
        gpu = Gpu(index=i, name=name, compute_capability=cc, memory_total_bytes=None, uuid=uuid)  # type: ignore[arg-type]
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpu.memory_total_bytes = int(info.total)
            gpu.memory_free_bytes = int(info.free)
        except nvml.NVMLError_NotSupported:
            # GB10: the GPU has no memory of its own to report; it shares the host's.
            gpu.unified_memory = True
            gpu.memory_note = "unified, NVML cannot report"
        except Exception as exc:
            gpu.memory_note = f"unknown ({_nvml_reason(exc)})"
        gpu.processes = _processes(nvml, handle)
        host.gpus.append(gpu)
    host.gpu_links = _links(nvml, handles)


def _processes(nvml: Any, handle: Any) -> list[dict[str, int | None]] | None:
    """The compute processes NVML sees on a GPU with their memory (None when it cannot list them)."""
    query = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses", None)
    if query is None:
        return None
    try:
        found = query(handle)
    except Exception:  # NotSupported (GB10), NoPermission, or an old driver
        return None
    out = []
    for proc in found or []:
        used = getattr(proc, "usedGpuMemory", None)
        out.append({"pid": int(proc.pid), "used_bytes": int(used) if isinstance(used, int) and used >= 0 else None})
    return out


def _links(nvml: Any, handles: list[Any]) -> list[str]:
    if len(handles) < 2:
        return []
    out = []
    for i, handle in enumerate(handles):
        active = 0
        for link in range(18):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link):
                    active += 1
            except Exception:
                break
        out.append(f"GPU{i}: NVLink x{active}" if active else f"GPU{i}: PCIe (no active NVLink)")
    return out


def target_fit(host: Host, target: str, engine: str = "sglang") -> tuple[bool, str]:
    """Can this host run a recipe written for `target` on `engine`? (ok, why)."""
    profile = TARGETS[target]
    if profile.gpu_count == 0:
        if target == "auto" and get_adapter(engine).needs_gpu and not host.gpus:
            return False, f"{engine} needs an NVIDIA GPU and none was found"
        return True, "no GPU needed" if target == "cpu" else "runs on what this host has"
    if host.gpu_count < profile.gpu_count:
        return False, f"needs {profile.gpu_count} GPU(s), found {host.gpu_count}" + (
            f" ({host.nvml_status})" if not host.gpus and host.nvml_status else "")
    gpus = host.gpus[: profile.gpu_count]
    for gpu in gpus:
        cc = gpu.compute_capability
        if cc is None:
            return False, f"GPU{gpu.index} compute capability unknown"
        if profile.cc_exact and tuple(cc) != profile.cc_exact:
            want = f"sm_{profile.cc_exact[0]}{profile.cc_exact[1]}"
            return False, f"needs {want}, GPU{gpu.index} is {gpu.sm} ({gpu.name})"
        if profile.cc_majors and cc[0] not in profile.cc_majors:
            fams = "/".join(f"sm_{m}x" for m in profile.cc_majors)
            return False, f"needs {fams}, GPU{gpu.index} is {gpu.sm} ({gpu.name})"
    if profile.memory == "unified" and not all(g.unified_memory for g in gpus):
        return False, "needs unified memory (GB10); these GPUs have their own"
    return True, f"{profile.gpu_count} x {gpus[0].name} ({gpus[0].sm})"
