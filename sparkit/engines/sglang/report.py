"""The activation report written from inside an SGLang process (schema: sparkit.engines.activation_report).

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
from pathlib import Path

from sparkit.engines.activation_report import (
    REPORT_DIR_ENV,
    SECRET_VALUE,
    ActivationReport,
    EmbeddingReport,
    EngineSwitch,
    LmHeadReport,
    ModelReport,
    MoeLayerReport,
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


def _humming_schemas(module, quant_method) -> list:
    """The humming weight schemas a layer runs: after loading, a pre-quantised MXFP4 layer holds one
    per sublayer (`layer.weight_schemas`, set by prepare_humming_moe_layer); online humming
    quantises from its config's schema (HummingMoEMethod.quant_config.weight_schema)."""
    schemas = getattr(module, "weight_schemas", None)
    if isinstance(schemas, dict) and schemas:
        return [schemas[k] for k in sorted(schemas)]
    schema = getattr(getattr(quant_method, "quant_config", None), "weight_schema", None)
    return [schema] if schema is not None else []


def _schema_text(schema) -> str:
    parts = [f"{attr}={getattr(schema, attr)}" for attr in ("b_dtype", "bs_dtype") if getattr(schema, attr, None) is not None]
    group = getattr(schema, "weight_scale_group_size", None)
    if group is not None:
        parts.append(f"group={group}")
    return " ".join(parts) or type(schema).__name__


def _humming_format(schemas: list) -> str | None:
    """The expert format humming's weight schema names (b_dtype float4e2m1 with e8m0 scales per 32
    = MXFP4): a humming method's class name does not say it."""
    for schema in schemas:
        dtype = str(getattr(schema, "b_dtype", "") or "").lower()
        for needle, fmt in _HUMMING_DTYPES:
            if dtype.startswith(needle):
                return fmt
    return None


def _weight_format(module, quant_method, name: str, schemas: list) -> str:
    """What the layer's expert weights hold: the humming schema, else what the stored weight says
    (Fp8MoEMethod holds MXFP4 experts as int8 pairs when the checkpoint marks them so), else the
    method's class name."""
    humming = _humming_format(schemas)
    if humming is not None:
        return humming
    if getattr(quant_method, "is_fp4_expert", False) or getattr(getattr(quant_method, "_fp8", None), "is_fp4_expert", False):
        return "mxfp4"
    return expert_weight_format(name)


def _runner(module, quant_method, runner_backend: str | None) -> str:
    """The runner the layer's quant method really runs: its own get_moe_runner_backend() (SGLang's
    contract), its runner, the layer's runner config, the global backend; humming methods run
    humming's kernels whatever the flag says."""
    backend = None
    try:
        get = getattr(quant_method, "get_moe_runner_backend", None)
        backend = get(module) if callable(get) else None
    except Exception:
        backend = None
    if backend is None:
        backend = getattr(getattr(quant_method, "runner", None), "runner_backend", None)
    if backend is None:
        backend = getattr(getattr(module, "moe_runner_config", None), "runner_backend", None) or getattr(quant_method, "runner_backend", None)
    if backend is not None:
        return str(getattr(backend, "value", backend))
    if "humming" in type(quant_method).__name__.lower():
        return "humming"
    return runner_backend or "unknown"


def moe_layers(model, runner_backend: str | None = None) -> list[MoeLayerReport]:
    """Every MoE expert layer of `model` (FusedMoE-like modules: a `quant_method`, a MoE class name)
    with what it really runs. A probe that fails reads "unknown", never raises."""
    named = getattr(model, "named_modules", None)
    if named is None:
        return []
    out = []
    for path, module in named():
        cls = type(module).__name__
        qm = getattr(module, "quant_method", None)
        if qm is None or not ("MoE" in cls or "Experts" in cls or "Moe" in cls):
            continue
        name = type(qm).__name__
        try:
            schemas = _humming_schemas(module, qm)
            fmt = _weight_format(module, qm, name, schemas)
            runner = _runner(module, qm, runner_backend)
            schema = "; ".join(_schema_text(x) for x in schemas) or None
        except Exception:  # never break the engine over a report
            fmt, runner, schema = expert_weight_format(name), runner_backend or "unknown", None
        out.append(MoeLayerReport(name=path or cls, quant_method=name, expert_weight_format=fmt, runner=runner,
                                  weight_schema=schema))
    return out


def moe_report(model, runner_backend: str | None = None) -> MoeReport | None:
    """Every MoE layer's quant method, expert format and runner, and the most common of each."""
    return MoeReport.of_layers(moe_layers(model, runner_backend))


def input_embeddings(model):
    """A model's token embedding module (SGLang's get_input_embeddings, else the usual attributes)."""
    try:
        get = getattr(model, "get_input_embeddings", None)
        found = get() if callable(get) else None
    except Exception:
        found = None
    inner = getattr(model, "model", None)
    return found or getattr(model, "embed_tokens", None) or getattr(inner, "word_embeddings", None) \
        or getattr(inner, "embed_tokens", None)


