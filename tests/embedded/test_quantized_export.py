"""tiny-ling's quantised exports (`sparkit model export-hf --weights fp8|mxfp4`): the tensors, dtypes
and scale shapes of the published Ling -fp8 / -fp4 layouts, the quantization_config, the same
classification as sparkit's declared Ling profile, loaded back by the embedded engine with the
checkpoint's own values, written atomically and reused, refused with the tensor and width named
when a width cannot be tiled. SGLang's own loaders on the same files: tests/sglang_plugin/
test_quantized_export_in_sglang.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sparkit.checkpoint_headers import read_safetensors_index  # noqa: E402
from sparkit.errors import DataError, LaunchError, UsageError  # noqa: E402
from sparkit.models import checkpoint  # noqa: E402
from sparkit.models.tiny_ling import hf_checkpoint  # noqa: E402


def _headers(directory: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {t.name: (t.dtype, t.shape) for t in read_safetensors_index(directory).tensors.values()}


def _config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


# ------------------------------------------------------------------ headers, dtypes, scales, config


def test_the_fp8_export_is_block_128_fp8_with_float32_scales_and_the_rest_bf16(quantized_exports):
    h = _headers(quantized_exports["fp8"])
    c = _config(quantized_exports["fp8"])
    H, I, S, V = c["hidden_size"], c["moe_intermediate_size"], c["moe_shared_expert_intermediate_size"], c["vocab_size"]  # noqa: E741 (the shape names)
    assert (H, I, S) == (128, 128, 128)
    nextn = f"model.layers.{c['num_hidden_layers']}"
    for p in ("model.layers.0", "model.layers.3", nextn):
        assert h[f"{p}.attention.query_key_value.weight"] == ("F8_E4M3", (384, 128))
        assert h[f"{p}.attention.query_key_value.weight_scale_inv"] == ("F32", (3, 1))  # [ceil(N/128), ceil(K/128)]
        assert h[f"{p}.attention.dense.weight_scale_inv"] == ("F32", (1, 1))
        assert h[f"{p}.mlp.experts.7.gate_proj.weight"] == ("F8_E4M3", (I, H))
        assert h[f"{p}.mlp.experts.7.down_proj.weight_scale_inv"] == ("F32", (1, 1))
        assert h[f"{p}.mlp.shared_experts.up_proj.weight"] == ("F8_E4M3", (S, H))
        assert h[f"{p}.mlp.gate.weight"] == ("BF16", (8, H))  # the router: unquantised
        assert h[f"{p}.input_layernorm.weight"] == ("BF16", (H,))
    assert h[f"{nextn}.eh_proj.weight"] == ("F8_E4M3", (H, 2 * H)) and h[f"{nextn}.eh_proj.weight_scale_inv"] == ("F32", (1, 2))
    assert h["model.word_embeddings.weight"] == h["lm_head.weight"] == ("BF16", (V, H))
    assert h["model.norm.weight"] == ("BF16", (H,))
    assert {dtype for dtype, _ in h.values()} == {"F8_E4M3", "F32", "BF16"}
    assert c["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                        "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}


def test_the_mxfp4_export_packs_routed_experts_two_per_byte_with_an_e8m0_scale_per_32(quantized_exports):
    h = _headers(quantized_exports["mxfp4"])
    c = _config(quantized_exports["mxfp4"])
    H, I = c["hidden_size"], c["moe_intermediate_size"]  # noqa: E741 (the shape names)
    for p in ("model.layers.0", f"model.layers.{c['num_hidden_layers']}"):
        for e in (0, 7):
            assert h[f"{p}.mlp.experts.{e}.gate_proj.weight"] == ("U8", (I, H // 2))
            assert h[f"{p}.mlp.experts.{e}.gate_proj.weight_scale_inv"] == ("F8_E8M0", (I, H // 32))
            assert h[f"{p}.mlp.experts.{e}.down_proj.weight"] == ("U8", (H, I // 2))
            assert h[f"{p}.mlp.experts.{e}.down_proj.weight_scale_inv"] == ("F8_E8M0", (H, I // 32))
        # everything else linear is block FP8, as in the published -fp4
        assert h[f"{p}.attention.query_key_value.weight"] == ("F8_E4M3", (384, 128))
        assert h[f"{p}.mlp.shared_experts.down_proj.weight_scale_inv"] == ("F32", (1, 1))
        assert h[f"{p}.mlp.gate.weight"][0] == "BF16"
    assert h["lm_head.weight"][0] == h["model.word_embeddings.weight"][0] == "BF16"
    q = c["quantization_config"]
    assert q["routed_experts_quant_method"] == "mxfp4" and q["routed_experts_group_size"] == 32
    assert q["quant_method"] == "fp8" and q["weight_block_size"] == [128, 128]


@pytest.mark.parametrize("label", ["bf16", "fp8", "mxfp4", "fp8-damaged"])
def test_every_export_holds_exactly_the_declared_tensor_inventory(quantized_exports, label):
    """hf_tensor_inventory is what plans and the loader read before the files exist."""
    from sparkit.models.tiny_ling.model import TinyLingConfig

    directory = quantized_exports[label]
    cfg = hf_checkpoint.config_from_hf(_config(directory))
    assert isinstance(cfg, TinyLingConfig)
    weights = label.removesuffix("-damaged")
    assert _headers(directory) == hf_checkpoint.hf_tensor_inventory(cfg, weights)
    marker = json.loads((directory / checkpoint.EXPORT_MARKER).read_text())
    assert marker["weights"] == weights and marker["export_version"] == checkpoint.EXPORT_VERSION
    assert bool(marker["damaged_scale"]) == label.endswith("-damaged")


def test_transformers_reads_the_quantization_config_through_the_exports_own_class(quantized_exports):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(quantized_exports["mxfp4"]), trust_remote_code=True)
    assert type(config).__name__ == "BailingMoeV2Config"
    quant = config.quantization_config if isinstance(config.quantization_config, dict) else config.quantization_config.to_dict()
    assert quant["routed_experts_quant_method"] == "mxfp4" and quant["weight_block_size"] == [128, 128]


# ------------------------------------------------------------------ the declared Ling profile's classification


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["bf16", "fp8", "mxfp4"])
def test_each_export_is_classified_like_the_declared_ling_profile_of_its_variant(quantized_exports, weights):
    """sparkit.checkpoint_headers + sparkit.roofline.layout read the export's headers into roles; each role
    tiny-ling has must be stored the way the declared Ling-3.0-flash profile of the same variant
    stores it (unquantised / fp8 / mxfp4)."""
    from sparkit.roofline.layout import layout_from_checkpoint
    from sparkit.roofline.profiles import PROFILES, declared_layout
    from sparkit.weight_formats import format_of_dtypes

    def formats(layout) -> dict[str, str]:
        out = {}
        for layer in layout.layers:
            for role, w in layer.weights.items():
                out.setdefault(role, set()).add(format_of_dtypes(w.dtypes))
            if layer.experts:
                out.setdefault("routed_experts", set()).add(format_of_dtypes(layer.experts.per_expert.dtypes))
        for role in ("embedding", "lm_head", "final_norm"):
            out[role] = {format_of_dtypes(getattr(layout, role).dtypes)}
        return out

    mine = formats(layout_from_checkpoint(quantized_exports[weights]))
    ling = formats(declared_layout(PROFILES[0], weights))
    assert set(mine) == {"attention", "norm", "router", "routed_experts", "shared_expert", "mtp_proj", "embedding",
                         "lm_head", "final_norm"}
    assert {role: mine[role] for role in mine} == {role: ling[role] for role in mine}
    assert mine["routed_experts"] == {{"bf16": "unquantised"}.get(weights, weights)}
    assert mine["lm_head"] == mine["router"] == {"unquantised"}


# ------------------------------------------------------------------ loaded back


def _values_of(export: Path, name: str):
    from safetensors.torch import load_file

    from sparkit.models.tiny_ling.quant import dequantize_fp8_block, dequantize_mxfp4

    state = load_file(str(export / "model.safetensors"))
    w, s = state[f"{name}.weight"], state.get(f"{name}.weight_scale_inv")
    if s is None:
        return w.float()
    if w.dtype == torch.float8_e4m3fn:
        return dequantize_fp8_block(w, s)
    return dequantize_mxfp4(w, s.view(torch.uint8))


@pytest.mark.parametrize("weights", ["fp8", "mxfp4"])
def test_the_embedded_engine_loads_each_export_back_with_the_checkpoints_own_values(quantized_exports, quant_model_dir, weights):
    export = quantized_exports[weights]
    _, native = checkpoint.load_checkpoint(quant_model_dir)
    _, loaded = checkpoint.load_checkpoint(export)
    a, b = native.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    # unquantised tensors are the bf16 ones exactly; quantised ones are their stored bytes decoded
    for k in ("embed_tokens.weight", "lm_head.weight", "norm.weight", "layers.0.mlp.gate.weight", "mtp.enorm.weight"):
        assert torch.equal(a[k], b[k]), k
    qkv = _values_of(export, "model.layers.1.attention.query_key_value")
    assert torch.equal(b["layers.1.self_attn.qkv_proj.weight"], qkv)
    gate = _values_of(export, "model.layers.2.mlp.experts.5.gate_proj")
    assert torch.equal(b["layers.2.mlp.w_gate_up"][5, :gate.shape[0]], gate)
    # and those values are close to the bf16 weights (fp8 block: a few %; mxfp4: e2m1's 2-3 bits)
    bound = {"fp8": 0.07, "mxfp4": 0.35}[weights]
    for k in ("layers.0.mlp.w_gate_up", "layers.3.mlp.w_down", "layers.1.self_attn.o_proj.weight"):
        err = float((a[k] - b[k]).abs().amax() / a[k].abs().amax())
        assert 0 < err < bound, (k, err)
    expert_err = float((a["layers.0.mlp.w_down"] - b["layers.0.mlp.w_down"]).abs().amax() / a["layers.0.mlp.w_down"].abs().amax())
    assert expert_err > (0.05 if weights == "mxfp4" else 0)  # the experts really are in the layout's precision


@pytest.mark.parametrize("weights", ["fp8", "mxfp4"])
def test_the_engine_serves_the_export_and_reports_every_moe_layer_in_its_format(quantized_exports, weights):
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig
    from sparkit.models.tiny_ling.quant import CHECKPOINT_EXPERT_METHODS

    engine = EmbeddedEngine(EngineConfig(model_path=str(quantized_exports[weights]), expert_weights=weights,
                                         speculative_algorithm="NEXTN", lm_head_dtype="fp8"))
    report = engine.activation_report()
    target, draft = report.target.moe, report.draft.moe
    assert [layer.name for layer in target.layers] == [f"layers.{i}.mlp" for i in range(4)]
    assert [layer.name for layer in draft.layers] == ["mtp.decoder.mlp"]
    for layer in target.layers + draft.layers:
        assert (layer.expert_weight_format, layer.quant_method, layer.runner) == (
            weights, CHECKPOINT_EXPERT_METHODS[weights], "embedded-torch")
    with pytest.raises(LaunchError, match=f"stores its experts as {weights}.*--expert-weights bf16 would quantise them again"):
        EmbeddedEngine(EngineConfig(model_path=str(quantized_exports[weights]), expert_weights="bf16"))


def test_a_scale_of_the_wrong_shape_is_refused_naming_the_tensor(quantized_exports, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(quantized_exports["fp8"], bad)
    state = load_file(str(bad / "model.safetensors"))
    name = "model.layers.2.mlp.experts.3.up_proj.weight_scale_inv"
    state[name] = torch.ones(2, 1)
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(LaunchError, match=rf"{name} is F32 \[2, 1\], the fp8 layout .* has F32 \[1, 1\]"):
        checkpoint.load_checkpoint(bad)


# ------------------------------------------------------------------ written atomically, reused, refused


def test_an_export_is_reused_when_complete_and_redone_for_another_layout(quant_model_dir, tmp_path):
    destination = tmp_path / "export"
    checkpoint.ensure_hf_export(quant_model_dir, destination, "bfloat16", "fp8")
    stamp = (destination / "model.safetensors").stat().st_mtime_ns
    checkpoint.ensure_hf_export(quant_model_dir, destination, "bfloat16", "fp8")
    assert (destination / "model.safetensors").stat().st_mtime_ns == stamp
    checkpoint.ensure_hf_export(quant_model_dir, destination, "bfloat16", "mxfp4")
    assert json.loads((destination / checkpoint.EXPORT_MARKER).read_text())["weights"] == "mxfp4"
    assert checkpoint.checkpoint_weights(destination) == "mxfp4"
    assert oct((destination / "model.safetensors").stat().st_mode & 0o777) == "0o600"


def test_an_export_killed_midway_leaves_nothing_that_looks_complete(quant_model_dir, tmp_path, monkeypatch):
    import safetensors.torch

    destination = tmp_path / "export"

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(OSError):
        checkpoint.export_hf(quant_model_dir, destination, "bfloat16", "fp8")
    assert not destination.exists() and not any(tmp_path.iterdir())


def test_widths_the_layout_cannot_tile_are_refused_naming_the_tensor_and_the_width(tmp_path):
    from sparkit.models.tiny_ling.family import BUILDER_VERSION
    from sparkit.models.tiny_ling.model import TinyLingConfig, TinyLingForCausalLM
    from sparkit.models.tiny_ling.tokenizer import save_tokenizer

    source = tmp_path / "tiny-192"
    model = TinyLingForCausalLM(TinyLingConfig(moe_intermediate_size=192, shared_expert_intermediate_size=192))
    checkpoint.save_checkpoint(model, source)
    save_tokenizer(source)
    (source / checkpoint.MARKER).write_text(json.dumps({"builder_version": BUILDER_VERSION, "seed": 0}))
    with pytest.raises(DataError) as info:
        checkpoint.export_hf(source, tmp_path / "out", "bfloat16", "fp8")
    message = str(info.value)
    assert "moe_intermediate_size 192" in message
    assert "model.layers.0.mlp.experts.0.gate_proj.weight [192, 128]: rows 192 not a multiple of the FP8 block 128" in message
    assert not (tmp_path / "out").exists()
    with pytest.raises(DataError, match="expert width 192 not a multiple of 128"):
        checkpoint.export_hf(source, tmp_path / "out", "bfloat16", "mxfp4")
    checkpoint.export_hf(source, tmp_path / "out", "bfloat16", "bf16")  # the bf16 layout takes any width
    with pytest.raises(UsageError, match="--weights 'int4'"):
        checkpoint.export_hf(source, tmp_path / "out2", "bfloat16", "int4")
    with pytest.raises(UsageError, match="needs --weights fp8 or mxfp4"):
        checkpoint.export_hf(source, tmp_path / "out2", "bfloat16", "bf16", damaged_scale=True)


def test_mlas_kv_a_proj_alone_may_end_in_a_ragged_block_of_rows_and_keeps_its_values():
    """Ling-3.0's MLA writes kv_lora_rank + qk_rope_head_dim = 576 rows (4.5 blocks) into
    kv_a_proj_with_mqa, and Ling-3.0-flash-fp8 stores it so: a last block of 64 rows with a scale
    of its own (SGLang appends it whole to the whole-block q_a_proj). Any other layer with ragged
    rows is still refused; the ragged block's scale comes from its own 64 rows, and the values
    come back within e4m3's rounding."""
    from sparkit.models.tiny_ling.hf_quantized import layout_problems
    from sparkit.models.tiny_ling.quant import dequantize_fp8_block, quantize_fp8_block
    from sparkit.weight_formats import tiling_problem

    assert tiling_problem(576, 128, "fp8", ragged_rows=True) is None
    assert "rows 576 not a multiple" in tiling_problem(576, 128, "fp8")
    assert "columns 200" in tiling_problem(576, 200, "fp8", ragged_rows=True)
    inventory = {"model.layers.3.attention.kv_a_proj_with_mqa.weight": ("BF16", (576, 128)),
                 "model.layers.3.attention.q_b_proj.weight": ("BF16", (576, 128))}
    (problem,) = layout_problems(inventory, 4, "fp8")
    assert problem.startswith("model.layers.3.attention.q_b_proj.weight [576, 128]")
    torch.manual_seed(0)
    weight = torch.randn(576, 128)
    weight[512:] *= 1e-3  # the ragged block's own scale must follow its own (small) values
    values, scale = quantize_fp8_block(weight)
    assert values.shape == (576, 128) and scale.shape == (5, 1)
    assert scale[4, 0] == pytest.approx(weight[512:].abs().max().item() / 448, rel=1e-6)
    back = dequantize_fp8_block(values, scale)
    assert torch.allclose(back, weight, rtol=0.07, atol=0)  # e4m3: 3 mantissa bits, every element


