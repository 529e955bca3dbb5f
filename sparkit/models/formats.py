"""What the embedded engine loads, by name: each built-in model's own checkpoint layout and its
Hugging Face export (tiny-ling: BailingMoeV2, tiny-ling-v3: BailingMoeV3), each recognised by its
config.json architecture and sparkit's marker file.

A leaf module (no torch, no transformers): the preflight recognises a checkpoint with it before
anything heavy is imported, and the model, the loader and the exporter take their names from here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# config.json architectures: (sparkit's own layout, the Hugging Face export), per built-in model
ARCHITECTURES = {
    "tiny-ling": ("TinyLingForCausalLM", "BailingMoeV2ForCausalLM"),
    "tiny-ling-v3": ("TinyLingV3ForCausalLM", "BailingMoeV3ForCausalLM"),
}
BUILD_MARKER = ".sparkit-build.json"  # written by the builder (sparkit model make-tiny)
EXPORT_MARKER = ".sparkit-export.json"  # written by the exporter
# the formats a built-in model holds its routed experts and its lm_head in (sparkit.models.tiny_ling.quant)
EXPERT_FORMATS = ("fp32", "bf16", "fp8", "mxfp4")  # fp32: keep the trained weights as they are
LM_HEAD_DTYPES = ("fp32", "bf16", "fp8")


@dataclass(frozen=True)
class Recognised:
    """What a directory holds, as far as the embedded engine is concerned."""

    servable: bool | None  # True: a built-in model; False: a model this engine cannot serve; None: cannot tell
    what: str  # in words, for a message
    architectures: tuple[str, ...] = ()


def recognise(directory: str | Path) -> Recognised:
    """A checkpoint directory read for what it is (config.json and the markers only)."""
    directory = Path(directory)
    config_path = directory / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        return Recognised(None, f"{config_path} is unreadable ({getattr(exc, 'strerror', None) or exc})")
    if not isinstance(config, dict):
        return Recognised(None, f"{config_path} is not a JSON object")
    return recognise_config(config, built=(directory / BUILD_MARKER).is_file(),
                            exported=(directory / EXPORT_MARKER).is_file())


def recognise_config(config: dict, *, built: bool = False, exported: bool = False) -> Recognised:
    """A checkpoint read for what it is from its config.json (a local directory's, or one read
    from the hub before anything is pulled); `built`/`exported`: sparkit's marker files are there
    (a hub copy has no markers: its config's own `sparkit` key says it was exported)."""
    architectures = tuple(str(a) for a in (config.get("architectures") or []) if isinstance(a, str))
    named = ", ".join(architectures) or "none"
    for name, (own, hf) in ARCHITECTURES.items():
        if own in architectures:
            return Recognised(True, f"a {name} checkpoint{' (built by sparkit)' if built else ''}", architectures)
        if hf in architectures:
            if exported or isinstance(config.get("sparkit"), dict):
                return Recognised(True, f"{name}'s Hugging Face export (sparkit model export-hf)", architectures)
            return Recognised(None, f"a {hf} checkpoint sparkit did not export: the embedded engine computes "
                              f"this architecture but at {name}'s scale; a real Ling model belongs on SGLang", architectures)
    return Recognised(False, f"a model of architecture {named} (config.json {config.get('model_type') or 'has no model_type'})",
                      architectures)
