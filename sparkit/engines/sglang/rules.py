"""SGLang's own recipe rules: what SGLang (0.5.23) cannot run or silently changes, checked with the
general rules (sparkit.planning.rules) for a recipe of engine sglang (SGLangAdapter.rules())."""

from __future__ import annotations

import json
from pathlib import Path

from sparkit.contract.flag_table import SPECULATIVE_NUMBERS
from sparkit.contract.rules import Rule
from sparkit.env_switch import truthy as _truthy
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
    if stack.lm_head != "fp8" and _truthy(server.env.get("SGLANG_ENABLE_FP8_LM_HEAD")):
        out.append(("error", "server.env.SGLANG_ENABLE_FP8_LM_HEAD",
                    f"SGLANG_ENABLE_FP8_LM_HEAD is set but stack.lm_head is {stack.lm_head}"))
    return out


@rule(
    "dspark-needs-draft-model",
    "DSpark drafts with a separate block-draft checkpoint; the target has no DSpark layer",
    "set stack.speculative.draft_model (e.g. inclusionAI/Ling-3.0-flash-dspark)",
    into=SGLANG_RULES,
)
def _dspark_draft(loaded: LoadedRecipe):
    spec = loaded.recipe.stack.speculative
    if spec.method == "dspark" and not spec.draft_model:
        return [("error", "stack.speculative", "speculative method dspark needs draft_model")]
    return []


@rule(
    "dspark-takes-no-step-numbers",
    "DSpark's block size comes from the draft checkpoint; sglang takes no num-steps / draft-tokens / topk for it",
    "remove speculative.num_steps, eagle_topk and num_draft_tokens",
    into=SGLANG_RULES,
)
def _dspark_numbers(loaded: LoadedRecipe):
    spec = loaded.recipe.stack.speculative
    if spec.method != "dspark":
        return []
    given = [k for k in SPECULATIVE_NUMBERS if getattr(spec, k) is not None]
    if given:
        return [("error", f"stack.speculative.{given[0]}", "dspark takes no " + ", ".join(given))]
    return []


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


def expert_width(model_path: str) -> int | None:
    """moe_intermediate_size from a local config.json, else from the known-models table."""
    config = Path(model_path).expanduser() / "config.json"
    if config.is_file():
        try:
            value = json.loads(config.read_text()).get("moe_intermediate_size")
            return int(value) if value else None
        except (OSError, ValueError):
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
