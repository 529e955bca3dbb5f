"""The engine's part of the contract: what an adapter states about its engine and hands the
planner, and the Protocol every adapter meets (sparkit.engines.base finds them; a third-party
package adds one through the entry-point group ENTRY_POINT_GROUP).

`engine_names` reads the registered names from the package metadata without importing any
adapter, so that a recipe's `engine:` is validated below the engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from sparkit.contract.checks import CheckResult
from sparkit.contract.flag_table import Setting
from sparkit.contract.log import Diagnosis, LogEvidence
from sparkit.contract.plan import LaunchPlan, Provision
from sparkit.contract.reading import ReadRules
from sparkit.contract.rules import Rule

ENTRY_POINT_GROUP = "sparkit.engines"
# The phases of a start, in order, as `sparkit up` shows them; an adapter's startup_phase() names one.
STARTUP_PHASES = ("starting", "loading weights", "capturing CUDA graphs", "warming up", "ready")
# What sparkit's pyproject.toml registers in ENTRY_POINT_GROUP (tests/test_engines.py keeps them equal).
BUILTIN_ENGINES = {
    "sglang": "sparkit.engines.sglang.adapter:SGLangAdapter",
    "embedded": "sparkit.engines.embedded.adapter:EmbeddedAdapter",
}


def engine_specs() -> dict[str, str]:
    """name -> "module:Class" of every engine: the installed entry points of ENTRY_POINT_GROUP,
    and the built-ins from BUILTIN_ENGINES when they are not installed (a source tree on PYTHONPATH)."""
    specs = {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    for name, value in BUILTIN_ENGINES.items():
        specs.setdefault(name, value)
    return dict(sorted(specs.items()))


def engine_names() -> list[str]:
    return list(engine_specs())


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
    # Expectations fields only the engine can state (e.g. server_args: the resolved-args names and
    # values to verify, laid over the shared settings' expectations: SGLang reports NEXTN as EAGLE).
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
    # Its settings table (sparkit.contract.flag_table: recipe key -> flag -> resolved arg -> expectation,
    # label, provision); a third-party adapter without one has no labelled settings to show.
    settings: tuple[Setting, ...]

    def probe(self) -> EngineInfo:
        """Is the engine installed, which version, which optional kernels. Never raises."""
        ...

    def rules(self) -> list[Rule]:
        """The engine's own recipe rules (what it cannot run), checked with the general ones."""
        ...

    # Optional: `environment() -> EngineEnvironment` (sparkit.contract.environment), the families of
    # variables the engine reads as settings: a recipe's server.env may set those; any other needs
    # server.allow_code_env. An adapter without it: COMMON_ENVIRONMENT (PyTorch, CUDA, NCCL, ...).

    # Optional: `compatibility(recipes, probe) -> dict | None`, what `sparkit doctor` shows of the
    # installed packages the engine needs, judged for each of `recipes` ([(name, resolved recipe
    # dict)] of this engine); see SGLangAdapter.compatibility. Found with getattr: an adapter
    # without it has nothing to report.

    def launch(self, loaded: Any, *, port: int) -> EngineLaunch:
        """(`loaded` is a sparkit.recipes.load.LoadedRecipe: the contract sits below the recipes.)
        The engine's part of the launch of a recipe whose rules passed. Raises RecipeError for
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
