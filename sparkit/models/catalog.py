"""The built-in model families sparkit ships (sparkit.models.families.ModelFamily), by name and by
the architectures their checkpoints' config.json carry."""

from __future__ import annotations

from sparkit.errors import UsageError
from sparkit.models.families import ModelFamily
from sparkit.models.tiny_ling.family import FAMILY as TINY_LING
from sparkit.models.tiny_ling_v3.family import FAMILY as TINY_LING_V3

FAMILIES: dict[str, ModelFamily] = {f.name: f for f in (TINY_LING, TINY_LING_V3)}
BUILTIN_MODELS = tuple(FAMILIES)
# The built-in DSpark block drafts (sparkit.models.dspark: one builder of their own, not a family's) and
# the built-in model each drafts for.
BUILTIN_DRAFTS: dict[str, str] = {"tiny-ling-dspark": "tiny-ling", "tiny-ling-v3-dspark": "tiny-ling-v3"}


def family(name: str) -> ModelFamily:
    if name not in FAMILIES:
        raise UsageError(f"unknown built-in model {name!r}", hint=f"available: {', '.join(BUILTIN_MODELS)}")
    return FAMILIES[name]


def family_of_architectures(architectures) -> tuple[ModelFamily, bool] | None:
    """(the family, whether it is the HF export) of a config.json's architectures; None if none."""
    names = set(architectures or [])
    for fam in FAMILIES.values():
        if fam.model_class in names:
            return fam, False
        if fam.hf_architecture in names:
            return fam, True
    return None
