"""The general compatibility rules over a recipe: the ones that need neither an engine nor the
built-in models (those that do live in sparkit.planning.rules, above the engines).

Each rule (sparkit.contract.rules.Rule) has a name, a one-sentence reason and a fix. A rule returns
the violations it finds; `error` violations stop planning, `warning`s are printed with the plan.
What one engine cannot run is that engine's adapter's `rules()` (SGLang's:
sparkit.engines.sglang.rules), checked with these by sparkit.planning.rules; what needs the
installed engine (flags its parser no longer has, env names its registry ignores) its adapter
checks while it compiles.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sparkit.contract.flag_table import SPECULATIVE_NUMBERS, chain_draft_tokens
from sparkit.contract.rules import Rule, Severity
from sparkit.recipes.load import LoadedRecipe

RULES: list[Rule] = []


def rule(name: str, reason: str, fix: str, *, into: list[Rule] = RULES):
    """Declare a rule: the decorated check joins `into` (the general rules unless said)."""
    def register(fn: Callable[[LoadedRecipe], list[tuple[Severity, str, str]]]):
        into.append(Rule(name, reason, fix, fn))
        return fn

    return register


def flag_present(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


@rule(
    "speculative-numbers-all-or-none",
    "sglang crashes at start on a partial set (only num_steps: TypeError; only eagle_topk: AssertionError)",
    "give speculative.num_steps, eagle_topk and num_draft_tokens together, or none of them for the model's defaults",
)
def _spec_all_or_none(loaded: LoadedRecipe):
    spec = loaded.recipe.stack.speculative
    if spec.method != "nextn":
        return []
    given = {k: getattr(spec, k) for k in SPECULATIVE_NUMBERS}
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
        if spec.num_draft_tokens != chain_draft_tokens(spec.num_steps):
            return [("error", "stack.speculative.num_draft_tokens",
                     f"with eagle_topk 1, num_draft_tokens must be num_steps + 1 = {chain_draft_tokens(spec.num_steps)}, "
                     f"not {spec.num_draft_tokens}")]
    return []


@rule(
    "dspark-needs-draft-model",
    "DSpark drafts with a separate block-draft checkpoint; the target has no DSpark layer",
    "set stack.speculative.draft_model (e.g. inclusionAI/Ling-3.0-flash-dspark, or sparkit:tiny-ling-dspark for tiny-ling)",
)
def _dspark_draft(loaded: LoadedRecipe):
    spec = loaded.recipe.stack.speculative
    if spec.method == "dspark" and not spec.draft_model:
        return [("error", "stack.speculative", "speculative method dspark needs draft_model")]
    return []


@rule(
    "dspark-takes-no-step-numbers",
    "DSpark's block size comes from the draft checkpoint (or speculative.block_size); the engines take no "
    "num-steps / draft-tokens / topk for it (sglang resolves them to 1, block_size + 1, 1)",
    "remove speculative.num_steps, eagle_topk and num_draft_tokens (set speculative.block_size to change the block)",
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
    "block-size-is-dspark",
    "speculative.block_size is the number of tokens a DSpark block drafts; NEXTN drafts num_steps tokens",
    "remove speculative.block_size, or use speculative.method: dspark",
)
def _block_size_dspark(loaded: LoadedRecipe):
    spec = loaded.recipe.stack.speculative
    if spec.block_size is not None and spec.method != "dspark":
        return [("error", "stack.speculative.block_size", f"block_size is a DSpark setting; the method is {spec.method}")]
    return []


# Names that hold credentials by convention. Engine knobs (SGLANG_*, SPARKIT_*) are not among them
# even when they end in _TOKEN (SGLANG_USE_AITER_FP8_PER_TOKEN is a kernel switch).
_SECRET_NAME = re.compile(r"(?:^|_)(?:API_?KEY|TOKEN|SECRET|SECRET_KEY|PASSWORD|PASSWD|ACCESS_KEY|CREDENTIALS?)$")
_KNOB_PREFIXES = ("SGLANG_", "SPARKIT_")


def looks_secret(name: str) -> bool:
    """An environment variable name that, by convention, holds a credential."""
    upper = name.upper()
    return bool(_SECRET_NAME.search(upper)) and not upper.startswith(_KNOB_PREFIXES)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@rule(
    "env-names",
    "an engine's environment holds NAME=VALUE strings ended by a NUL: a name with other characters, or a value "
    "with a NUL, cannot be set, and the launch would fail after the preflight",
    "name variables with letters, digits and _ (not starting with a digit), and keep NUL out of their values",
)
def _env_names(loaded: LoadedRecipe):
    out = []
    for name, value in loaded.recipe.server.env.items():
        if not _ENV_NAME.match(name):
            out.append(("error", f"server.env.{name}", f"{name!r} is not an environment variable name"))
        elif "\0" in value:
            out.append(("error", f"server.env.{name}", f"the value of {name} holds a NUL character"))
    return out[:1] + ([("error", "server.env", f"and {len(out) - 1} more such variable(s)")] if len(out) > 1 else [])


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


