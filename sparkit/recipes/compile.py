"""compile_plan: a loaded recipe -> the exact LaunchPlan (argv, env, expectations).

Engine-independent rules run first (sparkit.recipes.rules); then the engine's
adapter compiles and checks what only the installed engine can judge (its flag
parser, its environment registry). Planning never needs the target hardware.
"""

from __future__ import annotations

from typing import Any

from sparkit.recipes.load import LoadedRecipe
from sparkit.recipes.plan import Expectations, LaunchPlan, Provision

DEFAULT_MIN_ACCEPT_LENGTH = 1.5


def compile_plan(loaded: LoadedRecipe, *, port: int | None = None) -> LaunchPlan:
    """Compile a loaded recipe. Raises RecipeError (rule broken, flag refused by the
    installed engine); warnings travel in plan.warnings."""
    from sparkit.engines.base import get_adapter
    from sparkit.recipes.rules import check_rules, raise_for_errors

    warnings = raise_for_errors(loaded, check_rules(loaded))
    plan = get_adapter(loaded.recipe.engine).compile(loaded, port=port)
    plan.warnings = warnings + plan.warnings
    return plan


def base_expectations(recipe: Any) -> Expectations:
    """The expectations every engine shares; adapters add engine-specific ones."""
    stack, spec = recipe.stack, recipe.stack.speculative
    min_accept = recipe.checks.min_accept_length
    if min_accept is None and spec.enabled:
        min_accept = DEFAULT_MIN_ACCEPT_LENGTH
    return Expectations(
        weights=stack.weights,
        moe_backend=stack.moe_backend,
        lm_head=stack.lm_head,
        lm_head_exact_top_k=stack.lm_head_exact_top_k if stack.lm_head == "fp8" else None,
        speculative=spec.method if spec.enabled else None,
        num_steps=spec.num_steps,
        eagle_topk=spec.eagle_topk,
        num_draft_tokens=spec.num_draft_tokens,
        draft_model=spec.draft_model,
        draft_shares_lm_head=True if spec.method == "nextn" and stack.lm_head == "fp8" else None,
        tp=stack.tp,
        ep=stack.ep,
        attention_backend=stack.attention_backend,
        mem_fraction_static=recipe.server.mem_fraction_static,
        min_accept_length=min_accept if spec.enabled else None,
        min_decode_tok_s=recipe.checks.min_decode_tok_s,
    )


def build_plan(
    loaded: LoadedRecipe,
    *,
    engine: str,
    argv: list[str],
    env: dict[str, str],
    port: int,
    expectations: Expectations,
    provisions: list[Provision],
    warnings: list[str],
    served_model_name: str,
) -> LaunchPlan:
    r = loaded.recipe
    return LaunchPlan(
        engine=engine,  # type: ignore[arg-type]
        argv=argv,
        env=env,
        host=r.server.host,
        port=port,
        model=r.model.path,
        served_model_name=served_model_name,
        recipe_name=loaded.name,
        recipe_path=str(loaded.path) if loaded.path else None,
        expectations=expectations,
        provisions=provisions,
        warnings=warnings,
        api_key_env=r.server.api_key_env,
        recipe=loaded.resolved(),
    )


__all__ = ["compile_plan", "base_expectations", "build_plan"]
