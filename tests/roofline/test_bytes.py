"""Bytes per decode step, on real safetensors headers: Ling-3.0-flash-fp4's tensors as sparse files
(shapes of the documented configuration, no weights) and the shipped tiny-ling checkpoint. Every
expected figure is summed here from the shapes, independently of sparkit's classifier."""

from __future__ import annotations

import itertools
import json
import math
import struct

import pytest

from sparkit.recipes.load import load_recipe
from sparkit.roofline.bandwidth import Bandwidth
from sparkit.roofline.estimate import estimate, expected_distinct_experts

from _checkpoints import write_ling3_flash_fp4

SPARK = Bandwidth(273.0, 1, "spec", "test: GB10 spec sheet")
CTX = 32768


@pytest.fixture(scope="module")
def ling_dir(tmp_path_factory):
    return write_ling3_flash_fp4(tmp_path_factory.mktemp("ling3-flash-fp4"))


def fp8_block(rows: int, cols: int) -> int:
    """An FP8 linear weight with its block-128 float32 scales."""
    return rows * cols + math.ceil(rows / 128) * math.ceil(cols / 128) * 4


def mxfp4(rows: int, cols: int) -> int:
    return rows * cols // 2 + rows * cols // 32


KDA_LAYER = (5 * fp8_block(4096, 2560) + fp8_block(2560, 4096) + 32 * 2560 * 2 + 3 * 4096 * 4 * 2 + 32 * 4
             + 4096 * 4 + 128 * 2)
MLA_LAYER = (fp8_block(6144, 2560) + fp8_block(576, 2560) + 512 * 2 + fp8_block(8192, 512) + fp8_block(2560, 4096)
             + 32 * 2560 * 2)
EXPERT = 2 * mxfp4(768, 2560) + mxfp4(2560, 768)
SHARED = 2 * fp8_block(768, 2560) + fp8_block(2560, 768)
ROUTER_FP32 = 512 * 2560 * 4 + 512 * 4
DENSE = 2 * fp8_block(6144, 2560) + fp8_block(2560, 6144)
HEAD_FP8 = 157184 * 2560 + 157184 * 4
RESCORE_ROW = 4 * 2 * 2560 * 2  # top-4 stretches, two tokens each, bf16 rows of 2560
MLA_KV_ROW = 576 * 2
KDA_STATE = 32 * 128 * 128 * 4 + 3 * 3 * 4096 * 2


def spark_optimized(ling_dir):
    return load_recipe("ling-3.0-flash/spark-optimized", [f"model.path={ling_dir}"]).recipe


@pytest.mark.slow
def test_a_decode_step_reads_attention_experts_head_and_caches_at_their_stored_dtypes(ling_dir):
    r = estimate(spark_optimized(ling_dir), context=CTX, bandwidth=SPARK)
    assert r.layout_source == "checkpoint"
    norms = 42 * 2 * 2560 * 2 + 2560 * 2
    expected = {
        "attention": 35 * KDA_LAYER + 7 * MLA_LAYER,
        "dense_mlp": 2 * DENSE,
        "shared_expert": 40 * SHARED,
        "routed_experts": 40 * 8 * EXPERT,
        "router": 40 * ROUTER_FP32,
        "norm": norms,
        "embedding": 2560 * 2,
        "lm_head": HEAD_FP8,
        "lm_head_rescore": RESCORE_ROW,
        "kv_cache": 7 * (CTX + 1) * MLA_KV_ROW,
        "linear_state": 35 * KDA_STATE * 2,
    }
    for key, value in expected.items():
        assert r.step[key] == pytest.approx(value, rel=1e-12), key
    assert r.step_bytes == pytest.approx(sum(expected.values()), rel=1e-12)
    assert r.tok_s() == pytest.approx(273e9 / sum(expected.values()))


