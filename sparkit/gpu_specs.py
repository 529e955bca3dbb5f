"""GPU parts sparkit has a spec sheet for: peak memory bandwidth from the vendors' data sheets
(GB/s = 1e9 bytes/s). A fact that needs nothing of sparkit's, so that a recipe can name a part
(`target_gpu`) and the roofline read its figure (sparkit.roofline.bandwidth)."""

from __future__ import annotations

# (substring of the NVML device name, marketing name, GB/s). First match wins: specific first.
GPU_SPECS: tuple[tuple[str, str, float], ...] = (
    ("GB10", "NVIDIA GB10 (DGX Spark, LPDDR5X)", 273.0),
    ("GB300", "NVIDIA GB300", 8000.0),
    ("GB200", "NVIDIA GB200", 8000.0),
    ("B300", "NVIDIA B300", 8000.0),
    ("B200", "NVIDIA B200", 8000.0),
    ("RTX PRO 6000", "NVIDIA RTX PRO 6000 Blackwell", 1792.0),
    ("RTX 5090", "NVIDIA GeForce RTX 5090", 1792.0),
    ("H200", "NVIDIA H200", 4800.0),
    ("H100 NVL", "NVIDIA H100 NVL", 3900.0),
    ("H100 PCIe", "NVIDIA H100 PCIe", 2000.0),
    ("H100", "NVIDIA H100 SXM", 3350.0),
    ("H20", "NVIDIA H20", 4000.0),
    ("GH200", "NVIDIA GH200", 4000.0),
)


def gpu_spec(device_name: str) -> tuple[str, float] | None:
    """(marketing name, GB/s) for an NVML device name, or None for a GPU sparkit has no sheet for."""
    for key, name, gb_s in GPU_SPECS:
        if key.lower() in device_name.lower():
            return name, gb_s
    return None


def spec_by_key(key: str) -> tuple[str, float]:
    for k, name, gb_s in GPU_SPECS:
        if k == key:
            return name, gb_s
    raise KeyError(key)
