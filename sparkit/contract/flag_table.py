"""The settings tables' shape, and what every engine's table shares.

Each engine declares its settings once, as one table (sparkit.engines.sglang.flags.SETTINGS,
sparkit.engines.embedded.settings.SETTINGS): a row per resolved argument, saying which recipe key sets
it, the engine flag that passes it, how the recipe's value becomes the flag's (`arg`), what the live
server must then report for it (`expect`), how screens and result files name it (`label`) and which
optimisation its flag provides in `sparkit plan` (`provides`). From the table come the engine's argv,
the flags a pass-through may not repeat (the managed destinations), the resolved args the startup
checks expect, the chat's server panel and the server arguments a GSM8K summary records
(sparkit.engines.base.shown_args). What a recipe key is, whatever the engine (its type, default,
documentation, and whether a change of it changes rounding: `CHANGES_ROUNDING`), is its schema field
(sparkit.recipes.schema); `sparkit tune --param` reaches every field by its key, `sparkit verify` reads
the rounding marks.

Both engines report their resolved arguments in SGLang's ServerArgs names (/server_info), so the
settings every engine resolves under one name are declared here once, in SHARED (with the expectation
every engine is held to: the recipe's value, unless an engine's row says otherwise), and each engine's
table takes them up with its own flag (`shared(key, ...)`).

Adding a stack optimisation (e.g. `stack.kv_cache_dtype`, SGLang's `--kv-cache-dtype`) takes, tests and
recipes aside:
  1. sparkit/recipes/schema.py: the field, its type, default and documentation (the recipe reference
     is generated from it: `python scripts/gen_recipe_reference.py`), with `CHANGES_ROUNDING` when a
     change of it changes the logits' rounding.
  2. sparkit/engines/sglang/flags.py: its row (flag, resolved-args name, `arg`, `expect`, `label`,
     `provides`); CHOICE_ROWS in the adapter when SGLang takes it from a list of choices.
  3. sparkit/engines/embedded/settings.py (the engine's setting and its row), or, when the engine
     cannot run it, a rule in sparkit/engines/embedded/adapter.py that refuses any other value.
  4. README.md where a user reads about it.
Nothing else lists settings: tune, verify, the chat panel, the GSM8K summary, the argv, the managed
flags and the startup checks' expectations all derive from these declarations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sparkit.contract.plan import Provision

# The recipe's three NEXTN numbers (stack.speculative.*), which SGLang takes all or none of.
SPECULATIVE_NUMBERS = ("num_steps", "eagle_topk", "num_draft_tokens")


def chain_draft_tokens(num_steps: int) -> int:
    """The tokens one NEXTN verify step checks on a chain (eagle_topk 1): the drafts and the bonus
    token. SGLang rewrites any other num_draft_tokens to this at topk 1."""
    return num_steps + 1


# The NEXTN numbers SGLang 0.5.23 picks for a Bailing (Ling) model when a recipe gives none
# (sglang.srt.arg_groups.speculative_hook._auto_choose_speculative_params; a test pins them to the
# installed SGLang); the embedded engine, a reference for it, defaults to the same.
SPECULATIVE_DEFAULTS = {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": chain_draft_tokens(3)}

# SGLang runs NEXTN as EAGLE and reports the algorithm it runs: /server_info says EAGLE for a NEXTN
# launch (the embedded engine takes either name and reports the one it was given).
ALIASES = {"NEXTN": "EAGLE"}

# checks.min_accept_length when a speculative recipe states none (compile writes it into the plan).
DEFAULT_MIN_ACCEPT_LENGTH = 1.5
# ... for a DSpark recipe: well between what an untrained draft reaches on the startup probe (1.01 on
# tiny-ling, its mask rows and Markov bias random) and what the trained draft does (3.3 on the probe,
# 7+ on tiny-ling's own text): a block draft that is useless still commits more than one token now
# and then (a repetitive text), so 1.5 would not tell it from a working one.
DEFAULT_MIN_ACCEPT_LENGTH_DSPARK = 2.0

# The port a server listens on unless a recipe or `--port` says otherwise (SGLang's default, and so
# the embedded engine's).
DEFAULT_PORT = 30000


@dataclass(frozen=True)
class Setting:
    """One resolved argument of an engine and where it comes from."""

    key: str  # the recipe key that sets it (dotted)
    dest: str  # its name in the resolved args (SGLang's ServerArgs spelling)
    flag: str | None = None  # the engine's flag (None: the engine takes no flag for it)
    # A pass-through flag with this destination is an error naming `key` (False: sparkit passes
    # the flag only to turn something off, and a pass-through of it has always been accepted).
    managed: bool = True
    # The flag's value for a launch: None (not passed), True (a bare flag) or the value.
    arg: Callable[[Any], Any] | None = None
    # What the live server must report for it (None: not asserted).
    expect: Callable[[Any], Any] | None = None
    # How the chat's server panel and a GSM8K summary name this resolved arg (None: not shown).
    label: str | None = None
    # The optimisation its flag provides (`sparkit plan`'s "provides"), named `provides=<the recipe's
    # value>`, when the row passes its flag (None: the adapter states the provision, or there is none).
    provides: str | None = None

    def argv(self, launch: Any) -> list[str]:
        """This row's part of the command line for `launch` (the engine's planned values)."""
        value = self.arg(launch) if self.arg is not None and self.flag else None
        if value is None or value is False:
            return []
        return [self.flag] if value is True else [self.flag, str(value)]  # type: ignore[list-item]


def _recipe_says(key: str) -> Callable[[Any], Any]:
    return lambda launch: recipe_value(launch.recipe, key)


def _algorithm(launch: Any) -> str | None:
    spec = launch.recipe.stack.speculative
    return spec.method.upper() if spec.enabled else None


_SPECULATIVE_LABELS = {"num_steps": "spec steps", "eagle_topk": "spec topk", "num_draft_tokens": "draft tokens"}

# The settings every engine resolves under the same name. Those with an `expect` are held to it on
# every engine (an engine's row may say otherwise), in this order in the resolved-args check.
SHARED: dict[str, Setting] = {s.key: s for s in (
    *(Setting(f"stack.speculative.{n}", f"speculative_{n}", expect=_recipe_says(f"stack.speculative.{n}"),
              label=_SPECULATIVE_LABELS[n]) for n in SPECULATIVE_NUMBERS),
    Setting("stack.tp", "tp_size", expect=_recipe_says("stack.tp"), label="tp"),
    Setting("stack.ep", "ep_size", expect=_recipe_says("stack.ep"), label="ep"),
    Setting("stack.attention_backend", "attention_backend", expect=_recipe_says("stack.attention_backend"),
            label="attention"),
    Setting("server.mem_fraction_static", "mem_fraction_static", expect=_recipe_says("server.mem_fraction_static")),
    Setting("stack.moe_backend", "moe_runner_backend", expect=_recipe_says("stack.moe_backend"), label="MoE backend"),
    Setting("stack.speculative.method", "speculative_algorithm", expect=_algorithm, label="speculative"),
    Setting("stack.speculative.draft_model", "speculative_draft_model_path", label="draft model"),
    Setting("model.path", "model_path", label="model"),
    Setting("model.served_name", "served_model_name", label="served as"),
    Setting("model.dtype", "dtype", label="dtype"),
)}


@dataclass(frozen=True)
class RecipeLaunch:
    """A launch as the recipe alone states it (what SHARED's expectations read), before an engine
    resolves anything."""

    recipe: Any  # sparkit.recipes.schema.Recipe


def shared_expectations(recipe: Any) -> dict[str, Any]:
    """What every engine's live server must report for the shared settings of `recipe` (an engine's
    own expectations, sparkit.contract.engine.EngineLaunch, are laid over these)."""
    return expected_args(tuple(SHARED.values()), RecipeLaunch(recipe))


def recipe_value(recipe: Any, key: str) -> Any:
    """The value of a dotted recipe key ("stack.speculative.num_steps") in a Recipe."""
    value = recipe
    for part in key.split("."):
        value = getattr(value, part)
    return value


def shared(key: str, **engine: Any) -> Setting:
    """The shared row for `key`, with an engine's flag and values."""
    return replace(SHARED[key], **engine)


