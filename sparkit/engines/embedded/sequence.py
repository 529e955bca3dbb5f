"""One request's state in the embedded engine (EmbeddedEngine.open): its tokens, its KV caches, its
sampling RNG, its logit rules and finish rules, how far its prompt is prefilled, and the logprobs
it asked for. Everything here is the request's own: a sequence decoded among others computes
exactly what it computes alone."""

from __future__ import annotations

from typing import Any

import torch

from sparkit.engines.embedded.api import LogprobRequest, SamplingParams, StepOutput, TokenLogprobs
from sparkit.engines.embedded.logits import LogitRules
from sparkit.engines.embedded.speculative import is_greedy, logits_to_probs, sample
from sparkit.models.profiler_spans import span


class Sequence:
    """A generation: committed tokens, RNG, finish rules, KV cache slots (released by the engine)."""

    def __init__(self, engine: Any, prompt: list[int], params: SamplingParams, generator,
                 logprobs: LogprobRequest | None, target_cache, draft_cache=None, drafter=None):
        self.engine, self.params, self.generator = engine, params, generator
        self.want = logprobs
        self.seq = prompt
        self.prompt_len = len(prompt)
        self.greedy = is_greedy(params)
        self.stop_ids = set(params.stop_token_ids or [])
        if not params.ignore_eos:
            self.stop_ids.add(engine.model_config.eos_token_id)
        self.max_new = params.max_new_tokens if params.max_new_tokens is not None else engine.context_length
        self.device = engine.device
        # penalties, min_new_tokens, grammar, logit_bias (min_new_tokens holds back EOS even under ignore_eos)
        self.rules = LogitRules(params, engine.vocab_limit, set(params.stop_token_ids or []) | {engine.model_config.eos_token_id},
                                engine.device)
        self.target_cache, self.draft_cache, self.drafter = target_cache, draft_cache, drafter
        self.prefilled = 0  # prompt tokens in the target's KV cache
        self.finished = False
        self.input_logprobs: TokenLogprobs | None = None  # gathered chunk by chunk

    @property
    def generated(self) -> int:
        return len(self.seq) - self.prompt_len

    @property
    def decoding(self) -> bool:
        """The prompt is in and the first token chosen: decode steps from here on."""
        return self.prefilled == self.prompt_len and not self.finished and self.generated > 0

    @property
    def prefill_only(self) -> bool:
        """max_new_tokens 0: nothing to generate; the prompt runs only when its logprobs are wanted."""
        return self.max_new == 0

    def next_chunk(self, chunk_size: int) -> int:
        """Prompt tokens in this sequence's next prefill chunk: the chunks start at multiples of
        chunk_size, so a prompt is cut the same way whatever else is running."""
        left = self.prompt_len - self.prefilled
        return left if chunk_size < 1 else min(left, chunk_size)

    def pick(self, logits) -> int:
        """A token from one row of logits the request's rules have already processed."""
        with span("sampling"):
            if self.greedy:
                return int(logits.argmax())
            return int(sample(logits_to_probs(logits[None], self.params), self.generator)[0])

    def pick_from_draft(self, logits) -> int:
        return int(sample(logits_to_probs(logits[None].float(), self.params), self.generator)[0])

    def commit(self, tokens: list[int]) -> tuple[list[int], dict | None]:
        """Append tokens up to the first finish condition; returns (committed, finish_reason).
        SGLang's order: a stop token, then the length, then a grammar that has terminated."""
        out = []
        self.rules.begin_commit()
        for t in tokens:
            out.append(t)
            self.seq.append(t)
            self.rules.accept(t)
            if t in self.stop_ids:
                return self._finish(out, {"type": "stop", "matched": t})
            if self.generated >= self.max_new:
                return self._finish(out, {"type": "length", "length": self.max_new})
            if self.rules.terminated:
                return self._finish(out, {"type": "stop", "matched": t})
        if len(self.seq) >= self.engine.context_length:
            return self._finish(out, {"type": "length", "length": self.generated})
        return out, None

    def _finish(self, out: list[int], reason: dict) -> tuple[list[int], dict]:
        self.finished = True
        return out, reason

    def first_output(self, logits, token: int) -> StepOutput:
        """Commit the first token (chosen from the prompt's last logits) and say so."""
        committed, finish = self.commit([token])
        return StepOutput(committed, verify_step=False, finished=finish is not None, finish_reason=finish,
                          logprobs=self.output_logprobs(logits, committed), input_logprobs=self.input_logprobs)

    def ended(self, reason: dict) -> StepOutput:
        """A final step that commits nothing (max_new_tokens 0, the context full before a verify)."""
        self.finished = True
        return StepOutput([], verify_step=False, finished=True, finish_reason=reason, input_logprobs=self.input_logprobs)

    # -- logprobs: the target's, from the logits each committed token was chosen from

    def output_logprobs(self, logits, tokens: list[int]) -> TokenLogprobs | None:
        """logits [>= len(tokens), V]: row i is where tokens[i] was chosen. Greedy: log_softmax of
        the logits; sampling: of logits / temperature (SGLang's sampler returns those)."""
        if self.want is None or not tokens:
            return None
        from sparkit.engines.embedded.speculative import GREEDY_EPS

        rows = logits[: len(tokens)]
        if not self.greedy:
            rows = rows / max(self.params.temperature, GREEDY_EPS)
        # a token the grammar or min_new_tokens forbids has logprob -inf: JSON has no such number,
        # so it reads as float32's lowest (SGLang clamps the same way)
        rows = rows.log_softmax(-1).clamp(min=torch.finfo(torch.float32).min)
        return pick_logprobs(rows, tokens, self.want.top)

    def add_input_logprobs(self, target_logits, hidden, first_row: int) -> None:
        """The prompt's logprobs from position want.input_start on that a prefill chunk's hidden
        states [1, n, H] (positions first_row ..) give (raw logits, as SGLang's input logprobs);
        position 0 has none."""
        if self.want is None or self.want.input_start is None:
            return
        start, n = self.want.input_start, self.prompt_len
        if self.input_logprobs is None:
            self.input_logprobs = TokenLogprobs(top=[] if self.want.top else None)
        out = self.input_logprobs
        if start >= n:
            return
        if start == 0 and first_row == 0:
            out.token_ids.append(self.seq[0])
            out.logprobs.append(None)
            if out.top is not None:
                out.top.append(None)
        # row r (position first_row + r) gives the logprob of the token after it
        lo, hi = max(start, 1, first_row + 1), min(n, first_row + hidden.shape[1] + 1)
        if lo < hi:
            rows = target_logits(hidden[:, lo - 1 - first_row : hi - 1 - first_row]).log_softmax(-1)
            out.extend(pick_logprobs(rows, self.seq[lo:hi], self.want.top))


def pick_logprobs(rows, tokens: list[int], top: int) -> TokenLogprobs:
    """rows [n, V] of logprobs: row i's value at tokens[i], and its `top` best (value, id). A token
    at float32's lowest (what a grammar's mask or min_new_tokens forbids, clamped) is no
    alternative: a row lists fewer than `top` when fewer are allowed."""
    index = torch.tensor(tokens, device=rows.device).view(-1, 1)
    chosen = rows.gather(1, index).view(-1).tolist()
    best = None
    if top:
        forbidden = torch.finfo(torch.float32).min
        values, ids = rows.topk(min(top, rows.shape[-1]), dim=-1)
        best = [[(value, tid) for value, tid in zip(v, i) if value > forbidden]
                for v, i in zip(values.tolist(), ids.tolist())]
    return TokenLogprobs(list(tokens), chosen, best)
