"""What one request does to the model's logits before a token is chosen from them, in SGLang
0.5.23's order (sglang/srt/sampling/sampling_batch_info.py `apply_logits_bias`, penaltylib/):

  1. additive penalties over the tokens the request generated so far (not its prompt, as
     SGLang's penalizers): `- frequency_penalty * count - presence_penalty * (count > 0)`, and
     while fewer than `min_new_tokens` are out, every stop token (stop_token_ids and EOS) at -inf;
  2. the repetition penalty, scaling the logits of generated tokens (`x * p` where x < 0,
     `x / p` elsewhere);
  3. the grammar's mask (tokens the grammar forbids at -inf);
  4. logit_bias, added.

Temperature, top-k, top-p and min-p then act on the result (speculative.logits_to_probs), and the
logprobs a request returns are of it, as SGLang's sampler computes them from these logits.

Speculative decoding: one verify forward scores k drafts at once; row j must be the logits as
plain decoding would have seen them after drafts[:j] were committed. `rows(logits, drafts)`
gives exactly that: each row's penalty counts include the drafts before it, and the grammar
matcher is advanced through the drafts as far as the grammar allows them (its mask for row j
is the one after drafts[:j]). A draft the grammar refuses gets probability 0 in its row, so it
is rejected there and the rows after it are never used. `begin_commit` then rolls the matcher
back to the committed state and `accept` advances it through what was really committed
(accepted drafts and the bonus token): the matcher never keeps a rejected draft. (SGLang itself
relaxes penalties under speculation: every verify row gets the penalties of the step's start;
here each row has its own, so greedy NEXTN output equals plain greedy output with penalties as
without.) The draft proposes from its own logits, unconstrained, as SGLang's does.
"""

from __future__ import annotations

from typing import Any

import torch

from sparkit.engines.embedded.api import SamplingParams


class LogitRules:
    """A request's penalties, grammar and bias, with the state they need (the generated tokens'
    counts, the grammar matcher). `active` is False when none applies: the logits pass as they are."""

    def __init__(self, params: SamplingParams, vocab_size: int, stop_ids: set[int], device: Any) -> None:
        self.params = params
        self.vocab_size = vocab_size
        self.device = device
        self.penalised = bool(params.frequency_penalty or params.presence_penalty or params.repetition_penalty != 1.0)
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device) if self.penalised else None
        self.generated = 0
        self.min_new = params.min_new_tokens or 0
        self.stop_ids = torch.tensor(sorted(i for i in stop_ids if 0 <= i < vocab_size), dtype=torch.long, device=device)
        self.bias = None
        if params.logit_bias:
            self.bias = torch.zeros(vocab_size, dtype=torch.float32, device=device)
            for token, value in params.logit_bias.items():
                if 0 <= int(token) < vocab_size:
                    self.bias[int(token)] = float(value)
        self.matcher = params.grammar.matcher() if params.grammar is not None else None
        self._bitmask = None
        self._advanced = 0  # drafts the matcher was advanced through by the last rows()
        self.active = self.penalised or self.min_new > 0 or self.bias is not None or self.matcher is not None

    @property
    def terminated(self) -> bool:
        return self.matcher is not None and self.matcher.is_terminated()

    def rows(self, logits: torch.Tensor, drafts: list[int] = ()) -> torch.Tensor:
        """logits [n, V] (float32), row j scored after drafts[:j] (n = len(drafts) + 1, or 1) ->
        the logits each position's token is chosen from."""
        if not self.active:
            return logits
        drafts = list(drafts)
        n = logits.shape[0]
        out = logits.clone()
        p = self.params
        if self.penalised:
            counts = self.counts.expand(n, -1).clone()
            for j in range(1, n):
                counts[j:, drafts[j - 1]] += 1.0
            if p.frequency_penalty:
                out -= p.frequency_penalty * counts
            if p.presence_penalty:
                out -= p.presence_penalty * (counts > 0).float()
        if self.min_new and self.stop_ids.numel():
            for j in range(n):
                if self.generated + j < self.min_new:
                    out[j, self.stop_ids] = float("-inf")
        if self.penalised and p.repetition_penalty != 1.0:
            scaled = torch.where(out < 0, out * p.repetition_penalty, out / p.repetition_penalty)
            out = torch.where(counts > 0, scaled, out)
        if self.matcher is not None:
            out = self._mask(out, drafts)
        if self.bias is not None:
            out += self.bias
        return out

    def _mask(self, out: torch.Tensor, drafts: list[int]) -> torch.Tensor:
        from sparkit.engines.embedded.grammar import allocate_bitmask, bitmask_to_allowed

        n = out.shape[0]
        self.begin_commit()  # a previous rows() may have left the matcher advanced
        if self._bitmask is None or self._bitmask.shape[0] < n:
            self._bitmask = allocate_bitmask(max(n, 1), self.vocab_size)
        bitmask = self._bitmask[:n]
        bitmask.fill_(-1)  # all allowed: rows after a refused draft or a finished grammar are never used
        for j in range(n):
            if self.matcher.is_terminated():
                break
            self.matcher.fill_next_token_bitmask(bitmask, j)
            if j == n - 1 or not self.matcher.accept_token(int(drafts[j])):
                break
            self._advanced += 1
        allowed = bitmask_to_allowed(bitmask, self.vocab_size).to(out.device)
        return out.masked_fill(~allowed[:, : out.shape[1]], float("-inf"))

    def begin_commit(self) -> None:
        """Undo the drafts rows() advanced the matcher through (the committed state again)."""
        if self.matcher is not None and self._advanced:
            self.matcher.rollback(self._advanced)
        self._advanced = 0

    def accept(self, token: int) -> None:
        """`token` is committed: counted for the penalties, fed to the grammar."""
        self.generated += 1
        if self.counts is not None and 0 <= token < self.vocab_size:
            self.counts[token] += 1.0
        if self.matcher is not None and not self.matcher.is_terminated():
            if not self.matcher.accept_token(int(token)):
                # only a token the mask allowed is ever chosen; anything else is a bug here
                raise RuntimeError(f"token {token} was committed but the grammar does not accept it")


def min_p_filter(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    """SGLang's min-p: drop tokens whose probability is below min_p times the row's highest."""
    if not min_p:
        return probs
    keep = probs >= probs.max(dim=-1, keepdim=True).values * min_p
    probs = probs * keep
    return probs / probs.sum(dim=-1, keepdim=True)