@pytest.mark.slow
def test_the_verify_step_reads_the_experts_its_tokens_touch_and_the_draft_reads_the_nextn_layer(ling_dir):
    r = estimate(spark_optimized(ling_dir), context=CTX, bandwidth=SPARK)
    n = 4  # NEXTN 3/1/4 verifies 4 positions
    distinct = 512 * (1 - (1 - 8 / 512) ** n)
    assert distinct == pytest.approx(31.25, abs=0.01)  # the study's "up to 32 experts instead of 8"
    assert r.spec.verify["routed_experts"] == pytest.approx(40 * distinct * EXPERT, rel=1e-12)
    assert r.spec.verify["linear_state"] == pytest.approx(35 * KDA_STATE * (n + 3), rel=1e-12)
    assert r.spec.verify["kv_cache"] == pytest.approx(7 * (CTX + n) * MLA_KV_ROW, rel=1e-12)
    assert r.spec.verify["lm_head_rescore"] == pytest.approx(n * RESCORE_ROW, rel=1e-12)

    def nextn_forward(tokens: float) -> float:
        d = 512 * (1 - (1 - 8 / 512) ** tokens)
        return (MLA_LAYER + 5 * 2560 * 2 + fp8_block(2560, 5120) + ROUTER_FP32 + SHARED + d * EXPERT
                + (CTX + tokens) * MLA_KV_ROW + tokens * 2560 * 2 + HEAD_FP8 + math.ceil(tokens) * RESCORE_ROW)

    assert sum(r.spec.chained.values()) == pytest.approx(nextn_forward(1), rel=1e-12)
    accept = 2.68
    cycle = sum(r.spec.verify.values()) + 2 * nextn_forward(1) + nextn_forward(accept)
    assert r.spec.cycle_bytes(accept) == pytest.approx(cycle, rel=1e-12)
    assert r.tok_s(accept) == pytest.approx(accept * 273e9 / cycle)


@pytest.mark.slow
def test_mtp_breaks_even_where_its_speed_meets_plain_decoding_and_pays_above(ling_dir):
    r = estimate(spark_optimized(ling_dir), context=CTX, bandwidth=SPARK)
    even = r.break_even_accept()
    assert 1.5 < even < 3.0
    assert r.tok_s(even) == pytest.approx(r.tok_s(), rel=1e-6)
    assert r.tok_s(even + 0.2) > r.tok_s() > r.tok_s(even - 0.2)


@pytest.mark.slow
def test_the_declared_profile_reads_what_the_real_headers_say(ling_dir):
    """Without a local checkpoint the hub id's declared profile must price a step exactly like a
    checkpoint with Ling-3.0-flash-fp4's real names, dtypes and shapes."""
    from_headers = estimate(spark_optimized(ling_dir), context=CTX, bandwidth=SPARK)
    declared = estimate(load_recipe("ling-3.0-flash/spark-optimized").recipe, context=CTX, bandwidth=SPARK)
    assert declared.layout_source == "declared profile"
    assert declared.step == pytest.approx(from_headers.step, rel=1e-12)
    assert declared.spec.cycle_bytes(3.9) == pytest.approx(from_headers.spec.cycle_bytes(3.9), rel=1e-12)


@pytest.mark.slow
def test_the_declared_profile_matches_the_published_sizes():
    """124B parameters and 5.1B active (published), the -fp4 target weights at SGLang's loaded
    64.88 GiB within 2%, and MLA KV at the 8066 bytes per token its KV pool implies."""
    from sparkit.roofline.profiles import LING3_FLASH_CONFIG, PROFILES, declared_layout

    bf16 = declared_layout(PROFILES[0], "bf16")
    params, active = bf16.target_parameters, bf16.active_target_parameters
    head = bf16.lm_head.float_numel
    assert params + head + bf16.embedding.float_numel == pytest.approx(124e9, rel=0.01)
    assert active + head == pytest.approx(5.1e9, rel=0.01)
    fp4 = declared_layout(PROFILES[0], "mxfp4")
    mtp = fp4.mtp_layers[0]
    mtp_bytes = sum(w.stored_bytes for w in mtp.weights.values()) + mtp.experts.per_expert.stored_bytes * 512
    assert (fp4.total_stored_bytes - mtp_bytes) / 2**30 == pytest.approx(64.88, rel=0.02)
    assert sum(layer.kv_elements_per_token for layer in fp4.target_layers) * 2 == pytest.approx(
        14.37 * 2**30 / 1_912_896, rel=0.001)
    assert LING3_FLASH_CONFIG["num_experts"] == 512


