"""How SGLang 0.5.23 sizes its memory pools when it starts, as a function of what it measures.

Followed line by line from the installed source (tests/memory/test_sglang_semantics.py pins every
formula to it), for one GPU, page size 1, no PP/DP/hierarchical cache:

1. `distributed/bootstrap.py measure_pre_model_load_memory`: P = `get_available_gpu_memory`, i.e.
   torch.cuda.mem_get_info's free bytes in the engine's process once its CUDA context exists (on
   an integrated GPU such as GB10, psutil's MemAvailable), before any weight loads.
2. The target's and the draft's weights load (logged `Load weight end ... mem usage=X GB`).
3. `mem_cache/kv_cache_configurator.py _profile_available_bytes`: A = free bytes now (the free
   memory after the weights less PRE_POOL_BYTES);
   rest = A - P x (1 - mem_fraction_static). rest <= 0: "Loaded weights leave no GPU memory for
   the KV cache".
4. Hybrid (KDA / Mamba) models, `_handle_max_mamba_cache`: with `--max-mamba-cache-size` K given,
   K slots (plus, with speculative decoding, per_req x (capped + 1) x D of intermediate state,
   capped = min(max_running_requests, K // ratio)); otherwise
   budget = rest x r / (1 + r) (r = mamba_full_memory_ratio, 0.9) and
   K = (budget - per_req) // per_req, or with speculative decoding
   K = (budget - per_req x (1 + D)) // (per_req x (1 + D / ratio)). K <= 0: "Not enough GPU memory
   for hybrid (mamba/linear-attention) state cache ... total_rest_memory=X GB". rest then loses
   (K + 1) x per_req (each pool has one padding slot) and the intermediate state.
   ratio = state slots per request (`_calculate_mamba_ratio`): 3 with the radix cache, plus the
   extra-buffer strategy's tracking slots (2 with the overlap scheduler, 1 without), 1 without a
   radix cache.
5. `model_executor/pool_configurator.py DefaultPoolConfigurator`: KV tokens = rest // cell, the
   cell being one token's KV over the full-attention layers, plus the EAGLE/NEXTN draft's share
   (cell x draft layers / target layers), capped by `--max-total-tokens`.

Sizes are logged in GiB (SGLang's "GB" is 2**30 bytes). What is left after the pools ("Memory pool
end. avail mem=...") is A minus the pools and the request-to-token table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

GIB = 1 << 30
# SGLang 0.5.23 constants (mem_cache/kv_cache_configurator.py), pinned by the tests.
MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3
MAMBA_FULL_MEMORY_RATIO = 0.9
# Between "Load weight end" and the pool's profile SGLang allocates a little more (logits and
# attention buffers, workspaces): 0.05-0.07 GiB in every H200 log of ../shared/gpu/sglang-h200/logs
# and tests/fixtures/sglang-0.5.23-h200 (the pools they log imply the free memory at the profile).
PRE_POOL_BYTES = int(0.06 * GIB)


@dataclass(frozen=True)
class PoolInputs:
    """What SGLang's pool sizing reads: its two memory measurements, its flags, the model's sizes."""

    pre_model_load_bytes: float  # P: free when the engine started, after its own CUDA context
    available_bytes: float  # free once the target's and draft's weights are loaded ("Load weight end. avail mem")
    mem_fraction_static: float
    kv_cell_bytes: int  # one token's KV over the target's full-attention layers
    kv_layers: int  # the target's full-attention layers
    draft_kv_layers: int = 0  # the EAGLE/NEXTN draft's (its cell is the target's per layer)
    context_len: int = 4096
    max_total_tokens: int | None = None
    max_running_requests: int | None = None  # as resolved (SGLang sets 48 for speculative decoding)
    # linear-attention (KDA) state, per request over all linear layers
    mamba_conv_bytes_per_req: int = 0
    mamba_ssm_bytes_per_req: int = 0
    mamba_full_memory_ratio: float = MAMBA_FULL_MEMORY_RATIO
    max_mamba_cache_size: int | None = None
    radix_cache: bool = True
    extra_buffer: bool = True  # mamba_radix_cache_strategy "extra_buffer" (Bailing V3's resolved default)
    overlap_schedule: bool = True
    spec_draft_tokens: int | None = None  # D, with speculative decoding
    # for the intermediate conv window of a speculative pool (deduplicated sliding windows)
    conv_kernel: int = 4
    conv_channels_per_layer: int = 0  # q, k and v channels of one linear layer
    linear_layers: int = 0
    conv_dtype_bytes: int = 2
    pre_pool_bytes: int = PRE_POOL_BYTES  # what SGLang allocates after the weights, before the profile

    @property
    def hybrid(self) -> bool:
        return self.mamba_conv_bytes_per_req + self.mamba_ssm_bytes_per_req > 0

    @property
    def mamba_bytes_per_req(self) -> int:
        return self.mamba_conv_bytes_per_req + self.mamba_ssm_bytes_per_req


@dataclass
class PoolSizes:
    """What SGLang allocates (or the error it raises), in the terms of its own log lines."""

    rest_bytes: float  # total_rest_memory before the state pool
    mamba_ratio: int | None = None
    max_mamba_cache_size: int | None = None
    conv_state_bytes: int = 0
    ssm_state_bytes: int = 0
    intermediate_ssm_bytes: int = 0
    intermediate_conv_bytes: int = 0
    state_reserved_bytes: float = 0.0  # what the state pool takes out of rest (SGLang's own accounting)
    kv_budget_bytes: float = 0.0
    kv_cell_bytes: int = 0  # target + draft, per token
    kv_tokens: int = 0  # max_total_num_tokens
    kv_bytes: int = 0  # target's pool
    draft_kv_bytes: int = 0
    max_running_requests: int | None = None
    req_to_token_bytes: int = 0
    pool_end_available_bytes: float = 0.0  # "Memory pool end. avail mem"
    error: str | None = None  # SGLang's own message, when it refuses to start
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def log_figures(self) -> dict[str, Any]:
        """The figures as SGLang logs them (GiB with two decimals, counts)."""
        def g(x: float) -> float:
            return round(x / GIB, 2)

        out: dict[str, Any] = {"total_rest_memory_gb": g(self.rest_bytes)}
        if self.max_mamba_cache_size is not None:
            out.update(max_mamba_cache_size=self.max_mamba_cache_size, conv_state_gb=g(self.conv_state_bytes),
                       ssm_state_gb=g(self.ssm_state_bytes))
            if self.intermediate_ssm_bytes:
                out.update(intermediate_ssm_state_cache_gb=g(self.intermediate_ssm_bytes),
                           intermediate_conv_window_cache_gb=g(self.intermediate_conv_bytes))
        if not self.error:
            out.update(kv_tokens=self.kv_tokens, kv_gb=g(self.kv_bytes), max_running_requests=self.max_running_requests,
                       memory_pool_end_avail_gb=g(self.pool_end_available_bytes))
            if self.draft_kv_bytes:
                out["draft_kv_gb"] = g(self.draft_kv_bytes)
        else:
            out["error"] = self.error
        return out


def mamba_ratio(inputs: PoolInputs) -> int:
    """State slots per running request (`_calculate_mamba_ratio`)."""
    if not inputs.radix_cache:
        return 1
    tracking = (2 if inputs.overlap_schedule else 1) if inputs.extra_buffer else 0
    return MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO + tracking


def size_pools(inputs: PoolInputs) -> PoolSizes:
    """SGLang 0.5.23's pool sizes for `inputs` (see the module docstring)."""
    p, f = inputs.pre_model_load_bytes, inputs.mem_fraction_static
    available = inputs.available_bytes - inputs.pre_pool_bytes  # A: what _profile_available_bytes measures
    rest = available - p * (1 - f)
    sizes = PoolSizes(rest_bytes=rest)
    spec = inputs.spec_draft_tokens
    reqs = inputs.max_running_requests
    if inputs.hybrid:
        per_req = inputs.mamba_bytes_per_req
        ratio = mamba_ratio(inputs)
        sizes.mamba_ratio = ratio
        intermediate = 0.0
        if inputs.max_mamba_cache_size is not None:
            k = inputs.max_mamba_cache_size
            if spec:
                capped = min(max(1, reqs or 1), k // ratio)
                intermediate = per_req * (capped + 1) * spec
        elif not inputs.radix_cache and reqs is not None:
            k = max(1, reqs)
            if spec:
                intermediate = per_req * (k + 1) * spec
        else:
            budget = rest * inputs.mamba_full_memory_ratio / (1 + inputs.mamba_full_memory_ratio)
            if spec:
                k = int((budget - per_req * (1 + spec)) // (per_req * (1 + spec / ratio)))
                capped = min(max(1, reqs or 1), k // ratio)
                intermediate = per_req * (capped + 1) * spec
            else:
                k = int((budget - per_req) // per_req)
        rest -= intermediate
        if k <= 0:
            sizes.max_mamba_cache_size = k
            sizes.error = (f"Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
                           f"max_mamba_cache_size={k} (total_rest_memory={rest / GIB:.2f} GB, "
                           f"mamba_cache_per_req={per_req / (1 << 20):.2f} MB)")
            return sizes
        sizes.max_mamba_cache_size = k
        sizes.conv_state_bytes = (k + 1) * inputs.mamba_conv_bytes_per_req
        sizes.ssm_state_bytes = (k + 1) * inputs.mamba_ssm_bytes_per_req
        if spec:
            capped = min(max(1, reqs or 1), k // ratio)
            sizes.intermediate_ssm_bytes = inputs.mamba_ssm_bytes_per_req * (capped + 1) * spec
            sizes.intermediate_conv_bytes = (inputs.linear_layers * (capped + 1) * inputs.conv_channels_per_layer
                                             * (spec + inputs.conv_kernel - 2) * inputs.conv_dtype_bytes)
        sizes.state_reserved_bytes = (k + 1) * per_req + intermediate
        rest -= (k + 1) * per_req
    if rest <= 0:
        minimum = 1 - available / p if p else 1.0
        sizes.error = (f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={f}. "
                       f"Raise --mem-fraction-static above {-(-minimum * 1000 // 1) / 1000:.3f}")
        return sizes
    draft_cell = int(inputs.kv_cell_bytes * inputs.draft_kv_layers / inputs.kv_layers) if inputs.kv_layers else 0
    cell = inputs.kv_cell_bytes + draft_cell
    sizes.kv_budget_bytes = rest
    sizes.kv_cell_bytes = cell
    tokens = int(rest // cell) if cell else (inputs.max_total_tokens or inputs.context_len)
    if inputs.max_total_tokens is not None:
        tokens = min(tokens, inputs.max_total_tokens)
    sizes.kv_tokens = tokens
    sizes.kv_bytes = tokens * inputs.kv_cell_bytes
    sizes.draft_kv_bytes = tokens * draft_cell
    # resolve_max_num_reqs
    if reqs is not None:
        running = min(max(1, reqs), tokens // 2)
    else:
        estimated = max(min(int(tokens / inputs.context_len * 512), 4096), 2048)
        running = min(estimated, tokens // 2)
    if inputs.hybrid and sizes.max_mamba_cache_size and sizes.mamba_ratio:
        cap = sizes.max_mamba_cache_size // sizes.mamba_ratio
        if cap < running:
            sizes.notes.append(f"max_running_requests is capped to {cap} by the mamba state cache")
            running = cap
    sizes.max_running_requests = running
    # ReqToTokenPool: (requests + 1) rows of the context length (+ a few speculative slots), int32
    sizes.req_to_token_bytes = (running + 1) * (inputs.context_len + 4 * (spec or 0)) * 4
    pools = (sizes.conv_state_bytes + sizes.ssm_state_bytes + sizes.intermediate_ssm_bytes + sizes.intermediate_conv_bytes
             + sizes.kv_bytes + sizes.draft_kv_bytes + sizes.req_to_token_bytes)
    sizes.pool_end_available_bytes = available - pools
    return sizes


__all__ = ["PoolInputs", "PoolSizes", "size_pools", "mamba_ratio", "GIB"]
