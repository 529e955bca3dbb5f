"""What an engine's startup log proves (LogEvidence: the lines the startup checks read) and the
cause of a failed start (Diagnosis): what an adapter's `read_log` and `diagnose` return."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class WeightLoad:
    """One "Load weight end." line: one per model (target, then the NextN draft)."""

    model_class: str | None
    quant: str | None
    elapsed_s: float | None
    line: str


@dataclass
class DecodeStat:
    """One periodic "Decode batch ..." line (every 40 decode steps)."""

    accept_length: float | None
    accept_rate: float | None
    gen_throughput: float | None
    graph: bool | None
    line: str


@dataclass
class LogEvidence:
    server_args: dict[str, Any] | None = None
    weight_loads: list[WeightLoad] = field(default_factory=list)
    mixed_mxfp4_experts: bool = False
    moe_backend_override: str | None = None  # "Bailing V3 mixed ... moe_runner_backend=X"
    humming_gemm: str | None = None  # "indexed" | "grouped" when humming MoE ran
    fp8_lm_head: bool = False
    graph_captures: int = 0
    graph_capture_failed: str | None = None
    decode_stats: list[DecodeStat] = field(default_factory=list)
    ready: bool = False
    rewrites: list[str] = field(default_factory=list)  # warnings where the engine changed a setting
    lines: dict[str, str] = field(default_factory=dict)  # evidence name -> the log line that proves it
    # SGLang's own "Engine startup timings (s)" line: {"load_weight": 0.14, "cuda_graph.prefill": 56.11, ...}
    startup_timings: dict[str, float] = field(default_factory=dict)

    @property
    def target_load(self) -> WeightLoad | None:
        return self.weight_loads[0] if self.weight_loads else None

    @property
    def draft_load(self) -> WeightLoad | None:
        drafts = [w for w in self.weight_loads if w.model_class and w.model_class.endswith("NextN")]
        if drafts:
            return drafts[-1]
        return self.weight_loads[1] if len(self.weight_loads) > 1 else None

    @property
    def last_accept_length(self) -> float | None:
        values = [d.accept_length for d in self.decode_stats if d.accept_length is not None]
        return values[-1] if values else None

    @property
    def last_gen_throughput(self) -> float | None:
        values = [d.gen_throughput for d in self.decode_stats if d.gen_throughput is not None]
        return values[-1] if values else None


@dataclass
class Diagnosis:
    cause: str  # short name: "out of memory", "unknown flag", ...
    detail: str  # one sentence for the user
    hint: str
    line: str | None = None  # the log line that gave it away
