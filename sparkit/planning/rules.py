"""Rule assembly, above the engines: the general rules (sparkit.recipes.rules), the general rules
that need to know every engine or the built-in models (here), and each engine's own (its adapter's
`rules()`), checked together before compile; the first error stops planning."""

from __future__ import annotations

from sparkit.contract.rules import Rule, Violation
from sparkit.engines.base import engine_environment, get_adapter, registry
from sparkit.engines.builtin_models import parse_builtin_ref
from sparkit.recipes.load import LoadedRecipe
from sparkit.recipes.rules import RULES as RECIPE_RULES
from sparkit.recipes.rules import flag_present, looks_secret, rule

# General rules that read the engines' registry or the built-in models: declared here, where the
# engines are below, rather than in sparkit.recipes.rules.
ENGINE_AWARE_RULES: list[Rule] = []


@rule(
    "builtin-layout-is-the-weights",
    "`sparkit:tiny-ling@fp8` / `@mxfp4` is the export in that layout: its experts hold exactly those weights, and "
    "the startup checks judge every MoE layer against stack.weights",
    "set stack.weights to the layout the model path names (or name the layout the recipe's stack.weights says)",
    into=ENGINE_AWARE_RULES,
)
def _builtin_layout_is_the_weights(loaded: LoadedRecipe):
    r = loaded.recipe
    ref = parse_builtin_ref(r.model.path)
    if ref is None or ref.weights is None or ref.weights == r.stack.weights:
        return []
    return [("error", "stack.weights", f"model.path {r.model.path!r} is the {ref.weights} export, but stack.weights is "
                                       f"{r.stack.weights}")]


def key_env_names(loaded: LoadedRecipe) -> list[str]:
    """Environment variables that carry the server's API key: the one the recipe names in
    server.api_key_env, and every engine's own (the embedded engine reads SPARKIT_API_KEY)."""
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
    into=ENGINE_AWARE_RULES,
)
def _inline_api_key(loaded: LoadedRecipe):
    server = loaded.recipe.server
    out = []
    if flag_present(server.extra_args, "--api-key"):
        out.append(("error", "server.extra_args", "--api-key given inline"))
    for name in key_env_names(loaded):
        if name in server.env:
            out.append(("error", f"server.env.{name}", f"server.env sets {name}, the variable that carries the API key"))
    return out


@rule(
    "no-secret-in-env",
    "a credential in server.env ends up in plan.json and `sparkit plan`; the engine inherits the environment of "
    "`sparkit up`, so it never needs to be in the recipe",
    "export it in the shell that runs `sparkit up` (e.g. `export HF_TOKEN=...`) and remove it from server.env",
    into=ENGINE_AWARE_RULES,
)
def _secret_in_env(loaded: LoadedRecipe):
    taken = set(key_env_names(loaded))
    return [("error", f"server.env.{name}", f"server.env sets {name}, which looks like a credential")
            for name in loaded.recipe.server.env if looks_secret(name) and name not in taken]


def code_env(loaded: LoadedRecipe) -> dict[str, str]:
    """The variables of the recipe's server.env outside its engine's settings, each with why it
    needs server.allow_code_env (whether the recipe allows it or not)."""
    environment = engine_environment(loaded.recipe.engine)
    found = {name: environment.needs_opt_in(name) for name in loaded.recipe.server.env}
    return {name: why for name, why in found.items() if why is not None}


def allowed_code_env(loaded: LoadedRecipe) -> dict[str, str]:
    """What the plan shows of the code the recipe lets into the engine: each variable of code_env
    that server.allow_code_env names, with why."""
    allowed = set(loaded.recipe.server.allow_code_env)
    return {name: why for name, why in code_env(loaded).items() if name in allowed}


# A refusal names the first variable (its file and line); so many more are counted, and a few named.
_NAMED_BESIDE = 5


@rule(
    "code-env-needs-opt-in",
    "the engine's environment is its settings (SGLang's, PyTorch's, CUDA's, NCCL's, Triton's, ...); any other "
    "variable, such as OPENSSL_CONF, PATH, HOME, LD_PRELOAD or PYTHONPATH, can make the engine load code the "
    "startup checks cannot tell from its own",
    "remove it from server.env (export it in your shell if you mean it), or list it in server.allow_code_env "
    "(`--set server.allow_code_env=[NAME]`)",
    into=ENGINE_AWARE_RULES,
)
def _code_env(loaded: LoadedRecipe):
    allowed = set(loaded.recipe.server.allow_code_env)
    refused = [(name, why) for name, why in code_env(loaded).items() if name not in allowed]
    if not refused:
        return []
    (name, why), others = refused[0], [n for n, _ in refused[1:]]
    message = f"server.env sets {name}: {why}"
    if others:
        named = ", ".join(others[:_NAMED_BESIDE]) + (", ..." if len(others) > _NAMED_BESIDE else "")
        message += f" (and {len(others)} more outside the engine's settings: {named})"
    return [("error", f"server.env.{name}", message)]


def general_rules() -> list[Rule]:
    """The rules of every recipe, whatever its engine: the recipes' own (sparkit.recipes.rules),
    then the ones that need to know every engine or the built-in models (above)."""
    return RECIPE_RULES + ENGINE_AWARE_RULES


def rules_for(engine: str) -> list[Rule]:
    """The engine-independent rules, then the engine's own (its adapter's `rules()`)."""
    return general_rules() + list(get_adapter(engine).rules())


def every_rule() -> list[Rule]:
    """Every rule sparkit knows: the general ones and each registered engine's."""
    return general_rules() + [r for adapter in registry().values() for r in adapter.rules()]


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
