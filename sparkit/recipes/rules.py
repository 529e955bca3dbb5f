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

from sparkit.contract.flag_table import SPECULATIVE_NUMBERS
from sparkit.contract.rules import Rule, Severity
from sparkit.recipes.load import LoadedRecipe
from sparkit.recipes.schema import code_loading

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
        if spec.num_draft_tokens != spec.num_steps + 1:
            return [("error", "stack.speculative.num_draft_tokens",
                     f"with eagle_topk 1, num_draft_tokens must be num_steps + 1 = {spec.num_steps + 1}, "
                     f"not {spec.num_draft_tokens}")]
    return []


# Names that hold credentials by convention. Engine knobs (SGLANG_*, SPARKIT_*) are not among them
# even when they end in _TOKEN (SGLANG_USE_AITER_FP8_PER_TOKEN is a kernel switch).
_SECRET_NAME = re.compile(r"(?:^|_)(?:API_?KEY|TOKEN|SECRET|SECRET_KEY|PASSWORD|PASSWD|ACCESS_KEY|CREDENTIALS?)$")
_KNOB_PREFIXES = ("SGLANG_", "SPARKIT_")


def looks_secret(name: str) -> bool:
    """An environment variable name that, by convention, holds a credential."""
    upper = name.upper()
    return bool(_SECRET_NAME.search(upper)) and not upper.startswith(_KNOB_PREFIXES)


@rule(
    "code-env-needs-opt-in",
    "a variable such as PYTHONPATH or LD_PRELOAD makes the engine load code from where it points, and the "
    "startup checks cannot tell that code from the engine's own",
    "remove it from server.env (export it in your shell if you mean it), or list it in server.allow_code_env "
    "(`--set server.allow_code_env=[NAME]`)",
)
def _code_env(loaded: LoadedRecipe):
    server = loaded.recipe.server
    return [("error", f"server.env.{name}", f"server.env sets {name}: {code_loading(name)}")
            for name in server.env if code_loading(name) and name not in server.allow_code_env]


def code_env_notes(loaded: LoadedRecipe) -> list[str]:
    """What `sparkit plan` says about each code-loading variable the recipe sets (and allows)."""
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


