"""The settings of one GSM8K run: everything that changes which answer a question gets (hashed, so
that --resume refuses a file made with other settings), and the sampling parameters they give."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkit.evals.gsm8k.prompts import PROMPT_VERSION, request_seed


@dataclass
class EvalSettings:
    """Everything that changes which answer a question gets. Hashed: --resume refuses a file
    made with different settings. --limit and --concurrency are left out on purpose: extending
    a --limit 100 run to all questions, or resuming at another concurrency, is legitimate."""

    data_sha256: str
    shots: int = 5
    format: str = "chat"
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 29
    max_tokens: int = 4096
    seed: int = 0
    exemplar_ids: list[int] = field(default_factory=list)
    prompt_version: int = PROMPT_VERSION

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:16]


def sampling_params(settings: EvalSettings, question_id: int) -> dict[str, Any]:
    """SGLang native sampling params for /generate."""
    params: dict[str, Any] = {"max_new_tokens": settings.max_tokens, "temperature": settings.temperature}
    if not settings.greedy:
        params.update(top_p=settings.top_p, top_k=settings.top_k, sampling_seed=request_seed(settings.seed, question_id))
    return params

