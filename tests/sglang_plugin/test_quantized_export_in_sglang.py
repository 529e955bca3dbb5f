"""The quantised tiny-ling exports (`sparkit model export-hf --weights fp8|mxfp4`) through SGLang
0.5.23's own code, on CPU.

sglang.srt's layer modules do not import here (no GPU stack), so the pieces that decide whether
SGLang accepts a checkpoint run from the installed source (tests/sglang_plugin/_sglang_source.py):
  - Fp8Config.from_config reads the export's quantization_config (block size, activation scheme,
    the modules left unquantised) and ModelConfig marks MXFP4 experts from routed_experts_quant_method;
  - Fp8MoEMethod.create_fp8_moe_weight_ makes the MoE parameters a layer of tiny-ling's shape gets
    (block-FP8 experts; MXFP4 experts: int8 pairs and per-32 scales), and FusedMoE._weight_loader_impl
    (with _load_w13 / _load_w2) copies every expert tensor of the export into them;
  - Fp8LinearMethod.create_fp8_weight_ (and its block-shape validation) makes the block-FP8 linear
    parameters, whose dtypes and shapes the export's attention, shared-expert and eh_proj tensors
    must have (their loaders copy them in place);
  - BailingMoEForCausalLM.load_weights maps every tensor name of the export (target and NextN draft)
    to a parameter, none left over and no parameter left unloaded.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import types
from collections.abc import Iterable
from enum import Enum
from typing import Any, Optional

import pytest

from _sglang_source import bind_method, exec_functions, find_class, find_function, module_ast

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")

FP8 = "sglang.srt.layers.quantization.fp8"
BASE = "sglang.srt.layers.quantization.base_config"
LAYER = "sglang.srt.layers.moe.fused_moe_triton.layer"
MOE_UTILS = "sglang.srt.layers.moe.utils"
BAILING = "sglang.srt.models.bailing_moe"
MODEL_CONFIG = "sglang.srt.configs.model_config"


# ------------------------------------------------------------------ SGLang's quant config


def _fp8_config_class():
    """sglang's Fp8Config with its installed __init__ / from_config (and QuantizationConfig's key
    readers) exec'd from the source."""
    from sglang.srt.environ import envs

    ns = {"torch": torch, "envs": envs, "logger": logging.getLogger("sglang-fp8"), "List": list, "Dict": dict,
          "Any": Any, "Optional": Optional, "log_info_on_rank0": lambda logger, msg: None}
    exec_functions(FP8, ["ACTIVATION_SCHEMES"], ns)
    base = type("QuantizationConfig", (), {"get_from_keys": staticmethod(bind_method(BASE, "QuantizationConfig", "get_from_keys", ns))})
    ns["QuantizationConfig"] = base
    base.get_from_keys_or = staticmethod(bind_method(BASE, "QuantizationConfig", "get_from_keys_or", ns))
    cls = type("Fp8Config", (base,), {})
    ns["Fp8Config"] = cls
    cls.__init__ = bind_method(FP8, "Fp8Config", "__init__", {**ns, "super": lambda: types.SimpleNamespace(__init__=lambda: None)})
    cls.from_config = classmethod(bind_method(FP8, "Fp8Config", "from_config", ns))
    return cls


def test_sglang_reads_the_fp8_export_as_block_fp8(quantized_exports):
    config = json.loads((quantized_exports["fp8"] / "config.json").read_text())["quantization_config"]
    cfg = _fp8_config_class().from_config(config)
    assert cfg.is_checkpoint_fp8_serialized is True and cfg.weight_block_size == [128, 128]
    assert cfg.activation_scheme == "dynamic" and cfg.use_mxfp8 is False
    assert "lm_head" in cfg.ignored_layers and "model.lm_head" in cfg.ignored_layers


