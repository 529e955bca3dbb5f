"""tiny-ling-v3's build: what sparkit.models.builder needs to make, train and gate it."""

from __future__ import annotations

from pathlib import Path

from sparkit.models.families import ModelFamily, QualityGate, Training
from sparkit.models.formats import ARCHITECTURES

# Bump when the model code, the corpus, the tokenizer or the training changes what a spec builds.
BUILDER_VERSION = 2  # 2: MLA latent 512 + rope 64 (was 128 + 128)
DEFAULT_TRAIN_STEPS = 3000
TRAIN_SEQ_LEN = 128
SHIPPED_DIR = Path(__file__).resolve().parent / "checkpoints"
# tiny-ling's gate: the same corpus, the same held-out text, the same greetings
DEFAULT_GATE = QualityGate()


def _new_model(config: dict | None, tokenizer):
    from sparkit.models.tiny_ling_v3.model import TinyLingV3Config, TinyLingV3ForCausalLM

    cfg = TinyLingV3Config.from_dict(config) if config else TinyLingV3Config()
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    return TinyLingV3ForCausalLM(cfg)


def _config_from_dict(raw: dict):
    from sparkit.models.tiny_ling_v3.model import TinyLingV3Config

    return TinyLingV3Config.from_dict(raw)


def _model_of_config(cfg):
    from sparkit.models.tiny_ling_v3.model import TinyLingV3ForCausalLM

    return TinyLingV3ForCausalLM(cfg)


def _training_loss(model, batch):
    from sparkit.models.tiny_ling_v3.model import training_loss

    return training_loss(model, batch)


def _after_step(model) -> None:
    from sparkit.models.tiny_ling_v3.model import after_step

    after_step(model)


def _hf_format():
    from sparkit.models.tiny_ling_v3 import hf_checkpoint

    return hf_checkpoint


FAMILY = ModelFamily(
    name="tiny-ling-v3", builder_version=BUILDER_VERSION, default_steps=DEFAULT_TRAIN_STEPS, shipped_dir=SHIPPED_DIR,
    model_class=ARCHITECTURES["tiny-ling-v3"][0], hf_architecture=ARCHITECTURES["tiny-ling-v3"][1], gate=DEFAULT_GATE,
    # 8 sequences a step (tiny-ling: 16): a step costs twice tiny-ling's on the CPU, so the same
    # number of steps costs the same time
    training=Training(batch_size=8, seq_len=TRAIN_SEQ_LEN, peak_lr=3e-3, warmup=20),
    new_model=_new_model, config_from_dict=_config_from_dict, training_loss=_training_loss, after_step=_after_step,
    hf_format=_hf_format, new_model_of_config=_model_of_config,
)
