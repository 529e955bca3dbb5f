"""DSpark speculative decoding on the embedded engine: SGLang 0.5.23's DSpark loop
(speculative/dspark_components/dspark_worker_v2.py), one sequence at a time, with its verify rule.
Each Sequence has a drafter of its own (its draft context cache); EmbeddedEngine.prefill and
decode call dspark_prefill and dspark_decode for it.

    prefill   the target over the prompt (chunk by chunk), capturing the draft's layers; the draft's context
              K/V of every prompt position; the first token (the first anchor)
    per step  the draft drafts a block from the anchor (the last committed token, at position m)
              over the context below m (sparkit.models.dspark.model: block_hidden, the Markov
              steps); the target verifies [anchor, d_0..d_{B-1}] in one forward at m..m+B,
              capturing again; greedy: the longest prefix of drafts equal to the target's argmax
              rows, plus the target's token after it (dflash.py's
              compute_dflash_correct_drafts_and_bonus); sampling: speculative rejection
              sampling against the distribution each draft was sampled from (exact for the
              target's distribution); the target's cache keeps m..m+accepted, and the draft's
              context gets the features of those positions (the anchor's and the accepted drafts':
              dspark_verify.py commit_hidden with commit_lens)
Every verify row is scored as plain decoding would score it (the request's penalties and grammar,
sparkit.engines.embedded.logits), so greedy DSpark output equals plain greedy output.
"""

from __future__ import annotations

from typing import Any

import torch

from sparkit.engines.embedded.api import StepOutput
from sparkit.errors import LaunchError


def load_dspark_draft(path: str, target, target_config, dtype, device):
    """The draft at `path` in the engine's dtype and device, computing with the target's own
    embedding and lm_head modules; LaunchError when it cannot draft for this target."""
    from sparkit.models.dspark.checkpoint import load_draft

    cfg, draft = load_draft(path)
    target_layers = target_config.num_hidden_layers
    mismatches = [f"{name} {mine} (the target's: {theirs})" for name, mine, theirs in (
        ("hidden_size", cfg.hidden_size, target_config.hidden_size),
        ("vocab_size", cfg.vocab_size, target_config.vocab_size),
        ("num_target_layers", cfg.num_target_layers, target_layers)) if mine != theirs]
    if mismatches:
        raise LaunchError(f"DSpark draft {path} was not made for this target: " + ", ".join(mismatches),
                          hint="build a draft for this target (`sparkit model make-dspark`)")
    draft.to(device=device, dtype=dtype)
    draft.attach_shared(target.embed_tokens, target.lm_head)
    return draft


class DSparkDrafter:
    """The draft and one sequence's context cache (the engine's own has none: `for_sequence`
    gives each Sequence a drafter of its own)."""

    def __init__(self, draft, cache):
        self.draft, self.cache = draft, cache
        self.layer_ids = tuple(draft.config.target_layer_ids)
        self.block_size = draft.config.block_size

    def for_sequence(self, context_length: int, dtype, device) -> DSparkDrafter:
        """A drafter over the same draft with a context cache of its own, for one sequence."""
        from sparkit.models.dspark.model import DraftCache

        return DSparkDrafter(self.draft, DraftCache(self.draft.config, context_length, dtype, device))

    def extend(self, features, start: int) -> None:
        """The context of committed positions start.. from the target's features [n, K*H]."""
        self.draft.write_context(features, self.cache, start)

    def propose(self, anchor: int, position: int, pick, vocab_limit: int) -> tuple[list[int], list]:
        tokens, rows, _ = self.draft.propose(anchor, self.cache, position, pick, vocab_limit)
        return tokens, rows


def dspark_prefill(engine: Any, seq: Any) -> StepOutput | None:
    """The sequence's next prompt chunk through the target, capturing the draft's layers, and
    the draft's context of those positions; None while the prompt is not all in, then the step
    that commits the first token (the first anchor). EmbeddedEngine.prefill's, with the capture."""
    if seq.prefill_only and (seq.want is None or seq.want.input_start is None):
        return seq.ended({"type": "length", "length": 0})
    begin = seq.prefilled
    end = begin + seq.next_chunk(engine.chunk_size())
    with torch.inference_mode():
        hidden, features = _target_forward(engine, seq, seq.seq[begin:end], begin)
        seq.target_cache.length = seq.prefilled = end
        seq.add_input_logprobs(engine._target_logits, hidden, begin)
        if end < seq.prompt_len:
            seq.drafter.extend(features[0], begin)
            return None
        if seq.prefill_only:
            return seq.ended({"type": "length", "length": 0})
        logits = seq.rules.rows(engine._target_logits(hidden[:, -1:]))
        out = seq.first_output(logits, seq.pick(logits[-1]))
        seq.drafter.extend(features[0], begin)
    return out


def dspark_decode(engine: Any, seq: Any) -> StepOutput:
    """One DSpark verify step of one sequence: draft a block from the anchor, verify it in one
    target forward, keep the accepted positions in both caches."""
    from sparkit.engines.embedded.speculative import logits_to_probs, verify_greedy, verify_rejection

    drafter: DSparkDrafter = seq.drafter
    block = drafter.block_size
    m = len(seq.seq) - 1  # the anchor's position: committed, not yet in either cache
    if m + block + 1 > engine.context_length:
        return seq.ended({"type": "length", "length": seq.generated})
    pick = (lambda lg: int(lg.argmax())) if seq.greedy else seq.pick_from_draft
    drafts, draft_logits = drafter.propose(seq.seq[-1], m, pick, engine.vocab_limit)
    hidden, features = _target_forward(engine, seq, [seq.seq[-1]] + drafts, m)
    logits = seq.rules.rows(engine._target_logits(hidden), drafts)  # row j as plain decoding sees it
    if seq.greedy:
        accepted, bonus = verify_greedy(drafts, logits.argmax(dim=-1).tolist())
    else:
        q = logits_to_probs(torch.stack(draft_logits), seq.params)
        accepted, bonus = verify_rejection(drafts, q, logits_to_probs(logits, seq.params), seq.generator)
    seq.target_cache.length = m + accepted + 1
    drafter.extend(features[0, : accepted + 1], m)
    committed, finish = seq.commit(drafts[:accepted] + [bonus])
    engine.total_verify_steps += 1
    engine.total_committed_in_verify += len(committed)
    return StepOutput(committed, verify_step=True, num_accepted_drafts=len(committed) - 1 if finish else accepted,
                      num_proposed_drafts=block, finished=finish is not None, finish_reason=finish,
                      logprobs=seq.output_logprobs(logits, committed))


def _target_forward(engine: Any, seq: Any, ids: list[int], start: int):
    """The target over `ids` at positions start.. (written into the sequence's cache): (its normed
    hidden states [1, n, H], the captured layers' residual stream [1, n, K*H])."""
    return engine.model.forward_hidden(torch.tensor([ids], device=engine.device), seq.target_cache, start,
                                       capture=seq.drafter.layer_ids)
