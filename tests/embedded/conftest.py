"""Fixtures of the engine-core tests: an untrained tiny-ling checkpoint (random weights; greedy
speculative equality must hold for any weights) and engine factories with few torch threads."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session", autouse=True)
def _few_torch_threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI machine is small and shared
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="session")
def untrained_model_dir(tmp_path_factory):
    from sparkit.models.checkpoint import MARKER, save_checkpoint
    from sparkit.models.tiny_ling.family import BUILDER_VERSION
    from sparkit.models.tiny_ling.model import TinyLingConfig, TinyLingForCausalLM
    from sparkit.models.tiny_ling.tokenizer import save_tokenizer

    directory = tmp_path_factory.mktemp("tiny-untrained")
    torch.manual_seed(1234)
    model = TinyLingForCausalLM(TinyLingConfig(max_position_embeddings=512))
    save_checkpoint(model, directory)
    save_tokenizer(directory)
    (directory / MARKER).write_text(json.dumps({"builder_version": BUILDER_VERSION, "seed": 1234}))
    return directory


@pytest.fixture
def make_engine():
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    def make(model_path, **kwargs):
        return EmbeddedEngine(EngineConfig(model_path=str(model_path), **kwargs))

    return make
