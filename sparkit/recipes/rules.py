"""Compatibility rules over a recipe (and what the installed engine supports).

Each rule has a name, a one-sentence reason and a fix. A rule returns the
violations it finds; `error` violations stop planning, `warning`s are printed
with the plan. What one engine cannot run is that engine's adapter's `rules()`, checked
with these; what needs the installed engine (flags its parser no longer has, env names its
registry ignores) its adapter checks while it compiles.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sparkit.env_switch import truthy as _truthy
from sparkit.recipes.load import LoadedRecipe
from sparkit.weight_formats import FP8_BLOCK

Severity = Literal["error", "warning"]

# moe_intermediate_size of models we know by hub id, for when no local config.json exists.
KNOWN_EXPERT_WIDTHS = {
    "ling-3.0-flash": 768,
}


@dataclass
class Violation:
    rule: str
    severity: Severity
    key: str  # dotted recipe key the problem is about
    message: str
    reason: str
    fix: str

    def text(self) -> str:
        return f"[{self.rule}] {self.message} ({self.reason})"


@dataclass(frozen=True)
class Rule:
    name: str
    reason: str
    fix: str
    check: Callable[[LoadedRecipe], list[tuple[Severity, str, str]]]  # (severity, key, message)


RULES: list[Rule] = []


def rule(name: str, reason: str, fix: str):
    def register(fn: Callable[[LoadedRecipe], list[tuple[Severity, str, str]]]):
        RULES.append(Rule(name, reason, fix, fn))
        return fn

    return register


def _flag_present(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


@rule(
    "fp8-head-excludes-fp32-head",
    "an FP8 lm_head and --enable-fp32-lm-head both replace the output matmul, so only one can be active",
    "keep stack.lm_head: fp8 and drop --enable-fp32-lm-head (or use stack.lm_head: fp32 without FP8)",
)
def _fp8_vs_fp32_head(loaded: LoadedRecipe):
    stack, server = loaded.recipe.stack, loaded.recipe.server
    out = []
    if stack.lm_head == "fp8" and _flag_present(server.extra_args, "--enable-fp32-lm-head"):
        out.append(("error", "server.extra_args", "stack.lm_head is fp8 but server.extra_args passes --enable-fp32-lm-head"))
    if stack.lm_head != "fp8" and _truthy(server.env.get("SGLANG_ENABLE_FP8_LM_HEAD")):
        out.append(("error", "server.env.SGLANG_ENABLE_FP8_LM_HEAD",
                    f"SGLANG_ENABLE_FP8_LM_HEAD is set but stack.lm_head is {stack.lm_head}"))
    return out


@rule(
    "speculative-numbers-all-or-none",
    "sglang crashes at start on a partial set (only num_steps: TypeError; only eagle_topk: AssertionError)",
    "give speculative.num_steps, eagle_topk and num_draft_tokens together, or none of them for the model's defaults",
)
def _spec_all_or_none(loaded: LoadedRecipe):
    spec = loaded.recipe.stack.speculative
    if spec.method != "nextn":
        return []
    given = {k: getattr(spec, k) for k in ("num_steps", "eagle_topk", "num_draft_tokens")}
    missing = [k for k, v in given.items() if v is None]
    if missing and len(missing) < 3:
        return [("error", "stack.speculative", "speculative numbers are partial: missing " + ", ".join(missing))]
    return []


@rule(
    "topk1-draft-tokens",
    "with eagle_topk 1 sglang silently rewrites num_draft_tokens to num_steps + 1, so the recipe would not be what runs",
    "set speculative.num_draft_tokens to num_steps + 1",
)
def _topk1_draft_tokens(loaded: LoadedRecipe):
    spec = loaded.recipe.stack.speculative
    if spec.method == "nextn" and spec.eagle_topk == 1 and spec.num_steps and spec.num_draft_tokens:
        if spec.num_draft_tokens != spec.num_steps + 1:
            return [("error", "stack.speculative.num_draft_tokens",
                     f"with eagle_topk 1, num_draft_tokens must be num_steps + 1 = {spec.num_steps + 1}, "
                     f"not {spec.num_draft_tokens}")]
    return []


@rule(
    "dspark-needs-draft-model",
    "DSpark drafts with a separate block-draft checkpoint; the target has no DSpark layer",
    "set stack.speculative.draft_model (e.g. inclusionAI/Ling-3.0-flash-dspark)",
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
)
def _dspark_numbers(loaded: LoadedRecipe):
    spec = loaded.recipe.stack.speculative
    if spec.method != "dspark":
        return []
    given = [k for k in ("num_steps", "eagle_topk", "num_draft_tokens") if getattr(spec, k) is not None]
    if given:
        return [("error", f"stack.speculative.{given[0]}", "dspark takes no " + ", ".join(given))]
    return []


@rule(
    "dspark-disables-metadata-glue-graph",
    "sglang force-disables SGLANG_ENABLE_METADATA_GLUE_GRAPH under DSpark/DFlash (it rebuilds attention plans every step)",
    "drop SGLANG_ENABLE_METADATA_GLUE_GRAPH from server.env for DSpark recipes",
)
def _dspark_glue_graph(loaded: LoadedRecipe):
    spec, env = loaded.recipe.stack.speculative, loaded.recipe.server.env
    if spec.method == "dspark" and _truthy(env.get("SGLANG_ENABLE_METADATA_GLUE_GRAPH")):
        return [("warning", "server.env.SGLANG_ENABLE_METADATA_GLUE_GRAPH",
                 "SGLANG_ENABLE_METADATA_GLUE_GRAPH has no effect under dspark (sglang force-disables it)")]
    return []


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


@rule(
    "builtin-layout-is-the-weights",
    "`sparkit:tiny-ling@fp8` / `@mxfp4` is the export in that layout: its experts hold exactly those weights, and "
    "the startup checks judge every MoE layer against stack.weights",
    "set stack.weights to the layout the model path names (or name the layout the recipe's stack.weights says)",
)
def _builtin_layout_is_the_weights(loaded: LoadedRecipe):
    from sparkit.engines.builtin_models import parse_builtin_ref

    r = loaded.recipe
    ref = parse_builtin_ref(r.model.path)
    if ref is None or ref.weights is None or ref.weights == r.stack.weights:
        return []
    return [("error", "stack.weights", f"model.path {r.model.path!r} is the {ref.weights} export, but stack.weights is "
                                       f"{r.stack.weights}")]


def key_env_names(loaded: LoadedRecipe) -> list[str]:
    """Environment variables that carry the server's API key: the one the recipe names in
    server.api_key_env, and every engine's own (the embedded engine reads SPARKIT_API_KEY)."""
    from sparkit.engines.base import registry

    names = [loaded.recipe.server.api_key_env] if loaded.recipe.server.api_key_env else []
    for adapter in registry().values():
        names += [n for n in getattr(adapter, "key_env", ()) if n not in names]
    return names


