"""Benchmark workloads: what prompts to send.

- `random`: fixed-length prompts of token ids drawn uniformly from the served
  model's vocabulary (special tokens excluded) and sent as `input_ids`, so the
  prompt length is exact and nothing is downloaded. Synthetic prompts inflate
  accept length; results say which workload they came from.
- `gsm8k`: questions of GSM8K's test split (shipped with sparkit; $SPARKIT_GSM8K for another file).
- `profile:KIND`: sparkit's own texts of one kind (code, prose, math, chat, repetitive; see
  sparkit.bench.profile), each prompt cut to exactly input_len tokens with the served model's
  tokenizer when it is local, so `tune` can rank settings on the text a deployment serves;
  `profile:mixed` takes code, prose, math and chat in turn (tune's default).
- FILE: a local .jsonl (one object with "prompt", "text" or "question" per
  line) or a plain text file (one prompt per line).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkit.errors import DataError, UsageError


@dataclass
class Prompt:
    input_ids: list[int] | None = None
    text: str | None = None

    def request_fields(self) -> dict[str, Any]:
        return {"input_ids": self.input_ids} if self.input_ids is not None else {"text": self.text}


@dataclass
class Workload:
    dataset: str  # "random" | "gsm8k" | a file path
    prompts: list[Prompt]
    output_len: int
    synthetic: bool
    description: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Vocabulary:
    size: int
    special_ids: frozenset[int] = frozenset()
    source: str = ""

    def sampleable(self) -> list[int]:
        return [i for i in range(self.size) if i not in self.special_ids]


def random_prompts(vocab: Vocabulary, count: int, input_len: int, seed: int) -> list[Prompt]:
    """`count` prompts of exactly `input_len` ids; the same seed gives the same prompts."""
    if input_len < 1:
        raise UsageError("--input-len must be at least 1")
    pool = vocab.sampleable()
    if not pool:
        raise DataError(f"the vocabulary from {vocab.source or 'the server'} has no ordinary tokens to sample")
    rng = random.Random(seed)
    return [Prompt(input_ids=[rng.choice(pool) for _ in range(input_len)]) for _ in range(count)]


def vocabulary_from_server(model_info: dict[str, Any], server_info: dict[str, Any]) -> Vocabulary:
    """The served model's vocabulary: from its local tokenizer when the server
    names a local directory, else from a vocab_size the server reports."""
    candidates = [
        model_info.get("tokenizer_path"),
        model_info.get("model_path"),
        server_info.get("tokenizer_path"),
        server_info.get("model_path"),
    ]
    for candidate in candidates:
        if candidate and Path(str(candidate)).is_dir():
            vocab = _vocabulary_from_tokenizer_dir(Path(str(candidate)))
            if vocab is not None:
                return vocab
    for candidate in candidates:  # a hub id whose tokenizer is in the local cache (no download)
        if candidate and not Path(str(candidate)).exists():
            vocab = _vocabulary_from_hub_cache(str(candidate))
            if vocab is not None:
                return vocab
    for source in (model_info, server_info):
        size = source.get("vocab_size")
        if isinstance(size, int) and size > 0:
            return Vocabulary(size=size, source="server vocab_size")
    raise DataError(
        "cannot find the served model's vocabulary for random prompts",
        hint="run bench on the machine that holds the model directory, or use --dataset gsm8k|FILE",
    )


def tokenizer_from_server(model_info: dict[str, Any], server_info: dict[str, Any]) -> Any | None:
    """The served model's `tokenizers.Tokenizer` when the server names a local directory
    holding tokenizer.json; None otherwise (a hub id, another machine)."""
    for candidate in (model_info.get("tokenizer_path"), model_info.get("model_path"),
                      server_info.get("tokenizer_path"), server_info.get("model_path")):
        if candidate and (Path(str(candidate)) / "tokenizer.json").is_file():
            try:
                from tokenizers import Tokenizer  # lazy

                return Tokenizer.from_file(str(Path(str(candidate)) / "tokenizer.json"))
            except Exception:
                continue
    return None


def _vocabulary_from_hub_cache(model_id: str) -> Vocabulary | None:
    try:
        from transformers import AutoTokenizer  # lazy: heavy import
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        tokenizer = AutoTokenizer.from_pretrained(model_id, local_files_only=True)
    except Exception:
        return None
    specials = set(getattr(tokenizer, "all_special_ids", []) or []) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return Vocabulary(size=len(tokenizer), special_ids=frozenset(specials), source=f"{model_id} (local cache)")


def _vocabulary_from_tokenizer_dir(path: Path) -> Vocabulary | None:
    tokenizer_file = path / "tokenizer.json"
    if tokenizer_file.is_file():
        try:
            from tokenizers import Tokenizer  # lazy; lighter than transformers and silent

            tokenizer = Tokenizer.from_file(str(tokenizer_file))
            specials = {i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
            return Vocabulary(size=tokenizer.get_vocab_size(with_added_tokens=True), special_ids=frozenset(specials), source=str(path))
        except Exception:
            pass
    try:
        from transformers import AutoTokenizer  # lazy: heavy import
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception:
        return None
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    specials |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return Vocabulary(size=len(tokenizer), special_ids=frozenset(specials), source=str(path))


@dataclass(frozen=True)
class ModelContext:
    """How many tokens of context the served model was made for, and who says so."""

    tokens: int
    why: str


def model_context(recipe: Any) -> ModelContext | None:
    """The context a recipe's model was made for: what its training saw (sparkit's built-in
    tiny-ling, or a local build or export of it: its builder's windows), else the recipe's
    model.context_length, else the checkpoint's own max_position_embeddings when it is local;
    None when nothing says."""
    from sparkit.engines.builtin_models import parse_builtin

    parsed = parse_builtin(recipe.model.path)
    if parsed is not None:
        from sparkit.models.tiny_ling.family import TRAIN_SEQ_LEN

        return ModelContext(TRAIN_SEQ_LEN, f"{parsed[0]} was trained on {TRAIN_SEQ_LEN}-token windows")
    if recipe.model.context_length:
        return ModelContext(int(recipe.model.context_length), f"the recipe's model.context_length is {recipe.model.context_length}")
    config = Path(recipe.model.path).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text())
        value = data.get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(data.get("sparkit"), dict):  # a tiny-ling build or its export: what it was trained on wins
        from sparkit.models.tiny_ling.family import TRAIN_SEQ_LEN

        return ModelContext(TRAIN_SEQ_LEN, f"{config.parent.name} (a tiny-ling build) was trained on "
                                           f"{TRAIN_SEQ_LEN}-token windows")
    if isinstance(value, int) and value > 0:
        return ModelContext(value, f"{config} declares max_position_embeddings {value}")
    return None


# tune's default workload, for a model made for `tokens` of context (or any: the upper bounds).
TUNE_DATASET = "profile:mixed"
TUNE_INPUT_LEN, TUNE_OUTPUT_LEN = 1024, 256


def tune_shape(context: ModelContext | None) -> tuple[int, int]:
    """(input tokens, output tokens) of tune's default requests: prompt and reply within the
    model's context (3/8 and 1/2 of it, so prompt + reply leave an eighth spare), at most
    1024 + 256."""
    if context is None:
        return TUNE_INPUT_LEN, TUNE_OUTPUT_LEN
    return max(8, min(TUNE_INPUT_LEN, context.tokens * 3 // 8)), max(8, min(TUNE_OUTPUT_LEN, context.tokens // 2))


def default_gsm8k_file() -> Path:
    """GSM8K test split: $SPARKIT_GSM8K, else the copy shipped with sparkit (sparkit.evals.gsm8k)."""
    from sparkit.evals.gsm8k.data import SHIPPED_DIR

    env = os.environ.get("SPARKIT_GSM8K")
    return Path(env).expanduser() if env else SHIPPED_DIR / "test.jsonl"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not valid JSON: {exc.msg}") from exc
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: expected a JSON object per line")
        rows.append(row)
    return rows


def gsm8k_prompts(path: Path, count: int, seed: int) -> list[Prompt]:
    rows = _read_jsonl(path)
    if not rows or "question" not in rows[0]:
        raise DataError(f"{path}: not a GSM8K file (no 'question' field)")
    rng = random.Random(seed)
    picked = rng.sample(rows, min(count, len(rows)))
    return [Prompt(text=f"Question: {row['question']}\nAnswer:") for row in picked]


def file_prompts(path: Path, count: int) -> list[Prompt]:
    if not path.is_file():
        raise DataError(f"{path}: no such prompt file", hint="--dataset takes random, gsm8k or a .jsonl/.txt file")
    if path.suffix == ".jsonl":
        prompts = []
        for number, row in enumerate(_read_jsonl(path), 1):
            text = row.get("prompt") or row.get("text") or row.get("question")
            if not isinstance(text, str):
                raise DataError(f"{path}: line {number} has no 'prompt', 'text' or 'question' string")
            prompts.append(Prompt(text=text))
    else:
        prompts = [Prompt(text=line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise DataError(f"{path}: holds no prompts")
    # Cycle when fewer prompts than requests, so --num-prompts means the same everywhere.
    return [prompts[i % len(prompts)] for i in range(count)]


def build_workload(
    dataset: str,
    *,
    count: int,
    input_len: int,
    output_len: int,
    seed: int,
    vocabulary: Vocabulary | None = None,
    tokenizer: Any = None,
) -> Workload:
    if count < 1:
        raise UsageError("--num-prompts must be at least 1")
    if output_len < 1:
        raise UsageError("--output-len must be at least 1")
    if dataset == "random":
        if vocabulary is None:
            raise DataError("random prompts need the served model's vocabulary")
        return Workload(
            dataset="random",
            prompts=random_prompts(vocabulary, count, input_len, seed),
            output_len=output_len,
            synthetic=True,
            description=(f"random ids, {input_len} in / {output_len} out (synthetic: its accept length is not real text's; "
                         "higher for a large model that repeats itself, 3.90 vs 2.68 on GSM8K in the Spark study; "
                         "lower for tiny-ling)"),
            details={"input_len": input_len, "vocab_size": vocabulary.size, "vocab_source": vocabulary.source},
        )
    if dataset == "gsm8k":
        path = default_gsm8k_file()
        if not path.is_file():
            named = " (SPARKIT_GSM8K)" if os.environ.get("SPARKIT_GSM8K") else " (is this sparkit install complete?)"
            raise DataError(f"GSM8K test.jsonl not found: {path}{named}",
                            hint="point SPARKIT_GSM8K at a test.jsonl, unset it for the shipped copy, or pass --dataset FILE")
        return Workload(
            dataset="gsm8k",
            prompts=gsm8k_prompts(path, count, seed),
            output_len=output_len,
            synthetic=False,
            description=f"GSM8K questions from {path}, {output_len} out",
            details={"file": str(path)},
        )
    if dataset.startswith("profile:"):
        from sparkit.bench.profile_texts import CHARS_PER_TOKEN, profile_prompts

        kind = dataset.split(":", 1)[1]
        prompts = profile_prompts(kind, input_len, count, tokenizer=tokenizer, seed=seed)
        cut = "tokens" if tokenizer is not None else f"tokens of {CHARS_PER_TOKEN} characters (no local tokenizer)"
        return Workload(
            dataset=dataset,
            prompts=prompts,  # type: ignore[arg-type]  # ProfilePrompt has Prompt's request_fields()
            output_len=output_len,
            synthetic=False,
            description=(f"{'code, prose, math and chat in turn' if kind == 'mixed' else kind + ' text'} (sparkit's "
                         f"profile texts), {input_len} {cut} in / {output_len} out"),
            details={"input_len": input_len, "kind": kind, "repeats_text": any(p.wrapped for p in prompts)},
        )
    path = Path(dataset).expanduser()
    return Workload(
        dataset=str(path),
        prompts=file_prompts(path, count),
        output_len=output_len,
        synthetic=False,
        description=f"prompts from {path}, {output_len} out",
        details={"file": str(path)},
    )
