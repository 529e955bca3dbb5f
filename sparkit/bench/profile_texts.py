"""The acceptance profile's texts: the shipped passages of each kind (sparkit/bench/texts, sources
and licences in NOTICE.txt) and prompts cut from them to a depth. Used by the profile and by
bench/tune workloads (`--dataset profile:KIND`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkit.errors import DataError, UsageError

TEXTS_DIR = Path(__file__).resolve().parent / "texts"
KINDS = ("code", "prose", "math", "chat", "repetitive")
# `profile:mixed`: natural text of every kind in turn (repetitive text, which flatters a draft, left
# out): tune's default workload, for a deployment that serves a bit of everything.
MIXED = "mixed"
MIXED_KINDS = ("code", "prose", "math", "chat")
PASSAGE_SEPARATOR = "\n%%\n"
CHARS_PER_TOKEN = 4  # without the served model's tokenizer, depths are cut in characters


def passages(kind: str) -> list[str]:
    """The shipped passages of one kind of text."""
    if kind not in KINDS:
        raise UsageError(f"unknown text kind {kind!r}", hint=f"kinds: {', '.join(KINDS)}, or {MIXED} (for bench and tune)")
    path = TEXTS_DIR / f"{kind}.txt"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot read the profile texts ({exc.strerror})") from None
    return [p.strip("\n") for p in text.split(PASSAGE_SEPARATOR) if p.strip()]


@dataclass
class ProfilePrompt:
    kind: str
    depth: int  # tokens (with a tokenizer) or CHARS_PER_TOKEN * depth characters
    input_ids: list[int] | None
    text: str | None
    wrapped: bool  # the kind's texts were shorter than the depth: they repeat

    def request_fields(self) -> dict[str, Any]:
        return {"input_ids": self.input_ids} if self.input_ids is not None else {"text": self.text}


def profile_prompts(kind: str, depth: int, count: int, *, tokenizer: Any = None, seed: int = 0) -> list[ProfilePrompt]:
    """`count` prompts of `kind` text, each exactly `depth` tokens long (cut with the served
    model's `tokenizers.Tokenizer` when given, else CHARS_PER_TOKEN characters per token). Prompt i
    starts at passage (seed + i) and runs on through the following ones."""
    if depth < 1:
        raise UsageError("profile depths must be at least 1 token")
    if kind == MIXED:  # prompt i of the i-th natural kind, each from its own passages
        prompts = []
        for i in range(count):
            one = MIXED_KINDS[i % len(MIXED_KINDS)]
            prompts += profile_prompts(one, depth, 1, tokenizer=tokenizer, seed=seed + i // len(MIXED_KINDS))
        return prompts
    texts = passages(kind)
    prompts = []
    for i in range(count):
        start = (seed + i) % len(texts)
        pieces: list[str] = []
        length, j, wrapped = 0, 0, False
        while length < depth:
            if j == len(texts):
                wrapped = True
            pieces.append(texts[(start + j) % len(texts)])
            j += 1
            joined = "\n\n".join(pieces)
            length = len(tokenizer.encode(joined, add_special_tokens=False).ids) if tokenizer else len(joined) // CHARS_PER_TOKEN
        joined = "\n\n".join(pieces)
        if tokenizer is not None:
            ids = tokenizer.encode(joined, add_special_tokens=False).ids[:depth]
            prompts.append(ProfilePrompt(kind, depth, ids, None, wrapped))
        else:
            prompts.append(ProfilePrompt(kind, depth, None, joined[: depth * CHARS_PER_TOKEN], wrapped))
    return prompts