def test_sglang_marks_the_mxfp4_exports_experts_fp4(quantized_exports):
    """ModelConfig: `is_fp4_experts = quantization_config.get("routed_experts_quant_method") == "mxfp4"`
    (read from the installed source), then the same Fp8Config as the -fp8 export."""
    init = find_function(find_class(module_ast(MODEL_CONFIG), "ModelConfig").body, "__init__")
    keys, compared = set(), set()
    for node in ast.walk(init):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get" and node.args \
                and isinstance(node.args[0], ast.Constant):
            keys.add(node.args[0].value)
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "attr", None) == "is_fp4_experts" \
                and isinstance(node.value, ast.Compare):
            compared.add(node.value.comparators[0].value)
    assert "routed_experts_quant_method" in keys and compared == {"mxfp4"}
    config = json.loads((quantized_exports["mxfp4"] / "config.json").read_text())["quantization_config"]
    assert config["routed_experts_quant_method"] == "mxfp4" and config["routed_experts_group_size"] == 32
    cfg = _fp8_config_class().from_config(config)
    assert cfg.is_checkpoint_fp8_serialized is True and cfg.weight_block_size == [128, 128]


# ------------------------------------------------------------------ the MoE parameters and loader


def _moe_layer_class(fp4: bool):
    """A FusedMoE whose weight creation and loading are SGLang's installed methods."""
    from sglang.srt.environ import envs
    from sglang.srt.utils.common import set_weight_attrs

    ns: dict = {"torch": torch, "Optional": Optional, "os": __import__("os"), "envs": envs,
                "set_weight_attrs": set_weight_attrs, "_use_aiter": False, "_use_hip_int4": False, "_is_hip": False,
                "_is_cpu": False, "is_xpu": lambda: False, "get_bool_env_var": lambda name, default="false": False}
    exec_functions(MOE_UTILS, ["get_moe_padding_size", "get_moe_weight_sizes", "AITER_PADDING_SIZE", "TRITON_PADDING_SIZE"], ns)
    exec_functions(LAYER, ["_maybe_copy_weight_view_before_h2d", "_weight_layout_method"], ns)
    enum_src = ast.get_source_segment(__import__("_sglang_source").module_path(LAYER).read_text(),
                                      find_class(module_ast(LAYER), "FusedMoeWeightScaleSupported"))
    exec(enum_src, {"Enum": Enum}, ns)
    for name in ("UnquantizedFusedMoEMethod", "CompressedTensorsMxInt4MoE", "ModelOptNvFp4FusedMoEMethod", "KTEPWrapperMethod"):
        ns[name] = type(name, (), {})
    ns["Fp8MoEMethod"] = type("Fp8MoEMethod", (), {"is_fp4_expert": fp4})
    create = bind_method(FP8, "Fp8MoEMethod", "create_fp8_moe_weight_", ns, strip_imports=True)
    methods = {m: bind_method(LAYER, "FusedMoE", m, ns) for m in (
        "_weight_loader_impl", "_load_gguf_weight", "_maybe_load_bf16_shared_expert_as_fp4",
        "_maybe_load_fp8_shared_expert_as_fp4", "_load_model_weight_or_group_weight_scale", "_load_w13", "_load_w2",
        "_load_per_tensor_weight_scale", "_load_per_channel_weight_scale", "_load_single_value", "_load_g_idx")}
    mapping = bind_method(LAYER, "FusedMoE", "make_expert_params_mapping", ns)
    return type("FusedMoE", (torch.nn.Module,), methods), create, ns["Fp8MoEMethod"], mapping


