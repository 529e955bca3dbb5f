"""`verify` end to end: real embedded servers started from recipes through sparkit.runs."""

from __future__ import annotations

import pytest

from sparkit.bench.verify import run_verify
from sparkit.contract.checks import Status

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "1")


def checks_of(report):
    return {c.name: c for c in report.checks}


def test_mtp_on_versus_off_is_greedy_identical(tiny_model_dir):
    model = f"model.path={tiny_model_dir}"
    report = run_verify("tiny", "tiny", recipe_overrides=[model],
                        against_overrides=[model, "stack.speculative=none"], num_prompts=3)
    checks = checks_of(report)
    assert report.rounding_changes == []
    assert checks["greedy_outputs"].status == Status.PASS, checks["greedy_outputs"].detail
    assert checks["greedy_outputs"].data["identical"] == 3
    assert checks["accept_length"].status == Status.SKIP  # the baseline does not speculate
    assert checks["state_pollution"].status == Status.PASS
    assert checks["startup_checks"].status == Status.PASS
    assert report.passed
    assert all(len(o["output_ids"]) == 256 for o in report.candidate["outputs"])


def test_dspark_versus_plain_decoding_is_greedy_identical(tiny_model_dir, dspark_draft_dir):
    """`sparkit verify tiny/tiny-dspark --against tiny --against-set stack.speculative=none`: the same
    stack (FP8 experts and head) with and without the block draft, byte for byte."""
    model = f"model.path={tiny_model_dir}"
    report = run_verify("tiny/tiny-dspark", "tiny", recipe_overrides=[model],
                        against_overrides=[model, "stack.speculative=none"], num_prompts=3)
    checks = checks_of(report)
    assert report.rounding_changes == []  # the embedded engine's verify pass replays decoding
    assert checks["greedy_outputs"].status == Status.PASS, checks["greedy_outputs"].detail
    assert checks["greedy_outputs"].data["identical"] == 3
    assert checks["state_pollution"].status == Status.PASS
    assert checks["startup_checks"].status == Status.PASS, checks["startup_checks"].detail
    assert report.passed


def test_fp8_lm_head_versus_bf16_is_declared_rounding_changing_with_its_agreement(tiny_model_dir):
    model = f"model.path={tiny_model_dir}"
    report = run_verify("tiny", "tiny", recipe_overrides=[model],
                        against_overrides=[model, "stack.lm_head=bf16"], num_prompts=4)
    checks = checks_of(report)
    assert report.rounding_changes == ["stack.lm_head: bf16 -> fp8"]
    greedy = checks["greedy_outputs"]
    assert "rounding-changing" in greedy.detail and greedy.status != Status.FAIL
    # FP8 rounding flips a few argmaxes; given the same context nearly all tokens agree.
    assert 0.8 <= greedy.data["teacher_forced_agreement"] <= 1.0
    assert greedy.data["teacher_forced_positions"] == 4 * 256 // 16
    # Every output that differs is explained: where it leaves the baseline, in tokens, and the
    # candidate's own logprobs of both tokens there (the real server's top_logprobs).
    divergences = greedy.data.get("divergences", [])
    assert len(divergences) == 4 - greedy.data["identical"]
    for d in divergences:
        assert d["candidate_logprob"] is not None and d["candidate_token"] != d["baseline_token"]
        assert any(f"prompt {d['prompt_index']} diverges at token {d['token']}" in line for line in greedy.evidence)
    accept = checks["accept_length"]
    assert accept.status != Status.SKIP  # both speculate: judged (its verdict is in the report)
    assert accept.data["baseline"] > 1.5 and accept.data["candidate"] > 1.5
    assert checks["state_pollution"].status == Status.PASS


def test_a_wrong_draft_fails_the_accept_length_gate_but_not_the_greedy_one(tiny_model_dir, wrong_draft_model_dir):
    model = f"model.path={tiny_model_dir}"
    report = run_verify("tiny-wrong-draft", "tiny",
                        recipe_overrides=[model, f"stack.speculative.draft_model={wrong_draft_model_dir}"],
                        against_overrides=[model], num_prompts=2, max_new_tokens=128)
    checks = checks_of(report)
    # Speculation never changes greedy output, even with a useless draft ...
    assert checks["greedy_outputs"].status == Status.PASS
    # ... but the accept length collapses and the gate says so; the candidate's own startup check
    # (acceptance) already says its draft is not doing its job.
    assert checks["accept_length"].status == Status.FAIL
    assert checks["startup_checks"].status == Status.FAIL and "candidate: acceptance" in checks["startup_checks"].detail
    assert checks["accept_length"].data["candidate"] < checks["accept_length"].data["baseline"] - 0.5
    assert not report.passed


def test_the_readme_example_says_what_it_was_judged_by(tiny_model_dir, tmp_path):
    """`sparkit verify tiny --against tiny-baseline`, the README's tour: an FP8 head against a
    bf16 one without MTP is judged by token agreement, and says why accept length is not."""
    import os
    import subprocess
    import sys

    model = f"model.path={tiny_model_dir}"
    env = {**os.environ, "SPARKIT_HOME": str(tmp_path / "home"), "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-m", "sparkit", "verify", "tiny", "--against", "tiny-baseline", "--set", model,
         "--against-set", model, "--num-prompts", "2", "--max-new-tokens", "32"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = next(line for line in done.stdout.splitlines() if line.startswith("verify passed"))
    assert summary == (
        "verify passed (tiny against tiny/tiny-baseline): judged by token agreement, not byte-exactness "
        "(stack.lm_head: bf16 -> fp8 changes rounding); accept length not compared: the baseline has no "
        "speculative decoding; the greedy re-run after sampled requests must be byte-exact; both servers' "
        "startup checks must pass")


def test_greedy_only_sends_no_sampled_request_and_says_so(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """For SGLang's NEXTN without flashinfer (a sampled request kills it): `verify --greedy-only`
    still gates the greedy outputs, and reports the state-pollution re-run as not run, with why."""
    import json

    from sparkit.cli.main import main

    monkeypatch.setenv("SPARKIT_HOME", str(tmp_path / "home"))
    model = f"model.path={tiny_model_dir}"
    with pytest.raises(SystemExit) as info:
        main(["verify", "tiny", "--against", "tiny", "--set", model, "--against-set", model,
              "--against-set", "stack.speculative=none", "--num-prompts", "2", "--max-new-tokens", "32",
              "--greedy-only", "--json"])
    assert info.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["greedy_outputs"]["status"] == "pass"
    assert checks["state_pollution"]["status"] == "skip" and "--greedy-only" in checks["state_pollution"]["detail"]
    assert not doc["candidate"].get("rerun")
