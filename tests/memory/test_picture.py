"""The memory picture: this machine's real /proc/meminfo and page cache, and a GB10's GPU through
NVML's real NotSupported error (the only fake: there is no GB10 here)."""

from __future__ import annotations

import psutil
from test_host import fake_nvml

from sparkit.host import detect_host
from sparkit.memory.meminfo import parse_meminfo, read_meminfo
from sparkit.memory.pagecache import evict_files, weight_files
from sparkit.memory.picture import memory_picture
from sparkit.models.tiny_ling.family import SHIPPED_DIR

TINY = SHIPPED_DIR / "tiny-ling-s0"


def test_meminfo_is_the_kernel_s_accounting():
    m = read_meminfo()
    assert m.source == "/proc/meminfo" and m.total == psutil.virtual_memory().total
    assert 0 < m.free <= m.available <= m.total and m.page_cache >= 0
    text = "MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 600 kB\nBuffers: 10 kB\nCached: 520 kB\nShmem: 30 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"
    parsed = parse_meminfo(text)
    assert (parsed.total, parsed.available, parsed.free, parsed.page_cache) == (1024000, 614400, 102400, 500 * 1024)


def test_the_model_s_share_of_the_page_cache_is_measured():
    files = weight_files([TINY])
    evict_files(files)
    cold = memory_picture(detect_host(), [TINY])
    assert cold.checkpoints[0].cached_bytes < 0.1 * cold.checkpoints[0].file_bytes
    for f in files:
        f.read_bytes()
    warm = memory_picture(detect_host(), [TINY])
    assert warm.checkpoints[0].cached_bytes > 0.9 * warm.checkpoints[0].file_bytes
    assert any("the model's own files" in r for r in warm.reasons)


def test_on_a_gb10_cuda_and_nvml_claims_are_shown_beside_memavailable():
    gb10 = detect_host(nvml=fake_nvml([{"name": "NVIDIA GB10", "cc": (12, 1), "memory": None}]))
    picture = memory_picture(gb10, [TINY])
    assert picture.unified and picture.nvml.startswith("NotSupported")
    assert picture.cuda_free_bytes == picture.meminfo["free"]  # CUDA's figure there: MemFree, not MemAvailable
    assert any("CUDA on the GB10 counts the page cache as used" in r for r in picture.reasons)
    h100 = detect_host(nvml=fake_nvml([{"name": "NVIDIA H100", "cc": (9, 0), "memory": 80 * 1024**3}]))
    discrete = memory_picture(h100)
    assert not discrete.unified and discrete.cuda_free_bytes is None and "GPU0 80.0 GiB free" in discrete.nvml
