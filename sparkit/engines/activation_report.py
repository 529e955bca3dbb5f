"""The activation report: what really runs, written from inside the engine process.

Both the embedded engine and sparkit's SGLang plugin write it; the startup checks
(sparkit.checks) read it. One JSON file per engine process / TP rank, named
`activation-tp{rank}.json`, in the directory given by the environment variable
`SPARKIT_REPORT_DIR` (sparkit's launcher sets it to the run directory).

Schema "sparkit.activation/2" (reports of schema /1, without `moe.layers`, are still read):

    {
      "schema": "sparkit.activation/2",
      "engine": "embedded" | "sglang",
      "engine_version": "0.1.0",
      "pid": 1234, "tp_rank": 0, "tp_size": 1,
      "device": "cpu" | "cuda:0",
      "written_at": "2026-11-29T17:00:00+00:00",
      "speculative": {"algorithm": "NEXTN" | "EAGLE" | "DSPARK" | null,
                      "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4,
                      "draft_model_path": null | "/path",
                      "block_size": 8},           # DSpark: tokens drafted per block (gamma); else null
      "models": {
        "target": ModelReport,
        "draft":  ModelReport | absent when no draft
      },
      "notes": ["free-form lines, e.g. 'Online FP8 quantization enabled for lm_head.'"],
      "engine_env": {"SGLANG_ENABLE_METADATA_GLUE_GRAPH": EngineSwitch, ...}   # optional (absent
                                      # from older reports, empty from the embedded engine)
    }

    EngineSwitch = {                  # one SGLANG_* variable in the engine process's environment
      "value": "1",                   # the string the process has ("<secret>" for a secret field)
      "effective": true,              # what the engine reads (sglang.srt.environ.envs.NAME.get())
      "default": false,               # what it reads when the variable is unset
      "known": true,                  # in the installed engine's registry (else it has no effect)
      "invalid": null                 # why the engine cannot read `value` (it then runs the default)
    }

    ModelReport = {
      "model_class": "TinyLingForCausalLM",
      "lm_head": {
        "weight_dtype": "float8_e4m3fn" | "bfloat16" | "float32",
        "quant_method": "Fp8LmHeadMethod" | "UnquantizedLinearMethod" | ...,
        "module_id": 140234,          # id() of the lm_head module object
        "storage_ptr": 9876543,       # data_ptr() of its weight storage
        "shared_with_target": true,   # draft only: same module object as the target's
        "exact_top_k": 4              # FP8 heads: candidates re-scored exactly from the bf16
                                      # weight per row (0: none); null where not applicable
      },
      "embed_tokens": {"module_id": 140240, "shared_with_target": true} | null,
                                      # the draft's embedding, where it has one of its own or shares
                                      # the target's (DSpark); null where the report does not say
      "moe": {"expert_weight_format": "bf16" | "fp8" | "mxfp4",     # the most common over the layers
              "quant_method": "Mxfp4HummingMoEMethod" | "EmbeddedFp8Experts" | ...,
              "runner": "humming" | "flashinfer_mxfp4" | "embedded-torch" | ...,
              "layers": [MoeLayerReport, ...]}                    # every MoE layer (schema /2)
    }

    MoeLayerReport = {
      "name": "model.layers.0.mlp.experts",   # the module's path in the model
      "quant_method": "Fp8MoEMethod",         # the class of the quant method its forward calls
      "expert_weight_format": "fp8",          # what its expert weights hold
      "runner": "triton",                     # the MoE runner backend that method runs
      "weight_schema": "b_dtype=float4e2m1 bs_dtype=float8e8m0 group=32" | null   # humming only
    }
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sparkit.paths import ensure_dir, write_atomic

SCHEMA = "sparkit.activation/2"
READABLE_SCHEMAS = ("sparkit.activation/1", SCHEMA)  # /1: no per-layer MoE list
REPORT_DIR_ENV = "SPARKIT_REPORT_DIR"
# An engine switch the engine's registry marks secret is reported without its value.
SECRET_VALUE = "<secret>"


@dataclass
class LmHeadReport:
    weight_dtype: str
    quant_method: str
    module_id: int
    storage_ptr: int
    shared_with_target: bool | None = None  # only meaningful for the draft
    exact_top_k: int | None = None  # FP8 heads: exact re-scoring candidates per row (0 = none)


@dataclass
class EmbeddingReport:
    module_id: int  # id() of the embedding module object
    shared_with_target: bool | None = None  # draft only: the target's own module


@dataclass
class MoeLayerReport:
    """One MoE layer: the quant method, expert weight format and runner it really runs."""

    name: str
    quant_method: str
    expert_weight_format: str
    runner: str
    weight_schema: str | None = None  # humming: the weight schema of its kernels


@dataclass
class MoeReport:
    """A model's MoE layers: the most common method, format and runner, and every layer."""

    expert_weight_format: str
    quant_method: str
    runner: str
    layers: list[MoeLayerReport] = field(default_factory=list)  # empty in a schema /1 report

    @classmethod
    def of_layers(cls, layers: list[MoeLayerReport]) -> MoeReport | None:
        """The summary of `layers` (the most common value of each field), None without layers."""
        from collections import Counter

        if not layers:
            return None

        def common(attr: str) -> str:
            return Counter(getattr(layer, attr) for layer in layers).most_common(1)[0][0]

        return cls(expert_weight_format=common("expert_weight_format"), quant_method=common("quant_method"),
                   runner=common("runner"), layers=list(layers))

    def per_layer(self) -> list[MoeLayerReport]:
        """Every layer; a schema /1 report (no list) reads as one entry standing for all of them."""
        if self.layers:
            return self.layers
        return [MoeLayerReport("(every MoE layer: a report without the per-layer list)", self.quant_method,
                               self.expert_weight_format, self.runner)]