def command_line(table: tuple[Setting, ...], launch: Any) -> list[str]:
    """The flags of every row for `launch`, in the table's order."""
    return [item for row in table for item in row.argv(launch)]


def expected_args(table: tuple[Setting, ...], launch: Any) -> dict[str, Any]:
    """The resolved args the live server must report for `launch` (rows whose `expect` says one)."""
    out: dict[str, Any] = {}
    for row in table:
        value = row.expect(launch) if row.expect is not None else None
        if value is not None:
            out[row.dest] = value
    return out


def passed(table: tuple[Setting, ...], dest: str, launch: Any) -> str:
    """What the command line for `launch` says for `dest` ("--moe-runner-backend triton"; "": not passed)."""
    return " ".join(next(row for row in table if row.dest == dest).argv(launch))


def managed_dests(table: tuple[Setting, ...]) -> dict[str, str]:
    """Resolved-args name -> the recipe key that sets it, for the flags a pass-through may not repeat."""
    return {row.dest: row.key for row in table if row.managed and row.flag}



def flag_provisions(table: tuple[Setting, ...], launch: Any, provider: str) -> list[Provision]:
    """The provisions of the rows that provide an optimisation through their flag (`provides`), for
    the rows that pass it for `launch`: `<provides>=<the recipe's value>`, by `provider`, the flag as
    passed."""
    out = []
    for row in table:
        argv = row.argv(launch) if row.provides else []
        if argv:
            out.append(Provision(f"{row.provides}={recipe_value(launch.recipe, row.key)}", provider, " ".join(argv)))
    return out
