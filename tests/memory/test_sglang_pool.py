"""SGLang's pool sizing as sparkit replays it (sparkit.memory.sglang_pool), against what real SGLang
0.5.23 servers on the H200 logged: from the free memory each logged ("Load weight begin/end ...
avail mem") and its model's config.json (the kit's generators, tests/fixtures/.../configs), the
state pool's slots and sizes, the KV pool's tokens and size and what was left must come out as
the server's own lines say. The formulas themselves are pinned to SGLang's source in
test_sglang_semantics.py."""

from __future__ import annotations

import json

import pytest

from sparkit.engines.sglang.log import parse_memory
from sparkit.memory.model_shape import model_shape
from sparkit.memory.sglang_pool import GIB, PoolInputs, mamba_ratio, size_pools

from _shared import REPO_DIR

FIXTURES = REPO_DIR / "tests" / "fixtures" / "sglang-0.5.23-h200"


def config(name: str) -> dict:
    return json.loads((FIXTURES / "configs" / f"{name}.json").read_text())


def inputs_for(log_name: str, model: str, *, draft_layers: int = 0, spec: int | None = None,
               requests: int | None = None) -> tuple[PoolInputs, object]:
    """PoolInputs from a real log's measured memory and its model's config (mem_fraction_static 0.3
    in every kit run, as server_args in the log says)."""
    text = (FIXTURES / log_name).read_text()
    logged = parse_memory(text)
    assert "'mem_fraction_static': 0.3" in text
    shape = model_shape(config(model))
    conv = shape.linear_attention_layers * shape.linear_state_conv_values * 2
    ssm = shape.linear_attention_layers * shape.linear_state_temporal_values * shape.linear_state_temporal_bytes
    return PoolInputs(
        pre_model_load_bytes=logged.pre_model_load_gb * GIB, available_bytes=logged.available_after_weights_gb * GIB,
        mem_fraction_static=0.3, kv_cell_bytes=shape.kv_bytes_per_token(2), kv_layers=shape.full_attention_layers,
        draft_kv_layers=draft_layers, context_len=4096, max_running_requests=requests,
        mamba_conv_bytes_per_req=conv, mamba_ssm_bytes_per_req=ssm, spec_draft_tokens=spec,
        conv_channels_per_layer=shape.linear_state_conv_values // 3, linear_layers=shape.linear_attention_layers,
    ), logged


def test_the_v3_state_and_kv_pools_sglang_sized_itself():
    """v3-plain: the tiny BailingMoeV3 (3 KDA + 1 MLA layers), no NEXTN: SGLang split the rest
    0.9 : 1 between state and KV ('Mamba Cache is allocated. max_mamba_cache_size: 26027, conv_state
    size: 0.67GB, ssm_state size: 19.06GB', 'KV Cache is allocated ... #tokens: 20437227, KV size: 21.93 GB')."""
    inputs, logged = inputs_for("v3-plain.log", "tiny-bailing-v3-mtp")
    sizes = size_pools(inputs)
    assert logged.mamba["max_mamba_cache_size"] == 26027 and logged.kv[0]["tokens"] == 20437227
    assert sizes.max_mamba_cache_size == pytest.approx(26027, rel=5e-4)
    assert round(sizes.conv_state_bytes / GIB, 2) == logged.mamba["conv_state_gb"]
    assert round(sizes.ssm_state_bytes / GIB, 2) == pytest.approx(logged.mamba["ssm_state_gb"], abs=0.011)
    assert sizes.kv_tokens == pytest.approx(logged.kv[0]["tokens"], rel=5e-4)
    assert round(sizes.kv_bytes / GIB, 2) == pytest.approx(logged.kv[0]["kv_gb"], abs=0.011)
    assert sizes.max_running_requests == logged.summary["max_running_requests"] == 4096
    assert sizes.pool_end_available_bytes / GIB == pytest.approx(logged.pool_end_avail_gb[-1], abs=0.3)
    # without the state pool's share the KV pool would be 0.9 x 1.9 times larger: the split matters
    alone = size_pools(PoolInputs(**{**inputs.__dict__, "mamba_conv_bytes_per_req": 0, "mamba_ssm_bytes_per_req": 0}))
    assert alone.kv_tokens > 1.8 * logged.kv[0]["tokens"]


