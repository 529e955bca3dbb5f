"""Workloads: exact-length random ids from the vocabulary, GSM8K and prompt files."""

from __future__ import annotations

import json

import pytest

from sparkit.bench.workload import Vocabulary, build_workload, file_prompts, gsm8k_prompts, random_prompts
from sparkit.errors import DataError, UsageError

from _shared import GSM8K_DIR


def test_random_prompts_have_exact_length_avoid_specials_and_repeat_with_the_seed():
    vocab = Vocabulary(size=10, special_ids=frozenset({0, 9}))
    a = random_prompts(vocab, count=3, input_len=50, seed=1)
    assert [len(p.input_ids) for p in a] == [50, 50, 50]
    assert all(1 <= i <= 8 for p in a for i in p.input_ids)
    assert [p.input_ids for p in a] == [p.input_ids for p in random_prompts(vocab, 3, 50, seed=1)]
    assert a[0].input_ids != random_prompts(vocab, 3, 50, seed=2)[0].input_ids


def test_random_workload_needs_a_vocabulary_and_sane_lengths():
    with pytest.raises(DataError):
        build_workload("random", count=1, input_len=8, output_len=8, seed=0, vocabulary=None)
    with pytest.raises(UsageError, match="--output-len"):
        build_workload("random", count=1, input_len=8, output_len=0, seed=0, vocabulary=Vocabulary(5))


@pytest.mark.skipif(not (GSM8K_DIR / "test.jsonl").exists(), reason="GSM8K data not present")
def test_gsm8k_prompts_are_questions_from_the_test_file():
    prompts = gsm8k_prompts(GSM8K_DIR / "test.jsonl", count=5, seed=0)
    assert len(prompts) == 5 and all(p.text.startswith("Question: ") and p.text.endswith("Answer:") for p in prompts)


def test_prompt_file_lines_cycle_to_the_requested_count(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("one\n\ntwo\n")
    assert [p.text for p in file_prompts(path, 3)] == ["one", "two", "one"]


def test_a_bad_prompt_file_names_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"answer": 3}) + "\n")
    with pytest.raises(DataError, match="line 2"):
        file_prompts(path, 2)
    broken = tmp_path / "b.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(DataError, match="b.jsonl:1"):
        file_prompts(broken, 1)
    with pytest.raises(DataError, match="no such prompt file"):
        file_prompts(tmp_path / "missing.jsonl", 1)


def test_vocabulary_comes_from_the_served_models_tokenizer(tiny_model_dir):
    from sparkit.bench.workload import vocabulary_from_server

    vocab = vocabulary_from_server({"model_path": str(tiny_model_dir)}, {})
    assert vocab.size == 262 and len(vocab.special_ids) == 6  # byte tokenizer + its special tokens
    assert max(vocab.sampleable()) < min(vocab.special_ids)


def test_no_vocabulary_anywhere_is_a_data_error_with_a_way_out():
    from sparkit.bench.workload import vocabulary_from_server

    with pytest.raises(DataError) as caught:
        vocabulary_from_server({"model_path": "nobody/no-such-model-xyz"}, {})
    assert "--dataset" in str(caught.value)


def test_the_context_a_model_was_made_for_comes_from_its_training_its_recipe_or_its_checkpoint(tmp_path):
    import json as _json

    from sparkit.bench.workload import model_context, tune_shape
    from sparkit.models.tiny_ling.family import TRAIN_SEQ_LEN
    from sparkit.recipes.load import load_recipe

    tiny = model_context(load_recipe("tiny").recipe)
    assert (tiny.tokens, tiny.why) == (TRAIN_SEQ_LEN, f"tiny-ling was trained on {TRAIN_SEQ_LEN}-token windows")
    assert tune_shape(tiny) == (48, 64) and sum(tune_shape(tiny)) <= TRAIN_SEQ_LEN
    stated = model_context(load_recipe("ling-3.0-flash/spark-optimized", ["model.context_length=4096"]).recipe)
    assert stated.tokens == 4096 and tune_shape(stated) == (1024, 256)
    local = tmp_path / "m"
    local.mkdir()
    (local / "config.json").write_text(_json.dumps({"max_position_embeddings": 512}))
    found = model_context(load_recipe("ling-3.0-flash/spark-optimized", [f"model.path={local}"]).recipe)
    assert found.tokens == 512 and "max_position_embeddings 512" in found.why and tune_shape(found) == (192, 256)
    assert model_context(load_recipe("ling-3.0-flash/spark-optimized").recipe) is None  # a hub id: nothing says
    from sparkit.models.builder import BuildSpec
    from sparkit.models.tiny_ling.family import SHIPPED_DIR

    shipped = SHIPPED_DIR / BuildSpec().dir_name  # a build's own max_position_embeddings (2048) is not its training
    assert model_context(load_recipe("tiny", [f"model.path={shipped}"]).recipe).tokens == TRAIN_SEQ_LEN
    assert tune_shape(None) == (1024, 256)


def test_mixed_profile_prompts_take_each_natural_kind_in_turn():
    from sparkit.bench.profile_texts import MIXED_KINDS, passages, profile_prompts

    prompts = profile_prompts("mixed", 40, 8)
    assert [p.kind for p in prompts] == list(MIXED_KINDS) * 2 and "repetitive" not in MIXED_KINDS
    for p in prompts:  # each cut from its own kind's texts
        assert p.text and any(p.text[:60] in passage or passage[:60] in p.text for passage in passages(p.kind))
