"""The engine adapter protocol: one adapter per engine (sglang, embedded).

An adapter detects what the installed engine supports and compiles a loaded
recipe into a LaunchPlan (argv + env + expectations). Adding an engine is
adding one adapter and one entry in `get_adapter`, not touching the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sparkit.recipes.load import LoadedRecipe
    from sparkit.recipes.plan import LaunchPlan


@dataclass
class EngineInfo:
    """What `sparkit doctor` reports about an installed engine."""

    name: str
    importable: bool
    version: str | None = None
    detail: str = ""
    extras: dict[str, str | None] = field(default_factory=dict)  # package -> version (None = missing)


class EngineAdapter(Protocol):
    name: str

    def probe(self) -> EngineInfo:
        """Is the engine installed, which version, which optional kernels. Never raises."""
        ...

    def compile(self, loaded: "LoadedRecipe", *, port: int | None = None) -> "LaunchPlan":
        """The exact launch for a recipe whose engine-independent rules already passed.
        Raises RecipeError for what only the installed engine can reject."""
        ...


def get_adapter(engine: str) -> EngineAdapter:
    if engine == "sglang":
        from sparkit.engines.sglang.adapter import SGLangAdapter

        return SGLangAdapter()
    if engine == "embedded":
        from sparkit.engines.embedded.adapter import EmbeddedAdapter

        return EmbeddedAdapter()
    raise ValueError(f"unknown engine {engine!r}")


def package_version(name: str) -> str | None:
    """Installed distribution version without importing the package (None = not installed)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
