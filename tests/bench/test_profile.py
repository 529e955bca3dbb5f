"""The acceptance profile's texts, prompts and verdicts (unit), and `sparkit bench profile` on two
real embedded servers (e2e)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sparkit.bench.profile import KINDS, paired_speedup, verdict
from sparkit.bench.profile_texts import TEXTS_DIR, passages, profile_prompts


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from tokenizers import Tokenizer

    from sparkit.models.builder import builtin_model_dir

    return Tokenizer.from_file(str(builtin_model_dir("tiny-ling", 0) / "tokenizer.json"))


def test_every_kind_ships_with_its_source_and_licence_named():
    notice = (TEXTS_DIR / "NOTICE.txt").read_text()
    for kind in KINDS:
        assert f"{kind}.txt" in notice
        assert len(passages(kind)) >= 5
    assert "MIT License" in notice and "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in notice
    assert passages("code")[0].startswith("# from Lib/bisect.py")  # real standard-library source


def test_prompts_are_cut_to_the_depth_in_the_served_models_tokens(tiny_tokenizer):
    prompts = profile_prompts("math", 40, 3, tokenizer=tiny_tokenizer, seed=1)
    texts = passages("math")
    for i, prompt in enumerate(prompts):
        assert len(prompt.input_ids) == 40 and not prompt.wrapped
        assert texts[1 + i].startswith(tiny_tokenizer.decode(prompt.input_ids))  # passage seed + i
    total = len(tiny_tokenizer.encode("\n\n".join(passages("prose"))).ids)
    deep = profile_prompts("prose", total + 50, 1, tokenizer=tiny_tokenizer)[0]
    assert deep.wrapped and len(deep.input_ids) == total + 50
    by_chars = profile_prompts("chat", 10, 1)[0]
    assert by_chars.input_ids is None and len(by_chars.text) == 40  # 4 characters per token without a tokenizer


def test_the_speedup_is_the_median_paired_ratio_and_the_verdict_needs_it_beyond_noise():
    on, off = [10.0, 10.0, 10.0, 10.0], [13.0, 14.0, 15.0, 14.0]
    speedup, noise = paired_speedup(on, off)
    assert speedup == pytest.approx(1.4)
    assert verdict("math", speedup, noise, 2.9)[0] == "pays"
    assert verdict("math", speedup, noise, 2.9)[1].startswith("MTP pays on math +40% (accept 2.90, noise ±")
    slower, noise = paired_speedup(on, [9.5, 9.6, 9.7, 9.6])
    assert verdict("prose", slower, noise, 1.4)[1].startswith("MTP loses on prose -4%")
    mixed, noise = paired_speedup(on, [12.0, 8.0, 11.0, 9.0])
    word, sentence = verdict("chat", mixed, noise, 2.0)
    assert word == "even" and sentence.startswith("no measurable difference on chat")


def sparkit(home, *args, timeout=300):
    env = {**os.environ, "SPARKIT_HOME": str(home), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "sparkit", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["interleaved", "sequential"])
def test_bench_profile_runs_the_recipe_with_and_without_mtp_and_stops_both(tmp_path, mode):
    from sparkit.runs import pid_alive

    home = tmp_path / "home"
    extra = ["--sequential"] if mode == "sequential" else []
    done = sparkit(home, "bench", "profile", "tiny", "--kinds", "code,repetitive", "--depths", "24", "--prompts", "2",
                   "--output-len", "12", "--warmup", "0", "--out", str(tmp_path / "p.json"), *extra)
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "p.json").read_text())
    assert [(c["kind"], c["depth"]) for c in doc["cells"]] == [("code", 24), ("repetitive", 24)]
    for cell in doc["cells"]:
        assert cell["prompts"] == 2 and cell["failed"] == 0
        assert cell["accept_length"] > 1 and cell["tok_s_on"] > 0 and cell["tok_s_off"] > 0
        assert cell["model_speedup"] is not None
    assert [v["kind"] for v in doc["verdicts"]] == ["code", "repetitive"]
    for v in doc["verdicts"]:
        assert v["sentence"] in done.stdout
    assert "acceptance profile: tiny (nextn) vs no speculation" in done.stdout
    for side in ("on", "off"):
        pid = json.loads((home / "runs" / doc["servers"][side]["run_id"] / "meta.json").read_text()).get("pid")
        assert pid and not pid_alive(pid)


@pytest.mark.e2e
def test_a_recipe_without_speculative_decoding_cannot_be_profiled(tmp_path):
    done = sparkit(tmp_path / "home", "bench", "profile", "tiny/tiny-baseline")
    assert done.returncode == 2 and "has no speculative decoding" in done.stderr
    done = sparkit(tmp_path / "home", "bench", "profile", "tiny", "--kinds", "poetry")
    assert done.returncode == 2 and "unknown kind(s) poetry" in done.stderr


@pytest.mark.e2e
def test_bench_on_a_profile_kind_sends_prompts_of_exactly_input_len_tokens(embedded_server, tmp_path):
    out = tmp_path / "k.json"
    done = subprocess.run([sys.executable, "-m", "sparkit", "bench", "--url", embedded_server.url, "--dataset",
                           "profile:code", "--input-len", "40", "--output-len", "8", "--num-prompts", "3",
                           "--warmup", "0", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["workload"]["kind"] == "code" and doc["workload"]["synthetic"] is False
    assert [r["prompt_tokens"] for r in doc["repeats"][0]["requests"]] == [40, 40, 40]
