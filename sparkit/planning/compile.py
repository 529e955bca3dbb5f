"""compile_plan: a loaded recipe -> the exact LaunchPlan (argv, env, expectations).

The general rules and the engine's own (its adapter's `rules()`) run first (sparkit.planning.rules); then the engine's
adapter turns the recipe into its part of the launch (`EngineLaunch`), checking what only the
installed engine can judge (its flag parser, its environment registry); compile alone assembles
the plan from it. Planning never needs the target hardware.
"""

from __future__ import annotations

from dataclasses import fields

from sparkit.contract.engine import EngineLaunch
from sparkit.contract.flag_table import DEFAULT_MIN_ACCEPT_LENGTH, DEFAULT_MIN_ACCEPT_LENGTH_DSPARK, shared_expectations
from sparkit.contract.plan import Expectations, LaunchPlan
from sparkit.engines.base import get_adapter
from sparkit.planning.rules import allowed_code_env, check_rules, raise_for_errors
from sparkit.recipes.load import LoadedRecipe, display_path
from sparkit.recipes.schema import Recipe


def compile_plan(loaded: LoadedRecipe, *, port: int | None = None) -> LaunchPlan:
    """Compile a loaded recipe. Raises RecipeError (rule broken, flag refused by the
    installed engine); warnings travel in plan.warnings."""
    warnings = raise_for_errors(loaded, check_rules(loaded))
    r = loaded.recipe
    port = port if port is not None else r.server.port
    launch = get_adapter(r.engine).launch(loaded, port=port)
    code_env = allowed_code_env(loaded)
    return LaunchPlan(
        engine=r.engine,
        argv=launch.argv,
        env=launch.env,
        host=r.server.host,
        port=port,
        model=r.model.path,
        served_model_name=launch.served_model_name,
        recipe_name=loaded.name,
        recipe_path=str(loaded.path) if loaded.path else None,
        expectations=_expectations(r, launch, reference_note=_reference_model_note(loaded)),
        provisions=launch.provisions,
        warnings=loaded.warnings + _code_env_notes(loaded, code_env) + warnings + launch.warnings,
        code_env=code_env,
        model_builds=launch.model_builds,
        model_pulls=launch.model_pulls,
        api_key_env=r.server.api_key_env,
        recipe=loaded.resolved(),
        validated_by=launch.validated_by,
        validation_note=launch.validation_note,
    )


def _code_env_notes(loaded: LoadedRecipe, code_env: dict[str, str]) -> list[str]:
    """What `sparkit plan` warns of each variable the recipe lets into the engine."""
    env = loaded.recipe.server.env
    return [f"server.env.{name}={env[name]} is outside the engine's settings ({why}); allowed by "
            "server.allow_code_env" for name, why in code_env.items()]


def _layer(loaded: LoadedRecipe, *key: str) -> int | None:
    """How recent the layer that set `key` is: 0 for --set, 1 for the recipe file itself, 2 for
    its base, ...; None for a default (no layer set it)."""
    origin = loaded.origins.get(tuple(key))
    if origin is None:
        return None
    if origin.file == "--set":
        return 0
    files = [display_path(p) for p in loaded.chain]
    return files.index(origin.file) + 1 if origin.file in files else None


def _reference_model_note(loaded: LoadedRecipe) -> str | None:
    """A reference perplexity belongs to the checkpoint it was measured on. When a later layer
    (--set, or a recipe extending the one that states it) sets model.path, the check still runs
    (the path may name the same checkpoint, or a damaged copy of it), and a failure says where
    both values came from."""
    recipe = loaded.recipe
    if recipe.checks.reference_perplexity is None:
        return None
    ref_layer, model_layer = _layer(loaded, "checks", "reference_perplexity"), _layer(loaded, "model", "path")
    if ref_layer is None or model_layer is None or model_layer >= ref_layer:
        return None
    where = loaded.origins[("checks", "reference_perplexity")]
    model_from = loaded.origins[("model", "path")].file
    return (f"checks.reference_perplexity {recipe.checks.reference_perplexity} was stated at {where.file}:{where.line} "
            f"for that recipe's model, and model.path was then set to {recipe.model.path} by {model_from}: if "
            "that is another model, state its own value (--set checks.reference_perplexity=N, or null to "
            "skip the check)")


def _expectations(recipe: Recipe, launch: EngineLaunch, *, reference_note: str | None = None) -> Expectations:
    """What the recipe asks of every engine, then what only the engine can state."""
    stack, spec = recipe.stack, recipe.stack.speculative
    min_accept = recipe.checks.min_accept_length
    if min_accept is None and spec.enabled:
        min_accept = DEFAULT_MIN_ACCEPT_LENGTH_DSPARK if spec.method == "dspark" else DEFAULT_MIN_ACCEPT_LENGTH
    expectations = Expectations(
        weights=stack.weights,
        moe_backend=stack.moe_backend,
        lm_head=stack.lm_head,
        lm_head_exact_top_k=stack.lm_head_exact_top_k if stack.lm_head == "fp8" else None,
        speculative=spec.method if spec.enabled else None,
        draft_model=spec.draft_model,
        # DSpark always computes with the target's lm_head and embedding (SGLang's attach_shared_modules)
        draft_shares_lm_head=True if (spec.method == "nextn" and stack.lm_head == "fp8") or spec.method == "dspark" else None,
        draft_shares_embedding=True if spec.method == "dspark" else None,
        block_size=spec.block_size if spec.method == "dspark" else None,
        min_accept_length=min_accept if spec.enabled else None,
        min_decode_tok_s=recipe.checks.min_decode_tok_s,
        reference_perplexity=recipe.checks.reference_perplexity,
        reference_perplexity_tolerance=recipe.checks.reference_perplexity_tolerance,
        reference_model_note=reference_note,
    )
    known = {f.name for f in fields(Expectations)}
    unknown = set(launch.expectations) - known
    if unknown:  # an adapter's mistake, not the user's
        raise TypeError(f"engine adapter sets unknown expectations: {', '.join(sorted(unknown))}")
    for name, value in launch.expectations.items():
        setattr(expectations, name, value)
    # The settings every engine resolves under a shared name (speculative numbers, tp, ep, ...), with
    # what the engine states of them and of its own settings laid over.
    expectations.server_args = {**shared_expectations(recipe), **launch.expectations.get("server_args", {})}
    return expectations


__all__ = ["compile_plan", "DEFAULT_MIN_ACCEPT_LENGTH"]
