"""sparkit's built-in models as an engine's adapter plans and prepares them: planned, not built, at
compile time (`plan_builtin_model` records the build in the plan's `model_builds`, and its
Hugging Face export where the engine loads one or the path names a weights layout), built before
the launch (`prepare_builds`). The default build ships with sparkit, so only other seeds or step
counts train. The builder itself is sparkit.models.builder.

    sparkit:NAME[:seed=N][:steps=S][@WEIGHTS[+damaged-scale]]      NAME: tiny-ling or tiny-ling-v3
    sparkit:DRAFT[:seed=N][:steps=S]      DRAFT: tiny-ling-dspark or tiny-ling-v3-dspark (a DSpark
                                          draft for tiny-ling / tiny-ling-v3; steps=0: untrained)

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

from sparkit.models.builder import builtin_model_dir, ensure_model, remove_dead_builds
from sparkit.models.catalog import BUILTIN_DRAFTS, BUILTIN_MODELS, family
from sparkit.models.checkpoint import ensure_hf_export, hf_export_dir
from sparkit.models.dspark.builder import builtin_draft_dir, ensure_draft
from sparkit.models.dspark.config import read_block_size
from sparkit.models.tiny_ling.hf_quantized import LAYOUT_HINT
from sparkit.paths import cache_dir
from sparkit.weight_formats import WEIGHT_FORMATS

# Imported inside functions: a family's model module (its default config) and the quality gate's
# measure (sparkit.engines.embedded.quality: the engine), which import torch; planning a built-in
# model must not need them.

BUILTIN_PREFIX = "sparkit:"
DAMAGED_SCALE = "damaged-scale"
_BUILTIN = re.compile(r"^sparkit:(?P<name>[a-z0-9][a-z0-9-]*)(?::seed=(?P<seed>\d+))?(?::steps=(?P<steps>0|[1-9]\d{0,6}))?"
                      r"(?:@(?P<weights>[a-z0-9]+)(?P<damaged>\+" + DAMAGED_SCALE + r")?)?$")
SYNTAX = (f"sparkit:{'|'.join(BUILTIN_MODELS)}[:seed=N][:steps=S][@bf16|@fp8|@mxfp4[+damaged-scale]], "
          f"sparkit:{'|'.join(BUILTIN_DRAFTS)}[:seed=N][:steps=S] (a DSpark draft; steps=0: untrained)")

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
    if ref is None or ref.name not in (*BUILTIN_MODELS, *BUILTIN_DRAFTS):
        raise loaded.error(key, f"unknown built-in model {path!r}",
                           hint=f"built-in models: {SYNTAX} (:seed and :steps build another; @WEIGHTS names "
                                f"its export in that layout)")
    if ref.name in BUILTIN_DRAFTS:
        return _plan_builtin_draft(loaded, key, path, ref, builds)
    if ref.steps == 0:
        raise loaded.error(key, f"{path!r}: a {ref.name} build takes at least one training step",
                           hint="steps=0 (an untrained model) exists for the DSpark drafts (sparkit:tiny-ling-dspark:steps=0)")
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
        problem = _layout_problem(ref.name, build["dir"], weights)
        if problem:
            raise loaded.error(key, f"{path!r}: {problem}", hint=LAYOUT_HINT)
        dtype = export_dtype or "bfloat16"
        build["export_hf"] = {"dtype": dtype, "weights": weights, "damaged_scale": ref.damaged_scale,
                              "dir": str(hf_export_dir(build["dir"], dtype, weights, ref.damaged_scale))}
    if build not in builds:
        builds.append(build)
    return build["export_hf"]["dir"] if "export_hf" in build else build["dir"]


def builtin_build_dir(name: str, seed: int = 0, steps: int | None = None) -> str:
    """Where the build of a built-in model or DSpark draft lives (shipped, else the user cache)."""
    if name in BUILTIN_DRAFTS:
        return str(builtin_draft_dir(name, seed) if steps is None else builtin_draft_dir(name, seed, steps))
    return str(builtin_model_dir(name, seed) if steps is None else builtin_model_dir(name, seed, steps))


def _plan_builtin_draft(loaded, key: str, path: str, ref: BuiltinRef, builds: list[dict[str, Any]]) -> str:
    """A built-in DSpark draft: its build is the checkpoint both engines load (SGLang's layout)."""
    if ref.weights is not None:
        raise loaded.error(key, f"{path!r}: a DSpark draft has no weights layouts (@{ref.weights})",
                           hint="name the draft without @: it is stored as SGLang loads it (bf16)")
    if key != "stack.speculative.draft_model":
        raise loaded.error(key, f"{path!r} is a DSpark draft, not a model to serve",
                           hint="use it as stack.speculative.draft_model with speculative.method: dspark")
    build: dict[str, Any] = {"name": ref.name, "seed": ref.seed, "kind": "dspark"}
    if ref.steps is not None:
        build["steps"] = ref.steps
        build["dir"] = str(builtin_draft_dir(ref.name, ref.seed, ref.steps))
    else:
        build["dir"] = str(builtin_draft_dir(ref.name, ref.seed))
    if build not in builds:
        builds.append(build)
    return build["dir"]


def _layout_problem(name: str, build_dir: str, weights: str) -> str | None:
    """Why the build of `name` at `build_dir` cannot be exported in `weights` (its config.json's
    widths; a build not made yet has its family's default config)."""
    if weights == "bf16":
        return None
    import json
    import types
    from pathlib import Path

    fam = family(name)
    hf_format = fam.hf_format()
    try:  # a build's config.json holds every config field (no torch needed to read it)
        cfg = types.SimpleNamespace(**json.loads((Path(build_dir) / "config.json").read_text()))
        hf_format.layout_error(cfg, weights)
    except (OSError, ValueError, TypeError, AttributeError):
        cfg = fam.config_from_dict({})  # imports torch: only for builds not made yet
    return hf_format.layout_error(cfg, weights)


def prepare_builds(builds: list[dict[str, Any]], progress: BuildProgress) -> None:
    """Make every planned build (and export) exist; reuses what is already there."""
    # What a start killed mid-build left in the cache goes with the next start, even one that
    # builds nothing (a local checkpoint, or the shipped one used in place).
    remove_dead_builds(cache_dir() / "models")
    if not builds:
        return

    from sparkit.engines.embedded.quality import measure_draft_quality, measure_quality

    for build in builds:
        name = build.get("name", "tiny-ling")

        def report(fraction: float, message: str, _name: str = name) -> None:
            progress(fraction, f"{_name}: {message}")

        if build.get("kind") == "dspark":
            ensure_draft(name, int(build.get("seed", 0)), build.get("dir"), progress=report, steps=build.get("steps"),
                         measure=measure_draft_quality)
            continue

        directory = ensure_model(name, int(build.get("seed", 0)), build.get("dir"), progress=report, steps=build.get("steps"),
                                 measure=measure_quality)
        export = build.get("export_hf")
        if export:
            weights = export.get("weights", "bf16")
            what = "" if weights == "bf16" else f" ({weights}{', one scale damaged' if export.get('damaged_scale') else ''})"
            progress(1.0, f"{name}: writing its Hugging Face export{what} to {export['dir']}")
            ensure_hf_export(directory, export["dir"], export.get("dtype", "bfloat16"), weights,
                             bool(export.get("damaged_scale")))


def draft_block_size(draft_model: str | None, draft_dir: str | None) -> int | None:
    """The block size a DSpark draft declares (its config.json); a built-in draft not built yet
    has the shipped build's configuration (the builder's, whatever the seed or steps)."""
    block = read_block_size(draft_dir) if draft_dir else None
    if block is None and draft_model and parse_builtin(draft_model) is not None:
        block = read_block_size(builtin_draft_dir())
    return block
