"""Host detection. NVML is replaced only at the hardware boundary (this machine has no
GPU); the GB10 path raises the real NVMLError_NotSupported from nvidia-ml-py."""

from __future__ import annotations

import types

import psutil
import pynvml
import pytest

from sparkit.host import Gpu, Host, detect_host, target_fit

GIB = 1024**3


def fake_nvml(gpus: list[dict], nvlinks: int = 0):
    """An NVML module at the hardware boundary: the same functions and the real error classes."""

    def memory(handle):
        total = gpus[handle]["memory"]
        if total is None:  # GB10: NVML has no memory of its own to report
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(total=total, free=total, used=0)

    def nvlink(handle, link):
        if link >= 18:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link < nvlinks else 0

    return types.SimpleNamespace(
        NVMLError=pynvml.NVMLError,
        NVMLError_NotSupported=pynvml.NVMLError_NotSupported,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "580.95.05",
        nvmlSystemGetCudaDriverVersion=lambda: 13000,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: gpus[h]["name"],
        nvmlDeviceGetCudaComputeCapability=lambda h: gpus[h]["cc"],
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetNvLinkState=nvlink,
    )


def test_real_host_without_gpu_reports_cleanly():
    host = detect_host()
    assert host.ram_total_bytes == psutil.virtual_memory().total and host.cpu_cores >= 1
    if not host.gpus:  # this CI machine
        assert host.nvml_status and host.nvml_status != "ok"
        assert host.driver_version is None and host.gpu_memory_bytes(0) is None
        ok, why = target_fit(host, "gb10")
        assert not ok and "needs 1 GPU(s), found 0" in why
        assert target_fit(host, "cpu") == (True, "no GPU needed")
        assert target_fit(host, "auto", "sglang")[0] is False
        assert target_fit(host, "auto", "embedded")[0] is True
    assert host.to_dict()["ram_total_bytes"] == host.ram_total_bytes


def test_nvml_init_failure_is_reported_not_raised():
    def init():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    nvml = fake_nvml([])
    nvml.nvmlInit = init
    host = detect_host(nvml=nvml)
    assert host.gpus == [] and host.nvml_status.startswith("no NVIDIA driver (")


def test_gb10_memory_is_unified_when_nvml_cannot_report():
    host = detect_host(nvml=fake_nvml([{"name": "NVIDIA GB10", "cc": (12, 1), "memory": None}]))
    assert host.nvml_status == "ok" and host.driver_version == "580.95.05" and host.cuda_version == "13.0"
    gpu = host.gpus[0]
    assert gpu.unified_memory and gpu.memory_total_bytes is None and gpu.memory_note == "unified, NVML cannot report"
    assert gpu.sm == "sm_121" and host.unified_memory
    assert host.gpu_memory_bytes(0) == psutil.virtual_memory().total  # host RAM through psutil
    assert target_fit(host, "gb10") == (True, "1 x NVIDIA GB10 (sm_121)")
    ok, why = target_fit(host, "hopper")
    assert not ok and "needs sm_9x" in why
    assert host.to_dict()["gpus"][0]["sm"] == "sm_121"


def test_discrete_blackwell_tp4_with_nvlink():
    b200 = {"name": "NVIDIA B200", "cc": (10, 0), "memory": 180 * GIB}
    host = detect_host(nvml=fake_nvml([b200] * 4, nvlinks=18))
    assert host.gpu_count == 4 and host.gpu_memory_bytes(2) == 180 * GIB and not host.unified_memory
    assert host.gpu_links[0] == "GPU0: NVLink x18"
    assert target_fit(host, "blackwell-tp4")[0]
    ok, why = target_fit(host, "gb10")
    assert not ok and "needs sm_121" in why
    two = detect_host(nvml=fake_nvml([b200] * 2))
    ok, why = target_fit(two, "blackwell-tp4")
    assert not ok and why == "needs 4 GPU(s), found 2"
    assert two.gpu_links == ["GPU0: PCIe (no active NVLink)", "GPU1: PCIe (no active NVLink)"]


@pytest.mark.parametrize(("cc", "target", "ok"), [((9, 0), "hopper", True), ((8, 0), "hopper", False),
                                                  ((12, 0), "gb10", False)])
def test_compute_capability_family(cc, target, ok):
    host = Host(gpus=[Gpu(0, "gpu", cc, 80 * GIB)], ram_total_bytes=64 * GIB)
    assert target_fit(host, target)[0] is ok