@dataclass
class EngineSwitch:
    """One engine variable as the engine process sees it: its string, what the engine makes of it."""

    value: str
    effective: Any = None
    default: Any = None
    known: bool = True
    invalid: str | None = None


@dataclass
class ModelReport:
    model_class: str
    lm_head: LmHeadReport
    moe: MoeReport | None = None
    embed_tokens: EmbeddingReport | None = None


@dataclass
class SpeculativeReport:
    algorithm: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    draft_model_path: str | None = None
    block_size: int | None = None  # DSpark: tokens drafted per block


@dataclass
class ActivationReport:
    engine: str
    engine_version: str
    device: str
    models: dict[str, ModelReport]
    speculative: SpeculativeReport = field(default_factory=SpeculativeReport)
    tp_rank: int = 0
    tp_size: int = 1
    pid: int = field(default_factory=os.getpid)
    written_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    notes: list[str] = field(default_factory=list)
    engine_env: dict[str, EngineSwitch] = field(default_factory=dict)
    schema: str = SCHEMA

    @property
    def target(self) -> ModelReport | None:
        return self.models.get("target")

    @property
    def draft(self) -> ModelReport | None:
        return self.models.get("draft")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, directory: str | Path | None = None) -> Path | None:
        """Write activation-tp{rank}.json atomically; returns the path (None if no directory)."""
        directory = directory or os.environ.get(REPORT_DIR_ENV)
        if not directory:
            return None

        path = Path(directory) / f"activation-tp{self.tp_rank}.json"
        ensure_dir(path.parent)
        return write_atomic(path, json.dumps(self.to_dict(), indent=2))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ActivationReport:
        if data.get("schema") not in READABLE_SCHEMAS:
            raise ValueError(f"unknown activation report schema {data.get('schema')!r}")
        models = {}
        for role, m in data.get("models", {}).items():
            moe = dict(m.get("moe") or {})
            layers = [MoeLayerReport(**layer) for layer in moe.pop("layers", None) or []]
            models[role] = ModelReport(
                model_class=m["model_class"],
                lm_head=LmHeadReport(**m["lm_head"]),
                moe=MoeReport(**moe, layers=layers) if moe else None,
                embed_tokens=EmbeddingReport(**m["embed_tokens"]) if m.get("embed_tokens") else None,
            )
        return cls(
            engine=data["engine"],
            engine_version=data.get("engine_version", ""),
            device=data.get("device", ""),
            models=models,
            speculative=SpeculativeReport(**(data.get("speculative") or {})),
            tp_rank=data.get("tp_rank", 0),
            tp_size=data.get("tp_size", 1),
            pid=data.get("pid", 0),
            written_at=data.get("written_at", ""),
            notes=list(data.get("notes", [])),
            engine_env={name: EngineSwitch(**switch) for name, switch in (data.get("engine_env") or {}).items()},
        )


def load_reports(directory: str | Path) -> list[ActivationReport]:
    """All activation-tp*.json files in a run directory, sorted by rank (may be empty)."""
    reports = []
    for path in sorted(Path(directory).glob("activation-tp*.json")):
        reports.append(ActivationReport.from_dict(json.loads(path.read_text())))
    return sorted(reports, key=lambda r: r.tp_rank)
