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
    """One sequence's NextN draft state: its own KV cache, and the MTP hidden state and logits at
    its last committed position (where the next round's chain starts)."""

    def __init__(self, draft, num_steps: int, cache):
        self.draft, self.num_steps, self.cache = draft, num_steps, cache
        self.next_hidden = None  # [1, H]: MTP hidden at the last committed position (chain start)
        self.next_logits = None  # its logits: the distribution of d_1

    def reset(self) -> None:
        self.cache.length = 0
        self.next_hidden = self.next_logits = None

    def extend(self, target_hidden, next_ids, start: int) -> None:
        """Run the NextN layer over committed positions start.. with the target's hidden states
        [1, n, H] and the ids of the tokens that follow them [1, n] (a prefill chunk: alone)."""
        self.cache.truncate(min(self.cache.length, start))
        out = self.draft.forward_hidden(target_hidden, next_ids, self.cache, start, last_only=True)
        self.cache.length = start + next_ids.shape[1]
        self.next_hidden = out[0, -1:]
        self.next_logits = self.draft.logits(out[:, -1:])[0, -1]


# -- a speculative round over several sequences ----------------------------------------------------
#
# The engine's decode step under NEXTN. The method's own part is `propose` (k drafts per sequence,
# and the logits each was picked from) and `extend_drafts` (the draft state over what was
# committed); `decode_round` verifies with the target and commits, whatever proposed. Every forward
# goes through the engine (EmbeddedEngine.draft_forward / target_forward / *_logits), which runs
# the sequences together or one by one and gives each the bits it gets alone.


def decode_round(engine, seqs: list) -> list:
    """One speculative round for each sequence (api.StepOutput each, in order)."""
    from sparkit.engines.embedded.api import StepOutput  # noqa: F401 (the type of what comes back)

    k = engine.num_steps
    outs: dict[int, object] = {}
    live = []
    for i, seq in enumerate(seqs):
        if len(seq.seq) - 1 + k + 1 > engine.context_length:  # no room for the verify step's k + 1 positions
            outs[i] = seq.ended({"type": "length", "length": seq.generated})
        else:
            live.append(i)
    if live:
        for i, out in zip(live, _verify(engine, [seqs[i] for i in live])):
            outs[i] = out
    return [outs[i] for i in range(len(seqs))]


def _verify(engine, seqs: list) -> list:
    from sparkit.engines.embedded.api import StepOutput

    k = engine.num_steps
    starts = [len(seq.seq) - 1 for seq in seqs]  # the last committed token, not yet in the target cache
    drafts, draft_logits = propose(engine, seqs)
    hidden = engine.target_forward([seq.target_cache for seq in seqs], starts,
                                   [[seq.seq[-1]] + d for seq, d in zip(seqs, drafts)])
    # [k+1, V] each: row j as plain decoding would see it after drafts[:j] (logits.py)
    logits = [seq.rules.rows(rows, d) for seq, rows, d in zip(seqs, engine.target_logits(hidden), drafts)]
    best = _argmax_rows([rows for seq, rows in zip(seqs, logits) if seq.greedy])
    outs, extend = [], []
    for i, seq in enumerate(seqs):
        if seq.greedy:
            accepted, bonus = verify_greedy(drafts[i], best.pop(0))
        else:
            q = logits_to_probs(torch.stack(draft_logits[i]), seq.params)
            p = logits_to_probs(logits[i], seq.params)
            accepted, bonus = verify_rejection(drafts[i], q, p, seq.generator)
        new_tokens = drafts[i][:accepted] + [bonus]
        seq.target_cache.length = starts[i] + accepted + 1
        committed, finish = seq.commit(new_tokens)
        engine.total_verify_steps += 1
        engine.total_committed_in_verify += len(committed)
        # the logprobs of what was committed are the target's verify logits at those positions
        # (row j chose token j), never the draft's
        outs.append(StepOutput(committed, verify_step=True, num_accepted_drafts=len(committed) - 1 if finish else accepted,
                               num_proposed_drafts=k, finished=finish is not None, finish_reason=finish,
                               logprobs=seq.output_logprobs(logits[i], committed)))
        if finish is None:
            extend.append((seq, hidden[i][: accepted + 1], new_tokens, starts[i]))
    if extend:
        extend_drafts(engine, extend)
    return outs


def propose(engine, seqs: list) -> tuple[list[list[int]], list[list]]:
    """k draft tokens per sequence and the logits each was picked from: d_1 from the state the
    last extension left, then each next one chained on the draft's own hidden state (one forward of
    every sequence per step). The chain's cache entries are scratch: the next extension truncates
    them away."""
    k, vocab = engine.num_steps, engine.vocab_limit
    tokens: list[list[int]] = [[] for _ in seqs]
    picked_from: list[list] = [[] for _ in seqs]
    logits = [seq.drafter.next_logits for seq in seqs]
    hidden = [seq.drafter.next_hidden for seq in seqs]
    positions = [seq.drafter.cache.length for seq in seqs]
    caches = [seq.drafter.cache for seq in seqs]
    for step in range(k):
        rows = [lg[..., :vocab] for lg in logits]  # ids past the tokenizer's vocabulary are never proposed
        greedy = _argmax_rows([row[None] for seq, row in zip(seqs, rows) if seq.greedy])
        for i, seq in enumerate(seqs):
            tokens[i].append(greedy.pop(0)[0] if seq.greedy else seq.pick_from_draft(rows[i]))
            picked_from[i].append(rows[i])
        if step + 1 == k:
            break
        hidden = engine.draft_forward(caches, positions, hidden, [[t[-1]] for t in tokens])
        positions = [p + 1 for p in positions]
        logits = [lg[-1] for lg in engine.draft_logits(hidden)]
    return tokens, picked_from


def extend_drafts(engine, items: list) -> None:
    """items: (sequence, the target's hidden rows [n, H] at its newly committed positions, the n
    tokens that follow them, the first position). Runs the draft over them for every sequence at
    once (K/V for all, the output for the last: d_1 of the next round)."""
    for seq, _, _, start in items:
        seq.drafter.cache.truncate(min(seq.drafter.cache.length, start))
    out = engine.draft_forward([seq.drafter.cache for seq, *_ in items], [start for *_, start in items],
                               [h for _, h, _, _ in items], [t for _, _, t, _ in items], last_only=True)
    logits = engine.draft_logits(out)
    for (seq, _, tokens, start), hidden, rows in zip(items, out, logits):
        seq.drafter.cache.length = start + len(tokens)
        seq.drafter.next_hidden = hidden
        seq.drafter.next_logits = rows[-1]


def _argmax_rows(rows: list) -> list[list[int]]:
    """The argmax of every row of each [n_i, V] tensor, in one op: a list of lists."""
    if not rows:
        return []
    from sparkit.models.profiler_spans import span

    with span("sampling"):
        flat = torch.cat(rows).argmax(dim=-1).tolist()
    out, at = [], 0
    for r in rows:
        out.append(flat[at : at + r.shape[0]])
        at += r.shape[0]
    return out
