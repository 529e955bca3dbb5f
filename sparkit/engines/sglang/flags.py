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

from sparkit.contract.flag_table import ALIASES, SPECULATIVE_NUMBERS, Setting, expected_args, managed_dests, shared

# The NEXTN numbers SGLang 0.5.23 picks for a Bailing (Ling) model when the recipe gives none
# (sglang.srt.arg_groups.speculative_hook._auto_choose_speculative_params).
SPECULATIVE_DEFAULTS = {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
BAILING_ARCHITECTURE = "BailingMoeV2ForCausalLM"


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

    @property
    def spec(self) -> Any:
        return self.recipe.stack.speculative


def _speculative_number(name: str) -> Setting:
    # Passed for NEXTN when the recipe gives them (all three: rule speculative-numbers-all-or-none);
    # without them SGLang picks the model's defaults.
    return shared(f"stack.speculative.{name}", flag="--speculative-" + name.replace("_", "-"),
                  arg=lambda p: getattr(p.spec, name) if p.spec.method == "nextn" and p.spec.num_steps is not None else None,
                  expect=lambda p: getattr(p.spec, name) if p.spec.enabled else None)


def _not_auto(value: str) -> str | None:
    return None if value == "auto" else value


SETTINGS: tuple[Setting, ...] = (
    Setting("model.path", "model_path", flag="--model-path", arg=lambda p: p.model_path),
    Setting("model.path", "revision", flag="--revision", arg=lambda p: p.model_revision or None),
    Setting("model.served_name", "served_model_name", flag="--served-model-name",
            arg=lambda p: p.served_name or None, expect=lambda p: p.served_name or None),
    # sparkit's built-in tiny-ling reaches SGLang as its Hugging Face BailingMoeV2 export, whose
    # configuration class travels with it.
    Setting("model.trust_remote_code", "trust_remote_code", flag="--trust-remote-code",
            arg=lambda p: p.recipe.model.trust_remote_code or bool(p.builds)),
    Setting("model.context_length", "context_length", flag="--context-length",
            arg=lambda p: p.recipe.model.context_length or None),
    Setting("model.dtype", "dtype", flag="--dtype", arg=lambda p: _not_auto(p.recipe.model.dtype)),
    Setting("model.overrides", "json_model_override_args", flag="--json-model-override-args",
            arg=lambda p: json.dumps(p.recipe.model.overrides, separators=(",", ":")) if p.recipe.model.overrides else None),
    Setting("stack.quantization", "quantization", flag="--quantization", arg=lambda p: p.recipe.stack.quantization or None),
    shared("stack.moe_backend", flag="--moe-runner-backend", arg=lambda p: _not_auto(p.recipe.stack.moe_backend),
           expect=lambda p: _not_auto(p.recipe.stack.moe_backend)),
    Setting("stack.lm_head", "enable_fp32_lm_head", flag="--enable-fp32-lm-head",
            arg=lambda p: p.recipe.stack.lm_head == "fp32", expect=lambda p: p.recipe.stack.lm_head == "fp32"),
    # NEXTN runs as EAGLE, and /server_info says so (ALIASES).
    shared("stack.speculative.method", flag="--speculative-algorithm",
           arg=lambda p: p.spec.method.upper() if p.spec.enabled else None,
           expect=lambda p: ALIASES.get(p.spec.method.upper(), p.spec.method.upper()) if p.spec.enabled else None),
    *(_speculative_number(name) for name in SPECULATIVE_NUMBERS),
    shared("stack.speculative.draft_model", flag="--speculative-draft-model-path",
           arg=lambda p: p.draft_path if p.spec.enabled else None, expect=lambda p: p.draft_path if p.spec.enabled else None),
    Setting("stack.speculative.draft_model", "speculative_draft_model_revision", flag="--speculative-draft-model-revision",
            arg=lambda p: p.draft_revision if p.draft_path else None),
    shared("stack.attention_backend", flag="--attention-backend", arg=lambda p: p.recipe.stack.attention_backend or None,
           expect=lambda p: p.recipe.stack.attention_backend or None),
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
