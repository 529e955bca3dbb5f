"""How an engine reads a checkpoint's bytes per decode step: what an adapter's `read_rules`
returns and sparkit.roofline.estimate prices."""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class ReadRules:
    """How an engine reads a layout (from a recipe's stack and where it runs)."""

    engine: str
    device: str  # "gpu" | "cpu"
    float_bytes: int | None  # every float weight read at this size (embedded: compute dtype); None = stored
    online_fp8: bool  # SGLang --quantization fp8: linear weights quantised to 1 byte at load
    lm_head: str  # bf16 | fp32 | fp8
    lm_head_exact_top_k: int
    router_bytes: int | None  # per router element (SGLang: router_dtype); None = as stored
    kv_bytes: int
    state_bytes: int  # linear-attention recurrent state (SGLang: float32 unless --mamba-ssm-dtype)
    conv_bytes: int
    tp: int
    explained: list[str] = field(default_factory=list)
    head_bytes: int | None = None  # bf16/fp32 head read at this size per weight; None = as stored
    fp8_head_dequantised: bool = False  # an FP8 head read through a dequantised copy (float_bytes each)
