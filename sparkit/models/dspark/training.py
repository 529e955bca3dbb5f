"""Training a DSpark draft: the data (the target's own greedy continuations and its captured layer
outputs) and the objective.

The objective, as inferred from SGLang's DSpark code and the public DSpark / DFlash papers:
  - teacher forcing on the target's regenerated text: every training sequence is a prompt and
    the target's own greedy continuation, so each label is the token the target would produce;
  - blocks anchored where decoding anchors them: an anchor a in the continuation, the context the
    target's features at positions < a, the block [x_a, mask, ...] at a..a+B-1 whose row i
    predicts x_{a+1+i} (sparkit.models.dspark.model's docstring);
  - row i's logits are the corrected ones decoding drafts from, base + Markov bias of the true
    previous token x_{a+i} (during decoding it is the drafted one, equal to it while the drafts are
    accepted, which is the only case in which row i's token can count);
  - a position-decayed cross-entropy: row i weighs exp(-i / DECAY) (a token counts only if every
    earlier one was accepted, so later rows matter geometrically less: DFlash's decayed loss);
  - a confidence term: binary cross-entropy of the confidence head against whether row i's
    greedy draft equals its label, on detached features (it calibrates the head without moving
    the backbone), weighted CONFIDENCE_WEIGHT.
The shared embedding and lm_head are the target's, frozen (they are not the draft's parameters).
Many blocks of a sequence train at once: one mask lets each block see its own context and itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from sparkit.models.dspark.model import LingDSparkModel

DECAY = 4.0  # row i of a block weighs exp(-i / DECAY) in the loss
CONFIDENCE_WEIGHT = 0.1


@dataclass
class Sequences:
    """Training sequences, right-padded: tokens [N, T], features [N, T, K*H], where each
    continuation starts (the first anchor) and each sequence's length."""

    tokens: torch.Tensor
    features: torch.Tensor
    starts: torch.Tensor
    lengths: torch.Tensor


def regenerate(target, prompts: list[list[int]], new_tokens: int, progress=None) -> list[tuple[list[int], int]]:
    """(prompt + the target's greedy continuation, the prompt's length) for each prompt."""
    out = []
    for i, prompt in enumerate(prompts):
        out.append((prompt + target.greedy(prompt, new_tokens), len(prompt)))
        if progress is not None and (i + 1) % 32 == 0:
            progress((i + 1) / len(prompts), f"regenerated {i + 1}/{len(prompts)} continuations")
    return out


def capture(target, texts: list[tuple[list[int], int]], layer_ids: tuple[int, ...]) -> Sequences:
    """The target's features of every position of every text, one text per forward (a text's
    features then do not depend on which others are in the data set: the first steps of a build
    are the same bits whatever its length)."""
    longest = max(len(t) for t, _ in texts)
    tokens = torch.zeros(len(texts), longest, dtype=torch.long)
    features = None
    for i, (text, _) in enumerate(texts):
        tokens[i, : len(text)] = torch.tensor(text)
        row = target.features(tokens[i:i + 1, : len(text)], layer_ids)[0]
        if features is None:
            features = torch.zeros(len(texts), longest, row.shape[-1])
        features[i, : len(text)] = row
    return Sequences(tokens, features, torch.tensor([p for _, p in texts]), torch.tensor([len(t) for t, _ in texts]))


def sample_anchors(data: Sequences, rows: torch.Tensor, per_sequence: int, block: int, generator) -> torch.Tensor:
    """[len(rows), per_sequence] anchors, uniform over each sequence's continuation (a block's
    labels must lie inside the sequence)."""
    low = data.starts[rows]
    high = data.lengths[rows] - block - 1  # the last anchor whose labels x_{a+1..a+block} exist
    span = (high - low + 1).clamp(min=1)
    u = torch.rand(len(rows), per_sequence, generator=generator)
    return low[:, None] + (u * span[:, None]).long().clamp(max=(span - 1)[:, None])


