"""NEXTN (MTP) speculative decoding: sampling, drafting with the NextN layer, and verification.

Per round, with the last committed token x_m not yet in the target's KV cache:
  1. the draft proposes d_1..d_k (k = num_steps): d_1 from the MTP output at position m-1
     (target hidden h_{m-1} + embedding of x_m), then each next one chained on the MTP layer's
     own hidden state (EAGLE-style, topk 1);
  2. the target runs ONE forward over [x_m, d_1..d_k] (positions m..m+k);
  3. greedy: accept the longest prefix where d_j equals the target's argmax, plus the target's
     token at the first mismatch (the bonus). Sampling: standard speculative rejection sampling
     (accept d_j with probability min(1, p/q), else resample from norm(max(0, p - q))), which
     keeps the target's distribution exactly;
  4. both KV caches roll back to the committed length; the draft then re-runs ("extends") over
     the newly committed positions with the target's real hidden states, which also yields d_1
     of the next round.
"""

from __future__ import annotations

import torch

GREEDY_EPS = 1e-5  # SGLang treats temperature below this as greedy


def is_greedy(params) -> bool:
    return params.temperature < GREEDY_EPS or params.top_k == 1


def logits_to_probs(logits, params):
    """Temperature, top-k, top-p (nucleus), softmax, min-p. logits [N, V] float32 -> probs [N, V]."""
    logits = logits / max(params.temperature, GREEDY_EPS)
    if params.top_k is not None and params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    if params.top_p is not None and params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        cumulative = sorted_probs.cumsum(dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop_sorted = (cumulative - sorted_probs) >= params.top_p
        # A top_p below float32's resolution (1e-300 rounds to 0) would drop every token and leave
        # nothing to sample (NaN probabilities): the most likely token always stays.
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if getattr(params, "min_p", 0.0):
        from sparkit.engines.embedded.logits import min_p_filter

        probs = min_p_filter(probs, params.min_p)
    return probs


def sample(probs, generator) -> torch.Tensor:
    """One token per row of probs [N, V] -> [N]."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def verify_greedy(draft_tokens: list[int], target_argmax: list[int]) -> tuple[int, int]:
    """(number of accepted drafts, bonus token). target_argmax has len(draft_tokens) + 1 entries."""
    accepted = 0
    for d, t in zip(draft_tokens, target_argmax):
        if d != t:
            break
        accepted += 1
    return accepted, target_argmax[accepted]


def verify_rejection(draft_tokens: list[int], draft_probs, target_probs, generator) -> tuple[int, int]:
    """Speculative rejection sampling. draft_probs [k, V] (what each draft was sampled from),
    target_probs [k+1, V]. Returns (accepted, next token): the emitted sequence
    draft_tokens[:accepted] + [token] is distributed exactly as sampling from the target."""
    k = len(draft_tokens)
    if k:
        idx = torch.tensor(draft_tokens, device=target_probs.device)
        rows = torch.arange(k, device=target_probs.device)
        p = target_probs[rows, idx]
        q = draft_probs[rows, idx]
        u = torch.rand(k, generator=generator, device=target_probs.device)
        # accept when u * q < p  (i.e. u < p / q, without dividing by a zero q)
        reject = (u * q >= p).tolist()
    else:
        reject = []
    for j, rejected in enumerate(reject):
        if rejected:
            residual = (target_probs[j] - draft_probs[j]).clamp(min=0)
            total = residual.sum()
            dist = residual / total if total > 0 else target_probs[j]
            return j, int(sample(dist[None], generator)[0])
    return k, int(sample(target_probs[k][None], generator)[0])


class NextnDrafter:
    """Drafts with a NextN layer (TinyLingForCausalLMNextN) over its own KV cache."""

    def __init__(self, draft, num_steps: int, cache):
        self.draft, self.num_steps, self.cache = draft, num_steps, cache
        self.next_hidden = None  # MTP hidden at the last committed position (chain start)
        self.next_logits = None  # its logits: the distribution of d_1

    def reset(self) -> None:
        self.cache.length = 0
        self.next_hidden = self.next_logits = None

    def extend(self, target_hidden, next_ids, start: int) -> None:
        """Run the NextN layer over committed positions start.. with the target's hidden states
        [1, n, H] and the ids of the tokens that follow them [1, n]."""
        self.cache.truncate(min(self.cache.length, start))
        out = self.draft.forward_hidden(target_hidden, next_ids, self.cache, start, last_only=True)
        self.cache.length = start + next_ids.shape[1]
        self.next_hidden = out[:, -1:]
        self.next_logits = self.draft.logits(self.next_hidden)[0, -1]

    def propose(self, pick, vocab_limit: int) -> tuple[list[int], list]:
        """k draft tokens (and the per-step logits they were picked from). `pick(logits)` chooses
        a token (argmax or a sample). The chain's cache entries are scratch: the next `extend`
        truncates them away."""
        tokens, logits_list = [], []
        logits, hidden = self.next_logits, self.next_hidden
        pos = self.cache.length
        for step in range(self.num_steps):
            logits = logits[..., :vocab_limit]  # ids past the tokenizer's vocabulary are never proposed
            token = pick(logits)
            tokens.append(token)
            logits_list.append(logits)
            if step + 1 == self.num_steps:
                break
            ids = torch.tensor([[token]], device=hidden.device)
            hidden = self.draft.forward_hidden(hidden, ids, self.cache, pos)
            pos += 1
            logits = self.draft.logits(hidden)[0, -1]
        return tokens, logits_list