def _make_moe(fp4: bool, num_experts: int, hidden: int, inter: int):
    FusedMoE, create, method_cls, mapping = _moe_layer_class(fp4)
    layer = FusedMoE()
    for attr, value in {"moe_runner_config": types.SimpleNamespace(is_gated=True), "moe_tp_size": 1, "moe_tp_rank": 0,
                        "use_padded_loading": False, "use_presharded_weights": False, "use_triton_kernels": False,
                        "use_flashinfer_trtllm_moe": False, "scheme": None, "_has_fused_shared": False,
                        "quant_method": method_cls(),
                        "quant_config": types.SimpleNamespace(get_name=lambda: "fp8", is_fp4_experts=fp4)}.items():
        setattr(layer, attr, value)
    quant_config = types.SimpleNamespace(weight_block_size=[128, 128], activation_scheme="dynamic",
                                         is_checkpoint_fp8_serialized=True)
    create(layer=layer, num_experts=num_experts, hidden_size=hidden, intermediate_size_per_partition=inter,
           block_quant=True, quant_config=quant_config, use_mxfp8=False, is_checkpoint_fp8_serialized=True,
           is_fp4_expert=fp4, params_dtype=torch.bfloat16)
    return layer, mapping


def _export_state(directory):
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


@pytest.mark.parametrize("weights", ["fp8", "mxfp4"])
def test_sglangs_moe_loader_takes_every_expert_tensor_of_the_export(quantized_exports, weights):
    directory = quantized_exports[weights]
    config = json.loads((directory / "config.json").read_text())
    state = _export_state(directory)
    experts, hidden, inter = config["num_experts"], config["hidden_size"], config["moe_intermediate_size"]
    fp4 = weights == "mxfp4"
    layer, mapping = _make_moe(fp4, experts, hidden, inter)
    params = dict(layer.named_parameters())
    # what SGLang created: fp8 e4m3 + float32 block scales; fp4 int8 pairs + per-32 scales (float32 until
    # Mxfp4HummingMoEMethod casts them to e8m0 after loading)
    if fp4:
        assert (params["w13_weight"].dtype, tuple(params["w13_weight"].shape)) == (torch.int8, (experts, 2 * inter, hidden // 2))
        assert tuple(params["w2_weight_scale_inv"].shape) == (experts, hidden, inter // 32)
    else:
        assert (params["w13_weight"].dtype, tuple(params["w13_weight"].shape)) == (torch.float8_e4m3fn, (experts, 2 * inter, hidden))
        assert tuple(params["w13_weight_scale_inv"].shape) == (experts, 2 * inter // 128, hidden // 128)
    prefix = "model.layers.0.mlp."
    loaded = 0
    for name, tensor in state.items():
        if not name.startswith(prefix + "experts."):
            continue
        for param_name, weight_name, expert_id, shard_id in mapping(None, "gate_proj", "down_proj", "up_proj", experts):
            if weight_name in name:  # as BailingMoEForCausalLM.load_weights matches them
                target = name.replace(weight_name, param_name).removeprefix(prefix + "experts.")
                layer._weight_loader_impl(params[target], tensor, name, shard_id=shard_id, expert_id=expert_id)
                loaded += 1
                break
    assert loaded == experts * 3 * 2  # gate, up, down: weight and scale each
    for e in range(experts):
        p = f"{prefix}experts.{e}."
        gate, up, down = (state[f"{p}{n}_proj.weight"] for n in ("gate", "up", "down"))
        if fp4:  # the packed bytes, bit for bit (uint8 read into SGLang's int8 parameter)
            assert torch.equal(params["w13_weight"][e].view(torch.uint8), torch.cat((gate, up)))
            assert torch.equal(params["w2_weight"][e].view(torch.uint8), down)
            scale = params["w13_weight_scale_inv"][e].to(torch.float8_e8m0fnu).view(torch.uint8)
            want = torch.cat((state[f"{p}gate_proj.weight_scale_inv"], state[f"{p}up_proj.weight_scale_inv"])).view(torch.uint8)
            assert torch.equal(scale, want)  # what Mxfp4HummingMoEMethod hands humming: the export's e8m0 codes
        else:
            assert torch.equal(params["w13_weight"][e].view(torch.uint8), torch.cat((gate, up)).view(torch.uint8))
            assert torch.equal(params["w2_weight"][e].view(torch.uint8), down.view(torch.uint8))
            assert torch.equal(params["w13_weight_scale_inv"][e], torch.cat((state[f"{p}gate_proj.weight_scale_inv"],
                                                                             state[f"{p}up_proj.weight_scale_inv"])))
            assert torch.equal(params["w2_weight_scale_inv"][e], state[f"{p}down_proj.weight_scale_inv"])


def test_sglang_refuses_an_fp8_block_moe_whose_experts_are_not_whole_blocks():
    """The reason tiny-ling's experts are 128 wide: SGLang's own check, on a width of 192."""
    with pytest.raises(ValueError, match="not divisible by weight quantization block_n = 128"):
        _make_moe(False, 8, 128, 192)


# ------------------------------------------------------------------ the linear parameters


def _linear_creator():
    from sglang.srt.layers import parameter

    ns = {"torch": torch, "List": list, "Optional": Optional, "print_warning_once": lambda msg: None,
          "ModelWeightParameter": parameter.ModelWeightParameter, "BlockQuantScaleParameter": parameter.BlockQuantScaleParameter,
          "PerTensorScaleParameter": parameter.PerTensorScaleParameter}
    validate = bind_method(FP8, "Fp8LinearMethod", "validate_block_quant_shapes", ns)
    ns["Fp8LinearMethod"] = types.SimpleNamespace(validate_block_quant_shapes=validate)
    return bind_method(FP8, "Fp8LinearMethod", "create_fp8_weight_", ns)


@pytest.mark.parametrize("weights", ["fp8", "mxfp4"])
def test_sglangs_block_fp8_linear_parameters_hold_the_exports_linear_tensors(quantized_exports, weights):
    directory = quantized_exports[weights]
    config = json.loads((directory / "config.json").read_text())
    state = _export_state(directory)
    create = _linear_creator()
    quant_config = types.SimpleNamespace(weight_block_size=[128, 128], activation_scheme="dynamic")
    hidden, shared = config["hidden_size"], config["moe_shared_expert_intermediate_size"]
    qkv = 3 * config["num_attention_heads"] * config["head_dim"]
    nextn = f"model.layers.{config['num_hidden_layers']}"
    # (the checkpoint tensors of one SGLang linear layer, its output partitions, its input size)
    linears = [(["model.layers.1.attention.query_key_value"], [qkv // 3] * 3, hidden),
               (["model.layers.1.attention.dense"], [hidden], qkv // 3),
               (["model.layers.2.mlp.shared_experts.gate_proj", "model.layers.2.mlp.shared_experts.up_proj"], [shared, shared], hidden),
               (["model.layers.2.mlp.shared_experts.down_proj"], [hidden], shared),
               ([f"{nextn}.eh_proj"], [hidden], 2 * hidden)]
    for names, partitions, cols in linears:
        layer = torch.nn.Module()
        layer.tp_group = None
        create(layer, block_quant=True, quant_config=quant_config, use_mxfp8=False,
               output_size_per_partition=sum(partitions), input_size_per_partition=cols, output_partition_sizes=partitions,
               input_size=cols, output_size=sum(partitions), params_dtype=torch.bfloat16, weight_loader=None,
               is_checkpoint_fp8_serialized=True)
        weight = torch.cat([state[f"{n}.weight"] for n in names])
        scale = torch.cat([state[f"{n}.weight_scale_inv"] for n in names])
        assert (layer.weight.dtype, layer.weight.shape) == (weight.dtype, weight.shape), names
        assert (layer.weight_scale_inv.dtype, layer.weight_scale_inv.shape) == (scale.dtype, scale.shape), names
        # a merged or fused layer's scale rows are its partitions' scale rows, block by block
        assert layer.weight_scale_inv.shape[0] == sum(-(-p // 128) for p in partitions)


# ------------------------------------------------------------------ every tensor name to a parameter


class _Param:
    def __init__(self, name: str, calls: list):
        self.name, self.calls = name, calls

    def weight_loader(self, param, loaded_weight, *args, **kwargs):
        self.calls.append((self.name, tuple(loaded_weight.shape), args, kwargs))


def _sglang_param_names(config: dict, nextn: bool) -> list[str]:
    """The parameters bailing_moe.py's modules register for a block-FP8 checkpoint (LinearBase layers
    get weight + weight_scale_inv, FusedMoE w13/w2 weights and scales; embeddings, norms, router plain)."""
    def block(p: str) -> list[str]:
        out = [f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight", f"{p}.mlp.gate.weight"]
        for linear in ("attention.query_key_value", "attention.dense", "mlp.shared_experts.gate_up_proj",
                       "mlp.shared_experts.down_proj"):
            out += [f"{p}.{linear}.weight", f"{p}.{linear}.weight_scale_inv"]
        out += [f"{p}.mlp.experts.{w}" for w in ("w13_weight", "w2_weight", "w13_weight_scale_inv", "w2_weight_scale_inv")]
        return out

    if nextn:  # BailingMoEModelNextN: its own eh_proj and norms, one decoder block
        return (["model.word_embeddings.weight", "lm_head.weight", "model.enorm.weight", "model.hnorm.weight",
                 "model.final_layernorm.weight", "model.eh_proj.weight", "model.eh_proj.weight_scale_inv"]
                + block("model.decoder"))
    names = ["model.word_embeddings.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(config["num_hidden_layers"]):
        names += block(f"model.layers.{i}")
    return names


@pytest.mark.parametrize("weights", ["fp8", "mxfp4"])
def test_bailing_load_weights_maps_every_export_tensor_to_a_parameter(quantized_exports, weights):
    directory = quantized_exports[weights]
    config = json.loads((directory / "config.json").read_text())
    state = _export_state(directory)
    ns = {"torch": torch, "Iterable": Iterable, "Tuple": tuple, "default_weight_loader": None,
          "PPMissingLayer": type("PPMissingLayer", (), {}), "BailingMoESparseMoeBlock": type("BailingMoESparseMoeBlock", (), {})}
    FusedMoE = _moe_layer_class(weights == "mxfp4")[0]
    FusedMoE.make_expert_params_mapping = classmethod(bind_method(LAYER, "FusedMoE", "make_expert_params_mapping", ns))
    ns["FusedMoE"] = FusedMoE
    load_weights = bind_method(BAILING, "BailingMoEForCausalLM", "load_weights", ns)
    cfg = types.SimpleNamespace(**{k: v for k, v in config.items() if not isinstance(v, dict)})
    layers = config["num_hidden_layers"]
    for nextn in (False, True):
        calls: list = []
        params = {name: _Param(name, calls) for name in _sglang_param_names(config, nextn)}
        model = types.SimpleNamespace(config=cfg, named_parameters=lambda: params.items(),
                                      model=types.SimpleNamespace(layers=[]))
        load_weights(model, list(state.items()), is_nextn=nextn)
        mine = [n for n in state if n.startswith(f"model.layers.{layers}.")] if nextn else \
            [n for n in state if not n.startswith(f"model.layers.{layers}.")]
        assert len(calls) == len(mine), f"{len(mine) - len(calls)} tensors of the export found no parameter"
        unloaded = sorted(set(params) - {c[0] for c in calls}
                          - ({"model.word_embeddings.weight", "lm_head.weight"} if nextn else set()))
        assert unloaded == [], f"parameters no tensor of the export loads: {unloaded}"
        # each routed expert's gate/up/down, weight and scale, reached the FusedMoE loader with its id
        expert_calls = [c for c in calls if ".experts." in c[0]]
        assert len(expert_calls) == (1 if nextn else layers) * config["num_experts"] * 6
        assert {c[3]["expert_id"] for c in expert_calls} == set(range(config["num_experts"]))
    assert math.isfinite(float(state["lm_head.weight"].float().abs().max()))
