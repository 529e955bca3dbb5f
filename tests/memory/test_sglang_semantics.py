"""What the memory fit assumes about SGLang, pinned against the installed SGLang (0.5.23): its own
linear-attention state shape and prefill graph sizes computed by its code, and the formulas the
fit reproduces read from its source. When an upgrade changes one, this fails and names it."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from sparkit.memory import fit
from sparkit.memory.model_shape import model_shape

spec = importlib.util.find_spec("sglang")
if spec is None:
    pytest.skip("sglang is not installed", allow_module_level=True)
SRT = Path(list(spec.submodule_search_locations)[0]) / "srt"


def source(relative: str) -> str:
    return (SRT / relative).read_text()


def load(relative: str, name: str):
    """One sglang module by file (its package __init__ pulls multimodal code a CPU venv lacks)."""
    module_spec = importlib.util.spec_from_file_location(name, SRT / relative)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def ling_config() -> dict:
    generator = importlib.util.spec_from_file_location(
        "make_sparse_ling", Path(__file__).resolve().parents[2] / "scripts" / "make_sparse_ling.py")
    module = importlib.util.module_from_spec(generator)
    generator.loader.exec_module(module)
    return json.loads(json.dumps(module.config("fp4")))


@pytest.mark.parametrize("tp", [1, 4])
def test_kda_state_per_request_is_sglang_s_own(tp):
    mamba = load("configs/mamba_utils.py", "sglang_mamba_utils_for_sparkit")
    cfg = ling_config()
    schedule = [i for i in range(cfg["num_hidden_layers"]) if (i + 1) % cfg["layer_group_size"] != 0]
    shape = mamba.KimiLinearStateShape.create(tp_world_size=tp, num_heads=cfg["num_attention_heads"],
                                               head_dim=cfg["head_dim"], conv_kernel_size=cfg["short_conv_kernel_size"])
    theirs = mamba.KimiLinearCacheParams(shape=shape, layers=schedule).mamba_cache_per_req
    assert model_shape(cfg, tp).linear_state_bytes_per_request() == theirs


def test_prefill_graph_sizes_are_sglang_s():
    hook = load("arg_groups/cuda_graph_hook.py", "sglang_cuda_graph_hook_for_sparkit")
    for max_tokens in (256, 4096, 8192, 16384, 65536):
        assert fit.sglang_prefill_graph_sizes(max_tokens) == hook.generate_prefill_cuda_graph_batch_sizes(max_tokens)


def test_the_kv_pool_formula_and_the_integrated_gpu_figure():
    configurator = source("mem_cache/kv_cache_configurator.py")
    assert "slack_gb = pre_model_load_memory * (1 - get_schedule().mem_fraction_static)" in configurator
    assert "rest_memory = available_gpu_memory - slack_gb" in configurator
    assert re.search(rf"MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = {fit.SGLANG_MAMBA_SLOTS_PER_REQUEST}\b", configurator)
    assert "* get_schedule().mamba_full_memory_ratio\n                / (1 + get_schedule().mamba_full_memory_ratio)" in configurator
    schedule = source("arg_groups/fields/schedule.py")
    ratio = schedule[schedule.index("mamba_full_memory_ratio:"):][:300]
    assert f"fallback={fit.SGLANG_MAMBA_FULL_MEMORY_RATIO}" in ratio
    common = source("utils/common.py")  # GB10: pre_model_load_memory is MemAvailable
    assert re.search(r"if props\.is_integrated:.*?free_gpu_memory = psutil\.virtual_memory\(\)\.available", common, re.S)


def test_the_runtime_reserve_estimate_is_sglang_s():
    hook = source("arg_groups/memory_hook.py")
    for piece in ("reserved_mem = 512", "reserved_mem += activation_tokens * 1.5",
                  "activation_tokens = max(cfg.chunked_prefill_size, 2048)",
                  "reserved_mem += cfg.tp_size * cfg.pp_size / 8 * 1024",
                  "reserved_mem += decode_cuda_graph_config.max_bs * 2",
                  "reserved_mem += 1.5 * 1024",  # MLA prefill graphs
                  "reserved_mem += len(prefill_cuda_graph_config.bs) * 8"):
        assert piece in hook, piece
    assert fit.SGLANG_MLA_PREFILL_GRAPHS_MIB == 1.5 * 1024
    # The capacity brackets behind the defaults fit._sglang_capacity_defaults picks.
    brackets = re.findall(r"gpu_mem < (\d+) \* 1024.*?chunked_prefill_size=(\d+)", hook, re.S)
    assert brackets == [("20", "2048"), ("35", "4096"), ("60", "4096"), ("90", "8192"), ("160", "8192")]
    for gib, chunked in ((16, 2048), (30, 4096), (48, 4096), (80, 8192), (120, 8192), (180, 16384)):
        assert fit._sglang_capacity_defaults(gib * 1024**3, 1)[0] == chunked


def test_the_pool_sizing_sparkit_replays_is_sglang_s():
    """sparkit.memory.sglang_pool follows these lines of SGLang 0.5.23, one by one; an upgrade that
    changes one fails here, naming it."""
    from sparkit.memory import sglang_pool

    configurator = source("mem_cache/kv_cache_configurator.py")
    for piece in (
        "rest_memory = available_gpu_memory - slack_gb - mm_reservation_gb",
        "mamba_budget = (\n                total_rest_memory\n                * get_schedule().mamba_full_memory_ratio\n"
        "                / (1 + get_schedule().mamba_full_memory_ratio)",
        "(mamba_budget_bytes - per_req * (1 + D) - extra_per_slot)\n"
        "                        // (per_req * (1 + D / ratio) + extra_per_slot)",
        "(mamba_budget_bytes - replayssm_fixed_bytes - per_slot)\n                        // per_slot",
        "intermediate_size = per_req * (capped_reqs + 1) * D",
        "(get_schedule().max_mamba_cache_size + 1) * (stage_per_req + extra_per_slot)",
        "f\"Not enough GPU memory for hybrid (mamba/linear-attention) state cache. \"",
        "f\"(total_rest_memory={total_rest_memory:.2f} GB, \"",
        "f\"Loaded weights leave no GPU memory for the KV cache under \"",
        "estimated = max(min(estimated, 4096), 2048)",
        "max_num_reqs = min(requested_per_worker, token_capacity // 2)",
        "mamba_cap = get_schedule().max_mamba_cache_size // ratio",
        "extra_mamba_cache_bytes_per_req: int = 0",
    ):
        assert piece in configurator, piece
    assert f"MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = {sglang_pool.MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO}" \
        in configurator
    sizing = source("mem_cache/allocation_sizing.py")
    assert "return 2 if overlap else 1" in sizing and "if not extra_buffer:\n        return 0" in sizing
    pools = source("model_executor/pool_configurator.py")
    for piece in ("available_bytes // self._cell_size",
                  "draft_kv_size = int(\n                        self._cell_size * draft_num_layers / int(num_layers)"):
        assert piece in pools, piece
    # the pre-capture path: MLA models are never post-capture sized (Ling's KV is MLA)
    assert "if mla_enabled:\n        return False" in source("arg_groups/overrides.py")
    # SGLang's "GB" is 2**30 bytes in the lines sparkit compares with
    assert re.search(r"^GB = 1024 \* 1024 \* 1024$", source("mem_cache/memory_pool.py"), re.M)


def test_sglang_measures_free_memory_with_cuda_s_own_figure_at_its_start():
    """P (pre_model_load_memory) is get_available_gpu_memory: torch.cuda.mem_get_info on a discrete
    GPU, in the engine's process after its CUDA context; sparkit takes NVML's free memory less the
    context it measured (fit.CUDA_CONTEXT_BYTES)."""
    common = source("utils/common.py")
    assert "free_gpu_memory, _ = torch.cuda.mem_get_info(gpu_id)" in common
    boot = source("distributed/bootstrap.py")
    assert "pre_model_load_memory = get_available_gpu_memory(" in boot
    assert 0.5 * 2**30 < fit.CUDA_CONTEXT_BYTES < 1 * 2**30