def block_loss(draft: LingDSparkModel, data: Sequences, rows: torch.Tensor, anchors: torch.Tensor):
    """(total loss, decayed cross-entropy, confidence loss, first-row accuracy) of one batch."""
    cfg = draft.config
    B, A = anchors.shape
    G = cfg.block_size
    T = int(data.lengths[rows].max())
    tokens, feats = data.tokens[rows, :T], data.features[rows, :T]
    offsets = torch.arange(G)
    positions = (anchors[:, :, None] + offsets).reshape(B, A * G)  # [B, Q]
    labels = tokens.gather(1, (positions + 1).clamp(max=T - 1))
    prev = tokens.gather(1, positions)  # x_{a+i}: the anchor, then the true previous tokens
    ids = torch.full_like(positions, cfg.mask_token_id)
    ids[:, ::G] = prev[:, ::G]
    ctx = draft.project_context(feats)
    context = draft.context_kv(ctx, torch.arange(T))
    cos, sin = draft.rotary.tables(positions, ctx.dtype)
    cos, sin = cos[:, None], sin[:, None]  # [B, 1, Q, D/2]: one table per sequence, for every head
    block_of = torch.arange(A).repeat_interleave(G)
    sees_context = torch.arange(T)[None, None, :] < anchors.repeat_interleave(G, dim=1)[:, :, None]
    sees_block = (block_of[:, None] == block_of[None, :]).expand(B, -1, -1)
    mask = torch.cat((sees_context, sees_block), dim=-1)[:, None]  # [B, 1, Q, T + Q]
    x = draft.embed_tokens(ids)
    for layer, (k, v) in zip(draft.layers, context):
        x = layer(x, cos, sin, k, v, mask)
    hidden = draft.norm(x)
    logits = draft.base_logits(hidden) + draft.markov_head.bias(prev)
    weights = torch.exp(-offsets.float() / DECAY).repeat(A)[None].expand(B, -1)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view(B, -1)
    decayed = (ce * weights).sum() / weights.sum()
    hit = (logits.argmax(-1) == labels).float()
    total, confidence_loss = decayed, torch.zeros(())
    if draft.confidence_head is not None:
        raw = draft.confidence_head(hidden.detach(), draft.markov_head.markov_w1(prev).detach())
        confidence_loss = F.binary_cross_entropy_with_logits(raw, hit)
        total = decayed + CONFIDENCE_WEIGHT * confidence_loss
    return total, decayed.detach(), confidence_loss.detach(), hit[:, ::G].mean()


def train(draft: LingDSparkModel, data: Sequences, steps: int, seed: int, progress, *, batch: int = 16,
          anchors: int = 16, peak_lr: float = 3e-3, warmup: int = 20, stop_after: int | None = None,
          on_step=None) -> dict:
    """AdamW over the draft's own parameters (the shared modules are not among them): warm-up,
    then cosine decay over `steps`. The batches depend on (seed, step) only."""
    import time

    generator = torch.Generator().manual_seed(seed)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.01)
    end = steps if stop_after is None else min(steps, stop_after)
    # The first pass takes the sequences in the order they were generated (so the first steps need
    # only the first sequences: build_model's stop_after), later passes a permutation.
    order = torch.arange(len(data.tokens))
    cursor = 0
    draft.train()
    started = time.monotonic()
    figures = {"loss": float("nan"), "confidence_loss": float("nan"), "first_row_accuracy": float("nan")}
    for step in range(end):
        lr = peak_lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        if cursor + batch > len(order):
            order, cursor = torch.randperm(len(data.tokens), generator=generator), 0
        rows = order[cursor:cursor + batch]
        cursor += batch
        chosen = sample_anchors(data, rows, anchors, draft.config.block_size, generator)
        total, decayed, conf, first = block_loss(draft, data, rows, chosen)
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        figures = {"loss": round(float(decayed), 4), "confidence_loss": round(float(conf), 4),
                   "first_row_accuracy": round(float(first), 4)}
        if on_step is not None:
            on_step(step + 1)
        if (step + 1) % 10 == 0 or step + 1 == end:
            progress((step + 1) / steps, f"step {step + 1}/{steps}  loss {figures['loss']:.3f}  "
                     f"confidence loss {figures['confidence_loss']:.3f}")
    draft.eval()
    return {"train_steps": end, "train_seconds": round(time.monotonic() - started, 1), **figures,
            "parameters": sum(p.numel() for p in params)}
