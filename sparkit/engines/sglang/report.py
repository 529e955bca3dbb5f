"""The activation report written from inside an SGLang process (schema: sparkit.engines.activation).

One file per TP rank (`activation-tp{rank}.json` in $SPARKIT_REPORT_DIR), rewritten when the
picture changes: after the target's weights load (target only) and after the draft received its
lm_head (target + draft). Everything is read from the live modules, so the report says what
really runs: the lm_head weight dtype and quant method class, whether the draft's head *is* the
target's module (identity and storage pointer), the MoE layers' quant method and runner.

Reading engine internals must never break the engine: every probe falls back to "unknown".
Nothing here imports sglang at module level.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path

from sparkit.engines.activation import (
    REPORT_DIR_ENV,
    ActivationReport,
    LmHeadReport,
    ModelReport,
    MoeReport,
    SpeculativeReport,
)

logger = logging.getLogger("sparkit.sglang")

# Substrings of MoE quant-method class names -> expert weight format.
_FORMATS = (("mxfp4", "mxfp4"), ("fp4", "fp4"), ("fp8", "fp8"), ("int4", "int4"), ("w4a", "int4"),
            ("awq", "int4"), ("gptq", "int4"), ("unquantized", "bf16"))


def lm_head_report(head, target_head=None) -> LmHeadReport:
    weight = getattr(head, "weight", None)
    dtype = str(getattr(weight, "dtype", "unknown")).replace("torch.", "")
    try:
        ptr = int(weight.data_ptr()) if weight is not None else 0
    except Exception:  # meta tensors and the like
        ptr = 0
    shared = None
    if target_head is not None:
        shared = head is target_head
    return LmHeadReport(
        weight_dtype=dtype,
        quant_method=type(getattr(head, "quant_method", None)).__name__,
        module_id=id(head),
        storage_ptr=ptr,
        shared_with_target=shared,
        exact_top_k=getattr(head, "sparkit_exact_top_k", None),
    )


def expert_weight_format(quant_method_name: str) -> str:
    low = quant_method_name.lower()
    for needle, fmt in _FORMATS:
        if needle in low:
            return fmt
    return "unknown"


# humming's weight dtypes (humming.dtypes names) -> sparkit's expert weight formats.
_HUMMING_DTYPES = (("float4e2m1", "mxfp4"), ("float8e4m3", "fp8"), ("int4", "int4"), ("uint4", "int4"), ("int8", "int8"))


def _humming_format(quant_method) -> str | None:
    """HummingMoEMethod quantises online from a config: the class name does not say to what, its
    weight schema does (b_dtype float4e2m1 with e8m0 scales per 32 = MXFP4)."""
    config = getattr(quant_method, "quant_config", None)
    schema = getattr(config, "weight_schema", None)
    dtype = str(getattr(schema, "b_dtype", "") or "").lower()
    for needle, fmt in _HUMMING_DTYPES:
        if dtype.startswith(needle):
            return fmt
    return None


def moe_report(model, runner_backend: str | None = None) -> MoeReport | None:
    """The quant method most MoE expert layers use (FusedMoE-like modules: `quant_method` + experts)."""
    methods: Counter[str] = Counter()
    runners: Counter[str] = Counter()
    formats: Counter[str] = Counter()
    modules = getattr(model, "modules", None)
    if modules is None:
        return None
    for module in modules():
        cls = type(module).__name__
        qm = getattr(module, "quant_method", None)
        if qm is None or not ("MoE" in cls or "Experts" in cls or "Moe" in cls):
            continue
        name = type(qm).__name__
        methods[name] += 1
        if (humming := _humming_format(qm)) is not None:
            formats[humming] += 1
        cfg = getattr(module, "moe_runner_config", None)
        backend = getattr(cfg, "runner_backend", None) or getattr(qm, "runner_backend", None)
        if backend is not None:
            runners[str(getattr(backend, "value", backend))] += 1
    if not methods:
        return None
    method = methods.most_common(1)[0][0]
    fmt = formats.most_common(1)[0][0] if formats else expert_weight_format(method)
    runner = runners.most_common(1)[0][0] if runners else None
    if runner is None and "humming" in method.lower():
        runner = "humming"  # the humming methods run their own kernels whatever the backend flag says
    runner = runner or runner_backend or "unknown"
    return MoeReport(expert_weight_format=fmt, quant_method=method, runner=runner)


def model_report(model, role: str, target_model=None, runner_backend: str | None = None) -> ModelReport:
    head = getattr(model, "lm_head", None)
    target_head = getattr(target_model, "lm_head", None) if role == "draft" else None
    return ModelReport(
        model_class=type(model).__name__,
        lm_head=lm_head_report(head, target_head) if head is not None else LmHeadReport(
            weight_dtype="none", quant_method="none", module_id=0, storage_ptr=0,
            shared_with_target=False if role == "draft" else None),
        moe=moe_report(model, runner_backend),
    )


def _first(*values):
    for v in values:
        if v is not None:
            return v
    return None


def speculative_report(server_args=None) -> SpeculativeReport:
    bag = None
    try:
        from sglang.srt.runtime_context import get_spec

        bag = get_spec()
    except Exception:
        bag = None

    def read(name):
        return _first(getattr(bag, name, None) if bag is not None else None,
                      getattr(server_args, name, None))

    algo = read("speculative_algorithm")
    algo = getattr(algo, "name", algo)
    return SpeculativeReport(
        algorithm=str(algo) if algo is not None else None,
        num_steps=read("speculative_num_steps"),
        eagle_topk=read("speculative_eagle_topk"),
        num_draft_tokens=read("speculative_num_draft_tokens"),
        draft_model_path=read("speculative_draft_model_path"),
    )


def tp_rank_and_size(runner=None) -> tuple[int, int]:
    try:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        return int(parallel.tp_rank), int(parallel.tp_size)
    except Exception:
        return int(getattr(runner, "tp_rank", 0) or 0), int(getattr(runner, "tp_size", 1) or 1)


def moe_runner_backend() -> str | None:
    try:
        from sglang.srt.layers.moe.utils import get_moe_runner_backend

        backend = get_moe_runner_backend()
        return str(getattr(backend, "value", backend))
    except Exception:
        return None


def engine_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return "unknown"


def build_report(target_model, draft_model=None, *, tp_rank=0, tp_size=1, device="unknown",
                 speculative: SpeculativeReport | None = None, runner_backend: str | None = None,
                 notes: list[str] | None = None) -> ActivationReport:
    models = {"target": model_report(target_model, "target", runner_backend=runner_backend)}
    if draft_model is not None:
        models["draft"] = model_report(draft_model, "draft", target_model, runner_backend)
    return ActivationReport(
        engine="sglang", engine_version=engine_version(), device=str(device), models=models,
        speculative=speculative or SpeculativeReport(), tp_rank=tp_rank, tp_size=tp_size,
        notes=list(notes or []),
    )


def write_report(report: ActivationReport, directory: str | Path | None = None) -> Path | None:
    """Write it (no-op without $SPARKIT_REPORT_DIR); a failure is logged, never raised."""
    try:
        return report.write(directory or os.environ.get(REPORT_DIR_ENV))
    except Exception:
        logger.exception("sparkit: could not write the activation report")
        return None
