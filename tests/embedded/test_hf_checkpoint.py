"""tiny-ling as a Hugging Face BailingMoeV2 checkpoint: the export SGLang serves, read back by the
embedded engine with the same numbers, its config read by transformers the way SGLang reads it,
and every key SGLang's own model code reads present with the value tiny-ling implements."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sparkit.errors import LaunchError, UsageError  # noqa: E402
from sparkit.models import checkpoint  # noqa: E402
from sparkit.models.checkpoint import load_checkpoint  # noqa: E402
from sparkit.models.tiny_ling import hf_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def export(tiny_model_dir, tmp_path_factory):
    destination = tmp_path_factory.mktemp("hf") / "tiny-ling-hf"
    marker = checkpoint.export_hf(tiny_model_dir, destination, "bfloat16")
    return destination, marker


def _sglang_model_source(name: str) -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "srt" / "models" / name
    return path.read_text() if path.is_file() else None


def test_the_export_has_the_files_sglang_loads(export):
    destination, marker = export
    for name in ("config.json", "model.safetensors", f"{hf_checkpoint.CONFIG_MODULE}.py", "generation_config.json",
                 "tokenizer.json", "tokenizer_config.json", checkpoint.EXPORT_MARKER):
        assert (destination / name).is_file(), name
    config = json.loads((destination / "config.json").read_text())
    assert config["architectures"] == ["BailingMoeV2ForCausalLM"] and config["torch_dtype"] == "bfloat16"
    assert config["auto_map"]["AutoConfig"] == f"{hf_checkpoint.CONFIG_MODULE}.BailingMoeV2Config"
    generation = json.loads((destination / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"] == 257
    assert marker["dtype"] == "bfloat16" and marker["source"]["seed"] == 0


def test_the_weights_have_bailing_names_and_the_nextn_layer_after_the_last(export, tiny_model_dir):
    from safetensors.torch import load_file

    destination, _ = export
    names = set(load_file(str(destination / "model.safetensors")))
    layers = json.loads((destination / "config.json").read_text())["num_hidden_layers"]
    nextn = f"model.layers.{layers}."
    assert {"model.word_embeddings.weight", "model.norm.weight", "lm_head.weight"} <= names
    for suffix in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight",
                   "attention.query_key_value.weight", "mlp.experts.7.down_proj.weight", "mlp.shared_experts.up_proj.weight"):
        assert nextn + suffix in names, suffix
    pattern = re.compile(r"^model\.layers\.\d+\.(input_layernorm|post_attention_layernorm|attention\.(query_key_value|dense)"
                         r"|mlp\.gate|mlp\.experts\.\d+\.(gate|up|down)_proj|mlp\.shared_experts\.(gate|up|down)_proj"
                         r"|enorm|hnorm|eh_proj|final_layernorm)\.weight$")
    odd = sorted(n for n in names if n.startswith("model.layers.") and not pattern.match(n))
    assert odd == []


def test_the_embedded_engine_reads_the_export_back_with_the_same_numbers(export, tiny_model_dir):
    destination, _ = export
    _, native = load_checkpoint(tiny_model_dir)
    cfg, from_hf = load_checkpoint(destination)
    assert cfg.num_experts == native.config.num_experts and cfg.eos_token_id == native.config.eos_token_id
    native_state, hf_state = native.state_dict(), from_hf.state_dict()
    assert native_state.keys() == hf_state.keys()
    # the shipped weights are bf16, so a bf16 export is exact
    assert all(torch.equal(native_state[k], hf_state[k]) for k in native_state)
    ids = torch.tensor([[256, 72, 101, 108, 108, 111]])
    with torch.inference_mode():
        assert torch.equal(native.logits(native.forward_hidden(ids)), from_hf.logits(from_hf.forward_hidden(ids)))


@pytest.mark.slow
def test_a_server_serves_the_export(export, start_embedded_server):
    import httpx

    destination, _ = export
    server = start_embedded_server(model_path=destination, speculative_algorithm="NEXTN", speculative_num_steps=3,
                                   speculative_eagle_topk=1, speculative_num_draft_tokens=4, lm_head_dtype="fp8")
    body = httpx.post(server.url + "/generate", timeout=60, json={
        "text": "count: one two three", "sampling_params": {"temperature": 0, "max_new_tokens": 12}}).json()
    assert body["meta_info"]["completion_tokens"] > 0 and body["meta_info"]["spec_verify_ct"] > 0
    info = httpx.get(server.url + "/model_info", timeout=30).json()
    assert info["architectures"] == ["BailingMoeV2ForCausalLM"]


def test_transformers_reads_the_config_with_every_key_sglang_bailing_code_reads(export):
    """AutoConfig through the export's own configuration class (as SGLang does with
    --trust-remote-code); every `config.X` the installed sglang's bailing_moe.py and
    bailing_moe_nextn.py read must be there, at the value tiny-ling implements."""
    from transformers import AutoConfig

    destination, _ = export
    config = AutoConfig.from_pretrained(str(destination), trust_remote_code=True)
    assert type(config).__name__ == "BailingMoeV2Config"
    for key, want in (("use_qk_norm", False), ("first_k_dense_replace", 0), ("norm_topk_prob", True),
                      ("moe_router_enable_expert_bias", False), ("routed_scaling_factor", 1.0), ("num_shared_experts", 1),
                      ("n_group", 0), ("topk_group", 0), ("router_dtype", "fp32"), ("num_nextn_predict_layers", 1)):
        assert getattr(config, key) == want, key
    assert config.rope_parameters["rope_theta"] == 10000.0 and not hasattr(config, "partial_rotary_factor")
    sources = [s for s in (_sglang_model_source("bailing_moe.py"), _sglang_model_source("bailing_moe_nextn.py")) if s]
    if not sources:
        pytest.skip("sglang is not installed: its model code cannot be read")
    read = set()
    for source in sources:
        read |= set(re.findall(r"\bconfig\.([a-z_][a-z0-9_]*)\b", source))
    # Set by sglang itself (for_nextn_model, attention_type), read only for the hybrid V2.5/V3
    # layouts (use_kda), or read through hasattr() where absence means full-width RoPE.
    not_ours = {"for_nextn_model", "attention_type", "use_kda", "partial_rotary_factor", "rotary_dim"}
    missing = sorted(k for k in read - not_ours if not hasattr(config, k))
    assert missing == [], f"sglang's Bailing code reads config keys the export lacks: {missing}"


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("use_qk_norm", True, "use_qk_norm=True"),
        ("score_function", "sigmoid", "score_function='sigmoid'"),
        ("first_k_dense_replace", 1, "first_k_dense_replace=1"),
        ("num_key_value_heads", 1, "num_key_value_heads=1"),
        ("partial_rotary_factor", 0.5, "partial_rotary_factor=0.5"),
        ("n_group", 2, "n_group=2"),
    ],
)
def test_a_bailing_config_tiny_ling_does_not_implement_is_refused_naming_the_key(export, tmp_path, key, value, words):
    import shutil

    destination, _ = export
    copy = tmp_path / "changed"
    shutil.copytree(destination, copy)
    config = json.loads((copy / "config.json").read_text())
    config[key] = value
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(LaunchError, match=re.escape(words)):
        load_checkpoint(copy)


def test_export_refuses_a_directory_that_is_not_an_export_and_reexports_one(export, tiny_model_dir, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(UsageError, match="not a sparkit export"):
        checkpoint.export_hf(tiny_model_dir, mine)
    assert (mine / "notes.txt").read_text() == "keep"
    again = tmp_path / "again"
    checkpoint.export_hf(tiny_model_dir, again, "float32")
    checkpoint.export_hf(tiny_model_dir, again, "bfloat16")  # over a previous export: fine
    assert checkpoint.is_export(again, dtype="bfloat16") and not checkpoint.is_export(again, dtype="float32")
    with pytest.raises(UsageError, match="is the source checkpoint"):
        checkpoint.export_hf(tiny_model_dir, tiny_model_dir)


def test_export_hf_cli_writes_the_default_export_and_reports_json(sparkit_home):
    from typer.testing import CliRunner

    from sparkit.cli.main import app

    result = CliRunner().invoke(app, ["model", "export-hf", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert Path(data["path"]) == sparkit_home / "cache" / "models" / "tiny-ling-s0-hf-bfloat16"
    assert data["architecture"] == "BailingMoeV2ForCausalLM" and checkpoint.is_export(data["path"])
