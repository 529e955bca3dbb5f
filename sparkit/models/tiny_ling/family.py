"""tiny-ling's build: what sparkit.models.builder needs to make, train and gate it."""

from __future__ import annotations

from pathlib import Path

from sparkit.models.families import ModelFamily, QualityGate, Training
from sparkit.models.formats import ARCHITECTURES

# Bump when the model code, the corpus, the tokenizer or the training procedure changes what a
# spec builds (tests/embedded/test_builder.py fails when the shipped checkpoint was not rebuilt).
BUILDER_VERSION = 5
DEFAULT_TRAIN_STEPS = 2000
# Training windows: tiny-ling learns contexts of this many tokens and degrades well past them.
TRAIN_SEQ_LEN = 128
SHIPPED_DIR = Path(__file__).resolve().parent / "checkpoints"
DEFAULT_GATE = QualityGate()


def _new_model(config: dict | None, tokenizer):
    from sparkit.models.tiny_ling.model import TinyLingConfig, TinyLingForCausalLM

    cfg = TinyLingConfig.from_dict(config) if config else TinyLingConfig()
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    return TinyLingForCausalLM(cfg)


def _config_from_dict(raw: dict):
    from sparkit.models.tiny_ling.model import TinyLingConfig

    return TinyLingConfig.from_dict(raw)


def _model_of_config(cfg):
    from sparkit.models.tiny_ling.model import TinyLingForCausalLM

    return TinyLingForCausalLM(cfg)


def _training_loss(model, batch):
    from sparkit.models.tiny_ling.model import training_loss

    return training_loss(model, batch)


def _hf_format():
    from sparkit.models.tiny_ling import hf_checkpoint

    return hf_checkpoint


FAMILY = ModelFamily(
    name="tiny-ling", builder_version=BUILDER_VERSION, default_steps=DEFAULT_TRAIN_STEPS, shipped_dir=SHIPPED_DIR,
    model_class=ARCHITECTURES["tiny-ling"][0], hf_architecture=ARCHITECTURES["tiny-ling"][1], gate=DEFAULT_GATE,
    training=Training(batch_size=16, seq_len=TRAIN_SEQ_LEN, peak_lr=3e-3, warmup=20),
    new_model=_new_model, config_from_dict=_config_from_dict, training_loss=_training_loss, after_step=None,
    hf_format=_hf_format, new_model_of_config=_model_of_config,
)
