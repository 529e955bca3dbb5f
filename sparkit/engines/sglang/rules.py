"""SGLang's own recipe rules: what SGLang (0.5.23) cannot run or silently changes, checked with the
general rules (sparkit.planning.rules) for a recipe of engine sglang (SGLangAdapter.rules())."""

from __future__ import annotations

from pathlib import Path

from sparkit.checkpoint_headers import read_config
from sparkit.contract.rules import Rule
from sparkit.engines.builtin_models import builtin_build_dir, parse_builtin
from sparkit.engines.sglang.flags import FP8_LM_HEAD_ENV
from sparkit.env_switch import truthy as _truthy
from sparkit.errors import DataError
from sparkit.recipes.load import LoadedRecipe
from sparkit.recipes.rules import flag_present, rule
from sparkit.weight_formats import FP8_BLOCK

SGLANG_RULES: list[Rule] = []


@rule(
    "fp8-head-excludes-fp32-head",
    "an FP8 lm_head and --enable-fp32-lm-head both replace the output matmul, so only one can be active",
    "keep stack.lm_head: fp8 and drop --enable-fp32-lm-head (or use stack.lm_head: fp32 without FP8)",
    into=SGLANG_RULES,
)
def _fp8_vs_fp32_head(loaded: LoadedRecipe):
    stack, server = loaded.recipe.stack, loaded.recipe.server
    out = []
    if stack.lm_head == "fp8" and flag_present(server.extra_args, "--enable-fp32-lm-head"):
        out.append(("error", "server.extra_args", "stack.lm_head is fp8 but server.extra_args passes --enable-fp32-lm-head"))
    if stack.lm_head != "fp8" and _truthy(server.env.get(FP8_LM_HEAD_ENV)):
        out.append(("error", f"server.env.{FP8_LM_HEAD_ENV}", f"{FP8_LM_HEAD_ENV} is set but stack.lm_head is {stack.lm_head}"))
    return out


@rule(
    "dspark-disables-metadata-glue-graph",
    "sglang force-disables SGLANG_ENABLE_METADATA_GLUE_GRAPH under DSpark/DFlash (it rebuilds attention plans every step)",
    "drop SGLANG_ENABLE_METADATA_GLUE_GRAPH from server.env for DSpark recipes",
    into=SGLANG_RULES,
)
def _dspark_glue_graph(loaded: LoadedRecipe):
    spec, env = loaded.recipe.stack.speculative, loaded.recipe.server.env
    if spec.method == "dspark" and _truthy(env.get("SGLANG_ENABLE_METADATA_GLUE_GRAPH")):
        return [("warning", "server.env.SGLANG_ENABLE_METADATA_GLUE_GRAPH",
                 "SGLANG_ENABLE_METADATA_GLUE_GRAPH has no effect under dspark (sglang force-disables it)")]
    return []


# moe_intermediate_size of models we know by hub id, for when no local config.json exists.
KNOWN_EXPERT_WIDTHS = {
    "ling-3.0-flash": 768,
}


def _config_dir(model_path: str) -> Path:
    """The directory whose config.json describes `model_path` (a built-in's build, else the path)."""
    builtin = parse_builtin(model_path)
    if builtin is not None:
        try:
            return Path(builtin_build_dir(*builtin))
        except Exception:  # noqa: BLE001 - an unknown built-in is another rule's error
            return Path(model_path)
    return Path(model_path).expanduser()


def _config_value(model_path: str, key: str):
    """`key` of the model's local config.json; None when there is none or it cannot be read."""
    config = _config_dir(model_path) / "config.json"
    if not config.is_file():
        return None
    try:
        return read_config(config.parent).get(key)
    except DataError:  # unreadable, nested too deep
        return None


def expert_width(model_path: str) -> int | None:
    """moe_intermediate_size from a local config.json, else from the known-models table."""
    if (_config_dir(model_path) / "config.json").is_file():
        try:
            value = _config_value(model_path, "moe_intermediate_size")
            return int(value) if value else None
        except (TypeError, ValueError):  # not a number
            return None
    lowered = model_path.lower().rsplit("/", 1)[-1]
    for prefix, width in KNOWN_EXPERT_WIDTHS.items():
        if lowered.startswith(prefix):
            return width
    return None


@rule(
    "fp8-block-quant-tp-split",
    f"FP8 block quantisation (block {FP8_BLOCK}) cannot split an expert whose width is not a multiple of {FP8_BLOCK} x (tp / ep)",
    "set stack.ep equal to stack.tp so that whole experts are placed on each GPU",
    into=SGLANG_RULES,
)
def _fp8_block_split(loaded: LoadedRecipe):
    r = loaded.recipe
    fp8 = r.stack.weights == "fp8" or (r.stack.quantization or "").startswith("fp8")
    if not fp8 or r.stack.tp == 1:
        return []
    width = expert_width(r.model.path)
    moe_tp = max(1, r.stack.tp // r.stack.ep)
    if width and moe_tp > 1 and width % (FP8_BLOCK * moe_tp) != 0:
        return [("error", "stack.tp",
                 f"expert width {width} split {moe_tp} ways is {width // moe_tp}, not a multiple of {FP8_BLOCK}; "
                 f"use stack.ep: {r.stack.tp}")]
    return []


# SGLang 0.5.23's Triton MLA decode (sglang/kernels/ops/attention/decode_attention.py,
# _decode_grouped_att_m_fwd) splits the absorbed query into its latent and rope parts for these
# widths of kv_lora_rank + qk_rope_head_dim only; any other compiles a kernel whose P.V shapes
# disagree, and the server dies capturing its decode graphs, minutes after the model loaded (H200:
# tiny-ling-v3's 128 + 128, "Cannot make_shape_compatible: ... 128 and 256").
TRITON_MLA_WIDTHS = {576: "512 + 64, Ling-3.0's", 288: "256 + 32"}


@rule(
    "sglang-triton-mla-widths",
    "SGLang's Triton MLA decode kernel takes kv_lora_rank + qk_rope_head_dim of 576 (512 + 64) or 288 (256 + 32) "
    "only; with any other width the server dies compiling it after the model has loaded",
    "serve an MLA model of those widths (Ling-3.0's are 512 + 64) or another attention backend than triton",
    into=SGLANG_RULES,
)
def _triton_mla_widths(loaded: LoadedRecipe):
    r = loaded.recipe
    if (r.stack.attention_backend or "") != "triton":
        return []
    try:
        lora, rope = (int(_config_value(r.model.path, k) or 0) for k in ("kv_lora_rank", "qk_rope_head_dim"))
    except (TypeError, ValueError):
        return []
    if not lora or lora + rope in TRITON_MLA_WIDTHS:
        return []
    return [("error", "model.path", f"{r.model.path}: its MLA has kv_lora_rank {lora} + qk_rope_head_dim {rope} = "
             f"{lora + rope}, a width SGLang's Triton MLA decode kernel cannot split (it takes "
             f"{' or '.join(f'{w} ({what})' for w, what in TRITON_MLA_WIDTHS.items())})")]
