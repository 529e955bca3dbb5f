"""Paths every test may need. Import as `from _shared import GSM8K_DIR` (tests/ is on sys.path;
`from _shared import` is ambiguous once sub-folders have their own conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
SHARED_DIR = Path(os.environ.get("SPARKIT_SHARED_DIR", REPO_DIR.parent / "shared"))
GSM8K_DIR = SHARED_DIR / "data" / "gsm8k"


def near_tie_states(weight, n: int, seed: int, noise: float = 0.005):
    """[n, K] bf16 hidden states on weight's device whose two best tokens under the head `weight`
    ([N, K]; random pairs) are a few hundredths of a logit apart at about 20 logits, far above
    the rest: where per-row e4m3 rounding flips the bf16 argmax often enough to see (~14% of
    states on a CPU check). The exact re-scoring tests need such states."""
    import torch

    g = torch.Generator(device=weight.device).manual_seed(seed)
    w = weight.float()
    a = torch.randint(0, w.shape[0], (n,), generator=g, device=weight.device)
    b = torch.randint(0, w.shape[0], (n,), generator=g, device=weight.device)
    x = 20.0 * (w[a] / w[a].pow(2).sum(1, keepdim=True) + w[b] / w[b].pow(2).sum(1, keepdim=True))
    x = x + torch.randn(n, w.shape[1], generator=g, device=weight.device) * noise
    return x.to(torch.bfloat16)