def embedding_report(model, target_model) -> EmbeddingReport | None:
    """A draft's embedding (a DSpark draft's `embed_tokens`, attached by SGLang), and whether it is
    the target's own module; None where the draft has no attribute of that name."""
    embed = getattr(model, "embed_tokens", None)
    if embed is None:
        return None
    return EmbeddingReport(module_id=id(embed), shared_with_target=embed is input_embeddings(target_model))


def model_report(model, role: str, target_model=None, runner_backend: str | None = None) -> ModelReport:
    head = getattr(model, "lm_head", None)
    target_head = getattr(target_model, "lm_head", None) if role == "draft" else None
    return ModelReport(
        model_class=type(model).__name__,
        lm_head=lm_head_report(head, target_head) if head is not None else LmHeadReport(
            weight_dtype="none", quant_method="none", module_id=0, storage_ptr=0,
            shared_with_target=False if role == "draft" else None),
        moe=moe_report(model, runner_backend),
        embed_tokens=embedding_report(model, target_model) if role == "draft" else None,
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


# The engine's own switches: every variable of the process's environment with this prefix is
# reported, with what the engine makes of it (sglang.srt.environ.envs).
SWITCH_PREFIX = "SGLANG_"


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _switch(value: str, field) -> EngineSwitch:
    """What sglang's registry entry `field` reads from `value` (sglang warns and runs the default
    for a value it cannot parse: recorded as `invalid`)."""
    import warnings

    try:
        default = field.default() if callable(field.default) else field.default
    except Exception:
        default = None
    invalid = None
    try:
        field.parse(value)
    except Exception as exc:  # sglang's parse raises ValueError; anything else is as unreadable
        invalid = str(exc) or type(exc).__name__
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            effective = field.get()
    except Exception as exc:
        effective, invalid = None, invalid or f"{type(exc).__name__}: {exc}"
    secret = bool(getattr(field, "secret", False))
    return EngineSwitch(value=SECRET_VALUE if secret else value,
                        effective=SECRET_VALUE if secret else _jsonable(effective),
                        default=SECRET_VALUE if secret else _jsonable(default), known=True, invalid=invalid)


def engine_switches() -> dict[str, EngineSwitch]:
    """Every SGLANG_* variable of this process's environment, with the value sglang reads from it
    (its registry, sglang.srt.environ.envs); a name the registry lacks is `known: false` (sglang
    ignores it). Without sglang's registry every name reads as unknown."""
    names = sorted(n for n in os.environ if n.startswith(SWITCH_PREFIX))
    if not names:
        return {}
    try:
        from sglang.srt.environ import EnvField, envs
    except Exception:
        envs, EnvField = None, None
    out = {}
    for name in names:
        field = getattr(envs, name, None) if envs is not None else None
        if EnvField is None or not isinstance(field, EnvField):
            out[name] = EngineSwitch(value=os.environ[name], known=False)
            continue
        try:
            out[name] = _switch(os.environ[name], field)
        except Exception:  # never break the engine over a report
            out[name] = EngineSwitch(value=os.environ[name], known=True, invalid="could not be read")
    return out


def build_report(target_model, draft_model=None, *, tp_rank=0, tp_size=1, device="unknown",
                 speculative: SpeculativeReport | None = None, runner_backend: str | None = None,
                 notes: list[str] | None = None,
                 engine_env: dict[str, EngineSwitch] | None = None) -> ActivationReport:
    models = {"target": model_report(target_model, "target", runner_backend=runner_backend)}
    if draft_model is not None:
        models["draft"] = model_report(draft_model, "draft", target_model, runner_backend)
        if speculative is not None and str(speculative.algorithm).upper() == "DSPARK" and speculative.block_size is None:
            # what the DSpark worker drafts: speculative_num_draft_tokens - 1 (resolve_runtime_config),
            # else the draft's own gamma (DSparkDraftMixin, from its config's block_size)
            gamma = getattr(draft_model, "gamma", None)
            tokens = speculative.num_draft_tokens
            speculative.block_size = tokens - 1 if isinstance(tokens, int) and tokens > 1 else (
                gamma if isinstance(gamma, int) else None)
    return ActivationReport(
        engine="sglang", engine_version=engine_version(), device=str(device), models=models,
        speculative=speculative or SpeculativeReport(), tp_rank=tp_rank, tp_size=tp_size,
        notes=list(notes or []), engine_env=dict(engine_env or {}),
    )


def write_report(report: ActivationReport, directory: str | Path | None = None) -> Path | None:
    """Write it (no-op without $SPARKIT_REPORT_DIR); a failure is logged, never raised."""
    try:
        return report.write(directory or os.environ.get(REPORT_DIR_ENV))
    except Exception:
        logger.exception("sparkit: could not write the activation report")
        return None
