"""sparkit: fast, provably correct batch-1 MoE decoding on a desktop.

The public surface, for a Python user (the CLI is a thin layer over the same names):

    import sparkit

    loaded = sparkit.load_recipe("tiny")              # a recipe file or shipped name, + overrides
    plan = sparkit.compile_plan(loaded)               # the exact engine launch (LaunchPlan)
    with sparkit.transient_server(plan, checks=True) as started:   # or sparkit.up(plan)
        assert started.ok                             # every startup check passed
        async with sparkit.EngineClient(started.server.url) as client: ...
    run = sparkit.select_run("tiny")                  # a run `sparkit up` started
    sparkit.stop(run)

Errors are SparkitError subclasses with a user-facing message, a hint and an exit code.
Everything is imported on first use, so `import sparkit` (and `sparkit --help`) stays instant and
never imports torch, sglang, textual or scipy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sparkit._version import __version__

# name -> the module that owns it
_EXPORTS = {
    "load_recipe": "sparkit.recipes.load",
    "LoadedRecipe": "sparkit.recipes.load",
    "Recipe": "sparkit.recipes.schema",
    "compile_plan": "sparkit.planning.compile",
    "LaunchPlan": "sparkit.contract.plan",
    "up": "sparkit.runs.pipeline",
    "transient_server": "sparkit.runs.pipeline",
    "Started": "sparkit.runs.pipeline",
    "Run": "sparkit.runs.store",
    "RunState": "sparkit.runs.store",
    "Server": "sparkit.runs.store",
    "list_runs": "sparkit.runs.store",
    "select_run": "sparkit.runs.store",
    "resolve_server": "sparkit.runs.store",
    "stop": "sparkit.runs.launcher",
    "run_activation_checks": "sparkit.checks.runner",
    "CheckResult": "sparkit.contract.checks",
    "Status": "sparkit.contract.checks",
    "EngineClient": "sparkit.client",
    "SparkitError": "sparkit.errors",
    "UsageError": "sparkit.errors",
    "RecipeError": "sparkit.errors",
    "PreflightError": "sparkit.errors",
    "LaunchError": "sparkit.errors",
    "CheckFailed": "sparkit.errors",
    "EngineError": "sparkit.errors",
    "DataError": "sparkit.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # what type checkers and IDEs see
    from sparkit.checks.runner import run_activation_checks
    from sparkit.client import EngineClient
    from sparkit.contract.checks import CheckResult, Status
    from sparkit.contract.plan import LaunchPlan
    from sparkit.errors import (
        CheckFailed,
        DataError,
        EngineError,
        LaunchError,
        PreflightError,
        RecipeError,
        SparkitError,
        UsageError,
    )
    from sparkit.planning.compile import compile_plan
    from sparkit.recipes.load import LoadedRecipe, load_recipe
    from sparkit.recipes.schema import Recipe
    from sparkit.runs.launcher import stop
    from sparkit.runs.pipeline import Started, transient_server, up
    from sparkit.runs.store import Run, RunState, Server, list_runs, resolve_server, select_run
