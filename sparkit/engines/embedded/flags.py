"""The embedded engine's settings table: recipe key -> the engine's setting (its flag,
sparkit.engines.embedded.settings) -> resolved-args name -> what /server_info must report (the
shape: sparkit.engines.table). The adapter's argv is the table's rows in order (`command_line`),
then the recipe's pass-through flags; the expected server args come from the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkit.engines.embedded.settings import flag_name
from sparkit.engines.table import SPECULATIVE_NUMBERS, Setting, expected_args, shared


@dataclass
class Planned:
    """What a launch resolved before its command line."""

    recipe: Any  # sparkit.recipes.schema.Recipe
    port: int
    model_dir: str  # a built-in model's build, a pulled snapshot, or the directory as written
    served_name: str
    draft_dir: str | None = None

    @property
    def spec(self) -> Any:
        return self.recipe.stack.speculative

    @property
    def nextn(self) -> bool:
        return self.spec.method == "nextn"  # the only method the engine has (rule embedded-speculative-nextn-only)


def _setting(key: str, name: str, **kw: Any) -> Setting:
    return Setting(key, name, flag=flag_name(name), **kw)


def _speculative_number(name: str) -> Setting:
    return shared(f"stack.speculative.{name}", flag=flag_name(f"speculative_{name}"),
                  arg=lambda p: getattr(p.spec, name) if p.nextn and p.spec.num_steps is not None else None,
                  expect=lambda p: getattr(p.spec, name) if p.nextn else None)


SETTINGS: tuple[Setting, ...] = (
    _setting("model.path", "model_path", arg=lambda p: p.model_dir),
    _setting("model.served_name", "served_model_name", arg=lambda p: p.served_name),
    _setting("server.host", "host", arg=lambda p: p.recipe.server.host),
    _setting("server.port", "port", arg=lambda p: p.port),
    _setting("target", "device", arg=lambda p: {"cpu": "cpu", "auto": "auto"}.get(p.recipe.target, "cuda")),
    _setting("stack.weights", "expert_weights", arg=lambda p: p.recipe.stack.weights),
    _setting("stack.lm_head", "lm_head_dtype", arg=lambda p: p.recipe.stack.lm_head),
    _setting("stack.lm_head_exact_top_k", "lm_head_exact_top_k",
             arg=lambda p: p.recipe.stack.lm_head_exact_top_k if p.recipe.stack.lm_head == "fp8" else None),
    _setting("model.dtype", "dtype", arg=lambda p: p.recipe.model.dtype if p.recipe.model.dtype in ("bfloat16", "float32") else None),
    # The engine reports NEXTN as NEXTN (it takes EAGLE as an alias of it).
    shared("stack.speculative.method", flag=flag_name("speculative_algorithm"),
           arg=lambda p: "NEXTN" if p.nextn else None, expect=lambda p: "NEXTN" if p.nextn else None),
    *(_speculative_number(name) for name in SPECULATIVE_NUMBERS),
    shared("stack.speculative.draft_model", flag=flag_name("speculative_draft_model_path"),
           arg=lambda p: p.draft_dir if p.nextn else None),
    _setting("model.context_length", "context_length", arg=lambda p: p.recipe.model.context_length or None),
    _setting("server.enable_metrics", "enable_metrics", arg=lambda p: p.recipe.server.enable_metrics),
    # One device: no flag, and the check expects what the engine reports.
    shared("stack.tp", expect=lambda p: 1),
    shared("stack.ep", expect=lambda p: 1),
)


def server_args(planned: Planned) -> dict[str, Any]:
    """The resolved args /server_info must report for this launch."""
    return expected_args(SETTINGS, planned)
