"""The recipe schema: what a user writes in a recipe YAML file.

pydantic models with `extra="forbid"`, so a typo is an error rather than a
silently ignored key. The docstring under each field is the user documentation:
docs/recipe-reference.md is generated from it (scripts/gen_recipe_reference.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sparkit.contract.engine import engine_names
from sparkit.contract.flag_table import DEFAULT_PORT
from sparkit.gpu_specs import GPU_SPECS
from sparkit.kernels.rescoring import DEFAULT_EXACT_TOP_K
from sparkit.weight_formats import WEIGHT_FORMATS

# The MoE runner backends of sglang 0.5.23 plus the embedded engine's own. The
# sglang adapter also checks the value against the *installed* sglang's choices.
MoeBackend = Literal[
    "auto",
    "humming",
    "flashinfer_mxfp4",
    "flashinfer_cutlass",
    "flashinfer_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_cutedsl",
    "triton",
    "triton_kernel",
    "cutlass",
    "marlin",
    "deep_gemm",
    "aiter",
    "embedded-torch",
]

TargetName = Literal["auto", "gb10", "blackwell-tp4", "hopper", "cpu"]

MAX_TOKENS = 2**31 - 1  # a context length past this is no model's
MAX_GIB = 1024.0**2  # a memory figure past a PiB is a typo (and 1e300 GiB overflows a byte count)
MAX_EXTRA_ARGS = 512
MAX_GPUS = 4096  # tp / ep: far past any machine, and the roofline's arithmetic stays in floats
MAX_DRAFT = 1024  # speculative step and draft-token counts
MAX_BATCH = 2**20  # requests at once, CUDA-graph batch sizes

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# On a field: a change of this key changes the floating-point rounding of the logits, so greedy
# outputs may legitimately differ (`sparkit verify` then judges by token agreement, not byte-exact
# outputs; the recipe reference says so).
CHANGES_ROUNDING: dict[str, Any] = {"changes_rounding": True}


class _Strict(BaseModel):
    # allow_inf_nan: `1e309` reads as infinity, and no setting means infinity or NaN.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    """The model to serve."""

    path: str
    """Local checkpoint directory, hub id (`inclusionAI/Ling-3.0-flash`), or sparkit's built-in
    model: `sparkit:tiny-ling` (shipped; SGLang gets its Hugging Face BailingMoeV2 export) or
    `sparkit:tiny-ling-v3` (shipped; Ling-3.0's architecture, SGLang gets its BailingMoeV3 export), or
    another build of one, `sparkit:tiny-ling:seed=N:steps=S`, trained before the launch. A suffix
    names the export in a weights layout, for either engine: `@fp8` (block-128 FP8, the published
    -fp8 layout), `@mxfp4` (MXFP4 routed experts, FP8 elsewhere: the -fp4 layout), `@bf16`;
    `stack.weights` must then say the same. `@fp8+damaged-scale` / `@mxfp4+damaged-scale`: one
    expert's scale written wrong on purpose (the known-answer check must fail). Written before the
    launch (`sparkit model export-hf --weights`) and reused."""

    served_name: str | None = None
    """Name the server answers to in /v1/models and requests (default: engine's choice)."""

    trust_remote_code: bool = False
    """Allow the checkpoint's own Python code (needed by Ling on some sglang versions)."""

    context_length: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    """Maximum context length in tokens (default: the model's)."""

    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(default="auto", json_schema_extra=CHANGES_ROUNDING)
    """Activation / dense weight dtype."""

    overrides: dict[str, Any] = Field(default_factory=dict)
    """Model config overrides (sglang `--json-model-override-args`)."""


class Speculative(_Strict):
    """Speculative decoding. `method: none` (the default), `nextn` (the model's own MTP
    layer) or `dspark` (a separate block draft model). A bare string (`speculative: nextn`)
    is accepted as the method."""

    method: Literal["none", "nextn", "dspark"] = "none"
    """Which speculative decoder to use."""

    num_steps: int | None = Field(default=None, ge=1, le=MAX_DRAFT)
    """NEXTN: draft tokens proposed per step. Give all three numbers or none."""

    eagle_topk: int | None = Field(default=None, ge=1, le=MAX_DRAFT)
    """NEXTN: branching factor of the draft tree (1 = a chain)."""

    num_draft_tokens: int | None = Field(default=None, ge=1, le=MAX_DRAFT)
    """NEXTN: tokens verified per step; with eagle_topk 1 it must be num_steps + 1."""

    draft_model: str | None = None
    """Draft checkpoint: required for dspark (a LingDSparkModel checkpoint; `sparkit:tiny-ling-dspark`
    is the draft sparkit trains for tiny-ling, `sparkit:tiny-ling-v3-dspark` the one for tiny-ling-v3,
    `sparkit:tiny-ling-dspark:steps=0` one that never trained); for nextn it replaces the target's own NextN layer (`sparkit:tiny-ling:seed=1:steps=40`
    is a deliberately wrong draft)."""

    block_size: int | None = Field(default=None, ge=1, le=MAX_DRAFT)
    """DSpark: tokens drafted per block (sglang `--speculative-dspark-block-size`; each verify
    step checks block_size + 1 tokens: the anchor and the drafts). Unset = the draft checkpoint's
    block_size, the one it was trained for; the block size startup check compares the two."""

    @model_validator(mode="before")
    @classmethod
    def _bare_method(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"method": value}
        if value is None:
            return {"method": "none"}
        return value

    @property
    def enabled(self) -> bool:
        return self.method != "none"


class Stack(_Strict):
    """The optimisation stack."""

    weights: Literal[WEIGHT_FORMATS] = Field(default="bf16", json_schema_extra=CHANGES_ROUNDING)
    """What the checkpoint's expert weights hold (for the embedded engine with a bf16 checkpoint:
    what the experts are quantised to at load). Describes the checkpoint; it sets no
    `--quantization`. The `weights` startup check judges every MoE layer against it."""

    quantization: str | None = Field(default=None, json_schema_extra=CHANGES_ROUNDING)
    """Explicit sglang `--quantization` (online quantisation). Leave unset for pre-quantised
    checkpoints such as Ling's -fp4: a value that contradicts the checkpoint is an sglang error."""

    moe_backend: MoeBackend = Field(default="auto", json_schema_extra=CHANGES_ROUNDING)
    """MoE runner backend (`--moe-runner-backend`); `embedded-torch` or `auto` for the embedded engine."""

    lm_head: Literal["bf16", "fp32", "fp8"] = Field(default="bf16", json_schema_extra=CHANGES_ROUNDING)
    """Output layer precision: bf16 (the checkpoint's), fp32 (`--enable-fp32-lm-head`) or
    fp8 (online FP8 quantisation at load)."""

    lm_head_exact_top_k: int = Field(default=DEFAULT_EXACT_TOP_K, ge=0, le=64, json_schema_extra=CHANGES_ROUNDING)
    """With `lm_head: fp8`: how many of each row's best FP8 candidates are re-scored exactly
    from the bf16 weight, which sparkit then keeps next to the FP8 copy (on CUDA: the best
    vocabulary stretches, two tokens each). Near-ties then resolve as the bf16 head resolves
    them (top-1 agreement 100% where FP8 alone gives ~95% on a Ling-shaped head) for ~5% of the
    head's time and the bf16 weight's memory. 0 = FP8 only: frees the bf16 weight."""

    speculative: Speculative = Field(default_factory=Speculative)
    """Speculative decoding (see `speculative.*`). In a recipe that `extends` another, a
    different `method` replaces the base's whole speculative section; the same method merges."""

    attention_backend: str | None = None
    """Attention backend (`--attention-backend`), checked against the installed sglang."""

    kv_cache_dtype: str = Field(default="auto", min_length=1, max_length=64, json_schema_extra=CHANGES_ROUNDING)
    """KV cache storage dtype (SGLang's `--kv-cache-dtype`): `auto` (the model's dtype), `fp8_e4m3` or
    `fp8_e5m2` (half the KV bytes of bf16: a longer context fits, and each decode step reads less),
    `bf16`, ...: checked against the installed sglang's choices. The memory fit and the roofline
    size the KV cache in it. The embedded engine keeps its KV cache in the compute dtype (`auto`
    only)."""

    tp: int = Field(default=1, ge=1, le=MAX_GPUS, json_schema_extra=CHANGES_ROUNDING)
    """Tensor-parallel size (GPUs per replica)."""

    ep: int = Field(default=1, ge=1, le=MAX_GPUS, json_schema_extra=CHANGES_ROUNDING)
    """Expert-parallel size (divides the experts between GPUs instead of splitting each one)."""


class CudaGraph(_Strict):
    """CUDA graph capture."""

    enabled: bool = True
    """Capture CUDA graphs (off: `--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled`)."""

    prefill: bool = True
    """Also capture prefill graphs (false: `--disable-prefill-cuda-graph`). Batch-1 decoding runs on
    the decode graphs; SGLang 0.5.23 captures prefill graphs for 58 token counts up to 8192, which
    took 56 s of a tiny model's start on an H200."""

    max_bs_decode: int | None = Field(default=None, ge=1, le=MAX_BATCH)
    """Largest decode batch size captured (`--cuda-graph-max-bs-decode`)."""

    max_bs_prefill: int | None = Field(default=None, ge=1, le=MAX_BATCH)
    """Largest prefill batch size captured (`--cuda-graph-max-bs-prefill`)."""


class MemoryGuard(_Strict):
    """The load guard: while the engine loads and warms up, sparkit watches the host's memory
    (on a DGX Spark, the GPU's too). When free memory (MemFree) falls under the floor it evicts
    the checkpoint's pages from the page cache (posix_fadvise DONTNEED, no root needed); when
    available memory (MemAvailable) falls under it, it stops the engine before the machine
    wedges, and `sparkit up` fails with exit 5 naming the peak, the floor and what to change.
    Decisions go to memory-guard.jsonl in the run directory. `memory_guard: false` turns it off."""

    enabled: bool = True
    """Run the guard (Linux hosts; any engine)."""

    floor_gib: float | None = Field(default=None, gt=0, le=MAX_GIB)
    """Memory, in GiB, the OS keeps: the guard's threshold, and on unified memory what the memory
    fit keeps free at steady state. Default: 5% of the host's memory, at least 2 GiB (about 6 GiB
    on a DGX Spark)."""

    @model_validator(mode="before")
    @classmethod
    def _bare_switch(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value


class ConstrainedJson(_Strict):
    """How JSON is written under a `json_schema` or `response_format` constraint: SGLang's xgrammar
    settings, the same flags on both engines. SGLang's default (both off) lets the JSON hold any
    whitespace between its tokens, and a small model that likes whitespace writes `{` and then
    whitespace until `max_tokens`; tiny-ling does (the default recipe turns it off)."""

    disable_any_whitespace: bool = False
    """Compact JSON: no free whitespace, one space after `:` and `,`
    (`--constrained-json-disable-any-whitespace`)."""

    max_whitespace_cnt: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    """At most this many whitespace characters in a row where JSON allows them
    (`--constrained-json-max-whitespace-cnt`; unset = unbounded)."""


class Server(_Strict):
    """How the server listens and engine extras."""

    host: str = "127.0.0.1"
    """Address to listen on."""

    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    """Port to listen on (`sparkit up --port` wins)."""

    api_key_env: str | None = None
    """Name of the environment variable that holds the API key (never the key itself)."""

    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    """Fraction of the memory free at the engine's start that SGLang gives weights + KV cache; the
    rest is for activations, CUDA graphs and, on unified memory, the OS (DGX Spark cookbook: 0.68).
    The preflight checks it against the memory fit (`sparkit plan` shows the range that fits)."""

    max_running_requests: int | None = Field(default=None, ge=1, le=MAX_BATCH)
    """Most requests decoded at once."""

    cuda_graph: CudaGraph = Field(default_factory=CudaGraph)
    """CUDA graph settings."""

    memory_guard: MemoryGuard = Field(default_factory=MemoryGuard)
    """The load guard (see `memory_guard.*`)."""

    enable_metrics: bool = True
    """Expose Prometheus /metrics (the startup checks read it)."""

    constrained_json: ConstrainedJson = Field(default_factory=ConstrainedJson)
    """Constrained JSON's whitespace (see `constrained_json.*`)."""

    tool_call_parser: str | None = None
    """The format the model writes tool calls in, parsed into the API's `tool_calls`
    (`--tool-call-parser`; unset: no parsing, a `tools` request gets the model's text as content).
    `ling3` for Ling 3.0 (and tiny-ling's chat template); checked against the installed SGLang's
    choices; the embedded engine parses `ling3`. The startup check `tool calls` says whether
    parsing is on."""

    extra_args: list[str] = Field(default_factory=list, max_length=MAX_EXTRA_ARGS)
    """Pass-through engine flags, validated by the installed engine's own parser (at most 512 items:
    SGLang has about 300 flags)."""

    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for the engine, over the environment `sparkit up` inherits. Each must
    be one of the engine's settings (its allowlist: SGLang's registry and `SGLANG_*`, PyTorch, CUDA,
    NCCL, Triton, ...: the section "The engine's environment" below); any other variable, and one
    that names a file, directory, library or module, needs `allow_code_env`. SGLANG_* names are
    checked against the installed sglang's registry (a warning for each one it ignores)."""

    allow_code_env: list[str] = Field(default_factory=list, max_length=64)
    """The variables of `env` outside the engine's settings that this recipe means to set
    (OPENSSL_CONF, PATH, HOME, LD_PRELOAD, PYTHONPATH, TRITON_CACHE_DIR, ...: anything that is not
    on the engine's allowlist, below). Such a variable in `env` that is not listed here is an error
    (rule `code-env-needs-opt-in`); one that is listed is shown by `sparkit plan` and by `sparkit
    up`'s preflight as code the recipe lets into the engine. On the command line: `--set
    server.allow_code_env=[PYTHONPATH]`. Variables exported in the shell that runs sparkit are not
    the recipe's and need nothing."""

    @field_validator("allow_code_env")
    @classmethod
    def _code_env_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not an environment variable name (name the variable, not the key)")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        # YAML reads `SGLANG_X: 1` as an int; the environment only holds strings.
        if isinstance(value, dict):
            return {k: ("1" if v is True else "0" if v is False else str(v)) if not isinstance(v, (dict, list)) else v
                    for k, v in value.items()}
        return value


class Checks(_Strict):
    """What the startup checks expect of the live server."""

    min_accept_length: float | None = Field(default=None, ge=1)
    """Minimum mean speculative accept length (default 1.5 when speculative decoding is on)."""

    min_decode_tok_s: float | None = Field(default=None, gt=0)
    """Minimum batch-1 decode throughput in tokens/s (not asserted when unset)."""

    reference_perplexity: float | None = Field(default=None, ge=1)
    """The known answer: the perplexity the served model scores on sparkit's reference text (tiny-ling's,
    sparkit/checks/data/reference-tiny-ling.txt, scored in short passages through the server's prompt
    logprobs). A wrong kernel, quantisation or checkpoint moves it; not asserted when unset. It belongs
    to one checkpoint: serving another through --set model.path, restate it (or set it to null)."""

    reference_perplexity_tolerance: float | None = Field(default=None, gt=0, lt=1)
    """Largest relative gap to `reference_perplexity` that passes (default 0.10)."""


class Recipe(_Strict):
    """A recipe: what to serve and how. Keys not listed here are errors."""

    extends: str | None = None
    """Base recipe deep-merged under this one: a shipped recipe's name (`tiny`,
    `ling-3.0-flash/spark-optimized`), or a file named as a path (`./base.yaml`, `base.yaml`,
    `../x/y.yaml`, `/abs/z.yaml`: relative to this recipe's own directory). See "How recipe names
    resolve" below."""

    description: str | None = None
    """One line shown by `sparkit recipes list`."""

    engine: str = "sglang"
    """Which engine serves the model: `sglang`, `embedded`, or one a plugin registers (entry-point
    group `sparkit.engines`)."""

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        names = engine_names()
        if value not in names:
            raise ValueError(f"unknown engine {value!r}; registered engines: {', '.join(names)}")
        return value

    model: ModelSpec
    """The model."""

    target: TargetName = "auto"
    """Hardware profile the recipe is for: gb10, blackwell-tp4, hopper, cpu, or auto (any host)."""

    target_gpu: str | None = None
    """The GPU part the recipe is written for, when its target profile covers several (hopper: H100
    or H200): a name of sparkit's spec table (`H200`, `H100`, `B200`, `GB10`, ...). A plan made on a
    host without that GPU reads this part's spec-sheet bandwidth for its speed estimate instead of
    the profile's reference part; on the serving host, its own GPU (measured or spec) wins."""

    @field_validator("target_gpu")
    @classmethod
    def _known_gpu(cls, value: str | None) -> str | None:
        if value is not None and value not in {key for key, _, _ in GPU_SPECS}:
            raise ValueError(f"unknown GPU {value!r}; parts with a spec sheet: "
                             f"{', '.join(key for key, _, _ in GPU_SPECS)}")
        return value

    stack: Stack = Field(default_factory=Stack)
    """The optimisation stack."""

    server: Server = Field(default_factory=Server)
    """Server settings and engine pass-through."""

    checks: Checks = Field(default_factory=Checks)
    """Startup-check expectations."""


@dataclass(frozen=True)
class TargetProfile:
    """A named hardware profile a recipe is written for."""

    name: str
    gpu_count: int  # 0 = no GPU needed; for "auto" the minimum is engine-dependent
    cc_majors: tuple[int, ...]  # allowed compute-capability majors (empty = any)
    cc_exact: tuple[int, int] | None  # exact capability when the target is one chip
    memory: Literal["unified", "discrete", "host", "any"]
    description: str


TARGETS: dict[str, TargetProfile] = {
    "gb10": TargetProfile("gb10", 1, (12,), (12, 1), "unified", "one NVIDIA GB10 (DGX Spark), sm_121, 128 GB unified memory"),
    "blackwell-tp4": TargetProfile("blackwell-tp4", 4, (10, 12), None, "discrete", "4 NVIDIA Blackwell GPUs (sm_100/sm_120)"),
    "hopper": TargetProfile("hopper", 1, (9,), None, "discrete", "NVIDIA Hopper GPUs (sm_90), one or more"),
    "cpu": TargetProfile("cpu", 0, (), None, "host", "no GPU: host CPU and RAM"),
    "auto": TargetProfile("auto", 0, (), None, "any", "whatever this host has"),
}


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The section a field holds (Speculative, CudaGraph, ...), else None."""
    import typing

    return next((a for a in (annotation, *typing.get_args(annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)), None)


def recipe_keys(model: type[BaseModel] = Recipe, prefix: str = "") -> dict[str, Any]:
    """Every key of a recipe, dotted ("stack.speculative.num_steps"), sections included, in the
    order the schema declares them -> its pydantic FieldInfo."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        out[key] = info
        section = _section_model(info.annotation)
        if section is not None:
            out.update(recipe_keys(section, f"{key}."))
    return out


def rounding_keys() -> tuple[str, ...]:
    """The recipe keys whose change changes rounding (their fields carry CHANGES_ROUNDING)."""
    return tuple(key for key, info in recipe_keys().items()
                 if (info.json_schema_extra or {}).get("changes_rounding"))
