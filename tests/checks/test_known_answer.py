"""The known-answer check: the reference passages, SGLang's real logprob output, and the verdicts."""

from __future__ import annotations

import asyncio
import json
import math

from sparkit.checks.activation import check_known_answer, evaluate
from sparkit.checks.evidence import ServerEvidence
from sparkit.checks.known_answer import (
    PASSAGE_MAX_BYTES,
    REFERENCE_TEXT,
    KnownAnswerScore,
    add_scored,
    reference_passages,
    score_reference,
)
from sparkit.contract.checks import Status
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe

from _shared import REPO_DIR

SGLANG_PASSAGE1 = REPO_DIR / "tests" / "fixtures" / "sglang-0.5.23-h200" / "known-answer-passage1.json"


def test_passages_are_whole_sentences_short_enough_for_tiny_lings_training_window():
    passages = reference_passages()
    text = REFERENCE_TEXT.read_text().strip()
    assert " ".join(passages) == " ".join(text.split())  # nothing lost, nothing reordered
    assert len(passages) == 12
    assert all(len(p.encode()) <= PASSAGE_MAX_BYTES and p.endswith(".") for p in passages)


def test_sglangs_real_prompt_logprobs_are_read():
    capture = json.loads(SGLANG_PASSAGE1.read_text())
    assert capture["passage"] == reference_passages()[0]
    score = KnownAnswerScore()
    add_scored(score, capture["meta_info"])
    assert score.unavailable is None and score.passages == 1
    assert score.tokens == len(capture["passage"].encode())  # every byte token, BOS's None skipped
    assert score.perplexity == math.exp(-sum(e[0] for e in capture["meta_info"]["input_token_logprobs"][1:]) / score.tokens)
    assert abs(score.perplexity - 1.7076) < 1e-4


def _score(ppl: float, tokens: int = 1000) -> KnownAnswerScore:
    return KnownAnswerScore(passages=12, tokens=tokens, nll=math.log(ppl) * tokens, per_passage=[ppl] * 12)


def test_the_verdicts():
    plan = compile_plan(load_recipe("tiny"))
    assert plan.expectations.reference_perplexity == 1.461
    ok = check_known_answer(plan, ServerEvidence("embedded", known_answer=_score(1.4605)))
    assert ok.status == Status.PASS and "1.461" in ok.detail
    bad = check_known_answer(plan, ServerEvidence("embedded", known_answer=_score(2.728)))
    assert bad.status == Status.FAIL
    assert "wrong numbers" in bad.cause and "kernel" in bad.cause and bad.fix
    assert bad.data["gap"] > 0.8
    assert "another model" not in bad.cause  # the recipe's own model
    overridden = compile_plan(load_recipe("tiny", ["model.path=sparkit:tiny-ling:seed=3:steps=30"]))
    other = check_known_answer(overridden, ServerEvidence("embedded", known_answer=_score(2.728)))
    assert other.status == Status.FAIL and "or another model: checks.reference_perplexity 1.461 was stated at" in other.cause
    assert "model.path was then set to sparkit:tiny-ling:seed=3:steps=30 by --set" in other.cause
    low = check_known_answer(plan, ServerEvidence("embedded", known_answer=_score(1.2)))
    assert low.status == Status.FAIL  # too good is wrong too: another text, another model
    none = check_known_answer(plan, ServerEvidence("embedded", known_answer=KnownAnswerScore(unavailable="no logprobs here")))
    assert none.status == Status.WARN and "no logprobs here" in none.detail


def test_without_a_stated_value_the_check_skips():
    plan = compile_plan(load_recipe("tiny"))
    plan.expectations.reference_perplexity = None
    result = check_known_answer(plan, ServerEvidence("embedded", known_answer=_score(9.0)))
    assert result.status == Status.SKIP


def test_a_server_without_prompt_logprobs_is_a_warning_not_a_crash():
    score = KnownAnswerScore()
    add_scored(score, {"id": "x", "finish_reason": {"type": "length"}})  # an engine that ignores return_logprob
    assert score.unavailable and "input_token_logprobs" in score.unavailable and score.perplexity is None
    plan = compile_plan(load_recipe("tiny"))
    results = {r.name: r for r in evaluate(plan, ServerEvidence("embedded", known_answer=score))}
    assert results["known_answer"].status == Status.WARN
    assert "input_token_logprobs" in results["known_answer"].detail


def test_no_server_at_all_is_a_reason_too():
    from _engine_fixtures import free_port

    score = asyncio.run(score_reference(f"http://127.0.0.1:{free_port()}", timeout=5))
    assert score.perplexity is None and "refused the scoring request" in score.unavailable
