"""sparkit's built-in models as an engine's adapter plans and prepares them: planned, not built, at
compile time (`plan_builtin_model` records the build in the plan's `model_builds`, and its
Hugging Face export where the engine loads one or the path names a weights layout), built before
the launch (`prepare_builds`). The default build ships with sparkit, so only other seeds or step
counts train. The builder itself is sparkit.engines.embedded.builder.

    sparkit:tiny-ling[:seed=N][:steps=S][@WEIGHTS[+damaged-scale]]

`@fp8` / `@mxfp4` name the export in that layout of sparkit.weight_formats.LAYOUTS (the published
-fp8 and -fp4 checkpoints' layouts: `sparkit model export-hf --weights`), `@bf16` the plain
export; `+damaged-scale` the quantised export with one expert's scale written wrong on purpose
(`--debug-damage-scale`: the known-answer check must catch it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkit.engines.embedded.builder import BUILTIN_MODELS, builtin_model_dir, ensure_model, remove_dead_builds
from sparkit.engines.embedded.checkpoint import ensure_hf_export, hf_export_dir
from sparkit.engines.embedded.hf_quantized import LAYOUT_HINT, layout_error
from sparkit.paths import cache_dir
from sparkit.weight_formats import WEIGHT_FORMATS

# Imported inside functions: sparkit.engines.embedded.model (TinyLingConfig), which imports torch;
# planning a built-in model must not need it.

BUILTIN_PREFIX = "sparkit:"
DAMAGED_SCALE = "damaged-scale"
_BUILTIN = re.compile(r"^sparkit:(?P<name>[a-z0-9][a-z0-9-]*)(?::seed=(?P<seed>\d+))?(?::steps=(?P<steps>[1-9]\d{0,6}))?"
                      r"(?:@(?P<weights>[a-z0-9]+)(?P<damaged>\+" + DAMAGED_SCALE + r")?)?$")
SYNTAX = "sparkit:tiny-ling[:seed=N][:steps=S][@bf16|@fp8|@mxfp4[+damaged-scale]]"

# (fraction or None, message) while a build runs
BuildProgress = Callable[[float | None, str], None]


@dataclass(frozen=True)
class BuiltinRef:
    """A parsed built-in model path."""

    name: str
    seed: int = 0
    steps: int | None = None
    weights: str | None = None  # None: no layout named (the build itself, or the engine's default export)
    damaged_scale: bool = False


def parse_builtin_ref(path: str) -> BuiltinRef | None:
    """The parts of `sparkit:NAME[:seed=N][:steps=S][@WEIGHTS[+damaged-scale]]`; None for paths
    not of that form (an unknown WEIGHTS is not of that form)."""
    m = _BUILTIN.match(path)
    if not m or (m.group("weights") is not None and m.group("weights") not in WEIGHT_FORMATS):
        return None
    return BuiltinRef(m.group("name"), int(m.group("seed") or 0), int(m.group("steps")) if m.group("steps") else None,
                      m.group("weights"), m.group("damaged") is not None)


def parse_builtin(path: str) -> tuple[str, int, int | None] | None:
    """('tiny-ling', seed, steps or None) of a built-in model path (see parse_builtin_ref); None
    for paths that are not of that form."""
    ref = parse_builtin_ref(path)
    return (ref.name, ref.seed, ref.steps) if ref else None


def plan_builtin_model(loaded, key: str, path: str, builds: list[dict[str, Any]], export_dtype: str | None = None) -> str | None:
    """For a built-in model path: record its build (and its Hugging Face export, when the engine
    loads one, `export_dtype`, or the path names a weights layout) in `builds` and return the
    directory the engine will load. None for other paths."""
    if not path.startswith(BUILTIN_PREFIX):
        return None

    ref = parse_builtin_ref(path)
    if ref is None or ref.name not in BUILTIN_MODELS:
        raise loaded.error(key, f"unknown built-in model {path!r}",
                           hint=f"built-in models: {SYNTAX} (:seed and :steps build another; @WEIGHTS names "
                                f"its export in that layout)")
    if ref.damaged_scale and ref.weights in (None, "bf16"):
        raise loaded.error(key, f"{path!r}: +{DAMAGED_SCALE} damages a quantisation scale, and the bf16 export has none",
                           hint="use @fp8+damaged-scale or @mxfp4+damaged-scale")
    build: dict[str, Any] = {"name": ref.name, "seed": ref.seed}
    if ref.steps is not None:
        build["steps"] = ref.steps
        build["dir"] = str(builtin_model_dir(ref.name, ref.seed, ref.steps))
    else:
        build["dir"] = str(builtin_model_dir(ref.name, ref.seed))
    weights = ref.weights or ("bf16" if export_dtype is not None else None)
    if weights is not None:
        problem = _layout_problem(build["dir"], weights)
        if problem:
            raise loaded.error(key, f"{path!r}: {problem}", hint=LAYOUT_HINT)
        dtype = export_dtype or "bfloat16"
        build["export_hf"] = {"dtype": dtype, "weights": weights, "damaged_scale": ref.damaged_scale,
                              "dir": str(hf_export_dir(build["dir"], dtype, weights, ref.damaged_scale))}
    if build not in builds:
        builds.append(build)
    return build["export_hf"]["dir"] if "export_hf" in build else build["dir"]


def _layout_problem(build_dir: str, weights: str) -> str | None:
    """Why the build at `build_dir` cannot be exported in `weights` (its config.json's widths;
    a build not made yet has the builder's default config)."""
    if weights == "bf16":
        return None
    import json
    import types
    from pathlib import Path

    try:  # a build's config.json holds every TinyLingConfig field (no torch needed to read it)
        cfg = types.SimpleNamespace(**json.loads((Path(build_dir) / "config.json").read_text()))
        layout_error(cfg, weights)
    except (OSError, ValueError, TypeError, AttributeError):
        from sparkit.engines.embedded.model import TinyLingConfig  # imports torch: only for builds not made yet

        cfg = TinyLingConfig()
    return layout_error(cfg, weights)


def prepare_builds(builds: list[dict[str, Any]], progress: BuildProgress) -> None:
    """Make every planned build (and export) exist; reuses what is already there."""
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
            weights = export.get("weights", "bf16")
            what = "" if weights == "bf16" else f" ({weights}{', one scale damaged' if export.get('damaged_scale') else ''})"
            progress(1.0, f"{name}: writing its Hugging Face export{what} to {export['dir']}")
            ensure_hf_export(directory, export["dir"], export.get("dtype", "bfloat16"), weights,
                             bool(export.get("damaged_scale")))
