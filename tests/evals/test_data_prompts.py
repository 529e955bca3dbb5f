"""Data loading, few-shot prompts and the settings that guard --resume."""

from __future__ import annotations

import json

import pytest
from _shared import GSM8K_DIR

from sparkit.errors import DataError
from sparkit.evals.gsm8k.data import ensure_downloaded, load_dataset, load_split
from sparkit.evals.gsm8k.eval_settings import EvalSettings, sampling_params
from sparkit.evals.gsm8k.prompts import (
    build_chat_messages,
    build_completion_prompt,
    choose_exemplars,
    prompt_sha,
    request_seed,
)
from sparkit.evals.gsm8k.results_file import read_results
from sparkit.evals.gsm8k.summary import summarize


@pytest.fixture(scope="module")
def dataset():
    return load_dataset(GSM8K_DIR / "test.jsonl")


def test_loads_both_splits_from_a_file_or_its_directory(dataset):
    assert len(dataset.test) == 1319 and len(dataset.train) == 7473
    assert dataset.test[0].id == 0 and dataset.test[-1].id == 1318
    from_dir = load_dataset(GSM8K_DIR)
    assert from_dir.sha256 == dataset.sha256 and len(from_dir.test) == 1319


def test_exemplars_come_from_train_and_never_from_evaluated_questions(dataset):
    test_texts = {q.question for q in dataset.test}
    train_texts = {q.question for q in dataset.train}
    exemplars = choose_exemplars(dataset.train, 5, exclude=dataset.test)
    assert len(exemplars) == 5
    assert all(e.question in train_texts and e.question not in test_texts for e in exemplars)
    # Fixed draw: every run sees the same prompt prefix.
    assert [e.id for e in exemplars] == [e.id for e in choose_exemplars(dataset.train, 5, exclude=dataset.test)]
    # Evaluating the train split itself: the evaluated questions are excluded from the pool.
    evaluated = dataset.train[:4000]
    exemplars = choose_exemplars(dataset.train, 8, exclude=evaluated)
    assert not {e.question for e in exemplars} & {q.question for q in evaluated}


def test_evaluating_train_through_data_never_shows_an_evaluated_question_as_exemplar(tmp_path):
    # Someone points --data at a copy of the train split with train beside it: the prompts
    # must not contain the question being asked as a solved example.
    train_lines = (GSM8K_DIR / "train.jsonl").read_text().splitlines()[:50]
    (tmp_path / "test.jsonl").write_text("\n".join(train_lines) + "\n")
    (tmp_path / "train.jsonl").write_text("\n".join(train_lines) + "\n")
    data = load_dataset(tmp_path / "test.jsonl")
    questions = data.test[:10]
    exemplars = choose_exemplars(data.train, 5, exclude=questions)
    for q in questions:
        prompt = build_completion_prompt(q.question, exemplars)
        assert prompt.count(q.question) == 1  # only as the question asked, never as an exemplar


def test_prompts_in_both_formats(dataset):
    exemplars = choose_exemplars(dataset.train, 5, exclude=dataset.test)
    q = dataset.test[3]
    messages = build_chat_messages(q.question, exemplars)
    assert [m["role"] for m in messages] == ["user", "assistant"] * 5 + ["user"]
    assert messages[-1]["content"].endswith(q.question)
    assert all(m["content"].rstrip().endswith(f"The answer is {e.gold}.") for m, e in zip(messages[1::2], exemplars))
    prompt = build_completion_prompt(q.question, exemplars)
    assert prompt.count("Question: ") == 6 and prompt.endswith(f"Question: {q.question}\nAnswer:")
    assert "<<" not in prompt and "####" not in prompt
    assert build_completion_prompt(q.question, []) == f"Question: {q.question}\nAnswer:"
    assert prompt_sha(messages) != prompt_sha(prompt)


def test_missing_data_file_is_a_data_error_naming_the_path(tmp_path):
    with pytest.raises(DataError) as info:
        load_dataset(tmp_path / "nope.jsonl")
    assert "nope.jsonl" in str(info.value) and info.value.exit_code == 8