@rule(
    "no-inline-api-key",
    "a key in the recipe or on the engine's command line ends up in plan.json and `sparkit plan`, and argv is "
    "visible to every user of the machine",
    "export the key in the shell that runs `sparkit up` and name the variable in server.api_key_env "
    "(e.g. server.api_key_env: SPARKIT_API_KEY); remove it from the recipe",
)
def _inline_api_key(loaded: LoadedRecipe):
    server = loaded.recipe.server
    out = []
    if _flag_present(server.extra_args, "--api-key"):
        out.append(("error", "server.extra_args", "--api-key given inline"))
    for name in key_env_names(loaded):
        if name in server.env:
            out.append(("error", f"server.env.{name}", f"server.env sets {name}, the variable that carries the API key"))
    return out


# Names that hold credentials by convention. Engine knobs (SGLANG_*, SPARKIT_*) are not among them
# even when they end in _TOKEN (SGLANG_USE_AITER_FP8_PER_TOKEN is a kernel switch).
_SECRET_NAME = re.compile(r"(?:^|_)(?:API_?KEY|TOKEN|SECRET|SECRET_KEY|PASSWORD|PASSWD|ACCESS_KEY|CREDENTIALS?)$")
_KNOB_PREFIXES = ("SGLANG_", "SPARKIT_")


