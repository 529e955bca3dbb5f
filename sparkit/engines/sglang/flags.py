"""SGLang's settings table: recipe key -> `sglang.launch_server` flag -> resolved-args name ->
what /server_info must report (the shape: sparkit.contract.flag_table).

The adapter's argv is the table's rows in order (`command_line`), then the recipe's pass-through
flags; MANAGED_DESTS (the destinations a pass-through flag may not repeat) and the expected server
args (`expected_args`) come from the same rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sparkit.contract.flag_table import (
    ALIASES,
    SPECULATIVE_NUMBERS,
    Setting,
    expected_args,
    managed_dests,
    shared,
)

# The architecture SGLANG's NEXTN defaults (SPECULATIVE_DEFAULTS) are pinned for (a test asks the
# installed SGLang what it picks for it).
BAILING_ARCHITECTURE = "BailingMoeV2ForCausalLM"
# The Ling patch's own FP8 head switch (in the registry of a patched sglang, absent from 0.5.23).
FP8_LM_HEAD_ENV = "SGLANG_ENABLE_FP8_LM_HEAD"


@dataclass
class Planned:
    """What a launch resolved before its command line: where the models are read from (a pulled
    snapshot, a built-in export, the path as written), the name served, the port."""

    recipe: Any  # sparkit.recipes.schema.Recipe
    port: int
    model_path: str
    model_revision: str | None = None
    served_name: str | None = None
    draft_path: str | None = None
    draft_revision: str | None = None
    builds: list[dict[str, Any]] = field(default_factory=list)  # built-in models (sparkit.engines.builtin_models)
    pulls: list[dict[str, Any]] = field(default_factory=list)  # hub models (sparkit.hub.cache.plan_hub_model)
    # DSpark: the draft config's block_size (None: not readable at plan time), and the attention
    # backends the installed kernels run for the target and the draft (None: SGLang's choice)
    draft_block_size: int | None = None
    attention_backend: str | None = None
    draft_attention_backend: str | None = None
    attention_note: str = ""  # why those backends (compat.AttentionPick.reason)

    @property
    def spec(self) -> Any:
        return self.recipe.stack.speculative

    @property
    def dspark(self) -> bool:
        return self.spec.method == "dspark"

    @property
    def block_size(self) -> int | None:
        """DSpark: the block the server drafts (the recipe's, else the draft's)."""
        return (self.spec.block_size or self.draft_block_size) if self.dspark else None


def _expected_number(name: str, p: Planned) -> int | None:
    """NEXTN: the recipe's number; DSpark: SGLang's resolution (_handle_dspark: 1 step, topk 1,
    block_size + 1 draft tokens)."""
    if not p.dspark:
        return getattr(p.spec, name) if p.spec.enabled else None
    if name == "num_draft_tokens":
        return p.block_size + 1 if p.block_size else None
    return 1


def _speculative_number(name: str) -> Setting:
    # Passed for NEXTN when the recipe gives them (all three: rule speculative-numbers-all-or-none);
    # without them SGLang picks the model's defaults.
    return shared(f"stack.speculative.{name}", flag="--speculative-" + name.replace("_", "-"),
                  arg=lambda p: getattr(p.spec, name) if p.spec.method == "nextn" and p.spec.num_steps is not None else None,
                  expect=lambda p: _expected_number(name, p))


def _not_auto(value: str) -> str | None:
    return None if value == "auto" else value


SETTINGS: tuple[Setting, ...] = (
    shared("model.path", flag="--model-path", arg=lambda p: p.model_path),
    Setting("model.path", "revision", flag="--revision", arg=lambda p: p.model_revision or None),
    shared("model.served_name", flag="--served-model-name",
           arg=lambda p: p.served_name or None, expect=lambda p: p.served_name or None),
    # sparkit's built-in tiny-ling reaches SGLang as its Hugging Face BailingMoeV2 export, whose
    # configuration class travels with it.
    Setting("model.trust_remote_code", "trust_remote_code", flag="--trust-remote-code",
            arg=lambda p: p.recipe.model.trust_remote_code or bool(p.builds)),
    Setting("model.context_length", "context_length", flag="--context-length",
            arg=lambda p: p.recipe.model.context_length or None),
    shared("model.dtype", flag="--dtype", arg=lambda p: _not_auto(p.recipe.model.dtype)),
    Setting("model.overrides", "json_model_override_args", flag="--json-model-override-args",
            arg=lambda p: json.dumps(p.recipe.model.overrides, separators=(",", ":")) if p.recipe.model.overrides else None),
    Setting("stack.quantization", "quantization", flag="--quantization", arg=lambda p: p.recipe.stack.quantization or None,
            label="quantization"),
    shared("stack.moe_backend", flag="--moe-runner-backend", arg=lambda p: _not_auto(p.recipe.stack.moe_backend),
           expect=lambda p: _not_auto(p.recipe.stack.moe_backend)),
    Setting("stack.lm_head", "enable_fp32_lm_head", flag="--enable-fp32-lm-head",
            arg=lambda p: p.recipe.stack.lm_head == "fp32", expect=lambda p: p.recipe.stack.lm_head == "fp32",
            label="fp32 lm_head"),
    Setting("stack.kv_cache_dtype", "kv_cache_dtype", flag="--kv-cache-dtype",
            arg=lambda p: _not_auto(p.recipe.stack.kv_cache_dtype), expect=lambda p: _not_auto(p.recipe.stack.kv_cache_dtype),
            label="KV cache", provides="kv_cache_dtype"),
    # NEXTN runs as EAGLE, and /server_info says so (ALIASES).
    shared("stack.speculative.method", flag="--speculative-algorithm",
           arg=lambda p: p.spec.method.upper() if p.spec.enabled else None,
           expect=lambda p: ALIASES.get(p.spec.method.upper(), p.spec.method.upper()) if p.spec.enabled else None),
    *(_speculative_number(name) for name in SPECULATIVE_NUMBERS),
    shared("stack.speculative.draft_model", flag="--speculative-draft-model-path",
           arg=lambda p: p.draft_path if p.spec.enabled else None, expect=lambda p: p.draft_path if p.spec.enabled else None),
    Setting("stack.speculative.draft_model", "speculative_draft_model_revision", flag="--speculative-draft-model-revision",
            arg=lambda p: p.draft_revision if p.draft_path else None),
    Setting("stack.speculative.block_size", "speculative_dspark_block_size", flag="--speculative-dspark-block-size",
            arg=lambda p: p.spec.block_size if p.dspark else None),
    # DSpark: the backend the installed sgl_kernel runs (compat.dspark_attention_backends), else the recipe's
    shared("stack.attention_backend", flag="--attention-backend",
           arg=lambda p: p.attention_backend or p.recipe.stack.attention_backend or None,
           expect=lambda p: p.attention_backend or p.recipe.stack.attention_backend or None),
    Setting("stack.attention_backend", "speculative_draft_attention_backend", flag="--speculative-draft-attention-backend",
            arg=lambda p: p.draft_attention_backend, expect=lambda p: p.draft_attention_backend),
    shared("stack.tp", flag="--tp-size", arg=lambda p: p.recipe.stack.tp if p.recipe.stack.tp != 1 else None,
           expect=lambda p: p.recipe.stack.tp),
    shared("stack.ep", flag="--ep-size", arg=lambda p: p.recipe.stack.ep if p.recipe.stack.ep != 1 else None,
           expect=lambda p: p.recipe.stack.ep),
    shared("server.mem_fraction_static", flag="--mem-fraction-static", arg=lambda p: p.recipe.server.mem_fraction_static,
           expect=lambda p: p.recipe.server.mem_fraction_static),
    Setting("server.max_running_requests", "max_running_requests", flag="--max-running-requests",
            arg=lambda p: p.recipe.server.max_running_requests),
    # CUDA graphs are passed only to turn them off; a pass-through of these flags is accepted.
    Setting("server.cuda_graph.enabled", "cuda_graph_backend_decode", flag="--cuda-graph-backend-decode", managed=False,
            arg=lambda p: None if p.recipe.server.cuda_graph.enabled else "disabled"),
    Setting("server.cuda_graph.enabled", "cuda_graph_backend_prefill", flag="--cuda-graph-backend-prefill", managed=False,
            arg=lambda p: None if p.recipe.server.cuda_graph.enabled else "disabled"),
    Setting("server.cuda_graph.prefill", "disable_prefill_cuda_graph", flag="--disable-prefill-cuda-graph", managed=False,
            arg=lambda p: p.recipe.server.cuda_graph.enabled and not p.recipe.server.cuda_graph.prefill),
    Setting("server.cuda_graph.max_bs_decode", "cuda_graph_max_bs_decode", flag="--cuda-graph-max-bs-decode",
            arg=lambda p: p.recipe.server.cuda_graph.max_bs_decode or None),
    Setting("server.cuda_graph.max_bs_prefill", "cuda_graph_max_bs_prefill", flag="--cuda-graph-max-bs-prefill",
            arg=lambda p: p.recipe.server.cuda_graph.max_bs_prefill or None),
    Setting("server.enable_metrics", "enable_metrics", flag="--enable-metrics", arg=lambda p: p.recipe.server.enable_metrics),
    # Asserted only when the recipe sets them: SGLang's defaults (off, unbounded, no parser) are
    # what every other recipe runs, and /server_info reports them either way.
    Setting("server.constrained_json.disable_any_whitespace", "constrained_json_disable_any_whitespace",
            flag="--constrained-json-disable-any-whitespace",
            arg=lambda p: p.recipe.server.constrained_json.disable_any_whitespace,
            expect=lambda p: p.recipe.server.constrained_json.disable_any_whitespace or None),
    Setting("server.constrained_json.max_whitespace_cnt", "constrained_json_max_whitespace_cnt",
            flag="--constrained-json-max-whitespace-cnt", arg=lambda p: p.recipe.server.constrained_json.max_whitespace_cnt,
            expect=lambda p: p.recipe.server.constrained_json.max_whitespace_cnt),
    Setting("server.tool_call_parser", "tool_call_parser", flag="--tool-call-parser",
            arg=lambda p: p.recipe.server.tool_call_parser, expect=lambda p: p.recipe.server.tool_call_parser),
    Setting("server.host", "host", flag="--host", arg=lambda p: p.recipe.server.host),
    Setting("server.port", "port", flag="--port", arg=lambda p: p.port),
    # No value from the table: the key reaches SGLang in a private --config file (deliver_secret).
    Setting("server.api_key_env", "api_key", flag="--api-key"),
)

# Resolved-args names sparkit sets from recipe keys: a pass-through flag with the same
# destination would fight the recipe, so it is an error naming the key to use instead.
MANAGED_DESTS: dict[str, str] = managed_dests(SETTINGS)
# The same, by the flag's spelled-out name (what is recognised without SGLang's parser).
MANAGED_FLAGS: dict[str, str] = {row.flag: row.key for row in SETTINGS if row.dest in MANAGED_DESTS and row.flag}


def server_args(planned: Planned) -> dict[str, Any]:
    """The resolved args /server_info must report for this launch."""
    return expected_args(SETTINGS, planned)