@pytest.mark.slow
def test_export_hf_cli_writes_the_layout_and_says_so(quant_model_dir, tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-m", "sparkit.cli.main", "model", "export-hf", str(tmp_path / "x"), "--from",
                          str(quant_model_dir), "--weights", "mxfp4", "--debug-damage-scale", "--json"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["weights"] == "mxfp4" and doc["path"] == str(tmp_path / "x")
    assert doc["damaged_scale"] == {"tensor": "model.layers.0.mlp.experts.7.down_proj.weight_scale_inv", "factor": 64}
    bad = subprocess.run([sys.executable, "-m", "sparkit.cli.main", "model", "export-hf", str(tmp_path / "y"), "--from",
                          str(quant_model_dir), "--weights", "nf4"], capture_output=True, text=True, env=env, timeout=600)
    assert bad.returncode == 2 and "--weights 'nf4' is not one of bf16, fp8, mxfp4" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_damaged_scale_is_one_expert_scale_times_64(quantized_exports):
    from safetensors.torch import load_file

    healthy = load_file(str(quantized_exports["fp8"] / "model.safetensors"))
    damaged = load_file(str(quantized_exports["fp8-damaged"] / "model.safetensors"))
    differ = [n for n in healthy if not torch.equal(healthy[n].view(torch.uint8) if healthy[n].dtype.itemsize == 1 else healthy[n],
                                                    damaged[n].view(torch.uint8) if damaged[n].dtype.itemsize == 1 else damaged[n])]
    name = "model.layers.0.mlp.experts.7.down_proj.weight_scale_inv"
    assert differ == [name] and torch.equal(damaged[name], healthy[name] * 64)
