"""Contract between the embedded engine core (engine.py) and its HTTP server (server.py).

The server owns HTTP, queuing and formatting; the engine owns the model, the
KV cache, sampling and speculative decoding. The server calls the engine from
ONE worker thread (batch 1, requests queued), so the engine needs no locking.

Launch flags: declared once in settings.py (EngineConfig, ServerOptions); `python -m
sparkit.engines.embedded --help` lists them. sparkit passes an API key through the SPARKIT_API_KEY
environment variable, never argv, and only when the recipe names one (sparkit.api_key).
The activation report goes to $SPARKIT_REPORT_DIR/activation-tp0.json (sparkit.engines.activation_report).

Log lines (stdout, one per line, SGLang's wording so that one parser reads both engines):
    "server_args=ServerArgs(...)" or a JSON dump of the resolved args
    "Load weight begin. ..."
    "Load weight end. elapsed=0.42 s, type=TinyLingForCausalLM, quant=fp8, ..."   (target)
    "Load weight end. elapsed=..., type=TinyLingForCausalLMNextN, quant=..., ..."  (draft, when speculative)
    "Decode batch. #running-req: 1, #token: N, accept len: X, gen throughput (token/s): Y"  (every 40 steps)
    "The server is fired up and ready to roll!"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class SamplingParams:
    """SGLang's sampling parameters as the engine applies them (logits.py says in which order)."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    min_p: float = 0.0
    max_new_tokens: int = 128
    min_new_tokens: int = 0  # stop tokens (EOS, stop_token_ids) are forbidden until this many are out
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    grammar: Any = None  # a grammar.Grammar: the output must match it
    seed: int | None = None  # per-request RNG seed; None = engine's RNG


@dataclass
class LogprobRequest:
    """Which log-probabilities a request wants (SGLang's return_logprob / logprob_start_len /
    top_logprobs_num). Output tokens' logprobs always come with it; prompt positions from
    `input_start` on (None: none; position 0 has no logprob, nothing precedes it)."""

    input_start: int | None = None
    top: int = 0  # the top-N alternatives per position, besides the chosen token (0 = none)


@dataclass
class TokenLogprobs:
    """Log-probabilities of some positions under the target model: `logprobs[i]` is that of
    `token_ids[i]` (None for the first prompt token), `top[i]` the N best (logprob, id) there
    (None where logprobs[i] is None; absent when not asked for)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    top: list[list[tuple[float, int]] | None] | None = None

    def extend(self, other: TokenLogprobs) -> None:
        self.token_ids += other.token_ids
        self.logprobs += other.logprobs
        if other.top is not None:
            self.top = (self.top or []) + other.top

    def truncate(self, n: int) -> None:
        del self.token_ids[n:], self.logprobs[n:]
        if self.top is not None:
            del self.top[n:]


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
    # with a LogprobRequest: the committed tokens' logprobs (one per token_ids entry), and on the
    # first step the prompt's (LogprobRequest.input_start on)
    logprobs: TokenLogprobs | None = None
    input_logprobs: TokenLogprobs | None = None


class CancelFlag(Protocol):
    def __call__(self) -> bool: ...
