"""GSM8K prompts: few-shot exemplars drawn from the train split, as chat messages or a completion
prompt, and the per-request sampling seed."""

from __future__ import annotations

import hashlib
import json
import random
import re

from sparkit.errors import DataError
from sparkit.evals.gsm8k.data import Question

# Exemplars are a fixed draw from train so that every run (and every --seed) sees the same
# prompt prefix: runs stay comparable and the server's prefix cache does its job.
EXEMPLAR_SEED = 1234
# Bump when prompt wording changes so that old results files refuse to be resumed into.
PROMPT_VERSION = 1

COMPLETION_STOPS = ["Question:", "</s>", "<|im_end|>"]
INSTRUCTION = 'Solve the problem step by step, then finish with "The answer is N." where N is the final number.'

_CALCULATOR_RE = re.compile(r"<<[^<>]*>>")


def exemplar_solution(answer: str) -> str:
    """A train answer as chain of thought: calculator annotations dropped, '#### N' spelled out."""
    reasoning, final = answer.rsplit("####", 1)
    reasoning = _CALCULATOR_RE.sub("", reasoning).strip()
    return f"{reasoning}\nThe answer is {final.strip()}."


def choose_exemplars(train: list[Question], shots: int, exclude: list[Question], seed: int = EXEMPLAR_SEED) -> list[Question]:
    """`shots` train questions, never one whose text is among the evaluated questions
    (which matters when someone evaluates the train split itself)."""
    if shots <= 0:
        return []
    banned = {q.question.strip() for q in exclude}
    pool = [q for q in train if q.question.strip() not in banned]
    if len(pool) < shots:
        raise DataError(f"need {shots} exemplars from the train split but only {len(pool)} questions are usable")
    return random.Random(seed).sample(pool, shots)


def build_chat_messages(question: str, exemplars: list[Question]) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    for ex in exemplars:
        messages.append({"role": "user", "content": f"{INSTRUCTION}\n\nQuestion: {ex.question}"})
        messages.append({"role": "assistant", "content": exemplar_solution(ex.answer)})
    messages.append({"role": "user", "content": f"{INSTRUCTION}\n\nQuestion: {question}"})
    return messages


def build_completion_prompt(question: str, exemplars: list[Question]) -> str:
    parts = [f"Question: {ex.question}\nAnswer: {exemplar_solution(ex.answer)}\n\n" for ex in exemplars]
    parts.append(f"Question: {question}\nAnswer:")
    return "".join(parts)


def prompt_for(question: Question, exemplars: list[Question], fmt: str) -> str | list[dict[str, str]]:
    if fmt == "chat":
        return build_chat_messages(question.question, exemplars)
    return build_completion_prompt(question.question, exemplars)


def prompt_sha(prompt: str | list[dict[str, str]]) -> str:
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def request_seed(seed: int, question_id: int) -> int:
    """Per-request sampling seed from --seed and the question id: reproducible whatever the
    order requests finish in (where the engine honours seeds)."""
    digest = hashlib.sha256(f"gsm8k:{seed}:{question_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF

