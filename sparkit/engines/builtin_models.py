"""sparkit's built-in models (`sparkit:tiny-ling[:seed=N][:steps=S]`) as an engine's adapter plans
and prepares them: planned, not built, at compile time (`plan_builtin_model` records the build in
the plan's `model_builds`, and for engines that load Hugging Face checkpoints its export), built
before the launch (`prepare_builds`). The default build ships with sparkit, so only other seeds or
step counts train. The builder itself is sparkit.engines.embedded.builder.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

BUILTIN_PREFIX = "sparkit:"
_BUILTIN = re.compile(r"^sparkit:(?P<name>[a-z0-9][a-z0-9-]*)(?::seed=(?P<seed>\d+))?(?::steps=(?P<steps>[1-9]\d{0,6}))?$")

# (fraction or None, message) while a build runs
BuildProgress = Callable[[float | None, str], None]


def parse_builtin(path: str) -> tuple[str, int, int | None] | None:
    """('tiny-ling', seed, steps or None) for `sparkit:tiny-ling[:seed=N][:steps=S]`; None for
    paths that are not of that form."""
    m = _BUILTIN.match(path)
    if not m:
        return None
    return m.group("name"), int(m.group("seed") or 0), int(m.group("steps")) if m.group("steps") else None


def plan_builtin_model(loaded, key: str, path: str, builds: list[dict[str, Any]], export_dtype: str | None = None) -> str | None:
    """For a built-in model path: record its build (and, with `export_dtype`, its Hugging Face
    export) in `builds` and return the directory the engine will load. None for other paths."""
    if not path.startswith(BUILTIN_PREFIX):
        return None
    from sparkit.engines.embedded.builder import BUILTIN_MODELS, builtin_model_dir

    parsed = parse_builtin(path)
    if parsed is None or parsed[0] not in BUILTIN_MODELS:
        raise loaded.error(key, f"unknown built-in model {path!r}",
                           hint="built-in models: sparkit:tiny-ling, with :seed=N and :steps=S to build another")
    name, seed, steps = parsed
    build: dict[str, Any] = {"name": name, "seed": seed}
    if steps is not None:
        build["steps"] = steps
        build["dir"] = str(builtin_model_dir(name, seed, steps))
    else:
        build["dir"] = str(builtin_model_dir(name, seed))
    if export_dtype is not None:
        from sparkit.engines.embedded.checkpoint import hf_export_dir

        build["export_hf"] = {"dtype": export_dtype, "dir": str(hf_export_dir(build["dir"], export_dtype))}
    if build not in builds:
        builds.append(build)
    return build["export_hf"]["dir"] if export_dtype is not None else build["dir"]


def prepare_builds(builds: list[dict[str, Any]], progress: BuildProgress) -> None:
    """Make every planned build (and export) exist; reuses what is already there."""
    from sparkit.engines.embedded.builder import ensure_model, remove_dead_builds
    from sparkit.paths import cache_dir

    # What a start killed mid-build left in the cache goes with the next start, even one that
    # builds nothing (a local checkpoint, or the shipped one used in place).
    remove_dead_builds(cache_dir() / "models")
    if not builds:
        return

    for build in builds:
        name = build.get("name", "tiny-ling")

        def report(fraction: float, message: str, _name: str = name) -> None:
            progress(fraction, f"{_name}: {message}")

        directory = ensure_model(name, int(build.get("seed", 0)), build.get("dir"), progress=report, steps=build.get("steps"))
        export = build.get("export_hf")
        if export:
            from sparkit.engines.embedded.checkpoint import ensure_hf_export

            progress(1.0, f"{name}: writing its Hugging Face export to {export['dir']}")
            ensure_hf_export(directory, export["dir"], export.get("dtype", "bfloat16"))