def test_missing_train_split_is_a_data_error_unless_zero_shot(tmp_path):
    (tmp_path / "test.jsonl").write_text((GSM8K_DIR / "test.jsonl").read_text().splitlines()[0] + "\n")
    with pytest.raises(DataError, match="train.jsonl"):
        load_dataset(tmp_path / "test.jsonl")
    assert len(load_dataset(tmp_path / "test.jsonl", need_train=False).test) == 1


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"question": "q", "answer": "a\\n#### 3"}\nnot json\n', "bad.jsonl:2: not valid JSON"),
        ('{"question": "q", "answer": "no final line"}\n', "bad.jsonl:1: answer has no '#### N'"),
        ('{"q": 1}\n', "bad.jsonl:1: expected"),
        ("\n", "empty"),
    ],
)
def test_malformed_data_is_reported_with_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=message.replace("'", ".")):
        load_split(path)


def test_offline_download_is_a_clear_data_error(sparkit_home, monkeypatch):
    # A port nothing listens on: the same failure as being offline (the suite's HF_HUB_OFFLINE=1
    # would refuse before any connection: tests/evals/test_hub.py covers that case).
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(DataError) as info:
        ensure_downloaded("http://127.0.0.1:9/rows", timeout=2)
    assert "cannot download" in info.value.message and "--data" in info.value.hint
    assert not list((sparkit_home / "cache" / "gsm8k").glob("*.jsonl"))


def test_settings_hash_changes_with_anything_that_changes_answers():
    base = EvalSettings(data_sha256="x")
    assert base.hash() == EvalSettings(data_sha256="x").hash()
    for change in ({"temperature": 0.0}, {"shots": 3}, {"format": "completion"}, {"seed": 1}, {"max_tokens": 10}, {"data_sha256": "y"}):
        assert EvalSettings(**{"data_sha256": "x", **change}).hash() != base.hash(), change


def test_request_seeds_are_per_question_and_reproducible():
    seeds = [request_seed(0, i) for i in range(1319)]
    assert seeds == [request_seed(0, i) for i in range(1319)]
    assert len(set(seeds)) > 1300
    assert request_seed(1, 5) != request_seed(0, 5)
    greedy = EvalSettings(data_sha256="x", temperature=0.0)
    assert "sampling_seed" not in sampling_params(greedy, 3)
    sampled = sampling_params(EvalSettings(data_sha256="x"), 3)
    assert sampled["sampling_seed"] == request_seed(0, 3) and sampled["top_k"] == 29


def _result(qid: int, gold: str, answer: str | None, session="s1", t0=100.0, tokens=10, accept=None, verify=None) -> dict:
    ok = answer == gold
    return {
        "type": "result", "id": qid, "prompt_sha": "p", "output": f"The answer is {answer}", "strict": answer,
        "flexible": answer, "gold": gold, "correct": {"strict": ok, "flexible": ok}, "prompt_tokens": 5,
        "completion_tokens": tokens, "finish_reason": "stop", "latency_s": 1.0, "accept_length": accept,
        "spec_verify_ct": verify, "session": session, "concurrency": 4, "started_at": t0, "finished_at": t0 + 1.0,
    }


def test_results_file_survives_a_torn_last_line_and_summarises(tmp_path):
    path = tmp_path / "r.jsonl"
    header = {"type": "header", "settings": {"data_sha256": "x"}, "settings_hash": "h", "server_args": {"speculative_algorithm": "EAGLE", "tp_size": 1}}
    rows = [header, _result(0, "3", "3", tokens=20, verify=10), _result(1, "4", "5", t0=101.0, tokens=30, verify=10),
            _result(2, "6", None, session="s2", t0=500.0, tokens=10, verify=5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"type": "result", "id": 3, "outp')
    results = read_results(path)
    assert sorted(results.results) == [0, 1, 2]
    assert results.valid_bytes == len(path.read_bytes()) - len('{"type": "result", "id": 3, "outp')
    summary = summarize(results)
    assert summary["n"] == 3 and summary["accuracy"]["flexible"]["k"] == 1
    assert summary["invalid_rate"]["flexible"] == pytest.approx(1 / 3)
    # Two sessions of 2 s and 1 s of wall time: the gap between them is not counted.
    assert summary["wall_s"] == pytest.approx(2.0 + 1.0) and summary["output_throughput_tok_s"] == pytest.approx(60 / 3)
    assert summary["mean_accept_length"] == pytest.approx(60 / 25)
    assert summary["concurrency"] == 4
    assert summary["server_args"] == {"speculative_algorithm": "EAGLE", "tp_size": 1}


def test_a_file_without_header_is_not_taken_for_results(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(DataError, match="not a `sparkit eval gsm8k` results file"):
        read_results(path)
