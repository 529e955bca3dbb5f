"""Where a recipe's checkpoint is on this machine, or why it cannot be read.

A model reference is a local directory, one of sparkit's built-in models (`sparkit:tiny-ling...`,
built under SPARKIT_HOME or shipped with the package), or a hub id (`org/name[@revision]`). A hub
id is readable here when the Hugging Face cache holds a complete snapshot of it (`sparkit pull`,
or another tool's download; sparkit.hub.cache); otherwise its `hub` reference lets the memory fit
read its headers from the hub (sparkit.hub.remote), and `need` says what would make it local.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkit.engines.builtin_models import parse_builtin_ref
from sparkit.hub.cache import local_copy
from sparkit.hub.refs import HubRef, parse_hub_ref
from sparkit.models.dspark.builder import BUILTIN_DRAFTS, builtin_draft_dir


@dataclass(frozen=True)
class CheckpointLocation:
    ref: str  # what the recipe names
    directory: Path | None  # where its config.json and weights are, when readable
    how: str  # how it was found, or why not
    need: str | None = None  # what would make it readable (None when it is)
    hub: HubRef | None = None  # the hub model it names (its headers can be read from the hub)

    @property
    def readable(self) -> bool:
        return self.directory is not None


def locate(ref: str, build_dir: str | None = None) -> CheckpointLocation:
    """Find `ref` on disk. `build_dir` is where the plan builds a built-in model (plan.model_builds)."""
    if ref.startswith("sparkit:"):
        directory = Path(build_dir) if build_dir else None
        if directory is not None and (directory / "config.json").is_file():
            return CheckpointLocation(ref, directory, f"sparkit build {directory}")
        shipped = _shipped_draft(ref)
        if shipped is not None:  # every build of a built-in draft has the shipped one's layout
            return CheckpointLocation(ref, shipped, f"sparkit builds it before the launch; sized from the shipped "
                                      f"draft {shipped} (the same layout)")
        return CheckpointLocation(ref, None, "sparkit builds it before the launch; not built yet",
                                  need="it is read once built (`sparkit up` builds it; or `sparkit model make-tiny`)")
    path = Path(ref).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return CheckpointLocation(ref, path, f"local directory {path}")
        return CheckpointLocation(ref, None, f"{path} has no config.json", need="point model.path at a checkpoint directory")
    hub = parse_hub_ref(ref)
    if hub is not None:
        copy = local_copy(hub)
        if copy.complete:
            return CheckpointLocation(ref, copy.path, f"Hugging Face cache {copy.path} ({copy.state})", hub=hub)
        return CheckpointLocation(
            ref, None, f"hub id, not here ({copy.detail})", hub=hub,
            need=(f"`sparkit pull {hub}` (or the hub, for its safetensors headers: unset HF_HUB_OFFLINE), "
                  "or --set model.path=DIR with DIR a local copy; only config.json and the headers are read"))
    return CheckpointLocation(ref, None, f"{ref} is neither a local directory nor a hub id",
                              need="fix model.path (a directory, or org/name[@revision] on the hub)")


def _shipped_draft(ref: str) -> Path | None:
    """The shipped build of a built-in DSpark draft `ref` names (None: not a draft, or none ships)."""
    parsed = parse_builtin_ref(ref)
    if parsed is None or parsed.name not in BUILTIN_DRAFTS:
        return None
    shipped = builtin_draft_dir(parsed.name)
    return shipped if (shipped / "config.json").is_file() else None


def _build_dir_for(plan: Any, ref: str) -> str | None:
    """The directory the plan builds a `sparkit:` reference into (its HF export, for SGLang or a
    path that names a weights layout)."""
    if not ref.startswith("sparkit:"):
        return None

    parsed = parse_builtin_ref(ref)
    if parsed is None:
        return None
    for build in plan.model_builds:
        if (build.get("name"), build.get("seed"), build.get("steps")) != (parsed.name, parsed.seed, parsed.steps):
            continue
        export = build.get("export_hf")
        if parsed.weights is not None and (export is None or (export.get("weights", "bf16"), bool(export.get("damaged_scale")))
                                           != (parsed.weights, parsed.damaged_scale)):
            continue
        if export and (Path(export["dir"]) / "config.json").is_file():
            return export["dir"]
        return build["dir"]  # the export is written at launch; until then the build's own headers
    return None


def plan_checkpoints(plan: Any) -> dict[str, CheckpointLocation]:
    """The checkpoints a plan's engine loads: "target", and "draft" when a separate draft model is set."""
    recipe = plan.recipe or {}
    target_ref = plan.model
    out = {"target": locate(target_ref, _build_dir_for(plan, target_ref))}
    draft_ref = ((recipe.get("stack") or {}).get("speculative") or {}).get("draft_model")
    if draft_ref:
        out["draft"] = locate(draft_ref, _build_dir_for(plan, draft_ref))
    return out


def plan_checkpoint_dirs(plan: Any) -> list[Path]:
    """Local directories of the plan's checkpoints (for the page-cache picture and the load guard)."""
    return [loc.directory for loc in plan_checkpoints(plan).values() if loc.directory is not None]
