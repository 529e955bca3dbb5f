"""What a family of built-in models declares, for the builder (sparkit.models.builder), the
checkpoint reader and writer (sparkit.models.checkpoint) and the engines: its build (the builder
version, the default number of steps, the training shape, the quality gate), where its shipped
build lives, the architectures its checkpoints carry, and how to make, train and export one.

Torch-free: the callables import the family's modules when they run (plans read the rest)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class QualityGate:
    """What a full-length build must reach before it is cached (measured on the saved weights)."""

    max_heldout_loss: float = 0.55  # nats per token on held-out corpus documents
    min_accept_length: float = 2.2  # greedy NEXTN 3/1/4 on held-out prompts
    # every first message of the corpus's small talk, as typed ("Hello", "Hello!", "hi", ...), gets a reply
    greetings_answered: bool = True


@dataclass(frozen=True)
class Training:
    """The optimiser and data shape of a family's builds (AdamW, warm-up then cosine decay)."""

    batch_size: int = 16
    seq_len: int = 128  # the family learns contexts of this many tokens and degrades well past them
    peak_lr: float = 3e-3
    warmup: int = 20


@dataclass(frozen=True)
class ModelFamily:
    name: str  # the built-in model's name: sparkit:NAME
    builder_version: int  # bump when the model code, corpus, tokenizer or training changes what a spec builds
    default_steps: int  # the shipped build's optimiser steps (shorter builds skip the gate)
    shipped_dir: Path  # the directory holding the shipped build (NAME-s0)
    model_class: str  # config.json architectures of sparkit's own layout
    hf_architecture: str  # ... of its Hugging Face export
    gate: QualityGate
    training: Training
    # (config dict or None: the family's default, tokenizer) -> an untrained model (torch seeded by the caller)
    new_model: Callable[[dict | None, Any], Any]
    config_from_dict: Callable[[dict], Any]  # sparkit's config.json -> the family's config
    training_loss: Callable  # (model, batch [B, T+1]) -> (total, main loss, MTP loss)
    after_step: Callable[[Any], None] | None  # called after each optimiser step (e.g. the router bias update)
    # the module of its HF export, torch-free at import: HF_ARCHITECTURE, CONFIG_MODULE, CONFIG_SOURCE,
    # hf_config(cfg), config_from_hf(raw), state_dict_to_hf / state_dict_from_hf, hf_tensor_inventory(cfg,
    # weights, dtype), unquantised_linears(cfg), layout_error(cfg, weights), damage_target(cfg)
    hf_format: Callable[[], Any]
    new_model_of_config: Callable[[Any], Any]  # a config -> an untrained model (to load weights into)
