"""The engine seam: one adapter per engine, found through one registry.

An adapter turns a loaded recipe into its engine's part of a launch (`EngineLaunch`: argv, env,
which path provides each optimisation, warnings, the expectations only the engine can state,
builds to run first) and owns the engine's quirks: its recipe rules, the packages it needs,
whether it needs a GPU, how an API key reaches it, what it prepares before starting, how its
startup log reads. sparkit.recipes.compile assembles the LaunchPlan from it; nothing outside an
adapter branches on an engine's name.

Engines are entry points of the group `sparkit.engines` (name = "module:Class"). The two built-ins
are registered the same way, in sparkit's own pyproject.toml; the same loader reads them from
BUILTIN_ENGINES when sparkit runs from a source tree without installed metadata (a checkout on
PYTHONPATH). A third-party package adds an engine by declaring an entry point in that group.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sparkit.checks.results import CheckResult
    from sparkit.engines.sglang.log import Diagnosis, LogEvidence
    from sparkit.recipes.load import LoadedRecipe
    from sparkit.recipes.plan import LaunchPlan, Provision
    from sparkit.recipes.rules import Rule
    from sparkit.roofline.estimate import ReadRules

ENTRY_POINT_GROUP = "sparkit.engines"
# The phases of a start, in order, as `sparkit up` shows them; an adapter's startup_phase() names one.
STARTUP_PHASES = ("starting", "loading weights", "capturing CUDA graphs", "warming up", "ready")
# What sparkit's pyproject.toml registers in ENTRY_POINT_GROUP (tests/test_engines.py keeps them equal).
BUILTIN_ENGINES = {
    "sglang": "sparkit.engines.sglang.adapter:SGLangAdapter",
    "embedded": "sparkit.engines.embedded.adapter:EmbeddedAdapter",
}


@dataclass
class EngineInfo:
    """What `sparkit doctor` reports about an installed engine."""

    name: str
    importable: bool
    version: str | None = None
    detail: str = ""
    extras: dict[str, str | None] = field(default_factory=dict)  # package -> version (None = missing)


@dataclass
class EngineLaunch:
    """An adapter's part of a LaunchPlan (compile adds the recipe's own parts)."""

    argv: list[str]  # argv[0] is the executable
    env: dict[str, str]  # only what the engine needs set (merged over os.environ at start)
    served_model_name: str
    provisions: list[Provision] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Expectations fields only the engine can state (e.g. speculative_algorithm_reported: SGLang
    # reports NEXTN as EAGLE; server_args: the resolved-args names and values to verify).
    expectations: dict[str, Any] = field(default_factory=dict)
    model_builds: list[dict[str, Any]] = field(default_factory=list)  # see sparkit.engines.builtin_models
    model_pulls: list[dict[str, Any]] = field(default_factory=list)  # see sparkit.hub.cache.plan_hub_model
    validated_by: str | None = None  # what checked argv/env against the engine that will run them
    validation_note: str | None = None  # why nothing could, and how to get it


class EngineAdapter(Protocol):
    name: str
    needs_gpu: bool  # a target of `auto` needs a GPU on the host
    packages: tuple[str, ...]  # import names the engine needs on the serving host
    install_hint: str  # how to get them
    validation_hint: str  # how to get a plan validated by the engine's own parser where it is not
    memory_model: str  # "mem_fraction_static" | "host_process" (how sparkit.memory.fit sizes it)
    # Speculative decoding reproduces plain greedy decoding bit for bit (sparkit verify judges a
    # speculative change by byte-exact output only then; a third-party engine is assumed not to).
    exact_speculative: bool
    secret_files: tuple[str, ...]  # run-directory files deliver_secret writes, removed once the engine is up
    key_env: tuple[str, ...]  # environment variables the engine reads an API key from (never set in a recipe)

    def probe(self) -> EngineInfo:
        """Is the engine installed, which version, which optional kernels. Never raises."""
        ...

    def rules(self) -> list[Rule]:
        """The engine's own recipe rules (what it cannot run), checked with the general ones."""
        ...

    # Optional: `compatibility(recipes, probe) -> dict | None`, what `sparkit doctor` shows of the
    # installed packages the engine needs, judged for each of `recipes` ([(name, resolved recipe
    # dict)] of this engine); see SGLangAdapter.compatibility. Found with getattr: an adapter
    # without it has nothing to report.

    def launch(self, loaded: LoadedRecipe, *, port: int) -> EngineLaunch:
        """The engine's part of the launch of a recipe whose rules passed. Raises RecipeError for
        what only the installed engine can reject."""
        ...

    def preflight(self, plan: LaunchPlan) -> list[CheckResult]:
        """Engine-specific checks of the serving host (its packages and what they imply)."""
        ...

    def deliver_secret(self, secret: str, run_dir: Path) -> tuple[dict[str, str], list[str]]:
        """(environment, extra argv) that hand the engine its API key without it appearing in
        argv or plan.json."""
        ...

    def prepare(self, plan: LaunchPlan, progress) -> None:
        """What must exist before the engine starts (built-in model builds and exports)."""
        ...

    def startup_phase(self, line: str) -> str:
        """The furthest startup phase (one of STARTUP_PHASES) the log text shows."""
        ...

    def read_rules(self, recipe: Any, layout: Any, device: str) -> ReadRules:
        """How the engine reads a checkpoint's bytes per decode step (sparkit.roofline.estimate)."""
        ...

    def read_log(self, log_text: str) -> LogEvidence:
        """The evidence lines of the engine's log the startup checks read."""
        ...

    def diagnose(self, log_text: str, returncode: int | None) -> Diagnosis:
        """The most likely cause of a failed start, from the engine's log."""
        ...


@functools.cache
def registry() -> dict[str, EngineAdapter]:
    """Every engine, by name: the installed entry points of ENTRY_POINT_GROUP, and the built-ins
    from the same table when they are not installed (a source tree on PYTHONPATH)."""
    from importlib import metadata

    specs = {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    for name, value in BUILTIN_ENGINES.items():
        specs.setdefault(name, value)
    return {name: _load(value) for name, value in sorted(specs.items())}


def _load(value: str) -> EngineAdapter:
    import importlib

    module, _, attr = value.partition(":")
    return getattr(importlib.import_module(module), attr)()


def engine_names() -> list[str]:
    return list(registry())


def get_adapter(engine: str) -> EngineAdapter:
    adapters = registry()
    if engine not in adapters:
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(adapters)})")
    return adapters[engine]


def package_version(name: str) -> str | None:
    """Installed distribution version without importing the package (None = not installed)."""
    from importlib import metadata

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
    from sparkit.hub.cache import plan_hub_model
    from sparkit.hub.refs import model_hub_ref

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
    from sparkit.recipes.plan import Provision

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
