"""The engine seam: one adapter per engine, found through one registry (the types it speaks,
EngineAdapter, EngineLaunch and the rest, are the contract's: sparkit.contract.engine).

An adapter turns a loaded recipe into its engine's part of a launch (`EngineLaunch`: argv, env,
which path provides each optimisation, warnings, the expectations only the engine can state,
builds to run first) and owns the engine's quirks: its recipe rules, the packages it needs,
whether it needs a GPU, how an API key reaches it, what it prepares before starting, how its
startup log reads. sparkit.planning.compile assembles the LaunchPlan from it; nothing outside an
adapter branches on an engine's name.

Engines are entry points of the group `sparkit.engines` (name = "module:Class"). The two built-ins
are registered the same way, in sparkit's own pyproject.toml; the same loader reads them from
BUILTIN_ENGINES when sparkit runs from a source tree without installed metadata (a checkout on
PYTHONPATH). A third-party package adds an engine by declaring an entry point in that group.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from importlib import metadata
from typing import Any

from sparkit.contract.checks import CheckResult, Status
from sparkit.contract.engine import EngineAdapter, engine_specs
from sparkit.contract.environment import COMMON_ENVIRONMENT, EngineEnvironment
from sparkit.contract.plan import Provision
from sparkit.hub.cache import plan_hub_model
from sparkit.hub.refs import model_hub_ref
from sparkit.recipes.schema import recipe_keys


@functools.cache
def registry() -> dict[str, EngineAdapter]:
    """Every engine, by name: the installed entry points of ENTRY_POINT_GROUP, and the built-ins
    from the same table when they are not installed (a source tree on PYTHONPATH)."""
    return {name: _load(value) for name, value in engine_specs().items()}


def _load(value: str) -> EngineAdapter:
    module, _, attr = value.partition(":")
    return getattr(importlib.import_module(module), attr)()


def get_adapter(engine: str) -> EngineAdapter:
    adapters = registry()
    if engine not in adapters:
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(adapters)})")
    return adapters[engine]


def engine_environment(engine: str) -> EngineEnvironment:
    """The variables the engine reads as settings (its adapter's optional `environment()`; an
    adapter without one: the libraries every engine reads, COMMON_ENVIRONMENT)."""
    declared = getattr(get_adapter(engine), "environment", None)
    return declared() if callable(declared) else COMMON_ENVIRONMENT


def package_version(name: str) -> str | None:
    """Installed distribution version without importing the package (None = not installed)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` in a pass-through argv (`--flag V` or `--flag=V`), None when absent."""
    for i, item in enumerate(args):
        if item == flag and i + 1 < len(args):
            return args[i + 1]
        if item.startswith(flag + "="):
            return item.split("=", 1)[1]
    return None


# Set for an engine that loads a pulled snapshot: anything in it that would still try the hub
# fails at once instead of downloading inside a launch (a recipe's server.env may say otherwise).
OFFLINE_ENV = "HF_HUB_OFFLINE"


def hub_model_path(key: str, role: str, path: str, pulls: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(what the engine is given, its revision) for a recipe's model path: the local snapshot of
    a hub model complete here (recorded in `pulls`, the plan's model_pulls), else the hub id and
    revision (the launch is refused until `sparkit pull`), else the path as written."""
    local = plan_hub_model(key, role, path, pulls)
    if local is not None:
        return local, None
    ref = model_hub_ref(path)
    if ref is not None:
        return ref.repo, ref.revision
    return path, None


def local_model_provisions(pulls: list[dict[str, Any]], env: dict[str, str]) -> list:
    """For a plan that loads pulled snapshots: HF_HUB_OFFLINE=1 in `env` (unless the recipe sets
    it) and one Provision per model saying which copy the engine reads."""
    out = []
    for pull in pulls:
        if pull["local"]:
            env.setdefault(OFFLINE_ENV, "1")
            out.append(Provision(f"{pull['role']}={pull['ref']}", "sparkit-pull",
                                 f"{pull['local']} ({pull['state']}; {OFFLINE_ENV}={env[OFFLINE_ENV]})"))
        else:
            out.append(Provision(f"{pull['role']}={pull['ref']}", "sparkit-pull",
                                 f"not here ({pull['detail']}): `sparkit pull {pull['ref']}` before the launch"))
    return out


def packages_check(adapter: EngineAdapter) -> CheckResult:
    """Are the engine's packages importable here (without importing them)?"""
    missing = [m for m in adapter.packages if importlib.util.find_spec(m) is None]
    if missing:
        return CheckResult("engine_packages", "engine packages", Status.FAIL, "missing " + ", ".join(missing),
                           fix=adapter.install_hint)
    return CheckResult("engine_packages", "engine packages", Status.PASS, "importable: " + ", ".join(adapter.packages))


def shown_args() -> dict[str, str]:
    """Resolved-args name -> how the chat's server panel and a GSM8K summary name it: the labelled
    rows of every engine's settings table (sparkit.contract.flag_table), in the order a recipe states
    the keys that set them."""
    order = {key: i for i, key in enumerate(recipe_keys())}
    rows = [row for adapter in registry().values() for row in getattr(adapter, "settings", ()) if row.label]
    rows.sort(key=lambda row: order.get(row.key, len(order)))  # stable: a table's own order within a key
    out: dict[str, str] = {}
    for row in rows:
        out.setdefault(row.dest, row.label)
    return out
