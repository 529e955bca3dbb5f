"""Where sparkit keeps things on disk.

`SPARKIT_HOME`, when set, roots everything (tests and CI set it to a temporary
directory so that nothing leaks between runs). Otherwise the platform's user
directories are used.
"""

from __future__ import annotations

import os
from pathlib import Path


def _home() -> Path | None:
    value = os.environ.get("SPARKIT_HOME")
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    """Built models (tiny-ling) and other regenerable artefacts."""
    home = _home()
    if home:
        return home / "cache"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("sparkit"))


def data_dir() -> Path:
    """User data worth keeping: chat history, eval and bench results by default."""
    home = _home()
    if home:
        return home / "data"
    from platformdirs import user_data_dir

    return Path(user_data_dir("sparkit"))


def runs_dir() -> Path:
    """One sub-directory per started server (see sparkit.runs)."""
    home = _home()
    if home:
        return home / "runs"
    from platformdirs import user_state_dir

    return Path(user_state_dir("sparkit")) / "runs"


def repo_recipes_dir() -> Path:
    """The shipped recipes (top-level `recipes/` of the source tree)."""
    return Path(__file__).resolve().parent.parent / "recipes"