def test_the_v3_pools_with_nextn_reserve_the_verify_state():
    """v3-nextn-nograph: NEXTN 2/1/3 (3 draft tokens), 48 running requests, the draft's MLA layer
    beside the target's: 16263 slots with 0.11 GB of intermediate state, 13614799 tokens for both."""
    inputs, logged = inputs_for("v3-nextn-nograph.log", "tiny-bailing-v3-mtp", draft_layers=1, spec=3, requests=48)
    sizes = size_pools(inputs)
    assert mamba_ratio(inputs) == 5  # 3 with the radix cache + 2 tracking slots (extra buffer, overlap)
    assert sizes.max_mamba_cache_size == pytest.approx(logged.mamba["max_mamba_cache_size"], rel=5e-4)
    assert round(sizes.intermediate_ssm_bytes / GIB, 2) == logged.mamba["intermediate_ssm_state_cache_gb"] == 0.11
    assert round(sizes.intermediate_conv_bytes / GIB, 2) == logged.mamba["intermediate_conv_window_cache_gb"]
    assert sizes.kv_tokens == pytest.approx(logged.kv[0]["tokens"], rel=5e-4)
    # one KV line for the target's MLA layer and one for the draft's, each 14.61 GB
    assert [round(b / GIB, 2) for b in (sizes.kv_bytes, sizes.draft_kv_bytes)] == pytest.approx(
        [k["kv_gb"] for k in logged.kv], abs=0.011)
    assert sizes.max_running_requests == 48


def test_mha_kv_with_a_draft_layer_and_a_dense_model():
    """BailingMoeV2 + NEXTN (2 target + 1 draft layer of K and V) and a dense Qwen2: no state pool,
    the rest all KV ('#tokens: 29136413, K size: 13.89 GB, V size: 13.89 GB'; 43690284 tokens)."""
    inputs, logged = inputs_for("bailing-nextn-cudagraph.log", "tiny-bailing-mtp", draft_layers=1, spec=3, requests=48)
    sizes = size_pools(inputs)
    assert sizes.max_mamba_cache_size is None
    assert sizes.kv_tokens == pytest.approx(logged.kv[0]["tokens"], rel=5e-4)
    assert round(sizes.kv_bytes / GIB, 2) == pytest.approx(logged.kv[0]["kv_gb"], abs=0.021)
    assert round(sizes.draft_kv_bytes / GIB, 2) == pytest.approx(logged.kv[1]["kv_gb"], abs=0.011)
    dense, dense_log = inputs_for("dense-nograph.first200.log", "tiny-qwen2")
    assert size_pools(dense).kv_tokens == pytest.approx(dense_log.kv[0]["tokens"], rel=5e-4)


def test_a_capped_pool_is_the_cap():
    """sparkit-main: --max-total-tokens 65536: the pool is exactly the cap, whatever is free."""
    inputs, logged = inputs_for("sparkit-main/server.log", "tiny-bailing-mtp", draft_layers=1, spec=4, requests=48)
    capped = PoolInputs(**{**inputs.__dict__, "max_total_tokens": 65536, "context_len": 2048})
    assert size_pools(capped).kv_tokens == logged.kv[0]["tokens"] == 65536


def test_no_room_is_sglang_s_own_refusal():
    """What a second server started beside another finds: the free memory it measured at start is
    gone when it sizes its pools, rest < 0, and SGLang refuses in its own words."""
    inputs, _ = inputs_for("v3-plain.log", "tiny-bailing-v3-mtp")
    later = PoolInputs(**{**inputs.__dict__, "available_bytes": inputs.pre_model_load_bytes * 0.6})
    sizes = size_pools(later)
    assert sizes.error.startswith("Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
                                  "max_mamba_cache_size=")
    assert f"total_rest_memory={sizes.rest_bytes / GIB:.2f} GB" in sizes.error and sizes.rest_bytes < 0
    dense = PoolInputs(**{**later.__dict__, "mamba_conv_bytes_per_req": 0, "mamba_ssm_bytes_per_req": 0})
    assert size_pools(dense).error.startswith("Loaded weights leave no GPU memory for the KV cache under "
                                              "--mem-fraction-static=0.3")
    # an explicit, small state pool still fits where the auto-sized one would not
    explicit = PoolInputs(**{**inputs.__dict__, "available_bytes": inputs.pre_model_load_bytes * 0.71,
                             "max_mamba_cache_size": 64, "max_total_tokens": 16384})
    assert size_pools(explicit).error is None and size_pools(explicit).max_mamba_cache_size == 64
