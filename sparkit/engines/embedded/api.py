"""Contract between the embedded engine core (engine.py) and its HTTP server (server.py).

The server owns HTTP, queuing and formatting; the engine owns the model, the
KV cache, sampling and speculative decoding. The server calls the engine from
ONE worker thread (batch 1, requests queued), so the engine needs no locking.

Launch flags (server.py parses them; names follow SGLang's where one exists):

    --model-path DIR                  a tiny-ling checkpoint directory (config.json, model.safetensors, tokenizer)
    --served-model-name NAME          default: the directory name
    --host 127.0.0.1 --port 30000
    --device auto|cpu|cuda            auto = cuda when available
    --expert-weights bf16|fp8|mxfp4   format the routed/shared expert weights are quantised to at load
    --lm-head-dtype bf16|fp32|fp8     fp8 = online per-row e4m3 quantisation at load
    --lm-head-exact-top-k K           fp8 head: re-score the K best candidates per row exactly (bf16 copy kept; 0 = off)
    --dtype bfloat16|float32          activation / dense weight dtype (default float32 on cpu, bfloat16 on cuda)
    --speculative-algorithm NEXTN     (or EAGLE, an alias; omitted = no speculation)
    --speculative-num-steps N --speculative-eagle-topk 1 --speculative-num-draft-tokens N+1
    --speculative-draft-model-path DIR   take the NextN layer from another checkpoint (a "wrong draft")
    --context-length N
    --api-key KEY                     (sparkit passes it through the SPARKIT_API_KEY env var instead, never argv)
    --enable-metrics                  accepted for SGLang parity; /metrics is always on
    --seed S
    --max-queued-requests N
The activation report goes to $SPARKIT_REPORT_DIR/activation-tp0.json (sparkit.engines.activation).

Log lines (stdout, one per line, SGLang's wording so that one parser reads both engines):
    "server_args=ServerArgs(...)" or a JSON dump of the resolved args
    "Load weight begin. ..."
    "Load weight end. elapsed=0.42 s, type=TinyLingForCausalLM, quant=fp8, ..."   (target)
    "Load weight end. elapsed=..., type=TinyLingForCausalLMNextN, quant=..., ..."  (draft, when speculative)
    "Decode batch. #running-req: 1, #token: N, accept len: X, gen throughput (token/s): Y"  (every 40 steps)
    "The server is fired up and ready to roll!"
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None  # per-request RNG seed; None = engine's RNG


@dataclass
class StepOutput:
    """What one engine step committed for a request.

    Without speculation each step commits one token. With NEXTN, one verify step
    commits 1..num_steps+1 tokens (accepted drafts + the bonus token).
    """

    token_ids: list[int]  # newly committed tokens (never empty except on a final step with finish)
    verify_step: bool  # True when this step was a speculative verify (counts in spec_verify_ct)
    num_accepted_drafts: int = 0  # drafts accepted in this verify step (len(token_ids) - 1 normally)
    num_proposed_drafts: int = 0
    finished: bool = False
    finish_reason: dict | None = None  # SGLang shape: {"type": "length", "length": N} | {"type": "stop", "matched": id_or_str}


class EngineProtocol(Protocol):
    """What engine.EmbeddedEngine provides to the server."""

    tokenizer: object  # a transformers PreTrainedTokenizerFast (apply_chat_template, decode, encode)
    context_length: int
    model_name: str  # served model name

    def generate(self, input_ids: list[int], params: SamplingParams, cancelled: "CancelFlag") -> Iterator[StepOutput]:
        """Prefill then decode. Yields one StepOutput per step; the last has finished=True.

        Stops early (finish_reason {"type": "abort"}) as soon as `cancelled()` is true,
        freeing all per-request state (KV cache) before returning.
        Stop strings are matched by the server on decoded text; stop_token_ids and EOS by the engine.
        """
        ...

    def server_args(self) -> dict:
        """Resolved args in SGLang's key names (speculative_algorithm, speculative_num_steps, ...,
        moe_runner_backend, quantization, tp_size, ep_size, dtype, device, context_length, ...)."""
        ...

    def activation_report(self) -> "object":
        """A sparkit.engines.activation.ActivationReport built by inspecting the live modules."""
        ...


class CancelFlag(Protocol):
    def __call__(self) -> bool: ...
