"""Kernel configurations swept by benchmarks/fp8_lm_head.py (--sweep) and the GPU tests: the
alternatives measured against the shipped ones (sparkit.kernels.fp8_gemv_triton.PACKED_DEFAULT,
UNPACKED_DEFAULT, FP32_DEFAULT). Benchmark material, not shipped: the kernels behind each `kind`
live in sparkit.kernels.fp8_gemv_triton, which dispatches on KernelConfig.kind.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparkit.kernels.fp8_gemv_triton import KernelConfig  # noqa: E402

DOT_CONFIGS = [
    KernelConfig("dot", bn, bk, w, s)
    for bn, bk, w, s in [
        (64, 128, 4, 4), (64, 256, 4, 3), (64, 256, 4, 4), (64, 512, 4, 3),
        (128, 128, 4, 4), (128, 128, 8, 4), (128, 256, 4, 3), (128, 256, 8, 3),
        (128, 256, 8, 4), (128, 512, 8, 2), (128, 512, 8, 3), (256, 128, 8, 3),
        (256, 256, 8, 3), (32, 256, 4, 4), (32, 512, 4, 3), (64, 512, 4, 4),
    ]
]
TMA_CONFIGS = [
    KernelConfig("tma", bn, bk, w, s)
    for bn, bk, w, s in [
        (64, 128, 4, 4), (64, 128, 4, 6), (64, 256, 4, 4), (128, 128, 4, 4), (128, 128, 8, 4),
        (128, 128, 4, 6), (128, 256, 4, 3), (128, 256, 8, 4), (256, 128, 8, 4), (256, 128, 8, 3),
        (64, 256, 4, 6), (128, 256, 4, 5),
    ]
]
CCR_CONFIGS = [
    KernelConfig("ccr", bn, bk, w, s)
    for bn, bk, w, s in [
        (16, 512, 4, 3), (32, 512, 4, 3), (32, 512, 8, 3), (64, 512, 8, 3), (32, 256, 4, 4),
        (64, 256, 8, 4), (16, 512, 4, 4), (64, 512, 8, 2),
    ]
]
PACKED_CONFIGS = [
    KernelConfig(kind, bn, bk, w, s)
    for kind in ("pk16x", "pk16t")
    for bn, bk, w, s in [
        (64, 128, 4, 4), (64, 128, 4, 3), (128, 128, 8, 4), (128, 128, 4, 3), (128, 128, 8, 5),
        (128, 128, 8, 6), (256, 128, 8, 3), (256, 128, 8, 4), (128, 256, 8, 3),
    ]
]
# pk16p reads activations that _prescale_rows_kernel already scaled and rounded to fp16: the main
# loop is the plain chained fp16 MMA, with no per-tile work on the activations.
PRESCALED_CONFIGS = [
    KernelConfig("pk16p", bn, bk, w, s)
    for bn, bk, w, s in [(128, 256, 4, 3), (128, 256, 8, 3), (128, 128, 8, 4), (256, 128, 8, 3)]
]
TMA16_CONFIGS = [
    KernelConfig("tma16", bn, bk, w, s)
    for bn, bk, w, s in [(64, 128, 4, 4), (128, 128, 8, 4), (128, 128, 4, 3), (64, 256, 4, 3)]
]
CC_CONFIGS = [
    KernelConfig("cc", bn, bk, w, s)
    for bn, bk, w, s in [
        (16, 128, 4, 3), (16, 256, 4, 3), (32, 128, 4, 3), (32, 256, 8, 3),
        (8, 256, 4, 3), (16, 512, 8, 3), (64, 128, 8, 3), (32, 128, 4, 4),
    ]
]

