"""The known-answer check: the server scores a fixed shipped text, and its perplexity must be the
one the recipe states.

A wrong kernel, a bad quantisation or a damaged checkpoint can leave a server fluent and fast,
its draft accepted, every flag in place, and still compute the wrong numbers. The prompt's
log-probabilities show it: the server scores sparkit/checks/data/reference-tiny-ling.txt through
SGLang's own `/generate` (`return_logprob`, `logprob_start_len: 0`: `meta_info.input_token_logprobs`,
tuples of (logprob, token_id, text)), which real SGLang and the embedded engine both answer.

tiny-ling was trained on 128-token windows: past ~200 tokens its perplexity climbs (1.84 over
the first 128 tokens of the text, ~49 over all 1190), so the text is scored in short passages
(whole sentences, at most PASSAGE_MAX_BYTES bytes: byte-level tokens, so at most that many tokens
plus the BOS), each from the beginning of a sequence. The figure is their pooled perplexity,
exp(total negative log-likelihood / tokens scored): a sharp, stable value (1.461 on tiny-ling;
for the previous build, H200 SGLang scored the first passage 1.7304 where the embedded engine
scored 1.729). tiny-ling-v3 shares the tokenizer, the corpus and the 128-token training windows:
the same text and passages give its own known answer (recipes/tiny/tiny-v3*.yaml state it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkit.client import EngineClient
from sparkit.errors import EngineError

REFERENCE_TEXT = Path(__file__).resolve().parent / "data" / "reference-tiny-ling.txt"
# The beginning-of-sequence token as tiny-ling's tokenizer spells it in text (both engines'
# tokenizers read it as the special token, id 256).
SEQUENCE_START = "<|bos|>"
PASSAGE_MAX_BYTES = 119
DEFAULT_TOLERANCE = 0.10  # relative gap to the stated perplexity that still passes


def reference_passages(text: str | None = None, max_bytes: int = PASSAGE_MAX_BYTES) -> list[str]:
    """The reference text cut into whole sentences, at most `max_bytes` UTF-8 bytes a passage."""
    text = (REFERENCE_TEXT.read_text() if text is None else text).strip()
    passages, current = [], ""
    for sentence in re.findall(r"[^.]*\.(?:\s|$)|[^.]+$", text + " "):
        if current and len((current + sentence).strip().encode()) > max_bytes:
            passages.append(current.strip())
            current = ""
        current += sentence
    if current.strip():
        passages.append(current.strip())
    return passages


@dataclass
class KnownAnswerScore:
    """What the server said about the reference passages: the pooled perplexity, or why not."""

    passages: int = 0
    tokens: int = 0
    nll: float = 0.0
    per_passage: list[float] = field(default_factory=list)  # each passage's own perplexity
    unavailable: str | None = None  # the server gave no prompt logprobs: what it said instead

    @property
    def perplexity(self) -> float | None:
        return math.exp(self.nll / self.tokens) if self.tokens and self.unavailable is None else None

    def to_dict(self) -> dict[str, Any]:
        return {"passages": self.passages, "tokens": self.tokens, "perplexity": self.perplexity,
                "per_passage": self.per_passage, "unavailable": self.unavailable}


def generate_body(passage: str) -> dict[str, Any]:
    """One passage as SGLang's /generate scores it (one new token: SGLang refuses none)."""
    return {"text": SEQUENCE_START + passage, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": 0}


def add_scored(score: KnownAnswerScore, meta: dict[str, Any]) -> None:
    """Add one /generate meta_info's prompt logprobs (the first position has none: skipped)."""
    entries = meta.get("input_token_logprobs")
    if not isinstance(entries, list) or not entries:
        score.unavailable = ("the server returned no input_token_logprobs for return_logprob with "
                             "logprob_start_len 0")
        return
    values = [float(e[0]) for e in entries if isinstance(e, (list, tuple)) and e and e[0] is not None]
    if not values or any(not math.isfinite(v) for v in values):
        score.unavailable = "the server's prompt logprobs are empty or not finite"
        return
    score.passages += 1
    score.tokens += len(values)
    score.nll -= sum(values)
    score.per_passage.append(math.exp(-sum(values) / len(values)))


async def score_reference(url: str, *, api_key: str | None = None, timeout: float = 300.0,
                          passages: list[str] | None = None) -> KnownAnswerScore:
    """Score the reference passages on a live server, one request each (batch 1)."""
    score = KnownAnswerScore()
    try:
        async with EngineClient(url, api_key=api_key, timeout=timeout) as client:
            for passage in passages if passages is not None else reference_passages():
                body = generate_body(passage)
                text = body.pop("text")
                sampling = body.pop("sampling_params")
                out = await client.generate(text, sampling_params=sampling, extra=body)
                add_scored(score, out.meta)
                if score.unavailable:
                    break
    except EngineError as exc:
        score.unavailable = f"the server refused the scoring request: {exc.message}"
    return score
