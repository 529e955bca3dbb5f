"""Builder and tokenizer: AutoTokenizer round-trip and chat template, build reuse, atomic builds,
and clear errors for corrupt checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")

from sparkit.engines.embedded import builder  # noqa: E402
from sparkit.errors import LaunchError, UsageError  # noqa: E402


@pytest.fixture(scope="module")
def quick_build(tmp_path_factory):
    """A real (very briefly trained) build made through ensure_model."""
    directory = tmp_path_factory.mktemp("quick") / "tiny"
    messages = []
    path = builder.ensure_model(directory=directory, seed=3, train_seconds=0.5, progress=lambda f, m: messages.append((f, m)))
    return path, messages


def test_autotokenizer_loads_the_build_and_round_trips_any_utf8(quick_build):
    from transformers import AutoTokenizer

    path, _ = quick_build
    tok = AutoTokenizer.from_pretrained(str(path))
    for text in ["hello world", "  spaces\tand\nnewlines ", "héllo wörld", "你好，世界", "emoji 🎉🚀", "\x00\x7f", "<|eos|> literally"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    assert tok.convert_ids_to_tokens(tok.eos_token_id) == "<|eos|>"
    assert tok.convert_ids_to_tokens(tok.bos_token_id) == "<|bos|>"


def test_chat_template_renders_turns_and_the_generation_prompt(quick_build):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(quick_build[0]))
    text = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|bos|><|system|>Be brief.<|eos|><|user|>Hi<|eos|><|assistant|>"
    assert "chat_template" in json.loads((quick_build[0] / "tokenizer_config.json").read_text())


def test_build_has_the_documented_files_and_config(quick_build):
    path, messages = quick_build
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", builder.MARKER):
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["TinyLingForCausalLM"]
    assert config["num_experts"] == 8 and config["top_k"] == 2 and config["num_nextn_predict_layers"] == 1
    assert messages[0][0] == 0.0 and messages[-1][0] == 1.0
    fractions = [f for f, _ in messages]
    assert fractions == sorted(fractions)
    assert not list(path.parent.glob(".*building*"))  # no temporary directory left behind


def test_an_existing_complete_build_is_reused(quick_build):
    path, _ = quick_build
    before = (path / "model.safetensors").stat().st_mtime_ns
    messages = []
    again = builder.ensure_model(directory=path, seed=3, train_seconds=0.5, progress=lambda f, m: messages.append(m))
    assert again == path
    assert (path / "model.safetensors").stat().st_mtime_ns == before
    assert messages == [f"using existing build at {path}"]


def test_an_outdated_build_is_rebuilt(quick_build, tmp_path):
    path = tmp_path / "old"
    shutil.copytree(quick_build[0], path)
    (path / builder.MARKER).write_text(json.dumps({"builder_version": builder.BUILDER_VERSION - 1}))
    assert not builder.is_complete(path)
    builder.ensure_model(directory=path, seed=3, train_seconds=0.2)
    assert builder.is_complete(path)


def test_default_location_is_the_user_cache(sparkit_home):
    assert builder.builtin_model_dir("tiny-ling", 2) == sparkit_home / "cache" / "models" / "tiny-ling-s2"
    with pytest.raises(UsageError, match="unknown built-in model"):
        builder.builtin_model_dir("huge-ling", 0)


def test_refuses_to_overwrite_a_directory_that_is_not_a_build(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a tiny-ling build"):
        builder.ensure_model(directory=tmp_path, train_seconds=0.2)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_truncated_checkpoint_fails_with_a_message_naming_the_file(quick_build, tmp_path):
    from sparkit.engines.embedded.engine import EmbeddedEngine, EngineConfig

    path = tmp_path / "corrupt"
    shutil.copytree(quick_build[0], path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(LaunchError, match="model.safetensors") as info:
        EmbeddedEngine(EngineConfig(model_path=str(path)))
    assert str(weights) in str(info.value)


def test_garbage_config_and_missing_directory_fail_clearly(quick_build, tmp_path):
    path = tmp_path / "badconfig"
    shutil.copytree(quick_build[0], path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(LaunchError, match="config.json"):
        builder.load_checkpoint(path)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(LaunchError, match="TinyLingForCausalLM"):
        builder.load_checkpoint(path)
    with pytest.raises(LaunchError, match="does not exist"):
        builder.load_checkpoint(tmp_path / "nowhere")


def test_weights_that_do_not_match_the_config_are_named(quick_build, tmp_path):
    path = tmp_path / "mismatch"
    shutil.copytree(quick_build[0], path)
    config = json.loads((path / "config.json").read_text())
    config["num_experts"] = 4
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LaunchError, match="does not match"):
        builder.load_checkpoint(path)


def test_make_tiny_cli_builds_and_reports_json(tmp_path):
    from typer.testing import CliRunner

    from sparkit.cli.main import app

    target = tmp_path / "cli-tiny"
    result = CliRunner().invoke(app, ["model", "make-tiny", str(target), "--seed", "5", "--train-seconds", "1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["path"] == str(target) and data["seed"] == 5 and data["builder_version"] == builder.BUILDER_VERSION
    assert builder.is_complete(target)


def test_same_seed_and_steps_give_identical_weights_and_another_seed_does_not(tmp_path):
    from safetensors.torch import load_file

    from sparkit.engines.embedded.corpus import documents

    docs_a, docs_b = documents(seed=0), documents(seed=0)
    assert [next(docs_a) for _ in range(50)] == [next(docs_b) for _ in range(50)]
    stats = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        (tmp_path / name).mkdir()
        stats.append(builder.build_model(tmp_path / name, seed=seed, train_seconds=600, max_steps=2))
    assert [s["train_steps"] for s in stats] == [2, 2, 2]
    a, b, c = (load_file(str(tmp_path / n / "model.safetensors")) for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embed_tokens.weight"], c["embed_tokens.weight"])