@pytest.mark.slow
def test_tensor_parallel_splits_the_sharded_weights_and_keeps_routers_and_mla_kv_whole(ling_dir):
    tp1 = estimate(load_recipe("ling-3.0-flash/tp4-baseline", [f"model.path={ling_dir}", "stack.tp=1"]).recipe,
                   context=CTX, bandwidth=SPARK)
    tp4 = estimate(load_recipe("ling-3.0-flash/tp4-baseline", [f"model.path={ling_dir}"]).recipe,
                   context=CTX, bandwidth=Bandwidth(8000.0, 4, "spec", "test"))
    assert tp4.tp == 4
    for key in ("attention", "routed_experts", "shared_expert", "lm_head", "linear_state"):
        assert tp4.step[key] == pytest.approx(tp1.step[key] / 4, rel=1e-12), key
    for key in ("router", "kv_cache", "norm"):
        assert tp4.step[key] == pytest.approx(tp1.step[key], rel=1e-12), key


def test_expected_distinct_experts_is_the_mean_union_of_independent_top_k_choices():
    experts, k, tokens = 6, 2, 3
    choices = list(itertools.combinations(range(experts), k))
    unions = [len(set().union(*combo)) for combo in itertools.product(choices, repeat=tokens)]
    assert expected_distinct_experts(tokens, experts, k) == pytest.approx(sum(unions) / len(unions), rel=1e-12)
    assert expected_distinct_experts(1, 512, 8) == pytest.approx(8)


def _tiny_header():
    from sparkit.models.builder import builtin_model_dir

    path = builtin_model_dir("tiny-ling", 0) / "model.safetensors"
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    header.pop("__metadata__", None)
    return {name: math.prod(entry["shape"]) for name, entry in header.items()}


def test_the_embedded_engine_on_cpu_reads_every_weight_of_tiny_ling_in_float32():
    """tiny-ling's recipe stores fp8 experts, but the embedded engine decodes them once at load and
    a CPU step reads float32: summed here from the shipped checkpoint's own header."""
    numel = _tiny_header()
    ctx = 100
    experts = sum(v for n, v in numel.items() if n.startswith("layers.") and (".w_gate_up" in n or ".w_down" in n))
    dense = sum(v for n, v in numel.items() if n.startswith("layers.") and ".w_" not in n)
    expected = (dense + experts * 2 / 8) * 4  # 2 of 8 experts per layer
    expected += 128 * 4 + numel["norm.weight"] * 4  # one embedding row, the final norm
    expected += numel["lm_head.weight"] * 4 + 4 * 2 * 128 * 2  # the dequantised FP8 head + re-scoring
    expected += 4 * (ctx + 1) * (2 * 2 * 64) * 4  # K and V of 2 heads of 64, 4 layers, float32
    r = estimate(load_recipe("tiny", ["target=cpu"]).recipe, context=ctx, bandwidth=Bandwidth(20.0, 1, "measured", "t"))
    assert r.layout_source == "checkpoint" and r.device == "cpu"
    assert r.step_bytes == pytest.approx(expected, rel=1e-12)
    mtp = sum(v for n, v in numel.items() if n.startswith("mtp.") and ".w_" not in n)
    mtp_experts = sum(v for n, v in numel.items() if n.startswith("mtp.") and ".w_" in n)
    draft = ((mtp + mtp_experts * 2 / 8) * 4 + 128 * 4 + numel["lm_head.weight"] * 4 + 4 * 2 * 128 * 2
             + (ctx + 1) * (2 * 2 * 64) * 4)
    assert sum(r.spec.chained.values()) == pytest.approx(draft, rel=1e-12)
