"""One declaration of Ling-3.0-flash (sparkit/roofline/profiles.py, LING3_FLASH_SHAPES): every value
says what settles it and equals the published configuration class's default (transformers'
BailingHybridConfig, documented for inclusionAI/Ling-3.0-Flash); scripts/make_sparse_ling.py and the
Ling-width configs served on the H200 derive from it; its tensor inventory equals the one written
independently in tests/_checkpoints.py."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys

import pytest

from sparkit.checkpoint_headers import read_safetensors_index
from sparkit.roofline.layout import layout_from_checkpoint
from sparkit.roofline.profiles import (
    LING3_FLASH_CONFIG,
    LING3_FLASH_SHAPES,
    config_only_tensors,
    ling3_flash_config,
    ling3_flash_tensors,
)

from _checkpoints import ling3_flash_fp4_tensors
from _shared import REPO_DIR


def _generator():
    spec = importlib.util.spec_from_file_location("make_sparse_ling", REPO_DIR / "scripts" / "make_sparse_ling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_value_says_what_settles_it():
    for key, (value, source) in LING3_FLASH_SHAPES.items():
        assert LING3_FLASH_CONFIG[key] == value
        assert len(source) > 20, key
    for key in ("intermediate_size", "q_lora_rank"):  # the two the generator once got wrong
        assert "only" in LING3_FLASH_SHAPES[key][1]
    assert LING3_FLASH_CONFIG["intermediate_size"] == 6144 and LING3_FLASH_CONFIG["q_lora_rank"] is None


def test_the_declaration_is_the_published_config_class_s_defaults():
    transformers = pytest.importorskip("transformers.models.bailing_hybrid.configuration_bailing_hybrid")
    import inspect

    config_class = transformers.BailingHybridConfig
    # its defaults are documented as the checkpoint's
    assert '@auto_docstring(checkpoint="inclusionAI/Ling-3.0-Flash")' in inspect.getsource(transformers)
    defaults = {f.name: f.default for f in dataclasses.fields(config_class)}
    names = {"num_nextn_predict_layers": "num_mtp_layers"}
    for key, (value, _source) in LING3_FLASH_SHAPES.items():
        theirs = names.get(key, key)
        if theirs in defaults and key not in ("n_group", "num_shared_experts"):
            assert defaults[theirs] == value, key
    assert defaults["n_shared_experts"] == LING3_FLASH_CONFIG["num_shared_experts"]
    assert defaults["num_local_experts"] == LING3_FLASH_CONFIG["num_experts"]


@pytest.mark.slow
def test_the_sparse_generator_derives_from_the_declaration(tmp_path):
    gen = _generator()
    for weights in ("bf16", "fp8", "mxfp4"):
        cfg = gen.config(weights)
        assert {k: cfg[k] for k in LING3_FLASH_SHAPES} == {k: v for k, (v, _) in LING3_FLASH_SHAPES.items()}
    directory = gen.write_checkpoint(tmp_path / "fp4", "fp4")
    on_disk = read_safetensors_index(directory).tensors
    declared = ling3_flash_tensors("mxfp4")
    assert {n: (t.dtype, t.shape) for n, t in on_disk.items()} == {n: (d, tuple(s)) for n, (d, s) in declared.items()}
    assert sum(t.stat().st_blocks for t in directory.glob("*.safetensors")) * 512 < 64 << 20  # holes, not weights
    # the inventory tests/_checkpoints.py spells out by hand, minus the NextN layer's copy of the head
    # (shared_head.head, which SGLang's loader skips and the declaration leaves out)
    independent = {n: (d, tuple(s)) for n, (d, s) in ling3_flash_fp4_tensors().items() if "shared_head" not in n}
    assert {n: (d, tuple(s)) for n, (d, s) in declared.items()} == independent


@pytest.mark.parametrize("layers, mla, kda, moe", [(6, 1, 5, 4), (12, 2, 10, 10), (42, 7, 35, 40)])
def test_ling_width_layer_counts(tmp_path, layers, mla, kda, moe):
    """6 and 12 layers: the first two dense, every 6th MLA; 12 - 6 is one more of Ling's 6-layer
    groups (1 MLA + 5 KDA + 6 MoE), the composition 42 layers have six of after the first group."""
    cfg = ling3_flash_config("bf16", layers)
    tensors, why = config_only_tensors(cfg)
    names = list(tensors)
    target = [i for i in range(layers)]
    mla_layers = [i for i in target if f"model.layers.{i}.attention.kv_b_proj.weight" in tensors]
    kda_layers = [i for i in target if f"model.layers.{i}.attention.f_proj.weight" in tensors]
    moe_layers = [i for i in target if f"model.layers.{i}.mlp.gate.weight" in tensors]
    assert (len(mla_layers), len(kda_layers), len(moe_layers)) == (mla, kda, moe)
    assert f"model.layers.{layers}.eh_proj.weight" in names  # the NextN layer after the body
    assert f"{layers} layers" in why and "bf16" in why


def test_a_ling_width_checkpoint_serves_the_kit_s_tokenizer_padded(tmp_path):
    """`make_sparse_ling.py DIR --layers 6 --tokenizer-from TOK`: the tokenizer copied and padded to
    157184 ids, its token ids and remote-code loader kept; the headers' layout read back."""
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}},
                                                    "added_tokens": [{"id": 2, "content": "<|im_end|>"}]}))
    (tok / "config.json").write_text(json.dumps({"eos_token_id": 2, "pad_token_id": 2, "auto_map": {"AutoConfig": "x.Y"},
                                                 "hidden_size": 256}))
    (tok / "configuration_bailing_hybrid.py").write_text("# remote code\n")
    out = tmp_path / "ling6"
    done = subprocess.run([sys.executable, str(REPO_DIR / "scripts" / "make_sparse_ling.py"), str(out), "--weights", "bf16",
                           "--layers", "6", "--tokenizer-from", str(tok), "--json"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 6 and cfg["hidden_size"] == 2560 and cfg["eos_token_id"] == 2
    assert cfg["auto_map"] == {"AutoConfig": "x.Y"} and (out / "configuration_bailing_hybrid.py").is_file()
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) + 1 == 157184 and vocab["<x157183>"] == 157183
    layout = layout_from_checkpoint(out)
    assert len(layout.target_layers) == 6 and info["layers"] == 6 and info["bytes"] > 30 * 2**30
    bad = subprocess.run([sys.executable, str(REPO_DIR / "scripts" / "make_sparse_ling.py"), str(tmp_path / "x"),
                          "--weights", "int4"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--weights 'int4'" in bad.stderr + bad.stdout