def looks_secret(name: str) -> bool:
    """An environment variable name that, by convention, holds a credential."""
    upper = name.upper()
    return bool(_SECRET_NAME.search(upper)) and not upper.startswith(_KNOB_PREFIXES)


@rule(
    "no-secret-in-env",
    "a credential in server.env ends up in plan.json and `sparkit plan`; the engine inherits the environment of "
    "`sparkit up`, so it never needs to be in the recipe",
    "export it in the shell that runs `sparkit up` (e.g. `export HF_TOKEN=...`) and remove it from server.env",
)
def _secret_in_env(loaded: LoadedRecipe):
    taken = set(key_env_names(loaded))
    return [("error", f"server.env.{name}", f"server.env sets {name}, which looks like a credential")
            for name in loaded.recipe.server.env if looks_secret(name) and name not in taken]


@rule(
    "code-env-needs-opt-in",
    "a variable such as PYTHONPATH or LD_PRELOAD makes the engine load code from where it points, and the "
    "startup checks cannot tell that code from the engine's own",
    "remove it from server.env (export it in your shell if you mean it), or list it in server.allow_code_env "
    "(`--set server.allow_code_env=[NAME]`)",
)
def _code_env(loaded: LoadedRecipe):
    from sparkit.recipes.schema import code_loading

    server = loaded.recipe.server
    return [("error", f"server.env.{name}", f"server.env sets {name}: {code_loading(name)}")
            for name in server.env if code_loading(name) and name not in server.allow_code_env]


def code_env_notes(loaded: LoadedRecipe) -> list[str]:
    """What `sparkit plan` says about each code-loading variable the recipe sets (and allows)."""
    from sparkit.recipes.schema import code_loading

    server = loaded.recipe.server
    return [f"server.env.{name}={server.env[name]} loads code into the engine ({code_loading(name)}); "
            "allowed by server.allow_code_env" for name in server.env if code_loading(name) and name in server.allow_code_env]


@rule(
    "gb10-mem-fraction",
    "on DGX Spark the GPU shares memory with the OS; the cookbook measured that 0.75 risks GPU OOM and driver lockups",
    "use server.mem_fraction_static: 0.68",
)
def _gb10_mem_fraction(loaded: LoadedRecipe):
    r = loaded.recipe
    if r.target == "gb10" and r.server.mem_fraction_static is not None and r.server.mem_fraction_static >= 0.75:
        return [("warning", "server.mem_fraction_static",
                 f"mem_fraction_static {r.server.mem_fraction_static} on gb10")]
    return []


def rules_for(engine: str) -> list[Rule]:
    """The engine-independent rules, then the engine's own (its adapter's `rules()`)."""
    from sparkit.engines.base import get_adapter

    return RULES + list(get_adapter(engine).rules())


def every_rule() -> list[Rule]:
    """Every rule sparkit knows: the general ones and each registered engine's."""
    from sparkit.engines.base import registry

    return RULES + [r for adapter in registry().values() for r in adapter.rules()]


def check_rules(loaded: LoadedRecipe) -> list[Violation]:
    """Every violation of the rules that apply to the recipe's engine, in rule order."""
    found = []
    for r in rules_for(loaded.recipe.engine):
        for severity, key, message in r.check(loaded):
            found.append(Violation(r.name, severity, key, message, r.reason, r.fix))
    return found


def raise_for_errors(loaded: LoadedRecipe, violations: list[Violation]) -> list[str]:
    """Raise a RecipeError for the first error (naming the others); return warning texts."""
    errors = [v for v in violations if v.severity == "error"]
    if errors:
        first = errors[0]
        message = f"{first.message} [{first.rule}: {first.reason}]"
        if len(errors) > 1:
            message += "; also: " + "; ".join(f"{e.key}: {e.message} [{e.rule}]" for e in errors[1:])
        raise loaded.error(first.key, message, hint=first.fix)
    return [f"{v.key}: {v.message} [{v.rule}: {v.reason}] fix: {v.fix}" for v in violations if v.severity == "warning"]
