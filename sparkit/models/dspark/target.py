"""The target a DSpark draft is built against, as the builder and the engine need it: its shared
modules (embedding, lm_head), its captured layer outputs and its own greedy continuation.

A target is named by the builder (`TARGETS`): tiny-ling, and tiny-ling-v3 (the Ling-3.0-shaped
BailingMoeV3: KDA x3 + gated MLA). Both models' `forward_hidden(ids, cache, start, capture)` return
the residual stream after the chosen layers as BailingMoeV3's `set_dspark_layers_to_capture` hands
it to a DSpark draft, so one `DSparkTarget` serves both; each has its own draft configuration.
Nothing else in the draft's package knows which target it drafts for.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from sparkit.models.dspark.config import DSparkConfig


class DSparkTarget(Protocol):
    """What the builder reads from a target (batch 1 for generation, a batch for features)."""

    name: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    vocab_limit: int  # ids at or past it are never produced (the tokenizer's size)
    embed_tokens: nn.Module
    lm_head: nn.Module

    def features(self, input_ids: torch.Tensor, layer_ids: tuple[int, ...]) -> torch.Tensor:
        """input_ids [B, T] -> the residual stream after each of `layer_ids`, concatenated [B, T, K*H]."""
        ...

    def greedy(self, prompt: list[int], new_tokens: int) -> list[int]:
        """The target's own greedy continuation of `prompt` (`new_tokens` tokens, EOS ignored)."""
        ...


class TinyLingTarget:
    """A built-in model (tiny-ling, tiny-ling-v3: the same forward_hidden / new_cache / logits and the
    same tokenizer) as a DSpark target."""

    def __init__(self, model, vocab_limit: int, name: str = "tiny-ling"):
        self.model, self.name = model, name
        cfg = model.config
        self.hidden_size, self.vocab_size, self.num_layers = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
        self.vocab_limit = vocab_limit
        self.embed_tokens, self.lm_head = model.embed_tokens, model.lm_head

    def features(self, input_ids, layer_ids):
        with torch.no_grad():
            return self.model.forward_hidden(input_ids, capture=tuple(layer_ids))[1]

    def greedy(self, prompt, new_tokens):
        model = self.model
        with torch.inference_mode():
            cache = model.new_cache(len(prompt) + new_tokens + 1)
            hidden = model.forward_hidden(torch.tensor([prompt]), cache, 0)
            cache.length = len(prompt)
            out: list[int] = []
            for _ in range(new_tokens):
                token = int(model.logits(hidden[0, -1])[: self.vocab_limit].argmax())
                out.append(token)
                hidden = model.forward_hidden(torch.tensor([[token]]), cache, cache.length)
                cache.length += 1
        return out


def load_tiny_ling(directory: str | Path, name: str = "tiny-ling") -> TinyLingTarget:
    """A tiny-ling or tiny-ling-v3 checkpoint (load_checkpoint picks the family by its config.json)."""
    from sparkit.models.checkpoint import load_checkpoint
    from sparkit.models.tiny_ling.tokenizer import load_tokenizer

    _, model = load_checkpoint(directory)
    model.prepare_inference()
    return TinyLingTarget(model, min(len(load_tokenizer(directory)), model.config.vocab_size), name)


def load_tiny_ling_v3(directory: str | Path) -> TinyLingTarget:
    return load_tiny_ling(directory, "tiny-ling-v3")


def tiny_ling_prompts(directory: str | Path, count: int, seed: int) -> list[list[int]]:
    """Prompts from tiny-ling's corpus distribution (chat turns and text openings)."""
    from sparkit.models.tiny_ling.corpus import prompt_ids, sample_prompts
    from sparkit.models.tiny_ling.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(directory)
    return [prompt_ids(tokenizer, p) for p in sample_prompts(count, seed=seed)]


def tiny_ling_draft_config(directory: str | Path) -> DSparkConfig:
    """The draft sparkit builds for tiny-ling (4 layers of width 128, vocabulary 264)."""
    from sparkit.models.tiny_ling.model import TinyLingConfig

    return _draft_config_of(TinyLingConfig.load(Path(directory)))


def tiny_ling_v3_draft_config(directory: str | Path) -> DSparkConfig:
    """The draft sparkit builds for tiny-ling-v3: the widths of its config.json (4 layers of width
    128, vocabulary 264, rope theta 600000). Its capture points are tiny-ling's rule, layers 1 and 3:
    BailingMoeV3's set_dspark_layers_to_capture takes the draft's target_layer_ids verbatim and
    captures after layer i (no +1; the last layer's stream before the final norm), and SGLang's
    DFlash default for 4 target layers (dflash_utils.build_target_layer_ids: [1, 1]) would hand the
    draft one layer twice."""
    from sparkit.models.tiny_ling_v3.model import TinyLingV3Config

    raw = json.loads((Path(directory) / "config.json").read_text())
    return _draft_config_of(TinyLingV3Config.from_dict(raw))


def _draft_config_of(cfg) -> DSparkConfig:
    """The draft of a target's config: its widths and special tokens, its capture points (the
    middle layer's stream and the last one's)."""
    return DSparkConfig(hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
                        num_target_layers=cfg.num_hidden_layers,
                        target_layer_ids=[cfg.num_hidden_layers // 2 - 1, cfg.num_hidden_layers - 1],
                        mask_token_id=cfg.vocab_size - 1,  # a padding row of the head: no token uses it
                        max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta,
                        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id)


@dataclass(frozen=True)
class TargetKind:
    """How the builder gets one target: its checkpoint, the target itself, prompts from its
    corpus, the draft configuration built for it."""

    checkpoint: Callable[[], Path]
    load: Callable[[Path], DSparkTarget]
    prompts: Callable[[Path, int, int], list[list[int]]]
    draft_config: Callable[[Path], DSparkConfig]


def _shipped_tiny_ling() -> Path:
    from sparkit.models.builder import builtin_model_dir

    return builtin_model_dir("tiny-ling")


def _shipped_tiny_ling_v3() -> Path:
    from sparkit.models.builder import builtin_model_dir

    return builtin_model_dir("tiny-ling-v3")


TARGETS: dict[str, TargetKind] = {
    "tiny-ling": TargetKind(_shipped_tiny_ling, load_tiny_ling, tiny_ling_prompts, tiny_ling_draft_config),
    # the same corpus and tokenizer as tiny-ling's (sparkit.models.tiny_ling_v3.family)
    "tiny-ling-v3": TargetKind(_shipped_tiny_ling_v3, load_tiny_ling_v3, tiny_ling_prompts, tiny_ling_v3_draft_config),
}
